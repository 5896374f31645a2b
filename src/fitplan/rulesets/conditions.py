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
``train_seconds``), the JSON report's dotted keys of quantities (``time.seconds``: their ``json_key``
metadata), names plugins derive from an estimate (``train_hours``, ``headroom_fraction``: the
``fitplan_register_names`` hook), the plan's market (``market``, ``spot``, and ``cost_usd``: the cost in
that market, from the quantities holding the ``cost.on_demand`` and ``cost.spot`` roles), and
``share_X`` (X's fraction of the quantity holding the ``peak`` role). Advice rules also see
``variant_X``, ``delta_X`` (current − variant) and ``ratio_X`` (variant / current) once their variant
scenario is evaluated. A :class:`Vocabulary` (built from a plugin registry) resolves names and knows their
types, so that ``rulesets check`` catches an unknown name or a comparison of a number with a string.

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

SHARE_PREFIX = "share_"
VARIANT_PREFIXES = ("variant_", "delta_", "ratio_")
MARKET_NAMES: dict[str, tuple[str, str]] = {
    "market": ("text", "the plan's pricing: \"on_demand\" or \"spot\" (estimate: each market with a price)"),
    "spot": ("bool", "true when the plan runs on spot instances"),
    "cost_usd": ("number", "the plan's cost in its market (on-demand or spot), in the cost currency"),
}
"""Names about the plan's market, known to the core: the search and the policy check set the market."""


def _missing(ns: Namespace) -> Any:
    return None


class Namespace:
    """What a condition reads: the evaluated values (quantities and scenario fields), the market, the
    variant scenario's values (advice rules) and the :class:`Vocabulary` that resolves names
    (:func:`vocabulary` of the registry the values were evaluated with).

    ``values`` is anything with ``get(name)`` (a dict, or a chain of dicts).
    """

    __slots__ = ("values", "market", "variant", "vocabulary")

    def __init__(self, values: Any, market: str | None, variant: Mapping[str, Any] | None,
                 vocabulary: Vocabulary) -> None:
        self.values = values
        self.market = market
        self.variant = variant
        self.vocabulary = vocabulary

    def get(self, name: str) -> Any:
        return self.vocabulary.getter(name)(self)


class Vocabulary:
    """Every name a condition may use, its type and how to read it from a :class:`Namespace`: inputs,
    quantities (and their JSON keys), declared names, the market names, and the prefixed forms."""

    def __init__(self, compiled: Any, names: Mapping[str, Any], inputs: Mapping[str, str],
                 input_types: Mapping[str, str] | None = None, choices: Mapping[str, tuple] | None = None) -> None:
        self.types: dict[str, str] = {n: (input_types or {}).get(n, "any") for n in inputs}
        self.choices: dict[str, tuple] = {**(choices or {}), "market": ("on_demand", "spot")}
        """Names with a fixed set of values (scenario fields' choices, the market): a literal outside it never matches."""
        self.docs: dict[str, str] = dict(inputs)
        self._get: dict[str, Callable[[Namespace], Any]] = {}
        self._deps: dict[str, tuple[str, ...]] = {}
        for qname, q in compiled.quantities.items():
            self.types[qname] = q.type
            self.docs[qname] = q.doc.split("\n\n")[0]
            if q.json_key:
                self.types[q.json_key] = q.type
                self.docs[q.json_key] = f"the JSON report's {q.json_key} ({qname})"
                self._get[q.json_key] = _value_of(qname)
                self._deps[q.json_key] = (qname,)
        self.ids: dict[str, str] = {}
        """Names whose values are ruleset ids (lowercase) -> the table."""
        for n in names.values():
            for key in filter(None, (n.name, n.json_key)):
                self.types[key], self.docs[key], self._get[key], self._deps[key] = n.type, n.doc, n.get, n.deps
                if getattr(n, "id_of", ""):
                    self.ids[key] = n.id_of
        costs = {m: compiled.role(f"cost.{m}") for m in ("on_demand", "spot")}
        self._deps["cost_usd"] = tuple(c for c in costs.values() if c is not None)
        self.peak = compiled.role("peak")
        for name, (typ, doc) in MARKET_NAMES.items():
            self.types[name], self.docs[name] = typ, doc
        self._get["market"] = lambda ns: ns.market
        self._get["spot"] = lambda ns: None if ns.market is None else ns.market == "spot"
        self._get["cost_usd"] = lambda ns: (None if ns.market not in costs or costs[ns.market] is None
                                            else ns.values.get(costs[ns.market]))

    def getter(self, name: str) -> Callable[[Namespace], Any]:
        """A function of a :class:`Namespace` returning ``name``'s value."""
        got = self._get.get(name)
        if got is not None:
            return got
        for prefix in VARIANT_PREFIXES:
            if name.startswith(prefix):
                return _variant_getter(prefix, self.getter(name[len(prefix):]))
        if name.startswith(SHARE_PREFIX) and self.peak is not None:
            base, peak = self.getter(name[len(SHARE_PREFIX):]), self.peak

            def share(ns: Namespace) -> float | None:
                x, total = base(ns), ns.values.get(peak)
                return None if x is None or not total else x / total

            return share
        return _value_of(name)

    def quantities_for(self, name: str) -> set[str]:
        """The names whose values ``name`` reads (itself for a quantity or an input; a declared name's deps;
        the peak too for ``share_X``)."""
        for prefix in VARIANT_PREFIXES:
            if name.startswith(prefix):
                return self.quantities_for(name[len(prefix):])
        if name in self._deps:
            return set(self._deps[name])
        if name not in self.types and name.startswith(SHARE_PREFIX):
            return self.quantities_for(name[len(SHARE_PREFIX):]) | ({self.peak} if self.peak else set())
        return {name}

    def type_of(self, name: str) -> str | None:
        """``number``, ``text``, ``bool``, ``object``, ``any`` (an input), or None for an unknown name."""
        if name in self.types:
            return self.types[name]
        for prefix in VARIANT_PREFIXES:
            if name.startswith(prefix):
                base = self.types.get(name[len(prefix):])
                return base if prefix == "variant_" or base is None else "number" if base in ("number", "any") else None
        if name.startswith(SHARE_PREFIX) and self.types.get(name[len(SHARE_PREFIX):]) == "number":
            return "number"
        return None

    def known(self, name: str, *, variants: bool = False) -> bool:
        if name in self.types:
            return True
        if variants:
            for prefix in VARIANT_PREFIXES:
                if name.startswith(prefix):
                    return self.known(name[len(prefix):])
        return name.startswith(SHARE_PREFIX) and name[len(SHARE_PREFIX):] in self.types

    def problems(self, names: Iterable[tuple[str, str]], *, variants: bool = False) -> list[str]:
        """``unknown name 'peak_byte' (did you mean 'peak_bytes'?) @ location`` for each unknown name."""
        out = []
        for name, where in names:
            if self.known(name, variants=variants):
                continue
            pool = set(self.types) | {SHARE_PREFIX + n for n, t in self.types.items() if n.endswith("_bytes")}
            if variants:
                pool |= {p + n for p in VARIANT_PREFIXES for n in self.types}
            hint = did_you_mean(name, pool) or "see docs/policies.md for the names conditions can use"
            out.append(f"unknown name {name!r} ({hint}) @ {where}")
        return out

    def type_problems(self, data: Any, *, variants: bool = False) -> list[str]:
        """Comparisons whose literal cannot match the name's type (a number with a string, a text with
        ``gt``, an object at all), as ``... @ location``."""
        out = []
        for op, name, literal, where in comparisons_in(data):
            typ = self.type_of(name)
            if typ in (None, "any"):
                continue
            literals = list(literal) if isinstance(literal, (list, tuple)) else [literal]
            if typ == "object":
                out.append(f"{name!r} is not a value a condition can compare @ {where}")
            elif typ == "number" and any(isinstance(x, (str, bool)) for x in literals):
                out.append(f"{name!r} is a number, compared with {format_literal(literal)} @ {where}")
            elif typ == "text" and (op in ("gt", "ge", "lt", "le") or any(not isinstance(x, str) for x in literals)):
                out.append(f"{name!r} is a text, compared with {format_literal(literal)} using {op!r} @ {where}")
            elif typ == "bool" and any(not isinstance(x, bool) for x in literals):
                out.append(f"{name!r} is true or false, compared with {format_literal(literal)} @ {where}")
            elif op in ("eq", "ne", "in", "not_in"):
                out += self._choice_problems(name, literals, where)
        return out

    def _choice_problems(self, name: str, literals: list[Any], where: str) -> list[str]:
        """A literal a name with fixed values (:attr:`choices`) never takes: a wrong case, a misspelling, a type."""
        base = name.removeprefix("variant_")
        if base in self.ids:
            return [f"{name!r} is a {self.ids[base]} id, always lowercase: {format_literal(x)} can never match (did you "
                    f"mean {x.lower()!r}?) @ {where}" for x in literals if isinstance(x, str) and x != x.lower()]
        allowed = self.choices.get(base)
        if allowed is None:
            return []
        out = []
        for x in literals:
            if isinstance(x, bool) or x not in allowed:
                shown = [str(c) for c in allowed]
                hint = (did_you_mean(x, shown) if isinstance(x, str) else None) or "one of " + ", ".join(shown)
                out.append(f"{name!r} is one of {', '.join(shown)}: {format_literal(x)} can never match ({hint}) @ {where}")
        return out


def _value_of(name: str) -> Callable[[Namespace], Any]:
    return lambda ns: ns.values.get(name)


def _variant_getter(prefix: str, base: Callable[[Namespace], Any]) -> Callable[[Namespace], Any]:
    def get(ns: Namespace) -> Any:
        if ns.variant is None:
            return None
        other = base(Namespace(ns.variant, ns.market, None, ns.vocabulary))
        if prefix == "variant_":
            return other
        here = base(ns)
        if here is None or other is None or isinstance(here, bool) or not isinstance(here, (int, float)):
            return None
        if prefix == "delta_":
            return here - other
        return None if not here else other / here

    return get


def vocabulary(registry: Any) -> Vocabulary:
    """The vocabulary of a plugin registry's compiled graph and declared names (built once per registry)."""
    cached = registry.derived.get("vocabulary")
    if cached is None:
        from fitplan.inputs.names import input_names

        from fitplan.inputs.names import input_choices, input_types

        cached = registry.derived["vocabulary"] = Vocabulary(registry.compiled(), registry.names, input_names(),
                                                             input_types(), input_choices())
    return cached


# --------------------------------------------------------------------------- compiled conditions


class Condition:
    """A compiled condition: ``test(ns)`` says whether it holds; ``explain(ns)`` says why."""

    names: frozenset[str] = frozenset()

    def test(self, ns: Namespace) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def explain(self, ns: Namespace) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


class Compare(Condition):
    __slots__ = ("op", "fn", "name", "value", "names", "where", "_vocabulary", "_get")

    def __init__(self, op: str, name: str, value: Any, where: str) -> None:
        self.op, self.fn, self.name, self.value, self.where = op, COMPARISONS[op], name, value, where
        self.names = frozenset((name,))
        self._vocabulary: Vocabulary | None = None
        self._get: Callable[[Namespace], Any] = _missing

    def get(self, ns: Namespace) -> Any:
        """``name``'s value in ``ns`` (its getter is resolved once per vocabulary)."""
        vocabulary = ns.vocabulary
        if vocabulary is not self._vocabulary:
            self._get, self._vocabulary = vocabulary.getter(self.name), vocabulary
        return self._get(ns)

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


MAX_DEPTH, MAX_NODES = 32, 1000
"""A condition nests at most 32 levels and holds at most 1000 operators: real rules use a handful."""


def compile_condition(data: Any, where: str = "condition") -> Condition:
    """Compile a condition table. :raises FitplanError: naming the location (``condition.all[1].gtt``),
    for an unknown operator (with a suggestion), a malformed operand, a literal of the wrong type, or a
    condition deeper or larger than :data:`MAX_DEPTH` / :data:`MAX_NODES`."""
    _check_size(data, where)
    return _compile(data, where)


def _check_size(data: Any, where: str) -> None:
    stack, nodes = [(data, 1)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH or nodes > MAX_NODES:
            raise FitplanError(f"a condition nests more than {MAX_DEPTH} levels or holds more than {MAX_NODES} operators",
                               field=where, suggestion="split the rule into several rules")
        if isinstance(node, Mapping):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _compile(data: Any, where: str) -> Condition:
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
        children = [_compile(c, f"{here}[{i}]") for i, c in enumerate(operand)]
        return All(children) if op == "all" else AnyOf(children)
    if op == "not":
        return Not(_compile(operand, here))
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


def comparisons_in(data: Any) -> list[tuple[str, str, Any, str]]:
    """Every ``(operator, name, literal, location)`` a (valid) condition table holds."""
    out: list[tuple[str, str, Any, str]] = []

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
                out.extend((str(op), str(n), v, f"{here}.{n}") for n, v in operand.items())

    walk(data, "condition")
    return out


def names_in(data: Any) -> list[tuple[str, str]]:
    """Every ``(name, location)`` a (valid) condition table compares."""
    return [(name, where) for _, name, _, where in comparisons_in(data)]
