"""Rule conditions: TOML tables over quantity and scenario names, evaluated through a whitelisted
operator table. Never ``eval``.

A condition is a table with exactly one operator key (docs/policies.md)::

    { gt = { train_hours = 8 } }                  # every name of the inner table against its literal
    { in = { provider = ["aws", "lambda"] } }
    { all = [ { eq = { market = "spot" } }, { gt = { train_hours = 8 } } ] }
    { any = [ ... ] }
    { not = { eq = { method = "full" } } }

Comparison operators (``gt``, ``ge``, ``lt``, ``le``, ``eq``, ``ne``, ``in``, ``not_in``) are a dict of
name -> ``operator.*`` function (:data:`COMPARISONS`); ``all``, ``any`` and ``not`` combine conditions.
An inner table with several names means all of them (``{ lt = { a = 1, b = 2 } }`` is ``a < 1 and b < 2``).

Names are scenario fields (``method``, ``provider``, ``zero_stage``), quantities (``peak_bytes``,
``train_seconds``), the JSON report's dotted keys (``time.seconds``, ``cost.spot_usd``: :data:`ALIASES`),
plan-level names (``market``, ``cost_usd``, ``train_hours``, ``headroom_fraction``: :data:`DERIVED`), and
``share_<memory quantity>`` (its fraction of the peak). Advice rules also see ``variant_X``, ``delta_X``
(current − variant) and ``ratio_X`` (variant / current) once their variant scenario is evaluated.

An unknown value (``None``: no GPU, no dataset, no price) makes a comparison false, so a rule about
cost never fires on an estimate without prices.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fitplan.errors import FitplanError, did_you_mean


def _contains(value: Any, options: Any) -> bool:
    return operator.contains(options, value)


def _not_contains(value: Any, options: Any) -> bool:
    return not operator.contains(options, value)


COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
    "eq": operator.eq,
    "ne": operator.ne,
    "in": _contains,
    "not_in": _not_contains,
}
"""The whitelisted comparison operators: name -> function of (value of the name, literal)."""
SYMBOLS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "=", "ne": "!=", "in": "in", "not_in": "not in"}
COMBINATORS = ("all", "any", "not")
OPERATORS = (*COMPARISONS, *COMBINATORS)

ALIASES: dict[str, str] = {
    "memory.peak_bytes": "peak_bytes",
    "memory.device_total_bytes": "device_total_bytes",
    "memory.usable_bytes": "usable_bytes",
    "memory.headroom_bytes": "headroom_bytes",
    "memory.cpu_offload_bytes": "cpu_offload_bytes",
    "time.tokens": "train_tokens",
    "time.seconds": "train_seconds",
    "time.tokens_per_second": "train_tokens_per_second",
    "time.flops": "train_flops",
    "time.mfu": "train_mfu",
    "cost.gpu_hours": "gpu_hours",
    "cost.on_demand_usd": "on_demand_cost_usd",
    "cost.spot_usd": "spot_cost_usd",
    "cost.currency": "cost_currency",
}
"""The JSON report's dotted keys -> the quantity behind each."""


def _hours(ns: Namespace) -> float | None:
    s = ns.values.get("train_seconds")
    return None if s is None else s / 3600


def _cost(ns: Namespace) -> float | None:
    if ns.market == "spot":
        return ns.values.get("spot_cost_usd")
    return ns.values.get("on_demand_cost_usd")


def _headroom_fraction(ns: Namespace) -> float | None:
    h, u = ns.values.get("headroom_bytes"), ns.values.get("usable_bytes")
    return None if h is None or not u else h / u


def _gpu(ns: Namespace) -> str | None:
    spec = ns.values.get("gpu_spec")
    return spec.id if spec is not None else ns.values.get("gpu")


def _instance(ns: Namespace) -> str | None:
    choice = ns.values.get("instance_choice")
    return None if choice is None else choice.instance.id


def _gpus_paid(ns: Namespace) -> int | None:
    choice = ns.values.get("instance_choice")
    return None if choice is None else choice.gpus_paid


def _spot_saving(ns: Namespace) -> float | None:
    od, spot = ns.values.get("on_demand_cost_usd"), ns.values.get("spot_cost_usd")
    return None if not od or spot is None else 1 - spot / od


def _gpu_has(dtype: str) -> Callable[[Namespace], bool | None]:
    def get(ns: Namespace) -> bool | None:
        spec = ns.values.get("gpu_spec")
        return None if spec is None else dtype in spec.peak_tflops

    return get


def _batch_per_gpu(ns: Namespace) -> int | None:
    b, k = ns.values.get("per_device_train_batch_size"), ns.values.get("gradient_accumulation_steps")
    return None if b is None or k is None else b * k


DERIVED: dict[str, tuple[Callable[[Namespace], Any], str]] = {
    "market": (lambda ns: ns.market, "the plan's pricing: \"on_demand\" or \"spot\" (estimate: each market with a price)"),
    "spot": (lambda ns: None if ns.market is None else ns.market == "spot", "true when the plan runs on spot instances"),
    "cost_usd": (_cost, "the plan's cost in its market (on-demand or spot), in cost_currency"),
    "train_hours": (_hours, "training time in hours (train_seconds / 3600)"),
    "time.hours": (_hours, "training time in hours (train_seconds / 3600)"),
    "headroom_fraction": (_headroom_fraction, "free memory left on the GPU as a fraction of its usable memory"),
    "gpu": (_gpu, "the GPU's ruleset id (aliases resolved)"),
    "cost.provider": (lambda ns: ns.values.get("provider"), "the provider the plan rents from"),
    "cost.instance": (_instance, "the instance type rented"),
    "instance_id": (_instance, "the instance type rented"),
    "gpus_paid": (_gpus_paid, "GPUs paid for (whole instances)"),
    "spot_saving_fraction": (_spot_saving, "1 − spot cost / on-demand cost"),
    "gpu_supports_bf16": (_gpu_has("bf16"), "whether the GPU has bf16 tensor cores"),
    "gpu_supports_fp8": (_gpu_has("fp8"), "whether the GPU has fp8 tensor cores"),
    "batch_per_gpu": (_batch_per_gpu, "sequences per GPU per optimizer step: micro-batch × accumulation steps"),
}
"""Names computed from a plan's values (and its market), documented in docs/policies.md."""

SHARE_PREFIX = "share_"
VARIANT_PREFIXES = ("variant_", "delta_", "ratio_")


class Namespace:
    """What a condition reads: the evaluated values (quantities and scenario fields) and the market.

    ``values`` is anything with ``get(name)`` (a dict, or a chain of dicts). ``variant`` holds a variant
    scenario's values for advice rules.
    """

    __slots__ = ("values", "market", "variant")

    def __init__(self, values: Any, market: str | None = None, variant: Mapping[str, Any] | None = None) -> None:
        self.values = values
        self.market = market
        self.variant = variant

    def get(self, name: str) -> Any:
        return getter(name)(self)


def getter(name: str) -> Callable[[Namespace], Any]:
    """A function of a :class:`Namespace` returning ``name``'s value (resolved once, at compile time)."""
    if name in DERIVED:
        return DERIVED[name][0]
    if name in ALIASES:
        key = ALIASES[name]
        return lambda ns: ns.values.get(key)
    for prefix in VARIANT_PREFIXES:
        if name.startswith(prefix):
            base = getter(name[len(prefix):])
            return _variant_getter(prefix, base)
    if name.startswith(SHARE_PREFIX):
        base = getter(name[len(SHARE_PREFIX):])

        def share(ns: Namespace) -> float | None:
            x, peak = base(ns), ns.values.get("peak_bytes")
            return None if x is None or not peak else x / peak

        return share
    return lambda ns: ns.values.get(name)


def _variant_getter(prefix: str, base: Callable[[Namespace], Any]) -> Callable[[Namespace], Any]:
    def get(ns: Namespace) -> Any:
        if ns.variant is None:
            return None
        other = base(Namespace(ns.variant, ns.market))
        if prefix == "variant_":
            return other
        here = base(ns)
        if here is None or other is None or isinstance(here, bool) or not isinstance(here, (int, float)):
            return None
        if prefix == "delta_":
            return here - other
        return None if not here else other / here

    return get


# --------------------------------------------------------------------------- compiled conditions


class Condition:
    """A compiled condition: ``test(ns)`` says whether it holds; ``explain(ns)`` says why."""

    names: frozenset[str] = frozenset()

    def test(self, ns: Namespace) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def explain(self, ns: Namespace) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


class Compare(Condition):
    __slots__ = ("op", "fn", "name", "value", "get", "names", "where")

    def __init__(self, op: str, name: str, value: Any, where: str) -> None:
        self.op, self.fn, self.name, self.value, self.where = op, COMPARISONS[op], name, value, where
        self.get = getter(name)
        self.names = frozenset((name,))

    def test(self, ns: Namespace) -> bool:
        x = self.get(ns)
        if x is None:
            return False
        try:
            return bool(self.fn(x, self.value))
        except TypeError:
            raise FitplanError(f"cannot compare {self.name} = {x!r} with {self.value!r} using {self.op!r}",
                               field=self.where, value=self.value,
                               suggestion=f"{self.name} is a {type(x).__name__}") from None

    def explain(self, ns: Namespace) -> str:
        here = f"{self.name} = {format_literal(self.get(ns))}"
        if self.op == "eq":
            return here
        if self.op in ("ne", "in", "not_in"):
            return f"{here}, {'not' if self.op == 'ne' else SYMBOLS[self.op]} {format_literal(self.value)}"
        return f"{here} {SYMBOLS[self.op]} {format_literal(self.value)}"


class All(Condition):
    __slots__ = ("children", "names")

    def __init__(self, children: list[Condition]) -> None:
        self.children = children
        self.names = frozenset().union(*(c.names for c in children)) if children else frozenset()

    def test(self, ns: Namespace) -> bool:
        for c in self.children:
            if not c.test(ns):
                return False
        return True

    def explain(self, ns: Namespace) -> str:
        return " and ".join(_paren(c, ns) for c in self.children)


class AnyOf(Condition):
    __slots__ = ("children", "names")

    def __init__(self, children: list[Condition]) -> None:
        self.children = children
        self.names = frozenset().union(*(c.names for c in children)) if children else frozenset()

    def test(self, ns: Namespace) -> bool:
        for c in self.children:
            if c.test(ns):
                return True
        return False

    def explain(self, ns: Namespace) -> str:
        held = [c for c in self.children if c.test(ns)]
        return " or ".join(_paren(c, ns) for c in (held or self.children))


class Not(Condition):
    __slots__ = ("child", "names")

    def __init__(self, child: Condition) -> None:
        self.child = child
        self.names = child.names

    def test(self, ns: Namespace) -> bool:
        return not self.child.test(ns)

    def explain(self, ns: Namespace) -> str:
        return f"not ({self.child.explain(ns)})"


def _paren(c: Condition, ns: Namespace) -> str:
    text = c.explain(ns)
    return f"({text})" if isinstance(c, (All, AnyOf)) and len(c.children) > 1 else text


def format_literal(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_literal(x) for x in v) + "]"
    if v is None:
        return "unknown"
    return repr(v) if isinstance(v, str) else str(v)


_SCALARS = (bool, int, float, str)


def compile_condition(data: Any, where: str = "condition") -> Condition:
    """Compile a condition table. :raises FitplanError: naming the location (``condition.all[1].gtt``),
    for an unknown operator (with a suggestion), a malformed operand or a literal of the wrong type."""
    if not isinstance(data, Mapping) or len(data) != 1:
        got = "an empty table" if isinstance(data, Mapping) and not data else (
            f"a table with {len(data)} keys ({', '.join(map(str, data))})" if isinstance(data, Mapping) else type(data).__name__)
        raise FitplanError(f"a condition is a table with exactly one operator key, got {got}", field=where,
                           suggestion="operators: " + ", ".join(OPERATORS)
                           + "; several comparisons go in { all = [ {...}, {...} ] }")
    ((op, operand),) = data.items()
    here = f"{where}.{op}"
    if op in ("all", "any"):
        if not isinstance(operand, list) or not operand:
            raise FitplanError(f"{op!r} takes a non-empty list of conditions, got {operand!r:.60}", field=here)
        children = [compile_condition(c, f"{here}[{i}]") for i, c in enumerate(operand)]
        return All(children) if op == "all" else AnyOf(children)
    if op == "not":
        return Not(compile_condition(operand, here))
    if op not in COMPARISONS:
        hint = did_you_mean(str(op), OPERATORS) or "operators: " + ", ".join(OPERATORS)
        # the hint is part of the message: ruleset checks print messages with their location only
        raise FitplanError(f"unknown operator {op!r} ({hint})", field=here, value=op)
    if not isinstance(operand, Mapping) or not operand:
        raise FitplanError(f"{op!r} takes a table of name = value, got {operand!r:.60}", field=here,
                           suggestion=f"for example {{ {op} = {{ train_hours = 8 }} }}")
    comps: list[Condition] = []
    for name, value in operand.items():
        at = f"{here}.{name}"
        if op in ("in", "not_in"):
            if not isinstance(value, list) or not all(isinstance(x, _SCALARS) for x in value):
                raise FitplanError(f"{op!r} needs a list of values for {name!r}, got {value!r:.60}", field=at, value=value,
                                   suggestion=f'for example {{ {op} = {{ {name} = ["a", "b"] }} }}')
            value = tuple(value)
        elif not isinstance(value, _SCALARS):
            raise FitplanError(f"{op!r} compares {name!r} with a number, string or boolean, got {value!r:.60}", field=at,
                               value=value)
        elif op in ("gt", "ge", "lt", "le") and isinstance(value, (bool, str)):
            raise FitplanError(f"{op!r} compares {name!r} with a number, got {value!r}", field=at, value=value,
                               suggestion="use eq / ne / in for strings and booleans")
        comps.append(Compare(op, str(name), value, at))
    return comps[0] if len(comps) == 1 else All(comps)


def names_in(data: Any) -> list[tuple[str, str]]:
    """Every ``(name, location)`` a (valid) condition table compares."""
    out: list[tuple[str, str]] = []

    def walk(d: Any, where: str) -> None:
        if not isinstance(d, Mapping):
            return
        for op, operand in d.items():
            here = f"{where}.{op}"
            if op in ("all", "any") and isinstance(operand, list):
                for i, c in enumerate(operand):
                    walk(c, f"{here}[{i}]")
            elif op == "not":
                walk(operand, here)
            elif isinstance(operand, Mapping):
                out.extend((str(n), f"{here}.{n}") for n in operand)

    walk(data, "condition")
    return out


# --------------------------------------------------------------------------- names


def known_names(registry: Any = None) -> set[str]:
    """Every name a condition may use (besides the prefixed forms): scenario fields, resolved inputs,
    quantities of ``registry``'s graph, aliases and derived names."""
    from fitplan.engine.graph import RESOLVED_INPUTS
    from fitplan.inputs.scenario import FIELD_SECTION

    names = set(FIELD_SECTION) | set(RESOLVED_INPUTS) | set(ALIASES) | set(DERIVED)
    if registry is not None:
        compiled = registry.compiled()
        names |= {n for n, node in compiled.nodes.items() if node.kind != "reducer" and not n.endswith(".raw")}
    return names


def unknown_name_problems(names: Iterable[tuple[str, str]], known: set[str], *, variants: bool = False) -> list[str]:
    """``unknown name 'peak_byte' (did you mean 'peak_bytes'?) @ location`` for each unknown name."""
    out = []
    for name, where in names:
        if is_known(name, known, variants=variants):
            continue
        pool = set(known) | {SHARE_PREFIX + n for n in known if n.endswith("_bytes")}
        if variants:
            pool |= {p + n for p in VARIANT_PREFIXES for n in known}
        hint = did_you_mean(name, pool) or "see docs/policies.md for the names conditions can use"
        out.append(f"unknown name {name!r} ({hint}) @ {where}")
    return out


def is_known(name: str, known: set[str], *, variants: bool = False) -> bool:
    if name in known:
        return True
    if variants:
        for prefix in VARIANT_PREFIXES:
            if name.startswith(prefix):
                return is_known(name[len(prefix):], known, variants=False)
    if name.startswith(SHARE_PREFIX):
        return name[len(SHARE_PREFIX):] in known
    return False
