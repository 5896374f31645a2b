"""Model states: weights, master weights, gradients and optimizer states (bytes per GPU before sharding).

Sharding (ZeRO/FSDP), offload and QLoRA are reducers on these terms, declared in their own plugins.
"""

from __future__ import annotations

import functools
import math

from fitplan.engine.declarations import quantity
from fitplan.inputs.optimizer import OptimizerContext
from fitplan.pluginmgr.hookspecs import hookimpl


@quantity("tensors", type="object")
def trainable_tensors(arch):
    """The trainable parameter tensors as ``(shape, count)`` pairs: every parameter for full
    fine-tuning but those created with ``requires_grad=False`` (``ParamGroup.frozen``) and those the step leaves
    without a gradient (``ParamGroup.no_grad``: torch's optimizers give them no state); the LoRA reducer replaces
    them with the adapters."""
    return tuple((g.shape, g.count) for g in arch.param_groups() if g.trained)


@quantity("params")
def trainable_param_count(trainable_tensors):
    """Σ numel over the trainable tensors."""
    total = 0
    for shape, count in trainable_tensors:
        n = count
        for d in shape:
            n *= d
        total += n
    return total


@quantity("params")
def adapter_param_count(method, trainable_param_count, idle_adapter_param_count):
    """Parameters added by LoRA adapters (0 for full fine-tuning): the trainable ones and those on Linears the
    step never runs (``idle_adapter_param_count``, builtin/lora.py: weights without a gradient)."""
    return 0 if method == "full" else trainable_param_count + idle_adapter_param_count


@quantity("bytes/param")
def trainable_dtype_bytes(method, weight_dtype_bytes, assumptions, autocast_adapter_dtype, kbit_preparation):
    """Bytes per trainable parameter. Full fine-tuning: the weight dtype. LoRA: 4, because peft
    keeps adapters in fp32 (``autocast_adapter_dtype=True``, peft >= 0.12) whatever the base dtype; the
    weight dtype with ``autocast_adapter_dtype = false`` (torchtune's LoRA modules); QLoRA through TRL's
    SFTTrainer: 2 (it casts the adapters of a 4-bit model to bf16)."""
    if method == "full" or assumptions == "seed" or not autocast_adapter_dtype:
        return weight_dtype_bytes
    if method == "qlora" and kbit_preparation == "trl":
        return 2
    return 4


@quantity("params")
def fp32_param_count(arch, assumptions):
    """Parameters the model keeps in fp32 whatever dtype it is built in (``ParamGroup.fp32``: the learned
    file's ``f32`` tensors, e.g. a router weight created with ``dtype=torch.float32``); 0 under seed assumptions."""
    return 0 if assumptions == "seed" or arch.count_only else arch.fp32_param_count


def fp32_extra(count: int, dtype_bytes: float) -> float:
    """Bytes that ``count`` fp32-kept elements add over ``dtype_bytes`` per element (none in a 32-bit model)."""
    return count * max(0, 4 - dtype_bytes)


@quantity("bytes", category="memory", label="weights", json_key="memory.per_gpu_bytes.weights", short="weights", row="weights")
def weight_bytes(param_count, weight_dtype_bytes, adapter_param_count, trainable_dtype_bytes, fp32_param_count):
    """Weights: param_count × bytes per weight (4 for the tensors the model keeps in fp32), plus LoRA adapters in
    their own dtype. Seed: "parameters × precision" (7B × 4 = 28 GB)."""
    return (param_count * weight_dtype_bytes + fp32_extra(fp32_param_count, weight_dtype_bytes)
            + adapter_param_count * trainable_dtype_bytes)


@quantity("bytes", category="memory", label="master weights (fp32)", short_label="master weights", json_key="memory.per_gpu_bytes.master_weights", short="master_weights", row="master_weights")
def master_weight_bytes(trainable_param_count, master_weight_dtype_bytes):
    """fp32 master copy of the trainable weights kept by DeepSpeed/Megatron mixed precision
    (``*-master`` presets): 4 B per trainable parameter. Absent in torch AMP and pure 16-bit training."""
    return trainable_param_count * master_weight_dtype_bytes


@quantity("bytes", category="memory", label="gradients", json_key="memory.per_gpu_bytes.gradients", short="gradients", row="gradients")
def gradient_bytes(trainable_param_count, trainable_dtype_bytes, optimizer_spec, trainable_tensors, method,
                   fp32_param_count, optimizer_in_bwd, arch):
    """Gradients: one per trainable parameter, in the parameter's dtype (fp32 for the fp32-kept tensors full
    fine-tuning trains; frozen weights have none).
    Seed: "même taille que les poids". Optimizers that consume each gradient as backward produces it (LOMO,
    the ``*_layerwise`` variants: ``OptimizerSpec.frees_gradients``) never hold more than about one: the
    largest trainable tensor's gradient. torchtune's ``optimizer_in_bwd`` frees each gradient in the hook that
    steps its parameter: none is held past the backward (``builtin/peak.py`` counts the ones in flight)."""
    if optimizer_in_bwd:
        return 0
    if optimizer_spec.frees_gradients:
        return max((math.prod(shape) for shape, _ in trainable_tensors), default=0) * trainable_dtype_bytes
    fp32 = max(0, fp32_param_count - arch.frozen_fp32_param_count)  # an untrained fp32 tensor has no gradient
    return trainable_param_count * trainable_dtype_bytes + (fp32_extra(fp32, trainable_dtype_bytes) if method == "full" else 0)


def _kind(g) -> str:
    if g.module in ("embed_tokens", "embed_positions"):
        return "embedding"
    if len(g.shape) == 2 and g.name.endswith(".weight") and g.module not in ("router", "norm"):
        return "other" if g.module in CONV1D_MODULES else "linear"
    return "other"


@functools.lru_cache(maxsize=256)
def _modules(arch) -> tuple[tuple[str, str], ...]:
    """``(name, kind)`` of each parameter tensor of ``arch``."""
    return tuple((g.name, _kind(g)) for g in arch.param_groups() if g.trained)


CONV1D_MODULES = ("c_attn", "c_proj", "c_fc")
"""GPT-2's projections are ``transformers.pytorch_utils.Conv1D``, not ``nn.Linear`` (GaLore never targets them)."""


@quantity("context", type="object")
def optimizer_context(trainable_tensors, optimizer_state_dtype_bytes, trainable_dtype_bytes, device, arch, method,
                      optim_args, optim_target_modules):
    """What an optimizer's byte functions see: the trainable tensors (in ``model.parameters()`` order) with
    their names and kinds (embedding, linear, adapter, other), the state and parameter dtypes, the device, the
    HF ``optim_args`` and ``optim_target_modules``."""
    if method == "full" and not arch.is_bare:
        modules = _modules(arch)
    else:
        modules = tuple(("lora", "adapter") for _ in trainable_tensors) if method != "full" else ()
    pairs = tuple(tuple(kv.strip().split("=", 1)) for kv in optim_args.split(",") if "=" in kv)
    fp32 = tuple(g.fp32 for g in arch.param_groups() if g.trained) if method == "full" and not arch.count_only else ()
    return OptimizerContext(trainable_tensors, optimizer_state_dtype_bytes, trainable_dtype_bytes, device, modules,
                            pairs, tuple(optim_target_modules), fp32)


@quantity("bytes", category="memory", label="optimizer states", json_key="memory.per_gpu_bytes.optimizer_states", short="optimizer_states", row="optimizer_states")
def optimizer_state_bytes(optimizer_spec, optimizer_context):
    """Optimizer states as the chosen optimizer stores them (see ``fitplan plugins`` for each optimizer's rule),
    fp32 for the tensors the model keeps in fp32 (``OptimizerContext.dtype_parts``)."""
    return sum(int(optimizer_spec.state_bytes(part)) for part in optimizer_context.dtype_parts())


@quantity("bytes", json_key="memory.optimizer_host_bytes")
def optimizer_host_bytes(optimizer_spec, optimizer_context):
    """Optimizer state kept in host RAM between steps (GrokAdamW's three states), per process: not GPU memory."""
    return int(optimizer_spec.host_state_bytes(optimizer_context))


@quantity("bytes")
def optimizer_step_temp_bytes(optimizer_spec, optimizer_context):
    """The most ``optimizer.step()`` allocates beyond the states (each optimizer's rule: foreach AdamW one
    state-sized list, single-tensor AdamW two copies of one tensor, fused none, Adafactor a few per
    tensor). Sharding and offload are reducers on it."""
    return int(optimizer_spec.step_temp_bytes(optimizer_context))


@hookimpl
def fitplan_register_quantities(register):
    for q in (fp32_param_count, trainable_tensors, trainable_param_count, adapter_param_count, trainable_dtype_bytes, weight_bytes,
              master_weight_bytes, gradient_bytes, optimizer_context, optimizer_state_bytes, optimizer_host_bytes,
              optimizer_step_temp_bytes):
        register(q)
