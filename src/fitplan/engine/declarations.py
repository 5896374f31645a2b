"""What plugins declare: quantities, reducers and optimizers.

A :class:`Quantity` is a pure function whose name is the quantity, whose parameter names are
its dependencies (other quantities, or scenario inputs such as ``per_device_train_batch_size``,
``arch``, ``gpu_spec``), and whose docstring documents the formula and its source.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import attrs
from attrs import field, frozen


def _params(func: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(func).parameters)


@frozen
class Quantity:
    """A named number: ``func``'s parameter names are its dependencies."""

    name: str
    func: Callable[..., Any]
    unit: str
    doc: str = ""
    category: str = ""
    """``memory`` quantities are per-GPU byte counts shown in the breakdown."""
    plugin: str = ""
    deps: tuple[str, ...] = field(default=attrs.Factory(lambda self: _params(self.func), takes_self=True))


@frozen
class Reducer:
    """Transforms ``target`` when ``condition`` holds.

    ``transform(value, *deps)``: the first parameter receives the value so far in the chain;
    the others are dependencies by name. ``condition(*deps)`` decides, per evaluation, whether
    the reducer applies; when it does not, the value passes through unchanged.
    """

    name: str
    target: str
    transform: Callable[..., Any]
    condition: Callable[..., bool]
    doc: str = ""
    after: tuple[str, ...] = ()
    before: tuple[str, ...] = ()
    plugin: str = ""

    @property
    def transform_deps(self) -> tuple[str, ...]:
        return _params(self.transform)[1:]

    @property
    def condition_deps(self) -> tuple[str, ...]:
        return _params(self.condition)


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
        import math

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


def quantity(unit: str, *, name: str | None = None, category: str = "") -> Callable[[Callable[..., Any]], Quantity]:
    """Decorator: ``@quantity("bytes", category="memory") def weight_bytes(param_count, weight_dtype_bytes): ...``."""

    def wrap(func: Callable[..., Any]) -> Quantity:
        return Quantity(name=name or func.__name__, func=func, unit=unit, doc=inspect.getdoc(func) or "", category=category)

    return wrap


def reducer(target: str, *, when: Callable[..., bool], name: str | None = None,
            after: tuple[str, ...] = (), before: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Reducer]:
    """Decorator: ``@reducer("optimizer_state_bytes", when=lambda zero_stage: zero_stage >= 1)``."""

    def wrap(func: Callable[..., Any]) -> Reducer:
        return Reducer(name=name or func.__name__, target=target, transform=func, condition=when,
                       doc=inspect.getdoc(func) or "", after=after, before=before)

    return wrap
