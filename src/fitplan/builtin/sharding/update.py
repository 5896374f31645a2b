"""What each rank's optimizer updates in one optimizer step, by stack: the tensors it steps and in how many
``optimizer.step()`` calls (for the time model's update, ``builtin/time/step.py``).

Every stack that shards the optimizer updates only rank 0's own partition, and the memory model already
holds it (``deepspeed_rank.states_ctx``, ``fsdp_rank["ctx"]``, ``rank_optimizer_context``): the update is
timed on the same tensors, so memory and time agree on one layout (files of the pinned stack):

* **DeepSpeed ZeRO-1/2** (deepspeed/runtime/zero/stage_1_and_2.py): each optimizer group is flattened, padded
  to a multiple of 2·N elements and split into N equal partitions (``get_data_parallel_partitions``); each rank
  keeps an fp32 flat partition per group (``single_partition_of_fp32_groups``) and ``step()`` steps one group at
  a time (``_optimizer_step``, 2967-2970: ``param_groups`` narrowed to that group's single flat tensor): one
  fused multi-tensor launch sequence over one large flat tensor per group, not one per parameter.
* **DeepSpeed ZeRO-3** (zero/stage3.py): the same per sub-group of ``sub_group_size`` elements of the
  per-parameter ``ceil(n/N)`` partitions (``_optimizer_step``, 1235-1262: one flat fp32 tensor per call).
* **DeepSpeed ZeRO-0** (runtime/fp16/unfused_optimizer.py:197-240): no partition; one ``optimizer.step()``
  over fp32 copies of every parameter, tensor by tensor.
* **FSDP1** (torch/distributed/fsdp/_flat_param.py: one flat parameter per wrapped unit, padded to a multiple
  of N and chunked evenly): with the Trainer's ``use_orig_params=True`` the optimizer steps the original
  parameters' views into rank 0's chunk, per tensor (``fsdp_rank``).
* **FSDP2** (``fully_shard``: every parameter chunked on dim 0): the ``ceil(d0/N)``-row local shards, per
  tensor: the same rule as PyTorch-native ``fsdp_zero2``/``fsdp_zero3`` (``rank_trainable_tensors``).
* **PyTorch ZeRO-1** (``ZeroRedundancyOptimizer``): whole tensors assigned greedily (``rank_trainable_tensors``).
* **DDP, one GPU**: every trainable tensor.
"""

from __future__ import annotations

import attrs

from fitplan.engine.declarations import quantity
from fitplan.inputs.optimizer import OptimizerContext


@attrs.frozen
class RankUpdate:
    """Rank 0's optimizer update: ``calls`` (one context per ``optimizer.step()`` call on the GPU, or on the CPU
    under offload), ``split`` (tensor parallelism still to divide by: 1 where the stack's layout is already
    per tensor-parallel rank) and ``rule`` (which layout, in words)."""

    calls: tuple[OptimizerContext, ...]
    split: int
    rule: str

    @property
    def numel(self) -> int:
        return sum(c.numel for c in self.calls)


@quantity("update", type="object")
def rank_optimizer_update(sharding_kind, stack_name, rank_optimizer_context, deepspeed_rank, fsdp_rank, tensor_parallel,
                          arch):
    """The tensors rank 0's optimizer steps per optimizer step and in how many calls (module doc): DeepSpeed
    ZeRO-1/2/3 its flat fp32 partitions, one call per group (sub-group); ZeRO-0 every parameter in one call;
    accelerate FSDP1/FSDP2 rank 0's shards (``fsdp_rank``); PyTorch-native stacks ``rank_optimizer_context``."""
    t = tensor_parallel
    if deepspeed_rank is not None:
        r = deepspeed_rank
        if r.stage == 0:  # shapes of whole parameters: not yet split by tensor parallelism
            return RankUpdate((r.states_ctx,), t, "DeepSpeed ZeRO-0: every parameter's fp32 copy, one step call")
        return RankUpdate(tuple(r.group_ctxs), 1, f"DeepSpeed ZeRO-{r.stage}: rank 0's flat fp32 partition, "
                                                  f"one step call per {'sub-group' if r.stage == 3 else 'group'}")
    if fsdp_rank is not None:
        # FSDP2's chunks keep whole-parameter shapes (tensor parallelism not applied); FSDP1 and bare counts
        # are built from element counts already divided by it
        split = t if stack_name == "fsdp2" and not arch.is_bare else 1
        return RankUpdate((fsdp_rank["ctx"],), split, f"accelerate {stack_name.upper()}: rank 0's shards")
    rule = {"zero1": "PyTorch ZeRO-1: rank 0's whole tensors", "fsdp_zero2": "FSDP2: rank 0's dim-0 chunks",
            "fsdp_zero3": "FSDP2: rank 0's dim-0 chunks"}.get(sharding_kind, "every trainable tensor")
    return RankUpdate((rank_optimizer_context,), t, rule)


QUANTITIES = (rank_optimizer_update,)
