"""TRL 1.16's reward model (``--trainer reward``, builtin/trl/reward.py): fitplan against TRL's ``RewardTrainer`` on the
CPU, phase by phase, and the parameters, batch and FLOPs by hand.

The referee (``fitplan_torch.trl_referee.measure_reward``) runs ``trl.RewardTrainer.train()`` for two optimizer steps
on a tiny random ``AutoModelForSequenceClassification`` (``num_labels=1``) and measures the second step's live bytes
per phase. Each test states ``optim`` and ``precision`` (``32-true``: the weights in fp32, ``bf16=False`` in
``RewardConfig``; ``bf16-mixed``: ``bf16=True``, autocast over fp32 weights; ``bf16-true``: the bf16 checkpoint,
``bf16=False``). With no LM head the backward's peak is the final RMSNorm's ``pow`` backward (its two temporaries
beside the other branch's gradient of the same input, before autograd sums them: trace/step_trace.py
``before_sum``): the 16-bit and autocast cases check it within 0.1 %.
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
V, H = 1000, 64
"""tiny-llama's and tiny-gemma's vocabulary and hidden size (their config.json)."""


def _config(name: str, fp32: bool) -> dict:
    config = json.loads((CONFIGS / name / "config.json").read_text())
    if fp32:
        config["torch_dtype"] = "float32"
    return config


def _estimate(tmp_path: Path, name: str, method: str, fp32: bool = False, **fields):
    path = tmp_path / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_config(name, fp32)))
    base = dict(model=str(path), precision="32-true", optim="adamw_torch_fused", per_device_train_batch_size=2,
                max_seq_length=16, trainer="reward", method=method, lora_target_modules=LORA, lora_r=8, device="cpu",
                gradient_checkpointing=False)
    base.update(fields)
    return fitplan.estimate(**base)


@pytest.mark.parametrize(("name", "method", "fp32", "ckpt", "bf16"), [
    ("tiny-llama", "full", False, False, False),     # dense, fp32 checkpoint: the LM head gone, score (1, h) trains
    ("tiny-llama", "lora", False, False, False),     # LoRA (SEQ_CLS): score's trainable copy beside the adapters
    ("tiny-llama", "full", False, True, True),       # RewardConfig's defaults: gradient checkpointing, bf16=True
                                                     # (autocast over fp32 weights: score's cached 16-bit copy)
    ("tiny-gemma", "full", True, False, False),      # tied embeddings: the embedding stays, score is added
    ("tiny-gemma", "lora", True, False, False),
    ("tiny-qwen2-moe", "full", True, False, False),  # MoE
])
def test_reward_phases_within_one_percent_of_trl(tmp_path, name, method, fp32, ckpt, bf16):
    pytest.importorskip("trl")
    sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    from fitplan_torch.trl_referee import measure_reward

    measured = measure_reward(_config(name, fp32), method=method, batch=2, prompt=4, completion=12,
                              lora_target_modules=tuple(LORA), optim="adamw_torch_fused", bf16=bf16,
                              gradient_checkpointing=ckpt)
    predicted = _estimate(tmp_path, name, method, fp32, gradient_checkpointing=ckpt,
                          precision="bf16-mixed" if bf16 else "32-true")["phase_bytes"]
    assert set(predicted) == {"forward", "backward", "optimizer_step"}  # no reference model
    for phase, value in predicted.items():
        assert abs(value - measured[phase]) / measured[phase] < 0.01, (phase, value, measured[phase])


@pytest.mark.parametrize(("name", "method", "precision"), [
    ("tiny-gemma", "full", "bf16-true"),        # tied embeddings, bf16 weights
    ("tiny-qwen2-moe", "full", "bf16-true"),    # MoE, bf16 weights
    ("tiny-qwen3", "full", "bf16-true"),
    ("tiny-llama", "full", "bf16-mixed"),       # autocast over fp32 weights, no checkpointing
    ("tiny-llama", "lora", "bf16-mixed"),
])
def test_reward_backward_peak_is_the_final_norms_pow_backward(tmp_path, name, method, precision):
    """Were 0.5-1.3 % low before the step trace counted an op's backward temporaries before the sum of its
    gradients into the waiting ones: now within 0.1 % every phase."""
    pytest.importorskip("trl")
    sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    from fitplan_torch.trl_referee import measure_reward

    bf16 = precision == "bf16-mixed"
    measured = measure_reward(_config(name, bf16), method=method, batch=2, prompt=4, completion=12,
                              lora_target_modules=tuple(LORA), optim="adamw_torch_fused", bf16=bf16)
    predicted = _estimate(tmp_path, name, method, bf16, precision=precision)["phase_bytes"]
    for phase, value in predicted.items():
        assert abs(value - measured[phase]) / measured[phase] < 0.001, (phase, value, measured[phase])


# --------------------------------------------------------------------------- by hand


def _tiny_llama_decoder() -> int:
    """tiny-llama's decoder without embeddings: per layer q, k, v, o (h·h each), gate/up/down (h·176 each), two
    RMSNorms; the final norm."""
    return 2 * (4 * H * H + 3 * H * 176 + 2 * H) + H


def test_the_score_head_replaces_the_lm_head(tmp_path):
    """GenericForSequenceClassification (transformers/modeling_layers.py): the decoder, the input embedding and
    ``score`` (1, h), no LM head. Untied tiny-llama: V·h + decoder + h (the causal LM has 2·V·h); tied tiny-gemma:
    its embedding stays and ``score`` adds h."""
    llama = _estimate(tmp_path, "tiny-llama", "full")
    assert llama["param_count"] == V * H + _tiny_llama_decoder() + H
    gemma_lm = fitplan.estimate(model=str(CONFIGS / "tiny-gemma" / "config.json"), precision="bf16-true",
                                optim="adamw_torch_fused", device="cpu")["param_count"]
    assert _estimate(tmp_path, "tiny-gemma", "full", precision="bf16-true")["param_count"] == gemma_lm + H


def test_lora_trains_the_score_copy(tmp_path):
    """peft's PeftModelForSequenceClassification appends ``score`` to ``modules_to_save``: besides A (8, 64) and
    B (64, 8) on q_proj and v_proj in both layers, one (1, 64) copy trains."""
    trainable = _estimate(tmp_path, "tiny-llama", "lora")["trainable_tensors"]
    assert sum(n * (shape[0] * shape[1]) for shape, n in trainable) == 2 * 2 * (8 * H + H * 8) + H
    assert dict(trainable)[(1, H)] == 1


def test_reward_batch_and_flops_by_hand(tmp_path):
    """DataCollatorForPreference (reward_trainer.py): input_ids and attention_mask, int64 (2b, s) each. FLOPs per
    pair: both sequences' training FLOPs, 2·(6N + 12·L·h·s), N the parameters less the input embedding."""
    e = _estimate(tmp_path, "tiny-llama", "full")
    assert e["batch_bytes"] == 2 * 8 * (2 * 2) * 16
    n = _tiny_llama_decoder() + H
    assert e["flops_per_token"] == pytest.approx(2 * (6 * n + 12 * 2 * H * 16))


def test_reward_needs_an_architecture(tmp_path):
    """A bare parameter count cannot say which parameters are the LM head's: exit 2 naming the field."""
    with pytest.raises(FitplanError, match="needs the model's architecture") as e:
        fitplan.estimate(params="7B", trainer="reward", precision="bf16-true", optim="adamw_torch_fused")
    assert e.value.field == "trainer"
    r = run_cli("estimate", "--params", "7B", "--trainer", "reward", "--optim", "adamw_torch_fused",
                "--precision", "bf16-true")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "architecture" in r.stderr


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-granite"])
def test_reward_refuses_models_without_the_generic_classifier(name):
    """transformers 5.24: GPT-2 has its own GPT2ForSequenceClassification, Granite no sequence classifier at all
    (models/auto/modeling_auto.py): exit 2 rather than the generic score head's numbers."""
    r = run_cli("estimate", "--model", str(CONFIGS / name / "config.json"), "--trainer", "reward",
                "--optim", "adamw_torch_fused", "--precision", "32-true", "--device", "cpu")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "GenericForSequenceClassification" in r.stderr


def test_a_reward_config_json_fills_the_run(tmp_path):
    """A RewardConfig dump read like --training-args: ``max_length`` is the sequence length, the batch and the
    dtype follow. By hand: the weights are the classifier's fp32 parameters (4 bytes each, no LM head), the three
    phases have no reference forward."""
    cfg = tmp_path / "reward.json"
    cfg.write_text(json.dumps({"per_device_train_batch_size": 2, "max_length": 16, "gradient_checkpointing": False,
                               "bf16": False, "optim": "adamw_torch_fused", "center_rewards_coefficient": 0.01}))
    r = run_cli("estimate", "--model", str(CONFIGS / "tiny-llama" / "config.json"), "--trainer", "reward",
                "--device", "cpu", "--training-args", str(cfg), "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["memory"]["phases_bytes"]) == {"forward", "backward", "optimizer_step"}
    assert out["memory"]["per_gpu_bytes"]["weights"] == 4 * (V * H + _tiny_llama_decoder() + H)
