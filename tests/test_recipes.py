"""Recipe import (``fitplan estimate RECIPE.yaml``: src/fitplan/inputs/recipes.py and recipe_*.py) and LoRA on the
LM head and the input embeddings (builtin/lora.py, trace/kernels.py ``lora_embedding``).

The fixtures under tests/data/recipes/ are public recipes copied unchanged (each file's header names its repository
and commit; the two DeepSpeed JSONs beside them: axolotl-ai-cloud/axolotl @ 067b021c ``deepspeed_configs/zero3.json``,
hiyouga/LLaMA-Factory @ 00052690 ``examples/deepspeed/ds_z3_config.json``; docs/sources.md). The expected scenario of
each was written by reading its YAML and the framework's rule the reader's docstring cites, not from fitplan's output.
Every estimate here states ``optim`` and ``precision`` (or the recipe does).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
from conftest import run_cli

import fitplan
from fitplan import FitplanError
from fitplan.inputs.recipes import recipe_fields

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "tests" / "data" / "recipes"
CONFIGS = ROOT / "tests" / "data" / "configs"

# torchtune @ 30b8519: every recipe below has dtype: bf16 (-> dtype bfloat16, precision bf16-true), the LoRA
# ones keep adapters in bf16 (autocast_adapter_dtype False), loss CEWithChunkedOutputLoss (-> chunked), no
# dataset.packed (-> pad), tokenizer.max_seq_len null (-> not set).
TT_BF16 = {"dtype": "bfloat16", "precision": "bf16-true", "padding": "pad", "loss_implementation": "chunked"}
TT_LORA = {**TT_BF16, "method": "lora", "autocast_adapter_dtype": False, "lora_dropout": 0.0}
TT_QLORA = {**TT_LORA, "method": "qlora", "kbit_preparation": "none", "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "bfloat16"}
ATTN_ALL = ("q_proj", "v_proj", "k_proj", "o_proj")
MLP = ("gate_proj", "down_proj", "up_proj")
TORCHTUNE = {
    "llama3_1-8B_lora_single_device": {
        **TT_LORA, "model": "llama-3.1-8b", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ("q_proj", "v_proj"),
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 64, "num_train_epochs": 1.0,
        "gradient_checkpointing": True, "optim": "adamw_torch_fused"},
    "llama3_1-8B_qlora_single_device": {
        **TT_QLORA, "model": "llama-3.1-8b", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ATTN_ALL + MLP,
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 16, "num_train_epochs": 1.0,
        "gradient_checkpointing": True, "optim": "adamw_torch_fused"},
    "llama3_1-8B_lora": {  # the distributed recipe: no checkpointing, accumulation 32, no compile key
        **TT_LORA, "model": "llama-3.1-8b", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ("q_proj", "v_proj"),
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 32, "num_train_epochs": 1.0,
        "gradient_checkpointing": False, "optim": "adamw_torch_fused"},
    "llama3_1-8B_full": {  # custom_sharded_layers: a distributed FSDP2 recipe (fully_shard, resharded)
        **TT_BF16, "model": "llama-3.1-8b", "method": "full", "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1, "num_train_epochs": 3.0, "gradient_checkpointing": True,
        "optim": "adamw_torch_fused", "fsdp": "full_shard"},
    # optimizer_in_bwd: True (one optimizer per parameter, stepped in its gradient's hook), no accumulation
    "llama3_1-8B_full_single_device": {
        **TT_BF16, "model": "llama-3.1-8b", "method": "full", "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1, "num_train_epochs": 3.0, "gradient_checkpointing": True,
        "optim": "paged_adamw_8bit", "optimizer_in_bwd": True},
    "mistral-7B_full_low_memory": {  # bitsandbytes.optim.PagedAdamW: 32-bit states
        **TT_BF16, "model": "mistral-7b", "method": "full", "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1, "num_train_epochs": 3.0, "gradient_checkpointing": True,
        "optim": "paged_adamw_32bit", "optimizer_in_bwd": True},
    "llama2-7B_full_low_memory": {
        **TT_BF16, "model": "llama-2-7b", "method": "full", "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1, "num_train_epochs": 3.0, "gradient_checkpointing": True,
        "optim": "paged_adamw_32bit", "optimizer_in_bwd": True},
    "mistral-7B_qlora_single_device": {
        **TT_QLORA, "model": "mistral-7b", "lora_r": 64, "lora_alpha": 16, "lora_target_modules": ("q_proj", "k_proj",
        "v_proj") + MLP, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "num_train_epochs": 3.0,
        "gradient_checkpointing": True, "optim": "adamw_torch_fused"},
    "llama2-7B_lora_single_device": {
        **TT_LORA, "model": "llama-2-7b", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ("q_proj", "v_proj"),
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 64, "num_train_epochs": 1.0,
        "gradient_checkpointing": True, "optim": "adamw_torch_fused"},
    "gemma-2B_lora_single_device": {  # no apply_lora_to_output key: false
        **TT_LORA, "model": "gemma-2b", "lora_r": 64, "lora_alpha": 128, "lora_target_modules": ("q_proj", "k_proj",
        "v_proj") + MLP, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "num_train_epochs": 3.0,
        "gradient_checkpointing": True, "optim": "adamw_torch_fused"},
    "code_llama2-7B_qlora_single_device": {
        **TT_QLORA, "model": "codellama-7b", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ATTN_ALL + MLP,
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 16, "num_train_epochs": 1.0,
        "gradient_checkpointing": True, "optim": "adamw_torch_fused"},
}

# axolotl @ 067b021: bf16: auto (-> bf16 true, dtype bfloat16), attn_implementation flash_attention_2,
# gradient_checkpointing true, sample_packing true (-> pack) unless said.
AX = {"dtype": "bfloat16", "bf16": True, "tf32": False, "attn_implementation": "flash_attention_2",
      "gradient_checkpointing": True, "padding": "pack"}
AX_QLORA = {"method": "qlora", "kbit_preparation": "none", "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "bfloat16"}
SEVEN = MLP + ("q_proj", "v_proj", "k_proj", "o_proj")
AXOLOTL = {
    "llama-3-lora-1b.yml": {
        **AX, "model": "NousResearch/Llama-3.2-1B", "method": "lora", "lora_r": 16, "lora_alpha": 32,
        "lora_dropout": 0.05, "lora_target_modules": SEVEN, "max_seq_length": 2048, "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2, "num_train_epochs": 1.0, "optim": "adamw_8bit"},
    "llama-3-qlora-1b.yml": {
        **AX, **AX_QLORA, "model": "NousResearch/Llama-3.2-1B", "lora_r": 32, "lora_alpha": 16, "lora_dropout": 0.05,
        "lora_target_modules": SEVEN, "max_seq_length": 2048, "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 4, "num_train_epochs": 1.0, "optim": "adamw_bnb_8bit"},
    "llama-3-fft-8b.yaml": {
        **AX, "model": "NousResearch/Meta-Llama-3.1-8B", "method": "full", "max_seq_length": 8192,
        "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "num_train_epochs": 1.0,
        "optim": "paged_adamw_8bit"},
    "llama-3-fft-8b-liger-fsdp.yaml": {  # fsdp full_shard + fsdp_offload_params; no version: the Trainer's FSDP2
        **AX, "model": "NousResearch/Meta-Llama-3.1-8B", "method": "full", "max_seq_length": 4096,
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "num_train_epochs": 1.0,
        "optim": "adamw_torch_fused", "loss_implementation": "liger", "fsdp": "full_shard", "offload_params": True,
        "offload_optimizer": True, "stack": "fsdp2"},
    "llama-3-qlora-fsdp-70b.yaml": {  # sample_packing false, no pad_to_sequence_len: pad
        **AX, **AX_QLORA, "model": "casperhansen/llama-3-70b-fp16", "lora_r": 8, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_target_modules": ("all-linear",), "max_seq_length": 512, "padding": "pad",
        "per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "num_train_epochs": 4.0,
        "optim": "adamw_torch_fused", "fsdp": "full_shard", "offload_params": True, "offload_optimizer": True,
        "stack": "fsdp2"},
    "gemma2-qlora.yml": {
        **AX, **AX_QLORA, "tf32": True, "model": "google/gemma-2-9b", "lora_r": 32, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_target_modules": ("all-linear",), "max_seq_length": 2048,
        "per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "num_train_epochs": 4.0,
        "optim": "adamw_bnb_8bit"},
    "llama-3-lora-1b-ray.yml": {  # Ray Train: 4 workers, one GPU each; deepspeed_configs/zero3.json beside it
        **AX, "model": "NousResearch/Llama-3.2-1B", "method": "lora", "lora_r": 16, "lora_alpha": 32,
        "lora_dropout": 0.05, "lora_target_modules": SEVEN, "max_seq_length": 2048, "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2, "num_train_epochs": 1.0, "optim": "adamw_8bit", "num_gpus": 4,
        # zero3.json: stage 3, overlap_comm true, sub_group_size 0, the three "auto" sizes, max_live_parameters and
        # max_reuse_distance 0 (DeepSpeed's aliases of the stage3_ names), no offload, bf16 "auto" -> true
        "stack": "deepspeed", "zero_stage": 3, "overlap_comm": True, "sub_group_size": "0",
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": "0",
        "stage3_max_reuse_distance": "0", "offload_optimizer": False, "offload_params": False,
        "precision": "bf16-master"},
    "llama-2-qlora.yml": {
        **AX, **AX_QLORA, "model": "NousResearch/Llama-2-7b-hf", "lora_r": 32, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_target_modules": ("all-linear",), "max_seq_length": 4096,
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "num_train_epochs": 4.0,
        "optim": "paged_adamw_32bit"},
    "llama-2-qlora-fsdp.yml": {  # sample_packing false, no pad_to_sequence_len: pad; fsdp full_shard + offload
        **AX, **AX_QLORA, "model": "NousResearch/Llama-2-7b-hf", "lora_r": 32, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_target_modules": ("all-linear",), "max_seq_length": 512, "padding": "pad",
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "num_train_epochs": 4.0,
        "optim": "adamw_torch_fused", "fsdp": "full_shard", "offload_params": True, "offload_optimizer": True,
        "stack": "fsdp2"},
    "llama-3-qlora.yml": {
        **AX, **AX_QLORA, "model": "NousResearch/Meta-Llama-3-8B", "lora_r": 32, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_target_modules": ("all-linear",), "max_seq_length": 4096,
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "num_train_epochs": 4.0,
        "optim": "paged_adamw_32bit"},
}

# LLaMA-Factory: bf16 true (-> dtype bfloat16), lora_rank 8 and no lora_alpha (-> 16), lora_target all
# (-> all-linear), cutoff_len 2048, checkpointing on (no disable_gradient_checkpointing), no packing key.
LF = {"dtype": "bfloat16", "max_seq_length": 2048, "gradient_checkpointing": True, "num_train_epochs": 3.0,
      "per_device_train_batch_size": 1}
LF_LORA = {**LF, "method": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ("all-linear",)}
# examples/deepspeed/ds_z3_config.json: stage 3, overlap_comm false, the three "auto" sizes, the 1e9 ones, no
# offload, bf16 "auto" resolved by bf16: true -> DeepSpeed's bf16 optimizer
DS3 = {"stack": "deepspeed", "zero_stage": 3, "overlap_comm": False, "offload_optimizer": False, "offload_params": False,
       "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
       "stage3_max_live_parameters": "1000000000", "stage3_max_reuse_distance": "1000000000",
       "sub_group_size": "1000000000", "precision": "bf16-master"}
LLAMAFACTORY = {
    "train_lora-llama3_lora_sft.yaml": {
        **LF_LORA, "model": "meta-llama/Meta-Llama-3-8B-Instruct", "bf16": True, "padding": "pad",
        "gradient_accumulation_steps": 8},
    "train_lora-llama3_lora_pretrain.yaml": {  # stage pt: packing on by default (parser.py)
        **LF_LORA, "model": "meta-llama/Meta-Llama-3-8B-Instruct", "bf16": True, "padding": "pack",
        "gradient_accumulation_steps": 8},
    "train_lora-llama3_lora_sft_ds3.yaml": {  # ZeRO-3, unquantized: adapters not cast to fp32 (adapter.py)
        **LF_LORA, **DS3, "model": "meta-llama/Meta-Llama-3-8B-Instruct", "padding": "pad",
        "gradient_accumulation_steps": 2, "autocast_adapter_dtype": False},
    "train_full-llama3_full_sft.yaml": {
        **LF, **DS3, "model": "meta-llama/Meta-Llama-3-8B-Instruct", "method": "full", "padding": "pad",
        "gradient_accumulation_steps": 2},
    "train_qlora-llama3_lora_sft_otfq.yaml": {
        **LF_LORA, "model": "meta-llama/Meta-Llama-3-8B-Instruct", "bf16": True, "method": "qlora", "padding": "pad",
        "gradient_accumulation_steps": 8, "kbit_preparation": "none", "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16"},
    "train_lora-qwen3_lora_sft.yaml": {
        **LF_LORA, "model": "Qwen/Qwen3-4B-Instruct-2507", "bf16": True, "padding": "pad",
        "gradient_accumulation_steps": 8},
    "train_full-qwen3_full_sft.yaml": {
        **LF, **DS3, "model": "Qwen/Qwen3-4B-Instruct-2507", "method": "full", "padding": "pad",
        "gradient_accumulation_steps": 2},
    "train_lora-qwen3_lora_pretrain.yaml": {
        **LF_LORA, "model": "Qwen/Qwen3-4B-Instruct-2507", "bf16": True, "padding": "pack",
        "gradient_accumulation_steps": 8},
    "train_qlora-qwen3_lora_sft_otfq.yaml": {
        **LF_LORA, "model": "Qwen/Qwen3-4B-Instruct-2507", "bf16": True, "method": "qlora", "padding": "pad",
        "gradient_accumulation_steps": 8, "kbit_preparation": "none", "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16"},
    "train_lora-qwen3_lora_sft_ds3.yaml": {
        **LF_LORA, **DS3, "model": "Qwen/Qwen3-4B-Instruct-2507", "padding": "pad", "gradient_accumulation_steps": 2,
        "autocast_adapter_dtype": False},
}


def _cases():
    for name, want in TORCHTUNE.items():
        yield pytest.param(RECIPES / "torchtune" / f"{name}.yaml", want, id=f"torchtune-{name}")
    for name, want in AXOLOTL.items():
        yield pytest.param(RECIPES / "axolotl" / name, want, id=f"axolotl-{name}")
    for name, want in LLAMAFACTORY.items():
        yield pytest.param(RECIPES / "llamafactory" / name, want, id=f"llamafactory-{name}")


@pytest.mark.parametrize(("path", "want"), list(_cases()))
def test_each_public_recipe_gives_the_scenario_its_yaml_states(path, want):
    fields, _ = recipe_fields(path)
    assert fields == want


UNRESOLVED = {"llama-3-qlora-fsdp-70b.yaml": "casperhansen/llama-3-70b-fp16", "train_lora-qwen3_lora_sft.yaml": "",
              "train_lora-qwen3_lora_sft_ds3.yaml": "", "train_full-qwen3_full_sft.yaml": "",
              "train_lora-qwen3_lora_pretrain.yaml": "", "train_qlora-qwen3_lora_sft_otfq.yaml": ""}
"""Recipes whose model is in neither the catalog nor a Hub cache here (a Llama-3-70B mirror, Qwen3-4B-Instruct-2507)."""


@pytest.mark.parametrize(("path", "want"), [c for c in _cases() if c.values[0].name not in UNRESOLVED])
def test_each_imported_scenario_is_one_fitplan_estimates(path, want):
    """The scenario passes fitplan's checks (the stack's rules, the optimizer, the LoRA targets on the model) and
    the peak holds at least the weights."""
    est = fitplan.estimate(**recipe_fields(path)[0])
    assert est.role("peak") > est.values["weight_bytes"] > 0


@pytest.mark.parametrize(("path", "key", "value"), [
    (RECIPES / "axolotl" / "llama-2-fft_optimized.yml", "flash_attn_fuse_mlp", True),
    (RECIPES / "llamafactory" / "train_lora-llama3_lora_dpo.yaml", "stage", "dpo"),
    (RECIPES / "llamafactory" / "train_lora-llama3_lora_reward.yaml", "stage", "rm"),
])
def test_public_recipes_with_unmodelled_keys_are_refused_by_name(path, key, value):
    with pytest.raises(FitplanError) as e:
        recipe_fields(path)
    assert (e.value.file, e.value.field, e.value.value) == (str(path), f"$.{key}", value)
    assert "does not model" in e.value.message


TORCHTUNE_HEAD = ("model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_attn_modules: [q_proj]\n"
                  "dtype: bf16\n")


@pytest.mark.parametrize(("text", "field", "value"), [
    (TORCHTUNE_HEAD + "optimizer:\n  _component_: torchao.prototype.low_bit_optim.AdamW4bit\n",
     "$.optimizer._component_", "torchao.prototype.low_bit_optim.AdamW4bit"),
    (TORCHTUNE_HEAD + "loss:\n  _component_: torch.nn.CrossEntropyLoss\n", "$.loss._component_",
     "torch.nn.CrossEntropyLoss"),
    (TORCHTUNE_HEAD + "loss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n  num_output_chunks: 16\n",
     "$.loss.num_output_chunks", 16),
    ("base_model: x/y\nactivation_offloading: disk\n", "$.activation_offloading", "disk"),
    ("base_model: x/y\ngradient_checkpointing: offload_disk\n", "$.gradient_checkpointing", "offload_disk"),
    ("base_model: x/y\nadapter: lora\npeft_use_dora: true\n", "$.peft_use_dora", True),
    ("model_name_or_path: x/y\nstage: sft\nquantization_bit: 2\n", "$.quantization_bit", 2),
    ("model_name_or_path: x/y\nstage: sft\nuse_dora: true\n", "$.use_dora", True),
    ("model_name_or_path: x/y\nstage: sft\nfinetuning_type: freeze\n", "$.finetuning_type", "freeze"),
])
def test_memory_relevant_keys_fitplan_cannot_model_are_refused(tmp_path, text, field, value):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(FitplanError) as e:
        recipe_fields(path)
    assert (e.value.file, e.value.field, e.value.value) == (str(path), field, value)


def test_ignored_and_unknown_keys_are_named_in_warnings(tmp_path):
    path = tmp_path / "recipe.yml"
    path.write_text("base_model: x/y\nwandb_project: p\nlearning_rate: 0.1\nmystery_knob: 3\n")
    _, warns = recipe_fields(path)
    assert any("ignored" in w and "learning_rate, wandb_project" in w for w in warns)
    assert any("not recognised" in w and "mystery_knob" in w for w in warns)


def test_a_wrongly_typed_value_names_file_key_and_value(tmp_path):
    path = tmp_path / "recipe.yml"
    path.write_text("base_model: x/y\nmicro_batch_size: two\n")
    with pytest.raises(FitplanError) as e:
        recipe_fields(path)
    assert (e.value.file, e.value.field, e.value.value) == (str(path), "$.micro_batch_size", "two")


def test_axolotl_fsdp_config_is_read_by_the_rules_accelerate_applies(tmp_path):
    # fitplan/inputs/fsdp_keys.py, shared with the TrainingArguments and accelerate channels: str_to_bool
    # (accelerate/utils/environment.py) reads "false" as false, where a truth test would have offloaded
    path = tmp_path / "recipe.yml"
    path.write_text("base_model: x/y\nfsdp: full_shard\nfsdp_config:\n  fsdp_offload_params: 'false'\n"
                    "  fsdp_activation_checkpointing: 'true'\nfsdp_version: 1\n")
    fields, _ = recipe_fields(path)
    assert (fields["stack"], fields["fsdp"], fields.get("offload_params"), fields["gradient_checkpointing"]) == \
        ("fsdp1", "full_shard", None, True)
    path.write_text("base_model: x/y\nfsdp: full_shard\nfsdp_config:\n  fsdp_backward_prefetch: SOMETIMES\n")
    with pytest.raises(FitplanError) as e:
        recipe_fields(path)
    assert (e.value.file, e.value.field, e.value.value) == (str(path), "$.fsdp_config.fsdp_backward_prefetch", "SOMETIMES")
    path.write_text("base_model: x/y\nfsdp: full_shard\nfsdp_version: 3\n")
    with pytest.raises(FitplanError, match="fsdp_config.version must be 1 or 2") as e:
        recipe_fields(path)
    assert e.value.field == "$.fsdp_version"


def test_a_yaml_no_framework_wrote_is_refused(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("hello: world\n")
    with pytest.raises(FitplanError, match="not a recipe fitplan reads"):
        recipe_fields(path)


def _cli(*args: str):
    return run_cli("estimate", *args)


def test_the_cli_refuses_with_exit_2_and_no_traceback():
    r = _cli(str(RECIPES / "axolotl" / "llama-2-fft_optimized.yml"))
    assert r.returncode == 2
    assert "flash_attn_fuse_mlp" in r.stderr and "Traceback" not in r.stderr


def test_estimating_a_recipe_is_estimating_its_scenario_and_flags_win():
    """The torchtune LoRA recipe of docs/accuracy.md's table, through the CLI, equals the scenario written out
    by hand from its YAML (docs/accuracy.md lists it), with the README's sequence length and packing as flags."""
    path = RECIPES / "torchtune" / "llama3_1-8B_lora_single_device.yaml"
    r = _cli(str(path), "--max-seq-length", "2048", "--padding", "pack", "--format", "json")
    assert r.returncode == 0, r.stderr
    by_hand = fitplan.estimate(
        model="llama-3.1-8b", method="lora", dtype="bfloat16", precision="bf16-true", autocast_adapter_dtype=False,
        optim="adamw_torch_fused", gradient_checkpointing=True, lora_r=8, lora_alpha=16,
        lora_target_modules=("q_proj", "v_proj"), loss_implementation="chunked", per_device_train_batch_size=2,
        gradient_accumulation_steps=64, max_seq_length=2048, padding="pack")
    assert json.loads(r.stdout)["memory"]["per_gpu_bytes"]["peak"] == by_hand.role("peak")


GIB = 2**30
LLAMA_31_8B = 8_030_261_248  # meta-llama/Llama-3.1-8B's safetensors parameter count


def _compiled(tmp_path, name: str):
    """A torchtune config of the fixtures with ``compile: True`` (what ``tune run ... compile=True`` sets)."""
    text = (RECIPES / "torchtune" / name).read_text()
    assert "\ncompile: False" in text
    path = tmp_path / name
    path.write_text(text.replace("\ncompile: False", "\ncompile: True"))
    return path


def test_torchtune_bitsandbytes_optimizers_warn_what_fitplan_prices_differently():
    """torchtune instantiates bitsandbytes' optimizers itself: no 32-bit override for the embeddings (the HF
    Trainer's, which fitplan's 8-bit states follow), and paged states outside torch's allocator."""
    _, warns = recipe_fields(RECIPES / "torchtune" / "llama3_1-8B_full_single_device.yaml")  # PagedAdamW8bit, full
    assert any("registers none" in w for w in warns) and any("CUDA managed memory" in w for w in warns)
    _, warns = recipe_fields(RECIPES / "torchtune" / "llama2-7B_full_low_memory.yaml")  # PagedAdamW: 32-bit
    assert not any("registers none" in w for w in warns) and any("CUDA managed memory" in w for w in warns)


def test_compile_true_compiles_the_chunked_loss(tmp_path):
    """training.compile_loss (torchtune/training/_compile.py @ 30b8519) compiles CEWithChunkedOutputLoss's
    compute_cross_entropy when the recipe's compile is on: chunked_compiled, and the model compiled."""
    fields, warns = recipe_fields(_compiled(tmp_path, "llama3_1-8B_lora_single_device.yaml"))
    assert (fields["loss_implementation"], fields["torch_compile"]) == ("chunked_compiled", True)
    assert any("chunked_compiled" in w for w in warns)


def _readme_row(tmp_path, name: str):
    """torchtune's README (@ 30b8519) setup: batch 2, packed to 2048, no accumulation, compile on."""
    fields = recipe_fields(_compiled(tmp_path, name))[0]
    fields.update(max_seq_length=2048, padding="pack", gradient_accumulation_steps=1, gpu="rtx-4090")
    return fitplan.estimate(**fields)


def test_torchtune_readme_qlora_row_within_five_percent(tmp_path):
    """Published: 7.4 GiB peak on one RTX 4090 (torch.cuda memory statistics / 1024³); fitplan's allocated peak."""
    peak = _readme_row(tmp_path, "llama3_1-8B_qlora_single_device.yaml").role("peak") / GIB
    assert abs(peak / 7.4 - 1) <= 0.05


def test_torchtune_readme_lora_row_sits_above_what_its_tensors_need(tmp_path):
    """Published: 16.2 GiB. The tensors alive when the loss runs already need more than 16.2 GiB + 4.5 %: the bf16
    weights (2 bytes per parameter), the 32 layer checkpoints (each a (2, 2048, 4096) bf16 input,
    set_activation_checkpointing on TransformerSelfAttentionLayer) and the eight bf16 logit chunks the model
    returns (2 · 2 · 2048 · 128256 bytes in all, alive until the loss returns). fitplan's peak is above that
    floor, and the floor above the published figure."""
    floor = 2 * LLAMA_31_8B + 32 * 2 * 2048 * 4096 * 2 + 2 * 2 * 2048 * 128256
    assert floor / GIB > 16.2 * 1.045
    peak = _readme_row(tmp_path, "llama3_1-8B_lora_single_device.yaml").role("peak")
    assert floor < peak < 1.07 * 16.2 * GIB


def test_torchtune_readme_rows_with_activation_offloading(tmp_path):
    """What enable_activation_offloading (False in both configs at 30b8519; the LoRA/QLoRA recipe reads it, the full
    recipe does not have it at that commit) would give: the LoRA row's 30 layer checkpoints leave the GPU (32 minus
    h_0, a leaf AccumulateGrad holds, and h_31, in the stream's stash with the final norm's 4 packs: 30 · 2^25
    bytes; tests/test_offload.py), which brings it within 1 % of 16.2 GiB, but the QLoRA row then falls 9 % under
    7.4 GiB: one setting does not explain both rows, and the README states none (docs/accuracy.md)."""
    rows = {}
    for name in ("llama3_1-8B_lora_single_device.yaml", "llama3_1-8B_qlora_single_device.yaml"):
        path = _compiled(tmp_path, name)
        path.write_text(path.read_text().replace("enable_activation_offloading: False", "enable_activation_offloading: True"))
        fields = recipe_fields(path)[0]
        assert fields["activation_offloading"] == "torchtune"
        fields.update(max_seq_length=2048, padding="pack", gradient_accumulation_steps=1, gpu="rtx-4090")
        on = fitplan.estimate(**fields)
        off = fitplan.estimate(**{**fields, "activation_offloading": "none"})
        assert off.role("peak") - on.role("peak") == 30 * 2 * 2 * 2048 * 4096
        rows[name.split("-")[1]] = on.role("peak") / GIB
    assert abs(rows["8B_lora_single_device.yaml"] / 16.2 - 1) < 0.01
    assert rows["8B_qlora_single_device.yaml"] / 7.4 - 1 < -0.05


def test_torchtune_readme_full_row_counts_the_paged_states_out(tmp_path):
    """Published: 18.9 GiB (full fine-tune, one RTX 4090): the recipe steps PagedAdamW8bit in the backward
    (optimizer_in_bwd). bitsandbytes puts the state of every tensor of at least 1e5 elements in CUDA managed
    memory (bitsandbytes/optim/optimizer.py ``get_state_buffer`` -> functional.py ``get_paged``:
    cudaMallocManaged, outside torch's caching allocator, so not in torch.cuda.max_memory_allocated), one byte per
    element per state; its block maxima (fp32, one per 256 elements per state) and smaller tensors' states are
    torch tensors. torchtune registers no 32-bit override for the embedding (the HF Trainer does; fitplan's
    states follow the Trainer), so the comparison swaps fitplan's states for torchtune's unpaged ones. The
    result is +5.8 %: outside 5 % (docs/accuracy.md says why)."""
    e = _readme_row(tmp_path, "llama3_1-8B_full_single_device.yaml")
    assert (e.scenario.training.loss_implementation, e.scenario.training.optimizer_in_bwd) == ("chunked_compiled", True)
    sizes = [math.prod(shape) for shape, count in e["trainable_tensors"] for _ in range(count)]
    assert sum(sizes) == LLAMA_31_8B
    unpaged = sum((2 * n if n < 100_000 else 0) + 2 * 4 * -(-n // 256) for n in sizes)
    allocated = e.role("peak") - e["optimizer_state_bytes"] + unpaged
    assert 0.05 < allocated / (18.9 * GIB) - 1 < 0.065


def test_recipe_option_sits_over_a_scenario_toml_and_under_flags(tmp_path):
    """``--recipe`` beside a TOML scenario: the TOML's fields the recipe does not set stay (the GPU count), the
    recipe's win over the TOML's (the batch), flags win over both (the accumulation)."""
    from fitplan.inputs.sources import from_options

    toml = tmp_path / "plan.toml"
    toml.write_text('[hardware]\nnum_gpus = 2\n[training]\nper_device_train_batch_size = 8\n')
    built = from_options({"scenario_file": str(toml), "recipe": str(RECIPES / "axolotl" / "llama-3-lora-1b.yml"),
                          "gradient_accumulation_steps": 3})
    s = built.scenario
    # lora-1b.yml: micro_batch_size 2, gradient_accumulation_steps 2, base_model NousResearch/Llama-3.2-1B
    assert (s.hardware.num_gpus, s.training.per_device_train_batch_size, s.training.gradient_accumulation_steps,
            s.model.model) == (2, 2, 3, "NousResearch/Llama-3.2-1B")
    assert {"num_gpus", "per_device_train_batch_size", "lora_r"} <= built.fixed


# --------------------------------------------------------------------------- LoRA on the LM head and the embeddings


def _tiny(name: str, targets: tuple[str, ...], precision_override: str = "bf16-true", **kw):
    return fitplan.estimate(model=str(CONFIGS / name / "config.json"), method="lora", lora_r=4,
                            lora_target_modules=targets, optim="adamw_torch_fused", precision=precision_override,
                            per_device_train_batch_size=2, max_seq_length=16, **kw)


def test_head_and_embedding_adapters_have_peft_shapes():
    """tiny-llama: hidden 64, vocab 1000, untied. peft 0.21: lm_head's lora.Linear A (r, 64), B (1000, r);
    embed_tokens' lora.Embedding lora_embedding_A (r, 1000), lora_embedding_B (64, r): r·(64 + 1000) each."""
    q_only = _tiny("tiny-llama", ("q_proj",)).values["adapter_param_count"]
    both = _tiny("tiny-llama", ("q_proj", "lm_head", "embed_tokens")).values["adapter_param_count"]
    assert both - q_only == 2 * 4 * (64 + 1000)


def test_all_linear_leaves_the_head_and_embeddings_alone():
    """peft's all-linear excludes the output layer and selects no nn.Embedding (tuners_utils.py)."""
    a = _tiny("tiny-llama", ("all-linear",)).values["adapter_param_count"]
    # 2 layers × (q, k, v, o: 64 -> 64; gate, up: 64 -> 176; down: 176 -> 64), r = 4
    assert a == 2 * 4 * (4 * (64 + 64) + 3 * (64 + 176))


def test_head_lora_under_a_fused_loss_is_refused():
    with pytest.raises(FitplanError) as e:
        _tiny("tiny-llama", ("q_proj", "lm_head"), loss_implementation="liger").role("peak")
    assert e.value.field == "loss_implementation"


def _referee_agrees(fitplan_torch, est) -> None:
    """Model states exact, activations and the peak within 1 % of what fitplan-torch measures on the CPU."""
    c = fitplan_torch.validate(est, mode="cpu")["components"]
    for k in ("parameters", "gradients", "optimizer_states"):
        assert c[k]["predicted"] == c[k]["measured"], k
    for k in ("activations", "peak"):
        assert c[k]["predicted"] == pytest.approx(c[k]["measured"], rel=0.01), k


REFEREE = [
    ("tiny-llama", ("q_proj", "v_proj", "lm_head", "embed_tokens"), "bf16-true", False, "qlora"),
    ("tiny-llama", ("q_proj", "v_proj", "lm_head"), "bf16-true", False, "hf"),
    ("tiny-llama", ("q_proj", "v_proj", "embed_tokens"), "bf16-true", False, "hf"),
    ("tiny-llama", ("q_proj", "v_proj", "embed_tokens"), "bf16-true", True, "hf"),
    ("tiny-qwen2", ("q_proj", "v_proj", "embed_tokens", "lm_head"), "bf16-mixed", True, "hf"),
    ("tiny-gemma", ("q_proj", "embed_tokens", "lm_head"), "bf16-true", False, "hf"),
    ("tiny-gpt2", ("c_attn", "wte", "lm_head"), "32-true", False, "hf"),
    ("tiny-llama", ("q_proj", "lm_head"), "bf16-true", False, "chunked"),
]


@pytest.mark.parametrize(("name", "targets", "precision", "ckpt", "loss"), REFEREE)  # loss "qlora": method qlora
def test_head_and_embedding_lora_match_the_torch_referee(name, targets, precision, ckpt, loss):
    """peft builds the adapters by name and fitplan-torch measures the step on the CPU (QLoRA: bitsandbytes' CPU
    backend; its LM head and embeddings stay 16-bit): model states exact, activations and the peak within 1 %."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    fitplan_torch = pytest.importorskip("fitplan_torch")
    warnings.filterwarnings("ignore", module="(transformers|peft)")
    method = "qlora" if loss == "qlora" else "lora"
    extra = {"bnb_4bit_compute_dtype": "bfloat16"} if method == "qlora" else {"loss_implementation": loss}
    est = fitplan.estimate(model=str(CONFIGS / name / "config.json"), method=method, lora_target_modules=targets,
                           optim="adamw_torch_fused", precision=precision, gradient_checkpointing=ckpt,
                           per_device_train_batch_size=2, max_seq_length=16, **extra)
    _referee_agrees(fitplan_torch, est)


# --------------------------------------------------------------------------- peft's modules_to_save


def test_modules_to_save_train_a_whole_copy():
    """tiny-llama (hidden 64, vocab 1000, untied): ModulesToSaveWrapper deep-copies the module and trains the copy:
    lm_head adds its 1000×64 weight to the trainable parameters, embed_tokens its 1000×64 too."""
    base = _tiny("tiny-llama", ("q_proj",), precision_override="32-true")
    head = _tiny("tiny-llama", ("q_proj",), precision_override="32-true", lora_modules_to_save=("lm_head",))
    both = _tiny("tiny-llama", ("q_proj",), precision_override="32-true", lora_modules_to_save=("lm_head", "embed_tokens"))
    count = "adapter_param_count"
    assert (head.values[count] - base.values[count], both.values[count] - base.values[count]) == (64_000, 128_000)
    # the copy is a second weight beside the frozen original: fp32, 4 bytes per element
    assert head.values["weight_bytes"] - base.values["weight_bytes"] == 4 * 64_000


@pytest.mark.parametrize(("name", "kw", "why"), [
    ("tiny-llama", {"lora_modules_to_save": ("lm_head",), "precision_override": "bf16-true"}, "one trainable dtype"),
    ("tiny-gemma", {"lora_modules_to_save": ("lm_head",)}, "tied"),
    ("tiny-llama", {"lora_modules_to_save": ("q_proj",)}, "inside the decoder layers"),
    ("tiny-llama", {"lora_modules_to_save": ("lm_head",), "targets": ("q_proj", "lm_head")}, "LoRA also adapts"),
    ("tiny-llama", {"lora_modules_to_save": ("foo",)}, "names no module"),
    ("tiny-llama", {"lora_modules_to_save": ("lm_head",), "zero_stage": 3, "num_gpus": 2}, "ZeRO-3 or FSDP"),
])
def test_modules_to_save_fitplan_does_not_model_are_refused(name, kw, why):
    targets = kw.pop("targets", ("q_proj",))
    kw.setdefault("precision_override", "32-true")
    with pytest.raises(FitplanError, match=why) as e:
        _tiny(name, targets, **kw).role("peak")
    assert e.value.field == "lora_modules_to_save"


def test_recipes_name_modules_to_save(tmp_path):
    ax = tmp_path / "ax.yml"
    ax.write_text("base_model: x/y\nadapter: lora\nlora_target_modules: [q_proj]\nlora_modules_to_save: [embed_tokens, "
                  "lm_head]\n")
    lf = tmp_path / "lf.yaml"
    lf.write_text("model_name_or_path: x/y\nstage: sft\nadditional_target: embed_tokens,lm_head\n")
    assert recipe_fields(ax)[0]["lora_modules_to_save"] == recipe_fields(lf)[0]["lora_modules_to_save"] == (
        "embed_tokens", "lm_head")


SAVED_REFEREE = [
    ("tiny-llama", "lora", ("lm_head",), "bf16-mixed", False),
    ("tiny-llama", "lora", ("embed_tokens",), "bf16-mixed", False),
    ("tiny-llama", "lora", ("embed_tokens", "lm_head"), "32-true", True),
    ("tiny-qwen2", "lora", ("embed_tokens", "lm_head"), "bf16-mixed", True),
    ("tiny-mistral", "lora", ("lm_head",), "32-true", False),
    # prepare_model_for_kbit_training: the copies and the adapters fp32
    ("tiny-llama", "qlora", ("embed_tokens", "lm_head"), "bf16-true", False),
]


@pytest.mark.parametrize(("name", "method", "saved", "precision", "ckpt"), SAVED_REFEREE)
def test_modules_to_save_match_the_torch_referee(name, method, saved, precision, ckpt):
    """peft's LoraConfig(modules_to_save=...) measured by fitplan-torch on the CPU: model states exact,
    activations and the peak within 1 %."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    fitplan_torch = pytest.importorskip("fitplan_torch")
    warnings.filterwarnings("ignore", module="(transformers|peft)")
    extra = {"bnb_4bit_compute_dtype": "bfloat16"} if method == "qlora" else {}
    est = fitplan.estimate(model=str(CONFIGS / name / "config.json"), method=method, lora_target_modules=("q_proj", "v_proj"),
                           lora_modules_to_save=saved, optim="adamw_torch_fused", precision=precision,
                           gradient_checkpointing=ckpt, per_device_train_batch_size=2, max_seq_length=16, **extra)
    _referee_agrees(fitplan_torch, est)


def test_yaml_aliases_are_walked_once(tmp_path):
    """A "billion laughs" file (9 levels of 9 aliases: 9⁹ leaves if expanded) and a self-referential alias are
    read in linear time: the nesting check visits each shared node once."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
    path = tmp_path / "laughs.yml"
    path.write_text("\n".join(lines) + "\nloop: &loop [*loop]\nbase_model: x/y\n")
    fields, warns = recipe_fields(path)
    assert fields["model"] == "x/y"
    assert any("not recognised" in w and "a, b, c, d, e, f, g, h, i, loop" in w for w in warns)


def test_recommend_reads_a_torchtune_recipe():
    r = run_cli("recommend", str(RECIPES / "torchtune" / "llama3_1-8B_qlora_single_device.yaml"), "--num-examples",
                "20000", "--tokens-per-example", "600", "--format", "json")
    assert r.returncode == 0, r.stderr
    command = json.loads(r.stdout)["plans"][0]["command"].split()
    # the recipe's fields stay fixed in every plan: qlora_ builder, its seven targets, CEWithChunkedOutputLoss, bf16
    for flag, value in (("--method", "qlora"), ("--loss-implementation", "chunked"), ("--dtype", "bfloat16"),
                        ("--lora-target-modules", "q_proj,v_proj,k_proj,o_proj,gate_proj,down_proj,up_proj")):
        assert command[command.index(flag) + 1] == value
    assert "--no-autocast-adapter-dtype" in command


def test_recommend_reads_an_axolotl_recipe():
    r = run_cli("recommend", str(RECIPES / "axolotl" / "llama-3-qlora-1b.yml"), "--num-examples", "20000",
                "--tokens-per-example", "600", "--format", "json")
    assert r.returncode == 0, r.stderr
