"""DeepSpeed ZeRO 0-3 per rank, as deepspeed 0.19.8 allocates it (``--zero N``, ``--deepspeed ds_config.json``).

Rank 0's tensors (N data-parallel ranks, b bytes per 16-bit or fp32 model weight, the HF Trainer's two
optimizer groups g; file:line in deepspeed/runtime/ of 0.19.8):

* **ZeRO-1/2** (``DeepSpeedZeroOptimizer``, zero/stage_1_and_2.py): each group's trainable parameters are
  flattened into one 16-bit buffer padded to a multiple of 2·N elements (387, 441, runtime/utils.py:994-1005),
  **replicated on every rank** (``bit16_groups_flat``, 505-524): F_g·b. Each rank keeps an fp32 clone of its
  partition P_g = F_g/N (``single_partition_of_fp32_groups``, 560-577; also for an fp32 model) on which the
  optimizer's states live (one flat tensor per group, 584). Gradients: the IPG bucket of
  ``reduce_bucket_size`` elements in the model dtype (``setup_buckets``, 3256-3280; twice with ``overlap_comm``,
  3273-3278), allocated at the first gradient hook of a backward; ``grads_in_partition`` (2182-2195) holds every
  parameter that *starts* in this rank's partition, whole (the one straddling the boundary included). Stage 1
  keeps all 16-bit gradients until the backward ends (its hooks reduce nothing: 2290-2295) and reduces them
  then (958-980). ``step()`` (3013-3170), one group at a time: the partition's gradients flattened (P·b), cast
  to fp32 (P·4), the optimizer steps that group (its own temporaries), then the 16-bit partition is all-gathered
  in place (runtime/utils.py:1019-1022: ``allgather_bucket_size`` allocates nothing).
* **ZeRO-3** (``DeepSpeedZeroOptimizer_Stage3``, zero/stage3.py, partition_parameters.py): every parameter
  is partitioned on its own, ``ceil(n/N)`` elements per rank (partition_parameters.py:1690-1697, 1816-1817);
  parameters of at most ``stage3_param_persistence_threshold`` elements also stay whole after their first
  gather (1292-1297). fp32 clones of the trainable partitions per sub-group of ``sub_group_size`` elements
  (stage3.py:1153-1172, 1210-1233); for an fp32 model the "already fp32" shortcut never fires (1162-1167
  compares a ``torch.device`` with a string), so an fp32 model keeps its fp32 partition (the weights) and an
  fp32 clone (the master), as a 16-bit model does (measured: master = the trainable partitions × 4 B, in bf16
  and in fp32). The gradient partition buffer
  (786-801) and the IPG bucket (779-784, not doubled by ``overlap_comm``) are allocated at init and persist.
  Around each module its parameters are all-gathered (``ceil(n/N)·N`` elements each) and released after it
  unless used again within ``stage3_max_reuse_distance`` elements of the module trace
  (partitioned_param_coordinator.py:634-661): with the default 1e9 the last modules of the forward stay
  gathered until their backward. ``stage3_prefetch_bucket_size`` elements of parameters not yet gathered are
  gathered ahead (452-476): bounded by what is left to gather.
* **ZeRO-0** (no ZeRO optimizer): fp32, the client optimizer itself; bf16, ``FP16_UnfusedOptimizer``
  (runtime/fp16/unfused_optimizer.py:78): an fp32 copy of every parameter, 16-bit gradients, all cast to fp32
  at step (218-222). Gradients are all-reduced at the end of the backward through one flat copy of up to 5e8
  elements (runtime/engine.py:151, 3796-3830).
* **Offload** (``offload_optimizer``): the fp32 partition, its states, a persistent fp32 gradient partition,
  a 16-bit staging partition and a max-parameter-sized buffer live in (pinned) CPU memory (stage_1_and_2.py:
  278, 563-575, 653-658, 934-941; stage3.py:1157-1160, 1336-1342, 786-801); the GPU keeps the 16-bit weights,
  the bucket and a max-parameter-sized staging buffer (659-661). ``offload_param`` (stage 3) moves the 16-bit
  partitions to the CPU too (888-911): the GPU keeps what is gathered.
"""

from __future__ import annotations

import functools

import attrs

from fitplan.builtin.sharding.params import P, bare, ceil_div, ordered
from fitplan.inputs.optimizer import OptimizerContext
from fitplan.inputs.stacks import ds_value

ALIGN = 2
"""``nccl_start_alignment_factor``: flat groups are padded to a multiple of 2·N elements (stage_1_and_2.py:387, 441)."""
STAGE0_ALLREDUCE = 500_000_000
"""``MEMORY_OPT_ALLREDUCE_SIZE`` (runtime/engine.py:151): ZeRO-0 all-reduces gradients in flat copies of this many elements."""


@attrs.frozen
class DSRank:
    """Rank 0's bytes under DeepSpeed (see the module doc). ``host`` holds what offload puts in CPU memory."""

    weights: int
    master: int
    gradients: int
    grads_persistent: bool
    states_ctx: OptimizerContext
    group_ctxs: tuple[OptimizerContext, ...]
    step_flat_bytes: tuple[int, ...]
    """Per optimizer (sub-)group: the flattened 16-bit gradient of the partition (0 when it is already fp32)."""
    bucket: int
    gathered_kept: int
    gathered_module: int
    prefetch: int
    stage: int
    host: dict
    reduce_end: int
    device_buffers: int = 0
    """GPU buffers alive all step: the stage-3 IPG bucket, offload's max-parameter-sized staging buffer."""
    full_grads: int = 0
    """Every trainable parameter's 16-bit gradient: what ZeRO-0/1 hold at the end of the backward."""
    bucket_el: int = 0
    """``reduce_bucket_size`` in elements: a bucket is reduced when this many gradient elements are in it."""
    gathered_once: int = 0
    """Stage 3: gathered bytes of the modules with no backward (gathered for their forward only, then released)."""


def _groups(params: list[P]) -> list[list[P]]:
    """The Trainer's optimizer groups over the trainable parameters (empty ones dropped: engine.py:2348)."""
    decay = [p for p in params if p.trainable and p.decay]
    other = [p for p in params if p.trainable and not p.decay]
    return [g for g in (decay, other) if g]


def _in_partition(group: list[P], part: int) -> int:
    """Elements of the parameters starting in rank 0's partition ``[0, part)`` (straddlers whole)."""
    total, start = 0, 0
    for p in group:
        if start < part:
            total += p.numel
        start += p.numel
    return total


def _sub_groups(group: list[P], n: int, size: int) -> list[int]:
    """Stage 3: the partition elements of each sub-group of ``sub_group_size`` (stage3.py:1210-1233)."""
    parts = [ceil_div(p.numel, n) for p in group]
    if size >= sum(parts):
        return [sum(parts)]
    out, acc = [], 0
    for i, x in enumerate(parts):
        acc += x
        if acc >= size or i == len(parts) - 1:
            out.append(acc)
            acc = 0
    return out


def _reuse_kept(params: tuple[P, ...], n: int, b: float, persistent: frozenset[int], max_reuse: int,
                no_backward: frozenset[str] = frozenset()) -> tuple[int, int, int]:
    """Stage 3 after the forward: bytes of gathered parameters kept for the backward (modules whose next use,
    in the backward, comes within ``max_reuse`` elements of the trace), the largest module's gathered bytes, and
    the gathered bytes of the modules in ``no_backward``, which are released after their forward (gathered once).

    ``__params_to_release`` (partitioned_param_coordinator.py:634-664) keeps a module's parameters when they
    recur within ``max_reuse`` elements of the recorded module order. A module enters the backward part of that
    order only when its pre-backward function runs (parameter_offload.py:410-414, 466-482, 572-582), which
    autograd calls only for an output that requires grad: a module whose outputs do not (:func:`no_backward_modules`)
    never recurs, and its parameters go right after its forward."""
    modules: list[list[tuple[int, P]]] = []
    index: dict[str, int] = {}
    for i, p in enumerate(params):
        if p.module not in index:
            index[p.module] = len(modules)
            modules.append([])
        modules[index[p.module]].append((i, p))
    sizes = [sum(p.numel for _, p in m) for m in modules]
    gathered = [sum(ceil_div(p.numel, n) * n * b for i, p in m if i not in persistent) for m in modules]
    kept, once, fwd_after, bwd_after = 0.0, 0.0, 0, 0
    for k in range(len(modules) - 1, -1, -1):
        back = modules[k][0][1].module not in no_backward
        if not back:
            once += gathered[k]
        elif sizes[k] + fwd_after + bwd_after < max_reuse:
            kept += gathered[k]
        fwd_after += sizes[k]
        bwd_after += sizes[k] if back else 0
    return int(kept), int(max(gathered, default=0)), int(once)


def no_backward_modules(params: tuple[P, ...], param_ops) -> frozenset[str]:
    """The modules (``P.module``) whose outputs never require grad, from the trace's ``param_ops`` (parameter name,
    any output of its ops requires grad): a module is matched by its layer and its path, the parameter's module
    name (``model.layers.0.self_attn.q_proj``) ending in it. Modules the trace does not name (the repeated
    layers beyond its representative ones) count as having a backward."""
    import re

    ops: dict[tuple[int, str], bool] = {}
    for name, rg in param_ops or ():
        m = re.search(r"\.(\d+)\.", name)
        module = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name  # adapters: modules of their own
        key = (int(m.group(1)) if m else -1, module)
        ops[key] = ops.get(key, False) or rg
    by_layer: dict[int, list[tuple[str, bool]]] = {}
    for (layer, mod), rg in ops.items():
        by_layer.setdefault(layer, []).append((mod, rg))
    out = set()
    for p in params:
        path = p.module.split("/", 1)[-1].replace("{i}", str(p.layer))
        hits = [rg for mod, rg in by_layer.get(p.layer, ()) if mod == path or mod.endswith("." + path)]
        if hits and not any(hits):
            out.add(p.module)
    return frozenset(out)


def layout(params, stage: int, n: int, b: float, device: str, offload_optimizer: bool, offload_params: bool,
           values: dict, no_backward: frozenset[str] = frozenset()) -> DSRank:
    """Rank 0's DeepSpeed tensors for ``params`` (weights already in the engine's dtype: ``b`` bytes);
    ``no_backward``: the modules autograd runs no backward for (:func:`no_backward_modules`)."""
    r = _layout(tuple(params), stage, n, b, device, offload_optimizer, offload_params, values, no_backward)
    return attrs.evolve(r, full_grads=int(sum(p.numel for p in params if p.trainable) * b),
                        bucket_el=int(values["reduce_bucket_size"]))


def _layout(params, stage, n, b, device, offload_optimizer, offload_params, values, no_backward=frozenset()) -> DSRank:
    groups = _groups(params)
    frozen = sum(p.numel for p in params if not p.trainable) * b
    bucket_el = values["reduce_bucket_size"]
    host: dict[str, int] = {}
    if stage == 0:
        trainable = [(p.shape, 1) for p in params if p.trainable]
        per_group = [tuple((p.shape, 1) for p in g) for g in groups]
        total = sum(p.numel for p in params if p.trainable)
        master = total * 4 if b != 4 else 0
        ctx = OptimizerContext(tuple(trainable), 4, 4, device)
        gctx = tuple(OptimizerContext(t, 4, 4, device) for t in per_group)
        return DSRank(int(frozen + total * b), int(master), int(total * b), False, ctx, gctx,
                      tuple(0 for _ in gctx), 0, 0, 0, 0, 0, host, int(min(total, STAGE0_ALLREDUCE) * b))
    if stage in (1, 2):
        flats = [ceil_div(sum(p.numel for p in g), ALIGN * n) * ALIGN * n for g in groups]
        parts = [f // n for f in flats]
        grads = sum(_in_partition(g, part) for g, part in zip(groups, parts)) * b
        ctx = OptimizerContext(tuple(((x,), 1) for x in parts), 4, 4, device)
        gctx = tuple(OptimizerContext((((x,), 1),), 4, 4, device) for x in parts)
        bucket = bucket_el * b * (2 if values["overlap_comm"] else 1)
        weights = frozen + sum(flats) * b
        if offload_optimizer:
            big = max((p.numel for p in params if p.trainable), default=0) * b
            host = {"master_weights": sum(parts) * 4, "gradients": sum(parts) * 4,
                    "buffers": int(sum(parts) * b + big)}
            return DSRank(int(weights), 0, 0, False, ctx, gctx, tuple(0 for _ in parts), int(bucket), 0, 0, 0, stage,
                          host, 0, int(big))
        step_flat = tuple(x * b if b != 4 else 0 for x in parts)
        return DSRank(int(weights), int(sum(parts) * 4), int(grads), False, ctx, gctx, step_flat, int(bucket), 0, 0, 0,
                      stage, host, int(grads) if stage == 1 else 0)
    # stage 3
    threshold = values["stage3_param_persistence_threshold"]
    persistent = frozenset(i for i, p in enumerate(params) if p.numel <= threshold)
    parts_all = sum(ceil_div(p.numel, n) for p in params)
    whole = sum(ceil_div(p.numel, n) * n for i, p in enumerate(params) if i in persistent) * b
    subs = [s for g in groups for s in _sub_groups(g, n, values["sub_group_size"])]
    trainable_parts = sum(subs)
    masters = trainable_parts * 4  # a clone for fp32 models too: the shortcut of stage3.py:1162-1167 never fires
    ctx = OptimizerContext(tuple(((x,), 1) for x in subs), 4, 4, device)
    gctx = tuple(OptimizerContext((((x,), 1),), 4, 4, device) for x in subs)
    kept, module, once = _reuse_kept(params, n, b, persistent, values["stage3_max_reuse_distance"], no_backward)
    # prefetch gathers up to stage3_prefetch_bucket_size elements of the next parameters in the trace that are
    # not already gathered (partitioned_param_coordinator.py:452-476): never more than the non-persistent
    # parameters left once the kept ones are counted
    gatherable = sum(ceil_div(p.numel, n) * n for i, p in enumerate(params) if i not in persistent) * b
    prefetch = max(0, min(min(values["stage3_prefetch_bucket_size"], values["stage3_max_live_parameters"]) * b,
                          gatherable - kept))
    weights = parts_all * b + whole
    grads = trainable_parts * b
    bucket = bucket_el * b
    step_flat = tuple(x * b if b != 4 else 0 for x in subs)
    if offload_optimizer:
        host = {"master_weights": trainable_parts * 4, "gradients": int(trainable_parts * 4 + grads)}
        if offload_params:
            host["weights"] = int(parts_all * b)
            weights = whole
        return DSRank(int(weights), 0, 0, True, ctx, gctx, tuple(0 for _ in subs), int(bucket), kept, module,
                      int(prefetch), 3, host, 0, int(bucket), gathered_once=once)
    if offload_params:
        host["weights"] = int(parts_all * b)
        weights = whole
    return DSRank(int(weights), int(masters), int(grads), True, ctx, gctx, step_flat, int(bucket), kept, module,
                  int(prefetch), 3, host, 0, int(bucket), gathered_once=once)


def ds_values(arch, zero_stage, reduce_bucket_size, overlap_comm, stage3_prefetch_bucket_size,
              stage3_param_persistence_threshold, stage3_max_live_parameters, stage3_max_reuse_distance=None,
              sub_group_size=None) -> dict:
    """The ds_config values that drive the rules, resolved: the scenario's, HF's "auto", DeepSpeed's defaults."""
    hidden = 0 if arch.is_bare else arch.hidden_size
    return {
        "reduce_bucket_size": ds_value(reduce_bucket_size, "reduce_bucket_size", hidden),
        "overlap_comm": zero_stage == 3 if overlap_comm is None else bool(overlap_comm),
        "stage3_prefetch_bucket_size": ds_value(stage3_prefetch_bucket_size, "stage3_prefetch_bucket_size", hidden),
        "stage3_param_persistence_threshold": ds_value(stage3_param_persistence_threshold,
                                                       "stage3_param_persistence_threshold", hidden),
        "stage3_max_live_parameters": ds_value(stage3_max_live_parameters, "stage3_max_live_parameters", hidden),
        "stage3_max_reuse_distance": ds_value(stage3_max_reuse_distance, "stage3_max_reuse_distance", hidden),
        "sub_group_size": ds_value(sub_group_size, "sub_group_size", hidden),
    }


def rank_layout(arch, method, trainable_tensors, weight_dtype_bytes, zero_stage, shard_degree, tensor_parallel, device,
                offload_optimizer, offload_params, values, param_ops=()) -> DSRank:
    """:func:`layout` for the scenario (bare counts: one flat tensor); cached, for searches. ``param_ops``: the
    step trace's (:func:`no_backward_modules`)."""
    return _rank_layout(arch, method, trainable_tensors, weight_dtype_bytes, zero_stage, shard_degree, tensor_parallel,
                        device, offload_optimizer, offload_params, tuple(sorted(values.items())), tuple(param_ops))


@functools.lru_cache(maxsize=512)
def _rank_layout(arch, method, trainable_tensors, b, zero_stage, shard_degree, tensor_parallel, device,
                 offload_optimizer, offload_params, items, param_ops) -> DSRank:
    if arch.is_bare:
        params = bare(ceil_div(arch.param_count, tensor_parallel), b)
    else:
        params = ordered(arch, method, trainable_tensors, b, b, tensor_parallel)
    no_backward = no_backward_modules(tuple(params), param_ops) if zero_stage == 3 else frozenset()
    return layout(params, zero_stage, shard_degree, b, device, offload_optimizer, offload_params, dict(items), no_backward)


# --------------------------------------------------------------------------- quantities and reducers

from fitplan.engine.declarations import quantity, reducer  # noqa: E402


@quantity("values", type="object")
def deepspeed_config_values(arch, zero_stage, reduce_bucket_size, overlap_comm, stage3_prefetch_bucket_size,
                            stage3_param_persistence_threshold, stage3_max_live_parameters, stage3_max_reuse_distance,
                            sub_group_size):
    """The ds_config values the DeepSpeed rules use, resolved: the scenario's, HF's "auto" (hidden², 0.9·hidden²,
    10·hidden: transformers/integrations/deepspeed.py:232-241) or DeepSpeed's defaults for absent keys."""
    return ds_values(arch, zero_stage, reduce_bucket_size, overlap_comm, stage3_prefetch_bucket_size,
                     stage3_param_persistence_threshold, stage3_max_live_parameters, stage3_max_reuse_distance,
                     sub_group_size)


@quantity("layout", type="object")
def deepspeed_rank(sharding_kind, arch, method, trainable_tensors, weight_dtype_bytes, zero_stage, shard_degree,
                   tensor_parallel, device, offload_optimizer, offload_params, deepspeed_config_values, step_trace):
    """Rank 0's DeepSpeed tensors (module doc); None under another stack. Stage 3 reads from the step trace which
    modules run no backward (their parameters are gathered for the forward only)."""
    if not sharding_kind.startswith("ds"):
        return None
    ops = step_trace.param_ops if step_trace is not None and zero_stage == 3 else ()
    return rank_layout(arch, method, trainable_tensors, weight_dtype_bytes, zero_stage, shard_degree, tensor_parallel,
                       device, offload_optimizer, offload_params, deepspeed_config_values, ops)


@quantity("bool", type="bool")
def zero3_linear_saves_input(sharding_kind):
    """DeepSpeed ZeRO-3 saves the input of every Linear whose output is in the autograd graph, frozen weight or
    not: ``deepspeed.initialize`` converts the module through ``zero.Init(module=...)``
    (runtime/zero/parameter_offload.py:270), which with ``zero_optimization.memory_efficient_linear`` (default
    true, zero/config.py:346) replaces ``torch.nn.functional.linear`` by ``zero3_linear_wrap`` for the whole
    process (partition_parameters.py:412-419, 1090-1091); its ``LinearFunctionForZeroStage3.setup_context``
    calls ``ctx.save_for_backward(input, weight, bias)`` unconditionally (zero/linear.py:100-105), where
    PyTorch's ``mm`` saves the input only when the weight requires grad. Under LoRA every frozen Linear after
    the first adapter thus keeps its input (measured: +278,528 B on the tiny-Llama LoRA case, gone with
    ``memory_efficient_linear: false``). Full fine-tuning saves the same tensors either way; bitsandbytes'
    4-bit layers, GPT-2's Conv1D (``torch.addmm``) and nn.Linear subclasses with their own forward (Falcon's)
    do not call ``F.linear``. The learned replay applies it at each call site (``kernels.zero3_linear_input``)."""
    return sharding_kind == "ds3"


def _ds(sharding_kind):
    return sharding_kind.startswith("ds")


def _ds_weights(value, deepspeed_rank, method):
    """DeepSpeed's 16-bit (or fp32) weights on the GPU: stages 0-2 every parameter (flat, padded to 2·N, for
    the trainable ones); stage 3 the partitions plus the persistent parameters whole. (QLoRA under DeepSpeed:
    the 4-bit base as loaded, not modelled further.)"""
    if method == "qlora":
        return value
    return deepspeed_rank.weights


ds_weights = reducer("weight_bytes", when=_ds, name="deepspeed", after=("tensor_parallel", "qlora"))(_ds_weights)


@reducer("master_weight_bytes", when=_ds, name="deepspeed", after=("tensor_parallel",))
def ds_master(value, deepspeed_rank):
    """fp32 master partitions on the GPU (ZeRO-0 bf16: a copy of every parameter; stage 3 fp32: two copies)."""
    return deepspeed_rank.master


@reducer("gradient_bytes", when=_ds, name="deepspeed", after=("tensor_parallel",))
def ds_grads(value, deepspeed_rank):
    """The gradient partition on the GPU: ``grads_in_partition`` (stages 1-2, straddling parameters whole),
    ``grad_partitions_flat_buffer`` (stage 3, persistent), every ``.grad`` at stage 0; 0 under offload."""
    return deepspeed_rank.gradients


@reducer("optimizer_state_bytes", when=_ds, name="deepspeed", after=("tensor_parallel",))
def ds_states(value, deepspeed_rank, optimizer_spec, offload_optimizer):
    """The optimizer's states on rank 0's flat fp32 partitions (one tensor per group / sub-group); on the CPU
    with ``offload_optimizer``."""
    if offload_optimizer:
        return 0
    return int(optimizer_spec.state_bytes(deepspeed_rank.states_ctx))


@reducer("optimizer_step_temp_bytes", when=_ds, name="deepspeed", after=("tensor_parallel",))
def ds_step_temp(value, deepspeed_rank, optimizer_spec, offload_optimizer):
    """DeepSpeed steps one group at a time: the largest group's optimizer temporaries (0 under offload: the
    step runs on the CPU)."""
    if offload_optimizer:
        return 0
    return int(max((optimizer_spec.step_temp_bytes(c) for c in deepspeed_rank.group_ctxs), default=0))


def ds_terms(r: DSRank, optimizer_spec, weight_dtype_bytes, trainable_dtype_bytes, offload_optimizer) -> dict:
    """What DeepSpeed adds to the step timeline (keys in ``builtin/peak.py``)."""
    temps = [0 if offload_optimizer else int(optimizer_spec.step_temp_bytes(c)) for c in r.group_ctxs]
    parts = [int(c.numel) for c in r.group_ctxs]
    out: dict = {"forward": r.gathered_kept, "forward_spike": r.gathered_kept + 2 * r.gathered_module + r.prefetch,
                 "backward": r.gathered_kept, "backward_in_layer": r.gathered_module + r.prefetch,
                 "op_grad_scale": weight_dtype_bytes / trainable_dtype_bytes if trainable_dtype_bytes else 1.0}
    if offload_optimizer:
        step = 0
    elif r.stage == 0:
        total = sum(parts)
        step = r.gradients + (total * 4 if weight_dtype_bytes != 4 else 0) + max(temps, default=0)
    else:
        step = (0 if r.grads_persistent else r.gradients) + max(
            (p * 4 + max(f, t) for p, f, t in zip(parts, r.step_flat_bytes, temps)), default=0)
    out["step"] = int(step)
    if r.stage in (0, 1):
        out.update(grad_mode="accumulate", grad_first=r.bucket, reduce_end=r.reduce_end + r.bucket,
                   backward_grads=r.full_grads)
    elif r.stage == 2:  # the bucket from the first gradient hook, the partition from the first flush
        out.update(grad_mode="bucketed", grad_resident=r.bucket, grad_flushed=r.gradients, flush_at=r.bucket_el * weight_dtype_bytes)
    else:  # the persistent bucket is a device buffer; reduce_scatter_coalesced copies the gradients in it
        copy = min(r.bucket, r.full_grads)
        out.update(grad_mode="bucketed", grad_resident=0, grad_flushed=copy, flush_at=r.bucket_el * weight_dtype_bytes,
                   persistent_grads=r.grads_persistent)
    out["device_buffers"] = r.device_buffers
    return out


QUANTITIES = (deepspeed_config_values, deepspeed_rank, zero3_linear_saves_input)
REDUCERS = (ds_weights, ds_master, ds_grads, ds_states, ds_step_temp)
