"""The step time of sharded stacks as they run: each rank's optimizer update on its own partition, and the
collectives of one optimizer step with gradient accumulation (fitplan issue #27 item 4, #28).

Every expected number is derived here by hand from Llama-2-7B's shapes (config.json: vocab 32,000, hidden 4,096,
intermediate 11,008, 32 layers, untied embeddings), the cited library rules and the constants read from the
bundled rulesets (rulesets/hardware/nvidia.toml's H100 SXM, rulesets/throughput/fitted.toml's Hopper factors).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

import fitplan

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- constants, from the rulesets


def _h100():
    gpus = tomllib.loads((ROOT / "rulesets" / "hardware" / "nvidia.toml").read_text())["gpu"]
    return next(g for g in gpus if g["id"] == "h100-sxm")


def _fitted():
    return tomllib.loads((ROOT / "rulesets" / "throughput" / "fitted.toml").read_text())


H100 = _h100()
FIT = _fitted()
BANDWIDTH = H100["bandwidth_gbps"] * 1e9  # HBM bytes/s
MEMORY_EFF = next(e for e in FIT["time_efficiency"] if e["generation"] == "hopper")["memory"]
HOST = FIT["time_model"]["host_seconds_per_kernel"]
# NVLink figures are bidirectional: a ring sends one way (× 0.5) at NCCL's 0.8 of the link (time/comm.py)
LINK = H100["interconnect_gbps"] * 1e9 * 0.5 * 0.8

# --------------------------------------------------------------------------- Llama-2-7B, by hand

V, H, I, L, N = 32_000, 4_096, 11_008, 32, 8
LAYER_MATRICES = [(H, H)] * 4 + [(I, H), (I, H), (H, I)]  # q k v o, gate up (out × in), down
MATRIX_EL = 2 * V * H + L * sum(a * b for a, b in LAYER_MATRICES)  # embed + lm_head + the layers' Linears
NORM_EL = (2 * L + 1) * H  # two RMSNorms per layer and the final one
P = MATRIX_EL + NORM_EL
assert P == 6_738_415_616  # the published 6.74B

FOREACH_CHUNK = 320 * 65_536  # elements one multi_tensor_apply launch covers (ATen MultiTensorApply.cuh)
ADAMW_FOREACH_B = lambda param_b, state_b: 14 * state_b + 2 * param_b + 2 * param_b  # noqa: E731
# torch 2.13 _multi_tensor_adam (weight_decay 0): lerp_, mul_, addcmul_, sqrt, div_, add_, addcdiv_: 14 state-sized
# reads/writes, the gradient read twice, the parameter read and written; per element
MASTER_COPY_B = (2 + 4) + (4 + 2)  # DeepSpeed's bf16 gradient upcast to fp32 and the fp32 partition copied back


def update_seconds(elements: int, bytes_per_element: float, kernels: int) -> float:
    """A memory-bound update: its bytes at the fitted share of HBM bandwidth, overlapped with its launches on the
    host as the root of the sum of squares (roofline.overlap)."""
    gpu = elements * bytes_per_element / (BANDWIDTH * MEMORY_EFF)
    return math.hypot(gpu, kernels * HOST)


def foreach_kernels(tensors: int, elements: int) -> int:
    """Seven foreach ops over three tensor lists: one launch per 48 tensors or per chunk of elements."""
    return 7 * max(math.ceil(tensors / 48), math.ceil(elements / FOREACH_CHUNK), 1)


def est(**kw):
    return fitplan.estimate(model="llama-2-7b", gpu="h100-sxm", optim="adamw_torch", **kw)


# --------------------------------------------------------------------------- per-rank elements, by stack


def deepspeed_partitions() -> list[int]:
    """ZeRO-1/2 (stage_1_and_2.py: each optimizer group flattened, padded to a multiple of 2·N, split in N):
    the HF Trainer's groups are the decayed matrices and the undecayed norms. ZeRO-3 (stage3.py) partitions every
    parameter ``ceil(n/N)`` and groups them in sub-groups of sub_group_size = 1e9: every dimension here divides by
    8, so both give the same two partitions."""
    return [math.ceil(g / (2 * N)) * 2 * N // N for g in (MATRIX_EL, NORM_EL)]


def fsdp2_chunks() -> list[int]:
    """FSDP2 (and PyTorch-native fully_shard): rank 0's ``ceil(d0/N)`` rows of every tensor."""
    shapes = [(V, H)] + [s for _ in range(L) for s in LAYER_MATRICES + [(H,), (H,)]] + [(H,), (V, H)]
    return [math.ceil(s[0] / N) * math.prod(s[1:]) for s in shapes]


def fsdp1_views() -> list[int]:
    """FSDP1 with use_orig_params (_flat_param.py): one flat parameter per decoder layer and one for the root
    (embeddings, final norm, LM head), parameters at multiples of 8 bf16 elements (16 bytes: all sizes here are),
    padded to a multiple of N and chunked evenly; rank 0's optimizer sees the parts of the parameters inside its
    chunk: per layer q_proj whole and the start of k_proj, in the root the start of the embedding."""
    layer = [a * b for a, b in LAYER_MATRICES] + [H, H]
    root = [V * H, H, V * H]
    out = []
    for unit in [layer] * L + [root]:
        chunk = math.ceil(sum(unit) / N)
        start = 0
        for n in unit:
            if start < chunk:
                out.append(min(start + n, chunk) - start)
            start += n
    return out


def zero_redundancy_partition() -> list[int]:
    """torch ZeroRedundancyOptimizer._partition_parameters: tensors sorted largest first, each to the rank with
    the fewest elements so far (ties: the lowest rank); rank 0's tensors."""
    sizes = [V * H] * 2 + [a * b for a, b in LAYER_MATRICES] * L + [H] * (2 * L + 1)
    load, mine = [0] * N, []
    for n in sorted(sizes, reverse=True):
        r = load.index(min(load))
        load[r] += n
        if r == 0:
            mine.append(n)
    return mine


# --------------------------------------------------------------------------- the optimizer update per rank


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_update_is_the_rank_partition(stage):
    # bf16 with fp32 master partitions (HF bf16=True under DeepSpeed): AdamW over fp32 params and states,
    # 72 B per element, + 12 B of upcast and copy-back; one step call per group (stage_1_and_2.py:2967-2970,
    # stage3.py:1235-1262), each a foreach over one flat tensor
    parts = deepspeed_partitions()
    assert sum(parts) == P // N == 842_301_952
    kernels = sum(foreach_kernels(1, n) for n in parts)  # 7 × 41 + 7 × 1 = 294
    assert kernels == 294
    expected = update_seconds(sum(parts), ADAMW_FOREACH_B(4, 4) + MASTER_COPY_B, kernels)
    e = est(num_gpus=8, zero_stage=stage, precision="bf16-master")
    assert e["optimizer_step_kernels"] == kernels
    assert e["optimizer_step_seconds"] == pytest.approx(expected, rel=1e-9)
    one = est(num_gpus=1, zero_stage=stage, precision="bf16-master")["optimizer_step_seconds"]
    assert e["optimizer_step_seconds"] <= one / 6


@pytest.mark.parametrize("stack, views", [("fsdp2", fsdp2_chunks), ("fsdp1", fsdp1_views)])
def test_accelerate_fsdp_update_is_the_rank_shard(stack, views):
    # HF bf16=True under FSDP: fp32 shards and states (accelerate upcasts the trainable parameters), 72 B per
    # element, no master copy; one foreach over rank 0's shards (per tensor)
    mine = views()
    assert sum(mine) == P // N  # every dimension and unit divides by 8: no padding
    kernels = foreach_kernels(len(mine), sum(mine))  # 7 × 41 (element chunks dominate)
    expected = update_seconds(sum(mine), ADAMW_FOREACH_B(4, 4), kernels)
    e = est(num_gpus=8, fsdp="full_shard", stack=stack, precision="bf16-mixed")
    assert e["sharding_kind"] == f"hf_{stack}"
    assert e["optimizer_step_seconds"] == pytest.approx(expected, rel=1e-9)
    one = est(num_gpus=1, precision="bf16-mixed")["optimizer_step_seconds"]
    assert e["optimizer_step_seconds"] <= one / 6


@pytest.mark.parametrize("kw, views", [(dict(zero_stage=1), zero_redundancy_partition),
                                       (dict(fsdp="full_shard"), fsdp2_chunks)], ids=["zero1", "fully_shard"])
def test_torch_native_update_is_the_rank_share(kw, views):
    mine = views()
    expected = update_seconds(sum(mine), ADAMW_FOREACH_B(4, 4), foreach_kernels(len(mine), sum(mine)))
    e = est(num_gpus=8, stack="torch", precision="bf16-mixed", **kw)
    assert e["optimizer_step_seconds"] == pytest.approx(expected, rel=1e-9)
    assert e["optimizer_step_seconds"] <= est(num_gpus=1, precision="bf16-mixed")["optimizer_step_seconds"] / 6


def test_sharded_update_leaves_memory_as_it_was():
    # the states the update is timed on are the states the memory model holds: AdamW's two fp32 states of
    # rank 0's partition (DeepSpeed ZeRO-2: 2 × 4 B × P/8)
    e = est(num_gpus=8, zero_stage=2, precision="bf16-master")
    assert e["optimizer_state_bytes"] == 2 * 4 * P // N


# --------------------------------------------------------------------------- collectives with accumulation

F = (N - 1) / N  # a ring moves (N−1)/N of an all-gather or reduce-scatter per rank, twice that of an all-reduce
G16 = P * 2  # DeepSpeed's bf16 gradients / 16-bit parameters of the trainable (all) parameters
DS_CALLS = math.ceil(P / 5e8)  # ZeRO-1/2 buckets: reduce_bucket_size and allgather_bucket_size default 5e8 elements
UNITS = L + 1  # FSDP units: one per decoder layer (the Trainer's transformer-layer auto-wrap) and the root


def nccl(sent: float, calls: int, steps: int) -> float:
    """``calls`` ring collectives of ``steps`` ring steps on one H100 node (NVLink) sending ``sent`` bytes per GPU in
    all, each in NCCL's fastest protocol (NCCL 2.30 src/graph/tuning.cc: ring base latency LL 6.6, LL128 14.0,
    Simple 8.4 µs; NVLink hop latency 0.6, 1.9, 3.4 µs per step; bandwidth: Simple the link, LL128 0.92 of it,
    LL half of it capped at Hopper's 141 GB/s)."""
    size = sent / calls
    simple = 8.4e-6 + steps * 3.4e-6 + size / LINK
    ll128 = 14.0e-6 + steps * 1.9e-6 + size / (0.92 * LINK)
    ll = 6.6e-6 + steps * 0.6e-6 + size / min(141e9, 0.5 * LINK)
    return calls * min(simple, ll128, ll)


def test_nccl_all_reduce_by_message_size():
    """One all-reduce on 8 H100s (2·7 = 14 ring steps) by size: a small message is latency-bound and runs in LL,
    a medium one in LL128, a large one in Simple at the link's bandwidth (hand-derived from tuning.cc's model)."""
    from fitplan.builtin.time.comm import collective_seconds

    for size, protocol_seconds in ((64 * 1024, 6.6e-6 + 14 * 0.6e-6 + 2 * F * 64 * 1024 / min(141e9, 0.5 * LINK)),
                                   (8 * 2**20, 14.0e-6 + 14 * 1.9e-6 + 2 * F * 8 * 2**20 / (0.92 * LINK)),
                                   (2**30, 8.4e-6 + 14 * 3.4e-6 + 2 * F * 2**30 / LINK)):
        got = collective_seconds(2 * F * size, 1, "all_reduce", N, 1, "nvlink", LINK, "hopper")
        assert got == pytest.approx(protocol_seconds, rel=1e-12)
        assert got == pytest.approx(nccl(2 * F * size, 1, 14), rel=1e-12)
    # the effective bus bandwidth grows with the message: 64 KiB at under a tenth of the link, 1 GiB within 2 %
    small = 2 * F * 64 * 1024 / collective_seconds(2 * F * 64 * 1024, 1, "all_reduce", N, 1, "nvlink", LINK, "hopper")
    large = 2 * F * 2**30 / collective_seconds(2 * F * 2**30, 1, "all_reduce", N, 1, "nvlink", LINK, "hopper")
    assert small < 0.1 * LINK and large > 0.98 * LINK


def test_zero1_reduces_once_per_step_whatever_the_accumulation():
    # engine.py:3084-3093: ZeRO-1 reduces at the accumulation boundary only, after the backward (no overlap_comm:
    # nothing beside it); step() then all-gathers the updated bf16 partitions (stage_1_and_2.py:3155): one
    # reduce-scatter + one all-gather of G, all exposed
    expected = nccl(F * G16, DS_CALLS, N - 1) + nccl(F * G16, DS_CALLS, N - 1)
    for k in (1, 4):
        e = est(num_gpus=8, zero_stage=1, precision="bf16-master", gradient_accumulation_steps=k)
        assert e["comm_seconds_per_step"] == pytest.approx(expected, rel=1e-9)
        assert e["exposed_transfer_seconds"] == pytest.approx(expected, rel=1e-9)
        assert e["step_seconds"] - e["compute_seconds_per_step"] == pytest.approx(expected, rel=1e-9)
        assert e["communication_share"] > 0


def test_zero2_with_accumulation_keeps_its_collectives():
    # ZeRO-2 reduce-scatters in every micro-step's gradient hooks ("ZeRO stage >= 2 communicates during non
    # gradient accumulation boundaries as well", engine.py:3084; stage_1_and_2.py:2294) and all-gathers the
    # parameters once after step(): k = 4 moves 4 reduce-scatters + 1 all-gather, k = 1 one of each
    rs, ag = nccl(F * G16, DS_CALLS, N - 1), nccl(F * G16, DS_CALLS, N - 1)
    one = est(num_gpus=8, zero_stage=2, precision="bf16-master")
    four = est(num_gpus=8, zero_stage=2, precision="bf16-master", gradient_accumulation_steps=4)
    assert one["comm_seconds_per_step"] == pytest.approx(rs + ag, rel=1e-9)
    assert four["comm_seconds_per_step"] == pytest.approx(4 * rs + ag, rel=1e-9)
    # without overlap_comm (DeepSpeed's default below stage 3) the reductions run on the compute stream: exposed
    assert four["exposed_transfer_seconds"] == pytest.approx(4 * rs + ag, rel=1e-9)
    assert four["communication_share"] > 0
    # with overlap_comm the reduce-scatters hide behind half of the 4 micro-steps (COMM_OVERLAP_FRACTION), the
    # all-gather after the step behind nothing
    ov = est(num_gpus=8, zero_stage=2, precision="bf16-master", gradient_accumulation_steps=4, overlap_comm=True)
    micro = ov["micro_step_time"]["micro_step"]
    assert ov["exposed_transfer_seconds"] == pytest.approx(ag + max(0.0, 4 * rs - 0.5 * 4 * micro), rel=1e-9)
    assert ov["exposed_transfer_seconds"] >= ag > 0


def test_zero3_gathers_are_exposed_and_its_reduce_scatters_overlap():
    # DeepSpeed ZeRO-3 (partitioned_param_coordinator.py fetch_sub_module): before each module the compute stream
    # waits for every gather issued so far (wait_stream on the gather stream, :414-415) and the host for the oldest
    # of more than two outstanding fetches (synchronize, :403-404): the parameter gathers run in series with the
    # modules, exposed whole; the gradients are reduce-scattered in reduce_bucket_size buckets (5e8 elements)
    # during every micro-step's backward (overlap_comm, stage 3's default), beside half of the micro-steps
    for k in (1, 4):
        e = est(num_gpus=8, zero_stage=3, precision="bf16-master", gradient_accumulation_steps=k)
        windows = e["comm_seconds_by_window"]
        rs = k * nccl(F * G16, DS_CALLS, N - 1)
        gathers = e["comm_seconds_per_step"] - rs
        assert windows["micro"] == pytest.approx(rs, rel=1e-9)
        assert windows["serial"] == pytest.approx(gathers, rel=1e-9)
        assert gathers > rs  # forward and backward gathers of the 16-bit parameters (2·f·P) against one f·G
        micro = e["micro_step_time"]["micro_step"]
        assert e["exposed_transfer_seconds"] == pytest.approx(gathers + max(0.0, rs - 0.5 * k * micro), rel=1e-9)


def test_ddp_all_reduces_once_per_step_under_no_sync():
    # the HF Trainer runs all micro-steps but the last under accelerator.no_sync (trainer.py:1904-1916): one
    # all-reduce of the fp32 gradients (bf16-mixed) per optimizer step, 2·f·G
    # in DDP's buckets: 1 MiB first, then 25 MiB (torch/nn/parallel/distributed.py _BucketCapacityConfig)
    buckets = 1 + math.ceil((P * 4 - 2**20) / (25 * 2**20))
    expected = nccl(2 * F * P * 4, buckets, 2 * (N - 1))
    for k in (1, 4):
        e = est(num_gpus=8, stack="ddp", precision="bf16-mixed", gradient_accumulation_steps=k)
        assert e["comm_seconds_per_step"] == pytest.approx(expected, rel=1e-9)


def test_hf_fsdp_reduce_scatters_once_per_step():
    # FSDP under the Trainer: no_sync on the non-final micro-steps (FSDP2 set_requires_gradient_sync(False),
    # accelerator.py:1126-1129): parameters gathered for forward and backward every micro-step (bf16, 2·f·P),
    # gradients reduce-scattered once (f·G, bf16)
    for k in (1, 4):
        e = est(num_gpus=8, fsdp="full_shard", precision="bf16-mixed", gradient_accumulation_steps=k)
        expected = nccl(k * 2 * F * P * 2, k * 2 * UNITS, N - 1) + nccl(F * P * 2, UNITS, N - 1)
        assert e["comm_seconds_per_step"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("k", [1, 4])
def test_fsdp_copies_on_the_compute_stream(k):
    # FSDP2 (torch 2.13 _fully_shard/_fsdp_collectives.py foreach_all_gather_copy_out, from
    # FSDPParamGroup.wait_for_unshard on the current stream): after each unit's all-gather, split_with_sizes_copy
    # reads the flat gathered buffer and writes every parameter's unsharded tensor: per micro-step two gathers
    # (forward, backward) of the whole bf16 model, each read and written once: 2 · (k · 2 · P · 2 B).
    # FSDP1 gathers into its flat parameter in place, but runs the forward on torch.split views of it
    # (_flat_param.py _use_unsharded_views), so each backward builds the flat bf16 gradient with
    # SplitWithSizesBackward's cat: every gradient read and written once per micro-step: k · 2 · P · 2 B.
    e2 = est(num_gpus=8, fsdp="full_shard", stack="fsdp2", precision="bf16-mixed", gradient_accumulation_steps=k)
    e1 = est(num_gpus=8, fsdp="full_shard", stack="fsdp1", precision="bf16-mixed", gradient_accumulation_steps=k)
    copied, catted = 2 * (k * 2 * P * 2), k * 2 * P * 2
    assert (e2["fsdp_copy_out_bytes"], e2["fsdp_grad_cat_bytes"]) == (pytest.approx(copied, rel=1e-12), 0)
    assert (e1["fsdp_copy_out_bytes"], e1["fsdp_grad_cat_bytes"]) == (0, pytest.approx(catted, rel=1e-12))
    # serial with the compute: their bytes at the memory efficiency, on top of the micro-steps and per-step passes
    for e, extra in ((e2, copied), (e1, catted)):
        rest = (k * e["micro_step_time"]["micro_step"] + e["gradient_accumulation_seconds"] + e["grad_clip_seconds"]
                + e["optimizer_step_seconds"])
        assert e["compute_seconds_per_step"] - rest == pytest.approx(extra / (BANDWIDTH * MEMORY_EFF), rel=1e-9)


def test_fsdp_split_backward_is_a_cat_of_the_gradients():
    # the rule's premise on torch's own dispatch: a parameter used through torch.split views (as FSDP1 unflattens
    # its flat parameter) gets its gradient from SplitWithSizesBackward0, which runs one aten::cat
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    flat = torch.nn.Parameter(torch.randn(3 * 16 * 16))
    x = torch.randn(4, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        a, b, c = [t.view(16, 16) for t in torch.split(flat, [256] * 3)]
        (x @ a.t() @ b.t() @ c.t()).sum().backward()
    names = [ev.name for ev in prof.events()]
    assert "SplitWithSizesBackward0" in names and names.count("aten::cat") == 1
    assert flat.grad is not None and flat.grad.shape == flat.shape
