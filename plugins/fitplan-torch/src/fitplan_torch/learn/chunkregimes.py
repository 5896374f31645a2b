"""Chunked scans learned across chunks: the sequence padded to a multiple of a config's chunk field (issue #32;
a chunk that is a constant of the model's code, the gated delta rule's 64, is :mod:`.constchunk`'s).

Mamba-2's ``torch_forward`` (transformers 5.24 modeling_mamba2.py ``torch_forward``; the same code in nemotron_h, bamba,
falcon_h1, granitemoehybrid, zamba2) pads the sequence by ``pad_size = (chunk_size - seq_len % chunk_size) %
chunk_size`` (``pad_tensor_by_size``: ``F.pad``, aten ``constant_pad_nd``), reshapes to ``[b, ceil(s / chunk_size),
chunk_size, ...]`` and slices the output back ``y[:, :seq_len]`` only ``if pad_size > 0``. With the config's chunk
(256) above every probed sequence, the probes saw one chunk, and the file held for ``s <= chunk_size`` only
(:mod:`.seqbound`).

:func:`padded_chunk` finds a chunk field from the recording itself (no field name is assumed): a ``constant_pad_nd``
pads a sequence dimension ``s`` up to ``P``; the variables ``f`` whose value pads ``s`` to ``P`` (``f *
ceil(s / f) == P``) are tried at a small value, and the one that moves ``P`` to its own multiple is the chunk.
It returns the switch ``[s <= f, s > f and s % f != 0, s > f and s % f == 0]`` (:class:`.derive.Regime` states):

- one chunk (``f`` set to twice the base sequence): the einsums of ``torch_forward`` (torch 2.13 ``at::einsum``:
  ``sumproduct_pair`` permutes and reshapes each operand to a ``bmm``) reshape a permuted tensor whose chunk
  dimension is 1, a view, where two chunks or more copy it (``clone`` + ``_unsafe_view``): its own graph, the one
  the probes below one chunk learned before, its padded length ``f`` (:mod:`.seqbound` also writes ``s <= f``);
- padded, two chunks or more: the base is set to 2 to 3 chunks (``f`` = 6 at s = 16: 18 rows in 3 chunks) and the
  chunk probe takes a value that moves both the padded length and the chunk count (:func:`moving_chunks`; the probe
  at 9 would pad 16 to 18 as well, so the fitter would see no dependence on ``f``);
- unpadded (``y[:, :seq_len]`` is not taken), two chunks or more: ``f`` divides ``s`` (the smallest divisor above
  1: every probed sequence of the learner, 14 to 22, is even, and the held-out 21 takes ``f`` = 3).

The fitter writes the padded length ``f*ceil_div(s, f)`` and the chunk count ``ceil_div(s, f)`` (:mod:`.fit`).
"""

from __future__ import annotations

import math
from typing import Any

PADDED_CHUNKS = (2, 3)
"""The chunk counts of the padded regime's base (the smallest chunk above 4 that pads the base sequence to 2 or 3)."""


def _pad_lengths(rec, s: int) -> set[int]:
    """The lengths ``constant_pad_nd`` pads a dimension of size ``s`` up to (same rank, one dimension grown)."""
    out = set()
    for o in rec.ops:
        if not o["name"].startswith("constant_pad") or not o["outs"] or not o["args"]:
            continue
        src = o["args"][0][1]
        if not isinstance(src, int):
            continue
        a, b = rec.tensors[src]["shape"], rec.tensors[o["outs"][0]]["shape"]
        if len(a) == len(b):
            out |= {y for x, y in zip(a, b) if x == s and y > s}
    return out


def padded_base(s: int) -> int:
    """The chunk that pads ``s`` into 2 or 3 chunks, not dividing it (6 at s = 16)."""
    return next(c for c in range(5, s) if s % c and math.ceil(s / c) in PADDED_CHUNKS)


def even_base(s: int) -> int:
    """The smallest divisor of ``s`` above 1 (2 at s = 16)."""
    return next(c for c in range(2, s + 1) if s % c == 0)


def moving_chunks(val: int, s: int, default: list[int]) -> list[int]:
    """Values of the chunk that keep ``s`` padded and move both its padded length and its chunk count (from ``val``
    at ``s``), in 2 chunks or more: 12 from 6 at s = 16 (24 rows in 2 chunks, from 18 in 3); ``default``'s order
    first."""
    n, p = math.ceil(s / val), val * math.ceil(s / val)
    ok = [c for c in default + list(range(2, s)) if c > 1 and s % c
          and math.ceil(s / c) != n and c * math.ceil(s / c) != p]
    return list(dict.fromkeys(ok))


def dividing_chunks(val: int, s: int, default: list[int]) -> list[int]:
    """Divisors of ``s`` other than ``val``, above 1 and below ``s`` (two chunks or more): ``default``'s order
    first."""
    ok = [c for c in default + list(range(2, s)) if 1 < c < s and c != val and s % c == 0]
    return list(dict.fromkeys(ok))


def chunk_field(base: dict[str, Any], variables: list[str], variant: tuple[str, str], b: int, s: int) -> str | None:
    """The variable the sequence is padded to a multiple of (module doc), or None."""
    from .derive import run

    lengths = _pad_lengths(run(base, *variant, b, s), s)
    for f in variables:
        v = base.get(f)
        if type(v) is not int or v <= 1 or not any(v * math.ceil(s / v) == p for p in lengths):
            continue
        c = padded_base(s)
        try:
            moved = _pad_lengths(run({**base, f: c}, *variant, b, s), s)
        except Exception:  # noqa: BLE001 - the class or the model refuses this chunk: not learnable here
            continue
        if c * math.ceil(s / c) in moved:
            return f
    return None


def padded_chunk(base: dict[str, Any], variables: list[str], variant: tuple[str, str], b: int, s: int,
                 log) -> list[Any] | None:
    """The switch ``[padded, unpadded]`` over a chunk field (module doc), or None where nothing is padded to one."""
    from .derive import Regime

    f = chunk_field(base, variables, variant, b, s)
    if f is None:
        return None
    log(f"  {f}: the sequence is padded to a multiple of it: learned across chunks, padded (s % {f} != 0) and not")

    def alts(pick):
        return lambda name, val, ss, default: pick(val, ss, default) if name == f else None

    return [Regime("chunk-one", f"s <= {f}", lambda cfg, bb, ss: {**cfg, f: max(cfg[f], 2 * ss)},
                   valid=lambda cfg, bb, ss: ss <= cfg[f]),
            Regime("chunk-padded", f"s > {f} and s % {f} != 0", lambda cfg, bb, ss: {**cfg, f: padded_base(ss)},
                   valid=lambda cfg, bb, ss: ss > cfg[f] and ss % cfg[f] != 0, alts=alts(moving_chunks)),
            Regime("chunk-even", f"s > {f} and s % {f} == 0", lambda cfg, bb, ss: {**cfg, f: even_base(ss)},
                   valid=lambda cfg, bb, ss: ss > cfg[f] and ss % cfg[f] == 0, alts=alts(dividing_chunks))]
