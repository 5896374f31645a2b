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
DeepSpeed ZeRO-2           G                      k·G (during backward)    -
DeepSpeed ZeRO-3           k·(P + P_b)            k·G                      -
FSDP full_shard            k·2P                   k·G                      -
FSDP shard_grad_op         k·P                    k·G                      -
PyTorch ZeRO-1 (ZeRO opt.) P (broadcasts)         -                        G
========================== ====================== ======================== =================

ZeRO-1/2 all-gather the updated 16-bit partitions of the trainable parameters only (stage_1_and_2.py
builds its flat groups from the optimizer's parameter groups): G, not P, under LoRA.
P_b: ZeRO-3 re-gathers in the backward only the parameters it released after the forward
(``stage3_max_reuse_distance``). A ring collective moves ``(N-1)/N`` of the tensor per rank (all-gather,
reduce-scatter) or twice that (all-reduce); ``comm_bytes_per_step`` applies it and splits the bytes by
where they travel (``topology``): inside an instance (NVLink / PCIe) or between instances (the network).
"""

from __future__ import annotations

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


@quantity("bytes", type="object")
def comm_volumes(sharding_kind, data_parallel_degree, param_count, trainable_param_count, weight_dtype_bytes,
                 trainable_dtype_bytes, gradient_accumulation_steps, tensor_parallel, effective_fsdp, deepspeed_rank,
                 fsdp_rank, arch, per_device_train_batch_size, max_seq_length, activation_dtype_bytes):
    """Bytes of the tensors each collective runs over per optimizer step (module table): ``all_gather``,
    ``reduce_scatter``, ``all_reduce`` (data parallel, ``ranks`` of them) and ``tp_all_reduce`` (tensor
    parallel activations), with ``overlap``: what the stack overlaps with compute."""
    n, k, t = data_parallel_degree, gradient_accumulation_steps, tensor_parallel
    out = {"all_gather": 0.0, "reduce_scatter": 0.0, "all_reduce": 0.0, "tp_all_reduce": 0.0, "ranks": n,
           "overlap": "none"}
    if n > 1:
        kind = sharding_kind
        if kind.startswith("ds"):
            b = weight_dtype_bytes
            P, G = param_count * b / t, trainable_param_count * b / t
            stage = int(kind[2:])
            # stages 1-2 partition only the optimizer's (trainable) parameters: the all-gather after the step
            # moves their updated 16-bit partitions, G bytes (frozen LoRA bases are never communicated)
            if stage == 0:
                out.update(all_reduce=G, overlap="none (reduced after the backward)")
            elif stage == 1:
                out.update(reduce_scatter=G, all_gather=G, overlap="none (reduced at the boundary)")
            elif stage == 2:
                out.update(reduce_scatter=k * G, all_gather=G, overlap="reduce-scatter during the backward")
            else:
                # gathered for the forward and again for the backward, except what stays gathered in between and
                # the modules with no backward (a LoRA base before the first adapter)
                r = deepspeed_rank
                kept = (r.gathered_kept + r.gathered_once) if r is not None else 0
                out.update(all_gather=k * (2 * P - min(kept, P)), reduce_scatter=k * G,
                           overlap="prefetched gathers and bucketed reduce-scatter (overlap_comm)")
        elif kind.startswith("hf_fsdp") or kind in ("fsdp_zero2", "fsdp_zero3"):
            gb = fsdp_rank["gather_b"] if fsdp_rank is not None else weight_dtype_bytes
            P, G = param_count * gb / t, trainable_param_count * gb / t
            passes = 1 if effective_fsdp == "shard_grad_op" or kind == "fsdp_zero2" else 2
            out.update(all_gather=k * passes * P, reduce_scatter=k * G, overlap="prefetched unit gathers, per-unit reduce-scatter")
        elif kind == "zero1":
            G = trainable_param_count * trainable_dtype_bytes / t
            out.update(all_reduce=G, all_gather=G, overlap="gradient buckets during the backward")
        else:
            out.update(all_reduce=trainable_param_count * trainable_dtype_bytes / t,
                       overlap="gradient buckets during the backward")
    if t > 1 and not arch.count_only:
        act = per_device_train_batch_size * max_seq_length * arch.hidden_size * activation_dtype_bytes
        out["tp_all_reduce"] = k * arch.num_hidden_layers * 4 * act
    return out


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
