"""Expressions in learned architecture files: a small, safe subset of Python, compiled to closures.

Sizes and config rules in ``rulesets/architectures/*.json`` are written like Python expressions over
config fields, ``b`` (micro-batch), ``s`` (sequence length) and ``i`` (layer index)::

    b*s*hidden_size            num_attention_heads*head_dim + 2*num_key_value_heads*head_dim
    hidden_size//num_attention_heads        int(head_dim*partial_rotary_factor)
    layer_types[i] == "sliding_attention"    i >= first_k_dense_replace
    head_dim if head_dim is not None else hidden_size//num_attention_heads

Grammar: literals (int, float, string, True/False/None), names, ``+ - * / // % **``, comparisons
(``== != < <= > >= in``, ``not in``, ``is None``, ``is not None``), ``and or not``, ``x if c else y``,
subscripts ``name[expr]``, parentheses and the functions ``int min max len ceil_div pow2_floor pow2_ceil``
(the power of two at or below / at or above a positive integer: ALiBi's slopes are built for the power of two
nearest the head count, transformers 5.24 modeling_bloom.py ``_get_alibi_slopes``, modeling_mpt.py
``build_mpt_alibi_tensor``) and ``last_index(L, x, n)``: the last index ``j < n`` with ``L[j] == x``, -1 if none
(the layer that stores its kind's K/V for the shared layers after it: Gemma-4's and Gemma-3n's
``kv_sharing_modes``, the last layer of each of ``layer_types[:num_hidden_layers - num_kv_shared_layers]``'s
kinds, transformers 5.24 models/gemma4/configuration_gemma4.py). Nothing else is accepted (rules are data, never ``eval``). Compiled once per file and cached; evaluation is a call.
"""

from __future__ import annotations

import functools
import operator
import re
from typing import Any, Callable

from fitplan.errors import FitplanError

_TOKEN = re.compile(r"\s*(?:(\d+\.\d*(?:e[-+]?\d+)?|\d+(?:e[-+]?\d+)?)|([A-Za-z_][A-Za-z_0-9]*)|(\"[^\"]*\"|'[^']*')|"
                    r"(//|\*\*|==|!=|<=|>=|[-+*/%()<>\[\],]))")
_BINARY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow, "==": operator.eq, "!=": operator.ne, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
_PREC = {"or": 1, "and": 2, "not": 3, "in": 4, "not in": 4, "is": 4, "is not": 4, "==": 4, "!=": 4, "<": 4, "<=": 4,
         ">": 4, ">=": 4, "+": 5, "-": 5, "*": 6, "/": 6, "//": 6, "%": 6, "**": 8}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_floor(n: int) -> int:
    return 1 << (int(n).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def last_index(seq: Any, x: Any, n: int) -> int:
    """The last index ``j < n`` (``n`` clipped to ``len(seq)``; a negative ``n`` selects none) with ``seq[j] ==
    x``, or -1."""
    for j in range(min(int(n), len(seq)) - 1, -1, -1):
        if seq[j] == x:
            return j
    return -1


_FUNCS: dict[str, Callable[..., Any]] = {"int": int, "min": min, "max": max, "len": len, "ceil_div": _ceil_div,
                                         "bool": bool, "float": float, "pow2_floor": _pow2_floor,
                                         "pow2_ceil": _pow2_ceil, "last_index": last_index}
Env = dict[str, Any]


class ExprError(FitplanError):
    pass


def _tokens(src: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    src = src.strip()
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None or m.end() == pos:
            raise ExprError(f"cannot read expression {src!r} at {src[pos:]!r}")
        num, name, string, op = m.groups()
        pos = m.end()
        if num is not None:
            out.append(("num", float(num) if ("." in num or "e" in num) else int(num)))
        elif name is not None:
            if name in ("and", "or", "not", "if", "else", "in", "is", "True", "False", "None"):
                out.append(("kw", name))
            else:
                out.append(("name", name))
        elif string is not None:
            out.append(("str", string[1:-1]))
        else:
            out.append(("op", op))
    return out


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.toks = _tokens(src)
        self.i = 0

    def peek(self) -> tuple[str, Any] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, Any]:
        t = self.peek()
        if t is None:
            raise ExprError(f"unexpected end of expression {self.src!r}")
        self.i += 1
        return t

    def expect(self, kind: str, value: Any) -> None:
        t = self.take()
        if t != (kind, value):
            raise ExprError(f"expected {value!r} in {self.src!r}, got {t[1]!r}")

    def parse(self) -> Callable[[Env], Any]:
        f = self.ternary()
        if self.peek() is not None:
            raise ExprError(f"unexpected {self.peek()[1]!r} in {self.src!r}")
        return f

    def ternary(self) -> Callable[[Env], Any]:
        a = self.binary(1)
        if self.peek() == ("kw", "if"):
            self.take()
            c = self.binary(1)
            self.expect("kw", "else")
            b = self.ternary()
            return lambda e: a(e) if c(e) else b(e)
        return a

    def _binop(self) -> str | None:
        t = self.peek()
        if t is None:
            return None
        if t[0] == "op" and t[1] in _PREC:
            return t[1]
        if t[0] == "kw" and t[1] in ("and", "or", "in", "is"):
            if t[1] == "is" and self.i + 1 < len(self.toks) and self.toks[self.i + 1] == ("kw", "not"):
                return "is not"
            return t[1]
        if t == ("kw", "not") and self.i + 1 < len(self.toks) and self.toks[self.i + 1] == ("kw", "in"):
            return "not in"
        return None

    def binary(self, min_prec: int) -> Callable[[Env], Any]:
        left = self.unary()
        while True:
            op = self._binop()
            if op is None or _PREC[op] < min_prec:
                return left
            self.take()
            if op in ("is not", "not in"):
                self.take()
            right = self.binary(_PREC[op] + (0 if op == "**" else 1))
            left = self._combine(op, left, right)

    @staticmethod
    def _combine(op: str, a, b) -> Callable[[Env], Any]:
        if op == "and":
            return lambda e: a(e) and b(e)
        if op == "or":
            return lambda e: a(e) or b(e)
        if op == "in":
            return lambda e: a(e) in (b(e) or ())
        if op == "not in":
            return lambda e: a(e) not in (b(e) or ())
        if op == "is":
            return lambda e: a(e) is b(e)
        if op == "is not":
            return lambda e: a(e) is not b(e)
        f = _BINARY[op]
        return lambda e: f(a(e), b(e))

    def unary(self) -> Callable[[Env], Any]:
        t = self.peek()
        if t == ("op", "-"):
            self.take()
            a = self.unary()
            return lambda e: -a(e)
        if t == ("kw", "not"):
            self.take()
            a = self.binary(_PREC["not"])
            return lambda e: not a(e)
        return self.postfix(self.atom())

    def postfix(self, f: Callable[[Env], Any]) -> Callable[[Env], Any]:
        while self.peek() == ("op", "["):
            self.take()
            idx = self.ternary()
            self.expect("op", "]")
            f = (lambda g, k: lambda e: g(e)[k(e)])(f, idx)
        return f

    def atom(self) -> Callable[[Env], Any]:
        kind, v = self.take()
        if kind == "num" or kind == "str":
            return lambda e, v=v: v
        if kind == "kw" and v in ("True", "False", "None"):
            c = {"True": True, "False": False, "None": None}[v]
            return lambda e: c
        if kind == "op" and v == "(":
            f = self.ternary()
            self.expect("op", ")")
            return f
        if kind == "name":
            if self.peek() == ("op", "("):
                fn = _FUNCS.get(v)
                if fn is None:
                    raise ExprError(f"unknown function {v!r} in {self.src!r}", suggestion="one of " + ", ".join(_FUNCS))
                self.take()
                args = []
                if self.peek() != ("op", ")"):
                    args.append(self.ternary())
                    while self.peek() == ("op", ","):
                        self.take()
                        args.append(self.ternary())
                self.expect("op", ")")
                return lambda e: fn(*(a(e) for a in args))
            name = v

            def look(e: Env, name: str = name) -> Any:
                try:
                    return e[name]
                except KeyError:
                    raise ExprError(f"unknown name {name!r} in an architecture expression",
                                    field=name) from None
            return look
        raise ExprError(f"unexpected {v!r} in {self.src!r}")


@functools.lru_cache(maxsize=65536)
def compile_expr(src: str | int | float) -> Callable[[Env], Any]:
    """Compile ``src`` (an expression string, or a number) to a function of an environment dict."""
    if isinstance(src, (int, float)):
        return lambda e, v=src: v
    if re.fullmatch(r"\d+", src):
        v = int(src)
        return lambda e: v
    if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", src) and src not in ("True", "False", "None"):
        return lambda e: e[src]
    return _Parser(src).parse()


def evaluate(src: str | int | float, env: Env) -> Any:
    return compile_expr(src)(env)
