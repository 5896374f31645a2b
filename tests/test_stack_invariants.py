"""Invariants of every stack, over the catalog (hypothesis): what sharding more or offloading can never do.

* DeepSpeed: the per-GPU peak never grows from ZeRO stage k to k+1, nor with more GPUs at stage 3;
* accelerate FSDP (FSDP1, FSDP2) and PyTorch-native FSDP2: full_shard never needs more than shard_grad_op,
  more GPUs never more memory;
* offloading never raises GPU memory (DeepSpeed optimizer / parameter offload, FSDP CPU offload);
* offload without a stage that supports it is an error naming the flag.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fitplan
from fitplan.errors import FitplanError

from fitplan.context import get_context  # noqa: E402

CATALOG = sorted(get_context(()).rulesets.models)
BIG = {"llama-3.1-405b", "mixtral-8x22b"}  # evaluated too, but 405B ZeRO-0 needs > 6 TB: keep the sweep quick
MODELS = [m for m in CATALOG if m not in BIG] + sorted(BIG)
# peft 0.21 cannot adapt Llama-4's router (an nn.Linear subclass returning a tuple), which "all-linear" selects:
# fitplan refuses it as peft fails on it (builtin/lora.py), so those models get named targets here
NAMED_TARGETS = {m for m in CATALOG if get_context(()).rulesets.models[m].config.get("model_type") == "llama4_text"}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

common = dict(
    model=st.sampled_from(MODELS),
    batch=st.sampled_from([1, 2, 4]),
    seq=st.sampled_from([512, 2048]),
    ckpt=st.booleans(),
    method=st.sampled_from(["full", "lora"]),
    optim=st.sampled_from(["adamw_torch", "adamw_torch_fused", "adamw_8bit", "sgd"]),
)


def est(**kw):
    return fitplan.estimate(**kw)


def base(model, batch, seq, ckpt, method, optim, **kw):
    out = dict(model=model, per_device_train_batch_size=batch, max_seq_length=seq, gradient_checkpointing=ckpt,
               method=method, optim=optim, **kw)
    if method != "full":
        out["lora_target_modules"] = "q_proj,k_proj,v_proj,o_proj" if model in NAMED_TARGETS else "all-linear"
    return out


def peak(**kw) -> int:
    return est(**kw)["device_total_bytes"]


@SETTINGS
@given(**common, gpus=st.sampled_from([2, 4, 8, 16]), precision=st.sampled_from(["bf16-master", "32-true"]),
       bucket=st.sampled_from([None, "auto", "2e8"]))
def test_deepspeed_stage_k_plus_one_never_needs_more(model, batch, seq, ckpt, method, optim, gpus, precision, bucket):
    if precision == "32-true" and optim not in ("adamw_torch", "adamw_torch_fused"):
        return  # an fp32 ZeRO-1 master copy that states smaller than 8 B/param do not pay for: test below
    b = base(model, batch, seq, ckpt, method, optim, precision=precision, num_gpus=gpus, stack="deepspeed",
             reduce_bucket_size=bucket)
    ests = [est(**b, zero_stage=k) for k in (0, 1, 2, 3)]
    peaks = [e["peak_bytes"] for e in ests]  # device_total adds a reserve proportional to the peak
    r = [e["deepspeed_rank"] for e in ests]
    # Where DeepSpeed itself allocates more at the higher stage (each from its source, each a test below):
    # * the IPG bucket is reduce_bucket_size elements whatever the model's size (stage_1_and_2.py:3256-3280;
    #   measured 1.0 GB for a 98,624-parameter model at the default 5e8): with few trainable parameters
    #   (LoRA) it can outweigh what ZeRO-1 shards;
    # * ZeRO-2 allocates its gradient partition at the first bucket flush, while activations are alive;
    #   ZeRO-1 only when the backward ends (stage_1_and_2.py:2182-2195, 2290-2295);
    # * ZeRO-3 keeps parameters gathered for the backward (stage3_max_reuse_distance), prefetches, keeps its
    #   bucket for the whole step and, for fp32 models, an fp32 master clone beside the fp32 partitions (stage3.py:1162-1167);
    #   its gradient partition exists from init, so where ZeRO-2's peak precedes its first bucket flush, the
    #   ZeRO-3 partition plus its persistent (unpartitioned) small parameters can outweigh the whole 16-bit weights
    #   ZeRO-2 keeps (qwen2.5-0.5b, 2 GPUs, bf16: 143,104 bytes);
    # * ZeRO-0 and ZeRO-1 tie in fp32 on 2 GPUs (16 bytes per parameter at the end of the backward each),
    #   ZeRO-1 then larger by its 2·N alignment padding.
    op_grad = ests[2]["step_trace"].max_param_grad_bytes if ests[2]["step_trace"] is not None else 0
    allowance = [max(0, r[1].bucket),
                 max(0, r[2].bucket - r[1].bucket) + r[2].gradients + op_grad,
                 r[3].gathered_kept + r[3].prefetch + r[3].device_buffers + max(0, r[3].master - r[2].master)
                 + max(0, r[3].weights + r[3].gradients - r[2].weights)]
    for k in range(3):
        assert peaks[k + 1] <= peaks[k] * (1 + 1e-6) + allowance[k], (k, peaks, allowance)
    # model states alone never grow with the stage (fp32 ZeRO-1's master copy aside: test below)
    states = [e["model_state_bytes"] for e in ests]
    if precision == "bf16-master":
        assert all(y <= x for x, y in zip(states, states[1:])), states
    else:
        assert states[2] <= states[1] and states[3] <= states[2] + max(0, r[3].master - r[2].master), states


def test_fp32_zero1_can_need_more_than_zero0_with_small_optimizer_states():
    """DeepSpeed ZeRO-1/2 clone each rank's partition to fp32 even for an fp32 model (stage_1_and_2.py:560-577;
    measured: an fp32 ZeRO-1 run keeps Ψ·4 module weights and P·4 master). That copy, 4Ψ/N, is paid for by the
    optimizer states it shards only when they hold more than 4/(N−1) bytes per parameter: fp32 AdamW (8) on
    two GPUs saves 4Ψ for a 2Ψ copy, SGD (no state) saves nothing."""
    b = dict(model="llama-2-7b", precision="32-true", optim="sgd", per_device_train_batch_size=1, max_seq_length=512,
             num_gpus=2, stack="deepspeed")
    z0, z1 = est(**b, zero_stage=0), est(**b, zero_stage=1)
    psi = z0["param_count"]
    assert z1["master_weight_bytes"] >= psi * 4 // 2
    assert z1["device_total_bytes"] > z0["device_total_bytes"]


def test_zero3_can_need_more_than_zero2_on_a_small_model():
    """DeepSpeed's own defaults make ZeRO-3 larger than ZeRO-2 on GPT-2 (124M): a module's gathered parameters
    are released after it only if its next use is more than ``stage3_max_reuse_distance`` (1e9) elements of
    the module trace away (partitioned_param_coordinator.py:634-661); GPT-2's whole trace is 2 × 124M, so every
    parameter stays gathered from its forward to its backward (measured on the tiny Llama: all 228,352
    non-persistent elements, 456,704 bytes in bf16, alive when the backward starts), on top of the 1/N
    partitions, the persistent 5e8-element bucket (1 GB) and parameters under the 1e5 persistence threshold."""
    b = dict(model="gpt2", precision="bf16-master", per_device_train_batch_size=1, max_seq_length=512, num_gpus=2)
    z2, z3 = est(**b, zero_stage=2), est(**b, zero_stage=3)
    # every parameter over the 1e5-element persistence threshold stays gathered (2Ψ < 1e9): wte 50257×768,
    # wpe 1024×768, and per layer c_attn 768×2304, attn.c_proj 768×768, c_fc 768×3072, mlp.c_proj 3072×768
    kept = 50257 * 768 + 1024 * 768 + 12 * (768 * 2304 + 768 * 768 + 2 * 768 * 3072)
    assert z3["deepspeed_rank"].gathered_kept == kept * 2
    assert z3["comm_buffer_bytes"] == 500_000_000 * 2
    assert z3["peak_bytes"] > z2["peak_bytes"]


@SETTINGS
@given(**common, precision=st.sampled_from(["bf16-master", "32-true"]))
def test_deepspeed_zero3_more_gpus_never_more(model, batch, seq, ckpt, method, optim, precision):
    b = base(model, batch, seq, ckpt, method, optim, precision=precision, zero_stage=3)
    peaks = [peak(**b, num_gpus=n, num_nodes=m) for n, m in ((2, 1), (4, 1), (8, 1), (8, 2), (8, 8))]
    assert all(x >= y for x, y in zip(peaks, peaks[1:])), peaks


@SETTINGS
@given(**common, stack=st.sampled_from(["fsdp2", "fsdp1", "torch"]), precision=st.sampled_from(["bf16-mixed", "bf16-true"]))
def test_fsdp_full_shard_and_more_gpus_never_more(model, batch, seq, ckpt, method, optim, stack, precision):
    b = base(model, batch, seq, ckpt, method, optim, precision=precision, stack=stack)
    for n in (2, 4, 8, 16):
        assert peak(**b, fsdp="full_shard", num_gpus=n) <= peak(**b, fsdp="shard_grad_op", num_gpus=n)
    arch = est(**b, fsdp="full_shard", num_gpus=2).arch
    # FSDP2 splits every tensor on dim 0: an MoE's fused experts (dim 0 = the experts) stop shrinking at N = E
    # and their all-gather buffers (N × the padded shard) keep growing: test_fsdp2_moe_experts_stop_shrinking
    counts = (2, 4, 8, 16) if stack == "fsdp1" or not arch.is_moe else tuple(n for n in (2, 4, 8, 16) if n <= arch.num_experts)
    full = [peak(**b, fsdp="full_shard", num_gpus=n) for n in counts]
    assert all(x >= y for x, y in zip(full, full[1:])), full


def test_fsdp2_moe_experts_stop_shrinking_past_the_expert_count():
    """Mixtral-8x7B's fused experts (8, 2·14336, 4096) and (8, 4096, 14336) under FSDP2: ``torch.chunk`` on dim 0
    (_fsdp_common.py:134-140) gives rank 0 one expert from N = 8 on, and the all-gather output is N padded shards
    (_fsdp_collectives.py:325-360): at N = 16 twice the tensor. DeepSpeed partitions flat and keeps shrinking."""
    b = dict(model="mixtral-8x7b", precision="bf16-mixed", per_device_train_batch_size=1, max_seq_length=512)
    f8, f16 = (est(**b, fsdp="full_shard", num_gpus=n) for n in (8, 16))
    expert = (8 * 2 * 14336 * 4096 + 8 * 4096 * 14336) * 32  # both fused tensors of the 32 layers
    rest = f8["param_count"] - expert
    # fp32 shards at rest: from 8 to 16 GPUs only the non-expert parameters halve (the experts stay 1/8 each)
    assert f8["weight_bytes"] - f16["weight_bytes"] == pytest.approx(rest * 4 / 16, rel=0.01)
    assert f16["gathered_param_bytes"]["forward_spike"] > f8["gathered_param_bytes"]["forward_spike"]
    d8, d16 = (est(**{**b, "precision": "bf16-master"}, zero_stage=3, num_gpus=n) for n in (8, 16))
    assert d16["weight_bytes"] < d8["weight_bytes"] and d16["peak_bytes"] < d8["peak_bytes"]


@SETTINGS
@given(**common, gpus=st.sampled_from([1, 2, 8]), stage=st.sampled_from([1, 2, 3]))
def test_deepspeed_offload_never_raises_gpu_memory(model, batch, seq, ckpt, method, optim, gpus, stage):
    b = base(model, batch, seq, ckpt, method, optim, precision="bf16-master", num_gpus=gpus, zero_stage=stage)
    plain = est(**b)
    off = est(**b, offload_optimizer=True)
    # Offload keeps a largest-parameter-sized 16-bit staging buffer on the GPU (stage_1_and_2.py:659-661): with
    # little to move to the CPU (SGD: no states; 8 GPUs: small partitions) it can outweigh what it moves
    # (gpt2, 8 GPUs, SGD, ZeRO-1: a 77,194,752-byte buffer for 62,219,904 bytes of fp32 partition).
    staging = max(0, off["deepspeed_rank"].device_buffers - plain["deepspeed_rank"].device_buffers)
    assert off["peak_bytes"] <= plain["peak_bytes"] + staging
    if not staging:
        assert off["device_total_bytes"] <= plain["device_total_bytes"]
    assert off["cpu_offload_bytes"] > 0 == plain["cpu_offload_bytes"]
    if stage == 3:
        both = est(**b, offload_optimizer=True, offload_params=True)
        assert both["peak_bytes"] <= off["peak_bytes"]
        assert both["weight_bytes"] <= off["weight_bytes"]


@SETTINGS
@given(**common, stack=st.sampled_from(["fsdp2", "fsdp1"]), gpus=st.sampled_from([2, 8]))
def test_fsdp_offload_never_raises_gpu_memory(model, batch, seq, ckpt, method, optim, stack, gpus):
    b = base(model, batch, seq, ckpt, method, optim, precision="bf16-mixed", num_gpus=gpus, stack=stack, fsdp="full_shard")
    assert peak(**b, offload_optimizer=True, offload_params=True) <= peak(**b)


@pytest.mark.parametrize("fields, flag", [
    (dict(offload_optimizer=True, num_gpus=8), "offload_optimizer"),  # DDP
    (dict(offload_optimizer=True, stack="deepspeed", precision="bf16-master"), "offload_optimizer"),  # ZeRO-0
    (dict(offload_params=True, zero_stage=2, precision="bf16-master"), "offload_params"),
    (dict(offload_params=True, zero_stage=1, offload_optimizer=True, precision="bf16-master"), "offload_params"),
    (dict(offload_optimizer=True, fsdp="full_shard", num_gpus=8), "offload_params"),  # FSDP offloads both or neither
    (dict(offload_params=True, fsdp="full_shard", num_gpus=8), "offload_optimizer"),
    (dict(offload_optimizer=True, stack="torch", zero_stage=3, num_gpus=8), "offload_optimizer"),
])
def test_offload_without_a_stage_that_supports_it_is_an_error_naming_the_flag(fields, flag):
    with pytest.raises(FitplanError) as e:
        est(model="llama-2-7b", **fields)
    assert e.value.field == flag


@pytest.mark.parametrize("fields, flag", [
    (dict(zero_stage=2, precision="bf16-mixed"), "precision"),  # DeepSpeed casts to 16 bits: *-master
    (dict(zero_stage=2, fsdp="full_shard"), "zero_stage"),
    (dict(fsdp="full_shard", precision="bf16-master"), "precision"),
    (dict(stack="fsdp2", fsdp="hybrid_shard"), "fsdp"),
    (dict(stack="ddp", zero_stage=1), "zero_stage"),
])
def test_what_a_stack_cannot_run_is_an_error_naming_the_flag(fields, flag):
    with pytest.raises(FitplanError) as e:
        est(model="llama-2-7b", num_gpus=8, **fields)
    assert e.value.field == flag
