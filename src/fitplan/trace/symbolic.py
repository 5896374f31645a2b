"""Sizes that remember how they were computed from the micro-batch ``b`` and the sequence length ``s``.

A step trace's recording (:mod:`.learned_graph`) is the same list of ops for every ``(b, s)`` of a scenario
whenever no decision it takes depends on them: only the sizes change, and they are computed from ``b`` and
``s`` by the learned file's expressions and the trace's own arithmetic. :mod:`.reuse` records a scenario once
with ``b`` and ``s`` given as :class:`SymInt` values: each is the plain number (so the recording computes
exactly what it computes with plain numbers) and also a node of a :class:`Tape`, the expression that made it.
Every arithmetic result of a symbolic value is symbolic again (a new node); every *decision* a value takes part
in (a comparison, truth, use as an index, a hash, a conversion, a string) is written on the tape as a guard:
that expression, and the outcome the recording saw. At another ``(b, s)``, :meth:`Tape.values` evaluates every
node in the order they were made and checks each guard: when all hold, the recording would take every decision
the same way, and the new sizes are the evaluated nodes; when one fails, the scenario is recorded again.

The outcome is a guard, never a guess: an operation this module does not follow returns a plain value only
after a guard pins the operand to its recorded value (the conservative direction). The one way a value escapes
unguarded is Python's own arithmetic with a plain ``float`` on the left of a :class:`SymInt` (``2.0 * n``:
``float.__mul__`` accepts any int); trace code writes such constants as :data:`TWO` and :data:`FOUR` (plain
floats for plain operands). tests/test_trace_reuse.py compares re-evaluated traces with fresh recordings.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable


class GuardFailed(Exception):
    """A guard does not hold at the asked ``(b, s)``: the recording does not apply there."""


class Tape:
    """The expressions of one recording: node 0 is ``b``, node 1 ``s``; each later node is an operation on
    earlier nodes and constants (made once: equal expressions are one node), and the guards."""

    def __init__(self) -> None:
        self.nodes: list[tuple[Callable[..., Any], tuple[tuple[bool, Any], ...]]] = [(None, ()), (None, ())]
        self.index: dict[tuple, int] = {}
        self.guards: dict[int, Any] = {}
        """Node -> the value the recording saw (a comparison's outcome, or the value itself)."""
        self._compiled: tuple[int, Callable[[int, int], list[Any] | None]] | None = None

    def guard(self, n: int, outcome: Any) -> None:
        self.guards[n] = outcome

    def values(self, b: int, s: int) -> list[Any] | None:
        """Every node's value at ``(b, s)``, or None when a guard does not hold there (:meth:`compiled`)."""
        if self._compiled is None or self._compiled[0] != len(self.nodes):
            self._compiled = (len(self.nodes), self.compiled())
        return self._compiled[1](b, s)

    def compiled(self) -> Callable[[int, int], list[Any] | None]:
        """The nodes as one straight-line function of ``(b, s)`` (a few hundred lines; made once per recording):
        each node a line applying its operation, each guard a test. Only the operators of :data:`_SOURCE` are
        written out; any other operation and every constant is read from a list, never written into the text."""
        consts: list[Any] = []
        lines = ["def values(b, s):", " v0 = b", " v1 = s"]
        for n in (0, 1):
            if n in self.guards:
                consts.append(self.guards[n])
                lines.append(f" if v{n} != C[{len(consts) - 1}]: return None")
        for n in range(2, len(self.nodes)):
            fn, refs = self.nodes[n]
            names = []
            for r, a in refs:
                if r:
                    names.append(f"v{a}")
                else:
                    consts.append(a)
                    names.append(f"C[{len(consts) - 1}]")
            infix = _SOURCE.get(fn)
            if infix is not None and len(names) == 2:
                expr = f"{names[0]} {infix} {names[1]}"
            else:
                consts.append(fn)
                expr = f"C[{len(consts) - 1}]({', '.join(names)})"
            lines.append(f" v{n} = {expr}")
            if n in self.guards:
                consts.append(self.guards[n])
                lines.append(f" if v{n} != C[{len(consts) - 1}]: return None")
        lines.append(" return [" + ", ".join(f"v{n}" for n in range(len(self.nodes))) + "]")
        scope: dict[str, Any] = {"C": consts}
        exec(compile("\n".join(lines), "<fitplan trace tape>", "exec"), scope)  # noqa: S102 (our own operators only)
        return scope["values"]


_SOURCE = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "//", operator.truediv: "/",
           operator.mod: "%", operator.pow: "**", operator.lshift: "<<", operator.rshift: ">>", operator.and_: "&",
           operator.or_: "|", operator.xor: "^", operator.lt: "<", operator.le: "<=", operator.gt: ">",
           operator.ge: ">=", operator.eq: "==", operator.ne: "!="}
"""Operations written as Python operators in :meth:`Tape.compiled` (the same operation as the function)."""


def _apply(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the plain values, as a node of the symbolic arguments' tape (made once per distinct
    operation: the key is ``fn`` and, per argument, a node's index or a constant's type and value)."""
    tape = None
    plain = []
    refs = []
    key: list[Any] = [fn]
    for a in args:
        ta = type(a)
        if ta is SymInt or ta is SymFloat:
            if tape is None:
                tape = a.t
            elif a.t is not tape:  # two recordings' values: never follows one tape
                return _pinned_call(fn, args)
            plain.append(a.v)
            refs.append((True, a.n))
            key += (True, a.n)
        elif ta in _CONSTANTS:
            plain.append(a)
            refs.append((False, a))
            key += (False, ta, a)
        else:  # a value the tape does not keep as a constant
            return _pinned_call(fn, args)
    v = fn(*plain)
    k = tuple(key)
    n = tape.index.get(k)
    if n is None:
        n = tape.index[k] = len(tape.nodes)
        tape.nodes.append((fn, tuple(refs)))
    tv = type(v)
    if tv is int:
        return SymInt(v, tape, n)
    if tv is float:
        return SymFloat(v, tape, n)
    tape.guards[n] = v  # a comparison's outcome (a decision), or a value of another kind
    return v


def _pinned_call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*[_pinned(x) if isinstance(x, (SymInt, SymFloat)) else x for x in args])


def _pinned(x: Any) -> Any:
    """``x``'s plain value, with a guard that it stays what it is (a use this module does not follow)."""
    x.t.guard(x.n, x.v)
    return x.v


_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
           "truediv": operator.truediv, "mod": operator.mod, "pow": operator.pow, "lshift": operator.lshift,
           "rshift": operator.rshift, "and": operator.and_, "or": operator.or_, "xor": operator.xor}
_COMPARE = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq,
            "ne": operator.ne}
_UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": operator.abs, "invert": operator.invert,
          "trunc": math.trunc, "floor": math.floor, "ceil": math.ceil}
_PINNED = ("__index__", "__int__", "__float__", "__hash__", "__format__", "__str__", "__repr__",
           "__getnewargs__", "__reduce__", "__reduce_ex__", "bit_length", "bit_count", "to_bytes",
           "as_integer_ratio", "conjugate", "is_integer", "hex", "__complex__")
_PINNED_PROPERTIES = ("real", "imag", "numerator", "denominator")


def _methods(base: type) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    for name, fn in _BINARY.items():
        ns[f"__{name}__"] = (lambda f: lambda a, b: _apply(f, a, b))(fn)
        ns[f"__r{name}__"] = (lambda f: lambda a, b: _apply(f, b, a))(fn)  # b (plain) on the left
    for name, fn in _COMPARE.items():
        ns[f"__{name}__"] = (lambda f: lambda a, b: _apply(f, a, b))(fn)
    for name, fn in _UNARY.items():
        ns[f"__{name}__"] = (lambda f: lambda a: _apply(f, a))(fn)
    ns["__bool__"] = lambda a: _apply(bool, a)  # a guard on the truth only
    ns["__round__"] = lambda a, nd=None: _apply(round, a) if nd is None else _apply(round, a, nd)
    ns["__divmod__"] = lambda a, b: (a // b, a % b)
    ns["__rdivmod__"] = lambda a, b: (b // a, b % a)
    for name in _PINNED:
        if hasattr(base, name):
            ns[name] = (lambda nm: lambda a, *rest: getattr(base(_pinned(a)), nm)(*rest))(name)
    for name in _PINNED_PROPERTIES:
        ns[name] = property((lambda nm: lambda a: getattr(base(_pinned(a)), nm))(name))
    if base is float:
        ns.pop("__invert__", None)
        for name in ("lshift", "rshift", "and", "or", "xor"):
            ns.pop(f"__{name}__"), ns.pop(f"__r{name}__")
    return ns


class SymInt(int):
    """An int computed from ``b`` and ``s``: node ``n`` of tape ``t`` (see the module doc)."""

    def __new__(cls, v: int, tape: Tape, n: int) -> SymInt:
        o = int.__new__(cls, v)
        o.v, o.t, o.n = v, tape, n
        return o


class SymFloat(float):
    """A float computed from ``b`` and ``s`` (see :class:`SymInt`)."""

    def __new__(cls, v: float, tape: Tape, n: int) -> SymFloat:
        o = float.__new__(cls, v)
        o.v, o.t, o.n = v, tape, n
        return o


for _cls, _base in ((SymInt, int), (SymFloat, float)):
    for _name, _fn in _methods(_base).items():
        setattr(_cls, _name, _fn)


class Const(float):
    """A float constant that keeps a symbolic operand on its right symbolic (``2.0 * n``, see the module doc). A
    product with plain numbers is a :class:`Const` again, so that a chain ``TWO * a * b * c`` stays symbolic
    wherever its first symbolic factor comes."""

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, (SymInt, SymFloat)):
            return _apply(operator.mul, float(self), other)
        v = float(self) * other
        return Const(v) if type(v) is float else v


TWO = Const(2.0)
FOUR = Const(4.0)


def as_int(x: Any) -> Any:
    """``int(x)`` that stays symbolic (the learned file's sizes are evaluated through it)."""
    if isinstance(x, SymInt):
        return x
    if isinstance(x, SymFloat):
        return _apply(int, x)
    return int(x)


_CONSTANTS = frozenset({int, float, bool, str, type(None), Const})
"""Plain operands a node keeps as constants (anything else pins the symbolic operands)."""


def start(b: int, s: int) -> tuple[Tape, SymInt, SymInt]:
    """A new tape and ``b``, ``s`` as its first two nodes."""
    tape = Tape()
    return tape, SymInt(b, tape, 0), SymInt(s, tape, 1)


def value(x: Any, vals: list[Any]) -> Any:
    """``x`` at the evaluated nodes ``vals`` (a plain value stays)."""
    return vals[x.n] if isinstance(x, (SymInt, SymFloat)) else x
