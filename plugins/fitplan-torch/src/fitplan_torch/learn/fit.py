"""Symbolic sizes: every traced dimension written in terms of config fields, batch and sequence.

The learner records the same model at several sizes (probes): a base, one probe per variable where only
that variable changes, and joint probes where all change. A dimension is the vector of its values over
the probes. Its dependencies are the variables whose own probe changed it; the fit then searches, in
order, for the simplest expression over exactly those variables that reproduces the whole vector:

1. a constant (no dependency);
2. ``c · Π vᵢ^eᵢ`` (exponents -1, 1, 2; c a small integer or a half);
3. ``int(f · m)`` for a float field f (``partial_rotary_factor``) and a monomial m, halved, doubled or rounded up
   to even (``arange(0, int(f·m), 2)``), or what it leaves of m (``m - 2·ceil_div(int(f·m), 2)``);
4. a sum of two such terms (``(heads + 2·kv_heads)·head_dim``, ``s + 1``); before it, ``ceil_div(c·m, d)``, a
   count rounded up (the first expert's rows under balanced routing, :mod:`.routing`; a chunked scan's chunk
   count, also of a constant chunk a padded length was fitted with), and ``d*ceil_div(m, d)``, a length padded up to a multiple of a chunk (Mamba-2's chunked scan);
5. ``C // v``, a held size over one variable (Mamba-2's heads per group with the heads held);
6. a sum of three terms, each a small integer times a product of at most two fields (Mamba-2's ``in_proj``),
   then the same plus or minus 1 or 2 (ZAYA's convolution pad ``s + cca_time0 + cca_time1 - 2``);
7. a width rounded up to a multiple of a field, ``d·ceil_div(x, d)`` (xLSTM's ``round_up_to_next_multiple_of``);
8. a power of two near one variable (``pow2_floor(n_head)``, ``n_head - pow2_floor(n_head)``: ALiBi's
   slopes for a head count that is no power of two, learned in their own regime, :mod:`.sizeregimes`);
9. last, a product of the variables divided by a field the learner held (DBRX's ``d_model//n_heads//2``).

A strided slice's length is written from the slice's own bounds before any of these (:mod:`.slicesizes`).

A wrong expression would have to agree with every probe, including the joint ones; the learner then
checks the whole file against a fresh recording at sizes no probe used (:mod:`.verify`).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

from .constchunk import chunked_product

COEFFS = {Fraction(c) for c in (1, 2, 3, 4, 5, 6, 8, 12, 16, 32)} | {Fraction(1, 2), Fraction(1, 4), Fraction(3, 2),
                                                                  Fraction(3, 4)}


class FitError(ValueError):
    pass


def _too_big(c: Fraction, mono: tuple) -> bool:
    """A coefficient above 64 is no size relation, except an integer constant term: the held sizes a sum
    carries (Bamba's ``in_proj`` width ``2·intermediate + n_heads + 2·n_groups·d_state`` with the widths
    held is ``264 + 2·n_groups·d_state``)."""
    return abs(c) > 64 and (bool(mono) or c.denominator != 1)


def _fmt_mono(mono: tuple[tuple[str, int], ...]) -> str:
    num = []
    for v, e in mono:
        num.extend([v] * max(e, 0))
    s = "*".join(num) if num else "1"
    for v, e in mono:
        if e < 0:
            s += f"//{v}"
    return s


def _fmt(c: Fraction, mono: tuple[tuple[str, int], ...]) -> str | None:
    if not mono:
        return str(c.numerator) if c.denominator == 1 else None
    m = _fmt_mono(mono)
    neg = c < 0
    c = abs(c)
    if c == 1:
        s = m
    elif c.denominator == 1:
        s = f"{c.numerator}*{m}"
    elif c.numerator == 1:
        s = f"{m}//{c.denominator}"
    else:
        s = f"{c.numerator}*{m}//{c.denominator}"
    return "-" + s if neg else s


class Fitter:
    """Fits value vectors over a fixed set of probes (``env[0]`` is the base; ``single[v]`` the probe where
    only ``v`` changed); results are cached per vector."""

    def __init__(self, env: list[dict[str, Any]], single: dict[str, int], floats: list[str] = ()) -> None:
        self.env = env
        self.n = len(env)
        self.single = single
        self.floats = [f for f in floats if all(isinstance(e.get(f), float) for e in env)]
        self.cache: dict[tuple[int, ...], str] = {}
        self._monos: dict[frozenset, list] = {}
        self.chunks: list[str] = []
        """The constant chunks a padded length was fitted with (:meth:`_padded`): a chunk count divides by them."""

    def check(self, expr: str, y: tuple[int, ...]) -> bool:
        from fitplan.api import compile_expr

        f = compile_expr(expr)
        try:
            return all(f(e) == v for e, v in zip(self.env, y))
        except (ZeroDivisionError, TypeError, KeyError):
            return False

    def deps(self, y: tuple[int, ...]) -> frozenset:
        return frozenset(v for v, k in self.single.items() if y[k] != y[0])

    def _val(self, mono) -> tuple[Fraction, ...]:
        out = []
        for e in self.env:
            x = Fraction(1)
            for v, p in mono:
                x *= Fraction(e[v]) ** p
            out.append(x)
        return tuple(out)

    def monos(self, deps: frozenset, full: bool) -> list:
        key = (deps, full)
        got = self._monos.get(key)
        if got is not None:
            return got
        vs = sorted(deps)
        out = []
        subsets = [tuple(vs)] if full else [c for k in range(0, len(vs) + 1) for c in itertools.combinations(vs, k)]
        for combo in subsets:
            for exps in itertools.product((1, 2, -1), repeat=len(combo)):
                if sum(abs(x) for x in exps) > 4 or (combo and all(x < 0 for x in exps)):
                    continue
                mono = tuple(zip(combo, exps))
                out.append((mono, self._val(mono)))
        self._monos[key] = out
        return out

    def _ceil_quotient(self, deps: frozenset, y: tuple[int, ...]) -> str | None:
        """``ceil_div(c·m, d)``: a count rounded up, such as the rows of the first expert under the learner's
        balanced routing (:mod:`.routing`: k·b·s rows over E experts, the first gets ``ceil_div(k·b·s, E)``)."""
        for mono, _ in self.monos(deps, True):
            neg = [v for v, p in mono if p == -1]
            if len(neg) != 1:
                continue
            numer = tuple((v, p) for v, p in mono if p != -1)
            for c in (1, 2, 4):
                m = _fmt(Fraction(c), numer)
                if m is not None:
                    expr = f"ceil_div({m}, {neg[0]})"
                    if self.check(expr, y):
                        return expr
        for mono, _ in self.monos(deps, True):  # a count of constant chunks (a padded length fitted before)
            for d in self.chunks if all(p > 0 for _, p in mono) else ():
                expr = f"ceil_div({_fmt_mono(mono)}, {d})"
                if self.check(expr, y):
                    return expr
        return None

    def _padded(self, deps: frozenset, y: tuple[int, ...], depth: int = 2) -> str | None:
        """``r*ceil_div(m, d)``: a count of chunks of ``d`` in ``m``, times ``r`` (a monomial, or one more such count):
        Mamba-2's ``torch_forward`` (transformers 5.24 modeling_mamba2.py) pads the sequence by ``pad_size =
        (chunk_size - seq_len % chunk_size) % chunk_size`` (``pad_tensor_by_size``) and reshapes it to
        ``[b, ceil(s/chunk_size), chunk_size, ...]``: the padded length ``chunk_size*ceil_div(s, chunk_size)``
        (``d*ceil_div(m, d)``), the chunk tensors ``8*b*ceil_div(s, chunk_size)`` and the chunk-by-chunk states
        ``...*ceil_div(s, chunk_size)*ceil_div(s, chunk_size)``. ``m`` a product of the other variables; ``d`` a
        variable other than ``b`` and ``s``, a field the learner held, or a constant chunk (one a padded length was
        fitted with before, or a divisor above 1 of the values' common divisor, largest first, as a padded length
        only: the gated delta rule's 64, modeling_qwen3_next.py ``torch_chunk_gated_delta_rule``). ``m`` holds ``s``
        (chunks run along the sequence). Only where a probe rounded up (``m`` no multiple of ``d``) into two chunks
        or more: otherwise a monomial is the size."""
        held = [k for k, v in self.env[0].items() if k not in deps and k not in ("b", "s") and type(v) is int
                and v > 1 and all(e.get(k) == v for e in self.env)]
        g = math.gcd(*y)
        fresh = [str(d) for d in range(g, 1, -1) if g % d == 0 and str(d) not in self.chunks]
        for d in [v for v in sorted(deps) if v not in ("b", "s")] + held + self.chunks + fresh:
            dv = [int(d) if d.isdigit() else e[d] for e in self.env]
            for mono, val in self.monos(frozenset(deps - {d}), False):
                # chunks run along the sequence: m holds s, once
                if dict(mono).get("s") != 1 or any(p != 1 for _, p in mono) or all(v % w == 0 for v, w in zip(val, dv)):
                    continue
                got = self._count_times(y, mono, val, d, dv, depth, d in fresh)
                if got is not None:
                    if d.isdigit() and d not in self.chunks:
                        self.chunks.append(d)
                    return got
        return None

    def _count_times(self, y, mono, val, d: str, dv: list[int], depth: int, fresh: bool) -> str | None:
        """:meth:`_padded` for one count ``ceil_div(m, d)``, or one more than it: the chunk states with the initial
        state before them (modeling_mamba2.py ``torch_forward``: ``torch.cat([previous_states, states], dim=1)``, and
        ``segment_sum`` over that padded by one, ``[..., n + 1, n + 1]``). A constant chunk not seen before
        (``fresh``) only as a padded length ``d*ceil_div(m, d)``: a common divisor of a product is no chunk."""
        q0 = [-(-int(v) // w) for v, w in zip(val, dv)]
        if max(q0) < 2:
            return None
        for off in (0,) if fresh else (0, 1):
            q = [c + off for c in q0]
            if any(x % c for x, c in zip(y, q)) or (fresh and any(x != c * w for x, c, w in zip(y, q, dv))):
                continue
            r = self._factor(tuple(x // c for x, c in zip(y, q)), depth)
            if r is None:
                continue
            count = f"ceil_div({_fmt_mono(mono)}, {d})"
            expr = (count if not off else f"{count} + {off}") if r == "1" else \
                f"{r}*{count}" if not off else f"{r}*({count} + {off})"
            if self.check(expr, y):
                return expr
        return None

    def _factor(self, r: tuple[int, ...], depth: int) -> str | None:
        """What multiplies a chunk count in :meth:`_padded`: a constant, a monomial, or (``depth`` > 1) a count."""
        deps = self.deps(r)
        if not deps:
            return str(r[0]) if len(set(r)) == 1 else None
        got = self._monomial(deps, r)
        return got if got is not None or depth < 2 else self._padded(deps, r, depth - 1)

    def _pow2(self, deps: frozenset, y: tuple[int, ...]) -> str | None:
        """A power of two at or near one variable ``v``: ``pow2_floor(v)``, ``pow2_ceil(v)``, half or twice
        either, or ``v`` minus the one below (transformers 5.24 modeling_bloom.py ``_get_alibi_slopes``: slopes for
        the power of two below the heads, then ``heads - pow2_floor(heads)`` more; modeling_mpt.py
        ``build_mpt_alibi_tensor``: ``2 ** ceil(log2(heads))`` slopes, every second one taken)."""
        if len(deps) != 1:
            return None
        v = next(iter(deps))
        for wrap in ("{x}", "{x}//2", "2*{x}", "{v} - {x}", "{x} - {v}"):
            for f in ("pow2_floor", "pow2_ceil"):
                expr = wrap.format(x=f"{f}({v})", v=v)
                if self.check(expr, y):
                    return expr
        return None

    def fit(self, values) -> str:
        y = tuple(int(v) for v in values)
        got = self.cache.get(y)
        if got is None:
            got = self._fit(y)
            self.cache[y] = got
        return got

    def companions(self, v: str) -> frozenset:
        """The variables that change with ``v`` in its own probe (the expert count in an expert-group count's probe,
        :func:`.routing.divisor_probe`); empty for a probe where ``v`` alone changes."""
        k = self.single[v]
        return frozenset(u for u in self.env[k] if u != v and u not in ("b", "s") and self.env[k][u] != self.env[0][u])

    def _fit(self, y: tuple[int, ...]) -> str:
        deps = self.deps(y)
        # where v's own probe moved its companions too (:meth:`companions`), a size that changed there may not
        # depend on v (it changed through them: ``fewer``), and one that did not may (a quotient the probe keeps,
        # experts per group: ``more``). Monomials over fewer, then over the size's own variables, then over more;
        # the wider forms last (a sum or a power of two over other variables would fit a few probes by chance)
        loose = sorted(v for v in deps if self.companions(v) and self.companions(v) <= deps)
        fewer = [deps - set(drop) for k in range(len(loose), 0, -1) for drop in itertools.combinations(loose, k)]
        more = [deps | {v} for v in sorted(self.single) if v not in deps and self.companions(v) & deps]
        for d in fewer + [deps] + more:
            got = self._monomial(d, y) if d else None
            if got is not None:
                return got
        try:
            return self._fit_over(deps, y)
        except FitError:
            for d in fewer + more:
                try:
                    return self._fit_over(d, y)
                except FitError:
                    continue
            raise

    def _fit_over(self, deps: frozenset, y: tuple[int, ...]) -> str:
        if not deps:
            if len(set(y)) == 1:
                return str(y[0])
            raise FitError(f"values {list(y)} change across probes but with no single variable")
        best = self._monomial(deps, y)
        if best is not None:
            return best
        best = self._ceil_quotient(deps, y)
        if best is not None:
            return best
        best = self._padded(deps, y)
        if best is not None:
            return best
        best = chunked_product(self, deps, y)
        if best is not None:
            return best
        return self._wider(deps, y)

    def _monomial(self, deps: frozenset, y: tuple[int, ...]) -> str | None:
        """``c · Π vᵢ^eᵢ`` over exactly ``deps`` (the shortest that fits), or None."""
        fy = tuple(Fraction(v) for v in y)
        best = None
        for mono, val in self.monos(deps, True):
            if val[0] == 0:
                continue
            c0 = fy[0] / val[0]
            # exact first; then every small coefficient, checked with the integer (floor) semantics the
            # expression has where HF divides sizes (hidden_size // num_attention_heads)
            for c in ([c0] if c0 in COEFFS else []) + sorted(COEFFS, key=lambda x: abs(x - c0)):
                s = _fmt(c, mono)
                if s is None or (best is not None and len(s) >= len(best)):
                    continue
                if self.check(s, y):
                    best = s
                    break
        return best

    def _wider(self, deps: frozenset, y: tuple[int, ...]) -> str:
        """The forms after a monomial and a rounded-up count (the module doc, 3 to 7)."""
        for f in self.floats:
            if f not in deps:
                continue
            rest = frozenset(deps - {f})
            for mono, val in (self.monos(rest, True) if rest else [((), None)]):
                inner = f"int({f}*{_fmt_mono(mono)})" if mono else f"int({f})"
                # rounded up: arange(0, int(f·m), 2) has ceil_div(int(f·m), 2) entries (MiMo-V2-Flash's inv_freq)
                for wrap in ("{x}", "{x}//2", "2*{x}", "{x}//4", "ceil_div({x}, 2)", "2*ceil_div({x}, 2)"):
                    expr = wrap.format(x=inner)
                    if self.check(expr, y):
                        return expr
                    # the rest of the width that the rotary part leaves: ``q[..., rotary_dim:]``
                    # (modeling_mimo_v2_flash.py ``apply_rotary_pos_emb``, rotary_dim = cos.shape[-1])
                    if mono and self.check(f"{_fmt_mono(mono)} - {expr}", y):
                        return f"{_fmt_mono(mono)} - {expr}"
        cand = self._sum2(deps, y)
        if cand is not None:
            return cand
        for off in (-1, 1, -2, 2):  # a causal convolution's output: s + d_conv - 1 (two terms and a constant)
            cand = self._sum2(deps, tuple(v - off for v in y))
            if cand is not None and self.check(f"{cand} {'-' if off < 0 else '+'} {abs(off)}", y):
                return f"{cand} {'-' if off < 0 else '+'} {abs(off)}"
        best = self._held_over(deps, y)
        if best is not None:
            return best
        cand = self._sum3(deps, y)
        if cand is not None:
            return cand
        for off in (-1, 1, -2, 2):  # two causal convolutions in a row: s + (k0 - 1) + (k1 - 1) (ZAYA's left pad)
            cand = self._sum3(deps, tuple(v - off for v in y))
            if cand is not None and self.check(f"{cand} {'-' if off < 0 else '+'} {abs(off)}", y):
                return f"{cand} {'-' if off < 0 else '+'} {abs(off)}"
        cand = self._round_up(deps, y)
        if cand is not None:
            return cand
        cand = self._pow2(deps, y)  # last: only where no arithmetic of the sizes fits
        if cand is not None:
            return cand
        cand = self._over_held_field(deps, y)
        if cand is not None:
            return cand
        raise FitError(f"no expression over {sorted(deps)} fits the values {list(y)}")

    def _held_over(self, deps: frozenset, y: tuple[int, ...]) -> str | None:
        """``C // v``: a held size divided by one variable, rounded down (Mamba-2's heads per group,
        ``num_heads // n_groups`` with the heads held by the learner: ``repeat_interleave(num_heads // num_groups,
        ...)`` in transformers/models/mamba2/modeling_mamba2.py ``mamba2_chunk_scan``, 5.24). ``C`` is every
        integer whose quotient by the base value gives the base size (the smallest that fits every probe)."""
        if len(deps) != 1:
            return None
        (v,) = deps
        x0 = self.env[0][v]
        if type(x0) is not int or x0 <= 0:
            return None
        for c in range(max(y[0] * x0, 1), (y[0] + 1) * x0):
            if self.check(f"{c}//{v}", y):
                return f"{c}//{v}"
        return None

    def _over_held_field(self, deps: frozenset, y: tuple[int, ...]) -> str | None:
        """A product of the size's variables divided by a field the learner held (the same at every probe, so no
        probe sees it move), or by half or twice it: DBRX's rotary frequencies, ``head_dim // 2`` entries with
        ``head_dim = d_model // n_heads`` and ``n_heads`` held (transformers 5.24 models/dbrx/modeling_dbrx.py
        ``DbrxAttention`` and ``compute_default_rope_parameters``: ``arange(0, dim, 2)``). Only a field named in the
        probes' environment, never a number chosen to fit. Rounded up, the first expert's rows under balanced
        routing with the expert count held (:mod:`.routing`: ``ceil_div(k·b·s, E)``; DBRX's ``torch.where`` over
        its expert mask, modeling_dbrx.py ``DbrxExperts.forward``)."""
        held = sorted(k for k, v in self.env[0].items()
                      if k not in self.single and k not in ("b", "s") and type(v) is int and v > 1
                      and all(e.get(k) == v for e in self.env))
        for mono, _ in self.monos(deps, True):
            if any(p < 0 for _, p in mono):
                continue
            m = _fmt_mono(mono)
            for h in held:
                for wrap in ("{m}//{h}", "{m}//{h}//2", "2*{m}//{h}", "ceil_div({m}, {h})"):
                    expr = wrap.format(m=m, h=h)
                    if self.check(expr, y):
                        return expr
        return None

    def _round_up(self, deps: frozenset, y: tuple[int, ...]) -> str | None:
        """``d·ceil_div(x, d)``: a width rounded up to a multiple of a field ``d``, ``x`` a monomial over the size's
        variables or ``int(f·monomial)`` for a float field f. xLSTM's feed-forward width
        (transformers 5.24 configuration_xlstm.py ``round_up_to_next_multiple_of(hidden_size * ffn_proj_factor,
        ffn_round_up_to_multiple_of)``, ``int(((x + m - 1) // m) * m)``, equal to ``m·ceil_div(int(x), m)`` for an
        integer m). Neither ``d`` nor ``f`` need be among the size's variables: their own probes may leave the
        rounded width where it was (64 -> 96 rounds 171 to 192 both times); the joint probes, where every
        variable moves, are what tell the expression."""
        ints = sorted(k for k, v in self.env[0].items() if k not in ("b", "s") and type(v) is int and v > 1
                      and k not in deps)
        inner = []
        for mono, _ in self.monos(deps, True):
            if mono and all(p > 0 for _, p in mono):
                inner.append(_fmt_mono(mono))
                inner += [f"int({f}*{_fmt_mono(mono)})" for f in self.floats]
        for x in inner:
            for d in ints:
                expr = f"{d}*ceil_div({x}, {d})"
                if self.check(expr, y):
                    return expr
        return None

    def _sum3(self, deps: frozenset, y: tuple[int, ...]) -> str | None:
        """A sum of three terms, each a small integer times a product of at most two fields (Mamba-2's ``in_proj``
        width ``2·expand·hidden + 2·n_groups·d_state + n_heads``: BambaMixer, NemotronHMamba2Mixer), or None."""
        parts = [(m, v) for m, v in self.monos(deps, False) if m and all(p == 1 for _, p in m) and len(m) <= 2]
        fy = tuple(Fraction(v) for v in y)
        for trio in itertools.combinations(parts, 3):
            if {v for m, _ in trio for v, _ in m} != set(deps):
                continue
            cs = self._solve3([v for _, v in trio], fy)
            if cs is None or any(c <= 0 or c.denominator != 1 or c > 8 for c in cs):
                continue
            expr = " + ".join(_fmt(c, m) for c, (m, _) in zip(cs, trio))
            if self.check(expr, y):
                return expr
        return None

    def _solve3(self, cols, fy) -> tuple[Fraction, ...] | None:
        """The coefficients ``c`` with ``Σ cₖ·colsₖ = fy`` on the first three probes whose rows are independent."""
        def det(m):
            return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                    + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
        for rows in itertools.combinations(range(self.n), 3):
            a = [[cols[k][r] for k in range(3)] for r in rows]
            d = det(a)
            if d == 0:
                continue
            out = []
            for k in range(3):
                ak = [[fy[r] if j == k else a[i][j] for j in range(3)] for i, r in enumerate(rows)]
                out.append(det(ak) / d)
            return tuple(out)
        return None

    def _sum2(self, deps: frozenset, y: tuple[int, ...]) -> str | None:
        """The shortest sum of two terms ``c₁·m₁ + c₂·m₂`` over exactly ``deps`` that gives ``y``, or None."""
        fy = tuple(Fraction(v) for v in y)
        cand = None
        parts = self.monos(deps, False)
        for (m1, v1), (m2, v2) in itertools.combinations(parts, 2):
            used = {v for v, _ in m1} | {v for v, _ in m2}
            if used != set(deps):
                continue
            for i, j in itertools.combinations(range(self.n), 2):
                det = v1[i] * v2[j] - v1[j] * v2[i]
                if det != 0:
                    break
            else:
                continue
            c1 = (fy[i] * v2[j] - fy[j] * v2[i]) / det
            c2 = (v1[i] * fy[j] - v1[j] * fy[i]) / det
            if c1 == 0 or c2 == 0 or c1.denominator > 2 or c2.denominator > 2 or _too_big(c1, m1) or _too_big(c2, m2):
                continue
            t1, t2 = _fmt(c1, m1), _fmt(c2, m2)
            if t1 is None or t2 is None:
                continue
            s = f"{t1} - {t2[1:]}" if t2.startswith("-") else f"{t1} + {t2}"
            if (cand is None or len(s) < len(cand)) and self.check(s, y):
                cand = s
        return cand
