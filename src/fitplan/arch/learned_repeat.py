"""Repeated blocks of a learned segment: ops a model runs once per head (or per any size), unrolled for a scenario.

A module that loops over a size in Python records a number of ops that grows with it. StableLM's per-head q/k
LayerNorm (transformers 5.24 ``modeling_stablelm.py`` ``StableLmLayerNormPerHead``) splits its input into one
tensor per head (``torch.split(x, 1, dim=1)``: one ``split.Tensor`` with ``num_heads`` outputs), runs one
``nn.LayerNorm`` per head (``native_layer_norm`` ``num_heads`` times, each with its own weight
``norms.<h>.weight``) and concatenates the results (one ``cat`` over ``num_heads`` tensors). The learner
(fitplan-torch ``learn/fold.py``) keeps one repetition of such a block and the count as an expression; a
segment then has ``rep``, a list of blocks::

    {"n": "num_attention_heads", "first": 47, "len": 1, "each": ["t5", "t6", "t7", "t8"]}

* ``ops[first:first + len]`` is the body, recorded once (repetition 0) and run ``n`` times;
* ``each``: the tensors that exist once per repetition (the split's output, what the body creates). The recorded
  tensor is repetition 0's; repetition ``r`` gets a new tensor of the same entry (a view of the ``r``-th instance
  of its base where the base is in ``each``);
* in the body, a reference to an ``each`` tensor means the current repetition's instance, and ``{h}`` in a
  parameter or buffer name the repetition number (``p:model.layers.{i}.self_attn.q_layernorm.norms.{h}.weight``);
* outside the body, a list (an op's outputs, a list argument) that names an ``each`` tensor names its ``n``
  instances in order (the split's outputs, the ``cat``'s inputs);
* positions (``die``, ``sites``, ``logits_from``) after the body move by ``(n - 1) * len``; an ``each`` tensor that
  dies in the body dies in its own repetition;
* ``carry`` (a loop over the sequence, fitplan-torch ``learn/seqloop.py``: Mamba's reference scan), ``{X: Y}``: in
  repetition ``r >= 1`` the body's reference to ``X`` (the state repetition 0 starts from) means repetition
  ``r - 1``'s ``Y`` (the state it made)::

      {"n": "-1 + s", "first": 66, "len": 14, "each": [...], "carry": {"t71": "t74"}}

:func:`unroll` turns such a segment into the plain segment the model would have recorded at ``n``: the replay
(:mod:`.learned_segment`) never sees a block.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from fitplan.arch.archexpr import compile_expr

H = "{h}"
"""The repetition number in a parameter or buffer name of a repeated block (``norms.{h}.weight``)."""


def unroll(seg: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """``seg`` with each of its ``rep`` blocks repeated ``n`` times (evaluated in ``env``); ``seg`` itself when it
    has none. Blocks are unrolled last first, so that the positions of the earlier ones stay valid."""
    blocks = seg.get("rep")
    if not blocks:
        return seg
    out = {k: v for k, v in seg.items() if k != "rep"}
    for block in sorted(blocks, key=lambda b: b["first"], reverse=True):
        out = _unroll_block(out, block, int(compile_expr(block["n"])(env)))
    return out


def _unroll_block(seg: dict[str, Any], block: dict[str, Any], n: int) -> dict[str, Any]:
    if n < 1:
        raise ValueError(f"a repeated block runs {n} times: at least once is recorded")
    first, length = block["first"], block["len"]
    end = first + length
    shift = (n - 1) * length
    tensors = [list(t) for t in seg["t"]]
    each = list(block["each"])
    inst: dict[str, list[str]] = {}  # each tensor -> its instance per repetition
    for ref in each:
        inst[ref] = [ref]
    for r in range(1, n):
        for ref in each:
            entry = list(tensors[int(ref[1:])])
            base = entry[2]
            if isinstance(base, str) and base in inst:
                entry[2] = inst[base][r]
            inst[ref].append(f"t{len(tensors)}")
            tensors.append(entry)

    carry = block.get("carry") or {}

    def one(ref: Any, r: int) -> Any:
        if not isinstance(ref, str):
            return ref
        if r >= 1 and ref in carry:  # the state the repetition before made (a loop over the sequence)
            return inst[carry[ref]][r - 1]
        if ref in inst:
            return inst[ref][r]
        if ref.startswith(("p:", "b:")) and H in ref:
            return ref.replace(H, str(r))
        return ref

    def outside(v: Any) -> Any:
        if isinstance(v, list):
            return [x for ref in v for x in (inst[ref] if ref in inst else [ref])]
        return v

    def pos(k: int) -> int:
        return k + shift if k >= end else k

    ops = []
    for k, op in enumerate(seg["ops"]):
        if first <= k < end:
            continue
        ops.append(_map_op(op, outside))
    body = seg["ops"][first:end]
    unrolled = [_map_op(op, lambda v, r=r: [one(x, r) for x in v] if isinstance(v, list) else one(v, r))
                for r in range(n) for op in body]
    ops[first:first] = unrolled
    out = dict(seg)
    out["t"] = tensors
    out["ops"] = ops
    out["die"] = _deaths(seg.get("die", {}), inst, first, end, length, pos)
    if "sites" in seg:
        out["sites"] = _sites(seg["sites"], first, end, length, n, pos, one)
    if "logits_from" in seg:
        out["logits_from"] = pos(seg["logits_from"])
    return out


def _map_op(op: list[Any], f) -> list[Any]:
    """An op with every tensor reference (arguments, outputs, a Function's saves) passed through ``f``."""
    name, args, outs = op[0], op[1], op[2]
    new = [name, [[a, f(v)] for a, v in args], f(list(outs))]
    if len(op) > 3:
        extra = op[3]
        if "fsv" in extra:
            extra = {**extra, "fsv": f(list(extra["fsv"]))}
        new.append(copy.copy(extra))
    return new


def _deaths(die: dict[str, Any], inst: dict[str, list[str]], first: int, end: int, length: int, pos) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ref, d in die.items():
        copies = inst.get(ref, [ref])
        for r, c in enumerate(copies):
            if not isinstance(d, int):
                out[c] = d
            elif first <= d < end:
                out[c] = d + r * length  # dies in its own repetition
            else:
                out[c] = pos(d)
    return out


def _sites(sites: list[dict[str, Any]], first: int, end: int, length: int, n: int, pos, one) -> list[dict[str, Any]]:
    out = []
    for s in sites:
        if first <= s["start"] < end:
            for r in range(n):
                out.append({**s, "start": s["start"] + r * length, "end": s["end"] + r * length,
                            "input": one(s["input"], r), "output": one(s["output"], r),
                            "module": s["module"].replace(H, str(r))})
        else:
            out.append({**s, "start": pos(s["start"]), "end": pos(s["end"])})
    return out


_NUMBER = re.compile(r"\.(\d+)(?=\.|$)")


def template(name: str, known) -> str:
    """The parameter template a concrete repeated name comes from (``...norms.3.weight`` ->
    ``...norms.{h}.weight`` where the file lists that template), else ``name``."""
    if name in known:
        return name
    for m in reversed(list(_NUMBER.finditer(name))):
        cand = name[:m.start()] + "." + H + name[m.end():]
        if cand in known:
            return cand
    return name
