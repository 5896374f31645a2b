"""Folding ops a model runs once per head into one repeated block (docs/architectures.md, "Repeated blocks").

A Python loop over the pieces of a split records a number of ops that grows with the number of pieces.
StableLM's per-head q/k LayerNorm (transformers 5.24 ``modeling_stablelm.py`` ``StableLmLayerNormPerHead``)::

    states_per_heads = torch.split(hidden_states, 1, dim=1)           # split.Tensor: num_heads outputs
    return torch.cat([norm(h) for norm, h in zip(self.norms, states_per_heads)], dim=1)   # num_heads LayerNorms

records ``split`` with ``k`` outputs, ``k`` identical blocks (block ``j`` reads output ``j`` and the ``j``-th
module's parameters, ``norms.<j>.weight``) and one op that takes the ``k`` blocks' results as a list (``cat``).

A loop over the experts a router hit hands its blocks' results on in place instead. DBRX's experts (transformers
5.24 ``modeling_dbrx.py`` ``DbrxExperts.forward``; LongCat-Flash's and the eager path of the ``grouped_mm``
experts, ``integrations/moe.py``, read alike)::

    next_states = torch.zeros_like(hidden_states)
    expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:                                     # unbind.int: one output per expert hit
        idx, token_idx = torch.where(expert_mask[expert_idx])
        states = self.mlp(hidden_states[token_idx], w1, v1, w2)       # the expert's rows
        next_states.index_add_(0, token_idx, states * weights)        # written in place, no list consumer

records ``unbind`` with one output per expert hit and one block per output that ends writing ``next_states`` in
place (:func:`_accumulates`). Every block writes the same tensor, made before the loop, so the folded block reads
and writes it as it is in each repetition, and nothing after the loop names a block's own tensors. With the
routing the learner declares (:mod:`.routing`: every expert is hit, each with ``k·b·s/E`` rows rounded up) the
blocks have the same ops, block 0 the most rows.
:func:`fold` keeps block 0 and says so in ``rec.repeats`` (its position, length, count and the tensors that
exist once per repetition); the parameters of block 0 are renamed with ``{h}`` for the repetition
(``norms.{h}.weight``) and counted in ``rec.param_repeats``. Probes at other head counts then record the same
ops, the count is fitted like any size (``num_attention_heads``), and the core unrolls the block for a scenario
(``fitplan.arch.learned_repeat``).
"""

from __future__ import annotations

import re
from typing import Any

from .record import Recording

MAX_BODY = 16
"""The longest loop body looked for (StableLM's is one op: ``native_layer_norm``)."""
MAX_ACC_BODY = 64
"""The longest body of a loop that writes its result in place (DBRX's expert is 27 ops)."""
H = "{h}"


def fold(rec: Recording, params_meta: dict[str, Any] | None = None) -> Recording:
    """``rec`` with every split -> per-piece block -> list-consumer idiom folded to one repetition (in place)."""
    rec.repeats = []
    rec.param_repeats = {}
    blocks = []
    i = 0
    while i < len(rec.ops):
        found = _block_at(rec, i)
        if found is None:
            i += 1
            continue
        blocks.append(found)
        i = found["end"]
    if not blocks:
        return rec
    removed: set[int] = set()
    for b in blocks:
        _fold_one(rec, b, removed)
    _renumber(rec, removed, params_meta)
    return rec


def _block_at(rec: Recording, i: int) -> dict[str, Any] | None:
    """The loop at op ``i`` (an op with k >= 2 outputs), or None: the k blocks after it have the same ops, block
    ``j`` reads output ``j`` only, and the op after them takes the k blocks' results (same position) as a list, or
    every block writes its result in place into the same tensors made before the loop (:func:`_accumulates`)."""
    op = rec.ops[i]
    outs = op["outs"]
    k = len(outs)
    if k < 2 or op.get("pseudo"):
        return None
    for length in range(1, MAX_ACC_BODY + 1):
        c = i + 1 + k * length
        if c > len(rec.ops):
            return None
        blocks = [rec.ops[i + 1 + j * length: i + 1 + (j + 1) * length] for j in range(k)]
        if any(_shape(b) != _shape(blocks[0]) for b in blocks[1:]):
            continue
        if not all(_reads_only(b, outs, j) for j, b in enumerate(blocks)):
            continue
        made = [[t for o in b for t in o["outs"]] for b in blocks]
        site = any(o.get("site") is not None for b in blocks for o in b)
        written = set() if site else _accumulates(rec, i, blocks, made)
        if written:
            return {"split": i, "first": i + 1, "len": length, "count": k, "consumer": None, "end": c,
                    "blocks": blocks, "made": [[t for t in m if t not in written] for m in made]}
        if length > MAX_BODY or c >= len(rec.ops):
            continue
        consumer = rec.ops[c]
        lists = [v for _, v in consumer["args"] if isinstance(v, list) and len(v) == k]
        for v in lists:
            pos = [made[j].index(t) if t in made[j] else -1 for j, t in enumerate(v)]
            if pos[0] >= 0 and all(p == pos[0] for p in pos):
                if site:
                    return None  # an nn.Linear in the loop: not folded (sites are not repeated by the learner)
                return {"split": i, "first": i + 1, "len": length, "count": k, "consumer": c, "end": c + 1,
                        "blocks": blocks, "made": made}
    return None


def _accumulates(rec: Recording, i: int, blocks: list[list[dict[str, Any]]], made: list[list[int]]) -> set[int]:
    """The tensors every block writes in place (the same ones in each, made before op ``i``), where that is how the
    blocks hand their result on: no block reads another block's tensors, and nothing after the loop reads a
    block's own; else the empty set."""
    def written(block: list[dict[str, Any]]) -> set[int]:
        return {t for o in block if o.get("inplace") for t in o["outs"]
                if any(t in (v if isinstance(v, list) else [v]) for _, v in o["args"])}

    acc = written(blocks[0])
    if not acc or any(written(b) != acc for b in blocks[1:]):
        return set()
    before = {t for o in rec.ops[:i] for t in o["outs"]}
    if not acc <= before:
        return set()
    own = [set(m) - acc for m in made]
    for j, b in enumerate(blocks):
        others = set().union(*(own[n] for n in range(len(blocks)) if n != j))
        if any(t in others for o in b for _, v in o["args"] for t in (v if isinstance(v, list) else [v])):
            return set()
    mine = set().union(*own)
    end = i + 1 + len(blocks) * len(blocks[0])
    for o in rec.ops[end:]:
        if any(t in mine for _, v in o["args"] for t in (v if isinstance(v, list) else [v])):
            return set()
    if mine & {rec.loss, rec.logits, rec.embed_out}:
        return set()
    return acc


def _shape(block: list[dict[str, Any]]) -> list[Any]:
    return [(o["name"], len(o["outs"]), tuple(a for a, _ in o["args"])) for o in block]


def _reads_only(block: list[dict[str, Any]], outs: list[int], j: int) -> bool:
    seen = {t for o in block for _, v in o["args"] for t in (v if isinstance(v, list) else [v])}
    return outs[j] in seen and not any(t in seen for n, t in enumerate(outs) if n != j)


def _fold_one(rec: Recording, b: dict[str, Any], removed: set[int]) -> None:
    split = rec.ops[b["split"]]
    k, length = b["count"], b["len"]
    each = [split["outs"][0]] + b["made"][0]
    if b["consumer"] is not None:
        consumer = rec.ops[b["consumer"]]
        keep = set(b["made"][0])
        consumer["args"] = [(a, [t for t in v if t in keep] if isinstance(v, list) and len(v) == k else v)
                            for a, v in consumer["args"]]
    split["outs"] = [split["outs"][0]]
    names = {tid: name for name, tid in rec.params.items()}
    for pos, op0 in enumerate(b["blocks"][0]):
        for ai, (_, v0) in enumerate(op0["args"]):
            if isinstance(v0, list) or v0 not in names:
                continue
            others = [b["blocks"][j][pos]["args"][ai][1] for j in range(1, k)]
            tmpl = _template(names[v0], [names.get(t) for t in others])
            if tmpl is None:
                continue
            for t in others:
                rec.params.pop(names[t], None)
                rec.accumulate.pop(names[t], None)
            rec.params[tmpl] = rec.params.pop(names[v0])
            if names[v0] in rec.accumulate:
                rec.accumulate[tmpl] = rec.accumulate.pop(names[v0])
            rec.param_repeats[tmpl] = k
            names[v0] = tmpl
    for j in range(1, k):
        removed.update(range(b["first"] + j * length, b["first"] + (j + 1) * length))
    rec.repeats.append({"first": b["first"], "len": length, "count": k, "each": each})


def _template(name0: str, others: list[str | None]) -> str | None:
    """``a.norms.0.weight`` with ``a.norms.1.weight``, ``a.norms.2.weight`` ... -> ``a.norms.{h}.weight``: the one
    number that is the repetition's."""
    for m in reversed(list(re.finditer(r"(?<=\.)0(?=\.)", name0))):
        tmpl = name0[:m.start()] + H + name0[m.end():]
        if all(o == tmpl.replace(H, str(j + 1)) for j, o in enumerate(others)):
            return tmpl
    return None


def _renumber(rec: Recording, removed: set[int], meta: dict[str, Any] | None) -> None:
    """Drop the removed ops and move every op index the recording holds (deaths, sites, layers, saves, the backward)."""
    new_of: dict[int, int] = {}
    n = 0
    for i in range(len(rec.ops)):
        if i not in removed:
            new_of[i] = n
            n += 1
    kept_before = [0] * (len(rec.ops) + 1)  # an exclusive bound: the number of kept ops before it
    for i in range(len(rec.ops)):
        kept_before[i + 1] = kept_before[i] + (i not in removed)

    def at(i: int) -> int:
        """A position inside a removed repetition (a storage that dies there) moves to the op after the loop."""
        j = i
        while j in removed:
            j += 1
        return new_of.get(j, kept_before[min(j, len(rec.ops))])

    rec.ops = [o for i, o in enumerate(rec.ops) if i not in removed]
    for st in rec.storages:
        if st.get("death") is not None and st.get("death_phase", "forward") == "forward":
            st["death"] = at(st["death"])
    for t in rec.tensors:
        if t.get("op") is not None and t["op"] in new_of:
            t["op"] = new_of[t["op"]]
    for L in rec.layers:
        L["start"], L["end"] = kept_before[L["start"]], kept_before[L["end"]]
    for s in rec.sites:
        s["start"], s["end"] = kept_before[s["start"]], kept_before[s["end"]]
    rec.forward_end = kept_before[rec.forward_end]
    rec.saves = [(t, new_of[i]) for t, i in rec.saves if i in new_of]
    rec.backward = {new_of[i]: v for i, v in rec.backward.items() if i in new_of}
    rec.backward_order = [new_of[i] for i in rec.backward_order if i in new_of]
    for r in rec.repeats:
        r["first"] = new_of[r["first"]]
    if meta is not None:
        _rename_roles(meta, rec.param_repeats)


def _rename_roles(meta: dict[str, Any], repeats: dict[str, int]) -> None:
    roles = meta.get("roles", {})
    for tmpl in repeats:
        for j in range(repeats[tmpl]):
            role = roles.pop(tmpl.replace(H, str(j)), None)
            if role is not None:
                roles.setdefault(tmpl, role)
