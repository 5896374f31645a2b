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

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) * count for shape, count in self.tensors)

    @property
    def num_tensors(self) -> int:
        return sum(count for _, count in self.tensors)


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

    def update_bytes(self, ctx: OptimizerContext) -> float:
        """Bytes one step moves: ``step_bytes``, or a single pass (gradients and parameters read, parameters
        written: ``3 × param bytes`` per element; every state read and written: ``2 × state bytes``)."""
        if self.step_bytes is not None:
            return float(self.step_bytes(ctx))
        return 3.0 * ctx.numel * ctx.param_bytes + 2.0 * self.state_bytes(ctx)

    def update_kernels(self, ctx: OptimizerContext) -> float:
        """Kernels one step launches: ``step_kernels``, or one per trainable tensor."""
        return float(self.step_kernels(ctx)) if self.step_kernels is not None else float(ctx.num_tensors)
