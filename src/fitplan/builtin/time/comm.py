"""Communication and CPU-offload transfers of one optimizer step, and how much of them the compute hides.

The bytes come from the stack's own collectives (``comm_volumes``, builtin/sharding/comm.py: DeepSpeed,
FSDP1/FSDP2, DDP) and where the GPUs sit (``topology``: instances, their link and network):
``comm_bytes_per_step`` (bytes each GPU sends, intra- and inter-instance), ``comm_seconds_per_step`` (those
bytes over the links),
``offload_seconds_per_step`` (PCIe copies) and the overlap in ``step_seconds``.
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity

COMM_OVERLAP_FRACTION = 0.5
"""Share of a step's compute time that communication can hide behind.

Gradient buckets are reduced (DDP, ZeRO-1/2) while backward goes on, and ZeRO-3/FSDP prefetch the next
unit's parameters during forward and backward, so most communication runs concurrently with compute.
But backward is only 2/3 of the FLOPs, the first bucket is ready only after the last layers' backward,
the last bucket and the optimizer-step all-gather wait for all of it, and NCCL kernels take SMs and
memory bandwidth from the matmuls they overlap. Half of the compute time is the middle of "none" (0)
and "all of backward" (2/3): communication shorter than that is hidden, the excess is exposed."""

NVLINK_DIRECTION_FACTOR = 0.5
"""The hardware ruleset quotes NVLink / Infinity Fabric bandwidth bidirectionally (A100 600 GB/s); a ring
collective sends in one direction at a time, so it sees half. PCIe figures are already per direction."""

NCCL_EFFICIENCY = 0.8
"""Bus bandwidth NCCL reaches as a fraction of the link rate (nccl-tests all_reduce_perf: about 230-240 GB/s
on 8×A100 NVLink3 = 0.8 × 300 GB/s per direction; about 40 GB/s per 400 Gb/s InfiniBand rail)."""

PCIE_HOST_GBPS = 25.0
"""GB/s of pinned host <-> GPU copies for CPU offload: PCIe 4.0 x16 is 32 GB/s per direction, copies reach ~25."""


@quantity("bytes")
def comm_bytes_per_step(comm_volumes, topology, data_parallel_degree, tensor_parallel, effective_fsdp, num_nodes):
    """Bytes each GPU sends per optimizer step in collectives, ``{"intra": ..., "inter": ...}``: the stack's
    collectives (``comm_volumes``, builtin/sharding/comm.py: DeepSpeed, FSDP, DDP as each issues them) as ring
    algorithms move them, ``(n−1)/n`` of an all-gather or reduce-scatter and twice that of an all-reduce. They
    cross instances ("inter": the network) when the GPUs span instances or nodes (``topology``: a multi-GPU
    plan on one-GPU VMs talks only over the network); FSDP ``hybrid_shard`` keeps its sharding inside a node
    and all-reduces its shard across nodes; tensor-parallel all-reduces stay inside a node."""
    v = comm_volumes
    n = data_parallel_degree
    f = (n - 1) / n if n > 1 else 0.0
    dp = f * (v["all_gather"] + v["reduce_scatter"]) + 2 * f * v["all_reduce"]
    tp = 2 * (tensor_parallel - 1) / tensor_parallel * v["tp_all_reduce"] if tensor_parallel > 1 else 0.0
    spans = (topology is not None and topology["instances"] > 1) or num_nodes > 1
    if effective_fsdp == "hybrid_shard" and num_nodes > 1:
        m = max(1, num_nodes)
        shard = v["reduce_scatter"] / max(1, v["ranks"] // m)
        return {"intra": dp + tp, "inter": 2 * (m - 1) / m * shard}
    return {"intra": tp + (0.0 if spans else dp), "inter": dp if spans else 0.0}


def _intra_bandwidth(gpu_spec) -> float:
    factor = NVLINK_DIRECTION_FACTOR if not gpu_spec.interconnect.startswith("pcie") else 1.0
    return gpu_spec.interconnect_gbps * 1e9 * factor * NCCL_EFFICIENCY


@quantity("s")
def comm_seconds_per_step(comm_bytes_per_step, gpu_spec, topology):
    """Collective time per step: intra-node bytes at the hardware ruleset's ``interconnect_gbps`` (NVLink
    figures halved: a ring uses one direction) and inter-instance bytes at the network's GB/s per GPU (the
    instance's ``network_gbps``, else the GPU's ``inter_node_gbps``), both × the NCCL efficiency (0.8). None
    without a GPU."""
    if gpu_spec is None:
        return None
    t = 0.0
    if comm_bytes_per_step["intra"]:
        t += comm_bytes_per_step["intra"] / _intra_bandwidth(gpu_spec)
    if comm_bytes_per_step["inter"]:
        t += comm_bytes_per_step["inter"] / (network_gbps(gpu_spec, topology) * 1e9 * NCCL_EFFICIENCY)
    return t


def network_gbps(gpu_spec, topology) -> float:
    """GB/s per GPU between instances: the priced instance's network (``topology``), else the GPU ruleset's."""
    return topology["network_gbps"] if topology else gpu_spec.inter_node_gbps


@quantity("s")
def offload_seconds_per_step(offload_optimizer, offload_params, shard_stage, shard_degree, grad_bytes_unsharded,
                             trainable_param_count, weight_dtype_bytes, param_count, gradient_accumulation_steps,
                             tensor_parallel):
    """CPU offload's PCIe copies per step (DeepSpeed ZeRO-Offload) at 25 GB/s: each GPU's gradient shard
    goes down and its updated parameters come back up; with parameter offload (stage 3) every micro-step
    also fetches the parameter shard for forward and for backward. The CPU's update itself is
    ``optimizer_step_seconds``."""
    div = (shard_degree if shard_stage >= 1 else 1) * tensor_parallel
    b = 0.0
    if offload_optimizer:
        b += grad_bytes_unsharded / div + trainable_param_count * weight_dtype_bytes / div
    if offload_params and shard_stage >= 3:
        b += gradient_accumulation_steps * 2 * param_count * weight_dtype_bytes / (shard_degree * tensor_parallel)
    return b / (PCIE_HOST_GBPS * 1e9)


@quantity("s", json_key="time.step_seconds")
def step_seconds(compute_seconds_per_step, comm_seconds_per_step, offload_seconds_per_step, step_time_calibration):
    """One optimizer step: ``(compute + max(0, communication + offload − 0.5 × compute)) × calibration``:
    transfers overlap with up to half of the compute (``COMM_OVERLAP_FRACTION``, reasoning in the module);
    ``calibration`` is a measured run's step time over the model's (``fitplan calibrate``), 1 without one."""
    if compute_seconds_per_step is None:
        return None
    transfers = (comm_seconds_per_step or 0.0) + offload_seconds_per_step
    step = compute_seconds_per_step + max(0.0, transfers - COMM_OVERLAP_FRACTION * compute_seconds_per_step)
    return step * (step_time_calibration.scale if step_time_calibration is not None else 1.0)


QUANTITIES = (comm_bytes_per_step, comm_seconds_per_step, offload_seconds_per_step, step_seconds)
