"""TRL 1.16's DPO and KTO steps (builtin/trl/): fitplan against TRL's own trainers on the CPU, phase by phase.

The referee (``fitplan_torch.trl_referee``) runs ``trl.DPOTrainer.train()`` (or ``KTOTrainer``) for two optimizer steps on a tiny
random model and measures the second step's live bytes per phase: the policy's forward, the reference
forward (no grad), the backward and the optimizer step. Each test states ``optim`` and ``precision``
(the config's dtype: ``32-true`` for an fp32 checkpoint, ``bf16-true`` for a bf16 one, with ``bf16=False`` in
``DPOConfig``; ``bf16-mixed`` with ``bf16=True``, TRL's default, over fp32 weights). Other numbers are derived by hand from TRL's source.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import fitplan
from fitplan.errors import FitplanError

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"
LORA = ["q_proj", "v_proj"]


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def _estimate(name: str, method: str, **fields):
    precision = "32-true" if _config(name).get("torch_dtype", "float32") == "float32" else "bf16-true"
    base = dict(model=str(CONFIGS / name / "config.json"), precision=precision, optim="adamw_torch_fused",
                per_device_train_batch_size=2, max_seq_length=16, trainer="dpo", method=method,
                lora_target_modules=LORA, lora_r=8, device="cpu", gradient_checkpointing=False)
    base.update(fields)
    return fitplan.estimate(**base)


# --------------------------------------------------------------------------- the referee: TRL's DPOTrainer


@pytest.mark.parametrize(("trainer", "name", "method", "ckpt", "bf16"), [
    ("dpo", "tiny-llama", "full", False, False),      # dense, fp32, a second full model as reference
    ("dpo", "tiny-llama", "lora", False, False),      # LoRA: the reference is the policy with adapters disabled
    ("dpo", "tiny-llama", "full", True, False),       # TRL's default gradient checkpointing
    ("dpo", "tiny-llama", "full", False, True),       # TRL's default bf16 (autocast over fp32 weights): the
                                                      # reference model's cached 16-bit weight copies
    ("dpo", "tiny-qwen2-moe", "full", False, False),  # MoE, bf16 weights
    ("dpo", "tiny-gemma", "lora", False, False),      # tied embeddings, bf16 weights
    ("kto", "tiny-llama", "full", False, False),      # KTO: b sequences, three no-grad forwards (KL ones)
    ("kto", "tiny-qwen2-moe", "lora", False, False),
    ("kto", "tiny-gemma", "full", False, False),
])
def test_preference_phases_within_one_percent_of_trl(trainer, name, method, ckpt, bf16):
    pytest.importorskip("trl")
    sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    from fitplan_torch.trl_referee import measure_dpo

    measured = measure_dpo(_config(name), trainer=trainer, method=method, batch=2, prompt=4, completion=12,
                           gradient_checkpointing=ckpt, lora_target_modules=tuple(LORA), optim="adamw_torch_fused",
                           bf16=bf16)
    extra = {"precision": "bf16-mixed"} if bf16 else {}
    predicted = _estimate(name, method, trainer=trainer, gradient_checkpointing=ckpt, **extra)["phase_bytes"]
    assert set(predicted) == {"forward", "reference_forward", "backward", "optimizer_step"}
    for phase, value in predicted.items():
        assert abs(value - measured[phase]) / measured[phase] < 0.01, (phase, value, measured[phase])


# --------------------------------------------------------------------------- by hand from TRL's source


def _tiny_llama_params() -> int:
    """tiny-llama's parameters: embedding and LM head V·h each, per layer q, k, v, o (h·h each, 4 heads of 16),
    gate/up/down (h·I each) and two RMSNorms, and the final norm."""
    V, h, inter, L = 1000, 64, 176, 2
    return 2 * V * h + L * (4 * h * h + 3 * h * inter + 2 * h) + h


def test_reference_model_is_a_second_copy_only_for_full_fine_tuning():
    """DPOTrainer.__init__: ``ref_model`` loaded in the policy's dtype for full fine-tuning; none under LoRA
    (adapters disabled) or with ``precompute_ref_log_probs``. tiny-llama is fp32; its rotary ``inv_freq`` and
    ``original_inv_freq`` are head_dim/2 = 8 fp32 each."""
    full = _estimate("tiny-llama", "full")
    assert full["reference_model_bytes"] == 4 * _tiny_llama_params() + 2 * 8 * 4
    assert _estimate("tiny-llama", "lora")["reference_model_bytes"] == 0
    pre = _estimate("tiny-llama", "full", precompute_ref_log_probs=True)
    assert pre["reference_model_bytes"] == 0
    assert "reference_forward" not in pre["phase_bytes"]


def test_preference_batches_by_hand():
    """DataCollatorForPreference: input_ids, attention_mask, completion_mask, each (2b, s) int64;
    DataCollatorForUnpairedPreference: the same three and their KL_ twins, (b, s) int64, and b bool labels."""
    assert _estimate("tiny-llama", "full")["batch_bytes"] == 3 * 8 * (2 * 2) * 16
    assert _estimate("tiny-llama", "full", trainer="kto")["batch_bytes"] == 6 * 8 * 2 * 16 + 2


def test_fused_head_buffer_has_the_chunk_width_whatever_the_vocabulary():
    """``mm_buf = torch.empty((min(N, 4096), chunk_size))`` (trl/kernels/chunked_logprob.py) with chunk_size
    32768 (trl/trainer/utils.py): N = 2b·(s-1) rows of fp32 for tiny-llama, 4096 rows of bf16 beyond."""
    from fitplan.trace.fused_head import mm_buf_bytes, tile_sizes

    assert mm_buf_bytes(4 * 15, "f32") == 60 * 32768 * 4
    assert mm_buf_bytes(10_000, "bf16") == 4096 * 32768 * 2
    assert tile_sizes(5000, 40000) == [(4096, 32768), (4096, 7232), (904, 32768), (904, 7232)]


def test_sft_is_unchanged_by_the_trainer_field():
    """``trainer = "sft"`` is the default: the same estimate with and without it."""
    a = _estimate("tiny-llama", "full", trainer="sft")
    b = fitplan.estimate(model=str(CONFIGS / "tiny-llama" / "config.json"), precision="32-true", optim="adamw_torch_fused",
                         per_device_train_batch_size=2, max_seq_length=16, device="cpu", gradient_checkpointing=False)
    assert a["phase_bytes"] == b["phase_bytes"] and "reference_forward" not in a["phase_bytes"]


# --------------------------------------------------------------------------- time


def test_dpo_flops_per_token_of_a_pair_by_hand():
    """Per token of a pair: the policy's training FLOPs on both sequences, ``2·(6N + 12·L·h·s)``, and the
    reference forward of both, ``2·(2N + 4·L·h·s)``. tiny-llama: N = its parameters less the input embedding
    (a lookup), L = 2, h = 64, s = 16."""
    n = _tiny_llama_params() - 1000 * 64
    att = 12 * 2 * 64 * 16
    assert _estimate("tiny-llama", "full")["flops_per_token"] == pytest.approx(2 * (6 * n + att) + 2 * (2 * n + att / 3))
    pre = _estimate("tiny-llama", "full", precompute_ref_log_probs=True)
    assert pre["flops_per_token"] == pytest.approx(2 * (6 * n + att))
    # KTO: one sequence, its training FLOPs and three forwards (policy KL, reference KL, reference)
    kto = _estimate("tiny-llama", "full", trainer="kto")
    assert kto["flops_per_token"] == pytest.approx(6 * n + att + 3 * (2 * n + att / 3))


def test_reference_forward_is_priced_in_the_micro_step():
    """The reference forward adds its own roofline time; precomputed log-probabilities remove it."""
    kw = dict(gpu="h100-sxm", device="cuda", per_device_train_batch_size=4, max_seq_length=512)
    with_ref = _estimate("tiny-llama", "full", **kw)["micro_step_time"]
    without = _estimate("tiny-llama", "full", precompute_ref_log_probs=True, **kw)["micro_step_time"]
    assert with_ref["reference_forward"] > 0 and "reference_forward" not in without
    assert with_ref["micro_step"] == pytest.approx(without["micro_step"] + with_ref["reference_forward"])


# --------------------------------------------------------------------------- a TRL config


def test_a_dpo_config_json_fills_the_trl_fields(tmp_path):
    """``beta`` and ``precompute_ref_log_probs`` of a DPOConfig dump become the [trl] fields; ``max_length`` the
    sequence length; the trainer is said by --trainer."""
    cfg = tmp_path / "dpo.json"
    cfg.write_text(json.dumps({"per_device_train_batch_size": 2, "max_length": 16, "gradient_checkpointing": False,
                               "bf16": False, "beta": 0.2, "precompute_ref_log_probs": True, "optim": "adamw_torch_fused"}))
    r = run_cli("estimate", "--model", str(CONFIGS / "tiny-llama" / "config.json"), "--trainer", "dpo", "--device", "cpu",
                "--training-args", str(cfg), "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["memory"]["phases_bytes"]) == {"forward", "backward", "optimizer_step"}  # no reference forward
    assert not any(d.startswith("beta") for d in out["defaults"])
    assert "reference log-probs precomputed (no reference model in the step)" in out["defaults"]


@pytest.mark.parametrize(("keys", "message"), [
    ({"sync_ref_model": True, "precompute_ref_log_probs": True}, "You cannot use `sync_ref_model=True` together"),
    ({"loss_type": ["sigmoid", "bco_pair"], "loss_weights": [1.0]}, "`loss_weights` must have the same length"),
    ({"beta": -1}, "beta must be a number >= 0"),
])
def test_what_trl_refuses_in_a_config_exits_2(tmp_path, keys, message):
    cfg = tmp_path / "dpo.json"
    cfg.write_text(json.dumps(keys))
    r = run_cli("estimate", "--model", str(CONFIGS / "tiny-llama" / "config.json"), "--trainer", "dpo",
                "--training-args", str(cfg))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_validate_refuses_a_trl_trainer_rather_than_measure_the_wrong_step():
    """``fitplan validate`` runs the HF Trainer's step: comparing it with a DPO estimate would be meaningless."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    import fitplan_torch

    with pytest.raises(FitplanError, match="not TRL's 'dpo' trainer"):
        fitplan_torch.validate(_estimate("tiny-llama", "full"), mode="cpu")
