"""From a :class:`~.record.Recording` to segments: the prologue, one graph per decoder layer, the epilogue.

Within a segment every tensor is referenced locally (``t<k>``, in creation order); tensors from outside
are ``a<j>`` (the segment's j-th argument: a layer's hidden state and the context the model passes to
every layer, a tensor an earlier layer made that this layer reads, the epilogue's final hidden state), ``P<k>`` (a prologue tensor), ``p:<name>`` (a parameter,
``{i}`` standing for the layer index), ``b:<name>`` (a buffer) and ``x:<name>`` (the batch). A storage
is released after the op named in ``die`` (the Python lifetime the recorder saw); ``L`` means when the
caller rebinds the layer's result (the layer returns), ``M`` when the base model returns, ``F`` when the
forward returns.
"""

from __future__ import annotations

import re
from typing import Any

from . import looptail
from .record import Recording

LAYER_RE = re.compile(r"\.(\d+)\.")


def _param_template(name: str, layer: int | None) -> str:
    if layer is None:
        return name
    return name.replace(f".{layer}.", ".{i}.", 1)


def _each_layer_once(rec: Recording) -> None:
    """:raises LearnError: a decoder layer runs more than once in one step. HRM-Text calls its two stacks'
    layers once per cycle (``H_cycles * (L_cycles + 1)`` stack calls, the inputs of each re-injected between
    calls, some cycles under ``torch.no_grad()``: transformers/models/hrm_text/modeling_hrm_text.py
    ``HrmTextModel.forward``); a file's segments are one pass over the layers, each reading only the previous
    layer's output."""
    from collections import Counter

    from .derive import LearnError

    runs = Counter(L["index"] for L in rec.layers)
    again = sorted(i for i, c in runs.items() if c > 1)
    if again:
        raise LearnError(f"decoder layer {again[0]} runs {runs[again[0]]} times in one training step ({len(again)} "
                         f"of the {len(runs)} recorded layers run more than once): a recurrent-depth model that "
                         "calls its layers once per cycle (HRM's H/L cycles), which a learned file cannot express "
                         "yet (its segments run each layer once, in order)")


def between_layers(cut: "Cut", op: Any) -> str | None:
    """Where op ``op`` runs in the model's loop between two layer modules (in no segment), the words that say so:
    which layers, the ops and the modules they run in. XLM's loop calls ``attentions[i]`` as the layer and then
    ``layer_norm1[i]``, ``ffns[i]``, ``layer_norm2[i]`` itself (transformers 5.24 models/xlm/modeling_xlm.py
    ``XLMModel.forward``); Inkling2's loop concatenates a block boundary's input onto ``block_states``
    (models/inkling2/modeling_inkling2.py ``Inkling2TextModel.forward``). None: the op lies in a segment (or is no op
    of the step)."""
    if not isinstance(op, int) or op in cut.op_seg or not 0 <= op < len(cut.rec.ops):
        return None
    layers = [s for s in cut.segments if s["kind"] == "layer"]
    before = [s for s in layers if s["end"] <= op]
    after = [s for s in layers if s["first"] > op]
    if not before or not after:
        return None
    a, b = before[-1], after[0]
    gap = cut.rec.ops[a["end"]:b["first"]]
    names = ", ".join(dict.fromkeys(o["name"] for o in gap))
    mods = ", ".join(m for m in dict.fromkeys(o.get("module") or "" for o in gap) if m) or "no module"
    return (f"made by the model's loop between layers {a['layer']} and {b['layer']} ({len(gap)} ops outside the "
            f"layer modules: {names}; in {mods})")


class Cut:
    """One recording cut into segments (numeric shapes; :mod:`.derive` makes them symbolic)."""

    def __init__(self, rec: Recording, layer_names: dict[int, str]) -> None:
        self.rec = rec
        self.names = {tid: name for name, tid in rec.params.items()}
        self.bufs = {tid: name for name, tid in rec.buffers.items()}
        self.inputs = {tid: name for name, tid in rec.inputs.items()}
        self.layer_names = layer_names
        self.segments: list[dict[str, Any]] = []
        self._cut()

    # ------------------------------------------------------------------
    def _cut(self) -> None:
        rec = self.rec
        _each_layer_once(rec)
        bounds = [(None, 0, rec.layers[0]["start"] if rec.layers else rec.forward_end)]
        layers = looptail.layer_bounds(rec)  # each layer with the ops its loop runs after it (its tail)
        bounds += layers
        bounds.append(("epilogue", layers[-1][2] if rec.layers else rec.forward_end, rec.forward_end))
        self.outs = [looptail.layer_output(rec, layers, k) for k in range(len(layers))]
        self.owner_seg: dict[int, tuple[int, int]] = {}  # tid -> (segment number, local index)
        self.op_seg: dict[int, tuple[int, int]] = {}
        for n, (kind, a, b) in enumerate(bounds):
            for k, i in enumerate(range(a, b)):
                self.op_seg[i] = (n, k)
        for n, (kind, a, b) in enumerate(bounds):
            seg = {"kind": "prologue" if kind is None else ("epilogue" if kind == "epilogue" else "layer"),
                   "layer": kind if isinstance(kind, int) else None, "first": a, "end": b}
            self.segments.append(seg)
        for n, seg in enumerate(self.segments):
            self._segment(n, seg)

    def _ref(self, tid: int, n: int, seg: dict[str, Any], local: dict[int, int], args: dict[int, int]) -> str:
        if tid in local:
            return f"t{local[tid]}"
        if tid in args:
            return f"a{args[tid]}"
        if tid in self.names:
            return "p:" + _param_template(self.names[tid], seg["layer"])
        if tid in self.bufs:
            return "b:" + _param_template(self.bufs[tid], seg["layer"])
        if tid in self.inputs:
            return "x:" + self.inputs[tid]
        where = self.owner_seg.get(tid)
        if where is not None and where[0] == 0:
            return f"P{where[1]}"
        if where is not None and seg["kind"] in ("layer", "epilogue") and 0 < where[0] < n:
            # an earlier layer's tensor that this layer reads besides its arguments (Gemma-3n's shared layers
            # read the K/V their store layer put in ``shared_kv_states``, modeling_gemma3n.py
            # ``Gemma3nTextAttention.forward``; Inkling2's epilogue reads the ``block_states`` a block boundary
            # layer made, modeling_inkling2.py): one more argument, whose maker the file states (derive.py)
            args[tid] = len(seg["args"])
            seg["args"].append(["from_layer", None])
            return f"a{args[tid]}"
        # a view of something known, created outside the op stream (e.g. a parameter view): use the storage owner
        t = self.rec.tensors[tid]
        owner = self.rec.storages[t["sid"]]["owner"]
        if owner is not None and owner != tid:
            return self._ref(owner, n, seg, local, args)
        if t["op"] is None and t["origin"] == "const":
            # a constant the model code keeps (a cached tensor attribute, not a buffer): alive before the step,
            # never counted; listed as a tensor of this segment with base "const"
            local[tid] = len(self._tensors)
            self._tensors.append([list(t["shape"]), t["dtype"], "const", None, tid])
            return f"t{local[tid]}"
        from .derive import LearnError

        between = between_layers(self, t["op"])
        if between is not None:
            raise LearnError(f"segment {n} ({seg['kind']}) reads a tensor (shape {list(t['shape'])}, op {t['op']}) "
                             f"{between}, which a learned file cannot express yet (its segments are the prologue, "
                             "the layer modules and the epilogue)")
        # Inkling2's epilogue (``final_input``, modeling_inkling2.py) attends over every block's output, not only
        # the last layer's: a file's segments pass one hidden state from layer to layer (a refusal, not a crash)
        raise LearnError(f"segment {n} ({seg['kind']}) reads a tensor made by segment "
                         f"{(self.owner_seg.get(tid) or ('?',))[0]} that is not its argument (shape "
                         f"{list(t['shape'])}, op {t['op']}): a layer or the epilogue reads earlier layers' outputs "
                         "besides the previous layer's (attention residuals over blocks), which a learned file "
                         "cannot express yet")

    def _view_base(self, owner: int, sid: int, n: int, seg: dict[str, Any], local: dict[int, int],
                   args: dict[int, int]) -> str:
        """The base of a view of storage ``sid``: its owner where the segment holds it, else an argument on that
        storage. ELECTRA's first layer receives a view of the embedding projection's output (``hidden_states``
        reshaped): its owner is a prologue tensor, but the layer sees it as ``a0``; naming the owner (``P15``) made
        layer 0's graph differ from the others', and a file whose layers all take layer 0's graph based every
        layer's views on the prologue's storage (one ``b·s·hidden`` saved tensor fewer per layer after the
        first)."""
        if owner not in local and owner not in args:
            on_storage = [tid for tid in args if self.rec.tensors[tid]["sid"] == sid]
            if on_storage:
                return f"a{args[on_storage[0]]}"
        return self._ref(owner, n, seg, local, args)

    def _segment(self, n: int, seg: dict[str, Any]) -> None:
        rec = self.rec
        local: dict[int, int] = {}
        args: dict[int, int] = {}
        arg_list: list[list[Any]] = []
        seg["args"] = arg_list  # (:meth:`_ref` appends an earlier layer's tensor that the layer reads)
        if seg["kind"] == "layer":
            k, L = next((k, x) for k, x in enumerate(rec.layers) if x["start"] == seg["first"])
            for name, tid in L["args"]:
                if tid not in args:
                    args[tid] = len(arg_list)
                    arg_list.append([name, None])
            seg["out_tid"] = self.outs[k]
        elif seg["kind"] == "epilogue":
            prev = self.segments[n - 1]
            if prev["kind"] == "layer":
                args[prev["out_tid"]] = 0
                arg_list.append(["hidden_states", None])
        tensors: list[list[Any]] = []
        self._tensors = tensors
        ops: list[list[Any]] = []
        for i in range(seg["first"], seg["end"]):
            op = rec.ops[i]
            ins = []
            for name, v in op["args"]:
                if isinstance(v, list):
                    ins.append([name, [None if x is None else self._ref(x, n, seg, local, args) for x in v]])
                else:
                    ins.append([name, self._ref(v, n, seg, local, args)])
            outs = []
            for tid in op["outs"]:
                if tid in local or tid in args or tid in self.names:
                    outs.append(self._ref(tid, n, seg, local, args))  # in-place: the op returns its input
                    continue
                t = rec.tensors[tid]
                owner = rec.storages[t["sid"]]["owner"]
                base = None
                if owner != tid:
                    base = self._view_base(owner, t["sid"], n, seg, local, args)
                local[tid] = len(tensors)
                self.owner_seg[tid] = (n, len(tensors))
                tensors.append([list(t["shape"]), t["dtype"], base, rec.storages[t["sid"]]["nbytes"] if base is None else None,
                                tid])
                outs.append(f"t{local[tid]}")
            extra: dict[str, Any] = {}
            if op.get("pseudo"):
                extra["pseudo"] = op["pseudo"]
            if op["scalars"]:
                extra["sc"] = op["scalars"]
            if op["inplace"]:
                extra["inplace"] = 1
            if op.get("site") is not None:
                extra["site"] = op["site"]
            if op.get("nograd"):
                extra["ng"] = 1  # grad mode off (a custom autograd Function, a torch.no_grad block): no autograd node
            if op.get("function"):  # the Function's node: what ctx.save_for_backward kept
                extra["fn"] = op["function"]
                extra["fsv"] = [self._ref(t, n, seg, local, args) for t in op["fsaves"]]
            ops.append([op["name"], ins, outs, extra, i])
        seg["args"] = arg_list
        seg["tensors"] = tensors
        reps = [r for r in getattr(rec, "repeats", ()) if seg["first"] <= r["first"] < seg["end"]]
        if reps:  # a loop over heads folded to one repetition (fold.py): positions and tensors made local
            seg["rep"] = [{"first": r["first"] - seg["first"], "len": r["len"], "count": r["count"],
                           "each": [f"t{local[t]}" for t in r["each"]],
                           **({"carry": {self._ref(x, n, seg, local, args): f"t{local[y]}" for x, y in r["carry"].items()}}
                              if r.get("carry") else {})} for r in reps]
        seg["ops"] = ops
        seg["local"] = local
        seg["argmap"] = args
        if seg["kind"] == "layer":
            seg["out"] = self._ref(seg["out_tid"], n, seg, local, args)
