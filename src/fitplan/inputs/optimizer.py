"""Optimizers as fitplan sees them: what ``--optim NAME`` resolves to, and what its byte functions see.

A third-party optimizer plugin declares an :class:`OptimizerSpec` through the
``fitplan_register_optimizers`` hook; the quantities of optimizer states and step temporaries call its
functions with an :class:`OptimizerContext` (the trainable tensors, the state and parameter dtypes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
from attrs import frozen


@frozen
class OptimizerContext:
    """What an optimizer's byte functions see.

    :ivar tensors: the trainable parameter tensors as ``(shape, count)`` pairs.
    :ivar state_bytes: bytes per element of a full-precision state (4 for fp32 states, 2 when states follow bf16 weights).
    :ivar param_bytes: bytes per element of the trainable parameters.
    :ivar device: ``cuda`` or ``cpu``: where the step runs (torch keeps some optimizer scalars, such as
        AdamW's ``step``, on the CPU when the parameters are on a GPU).
    """

    tensors: tuple[tuple[tuple[int, ...], int], ...]
    state_bytes: float
    param_bytes: float
    device: str = "cuda"
    modules: tuple[tuple[str, str], ...] = ()
    """``(name, kind)`` of each entry of ``tensors`` (same order), when known: ``name`` as in
    ``model.named_parameters()`` without the ``model.layers.N.`` prefix (``self_attn.q_proj.weight``), ``kind``
    one of ``embedding`` (an ``nn.Embedding`` weight), ``linear`` (an ``nn.Linear`` weight), ``adapter`` (a LoRA
    A/B weight), ``other`` (norms, biases, Conv1D and expert weights). Empty when the tensors are not the
    model's own (flattened ZeRO partitions): every per-tensor rule then sees plain tensors."""
    optim_args: tuple[tuple[str, str], ...] = ()
    """HF ``optim_args`` (``"rank=64,momentum=0.9"``) as ``(key, value)`` string pairs, as the Trainer parses them."""
    target_modules: tuple[str, ...] = ()
    """HF ``optim_target_modules`` (GaLore, APOLLO): module names, ``all-linear``, or one regular expression."""
    fp32: tuple[bool, ...] = ()
    """Per entry of ``tensors`` (same order), when known: the model keeps that tensor in fp32 whatever the weight
    dtype (a router weight created with ``dtype=torch.float32``). Empty: every tensor in ``param_bytes``."""

    def dtype_parts(self) -> tuple[OptimizerContext, ...]:
        """The context split by parameter dtype when states follow the weights in a 16-bit dtype
        (``state_bytes < 4``) and some tensors stay fp32: torch optimizers create each state with
        ``torch.zeros_like(p)`` (torch/optim/adamw.py, ``_init_group``), so an fp32 tensor's states are fp32.
        Per-tensor states add up over the parts. Otherwise the context alone."""
        if self.state_bytes >= 4 or len(self.fp32) != len(self.tensors) or not any(self.fp32):
            return (self,)
        mods = self.modules if len(self.modules) == len(self.tensors) else ()

        def part(keep: bool, state: float, param: float) -> OptimizerContext:
            idx = [i for i, f in enumerate(self.fp32) if f == keep]
            return attrs.evolve(self, tensors=tuple(self.tensors[i] for i in idx), state_bytes=state,
                                param_bytes=param, modules=tuple(mods[i] for i in idx) if mods else (),
                                fp32=tuple(keep for _ in idx))

        return (part(False, self.state_bytes, self.param_bytes), part(True, 4, 4))

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) * count for shape, count in self.tensors)

    @property
    def num_tensors(self) -> int:
        return sum(count for _, count in self.tensors)

    def entries(self) -> list[tuple[tuple[int, ...], int, str, str]]:
        """``(shape, count, name, kind)`` per entry (name ``""`` and kind ``other`` when unknown)."""
        mods = self.modules if len(self.modules) == len(self.tensors) else (("", "other"),) * len(self.tensors)
        return [(shape, count, name, kind) for (shape, count), (name, kind) in zip(self.tensors, mods)]

    def arg(self, key: str, default: Any, kind: type = float) -> Any:
        """``optim_args[key]`` converted with ``kind``, or ``default``."""
        for k, v in self.optim_args:
            if k == key:
                return kind(v)
        return default

    def is_target(self, name: str, kind: str) -> bool:
        """Whether the weight ``name`` is a GaLore / APOLLO target, as transformers 5.24 decides it
        (``trainer_optimizer._setup_low_rank_optimizer`` with ``trainer_utils.check_target_module_exists``): an
        ``nn.Linear`` whose module name contains one of the targets, matches the one regular expression given
        as a string, or any ``nn.Linear`` for ``all-linear``."""
        if kind != "linear" or not self.target_modules:
            return False
        module = name.removesuffix(".weight")
        full = module if module == "lm_head" else "model.layers.0." + module if "." in module else "model." + module
        targets = self.target_modules
        if len(targets) == 1 and targets[0].replace("_", "-") == "all-linear":
            return True
        if len(targets) == 1 and not targets[0].isidentifier():
            import re

            return re.fullmatch(targets[0], full) is not None
        return any(t in full for t in targets)


@frozen
class OptimizerSpec:
    """An optimizer as fitplan sees it.

    :ivar state_bytes: bytes of optimizer state for the trainable tensors (function of an :class:`OptimizerContext`).
    :ivar step_temp_bytes: extra bytes alive during ``optimizer.step()`` (foreach temporaries, ...).
    :ivar flops_per_param: optimizer FLOPs per trainable parameter per step.
    :ivar step_bytes: bytes one ``optimizer.step()`` reads and writes in device memory (the time model prices
        the step on memory bandwidth: an optimizer update does a few FLOPs per byte); None: one pass reading
        the gradients, parameters and states and writing the parameters and states (:meth:`update_bytes`).
    :ivar step_kernels: kernels one step launches (host time); None: one per trainable tensor.
    :ivar torch_class: dotted path of the torch implementation used by ``fitplan validate`` (or "").
    :ivar torch_kwargs: keyword arguments for it.
    """

    name: str
    state_bytes: Callable[[OptimizerContext], float]
    doc: str
    source: str = ""
    aliases: tuple[str, ...] = ()
    step_temp_bytes: Callable[[OptimizerContext], float] = lambda ctx: 0
    flops_per_param: float = 0.0
    states_per_param: float = 0.0
    """For display and the seed's simplified view: full-precision states per parameter."""
    step_bytes: Callable[[OptimizerContext], float] | None = None
    step_kernels: Callable[[OptimizerContext], float] | None = None
    torch_class: str = ""
    torch_kwargs: dict[str, Any] = attrs.Factory(dict)
    plugin: str = ""
    hf: bool = False
    """A value of transformers' ``OptimizerNames`` (``TrainingArguments.optim``): the HF Trainer builds it."""
    refused: str = ""
    """Why fitplan does not estimate this name (what is missing), for an HF name it knows but does not model:
    ``--optim NAME`` is then an error quoting it."""
    check: Callable[[OptimizerRun], str | None] | None = None
    """A refusal that depends on the run (a CUDA-only optimizer on ``device = cpu``, a layerwise one with
    gradient accumulation): the reason, or None when the run is fine."""
    host_state_bytes: Callable[[OptimizerContext], float] = lambda ctx: 0
    """Optimizer state kept in host (CPU) RAM between steps (GrokAdamW)."""
    frees_gradients: bool = False
    """Each gradient is consumed and freed as backward produces it (LOMO, the ``*_layerwise`` variants): a full
    set of gradients never exists."""
    measured_on_cpu: bool = False
    """The referee (fitplan-torch) runs it on the CPU and the tests compare its state bytes with this spec."""
    search: bool = True
    """Whether ``fitplan recommend`` tries it when no ``--optims`` list is given (the common ones: the built-in
    specs of the other HF names are estimated when named, not searched)."""

    def update_bytes(self, ctx: OptimizerContext) -> float:
        """Bytes one step moves: ``step_bytes``, or a single pass (gradients and parameters read, parameters
        written: ``3 × param bytes`` per element; every state read and written: ``2 × state bytes``)."""
        if self.step_bytes is not None:
            return float(self.step_bytes(ctx))
        return 3.0 * ctx.numel * ctx.param_bytes + 2.0 * self.state_bytes(ctx)

    def update_kernels(self, ctx: OptimizerContext) -> float:
        """Kernels one step launches: ``step_kernels``, or one per trainable tensor."""
        return float(self.step_kernels(ctx)) if self.step_kernels is not None else float(ctx.num_tensors)


@frozen
class OptimizerRun:
    """What a run-dependent refusal (:attr:`OptimizerSpec.check`) sees."""

    device: str
    world_size: int
    gradient_accumulation_steps: int
    grad_dtype: str
    """The trainable parameters' gradients' dtype: ``fp32``, ``bf16`` or ``fp16``."""
    compute_dtype: str
    method: str
    target_modules: tuple[str, ...] = ()
