"""TRL 1.16's ORPO and CPO (``--trainer orpo|cpo``, builtin/trl/reference_free.py and trace/logits_head.py): fitplan
against TRL's own trainers on the CPU, phase by phase; the loss's instants against torch running TRL's own loss
functions; the batch, FLOPs and TRL's refusals by hand.

The referee (``fitplan_torch.trl_referee.measure_orpo``) runs ``trl.experimental.orpo.ORPOTrainer.train()`` (or
``CPOTrainer``) for two optimizer steps on a tiny random model and measures the second step's live bytes per
phase. Each test states ``optim`` and ``precision``: ``32-true`` (fp32 checkpoint, ``bf16=False``), ``bf16-true``
(bf16 checkpoint, ``bf16=False``), ``bf16-mixed`` (``bf16=True`` over fp32 weights: TRL's default),
``bf16-autocast`` (``bf16=True`` over bf16 weights).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

import fitplan

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"
LORA = ["q_proj", "v_proj"]


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def _precision(name: str, bf16: bool) -> str:
    fp32 = _config(name).get("torch_dtype", "float32") == "float32"
    if bf16:
        return "bf16-mixed" if fp32 else "bf16-autocast"
    return "32-true" if fp32 else "bf16-true"


def _estimate(name: str, trainer: str, method: str, bf16: bool = False, **fields):
    base = dict(model=str(CONFIGS / name / "config.json"), precision=_precision(name, bf16), optim="adamw_torch_fused",
                per_device_train_batch_size=2, max_seq_length=16, trainer=trainer, method=method,
                lora_target_modules=LORA, lora_r=8, device="cpu", gradient_checkpointing=False)
    base.update(fields)
    return fitplan.estimate(**base)


# --------------------------------------------------------------------------- the referee: TRL's trainers


@pytest.mark.parametrize(("trainer", "name", "method", "ckpt", "bf16", "fields"), [
    ("orpo", "tiny-llama", "full", False, False, {}),        # dense, fp32: the logsumexp path, logits saved
    ("orpo", "tiny-llama", "lora", False, False, {}),        # LoRA: the final hidden state goes with the model's frame
    ("orpo", "tiny-llama", "full", True, True, {}),          # ORPOConfig's defaults: checkpointing, bf16 autocast
                                                             # (accelerate's fp32 copy of the logits)
    ("orpo", "tiny-qwen2-moe", "full", False, False, {}),    # MoE, bf16 weights: the per-row log_softmax path
    ("orpo", "tiny-gemma", "lora", False, False, {}),        # tied embeddings, bf16 weights
    ("orpo", "tiny-gemma", "full", False, True, {}),         # autocast over bf16 weights: fp32 outputs too
    ("cpo", "tiny-llama", "full", False, False, {}),         # CPO's defaults: sigmoid, cpo_alpha 1 (the NLL term)
    ("cpo", "tiny-llama", "full", False, False, {"loss_type": "alphapo"}),  # AlphaPO: simpo, cpo_alpha 0, no NLL
    ("cpo", "tiny-qwen2-moe", "lora", False, False, {"loss_type": "simpo", "cpo_alpha": 0.0}),
    ("cpo", "tiny-gemma", "full", False, False, {}),
])
def test_orpo_cpo_phases_within_one_percent_of_trl(trainer, name, method, ckpt, bf16, fields):
    pytest.importorskip("trl")
    sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    from fitplan_torch.trl_referee import measure_orpo

    measured = measure_orpo(_config(name), trainer=trainer, method=method, batch=2, prompt=4, completion=12,
                            gradient_checkpointing=ckpt, bf16=bf16, lora_target_modules=tuple(LORA),
                            optim="adamw_torch_fused", **fields)
    predicted = _estimate(name, trainer, method, bf16, gradient_checkpointing=ckpt, **fields)["phase_bytes"]
    assert set(predicted) == {"forward", "backward", "optimizer_step"}  # no reference model
    for phase, value in predicted.items():
        assert abs(value - measured[phase]) / measured[phase] < 0.01, (phase, value, measured[phase])


# --------------------------------------------------------------------------- the loss alone, against torch


def _trl_loss_peaks(trainer: str, dtype: str, b: int, s: int, vocab: int, cpo_alpha: float = 1.0):
    """Run TRL's own ``get_batch_loss_metrics`` (ORPO's or CPO's, unbound, on a stand-in ``self``) over logits
    made from a leaf, under the referee's live-bytes counter: the most the loss holds beyond the logits in the
    forward, what it leaves for the backward, and the backward's peak, all beyond what was alive before it."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    from fitplan_torch.measure import LiveBytes
    from trl.experimental.cpo import CPOTrainer
    from trl.experimental.orpo import ORPOTrainer

    cls = ORPOTrainer if trainer == "orpo" else CPOTrainer
    me = types.SimpleNamespace(is_encoder_decoder=False, padding_value=2, pad_token_id=2, aux_loss_enabled=False,
                               beta=0.1, loss_type="sigmoid", cpo_alpha=cpo_alpha, alpha=0.0, label_smoothing=0.0,
                               accelerator=types.SimpleNamespace(device=torch.device("cpu"),
                                                                 gather_for_metrics=lambda x: x))
    for fn in ("concatenated_forward", "get_batch_loss_metrics", "odds_ratio_loss", "cpo_loss"):
        if hasattr(cls, fn):
            setattr(me, fn, types.MethodType(getattr(cls, fn), me))
    me.concatenated_inputs, me.get_batch_logps = cls.concatenated_inputs, cls.get_batch_logps
    leaf = torch.randn(2 * b, s, vocab, dtype=getattr(torch, dtype)).requires_grad_()
    logits = leaf.nbytes
    at_gradient: list[int] = []

    def model(ids, attention_mask=None, use_cache=False):
        out = leaf * 1.0  # the LM head's output: a tensor of its own, saved by nothing
        # the backward is measured up to the logits' (summed) gradient: what comes after is the model's backward
        out.register_hook(lambda grad: at_gradient.append(counter.peak))
        return types.SimpleNamespace(logits=out)

    ids = torch.randint(3, vocab, (b, s))
    labels = ids.clone()
    labels[:, :4] = -100
    ones = torch.ones(b, s, dtype=torch.long)
    batch = {"chosen_input_ids": ids, "chosen_attention_mask": ones, "chosen_labels": labels,
             "rejected_input_ids": ids.clone(), "rejected_attention_mask": ones.clone(), "rejected_labels": labels.clone(),
             "prompt_input_ids": ids[:, :4].clone(), "prompt_attention_mask": ones[:, :4].clone()}
    counter = LiveBytes()
    counter.track([leaf, *batch.values()])
    base = counter.current
    with counter:
        counter.reset_peak()
        loss, _ = me.get_batch_loss_metrics(model, batch)
        forward = counter.peak - base - logits
        retained = counter.current - base
        counter.reset_peak()
        loss.backward()
    return forward, at_gradient[0] - base, retained


@pytest.mark.parametrize(("trainer", "dtype", "cpo_alpha"), [
    ("orpo", "float32", 1.0), ("orpo", "bfloat16", 1.0), ("cpo", "float32", 0.0), ("cpo", "bfloat16", 0.0),
])
@pytest.mark.parametrize(("b", "s", "vocab"), [(2, 16, 1000), (1, 24, 512), (3, 8, 2000)])
def test_loss_instants_match_torch_running_trls_loss(trainer, dtype, cpo_alpha, b, s, vocab):
    """:func:`logits_head.loss_bytes` against torch: the forward's peak beyond the logits, what the forward leaves
    (the saved tensors, and the logits when saved), and the backward's peak beyond what was alive before the loss
    (the leaf's own gradient, the logits' gradient, included, as fitplan's point counts it)."""
    from fitplan.trace.logits_head import loss_bytes

    forward, backward, retained = _trl_loss_peaks(trainer, dtype, b, s, vocab, cpo_alpha)
    e = 4 if dtype == "float32" else 2
    lb = loss_bytes(2 * b, s, vocab, e, trainer == "orpo" or cpo_alpha != 0, "cpu")
    logits = 2 * b * s * vocab * e
    kept = sum(lb.saved) + (logits if lb.logits_saved else 0)
    concat = 3 * 8 * 2 * b * s  # concatenated_inputs' three int64 tensors: fitplan's forward phase counts them apart
    for model, measured in ((lb.forward_peak + concat, forward), (kept, retained), (lb.backward_peak, backward)):
        # within 1 % (of the logits' bytes where the instant is smaller: CPO without NLL keeps only int tensors)
        assert abs(model - measured) < 0.01 * max(measured, logits), (model, measured)


def test_cuda_path_by_hand():
    """On CUDA ``selective_log_softmax`` is TRL's Triton kernel (trl/kernels/logprob_entropy.py): four fp32
    outputs per row and position, saves the logits; its backward's ``grad_logits = empty_like(logits)``
    (``2b·(s-1)·V·e``). b = 2 pairs, s = 16, V = 1000, bf16: the logits L = 4·16·1000·2 = 128,000; ORPO's NLL
    term saves log_softmax of the chosen half, 2·15·1000·2 = 60,000. The backward's last instant is the sum of the
    logits' two gradients (``3·L``); before it, the saved logits, the log-softmax and ``grad_logits``
    (128,000 + 60,000 + 120,000)."""
    from fitplan.trace.logits_head import loss_bytes

    lb = loss_bytes(4, 16, 1000, 2, True, "cuda")
    assert lb.logits_saved
    assert 60_000 in lb.saved and 16 * 4 * 15 in lb.saved
    assert lb.backward_peak == max(3 * 128_000, 128_000 + 60_000 + 120_000)


# --------------------------------------------------------------------------- by hand from TRL's source


def test_batch_is_six_int64_tensors_of_b_by_s():
    """DPODataCollatorWithPadding: chosen_/rejected_ input_ids, attention_mask, labels, (b, s) int64 each."""
    assert _estimate("tiny-llama", "orpo", "full")["batch_bytes"] == 6 * 8 * 2 * 16


def test_flops_per_token_of_a_pair_are_both_sequences_training_flops():
    """No reference forward: a pair's FLOPs per token are twice the policy's training FLOPs (6N + 12·L·h·s each),
    N = tiny-llama's parameters less the input embedding (a lookup)."""
    V, h, inter, L, s = 1000, 64, 176, 2, 16
    n = V * h + L * (4 * h * h + 3 * h * inter + 2 * h) + h
    for trainer in ("orpo", "cpo"):
        assert _estimate("tiny-llama", trainer, "full")["flops_per_token"] == pytest.approx(2 * (6 * n + 12 * L * h * s))


def test_alphapo_is_cpo_without_the_nll_term():
    """``CPOConfig.__post_init__``: ``loss_type="alphapo"`` becomes simpo with ``cpo_alpha = 0``."""
    alpha = _estimate("tiny-llama", "cpo", "full", loss_type="alphapo")["phase_bytes"]
    zero = _estimate("tiny-llama", "cpo", "full", cpo_alpha=0.0)["phase_bytes"]
    one = _estimate("tiny-llama", "cpo", "full")["phase_bytes"]
    assert alpha == zero and alpha["forward"] < one["forward"]


def test_report_states_the_trainers_defaults():
    defaults = _estimate("tiny-llama", "cpo", "full")["assumed_defaults"]
    assert "cpo_alpha 1.0 (CPOConfig default: the NLL term is computed)" in defaults
    assert "beta 0.1 (CPOConfig default)" in defaults and "no reference model (ORPO/CPO)" in defaults


@pytest.mark.parametrize(("args", "keys", "message"), [
    (["--loss-type", "kto_pair"], None, "Support for kto_pair has been removed in CPOTrainer. Please use KTOTrainer."),
    (["--loss-type", "bco_pair"], None, "Unknown loss type: bco_pair. Should be one of ['sigmoid', 'hinge', 'ipo', 'simpo']"),
    ([], {"loss_type": "kto_pair"}, "Support for kto_pair has been removed in CPOTrainer."),
    ([], {"cpo_alpha": -1}, "cpo_alpha must be a number >= 0"),
])
def test_what_cpo_refuses_exits_2(tmp_path, args, keys, message):
    extra = []
    if keys is not None:
        cfg = tmp_path / "cpo.json"
        cfg.write_text(json.dumps(keys))
        extra = ["--training-args", str(cfg)]
    r = run_cli("estimate", "--model", str(CONFIGS / "tiny-llama" / "config.json"), "--trainer", "cpo", "--device", "cpu",
                *args, *extra)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_autocast_cache_of_repeated_layers_goes_before_the_loss(tmp_path):
    """Five layers (fitplan replays layer 0 and one block standing for four): ORPOConfig's defaults (gradient
    checkpointing, bf16 autocast over fp32 weights). Every layer's cached 16-bit weight copies are alive at the
    LM head (the peak here) and go when accelerate's autocast context exits with the model's forward, before
    the loss: measured by the referee, within 1 % every phase."""
    pytest.importorskip("trl")
    sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    from fitplan_torch.trl_referee import measure_orpo

    config = {**_config("tiny-llama"), "num_hidden_layers": 5}
    path = tmp_path / "tiny-llama-5" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    measured = measure_orpo(config, trainer="orpo", method="full", batch=2, prompt=4, completion=12,
                            gradient_checkpointing=True, bf16=True, optim="adamw_torch_fused")
    predicted = fitplan.estimate(model=str(path), precision="bf16-mixed", optim="adamw_torch_fused",
                                 per_device_train_batch_size=2, max_seq_length=16, trainer="orpo", method="full",
                                 device="cpu", gradient_checkpointing=True)["phase_bytes"]
    for phase, value in predicted.items():
        assert abs(value - measured[phase]) / measured[phase] < 0.01, (phase, value, measured[phase])
