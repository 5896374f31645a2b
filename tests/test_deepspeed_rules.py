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
    base = dict(model="llama-2-13b", precision="bf16-master", num_gpus=8, gpu="h100-sxm",
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
