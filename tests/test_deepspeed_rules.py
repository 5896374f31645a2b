"""DeepSpeed's model states at real size, derived by hand from deepspeed 0.19.8's source (the CPU referee
measures the same rules on tiny models: docs/accuracy-stacks.md).

Llama-2-13B (vocab 32,000, hidden 5,120, intermediate 13,824, 40 layers, untied head): per layer 4·5120² +
3·5120·13824 + 2·5120 = 317,204,480 parameters; with the embedding, the head and the final norm
Ψ = 13,015,864,320. The HF Trainer's two optimizer groups: no weight decay for the 81 norm weights
(81 · 5,120 = 414,720), decay for the other 13,015,449,600.
"""

from __future__ import annotations

import math

import pytest

import fitplan

PSI = 13_015_864_320
NO_DECAY = 81 * 5120
DECAY = PSI - NO_DECAY


def ds13b(**kw):
    base = dict(model="llama-2-13b", precision="bf16-master", optim="adamw_torch", num_gpus=8, gpu="h100-sxm",
                per_device_train_batch_size=4, max_seq_length=2048)
    return fitplan.estimate(**{**base, **kw})


def zero12_partition(n: int, world: int) -> int:
    """stage_1_and_2.py:441: each group is flattened and padded to ``nccl_start_alignment_factor (2) × world``
    elements, then split in ``world`` equal partitions."""
    align = 2 * world
    return math.ceil(n / align) * align // world


def test_zero2_keeps_every_16_bit_weight_and_partitions_the_rest():
    e = ds13b(zero_stage=2)
    part = zero12_partition(DECAY, 8) + zero12_partition(NO_DECAY, 8)  # 1,626,931,200 + 51,840
    assert part == 1_626_983_040
    assert e["stack_name"] == "deepspeed" and e["stack_description"].startswith("DeepSpeed ZeRO-2")
    assert e["weight_bytes"] == 2 * PSI  # the bf16 module stays whole on every rank (26.03 GB)
    assert e["master_weight_bytes"] == 4 * part  # fp32 partition (single_partition_of_fp32_groups)
    assert e["optimizer_state_bytes"] == 8 * part  # Adam's exp_avg and exp_avg_sq on it; `step` stays on the CPU


def test_zero2_model_states_match_deepspeeds_own_estimator():
    # estimate_zero2_model_states_mem_needs (stage_1_and_2.py:4017-4034, no offload): 2Ψ + 18Ψ/N, "2 grads 16-bit
    # + 4 grads 32-bit + 4 params 32-bit + 8 optimizer states" per partitioned element. fitplan's terms for the
    # same things: weights, master, states, and the 16-bit and fp32 gradient partitions of the step
    e = ds13b(zero_stage=2)
    part = 1_626_983_040
    fitplan_states = e["weight_bytes"] + e["master_weight_bytes"] + e["optimizer_state_bytes"] + (2 + 4) * part
    deepspeed_estimate = 2 * PSI + int(18 * PSI / 8)
    assert fitplan_states == pytest.approx(deepspeed_estimate, rel=1e-6)  # padding: 128 elements × 18 B


def test_zero3_partitions_each_parameter_and_keeps_small_ones_whole():
    # partition_parameters.py:1778-1817: every parameter is padded to a multiple of the world size and split;
    # parameters of at most stage3_param_persistence_threshold (1e5) elements (the 81 norms) are also kept
    # gathered (ds_persist, :1292). Every other 13B tensor divides by 8.
    e = ds13b(zero_stage=3, gradient_checkpointing=True, per_device_train_batch_size=1)
    partitions = DECAY // 8 + 81 * (5120 // 8)
    assert e["weight_bytes"] == 2 * partitions + 2 * NO_DECAY
    offloaded = ds13b(zero_stage=3, gradient_checkpointing=True, per_device_train_batch_size=1, offload_params=True,
                      offload_optimizer=True)
    assert offloaded["weight_bytes"] == 2 * NO_DECAY  # the partitions live on the CPU; persistent params stay
    assert offloaded["cpu_offload_bytes"] > 0 and offloaded["device_total_bytes"] < e["device_total_bytes"]


def test_fsdp_full_shard_bf16_has_no_autocast_copies():
    # accelerate's FSDP with bf16: MixedPrecision(param_dtype=bf16) gathers the layers in bf16, so autocast finds
    # bf16 weights and copies nothing; the fp32 shards are 4Ψ/8 (every 13B tensor divides by 8)
    e = ds13b(fsdp="full_shard", precision="bf16-mixed", zero_stage=0)
    assert e["stack_description"].startswith("FSDP2")
    assert e["autocast_weight_copy_bytes"] == 0
    assert e["weight_bytes"] == 4 * PSI // 8
    # bare fully_shard under torch autocast (--stack torch) gathers fp32 and autocast copies each layer
    assert ds13b(fsdp="full_shard", precision="bf16-mixed", stack="torch")["autocast_weight_copy_bytes"] > 0


# --------------------------------------------------------------------------- ZeRO-3 + LoRA activations and gathers

TINY = "tests/data/configs/"


def tiny_lora(model="tiny-llama", targets=("q_proj", "v_proj"), **kw):
    base = dict(model=TINY + model + "/config.json", precision="bf16-master", per_device_train_batch_size=2,
                max_seq_length=128, num_gpus=2, stack="deepspeed", zero_stage=3, method="lora",
                lora_target_modules=targets, device="cpu")
    return fitplan.estimate(**{**base, **kw})


def test_zero3_linear_saves_the_input_of_frozen_linears():
    # runtime/zero/linear.py:100-105 saves (input, weight, bias) for every F.linear in the graph; torch's mm saves
    # the input only for a trainable weight. Tiny Llama (h 64, I 176, 2 layers), T = 2 × 128 tokens, bf16, LoRA on
    # q/v: the frozen Linears whose input nothing else saves are gate/up (post-attention norm output, T·h·2 B),
    # down_proj (T·I·2 B) in each layer and the LM head (final norm output, T·h·2 B):
    extra = 2 * (256 * 64 * 2 + 256 * 176 * 2) + 256 * 64 * 2
    assert extra == 278_528
    z3, z2 = tiny_lora(), tiny_lora(zero_stage=2)
    assert z3["step_trace"].retained_bytes - z2["step_trace"].retained_bytes == extra
    # measured by the referee (deepspeed 0.19.8, 2 gloo ranks): 2,471,940 B retained with the default
    # memory_efficient_linear, 2,193,412 B with it off (as ZeRO-2)
    assert z3["step_trace"].retained_bytes == 2_471_940
    assert z3["zero3_linear_saves_input"] and not z2["zero3_linear_saves_input"]


def test_zero3_linear_patch_does_not_reach_gpt2_conv1d():
    # GPT-2's projections are Conv1D (torch.addmm): only the LM head, an nn.Linear on the tied embedding, saves its
    # input (the final LayerNorm's output, T·h·2 = 256 × 64 × 2 B) under ZeRO-3
    z3, z2 = tiny_lora("tiny-gpt2", ("c_attn",)), tiny_lora("tiny-gpt2", ("c_attn",), zero_stage=2)
    assert z3["step_trace"].retained_bytes - z2["step_trace"].retained_bytes == 256 * 64 * 2


def test_full_fine_tuning_saves_the_same_under_zero3():
    full3, full2 = tiny_lora(method="full"), tiny_lora(method="full", zero_stage=2)
    assert full3["step_trace"].retained_bytes == full2["step_trace"].retained_bytes


def test_zero3_releases_modules_that_run_no_backward_after_their_forward():
    # 4 ranks, persistence threshold 1,000 elements: every Linear and the embedding are partitioned. All of them
    # would stay gathered until their backward (max_reuse_distance 1e9): embedding 64,000 + LM head 64,000 +
    # 2 layers × (4 × 4,096 + 3 × 11,264) elements × 2 B = 456,704 B. Under LoRA on q/v the embedding and layer
    # 0's frozen q, k, v read no tensor that requires grad: their outputs do not, DeepSpeed's pre-backward function
    # never runs for them (parameter_offload.py:466-482), they never recur in the module trace and are released
    # after their forward (partitioned_param_coordinator.py:653-662): 456,704 − 128,000 − 3 × 8,192 = 304,128 B,
    # what the referee measured gathered at the end of the forward.
    small = dict(num_gpus=4, reduce_bucket_size=20_000, stage3_prefetch_bucket_size=10_000,
                 stage3_param_persistence_threshold=1_000)
    r = tiny_lora(**small)["deepspeed_rank"]
    assert r.gathered_kept == 304_128
    assert r.gathered_once == 128_000 + 3 * 8_192
    assert tiny_lora(**small, method="full")["deepspeed_rank"].gathered_kept == 456_704
    # with checkpointing, peft makes the embedding's output require grad (enable_input_require_grads): every module
    # runs a backward
    assert tiny_lora(**small, gradient_checkpointing=True)["deepspeed_rank"].gathered_once == 0


def test_memory_efficient_linear_off_is_named_not_modelled():
    from fitplan.inputs.importers import deepspeed_fields_from

    warnings: list[str] = []
    cfg = {"zero_optimization": {"stage": 3, "memory_efficient_linear": False}, "bf16": {"enabled": True}}
    deepspeed_fields_from(cfg, "ds.json", warnings=warnings)
    assert any("not modelled" in w and "zero_optimization.memory_efficient_linear=false" in w for w in warnings)
    quiet: list[str] = []
    deepspeed_fields_from({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}, "ds.json", warnings=quiet)
    assert not any("memory_efficient_linear" in w for w in quiet)
