"""PyTorch-native sharding (``--stack torch``), as fitplan-torch's plain referee runs it; tensor parallelism.

Per GPU (rank 0), with N the data-parallel degree (Rajbhandari et al. 2019, "ZeRO"), as PyTorch's own
implementations allocate (what fitplan-torch validates with two gloo ranks):

* stage 0, N > 1 (also ``--stack ddp`` and several GPUs with no other flag): DDP. Every rank keeps
  everything, plus DDP's gradient buckets (a flat copy of the gradients: ``gradient_as_bucket_view`` is off
  by default).
* stage 1: DDP + ``torch.distributed.optim.ZeroRedundancyOptimizer``: whole parameter tensors are assigned
  to ranks greedily (largest first, to the rank with the fewest elements so far); each rank keeps the
  optimizer states (and step temporaries) of its tensors.
* stages 2 and 3: FSDP2 ``fully_shard`` on every decoder layer and the root, ``reshard_after_forward`` False
  / True, with no mixed-precision policy (autocast, when the precision asks for it, runs on the fp32 shards).
  Each parameter is split on dim 0 with ``torch.chunk``: rank 0 keeps ``ceil(d0/N)`` rows of it, and so its
  gradient and optimizer states (AdamW's ``step`` scalars are per tensor, not sharded). During forward and
  backward the root's parameters (embeddings, final norm, LM head) and the current layer's are gathered
  (stage 2: every layer's, from forward to backward), plus the flat all-gather buffer of the latest layer
  (freed when the next all-gather is copied out).

DeepSpeed (``deepspeed.py``) and accelerate's FSDP (``fsdp.py``) are the other stacks. Tensor parallelism
(degree t) splits weights, gradients and states t ways before data-parallel sharding.
"""

from __future__ import annotations

import math

from fitplan.engine.declarations import quantity, reducer
from fitplan.inputs.optimizer import OptimizerContext

TORCH_KINDS = ("zero1", "fsdp_zero2", "fsdp_zero3")


def _ceil_div(a, b):
    return -(-int(a) // int(b))


def _tp(value, tensor_parallel):
    return _ceil_div(value, tensor_parallel)


tp_weights = reducer("weight_bytes", when=lambda tensor_parallel: tensor_parallel > 1, name="tensor_parallel", after=("qlora",))(_tp)
tp_master = reducer("master_weight_bytes", when=lambda tensor_parallel: tensor_parallel > 1, name="tensor_parallel")(_tp)
tp_grads = reducer("gradient_bytes", when=lambda tensor_parallel: tensor_parallel > 1, name="tensor_parallel")(_tp)
tp_states = reducer("optimizer_state_bytes", when=lambda tensor_parallel: tensor_parallel > 1, name="tensor_parallel")(_tp)


def _shard(value, shard_degree):
    return _ceil_div(value, shard_degree)


def _chunk(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    """Rank 0's piece of a tensor under ``torch.chunk(n, dim=0)``: ``ceil(d0/n)`` rows."""
    if not shape:
        return shape
    return (min(shape[0], _ceil_div(shape[0], n)), *shape[1:])


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


@quantity("tensors", type="object")
def rank_trainable_tensors(trainable_tensors, sharding_kind, shard_degree):
    """The trainable tensors rank 0's optimizer holds: ZeRO-1 (``_partition_parameters``): tensors sorted by
    size, largest first, each to the rank with the fewest elements so far (ties: the lowest rank); FSDP:
    rank 0's ``ceil(d0/N)``-row chunk of every tensor; otherwise all of them."""
    n = shard_degree
    if sharding_kind == "zero1":
        flat = [shape for shape, count in trainable_tensors for _ in range(count)]
        order = sorted(range(len(flat)), key=lambda i: -_numel(flat[i]))
        sizes = [0] * n
        mine: list[int] = []
        for i in order:
            r = sizes.index(min(sizes))
            sizes[r] += _numel(flat[i])
            if r == 0:
                mine.append(i)
        out: list[list] = []
        for i in sorted(mine):
            if out and out[-1][0] == flat[i]:
                out[-1][1] += 1
            else:
                out.append([flat[i], 1])
        return tuple((shape, count) for shape, count in out)
    if sharding_kind.startswith("fsdp"):
        return tuple((_chunk(shape, n), count) for shape, count in trainable_tensors)
    return trainable_tensors


@quantity("context", type="object")
def rank_optimizer_context(rank_trainable_tensors, optimizer_state_dtype_bytes, trainable_dtype_bytes, device):
    """What rank 0's optimizer sees (its partition or shard of the trainable tensors)."""
    return OptimizerContext(rank_trainable_tensors, optimizer_state_dtype_bytes, trainable_dtype_bytes, device)


def _sharded(kind_min: int):
    return lambda sharding_kind, shard_stage, shard_degree: (sharding_kind in TORCH_KINDS and shard_stage >= kind_min
                                                            and shard_degree > 1)


@reducer("optimizer_state_bytes", when=_sharded(1), name="zero", after=("tensor_parallel",))
def zero_states(value, optimizer_spec, rank_optimizer_context, tensor_parallel, shard_degree):
    """Stage ≥ 1: rank 0's optimizer states, as its optimizer creates them for its partition (ZeRO-1) or its
    shards (FSDP: per-tensor scalars such as AdamW's ``step`` stay one per tensor)."""
    if tensor_parallel > 1:
        return _ceil_div(value, shard_degree)
    return int(optimizer_spec.state_bytes(rank_optimizer_context))


@reducer("optimizer_step_temp_bytes", when=_sharded(1), name="zero", after=("tensor_parallel",))
def zero_step_temp(value, optimizer_spec, rank_optimizer_context, tensor_parallel, shard_degree):
    """From stage 1 each rank's optimizer steps only its partition or shards: its step temporaries are those
    of its tensors."""
    if tensor_parallel > 1:
        return _ceil_div(value, shard_degree)
    return int(optimizer_spec.step_temp_bytes(rank_optimizer_context))


zero_master = reducer("master_weight_bytes", when=_sharded(1), name="zero", after=("tensor_parallel",))(_shard)
tp_step_temp = reducer("optimizer_step_temp_bytes", when=lambda tensor_parallel: tensor_parallel > 1,
                       name="tensor_parallel")(_tp)


@reducer("gradient_bytes", when=_sharded(2), name="zero", after=("tensor_parallel",))
def zero_grads(value, rank_trainable_tensors, trainable_dtype_bytes, tensor_parallel, shard_degree):
    """Stage ≥ 2 (FSDP2): rank 0's gradient shards, ``ceil(d0/N)`` rows of each trainable tensor."""
    if tensor_parallel > 1:
        return _ceil_div(value, shard_degree)
    return int(sum(_numel(shape) * count for shape, count in rank_trainable_tensors) * trainable_dtype_bytes)


def _param_shapes(arch, method, trainable_tensors, weight_dtype_bytes, trainable_dtype_bytes):
    """(shape, count, bytes per element, in a decoder layer) for every parameter tensor (LoRA: base + adapters)."""
    out = [(g.shape, g.count, weight_dtype_bytes, g.layer) for g in arch.param_groups()]
    if method != "full":
        out += [(shape, count, trainable_dtype_bytes, True) for shape, count in trainable_tensors]
    return out


@reducer("weight_bytes", when=_sharded(2), name="zero", after=("tensor_parallel", "qlora"))
def zero_weights(value, arch, method, trainable_tensors, weight_dtype_bytes, trainable_dtype_bytes, shard_degree,
                 tensor_parallel):
    """Stage ≥ 2 (FSDP2): at rest each rank keeps its ``ceil(d0/N)``-row chunk of every parameter (the padded
    shard: rank 0's is the largest). Gathered parameters are counted in the peak (``gathered_param_bytes``)."""
    if tensor_parallel > 1 or method == "qlora" or arch.is_bare:
        return _ceil_div(value, shard_degree)
    return int(sum(_numel(_chunk(shape, shard_degree)) * count * nbytes
                   for shape, count, nbytes, _ in _param_shapes(arch, method, trainable_tensors, weight_dtype_bytes,
                                                                trainable_dtype_bytes)))


def torch_gathered(sharding_kind, arch, method, trainable_tensors, weight_dtype_bytes, trainable_dtype_bytes,
                   shard_degree, tensor_parallel, copy_out: bool = True):
    """FSDP2 parameters gathered (rank 0), with the root module's (embeddings, final norm, LM head) always
    among them from the first forward op to the end of the backward:

    * ``forward``: when the forward ends: stage 3 the flat all-gather output of the last layer (N × its
      padded shards: FSDP2 frees it only when the next all-gather is copied out); stage 2 also every layer;
    * ``forward_spike``: while the last layer is gathered: its parameters, its flat output and the
      previous layer's flat output (stage 2: the earlier layers too);
    * ``backward``: the layer being differentiated (stage 2: all layers);
    * ``backward_in_layer`` (stage 3): while a layer is differentiated, FSDP2 has already prefetched the
      next one (its parameters and its flat all-gather output, alive until the next copy-out), and the
      layer's own gradients stay unsharded until its ``post_backward`` reduce-scatters them; the LM
      head's gradient (the root's) stays unsharded until the backward ends. Added to the single-GPU
      timeline, whose gradients are counted sharded.

    ``copy_out=False`` (FSDP1) drops the flat all-gather output: FSDP1 gathers straight into the padded buffer."""
    if not sharding_kind.startswith("fsdp"):
        return {"forward": 0, "forward_spike": 0, "backward": 0, "backward_in_layer": 0}
    n = shard_degree
    if arch.is_bare:
        layer = arch.param_count * weight_dtype_bytes / 32
        return {"forward": int(2 * layer), "forward_spike": int(3 * layer), "backward": int(2 * layer),
                "backward_in_layer": int(4 * layer)}
    root = layer = flat = 0
    L = arch.num_hidden_layers
    for shape, count, nbytes, in_layer in _param_shapes(arch, method, trainable_tensors, weight_dtype_bytes,
                                                        trainable_dtype_bytes):
        full = _numel(shape) * count * nbytes
        if in_layer:
            layer += full / L
            flat += n * _numel(_chunk(shape, n)) * count * nbytes / L if copy_out else 0
        else:
            root += full
    zero2 = sharding_kind == "fsdp_zero2"
    before = layer * (L - 1) if zero2 else 0  # layers gathered before the last one (stage 2 keeps them)
    layer_grads = head_grads = 0.0
    if method == "full":
        for g in arch.param_groups():
            if g.layer:
                layer_grads += g.total * trainable_dtype_bytes / L
            elif g.module in ("lm_head", "norm"):
                head_grads += g.total * trainable_dtype_bytes
    else:
        layer_grads = sum(math.prod(shape) * count for shape, count in trainable_tensors) * trainable_dtype_bytes / L
    unsharded = (1 - 1 / n) * (layer_grads + head_grads)
    in_layer = (root + 2 * layer + flat + unsharded) if not zero2 and L > 1 else 0
    return {"forward": _ceil_div(root + before + (layer if zero2 else 0) + flat, tensor_parallel),
            "forward_spike": _ceil_div(root + before + layer + 2 * flat, tensor_parallel),
            "backward": _ceil_div(root + layer * (L if zero2 else 1), tensor_parallel),
            "backward_in_layer": _ceil_div(in_layer, tensor_parallel)}


QUANTITIES = (rank_trainable_tensors, rank_optimizer_context)
REDUCERS = (tp_weights, tp_master, tp_grads, tp_states, tp_step_temp, zero_states, zero_master, zero_grads, zero_step_temp,
            zero_weights)
