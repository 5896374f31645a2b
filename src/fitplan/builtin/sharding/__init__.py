"""Sharding, by stack: who splits the model states across data-parallel ranks, and how (rank 0's bytes).

The stack (``inputs/stacks.py``) decides which rules apply: DeepSpeed ZeRO 0-3 (``deepspeed.py``),
accelerate's FSDP1 / FSDP2 as the HF Trainer runs them (``fsdp.py``), DDP and PyTorch-native ZeRO-1 / FSDP2
(``torch_native.py``, also tensor parallelism). Each is a set of reducers on the model-state quantities plus
``gathered_param_bytes``: what the stack adds to the step timeline of ``builtin/peak.py``. CPU offload is in
``offload.py``; communication buffers, the bytes each collective moves and the topology in ``comm.py``; what
each rank's optimizer updates per step (for the time model) in ``update.py``.
"""

from __future__ import annotations

from fitplan.builtin.sharding import comm, common, deepspeed, fsdp, offload, torch_native, update
from fitplan.engine.declarations import quantity
from fitplan.pluginmgr.hookspecs import hookimpl

GATHER_KEYS = ("forward", "forward_spike", "backward", "backward_in_layer")


@quantity("bytes", type="object")
def gathered_param_bytes(sharding_kind, stack_name, effective_fsdp, arch, method, trainable_tensors,
                         weight_dtype_bytes, trainable_dtype_bytes, shard_degree, tensor_parallel, deepspeed_rank,
                         fsdp_rank, optimizer_spec, offload_optimizer):
    """What the stack adds to the step timeline (keys read by ``builtin/peak.py``): gathered parameters
    (``forward``, ``forward_spike``, ``backward``, ``backward_in_layer``: PyTorch-native and accelerate FSDP,
    DeepSpeed ZeRO-3) and, for DeepSpeed, how gradients are held in the backward (``grad_mode``,
    ``grad_first``, ``grad_resident``, ``reduce_end``), the optimizer step's bytes (``step``) and the GPU
    buffers that live all step (``device_buffers``)."""
    if deepspeed_rank is not None:
        return deepspeed.ds_terms(deepspeed_rank, optimizer_spec, weight_dtype_bytes, trainable_dtype_bytes,
                                  offload_optimizer)
    if fsdp_rank is not None:
        return fsdp.fsdp_terms(sharding_kind, stack_name, effective_fsdp, arch, method, trainable_tensors, fsdp_rank,
                               shard_degree, tensor_parallel)
    return torch_native.torch_gathered(sharding_kind, arch, method, trainable_tensors, weight_dtype_bytes,
                                       trainable_dtype_bytes, shard_degree, tensor_parallel)


@quantity("bytes")
def live_param_bytes(gathered_param_bytes):
    """Gathered (unsharded) parameters alive during the step, the most of its phases (FSDP, ZeRO-3)."""
    return max(int(gathered_param_bytes.get(k, 0)) for k in GATHER_KEYS)


@hookimpl
def fitplan_register_quantities(register):
    for q in (*common.QUANTITIES, *torch_native.QUANTITIES, *deepspeed.QUANTITIES, *fsdp.QUANTITIES,
              *offload.QUANTITIES, *comm.QUANTITIES, *update.QUANTITIES, gathered_param_bytes, live_param_bytes):
        register(q)


@hookimpl
def fitplan_register_reducers(register):
    for r in (*torch_native.REDUCERS, *deepspeed.REDUCERS, *fsdp.REDUCERS, *offload.REDUCERS):
        register(r)


@hookimpl
def fitplan_register_settings(register):
    for s in offload.SETTINGS:
        register(s)
