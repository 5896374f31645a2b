"""Communication: the buffers each stack keeps, the bytes its collectives move per step, and the topology.

``comm_volumes`` (for the time model, ``builtin/time.py``): per optimizer step, the size of the tensors each
collective runs over, summed over calls, as the stack issues them (N ranks, k micro-steps, P the 16-bit
(gathered) parameter bytes of one replica, G the gradient bytes in the reduce dtype):

========================== ====================== ======================== =================
stack                      all_gather             reduce_scatter           all_reduce
========================== ====================== ======================== =================
DDP                        -                      -                        G (once per step)
DeepSpeed ZeRO-0           -                      -                        G
DeepSpeed ZeRO-1           G (after the step)     G (at the boundary)      -
DeepSpeed ZeRO-2           G (after the step)     k·G (every backward)     -
DeepSpeed ZeRO-3           k·(P + P_b)            k·G                      -
HF FSDP full_shard         k·2P                   G (last backward)        -
HF FSDP shard_grad_op      k·P                    G (last backward)        -
PyTorch FSDP2 (referee)    k·2P / k·P             k·G                      -
PyTorch ZeRO-1 (ZeRO opt.) P (broadcasts)         -                        G
========================== ====================== ======================== =================

ZeRO-1/2 all-gather the updated 16-bit partitions of the trainable parameters only (stage_1_and_2.py
builds its flat groups from the optimizer's parameter groups): G, not P, under LoRA.
P_b: ZeRO-3 re-gathers in the backward only the parameters it released after the forward
(``stage3_max_reuse_distance``). A ring collective moves ``(N-1)/N`` of the tensor per rank (all-gather,
reduce-scatter) or twice that (all-reduce); ``comm_bytes_per_step`` applies it and splits the bytes by
where they travel (``topology``): inside an instance (NVLink / PCIe) or between instances (the network).
``windows`` splits the same bytes by when they run (``WINDOWS``), which decides how much compute can hide them
(``builtin/time/comm.py``).
"""

from __future__ import annotations

import math

from fitplan.engine.declarations import quantity

INSTANCE_DEFAULT_NETWORK = "the GPU ruleset's inter_node_gbps per GPU"


@quantity("bytes", category="memory", label="communication buffers", short_label="comm. buffers",
          json_key="memory.per_gpu_bytes.comm_buffers", row="comm_buffers")
def comm_buffer_bytes(sharding_kind, grad_bytes_unsharded, tensor_parallel, gathered_param_bytes):
    """Communication buffers alive for the whole step: DDP's gradient buckets (DDP and PyTorch ZeRO-1), a flat
    copy of every gradient since ``gradient_as_bucket_view`` is off by default; DeepSpeed ZeRO-3's IPG bucket
    (``reduce_bucket_size`` elements, allocated at init) and offload's GPU staging buffer. DeepSpeed ZeRO-1/2's
    bucket exists only during the backward (in the peak, not here); FSDP's reduce-scatter buffers only while a
    unit's gradients are reduced."""
    if sharding_kind in ("ddp", "zero1"):
        return -(-int(grad_bytes_unsharded) // int(tensor_parallel))
    return int(gathered_param_bytes.get("device_buffers", 0))


@quantity("bytes")
def grad_bytes_unsharded(trainable_param_count, trainable_dtype_bytes):
    """All gradients of one replica, before sharding."""
    return trainable_param_count * trainable_dtype_bytes


COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "tp_all_reduce")
WINDOWS = ("micro", "last", "serial")
"""When a collective runs, which decides what compute it can hide behind (``step_seconds``): ``micro`` inside
every micro-step's forward and backward (prefetched gathers, bucketed reductions on their own stream);
``last`` once per optimizer step, during the last micro-step's backward (DDP's buckets after ``no_sync``);
``serial`` with nothing to overlap (after the backward, or after the optimizer step)."""


DDP_BUCKET_BYTES = 25 * 2**20
"""DDP's gradient bucket cap (``bucket_cap_mb`` default 25 MiB, torch/nn/parallel/distributed.py
``_BucketCapacityConfig``); the first bucket is 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``) when the cap is the
default, so that the last layers' gradients start reducing early."""
DDP_FIRST_BUCKET_BYTES = 2**20
DS_ALLREDUCE_ELEMENTS = 500_000_000
"""DeepSpeed ZeRO-0 reduces gradients in flat buffers of this many elements (engine.py
``MEMORY_OPT_ALLREDUCE_SIZE``, ``buffered_allreduce_fallback``)."""
DS_ALLGATHER_ELEMENTS = 500_000_000
"""DeepSpeed ZeRO-1/2 all-gather the updated partitions in buckets of ``allgather_bucket_size`` elements (default
5e8, zero/config.py; HF's "auto" leaves it alone)."""


def _put(out: dict, window: str, name: str, nbytes: float, calls: float = 1) -> None:
    """Add ``nbytes`` over ``calls`` collectives of kind ``name`` in ``window`` (the calls price each one's
    latency: builtin/time/comm.py)."""
    out[name] += nbytes
    out["windows"][window][name] += nbytes
    out["calls"][window][name] += calls if nbytes else 0


def _buckets(total: float, cap: float) -> int:
    """Collectives over ``total`` (bytes or elements) in buckets of at most ``cap``."""
    return max(1, math.ceil(total / cap)) if total > 0 else 0


def ddp_buckets(grad_bytes: float) -> int:
    """DDP's all-reduces per reduction: a 1 MiB first bucket, then buckets of 25 MiB (a tensor larger than the
    cap gets a bucket of its own: counted here by bytes)."""
    if grad_bytes <= 0:
        return 0
    return 1 + _buckets(max(0.0, grad_bytes - DDP_FIRST_BUCKET_BYTES), DDP_BUCKET_BYTES)


@quantity("bytes", type="object")
def comm_volumes(sharding_kind, data_parallel_degree, param_count, trainable_param_count, weight_dtype_bytes,
                 trainable_dtype_bytes, gradient_accumulation_steps, tensor_parallel, effective_fsdp, deepspeed_rank,
                 fsdp_rank, arch, per_device_train_batch_size, max_seq_length, activation_dtype_bytes,
                 deepspeed_config_values):
    """Bytes of the tensors each collective runs over per optimizer step (module table): ``all_gather``,
    ``reduce_scatter``, ``all_reduce`` (data parallel, ``ranks`` of them) and ``tp_all_reduce`` (tensor
    parallel activations), with ``overlap`` (what the stack overlaps with compute, in words) and ``windows``:
    the same bytes by when they run (``WINDOWS``)."""
    n, k, t = data_parallel_degree, gradient_accumulation_steps, tensor_parallel
    out = {c: 0.0 for c in COLLECTIVES}
    out.update(ranks=n, overlap="none", windows={w: {c: 0.0 for c in COLLECTIVES} for w in WINDOWS},
               calls={w: {c: 0 for c in COLLECTIVES} for w in WINDOWS})
    if n > 1:
        _data_parallel(out, sharding_kind, k, t, param_count, trainable_param_count, weight_dtype_bytes,
                       trainable_dtype_bytes, effective_fsdp, deepspeed_rank, fsdp_rank, deepspeed_config_values,
                       _layers(arch), _tensors(arch))
    if t > 1 and not arch.count_only:
        act = per_device_train_batch_size * max_seq_length * arch.hidden_size * activation_dtype_bytes
        # Megatron-style tensor parallelism: two all-reduces per layer in the forward, two in the backward
        _put(out, "micro", "tp_all_reduce", k * arch.num_hidden_layers * 4 * act, k * arch.num_hidden_layers * 4)
    return out


def _layers(arch) -> int:
    """The FSDP units of a model wrapped per decoder layer (the HF Trainer's transformer-layer auto-wrap) plus the
    root (embeddings, final norm, head); one unit per billion parameters for a bare parameter count."""
    if arch.is_bare or arch.count_only:
        return max(1, round(arch.param_count / 1e9)) + 1
    return arch.num_hidden_layers + 1


def _tensors(arch) -> int:
    """Parameter tensors: DeepSpeed ZeRO-3 fetches each in every pass (``zero3_fetches_per_pass``)."""
    if arch.is_bare or arch.count_only:
        return 9 * _layers(arch)
    return sum(g.count for g in arch.param_groups())


def _data_parallel(out, kind, k, t, param_count, trainable_param_count, weight_dtype_bytes, trainable_dtype_bytes,
                   effective_fsdp, deepspeed_rank, fsdp_rank, ds_values, units, tensors) -> None:
    """The data-parallel collectives of one optimizer step, by stack (module table), into ``out``, with how many
    calls carry them: DDP's buckets, DeepSpeed's buckets of ``reduce_bucket_size`` / ``allgather_bucket_size``
    elements, ZeRO-3's per-tensor fetches, FSDP's per-unit gathers and reduce-scatters (``units``)."""
    overlap_comm = bool(ds_values["overlap_comm"])
    trainable = trainable_param_count / t
    reduce_calls = _buckets(trainable, float(ds_values["reduce_bucket_size"]))
    gather_calls = _buckets(trainable, DS_ALLGATHER_ELEMENTS)
    if kind.startswith("ds"):
        b = weight_dtype_bytes
        P, G = param_count * b / t, trainable_param_count * b / t
        stage = int(kind[2:])
        # engine.py:3084-3093: stages 0-1 reduce only at the accumulation boundary (ZeRO-0 after the backward,
        # buffered_allreduce_fallback; ZeRO-1 reduce_gradients, or its hooks on the boundary micro-step with
        # overlap_comm: stage_1_and_2.py:2286-2295); stage 2 reduces in every micro-step's hooks, on the compute
        # stream without overlap_comm (average_tensor); stages 1-2 partition only the optimizer's (trainable)
        # parameters and all-gather their updated 16-bit partitions after step() (all_gather_dp_groups,
        # 3155-3180): G bytes, not overlapped (the next forward needs them)
        reduce_window = "last" if overlap_comm else "serial"
        if stage == 0:
            _put(out, "serial", "all_reduce", G, _buckets(trainable, DS_ALLREDUCE_ELEMENTS))
            out["overlap"] = "none (reduced after the backward)"
        elif stage == 1:
            _put(out, reduce_window, "reduce_scatter", G, reduce_calls)
            _put(out, "serial", "all_gather", G, gather_calls)
            out["overlap"] = ("reduce-scatter in the last backward (overlap_comm)" if overlap_comm
                              else "none (reduced after the last backward)") + "; all-gather after the step"
        elif stage == 2:
            _put(out, "micro" if overlap_comm else "serial", "reduce_scatter", k * G, k * reduce_calls)
            _put(out, "serial", "all_gather", G, gather_calls)
            out["overlap"] = ("reduce-scatter during every backward (overlap_comm)" if overlap_comm
                              else "none (reduce-scatter on the compute stream)") + "; all-gather after the step"
        else:
            # gathered for the forward and again for the backward, except what stays gathered in between and
            # the modules with no backward (a LoRA base before the first adapter). The gathers are exposed whole:
            # before each module the compute stream waits for every gather issued so far (fetch_sub_module:
            # current_stream().wait_stream(allgather_stream), partitioned_param_coordinator.py:414-415; CUDA does
            # not resolve the dependency itself, cuda_accelerator.py resolves_data_dependency) and the host stops
            # at the oldest of more than two outstanding fetches (__max_ongoing_fetch_events = 2, synchronize(),
            # :403-404), so a gather runs at most one prefetch bucket ahead and the host's launches wait behind it
            r = deepspeed_rank
            kept = (r.gathered_kept + r.gathered_once) if r is not None else 0
            gathered = 2 * P - min(kept, P)
            _put(out, "serial", "all_gather", k * gathered, k * round(2 * tensors * gathered / (2 * P)) if P else 0)
            _put(out, "micro", "reduce_scatter", k * G, k * reduce_calls)
            out["overlap"] = "gathers in series with the modules; bucketed reduce-scatter during the backward (overlap_comm)"
    elif kind.startswith("hf_fsdp") or kind in ("fsdp_zero2", "fsdp_zero3"):
        gb = fsdp_rank["gather_b"] if fsdp_rank is not None else weight_dtype_bytes
        P, G = param_count * gb / t, trainable_param_count * gb / t
        passes = 1 if effective_fsdp == "shard_grad_op" or kind == "fsdp_zero2" else 2
        _put(out, "micro", "all_gather", k * passes * P, k * passes * units)
        if kind.startswith("hf_fsdp"):
            # the HF Trainer runs every micro-step but the last under accelerator.no_sync (trainer.py:1904-1916):
            # FSDP2 set_requires_gradient_sync(False), FSDP1 FullyShardedDataParallel.no_sync
            # (accelerator.py:1126-1139): gradients are reduce-scattered once, in the last backward
            _put(out, "last", "reduce_scatter", G, units)
        else:
            _put(out, "micro", "reduce_scatter", k * G, k * units)
        out["overlap"] = "prefetched unit gathers, per-unit reduce-scatter"
    elif kind == "zero1":
        G = trainable_param_count * trainable_dtype_bytes / t
        _put(out, "last", "all_reduce", G, ddp_buckets(G))
        # ZeroRedundancyOptimizer.step's broadcasts (_sync_params): one per rank's partition
        _put(out, "serial", "all_gather", G, out["ranks"])
        out["overlap"] = "gradient buckets during the backward; broadcasts after the step"
    else:
        # DDP under the HF Trainer: no_sync until the last micro-step, whose backward reduces the buckets
        G = trainable_param_count * trainable_dtype_bytes / t
        _put(out, "last", "all_reduce", G, ddp_buckets(G))
        out["overlap"] = "gradient buckets during the last backward"


@quantity("topology", type="object")
def topology(gpu_spec, provider, instance, region, num_gpus, num_nodes, rulesets):
    """Where the GPUs sit: ``gpus_per_instance`` (the priced instance shape, else the GPU ruleset's
    ``gpus_per_node``), ``instances``, the link inside an instance (``intra``: NVLink / PCIe and its GB/s per
    GPU) and between instances (``network_gbps`` per GPU). A multi-GPU plan on single-GPU VMs talks over the
    network only. None without a GPU."""
    if gpu_spec is None:
        return None
    per, link, link_gbps = gpu_spec.gpus_per_node, gpu_spec.interconnect, gpu_spec.interconnect_gbps
    network = gpu_spec.inter_node_gbps
    source = "hardware ruleset"
    if provider is not None:
        from fitplan.rulesets.pricing import choose_instance

        inst = choose_instance(rulesets, provider, gpu_spec.id, num_gpus, num_nodes, instance, region).instance
        per = inst.gpus
        if inst.interconnect:
            link = inst.interconnect
        if inst.interconnect_gbps:
            link_gbps = inst.interconnect_gbps
        source = f"instance {inst.provider}/{inst.id}"
        if inst.network_gbps:
            network = inst.network_gbps / inst.gpus
        else:
            source += f" (it states no network: the {gpu_spec.id} ruleset's inter_node_gbps, an assumption)"
    used = num_gpus * num_nodes
    instances = num_nodes * -(-num_gpus // per) if per < num_gpus else num_nodes
    return {"gpus_per_instance": per, "instances": instances, "gpus": used,
            "intra": link if per > 1 else "none", "intra_gbps": link_gbps if per > 1 else 0.0,
            "network_gbps": network, "source": source}


QUANTITIES = (comm_buffer_bytes, grad_bytes_unsharded, comm_volumes, topology)
