"""Sizes that remember how they were computed from the micro-batch ``b`` and the sequence length ``s``.

A step trace's recording (:mod:`.learned_graph`) is the same list of ops for every ``(b, s)`` of a scenario
whenever no decision it takes depends on them: only the sizes change, and they are computed from ``b`` and
``s`` by the learned file's expressions and the trace's own arithmetic. :mod:`.reuse` records a scenario once
with ``b`` and ``s`` given as :class:`Sym` values: each holds the plain number (so the recording computes
exactly what it computes with plain numbers) and is a node of a :class:`Tape`, the expression that made it.
Every arithmetic result of a symbolic value is symbolic again (a node); every *decision* a value takes part in
(a comparison, truth, use as an index or a ``range`` bound, a hash, a conversion, a string, any method of the
number) is written on the tape as a guard: that expression and the outcome the recording saw. At another
``(b, s)``, :meth:`Tape.values` evaluates every node in the order they were made and checks each guard: when
all hold, the recording takes every decision the same way, and the new sizes are the evaluated nodes; when one
fails, the scenario is recorded again.

A :class:`Sym` is not an ``int`` or ``float`` subclass, on purpose: Python's own code reads the value of an int
subclass without asking it (``range(n)``, ``seq[n]``, ``2.0 * n`` through ``float.__mul__``), which would let a
size escape the tape unguarded. A plain object is asked through its special methods every time, and any other
use fails loudly (``isinstance(n, int)`` is false: tests/test_trace_reuse.py compares re-evaluated traces with
plain recordings, which would tell a branch taken differently apart).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable


class Tape:
    """The expressions of one recording: node 0 is ``b``, node 1 ``s``; each later node is an operation on
    earlier nodes and constants (made once: equal expressions are one node), and the guards."""

    def __init__(self) -> None:
        self.nodes: list[tuple[Callable[..., Any] | None, tuple[tuple[bool, Any], ...]]] = [(None, ()), (None, ())]
        self.index: dict[tuple, int] = {}
        self.guards: dict[int, Any] = {}
        """Node -> the value the recording saw (a comparison's outcome, or the value itself)."""
        self._compiled: tuple[tuple[int, int], Callable[[int, int], list[Any] | None]] | None = None

    def values(self, b: int, s: int) -> list[Any] | None:
        """Every node's value at ``(b, s)``, or None when a guard does not hold there (:meth:`compiled`)."""
        size = (len(self.nodes), len(self.guards))
        if self._compiled is None or self._compiled[0] != size:
            self._compiled = (size, self.compiled())
        return self._compiled[1](b, s)

    def compiled(self) -> Callable[[int, int], list[Any] | None]:
        """The nodes as one function of ``(b, s)`` (made once per recording): a plain loop over the steps, each
        applying its operation to earlier values and constants, each guard a comparison with the value the
        recording saw. No code is generated."""
        steps = [(n, fn, tuple((r, a) for r, a in refs), n in self.guards, self.guards.get(n))
                 for n, (fn, refs) in enumerate(self.nodes) if fn is not None or n in self.guards]

        count = len(self.nodes)

        def values(b: int, s: int) -> list[Any] | None:
            v: list[Any] = [b, s] + [None] * (count - 2)
            for n, fn, refs, guarded, seen in steps:
                if fn is not None:
                    v[n] = fn(*[v[a] if r else a for r, a in refs])
                if guarded and v[n] != seen:
                    return None
            return v

        return values


_CONSTANTS = frozenset({int, float, bool, str, type(None)})
"""Plain operands a node keeps as constants (anything else pins the symbolic operands)."""


class Sym:
    """A number computed from ``b`` and ``s``: its plain value ``v``, node ``n`` of tape ``t`` (module doc)."""

    __slots__ = ("v", "t", "n")

    def __init__(self, v: int | float, tape: Tape, n: int) -> None:
        self.v, self.t, self.n = v, tape, n

    def __getattr__(self, name: str) -> Any:
        """Any other attribute of the number (``bit_length``, ``real``, ``is_integer``, ...): the plain value's,
        once a guard pins it."""
        if name in Sym.__slots__:
            raise AttributeError(name)
        return getattr(_pinned(self), name)


def _apply(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the plain values, as a node of the symbolic arguments' tape (made once per distinct
    operation: the key is ``fn`` and, per argument, a node's index or a constant's type and value). A result
    that is not a number is a decision: a guard."""
    tape = None
    plain = []
    refs = []
    key: list[Any] = [fn]
    for a in args:
        ta = type(a)
        if ta is Sym:
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
    if tv is int or tv is float:
        return Sym(v, tape, n)
    tape.guards[n] = v  # a comparison's outcome (a decision), or a value of another kind
    return v


def _pinned(x: Sym) -> Any:
    """``x``'s plain value, with a guard that it stays what it is (a use this module does not follow)."""
    x.t.guards[x.n] = x.v
    return x.v


def _pinned_call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*[_pinned(x) if type(x) is Sym else x for x in args])


_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
           "truediv": operator.truediv, "mod": operator.mod, "pow": operator.pow, "lshift": operator.lshift,
           "rshift": operator.rshift, "and": operator.and_, "or": operator.or_, "xor": operator.xor}
_COMPARE = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq,
            "ne": operator.ne}
_UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": operator.abs, "invert": operator.invert,
          "trunc": math.trunc, "floor": math.floor, "ceil": math.ceil, "bool": bool}
_PINNED = ("index", "int", "float", "complex", "hash", "format", "str", "repr", "reduce", "reduce_ex")
"""Special methods answered by the plain value, pinned (Python looks them up on the class, not through
``__getattr__``)."""


def _install() -> None:
    for name, fn in _BINARY.items():
        setattr(Sym, f"__{name}__", (lambda f: lambda a, b: _apply(f, a, b))(fn))
        setattr(Sym, f"__r{name}__", (lambda f: lambda a, b: _apply(f, b, a))(fn))  # b (plain) on the left
    for name, fn in {**_COMPARE, **_UNARY}.items():
        setattr(Sym, f"__{name}__", (lambda f: lambda a, *b: _apply(f, a, *b))(fn))
    for name in _PINNED:
        setattr(Sym, f"__{name}__", (lambda nm: lambda a, *rest: getattr(_pinned(a), nm)(*rest))(f"__{name}__"))
    Sym.__round__ = lambda a, nd=None: _apply(round, a) if nd is None else _apply(round, a, nd)
    Sym.__divmod__ = lambda a, b: (a // b, a % b)
    Sym.__rdivmod__ = lambda a, b: (b // a, b % a)


_install()


def as_int(x: Any) -> Any:
    """``int(x)`` that stays symbolic (the learned file's sizes are evaluated through it)."""
    if type(x) is Sym:
        return x if type(x.v) is int else _apply(int, x)
    return int(x)


def start(b: int, s: int) -> tuple[Tape, Sym, Sym]:
    """A new tape and ``b``, ``s`` as its first two nodes."""
    tape = Tape()
    return tape, Sym(b, tape, 0), Sym(s, tape, 1)
