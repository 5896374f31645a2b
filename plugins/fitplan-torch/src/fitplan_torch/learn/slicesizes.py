"""The length of a strided slice, written from the slice's own arguments and the size it cuts.

``x[..., start:end:step]`` (``aten::slice.Tensor(self, dim, start, end, step)``) keeps
``len(range(start, min(end, n), step))`` entries of a dimension of size ``n`` (torch 2.13
torch/_decomp/decompositions.py ``slice_forward``, as ATen's ``slice``: start and end clamped to ``[0, n]``, an end
below the start made the start, the length ``(end - start + step - 1) // step``). Such a length moves in steps of ``step`` as ``n`` grows, so a fit over the
probes' values alone either finds no expression (Cohere Compass's rotary frequencies interleaved for three
position axes, ``freqs[..., 1:60:3]`` over ``head_dim // 2`` entries: 3, 4 and 6 at head dims 16, 24 and 36), sees
it change at no single variable's probe (Qwen3.5, ``freqs[..., 1:33:3]`` over
``int(head_dim * partial_rotary_factor) // 2`` entries: 1 wherever that is at most 4, 2 at the joint probe's 6),
or, worse, fits a formula that agrees with the probes and not at other sizes (``ceil_div(head_dim//2, 3)`` agrees
with ``ceil_div(head_dim//2 - 1, 3)`` at 8, 12 and 18 entries and not at 64: the probes never reach every residue of
the step, nor the clamp at ``end``). The slice's arguments are in the recording; only ``n`` is a size to fit
(transformers 5.24 models/cohere_compass/modeling_cohere_compass.py and models/qwen3_5/modeling_qwen3_5.py
``recomposition_frequencies``: ``slice(offset, mrope_section[dim] * 3, 3)``).
"""

from __future__ import annotations

from typing import Any

from .fit import FitError, Fitter

SLICE_OP = "slice.Tensor"
OPEN_END = 2**62  # ``x[a::c]`` passes the largest int64 as its end


def slice_length(n: str, start: int, end: int, step: int) -> str:
    """The expression for ``len(range(start, min(end, n), step))`` with ``n`` an expression (start, end >= 0)."""
    stop = f"({n})" if end >= OPEN_END else f"min({end}, {n})"
    if step == 1:
        return stop if start == 0 else f"max(0, {stop} - {start})"
    return f"max(0, ceil_div({stop} - {start}, {step}))"


def _op_of(seg: dict[str, Any], k: int) -> list | None:
    for op in seg["ops"]:
        if f"t{k}" in op[2]:
            return op
    return None


def _args(op: list, rec: Any, rank: int) -> tuple[int, int, int, int] | None:
    """``(dim, start, end, step)`` of a slice op as recorded (``rec.ops[i]["bounds"]``, :mod:`.record`), the
    dimension made non-negative; None where a bound is negative (counted from the end: another formula) or was
    not recorded."""
    bounds = rec.ops[op[4]].get("bounds") if len(op) > 4 and op[4] < len(rec.ops) else None
    if not bounds:
        return None
    start, end, step = bounds
    dim = (op[3].get("sc") or {}).get("dim", 0)
    start = 0 if start is None else start
    end = OPEN_END if end is None else min(end, OPEN_END)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (dim, start, end, step)):
        return None
    if start < 0 or end < 0 or step < 1:
        return None
    return dim % rank if rank else dim, start, end, step


def sliced_size(segs: list[dict[str, Any]], recs: list, k: int, d: int, fitter: Fitter, strided: bool = False) -> str | None:
    """The size of dimension ``d`` of tensor ``t{k}`` (``segs``: the same segment at every probe, ``recs`` the
    probes' recordings) where a slice
    created it along ``d`` with the same arguments at every probe and cut a tensor of the same segment: the
    slice's length over the fitted size it cut, checked against every probe; None otherwise. With ``strided``,
    only a slice whose step exceeds 1 (one with step 1 is asked only where no other expression fits: a plain
    fit of ``x[..., :r]`` is ``r`` or the cut size, as before)."""
    ops = [_op_of(s, k) for s in segs]
    if any(op is None or op[0] != SLICE_OP for op in ops):
        return None
    rank = len(segs[0]["tensors"][k][0])
    got = {_args(op, rec, rank) for op, rec in zip(ops, recs)}
    if len(got) != 1 or None in got:
        return None
    dim, start, end, step = got.pop()
    if strided and step == 1:
        return None
    src = ops[0][1][0][1] if ops[0][1] and isinstance(ops[0][1][0], list) else None
    if dim != d or not (isinstance(src, str) and src[:1] == "t" and src[1:].isdigit()):
        return None
    j = int(src[1:])
    try:
        n = fitter.fit([s["tensors"][j][0][d] for s in segs])
    except (FitError, IndexError):
        return None
    expr = slice_length(n, start, end, step)
    y = tuple(int(s["tensors"][k][0][d]) for s in segs)
    return expr if fitter.check(expr, y) else None
