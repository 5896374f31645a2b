"""A layer's work that the model's loop does itself, after the layer module returns: the layer's *tail*.

Most decoder loops only call ``layer(hidden_states, ...)``; some run more ops of the layer between two layer
modules:

* XLM's loop calls ``attentions[i]`` (the module the recorder takes as the layer) and then, inline, dropout, the
  residual add, ``layer_norm1[i]``, ``ffns[i]``, ``layer_norm2[i]`` and the padding mask (transformers 5.24
  models/xlm/modeling_xlm.py ``XLMModel.forward``): the next layer's input is made there;
* Inkling2's loop concatenates a block boundary's input onto ``block_states`` (models/inkling2/modeling_inkling2.py
  ``Inkling2TextModel.forward``), which later layers and the epilogue read.

Such ops lay in no segment, so a later segment reading what they made was refused. :func:`layer_bounds` gives each
layer's segment the ops up to the next layer module where a later op reads a tensor they made (the layer's tail);
a gap of ``select.int`` views only is the loop's indexing of a prologue tensor (Gemma-4's per-layer inputs,
:func:`.crosslayer.per_layer_slice`) and stays outside. The last layer's tail is the epilogue's first ops where they
repeat the tail of the layer before it, op for op (the loop body runs the same code after every layer).
"""

from __future__ import annotations

from typing import Any


def _last_reads(rec) -> dict[int, int]:
    """Tensor id -> the last op that reads it (an argument of the op)."""
    last: dict[int, int] = {}
    for i, op in enumerate(rec.ops):
        for _, v in op["args"]:
            for x in (v if isinstance(v, list) else [v]):
                if isinstance(x, int):
                    last[x] = i
    return last


def _is_tail(rec, a: int, b: int, last: dict[int, int]) -> bool:
    """Whether ops ``a..b`` (between two layer modules) make a tensor an op from ``b`` on reads, other than the loop's
    ``select.int`` of a prologue tensor."""
    for op in rec.ops[a:b]:
        if op["name"] == "select.int":
            continue
        if any(last.get(t, -1) >= b for t in op["outs"]):
            return True
    return False


def layer_bounds(rec) -> list[tuple[int, int, int]]:
    """``(layer index, first op, end op)`` per recorded layer, the tail included (see the module's text)."""
    layers = rec.layers
    last = _last_reads(rec)
    out = []
    for k, L in enumerate(layers):
        end = L["end"]
        if k + 1 < len(layers) and _is_tail(rec, L["end"], layers[k + 1]["start"], last):
            end = layers[k + 1]["start"]
        out.append((L["index"], L["start"], end))
    if len(layers) >= 2:
        prev = layers[-2]
        tail = [o["name"] for o in rec.ops[prev["end"]:out[-2][2]]]
        end = layers[-1]["end"]
        if tail and [o["name"] for o in rec.ops[end:end + len(tail)]] == tail:
            out[-1] = (layers[-1]["index"], layers[-1]["start"], end + len(tail))
    return out


def layer_output(rec, bounds: list[tuple[int, int, int]], k: int) -> int:
    """The tensor layer ``k`` hands to what follows it: the module's output where the layer has no tail, else the next
    layer's first argument where this layer's tail made it; the last layer's is the output at the place the layer
    before it made its own (the same op of the same tail)."""
    L = rec.layers[k]
    first, end = bounds[k][1], bounds[k][2]
    if end == L["end"]:
        return L["out"]
    if k + 1 < len(rec.layers):
        nxt = rec.layers[k + 1]["args"][0][1] if rec.layers[k + 1]["args"] else None
        made = rec.tensors[nxt]["op"] if nxt is not None else None
        if isinstance(made, int) and first <= made < end:
            return nxt
        return L["out"]
    prev = layer_output(rec, bounds, k - 1)
    op_at = rec.tensors[prev]["op"]
    if not isinstance(op_at, int) or not bounds[k - 1][1] <= op_at < bounds[k - 1][2]:
        return L["out"]
    pos = op_at - rec.layers[k - 1]["end"]
    op = rec.ops[L["end"] + pos] if pos >= 0 else None
    q = rec.ops[op_at]["outs"].index(prev)
    return op["outs"][q] if op is not None and q < len(op["outs"]) else L["out"]


def module_last(rec, seg: dict[str, Any]) -> int:
    """The segment-local index of a layer segment's last op inside the layer module (before its tail)."""
    L = next(x for x in rec.layers if x["start"] == seg["first"])
    return L["end"] - seg["first"] - 1
