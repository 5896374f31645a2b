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
    torch_class: str = ""
    torch_kwargs: dict[str, Any] = attrs.Factory(dict)
    plugin: str = ""
