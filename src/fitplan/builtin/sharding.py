"""Sharding reducers: tensor parallelism, ZeRO 1/2/3 and FSDP, CPU offload; communication buffers.

Per GPU, with N the data-parallel degree (Rajbhandari et al. 2019, "ZeRO"; PyTorch FSDP docs):

* stage 1 (``--zero 1``): optimizer states and fp32 master weights / N;
* stage 2 (``--zero 2``, FSDP ``shard_grad_op``): + gradients / N;
* stage 3 (``--zero 3``, FSDP ``full_shard``): + weights / N, plus the live all-gathered parameters
  (the layer being computed and the prefetched next one);
* FSDP ``hybrid_shard``: full sharding within a node (N = GPUs per node), replication across nodes.

Tensor parallelism (degree t) splits weights, gradients and states t ways before data-parallel sharding.
CPU offload (DeepSpeed ZeRO-Offload) moves optimizer states and master weights (and with
``--offload-params`` the weights of stage 3) to CPU RAM, reported as ``cpu_offload_bytes``.
"""

from __future__ import annotations

from ..declarations import quantity, reducer
from ..hookspecs import hookimpl

FSDP_STAGE = {"full_shard": 3, "shard_grad_op": 2, "hybrid_shard": 3}
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` / ``allgather_bucket_size`` (elements)."""
DDP_BUCKET_BYTES = 25 * 2**20


def _ceil_div(a, b):
    return -(-int(a) // int(b))


@quantity("stage")
def shard_stage(zero_stage, fsdp):
    """The effective ZeRO stage: ``--zero`` or the FSDP mode's equivalent (full_shard 3, shard_grad_op 2, hybrid_shard 3)."""
    return max(zero_stage, FSDP_STAGE.get(fsdp, 0))


@quantity("GPUs")
def data_parallel_degree(world_size, tensor_parallel):
    """Data-parallel replicas: world size / tensor-parallel degree."""
    return max(1, world_size // tensor_parallel)


@quantity("GPUs")
def shard_degree(data_parallel_degree, fsdp, num_gpus, tensor_parallel):
    """How many ways model states are sharded: the data-parallel degree (hybrid_shard: the GPUs of one node)."""
    if fsdp == "hybrid_shard":
        return max(1, num_gpus // tensor_parallel)
    return data_parallel_degree


def _tp(value, tensor_parallel):
    return _ceil_div(value, tensor_parallel)


tp_weights = reducer("weight_bytes", when=lambda tensor_parallel: tensor_parallel > 1, name="tensor_parallel", after=("qlora",))(_tp)
tp_master = reducer("master_weight_bytes", when=lambda tensor_parallel: tensor_parallel > 1, name="tensor_parallel")(_tp)
tp_grads = reducer("gradient_bytes", when=lambda tensor_parallel: tensor_parallel > 1, name="tensor_parallel")(_tp)
tp_states = reducer("optimizer_state_bytes", when=lambda tensor_parallel: tensor_parallel > 1, name="tensor_parallel")(_tp)


def _shard(value, shard_degree):
    return _ceil_div(value, shard_degree)


zero_states = reducer("optimizer_state_bytes", when=lambda shard_stage, shard_degree: shard_stage >= 1 and shard_degree > 1,
                      name="zero", after=("tensor_parallel",))(_shard)
zero_master = reducer("master_weight_bytes", when=lambda shard_stage, shard_degree: shard_stage >= 1 and shard_degree > 1,
                      name="zero", after=("tensor_parallel",))(_shard)
zero_grads = reducer("gradient_bytes", when=lambda shard_stage, shard_degree: shard_stage >= 2 and shard_degree > 1,
                     name="zero", after=("tensor_parallel",))(_shard)
tp_step_temp = reducer("optimizer_step_temp_bytes", when=lambda tensor_parallel: tensor_parallel > 1,
                       name="tensor_parallel")(_tp)
zero_step_temp = reducer("optimizer_step_temp_bytes",
                         when=lambda shard_stage, shard_degree: shard_stage >= 1 and shard_degree > 1,
                         name="zero", after=("tensor_parallel",))(_shard)
"""From stage 1 each rank's optimizer steps only its partition of the states, so its step temporaries
are those of the partition too."""


@quantity("bytes")
def live_param_bytes(arch, weight_dtype_bytes, tensor_parallel):
    """ZeRO-3 / FSDP all-gathered parameters alive at once: the unit being computed and the prefetched
    next one. The largest such pair is the embedding (or LM head) with a decoder layer, or two decoder
    layers: ``(max(layer, V·h) + layer) × weight bytes``. A bare ``--params`` model is taken as 32 layers."""
    if arch.family == "bare":
        return int(2 * arch.param_count / 32 * weight_dtype_bytes)
    layer = sum(g.total for g in arch.param_groups() if g.layer) // arch.num_hidden_layers
    embed = arch.vocab_size * arch.hidden_size
    return _ceil_div((max(layer, embed) + layer) * weight_dtype_bytes, tensor_parallel)


@reducer("weight_bytes", when=lambda shard_stage, shard_degree: shard_stage >= 3 and shard_degree > 1,
         name="zero", after=("tensor_parallel", "qlora"))
def zero_weights(value, shard_degree, live_param_bytes):
    """Stage 3: each GPU keeps 1/N of the weights plus the live all-gathered units."""
    return _ceil_div(value, shard_degree) + live_param_bytes


def _offloaded(value):
    return 0


offload_states = reducer("optimizer_state_bytes", when=lambda offload_optimizer: offload_optimizer,
                         name="offload", after=("zero",))(_offloaded)
offload_master = reducer("master_weight_bytes", when=lambda offload_optimizer: offload_optimizer,
                         name="offload", after=("zero",))(_offloaded)
offload_step_temp = reducer("optimizer_step_temp_bytes", when=lambda offload_optimizer: offload_optimizer,
                            name="offload", after=("zero",))(_offloaded)
"""With the optimizer offloaded, ``step()`` runs on the CPU: no step temporaries on the GPU."""


@reducer("weight_bytes", when=lambda offload_params, shard_stage: offload_params and shard_stage >= 3,
         name="offload", after=("zero",))
def offload_weights(value, live_param_bytes):
    """ZeRO-3 parameter offload: only the live all-gathered units stay on the GPU."""
    return live_param_bytes


@quantity("bytes")
def cpu_offload_bytes(offload_optimizer, offload_params, shard_stage, shard_degree, num_gpus, optimizer_spec,
                      optimizer_context, trainable_param_count, master_weight_dtype_bytes, param_count,
                      weight_dtype_bytes, tensor_parallel):
    """CPU RAM per node for offloaded states, master weights and (stage 3) parameters:
    GPUs per node × each GPU's shard (DeepSpeed ZeRO-Offload keeps fp32 states and master weights on the CPU)."""
    per_gpu = 0
    div = (shard_degree if shard_stage >= 1 else 1) * tensor_parallel
    if offload_optimizer:
        states = optimizer_spec.state_bytes(optimizer_context)
        per_gpu += (states + trainable_param_count * master_weight_dtype_bytes) / div
    if offload_params and shard_stage >= 3:
        per_gpu += param_count * weight_dtype_bytes / (shard_degree * tensor_parallel)
    return int(per_gpu * num_gpus)


@quantity("bytes", category="memory")
def comm_buffer_bytes(shard_stage, data_parallel_degree, gradient_bytes, grad_bytes_unsharded, trainable_dtype_bytes):
    """Communication buffers: DDP's gradient buckets (a flat copy of all gradients, since
    ``gradient_as_bucket_view`` is off by default) at stage 0; at stages 1–3 DeepSpeed's reduce
    bucket, ``min(reduce_bucket_size, gradients)`` elements in the gradient dtype."""
    if data_parallel_degree <= 1:
        return 0
    if shard_stage == 0:
        return gradient_bytes
    return int(min(DEEPSPEED_BUCKET_ELEMENTS * trainable_dtype_bytes, grad_bytes_unsharded))


@quantity("bytes")
def grad_bytes_unsharded(trainable_param_count, trainable_dtype_bytes):
    """All gradients of one replica, before sharding."""
    return trainable_param_count * trainable_dtype_bytes


@hookimpl
def fitplan_register_quantities(register):
    for q in (shard_stage, data_parallel_degree, shard_degree, live_param_bytes, cpu_offload_bytes, comm_buffer_bytes,
              grad_bytes_unsharded):
        register(q)


@hookimpl
def fitplan_register_reducers(register):
    for r in (tp_weights, tp_master, tp_grads, tp_states, tp_step_temp, zero_states, zero_master, zero_grads,
              zero_step_temp, zero_weights, offload_states, offload_master, offload_step_temp, offload_weights):
        register(r)
