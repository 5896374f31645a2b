"""Folding a Python loop over the sequence into one repeated block that carries its state (docs/architectures.md,
"Repeated blocks").

A model that scans the sequence in Python records the ops of one iteration once per position. Mamba's reference
scan off CUDA (transformers 5.24 ``models/mamba/modeling_mamba.py``, the "Recurrent iteration" branch of the
selective scan that ``MambaMixer.slow_forward`` runs when ``mamba_ssm`` is not installed)::

    for index in range(seq_len):
        ssm_state = discrete_A[:, :, index] * ssm_state + deltaB_u[:, :, index]
        scan_output = torch.matmul(ssm_state.to(input_dtype), C[:, index, :].unsqueeze(-1))
        scan_outputs.append(scan_output[:, :, 0])
    scan_output = torch.stack(scan_outputs, dim=-1)

records, per position, ``select`` -> ``mul`` -> ``select`` -> ``add`` -> ... -> ``bmm`` -> ``select``: the same
ops with the same shapes, each iteration reading the state the one before made (the *carry*) and otherwise the
same tensors (``discrete_A``, the parameters), and one ``stack`` over every iteration's output. The first
iteration can differ (its state, ``torch.zeros``, needs no gradient, so its ``mul`` saves one tensor, the others
two): it stays as recorded, and the run of identical iterations after it is the loop.

:func:`fold_loops` finds every run of at least :data:`MIN_RUN` consecutive identical blocks inside one layer (same
ops, shapes, dtypes and saves; every argument either made in the same block at the same place, made in the block
before at the same place (the carry), or the very same tensor in every block) whose tensors are read after the run
only through lists that name every block's (the ``stack``), keeps the first block and writes it in
``rec.repeats`` with its count and ``carry``: ``{X: Y}``, in repetition ``r >= 1`` the body's reference to ``X``
(what the first repetition reads) means repetition ``r - 1``'s ``Y``. The count is fitted over the probes like any
size (``s - 1`` for Mamba), and the core unrolls it (``fitplan.arch.learned_repeat``): memory is every
iteration's saved tensors, time every iteration's work.

A storage that Python releases in a later iteration is released after the loop in the file (an upper bound);
the tensors a scan keeps alive are the ones autograd saves, released in the backward either way.
"""

from __future__ import annotations

from typing import Any

from .fold import _renumber
from .record import Recording

MIN_RUN = 3
"""The fewest identical iterations folded (the learner's probes record at least 12 positions)."""
MAX_BODY = 96
"""The longest iteration looked for."""


def fold_loops(rec: Recording) -> Recording:
    """``rec`` with every run of identical, chained iterations folded to its first (in place)."""
    if not hasattr(rec, "repeats"):
        rec.repeats, rec.param_repeats = [], {}
    deep = [_deep(rec, o) for o in rec.ops]
    made = {t: (i, m) for i, o in enumerate(rec.ops) for m, t in enumerate(o["outs"])}
    runs = []
    i = 0
    while i < len(rec.ops):
        run = _run_at(rec, deep, made, i)
        if run is None:
            i += 1
            continue
        runs.append(run)
        i = run["first"] + run["count"] * run["len"]
    if not runs:
        return rec
    removed: set[int] = set()
    for run in runs:
        _fold_run(rec, run, made, removed)
    _renumber(rec, removed, None)
    return rec


def _deep(rec: Recording, op: dict[str, Any]) -> tuple:
    outs = tuple((tuple(rec.tensors[t]["shape"]), rec.tensors[t]["dtype"]) for t in op["outs"])
    return (op["name"], outs, tuple(a for a, _ in op["args"]), len(op.get("saves", ())), op.get("layer"),
            op.get("site") is not None, bool(op.get("nograd")), bool(op.get("function")), bool(op.get("pseudo")),
            tuple(sorted((k, repr(v)) for k, v in op.get("scalars", {}).items())))


def _run_at(rec: Recording, deep: list[tuple], made: dict[int, tuple[int, int]], i: int) -> dict[str, Any] | None:
    n = len(rec.ops)
    for length in range(1, MAX_BODY + 1):
        if i + MIN_RUN * length > n:
            return None
        if deep[i] != deep[i + length] or deep[i:i + length] != deep[i + length:i + 2 * length]:
            continue  # the first op's comparison alone rules out most lengths
        k = 2
        while i + (k + 1) * length <= n and deep[i:i + length] == deep[i + k * length:i + (k + 1) * length]:
            k += 1
        while k >= MIN_RUN:
            run = _chained(rec, made, i, length, k)
            if run is not None:
                return run
            k -= 1
    return None


def _refs(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def _chained(rec: Recording, made: dict[int, tuple[int, int]], first: int, length: int, k: int) -> dict[str, Any] | None:
    """The run of ``k`` blocks of ``length`` ops at ``first`` as a loop (its carry), or None where a block reads
    anything but its own tensors, the block before's (at the same place) and what every block reads."""
    if any(rec.ops[first + p].get("site") is not None or rec.ops[first + p].get("function") for p in range(length)):
        return None  # an nn.Linear or an autograd Function in the loop: not folded
    end = first + k * length

    def place(t: Any, j: int) -> tuple[int, int] | None:
        """Where block ``j`` made tensor ``t`` (its op's position in the block, the output), or None."""
        at = made.get(t) if isinstance(t, int) else None
        if at is None or not first + j * length <= at[0] < first + (j + 1) * length:
            return None
        return at[0] - first - j * length, at[1]

    carry: dict[Any, tuple[int, int]] = {}
    same: set[Any] = set()  # what every block reads as it is
    for p in range(length):
        args0 = rec.ops[first + p]["args"]
        for j in range(1, k):
            argsj = rec.ops[first + j * length + p]["args"]
            for (_, v0), (_, vj) in zip(args0, argsj):
                r0, rj = _refs(v0), _refs(vj)
                if len(r0) != len(rj):
                    return None
                for t0, tj in zip(r0, rj):
                    own0, ownj, prev = place(t0, 0), place(tj, j), place(tj, j - 1)
                    if own0 is not None and own0 == ownj:
                        continue
                    if own0 is None and prev is not None:
                        if carry.setdefault(t0, prev) != prev:
                            return None
                        continue
                    if t0 == tj and not first <= made.get(t0, (-1, 0))[0] < end:
                        same.add(t0)
                        continue
                    return None
    if set(carry) & same:
        return None  # the first block reads its initial state elsewhere too: the carry would rename that read
    blocks = [[t for p in range(length) for t in rec.ops[first + j * length + p]["outs"]] for j in range(k)]
    if not _read_after_as_lists(rec, end, blocks):
        return None
    return {"first": first, "len": length, "count": k, "end": end, "blocks": blocks,
            "carry": {x: blocks[0][_flat_index(rec, first, at)] for x, at in carry.items()}}


def _flat_index(rec: Recording, first: int, at: tuple[int, int]) -> int:
    return sum(len(rec.ops[first + p]["outs"]) for p in range(at[0])) + at[1]


def _read_after_as_lists(rec: Recording, end: int, blocks: list[list[int]]) -> bool:
    """Whether every op after the run reads a later block's tensor only as part of a list naming that tensor's
    instance in every block, in order (the ``stack``): never a later block's tensor alone, which the folded file
    could not name (the first block's, read alone, is the first repetition's)."""
    later = {t: j for j, b in enumerate(blocks) for t in b if j > 0}
    for op in rec.ops[end:]:
        for _, v in op["args"]:
            refs = _refs(v)
            hit = [t for t in refs if t in later]
            if not hit:
                continue
            if not isinstance(v, list):
                return False
            for pos, t in enumerate(refs):
                if t in blocks[0]:
                    place = blocks[0].index(t)
                    if refs[pos:pos + len(blocks)] != [b[place] for b in blocks]:
                        return False
            if len(hit) != sum(1 for t in refs if t in later):
                return False
    for t in later:
        if t in (rec.loss, rec.logits, rec.embed_out):
            return False
    return True


def _fold_one_list(v: list[Any], drop: set[int]) -> list[Any]:
    return [t for t in v if t not in drop]


def _fold_run(rec: Recording, run: dict[str, Any], made: dict[int, tuple[int, int]], removed: set[int]) -> None:
    first, length, k = run["first"], run["len"], run["count"]
    drop = {t for b in run["blocks"][1:] for t in b}
    for op in rec.ops[run["end"]:]:
        op["args"] = [(a, _fold_one_list(v, drop) if isinstance(v, list) else v) for a, v in op["args"]]
    removed.update(range(first + length, run["end"]))
    rec.repeats.append({"first": first, "len": length, "count": k, "each": list(run["blocks"][0]),
                        "carry": dict(run["carry"])})


def unfolded_loop_note(run, base: dict[str, Any], precision: str, attn: str, b: int, s: int) -> str:
    """Where a loop over the sequence that did not fold runs, for the refusal: the module whose ops grow most from
    ``s`` to ``s + 4`` positions, and why its iterations are no repeated block (a ``nonzero`` among them: sizes
    that depend on the data, such as Qwen4-Exp's QSA indexer, transformers 5.24 modeling_qwen4_exp.py
    ``Qwen4ExpTextQSAIndexer``: ``for batch_idx ... for query_idx ...: torch.nonzero(visible[...])``, whose blocks
    grow with the position); "" where the recordings cannot be made."""
    from collections import Counter

    try:
        recs = [run(base, precision, attn, b, n) for n in (s, s + 4)]
    except Exception:  # noqa: BLE001 - a note only: the refusal stands without it
        return ""
    counts = [Counter((o.get("module") or "?", o["name"]) for o in r.ops) for r in recs]
    grown = Counter({k: v - counts[0].get(k, 0) for k, v in counts[1].items() if v > counts[0].get(k, 0)})
    if not grown:
        return ""
    per_module = Counter()
    for (module, _), v in grown.items():
        per_module[module] += v
    module, more = per_module.most_common(1)[0]
    dependent = sorted({name for (m, name) in grown if m == module and name in ("nonzero", "masked_select", "unique")})
    why = (f"its iterations differ in size: {', '.join(dependent)} sizes them by the data" if dependent else
           "its iterations are not one repeated block (their ops or shapes differ from one position to the next)")
    return f"; the loop runs in {module} ({more} more ops at {s + 4} positions than at {s}): {why}"
