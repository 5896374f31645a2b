"""A sequence padded to a constant chunk: learned across chunks, in a regime of its own (issue #32).

The gated delta rule (transformers 5.24 modeling_qwen3_next.py ``torch_chunk_gated_delta_rule``, also olmo_hybrid,
qwen3_5, qwen3_5_moe, lara_mini) takes ``chunk_size=64`` as a default argument that no config field sets: it pads
the sequence by ``pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size`` (``F.pad``, aten
``constant_pad_nd``), reshapes to ``[b, heads, n_chunks, 64, d]`` and then loops over the chunks in Python::

    for i in range(num_chunks):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ last_recurrent_state
        ...
        last_recurrent_state = last_recurrent_state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new

At the learner's usual probes (``s`` = 14 to 22) every sequence is one chunk: the loop runs once, the padded length
is the constant 64, and the learned graph holds for ``s <= 64`` only (:mod:`.seqbound`). The shrink cannot move a
constant, so the probes must: :func:`chunk_switch` finds a pad whose output length stays the same constant ``C``
while the sequence moves (``C`` no config field's value: a chunk field is shrunk and probed like any size) and
returns two regimes of the sequence length:

- ``s > C``, recorded at ``(MIN_RUN + 1)·C - 2`` (:attr:`.derive.Regime.seq`): every probe (``s - 2`` to ``s + 6``)
  runs at least ``MIN_RUN + 1`` chunks, so the loop folds (:mod:`.seqloop`: the first chunk reads the
  ``torch.zeros`` state, which needs no grad, and stays as recorded; at least ``MIN_RUN`` identical ones follow),
  and the probes cross a chunk boundary (``4·C - 4`` to ``4·C + 4``), so the padded length fits
  ``C*ceil_div(s, C)``, the chunk count ``ceil_div(s, C)`` and the fold's count ``ceil_div(s, C) - 1``
  (:func:`fit_count`);
- ``s <= C``, recorded at the learner's ``s``: one chunk, no iteration after the first (the graph differs from the
  other regime's by the loop's ops).

At ``s`` a multiple of ``C`` the model slices nothing off the padded output (aten records ``alias`` where it
records ``slice`` otherwise: views, no storage and no work), so the ``s > C`` graph serves it as it is.
"""

from __future__ import annotations

from typing import Any


def _pad_lengths(rec, s: int) -> set[int]:
    """The lengths the pads of ``rec`` (recorded at sequence ``s``) pad a dimension of length ``s`` up to."""
    from .seqbound import _pad_op

    out = set()
    for op in rec.ops:
        if not _pad_op(op["name"]) or not op["outs"]:
            continue
        src = next((v for _, v in op["args"] if isinstance(v, int) and 0 <= v < len(rec.tensors)), None)
        if src is None:
            continue
        a, b = rec.tensors[src]["shape"], rec.tensors[op["outs"][0]]["shape"]
        if len(a) == len(b):
            out.update(db for da, db in zip(a, b) if da == s and db > s)
    return out


def constant_chunks(base: dict[str, Any], variant: tuple[str, str], b: int, s: int) -> list[int]:
    """The chunks ``C`` the model pads a sequence of ``s`` and of ``s + 4`` up to alike (a constant) that no
    config field sets (a field's chunk is probed as a size: Mamba-2's ``chunk_size``)."""
    from .derive import run

    lengths = [_pad_lengths(run(base, *variant, b, n), n) for n in (s, s + 4)]
    return sorted(c for c in lengths[0] & lengths[1] if not _set_by_field(base, variant, b, s, c))


def _set_by_field(base: dict[str, Any], variant: tuple[str, str], b: int, s: int, c: int) -> bool:
    """Whether a config field of value ``c`` moves the pad's length when it changes (the first other value of it
    the model runs with decides; a field the model runs with at no other value decides nothing)."""
    from .derive import alternatives, run

    for k, v in base.items():
        if v != c or isinstance(v, bool) or not isinstance(v, int):
            continue
        for alt in alternatives(k, v)[:3]:
            try:
                moved = c not in _pad_lengths(run({**base, k: alt}, *variant, b, s), s)
            except Exception:  # noqa: BLE001 - the model does not take this value: try another
                continue
            if moved:
                return True
            break
    return False


def chunk_switch(base: dict[str, Any], variant: tuple[str, str], b: int, s: int, log) -> list[Any] | None:
    """The switch ``[s > C (several chunks), s <= C (one)]`` for the largest constant chunk ``C`` (module doc), or
    None where the model pads to no constant chunk or cannot be recorded."""
    from .derive import Regime
    from .seqloop import MIN_RUN

    try:
        chunks = constant_chunks(base, variant, b, s)
    except Exception:  # noqa: BLE001 - the model does not run at these lengths: no such regime learned
        return None
    if not chunks:
        return None
    c = chunks[-1]
    seq = (MIN_RUN + 1) * c - 2
    log(f"  the sequence is padded to a multiple of a constant chunk {c}: learned as two regimes, s <= {c} "
        f"(one chunk) and s > {c} (recorded at s = {seq})")
    return [Regime(f"chunks-{c}", f"s > {c}", valid=lambda cfg, bb, ss: ss > c, seq=seq),
            Regime(f"one-chunk-{c}", f"s <= {c}", valid=lambda cfg, bb, ss: ss <= c)]


def fit_count(fitter, counts: list[int]) -> str:
    """The expression of a folded loop's repetition count: the fitted one, or (where none fits) the loop's trip
    count fitted and the first iteration taken off, which the fold keeps as recorded (:mod:`.seqloop`: its state
    is the loop's constant initial one): ``ceil_div(s, 64) - 1`` for the gated delta rule's loop over chunks."""
    from .fit import FitError

    try:
        return fitter.fit(counts)
    except FitError:
        try:
            trips = fitter.fit([n + 1 for n in counts])
        except FitError:
            raise FitError(f"no expression fits the counts {counts}, nor one more than each") from None
        return f"{trips} - 1"  # a sum or difference less one reads the same without parentheses


def chunked_product(fitter, deps: frozenset, y: tuple[int, ...]) -> str | None:
    """``m*ceil_div(v, d)``: a size that counts every chunk, for a constant chunk ``d`` a padded length was fitted
    with (``fitter.chunks``) and a monomial ``m`` over the other variables. The gated delta rule's ``matmul`` over
    ``[b, heads, n_chunks, 64, d]`` tensors views them as ``[b·heads·n_chunks, 64, d]`` (aten ``bmm``):
    ``b*linear_num_value_heads*ceil_div(s, 64)`` rows. None where no such form fits."""
    for d in fitter.chunks:
        for v in sorted(deps):
            quot = [-(-int(e[v]) // int(d)) for e in fitter.env]
            if any(q == 0 or n % q for q, n in zip(quot, y)):
                continue
            rest = deps - {v}
            per = tuple(n // q for q, n in zip(quot, y))
            m = fitter._monomial(rest, per) if rest else (str(per[0]) if len(set(per)) == 1 else None)
            if m is None:
                continue
            expr = f"ceil_div({v}, {d})" if m == "1" else f"{m}*ceil_div({v}, {d})"
            if fitter.check(expr, y):
                return expr
    return None
