"""Precision as the HF Trainer (transformers 5.24), accelerate and DeepSpeed decide it: "auto" filled from the
TrainingArguments, mismatches refused as HF refuses them, and a warning for what fitplan had to assume
(docs/memory-model.md, "Precision as the HF Trainer decides it")."""

from __future__ import annotations

import json

import pytest

import fitplan
from fitplan.errors import FitplanError
from fitplan.inputs.importers import deepspeed_fields_from, deepspeed_precision

ZERO3_TEMPLATE = {  # transformers' docs ZeRO-3 template: every precision key "auto"
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "overlap_comm": True, "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "train_micro_batch_size_per_gpu": "auto",
}


def test_auto_takes_the_training_arguments_value():
    assert deepspeed_precision(ZERO3_TEMPLATE, "ds.json", bf16=True, fp16=False) == "bf16-master"
    assert deepspeed_precision(ZERO3_TEMPLATE, "ds.json", bf16=False, fp16=True) == "16-master"
    assert deepspeed_precision(ZERO3_TEMPLATE, "ds.json", bf16=False, fp16=False) == "32-true"


def test_auto_without_training_arguments_is_the_hf_default_with_a_warning():
    warnings: list[str] = []
    assert deepspeed_precision(ZERO3_TEMPLATE, "ds.json", warnings=warnings) == "32-true"
    assert any("bf16.enabled is \"auto\"" in w and "--bf16" in w for w in warnings)


def test_missing_section_follows_the_flag_as_accelerate_adds_it():
    assert deepspeed_precision({"zero_optimization": {"stage": 2}}, "ds.json", bf16=True, fp16=False) == "bf16-master"


def test_explicit_value_must_match_the_training_arguments():
    with pytest.raises(FitplanError, match="mismatch") as e:
        deepspeed_precision({"bf16": {"enabled": True}}, "ds.json", bf16=False, fp16=False)
    assert e.value.field == "$.bf16.enabled"
    warnings: list[str] = []  # not stated: the config's explicit value is taken, with a warning
    assert deepspeed_precision({"bf16": {"enabled": True}}, "ds.json", warnings=warnings) == "bf16-master"
    assert warnings


def test_fp16_and_bf16_both_enabled_is_refused():
    with pytest.raises(FitplanError, match="cannot be simultaneously enabled"):
        deepspeed_precision({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "ds.json")


def test_deepspeed_optimizer_section_replaces_optim():
    warnings: list[str] = []
    out = deepspeed_fields_from({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, "ds.json", bf16=True,
                                fp16=False, warnings=warnings)
    assert out["optim"] == "adamw_torch_fused" and any("ignored" in w for w in warnings)


def test_cli_bf16_with_the_zero3_template_is_deepspeed_bf16(cli, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(ZERO3_TEMPLATE))
    out = cli("estimate", "--model", "llama-2-7b", "--num-gpus", "8", "--bf16", "--deepspeed", str(ds), "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["scenario"]["training"]["precision"] == "bf16-master"


def test_training_args_full_eval_switches_deepspeed_auto(tmp_path):
    """``bf16.enabled: "auto"`` is filled with ``bf16 or bf16_full_eval`` (transformers/integrations/deepspeed.py)."""
    from fitplan.inputs.importers import training_args_fields

    ta = tmp_path / "args.json"
    ta.write_text(json.dumps({"bf16_full_eval": True, "deepspeed": ZERO3_TEMPLATE}))
    fields, _ = training_args_fields(ta)
    assert fields["precision"] == "bf16-master"


def test_bf16_on_a_gpu_without_bf16_tensor_cores_warns():
    est = fitplan.estimate(model="llama-2-7b", method="lora", gpu="v100-32gb", precision="bf16-mixed")
    assert any("no bf16 tensor cores" in w and "is_bf16_supported" in w for w in est.warnings)
    assert not any("bf16 tensor" in w for w in fitplan.estimate(model="llama-2-7b", method="lora", gpu="a100-80gb",
                                                                 precision="bf16-mixed").warnings)


def test_qlora_compute_dtype_warnings():
    # an fp32 load (Llama-2 publishes float16; dtype="auto" would load that)
    plain = fitplan.estimate(model="llama-2-7b", method="qlora", dtype="float32")
    assert any("QLoRA without bf16/fp16" in w for w in plain.warnings)
    ignored = fitplan.estimate(model="llama-2-7b", method="qlora", dtype="float32", bnb_4bit_compute_dtype="bf16")
    assert any("bnb_4bit_compute_dtype=bf16 is not what runs" in w for w in ignored.warnings)
    assert not [w for w in fitplan.estimate(model="llama-2-7b", method="qlora", precision="bf16-true").warnings
                if "compute" in w]


def test_sequence_beyond_positions():
    est = fitplan.estimate(model="llama-3-8b", max_seq_length=200_000)
    [w] = [w for w in est.warnings if "max_position_embeddings" in w]
    assert "200000" in w and "8192" in w
    [w] = [w for w in fitplan.estimate(model="gpt2", max_seq_length=4096).warnings if "max_position_embeddings" in w]
    assert "4096" in w and "1024" in w and "IndexError" in w
