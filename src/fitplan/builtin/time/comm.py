"""Communication and CPU-offload transfers of one optimizer step, and how much of them the compute hides.

The bytes come from the stack's own collectives (``comm_volumes``, builtin/sharding/comm.py: DeepSpeed,
FSDP1/FSDP2, DDP) and where the GPUs sit (``topology``: instances, their link and network):
``comm_bytes_per_step`` (bytes each GPU sends, intra- and inter-instance), ``comm_seconds_per_step`` (those
bytes over the links) and ``comm_seconds_by_window`` (the same by when they run: in every micro-step, in the
last backward only, or with nothing beside them), ``offload_seconds_per_step`` (PCIe copies), and what the
compute does not hide (``exposed_transfer_seconds``), added in ``step_seconds``.
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity

COMM_OVERLAP_FRACTION = 0.5
"""Share of the compute a collective runs beside that can hide it (``exposed_transfer_seconds``).

Gradient buckets are reduced (DDP, ZeRO-1/2) while backward goes on, and ZeRO-3/FSDP prefetch the next
unit's parameters during forward and backward, so most communication runs concurrently with compute.
But backward is only 2/3 of the FLOPs, the first bucket is ready only after the last layers' backward,
the last bucket waits for all of it, and NCCL kernels take SMs and memory bandwidth from the matmuls they
overlap. Half of the compute time is the middle of "none" (0)
and "all of backward" (2/3): communication shorter than that is hidden, the excess is exposed."""

NVLINK_DIRECTION_FACTOR = 0.5
"""The hardware ruleset quotes NVLink / Infinity Fabric bandwidth bidirectionally (A100 600 GB/s); a ring
collective sends in one direction at a time, so it sees half. PCIe figures are already per direction."""

NCCL_EFFICIENCY = 0.8
"""Bus bandwidth NCCL reaches as a fraction of the link rate (nccl-tests all_reduce_perf: about 230-240 GB/s
on 8×A100 NVLink3 = 0.8 × 300 GB/s per direction; about 40 GB/s per 400 Gb/s InfiniBand rail)."""

PCIE_HOST_GBPS = 25.0
"""GB/s of pinned host <-> GPU copies for CPU offload: PCIe 4.0 x16 is 32 GB/s per direction, copies reach ~25."""


def link_bytes(v: dict, n: int, tensor_parallel: int, spans: bool, hybrid_nodes: int) -> dict:
    """Bytes each GPU sends for the collectives ``v`` (``{"all_gather": ..., "reduce_scatter": ..., "all_reduce":
    ..., "tp_all_reduce": ...}`` of N = ``n`` data-parallel ranks), ``{"intra": ..., "inter": ...}``: rings move
    ``(n−1)/n`` of an all-gather or reduce-scatter and twice that of an all-reduce; everything crosses the
    network when the GPUs span instances (``spans``), except FSDP ``hybrid_shard`` over ``hybrid_nodes`` > 1
    nodes (sharding inside a node, each GPU's gradient shard all-reduced across nodes) and tensor-parallel
    all-reduces (inside a node)."""
    f = (n - 1) / n if n > 1 else 0.0
    dp = f * (v["all_gather"] + v["reduce_scatter"]) + 2 * f * v["all_reduce"]
    t = tensor_parallel
    tp = 2 * (t - 1) / t * v["tp_all_reduce"] if t > 1 else 0.0
    if hybrid_nodes > 1:
        m = hybrid_nodes
        shard = v["reduce_scatter"] / max(1, n // m)
        return {"intra": dp + tp, "inter": 2 * (m - 1) / m * shard}
    return {"intra": tp + (0.0 if spans else dp), "inter": dp if spans else 0.0}


def _spans(topology, num_nodes) -> bool:
    return (topology is not None and topology["instances"] > 1) or num_nodes > 1


@quantity("bytes")
def comm_bytes_per_step(comm_volumes, topology, data_parallel_degree, tensor_parallel, effective_fsdp, num_nodes):
    """Bytes each GPU sends per optimizer step in collectives, ``{"intra": ..., "inter": ...}``: the stack's
    collectives (``comm_volumes``, builtin/sharding/comm.py: DeepSpeed, FSDP, DDP as each issues them) as ring
    algorithms move them, ``(n−1)/n`` of an all-gather or reduce-scatter and twice that of an all-reduce. They
    cross instances ("inter": the network) when the GPUs span instances or nodes (``topology``: a multi-GPU
    plan on one-GPU VMs talks only over the network); FSDP ``hybrid_shard`` keeps its sharding inside a node
    and all-reduces its shard across nodes; tensor-parallel all-reduces stay inside a node."""
    hybrid = num_nodes if effective_fsdp == "hybrid_shard" else 1
    return link_bytes(comm_volumes, data_parallel_degree, tensor_parallel, _spans(topology, num_nodes), hybrid)


def _intra_bandwidth(gpu_spec, topology=None) -> float:
    link = topology["intra"] if topology and topology["intra"] != "none" else gpu_spec.interconnect
    gbps = topology["intra_gbps"] if topology and topology["intra_gbps"] else gpu_spec.interconnect_gbps
    factor = NVLINK_DIRECTION_FACTOR if not link.startswith("pcie") else 1.0
    return gbps * 1e9 * factor * NCCL_EFFICIENCY


# NCCL's cost model for one ring collective (src/graph/tuning.cc, NCCL 2.30: ``ncclTunerConstantsDefaults``,
# ``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``): time = latency + message / algorithm bandwidth, where the
# latency is a base per protocol plus one hop latency per ring step (2(n-1) steps for an all-reduce, n-1 for an
# all-gather or reduce-scatter; steps between nodes at the network's hop latency), and NCCL runs each call in the
# protocol that is fastest for its size. fitplan prices the ring only (NCCL may pick a tree or NVLS for large
# all-reduces, which is faster: a stated simplification).
NCCL_BASE_LATENCY_US = {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}
"""Ring base latency per protocol, microseconds (tuning.cc ``baseLatencies``, Ring row)."""
NCCL_HOP_LATENCY_US = {"nvlink": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
                       "pcie": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
                       "net": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}}
"""Ring latency per step and link, microseconds (tuning.cc ``hwLatencies``: NVLINK, PCI, NET rows, Ring)."""
NCCL_LL_MAX_GBPS = {"volta": 39.0, "turing": 39.0, "ampere": 87.7, "ada": 87.7, "hopper": 141.0, "blackwell": 282.0}
"""LL protocol's bus bandwidth cap on one node by GPU generation (tuning.cc ``llMaxBws``, N1 column); between
nodes 39.0 (two nodes) and 20.4 GB/s (more), the Intel rows."""
NCCL_LL_BANDWIDTH_FACTOR = 0.5
NCCL_LL128_BANDWIDTH_FACTOR = 0.92
"""LL moves 8 bytes per 16 (half the bus bandwidth), LL128 120 per 128 (tuning.cc "Various model refinements");
LL128 runs only over NVLink inside a node (tuning.cc: enabled up to ``PATH_NVB`` inside and ``PATH_PXB`` /
``PATH_PXN`` between GPUs, never over the network)."""
RING_STEPS = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2, "tp_all_reduce": 2}
"""Ring steps per rank: n-1 for an all-gather or reduce-scatter, 2(n-1) for an all-reduce."""


def collective_seconds(sent_bytes: float, calls: float, kind: str, ranks: int, instances: int, intra_link: str,
                       bus_bps: float, generation: str) -> float:
    """Seconds of ``calls`` ring collectives of kind ``kind`` over ``ranks`` GPUs on ``instances`` instances that
    send ``sent_bytes`` per GPU in all (``link_bytes``: the ring's (n-1)/n share already applied), each at the bus
    bandwidth ``bus_bps`` of its slowest link (NVLink/PCIe inside one instance, the network across them): per call
    the fastest of NCCL's LL, LL128 and Simple protocols, latency + bytes / bandwidth (module constants)."""
    if sent_bytes <= 0 or ranks <= 1:
        return 0.0
    calls = max(1.0, calls)
    per = RING_STEPS[kind]
    steps = per * (ranks - 1)
    inter = per * (instances - 1) if instances > 1 else 0
    hop = "pcie" if intra_link.startswith("pcie") else "nvlink"
    ll_cap = (NCCL_LL_MAX_GBPS.get(generation, 87.7) if instances <= 1 else 39.0 if instances == 2 else 20.4) * 1e9
    protocols = {"Simple": bus_bps, "LL": min(ll_cap, NCCL_LL_BANDWIDTH_FACTOR * bus_bps)}
    if instances <= 1 and hop == "nvlink":
        protocols["LL128"] = NCCL_LL128_BANDWIDTH_FACTOR * bus_bps
    size = sent_bytes / calls
    best = min(1e-6 * (NCCL_BASE_LATENCY_US[p] + (steps - inter) * NCCL_HOP_LATENCY_US[hop][p]
                       + inter * NCCL_HOP_LATENCY_US["net"][p]) + size / bw for p, bw in protocols.items())
    return calls * best


def ring_network_bandwidth(inter_bps: float, intra_bps: float, ranks: int, instances: int) -> float:
    """Bus bandwidth of a ring collective across instances: the network's bytes/s per GPU (``inter_bps``) times the
    ring's ranks per instance, at most the link inside the instance (``intra_bps``). NCCL splits a collective over
    channels and gives each channel its own NIC (one rail per GPU on DGX-style nodes), and its cost model adds the
    channels' bandwidths: ``busBw = nChannels * bw`` with ``bw = bwInter`` per channel (NVIDIA/nccl
    src/graph/tuning.cc, ``ncclTopoTuneModel``). Each ring step therefore crosses the network on all of an
    instance's NICs at once, so the ring moves at the instance's whole network bandwidth (8 rails of 25 GB/s on a
    DGX A100: 200 GB/s), not one GPU's share of it. A ring over one-GPU instances keeps one NIC per rank."""
    per_instance = max(1, ranks // max(1, instances))
    if per_instance <= 1:
        return inter_bps
    return min(intra_bps, inter_bps * per_instance)


def window_seconds(v: dict, calls: dict, n: int, tensor_parallel: int, spans: bool, hybrid_nodes: int, gpu_spec,
                   topology) -> float:
    """Seconds of one window's collectives (``v`` bytes and ``calls`` by collective, as ``comm_volumes`` gives
    them): each collective's bytes per GPU as ``link_bytes`` counts them, priced call by call
    (``collective_seconds``) on the link it crosses; FSDP ``hybrid_shard`` splits into the in-node sharding and
    the cross-node all-reduce of each GPU's shard."""
    gen = gpu_spec.generation or ""
    instances = topology["instances"] if topology else 1
    intra_link = topology["intra"] if topology and topology["intra"] != "none" else gpu_spec.interconnect
    intra_bw, inter_bw = _intra_bandwidth(gpu_spec, topology), network_gbps(gpu_spec, topology) * 1e9 * NCCL_EFFICIENCY
    t = 0.0
    for kind in RING_STEPS:
        one = {c: (v[c] if c == kind else 0.0) for c in RING_STEPS}
        if not one[kind]:
            continue
        b = link_bytes(one, n, tensor_parallel, spans, hybrid_nodes)
        k = calls.get(kind, 1)
        if kind == "tp_all_reduce":
            t += collective_seconds(b["intra"], k, kind, tensor_parallel, 1, intra_link, intra_bw, gen)
        elif hybrid_nodes > 1:
            per_node = max(1, n // hybrid_nodes)
            t += collective_seconds(b["intra"], k, kind, per_node, 1, intra_link, intra_bw, gen)
            t += collective_seconds(b["inter"], k, "all_reduce", hybrid_nodes, hybrid_nodes, intra_link, inter_bw, gen)
        elif b["inter"]:
            bus = ring_network_bandwidth(inter_bw, intra_bw, n, max(2, instances))
            t += collective_seconds(b["inter"], k, kind, n, max(2, instances), intra_link, bus, gen)
        else:
            t += collective_seconds(b["intra"], k, kind, n, 1, intra_link, intra_bw, gen)
    return t


@quantity("s")
def comm_seconds_per_step(comm_seconds_by_window):
    """Collective time per step: the windows' sum (``comm_seconds_by_window``). Inside an instance at the hardware
    ruleset's ``interconnect_gbps`` (NVLink figures halved: a ring uses one direction), between instances at the
    network's GB/s per GPU (the instance's ``network_gbps``, else the GPU's ``inter_node_gbps``), both × the NCCL
    efficiency (0.8), plus NCCL's latency per call (``collective_seconds``). None without a GPU."""
    if comm_seconds_by_window is None:
        return None
    return sum(comm_seconds_by_window.values())


@quantity("s", type="object")
def comm_seconds_by_window(comm_volumes, gpu_spec, topology, data_parallel_degree, tensor_parallel, effective_fsdp,
                           num_nodes):
    """Collective seconds by when they run (``comm_volumes["windows"]``: ``micro``, ``last``, ``serial``), each
    window's collectives priced call by call as NCCL runs them (``window_seconds``). None without a GPU."""
    if gpu_spec is None:
        return None
    hybrid = num_nodes if effective_fsdp == "hybrid_shard" else 1
    spans = _spans(topology, num_nodes)
    calls = comm_volumes.get("calls") or {}
    return {w: window_seconds(v, calls.get(w, {}), data_parallel_degree, tensor_parallel, spans, hybrid, gpu_spec,
                              topology)
            for w, v in comm_volumes["windows"].items()}


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


@quantity("s")
def overlap_compute_seconds(compute_seconds_per_step, micro_step_time, gradient_accumulation_steps, assumed_mfu):
    """The compute that collectives can run beside: the k micro-steps (forward and backward), not the optimizer
    update, accumulation or clipping (gradients are reduced before the update reads them, and the updated
    parameters gathered after it writes them); with a stated or measured MFU, the whole compute (it has no
    parts). None without a GPU."""
    if compute_seconds_per_step is None:
        return None
    if assumed_mfu or micro_step_time is None:
        return compute_seconds_per_step
    return gradient_accumulation_steps * micro_step_time["micro_step"]


@quantity("s")
def exposed_transfer_seconds(comm_seconds_by_window, offload_seconds_per_step, overlap_compute_seconds,
                             gradient_accumulation_steps):
    """Communication and offload time per step that no compute hides. Transfers overlap with up to half of the
    compute they run beside (``COMM_OVERLAP_FRACTION``, H = 0.5 × ``overlap_compute_seconds``): collectives
    issued once per step in the last backward (``last``) beside that micro-step only (H / k), those issued in
    every micro-step and the offload copies (``micro``) beside what is left of H; collectives after the
    backward or after the optimizer step (``serial``: DeepSpeed ZeRO-0/1's boundary reduction without
    ``overlap_comm``, ZeRO-1/2's parameter all-gather) are never hidden. None without a GPU."""
    if comm_seconds_by_window is None or overlap_compute_seconds is None:
        return None
    w = comm_seconds_by_window
    hide = COMM_OVERLAP_FRACTION * overlap_compute_seconds
    last_hidden = min(w["last"], hide / gradient_accumulation_steps)
    micro = w["micro"] + offload_seconds_per_step
    return w["last"] - last_hidden + max(0.0, micro - (hide - last_hidden)) + w["serial"]


@quantity("s", json_key="time.step_seconds", role="step")
def step_seconds(compute_seconds_per_step, exposed_transfer_seconds, step_time_calibration):
    """One optimizer step: ``(compute + exposed transfers) × calibration`` (``exposed_transfer_seconds``: what
    the compute does not hide); ``calibration`` is a measured run's step time over the model's (``fitplan
    calibrate``), 1 without one."""
    if compute_seconds_per_step is None:
        return None
    step = compute_seconds_per_step + (exposed_transfer_seconds or 0.0)
    return step * (step_time_calibration.scale if step_time_calibration is not None else 1.0)


QUANTITIES = (comm_bytes_per_step, comm_seconds_per_step, comm_seconds_by_window, offload_seconds_per_step,
              overlap_compute_seconds, exposed_transfer_seconds, step_seconds)
