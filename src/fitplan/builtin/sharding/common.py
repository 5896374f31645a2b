"""What every stack shares: which stack runs, its name in the outputs, the sharding degree and kind."""

from __future__ import annotations

from fitplan.engine.declarations import quantity
from fitplan.inputs import stacks

FSDP_STAGE = {"full_shard": 3, "shard_grad_op": 2, "hybrid_shard": 3}


@quantity("stack", json_key="parallel.stack", type="text")
def stack_name(stack, zero_stage, fsdp, offload_optimizer, offload_params, precision, world_size, tensor_parallel):
    """The implementation that shards: ``deepspeed``, ``fsdp2``, ``fsdp1``, ``ddp``, ``torch`` (PyTorch-native ZeRO)
    or ``none`` (one GPU). ``--zero``, offload and ``*-master`` mean DeepSpeed, ``--fsdp`` the HF Trainer's FSDP2
    (``inputs/stacks.py``); a combination the stack cannot run is an error naming the flag."""
    dp = max(1, world_size // tensor_parallel)
    return stacks.check(stack, zero_stage, fsdp, offload_optimizer, offload_params, precision, dp)


@quantity("stack", json_key="parallel.stack_description", label="stack", type="text")
def stack_description(stack_name, shard_stage, fsdp, offload_optimizer, offload_params, fsdp_sharding_strategy):
    """The stack in words, as every output names it (``DeepSpeed ZeRO-2 + optimizer offload``); the stage is the
    ZeRO-equivalent one (``--stack torch --fsdp full_shard`` is PyTorch-native FSDP2, stage 3)."""
    return stacks.describe(stack_name, shard_stage, fsdp, offload_optimizer, offload_params, fsdp_sharding_strategy)


@quantity("mode", type="text")
def effective_fsdp(stack_name, fsdp, fsdp_sharding_strategy):
    """The FSDP strategy that runs: FSDP1 runs ``FSDP_SHARDING_STRATEGY`` (``fsdp_sharding_strategy``), FULL_SHARD
    when it is unset, whatever the Trainer's ``fsdp`` says (accelerate/utils/dataclasses.py:1719-1728,
    accelerator.py:1919)."""
    return stacks.effective_fsdp_mode(stack_name, fsdp, fsdp_sharding_strategy)


@quantity("stage")
def shard_stage(stack_name, zero_stage, effective_fsdp):
    """The ZeRO-equivalent stage: ``--zero`` (DeepSpeed, PyTorch-native) or the FSDP strategy's equivalent
    (full_shard 3, shard_grad_op 2, hybrid_shard 3)."""
    return max(zero_stage, FSDP_STAGE.get(effective_fsdp or "", 0))


@quantity("GPUs")
def data_parallel_degree(world_size, tensor_parallel):
    """Data-parallel replicas: world size / tensor-parallel degree."""
    return max(1, world_size // tensor_parallel)


@quantity("GPUs")
def shard_degree(data_parallel_degree, effective_fsdp, num_gpus, tensor_parallel):
    """How many ways model states are sharded: the data-parallel degree (hybrid_shard: the GPUs of one node)."""
    if effective_fsdp == "hybrid_shard":
        return max(1, num_gpus // tensor_parallel)
    return data_parallel_degree


@quantity("kind", type="text")
def sharding_kind(stack_name, shard_stage, shard_degree, data_parallel_degree, zero_stage):
    """How model states are split across ranks: ``none``; ``ddp`` (replicas); PyTorch-native ``zero1``
    (ZeroRedundancyOptimizer), ``fsdp_zero2`` / ``fsdp_zero3`` (bare FSDP2); DeepSpeed ``ds0``-``ds3``;
    accelerate ``hf_fsdp2`` / ``hf_fsdp1``."""
    if stack_name == "deepspeed":
        return f"ds{zero_stage}"
    if data_parallel_degree <= 1 and shard_degree <= 1:
        return "none"
    if stack_name in ("fsdp1", "fsdp2"):
        return "hf_" + stack_name if shard_degree > 1 else "ddp"
    if shard_stage == 0 or shard_degree <= 1:
        return "ddp"
    return {1: "zero1", 2: "fsdp_zero2"}.get(shard_stage, "fsdp_zero3")


QUANTITIES = (stack_name, stack_description, effective_fsdp, shard_stage, data_parallel_degree, shard_degree, sharding_kind)
