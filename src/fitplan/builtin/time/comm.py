"""Communication and CPU-offload transfers of one optimizer step, and how much of them the compute hides.

The time model reads these by name only, so a per-stack model of what each implementation sends
(DeepSpeed, FSDP1/FSDP2, DDP) and of the instance's topology can replace them: ``comm_bytes_per_step`` (bytes
each GPU sends, intra- and inter-node), ``comm_seconds_per_step`` (those bytes over the links),
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
def comm_bytes_per_step(shard_stage, shard_degree, data_parallel_degree, fsdp, num_nodes, param_count, weight_dtype_bytes,
                        grad_bytes_unsharded, trainable_param_count, trainable_dtype_bytes, gradient_accumulation_steps,
                        tensor_parallel, arch, per_device_train_batch_size, max_seq_length, activation_dtype_bytes):
    """Bytes each GPU sends per optimizer step in collectives, ``{"intra": ..., "inter": ...}``.

    With n data-parallel ranks, f = (n−1)/n, G the gradient bytes and P the parameter bytes of one replica,
    k micro-steps per step (ring algorithms, NCCL):

    * DDP (stage 0): one all-reduce of gradients per step, ``2f·G`` (HF accumulates under ``no_sync``);
    * ZeRO-1: reduce-scatter of gradients + all-gather of updated parameters, ``f·G + f·G``;
    * ZeRO-2 / FSDP shard_grad_op: gradients are reduce-scattered every micro-step, ``k·f·G + f·G``;
    * ZeRO-3 / FSDP full_shard: parameters all-gathered in forward and again in backward, gradients
      reduce-scattered, every micro-step: ``k·(2f·P + f·G)`` (1.5× DDP's volume when P = G);
    * FSDP hybrid_shard: that within a node, plus an all-reduce of each GPU's gradient shard across nodes;
    * tensor parallelism (degree t): 4 all-reduces of ``b·s·h`` activations per layer per micro-step (Megatron).

    Traffic crosses nodes ("inter") when ``num_nodes > 1``, except hybrid_shard's intra-node part."""
    n = data_parallel_degree
    P = param_count * weight_dtype_bytes / tensor_parallel
    G = grad_bytes_unsharded / tensor_parallel
    T = trainable_param_count * trainable_dtype_bytes / tensor_parallel
    k = gradient_accumulation_steps
    intra = inter = 0.0
    if n > 1:
        if fsdp == "hybrid_shard" and num_nodes > 1:
            g = shard_degree
            fg = (g - 1) / g
            intra += k * (2 * fg * P + fg * G)
            m = max(1, n // g)
            inter += 2 * (m - 1) / m * G / g
        else:
            f = (n - 1) / n
            if shard_stage == 0:
                vol = 2 * f * G
            elif shard_stage == 1:
                vol = f * G + f * T
            elif shard_stage == 2:
                vol = k * f * G + f * T
            else:
                vol = k * (2 * f * P + f * G)
            if num_nodes > 1:
                inter += vol
            else:
                intra += vol
    if tensor_parallel > 1 and not arch.is_bare:
        ft = (tensor_parallel - 1) / tensor_parallel
        act = per_device_train_batch_size * max_seq_length * arch.hidden_size * activation_dtype_bytes
        intra += k * arch.num_hidden_layers * 4 * 2 * ft * act
    return {"intra": intra, "inter": inter}


def _intra_bandwidth(gpu_spec) -> float:
    factor = NVLINK_DIRECTION_FACTOR if not gpu_spec.interconnect.startswith("pcie") else 1.0
    return gpu_spec.interconnect_gbps * 1e9 * factor * NCCL_EFFICIENCY


@quantity("s")
def comm_seconds_per_step(comm_bytes_per_step, gpu_spec):
    """Collective time per step: intra-node bytes at the hardware ruleset's ``interconnect_gbps`` (NVLink
    figures halved: a ring uses one direction) and inter-node bytes at ``inter_node_gbps``, both × the
    NCCL efficiency (0.8). None without a GPU."""
    if gpu_spec is None:
        return None
    t = 0.0
    if comm_bytes_per_step["intra"]:
        t += comm_bytes_per_step["intra"] / _intra_bandwidth(gpu_spec)
    if comm_bytes_per_step["inter"]:
        t += comm_bytes_per_step["inter"] / (gpu_spec.inter_node_gbps * 1e9 * NCCL_EFFICIENCY)
    return t


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
