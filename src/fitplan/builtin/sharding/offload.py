"""CPU offload: what leaves the GPU, and the CPU memory it takes (per rank and per node).

DeepSpeed's layout (``deepspeed.py``) already puts offloaded tensors on the host; FSDP's ``CPUOffload``
moves the shards, their gradients and the optimizer step to the CPU (reducers here). ``offload_host_bytes``
is rank 0's host memory by category; ``cpu_offload_bytes`` multiplies it by the GPUs of one node.
DeepSpeed's offload buffers are pinned (``pin_memory`` defaults to true: zero/offload_config.py:45, 75): the
kernel cannot page them out.
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity, reducer
from fitplan.inputs.settings import Search, Setting
from fitplan.inputs.stacks import ds_cpu_optimizer



def _searched_with(option):
    """The shard options the recommender tries with or without parameter offload: DeepSpeed offloads parameters
    at ZeRO-3 only (``inputs/stacks.py`` refuses it below); on one GPU ZeRO-3 is tried only with it (ZeRO-3 shards
    nothing over one rank: only its parameter offload can lower the peak)."""
    if option["offload_params"]:
        return option["zero_stage"] == 3
    return not (option["data_parallel"] == 1 and option["zero_stage"] == 3)


OFFLOAD_PARAMS = Setting(
    "offload_params", "parallel", type="bool", default=False, after="offload_optimizer",
    help="Parameters offloaded to the CPU: DeepSpeed ZeRO-3 offload_param (device cpu), or FSDP's "
         "CPUOffload(offload_params=True) together with --offload-optimizer.",
    search=Search(values=(False, True), level="shard", weight=2, allowed=_searched_with, stack="deepspeed"),
    plan_label="offload params")
"""The one declaration of ``offload_params`` (a field of ``[parallel]``): the scenario field, its flag and help,
the recommender's shard-level dimension (a plan offloading parameters is less simple than one offloading the
optimizer: weight 2) and the word a plan's offload list shows. Where it applies: ``inputs/stacks.py``."""


def _fsdp_offload(sharding_kind, offload_params):
    return sharding_kind.startswith("hf_fsdp") and offload_params


def _zero(value):
    return 0


fsdp_off_weights = reducer("weight_bytes", when=_fsdp_offload, name="offload", after=("fsdp",))(_zero)
fsdp_off_grads = reducer("gradient_bytes", when=_fsdp_offload, name="offload", after=("fsdp",))(_zero)
fsdp_off_states = reducer("optimizer_state_bytes", when=_fsdp_offload, name="offload", after=("fsdp",))(_zero)
fsdp_off_temp = reducer("optimizer_step_temp_bytes", when=_fsdp_offload, name="offload", after=("fsdp",))(_zero)
"""FSDP ``CPUOffload(offload_params=True)``: shards, gradients and the optimizer step on the CPU."""


@quantity("bytes", type="object")
def offload_host_bytes(sharding_kind, offload_optimizer, offload_params, deepspeed_rank, fsdp_rank, optimizer_spec):
    """Rank 0's CPU memory for offload, by category (``weights``, ``master_weights``, ``gradients``,
    ``optimizer_states``, ``buffers``, ``step_temp``): DeepSpeed's fp32 partition, its states, the persistent
    fp32 gradient partition and staging buffers (stage 3 with ``offload_param``: the 16-bit partitions); FSDP's
    shards, gradients and states. Under DeepSpeed optimizer offload the optimizer is the DeepSpeed CPU optimizer
    accelerate swaps in for the scenario's (``inputs.stacks.ds_cpu_optimizer``: DeepSpeedCPUAdam's two fp32
    moments per element of the fp32 partition whatever ``optim`` says, its ``step`` a Python int, no step
    temporaries); under FSDP offload, the scenario's optimizer."""
    out = {"weights": 0, "master_weights": 0, "gradients": 0, "optimizer_states": 0, "buffers": 0, "step_temp": 0}
    if deepspeed_rank is not None and (offload_optimizer or offload_params):
        for k, v in deepspeed_rank.host.items():
            out[k] = int(v)
        if offload_optimizer:  # the DeepSpeed CPU optimizer accelerate swaps in: fp32 states, no step temporaries
            _, states = ds_cpu_optimizer(optimizer_spec.name)
            out["optimizer_states"] = int(deepspeed_rank.states_ctx.numel * 4 * states)
    elif fsdp_rank is not None and offload_params:
        out.update(weights=fsdp_rank["weights"], gradients=fsdp_rank["gradients"],
                   optimizer_states=int(optimizer_spec.state_bytes(fsdp_rank["ctx"])),
                   step_temp=int(optimizer_spec.step_temp_bytes(fsdp_rank["ctx"])))
    return out


@quantity("bytes", json_key="memory.cpu_offload_bytes", label="CPU RAM for offload (per node)", role="cpu_offload")
def cpu_offload_bytes(offload_host_bytes, num_gpus):
    """CPU RAM per node for offload: GPUs per node × each rank's host bytes (states, master weights, fp32
    gradients, staging buffers; the optimizer's step temporaries at their peak)."""
    return int(sum(offload_host_bytes.values()) * num_gpus)


QUANTITIES = (offload_host_bytes, cpu_offload_bytes)
REDUCERS = (fsdp_off_weights, fsdp_off_grads, fsdp_off_states, fsdp_off_temp)
SETTINGS = (OFFLOAD_PARAMS,)
