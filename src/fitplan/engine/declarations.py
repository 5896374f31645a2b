"""What plugins declare to the engine: quantities, reducers and derived names, with their metadata.

A :class:`Quantity` is a pure function whose name is the quantity, whose parameter names are its
dependencies (other quantities, or inputs such as ``per_device_train_batch_size``, ``arch``,
``gpu_spec``), and whose docstring documents the formula and its source. Its metadata says how the rest
of fitplan shows and uses it, so that no table of quantity names lives outside the plugin that declares
them:

* ``label``: the human name (breakdown rows, explain trees), and ``short_label`` where space is tight
  (chart legends; default: the label);
* ``json_key``: its dotted key in the JSON report (``time.seconds``); conditions accept it as a name;
* ``short``: the short name ``fitplan explain`` accepts (``peak``, ``time``);
* ``row``: the breakdown row it fills (memory quantities: ``weights``, ``activations`` ...), in
  declaration order;
* ``role``: what the core relies on it for (one of :data:`ROLES`: the search compares the ``device_total``
  with the ``usable`` memory, ranks on ``seconds`` and ``cost.<market>``; ``share_X`` divides by the
  ``peak``); each role is held by at most one quantity;
* ``type``: ``number``, ``text``, ``bool`` or ``object``: what a policy condition may compare it with.

A :class:`Name` is a value computed from an evaluated estimate for conditions and reports only (no graph
node): ``train_hours``, ``gpus_paid``. It sees a view with ``values`` (a mapping) and ``market``.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import attrs
from attrs import field, frozen

TYPES = ("number", "text", "bool", "object")
"""What a quantity's or name's value is, for conditions: numbers compare with numbers, ..."""

ROLES: dict[str, str] = {
    "peak": "peak allocated bytes per GPU in one step (the breakdown's total; share_X = X / peak)",
    "saved": "what the forward leaves alive for the backward (activations, logits, autocast copies)",
    "breakdown": "the peak phase's rows: {row: bytes}, keyed by the memory quantities' row metadata, summing to the peak",
    "confidence": "how each figure is known: {json key or row: confidence entry} (docs/confidence vocabulary)",
    "device_total": "bytes the GPU must hold: the peak plus framework overheads (compared with the usable memory)",
    "overhead": "bytes the framework adds beyond the peak (CUDA context, allocator reserve): not a part of the peak",
    "usable": "the GPU's usable memory in bytes",
    "fit": "whether the run fits the GPU",
    "headroom": "usable memory minus the device total, in bytes",
    "seconds": "training time in seconds (the recommender's time objective)",
    "seconds.low": "the low end of the training time's likely range (seconds)",
    "seconds.high": "the high end of the training time's likely range (seconds)",
    "cost.on_demand": "cost in the on-demand market",
    "cost.spot": "cost in the spot market",
    "cost.on_demand.low": "the low end of the on-demand cost's likely range",
    "cost.on_demand.high": "the high end of the on-demand cost's likely range",
    "cost.spot.low": "the low end of the spot cost's likely range",
    "cost.spot.high": "the high end of the spot cost's likely range",
    "currency": "the currency of the costs",
    "instance": "the instances rented (fitplan.rulesets.pricing.InstancePlan)",
    "params": "the model's parameter count (sizes the model download of an emitted SkyPilot task)",
    "step": "seconds of one optimizer step (an emitted spot plan's save_steps is the checkpoint interval over it)",
    "cpu_offload": "host RAM per node for CPU offload, in bytes: GPUs per node × each rank's (the recommender checks "
                   "it against the instance's stated RAM)",
}
"""The roles the core relies on: the quantity holding each is found through its metadata, never by name."""


def _params(func: Callable[..., Any]) -> tuple[str, ...]:
    """The parameter names of ``func``, as ``inspect.signature`` gives them; read from the code object for a
    plain function (no ``*args``/``**kwargs``, not wrapped), which is what ``inspect.signature`` would do
    there, at a tenth of its cost (a hundred quantities are declared at every start)."""
    code = getattr(func, "__code__", None)
    if (type(func) is types.FunctionType and code is not None and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
            and not hasattr(func, "__wrapped__") and not hasattr(func, "__signature__")):
        return code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return tuple(inspect.signature(func).parameters)


def _type(inst: Any, att: attrs.Attribute, value: str) -> None:
    if value not in TYPES:
        raise ValueError(f"{type(inst).__name__}.type must be one of {', '.join(TYPES)}, got {value!r}")


def _role(inst: Any, att: attrs.Attribute, value: str) -> None:
    if value and value not in ROLES:
        raise ValueError(f"{type(inst).__name__}.role must be one of {', '.join(ROLES)}, got {value!r}")


@frozen
class Quantity:
    """A named number: ``func``'s parameter names are its dependencies (see the module doc for the metadata)."""

    name: str
    func: Callable[..., Any]
    unit: str
    doc: str = ""
    category: str = ""
    """``memory`` quantities are per-GPU byte counts: checked to be numbers after every evaluation."""
    plugin: str = ""
    deps: tuple[str, ...] = field(default=attrs.Factory(lambda self: _params(self.func), takes_self=True))
    label: str = ""
    short_label: str = ""
    json_key: str = ""
    short: str = ""
    row: str = ""
    role: str = field(default="", validator=_role)
    type: str = field(default="number", validator=_type)

    @property
    def compact_label(self) -> str:
        return self.short_label or self.label or self.name


@frozen
class Reducer:
    """Transforms ``target`` when ``condition`` holds.

    ``transform(value, *deps)``: the first parameter receives the value so far in the chain;
    the others are dependencies by name. ``condition(*deps)`` decides, per evaluation, whether
    the reducer applies; when it does not, the value passes through unchanged. ``after`` and
    ``before`` name other reducers on the same target (an unknown name is an error).
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
class Name:
    """A value derived from an evaluated estimate for conditions and reports (no graph node).

    ``get(view)`` reads ``view.values.get(name)`` for the names in ``deps`` (quantities and inputs) and
    ``view.market`` (``on_demand``, ``spot`` or None); it returns None when the value is unknown. ``deps``
    tells the recommender which quantities to compute for a policy that uses the name.
    """

    name: str
    get: Callable[[Any], Any]
    doc: str
    deps: tuple[str, ...] = ()
    type: str = field(default="number", validator=_type)
    json_key: str = ""
    plugin: str = ""


def quantity(unit: str, *, name: str | None = None, category: str = "", label: str = "", short_label: str = "",
             json_key: str = "", short: str = "", row: str = "", role: str = "",
             type: str = "number") -> Callable[[Callable[..., Any]], Quantity]:
    """Decorator: ``@quantity("bytes", category="memory", row="weights") def weight_bytes(param_count, ...): ...``."""

    def wrap(func: Callable[..., Any]) -> Quantity:
        return Quantity(name=name or func.__name__, func=func, unit=unit, doc=inspect.getdoc(func) or "",
                        category=category, label=label, short_label=short_label, json_key=json_key, short=short, row=row,
                        role=role, type=type)

    return wrap


def reducer(target: str, *, when: Callable[..., bool], name: str | None = None,
            after: tuple[str, ...] = (), before: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Reducer]:
    """Decorator: ``@reducer("optimizer_state_bytes", when=lambda zero_stage: zero_stage >= 1)``."""

    def wrap(func: Callable[..., Any]) -> Reducer:
        return Reducer(name=name or func.__name__, target=target, transform=func, condition=when,
                       doc=inspect.getdoc(func) or "", after=after, before=before)

    return wrap
