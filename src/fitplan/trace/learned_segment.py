"""Replaying one segment of a learned file (the prologue, a decoder layer, the epilogue) op by op.

:class:`~.learned_graph.Builder` holds what a scenario shares (its parameters, dtypes, LoRA targets, the
autograd table); a :class:`Segment` walks one recorded segment's ops in order: it resolves each op's
references (its own tensors, parameters and buffers, the prologue's outputs), creates the tensors the op
returns (new storages, views, in-place versions), hands the op to ``Builder.emit`` for what autograd saves,
places the scenario's substitutions at ``nn.Linear`` call sites (:mod:`.kernels`: LoRA, QLoRA, ZeRO-3's
``F.linear``), and lets each tensor go when the model's Python code does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fitplan.arch.learned_repeat import template as repeat_template
from fitplan.arch.archexpr import compile_expr
from fitplan.trace import kernels, liger, loss_heads, strides
from fitplan.trace.symbolic import as_int
from fitplan.arch.archfile import FLOAT

if TYPE_CHECKING:
    from fitplan.trace.learned_graph import Builder


class Segment:
    """One instantiation of a segment (the prologue, a layer, the epilogue)."""

    def __init__(self, b: "Builder", seg: dict[str, Any], args: list[Any], layer: int | None) -> None:
        self.b = b
        self.seg = seg
        self.layer = layer
        self.env = b.env if layer is None else {**b.env, "i": layer}
        self.refs: dict[str, Any] = {f"a{j}": t for j, t in enumerate(args)}
        self._dims_env: dict[str, Any] | None = None
        self._dims: dict[Any, int] = {}
        self.inherited: set[str] = set()
        """References this instance shares with the segment instance it continues (:meth:`run`)."""
        self.proxy_holds: dict[int, list[Any]] = {}
        """Op index -> tensors a LoRA parametrization keeps until then (:meth:`module_return`)."""
        self.dropped_casts: dict[str, str] = {}
        self.frozen_casts: dict[str, list[Any]] = {}
        """A frozen weight's autocast copy (its ref) -> [the weight, the ops that read it directly] (:meth:`_recast`)."""
        """A cast's output -> its input, where the replay's dtype makes the cast return its input."""
        self._strides: dict[str, Any] = {}
        self._producer: dict[str, list[Any]] | None = None
        self.site_end: dict[int, list[dict[str, Any]]] = {}
        self.site_start: dict[int, list[dict[str, Any]]] = {}
        for site in seg.get("sites", []):
            self.site_end.setdefault(site["end"], []).append(site)
            self.site_start.setdefault(site["start"], []).append(site)

    def ref(self, r: str | None):
        if r is None:
            return None
        t = self.refs.get(r)
        if t is not None:
            return t
        b = self.b
        if r.startswith(("p:", "b:")):
            name = r[2:]
            concrete = name.replace("{i}", str(self.layer)) if self.layer is not None else name
            if r[0] == "p" and b.param_targets:
                mult = next((m for leaf, m in b.param_targets.items() if name.endswith("." + leaf)), None)
                if mult is not None:
                    t, held = kernels.param_lora(self, concrete, name, mult)
                    self.refs[r] = t  # the parametrized weight, cached for the owning module's forward
                    end = self.module_return(r)
                    if held and end is not None:
                        self.proxy_holds.setdefault(end, []).extend(held)
                    return t
            if r[0] == "b":
                return b.buffer(concrete, name)
            return b.param(concrete, repeat_template(name, b.af.param_index))  # norms.3 -> norms.{h}
        if r.startswith("x:"):
            return b.externals[r[2:]]
        if r.startswith("P"):
            return b.prologue.refs["t" + r[1:]]
        if r.startswith("t"):
            entry = self.seg["t"][int(r[1:])]
            if entry[2] == "const":  # a constant the model keeps (not a buffer): alive before the step
                shape = tuple(as_int(compile_expr(d)(self.env)) for d in entry[0])
                t = b.tr.external_tensor(math.prod(shape), b.dt(entry[1]), "constant")
                t.shape = shape
                self.refs[r] = t
                return t
        raise KeyError(f"unknown reference {r!r}")

    def module_return(self, r: str) -> int | None:
        """The op after which the module owning parameter ``r`` returns, as the recorded lifetimes show it: peft's
        ``ParamWrapper.forward`` keeps its parametrization (and the proxy's delta) for the whole
        ``base_layer(x)`` call, and the other tensors the ops reading the weight (or a view of it) use are locals
        of that forward (transformers' ``grouped_mm_experts_forward``: the sorted rows and the offsets; a
        router's cast input), which die when it returns: the latest of their recorded deaths, at least the last
        read. None: no op of this segment reads it."""
        chain = {r}
        for j, entry in enumerate(self.seg["t"]):
            if entry[2] in chain:
                chain.add(f"t{j}")
        die = self.seg.get("die", {})
        end = None
        for k, op in enumerate(self.seg["ops"]):
            refs = [x for _, v in op[1] for x in (v if isinstance(v, list) else [v]) if isinstance(x, str)]
            if not any(x in chain for x in refs):
                continue
            end = max(k, end or 0)
            for x in refs:
                if x not in chain and x.startswith("t") and isinstance(die.get(x), int):
                    end = max(end, die[x])
        return end

    def dim(self, d: str | int) -> int:
        """The size a learned file's dimension expression ``d`` has in this instance's environment (kept: a segment's
        tensors share a few dimensions)."""
        if self._dims_env is not self.env:  # (a loss head's sub-segment changes ``s``: :mod:`.loss_heads`)
            self._dims_env, self._dims = self.env, {}
        v = self._dims.get(d)
        if v is None:
            v = self._dims[d] = as_int(compile_expr(d)(self.env))
        return v

    def new_tensor(self, entry: list[Any], label: str = "t", dtype: str | None = None):
        dims, base = entry[0], entry[2]
        shape = tuple([self.dim(d) for d in dims])
        numel = math.prod(shape)
        dtype = dtype or self.b.dt(entry[1])
        tr = self.b.tr
        if base is None:
            t = tr.new(numel, dtype, False, label)
        elif base == "const":
            t = tr.external_tensor(numel, dtype, "constant")
        else:
            bt = self.ref(base)
            t = tr.view(bt, numel)
            t.dtype = dtype
            t.param = False
            if label != "_unsafe_view":  # an autograd view (``_unsafe_view``'s result is a tensor of its own)
                t.base = bt.base if bt.base is not None else bt  # in-place writes to it rebase its base
        t.shape = shape
        return t

    def run(self, first: int = 0, last: int | None = None) -> None:
        """Replay the segment's ops ``first`` to ``last`` (excluded; a part of one chunk of a chunked loss head,
        :mod:`.loss_heads`, whose :attr:`inherited` references are the epilogue's: their lifetimes stay its)."""
        b, tr, seg = self.b, self.b.tr, self.seg
        die: dict[str, Any] = seg.get("die", {})
        deaths_at: dict[int, list[str]] = {}
        for r, k in die.items():
            if isinstance(k, int):
                deaths_at.setdefault(k, []).append(r)
        logits_from = seg.get("logits_from")
        skip: set[int] = set()
        quantized = {}
        if b.spec.method == "qlora":
            # bitsandbytes replaces the nn.Linear / Conv1D modules of the decoder layers (the LM head and the
            # modules outside the layers stay in 16-bit: transformers' get_keys_to_not_convert; a subclass
            # of nn.Linear is not replaced: integrations/bitsandbytes.py:189)
            for site in seg.get("sites", []):
                if "{i}" in site["module"] and not site.get("custom"):
                    quantized[site["start"]] = site
        embed = seg.get("embed_out") if b.lora and b.spec.checkpointing else None
        if embed is not None and self._embedding_trains():
            embed = None
        head = loss_heads.head_site(self) if first == 0 else None
        fused = b.liger_plan(seg)
        output = b.af.data.get("output_module") or "lm_head"
        for k, op in enumerate(seg["ops"]):
            if k < first:
                continue
            if last is not None and k >= last:
                break
            if any(s["module"] == output for s in self.site_start.get(k, ())):
                tr.head_from = len(tr.ops)  # the LM head's first op (activation offloading stops there: trace/offload.py)
            if head is not None and k == head["start"]:
                loss_heads.run(self, head)  # the loss implementation's head replaces the recorded one
                if b.spec.loss not in loss_heads.OWN_LIFETIMES:
                    self._deaths([r for r, d in die.items() if isinstance(d, int) and d >= k])
                break
            if logits_from is not None and k >= logits_from:
                tr.kind_default = "logits"
            site = quantized.get(k)
            if b.spec.linear_saves_input and site is None:
                for s in self.site_start.get(k, ()):
                    kernels.zero3_linear_input(self, s)
            if site is not None:
                kernels.qlora_linear(self, site)
                skip.update(range(site["start"] + 1, site["end"] + 1))
            elif k in fused:
                liger.run(self, fused[k])  # Liger-Kernel's fused op in place of the recorded construct
            elif k not in skip:
                self.op(op)
                if op[0] == "embedding":  # the hook below is on the base nn.Embedding: its output is the leaf
                    if embed is not None and embed in self.refs:
                        self._input_requires_grad(self.refs[embed])
                        embed = None
                    kernels.lora_embedding(self, op)
            ends = self.site_end.get(k, ())
            if ends and b.lora and deaths_at.get(k):
                # what dies at a Linear's last op besides its input and output (F.linear's temporaries: autocast's
                # copy of the input) is gone when the base layer returns, before peft's adapter runs
                keep = {r for s in ends for r in (s["input"], s["output"])}
                self._deaths([r for r in deaths_at[k] if r not in keep])
                deaths_at[k] = [r for r in deaths_at[k] if r in keep]
            for s in ends:
                self._site_output(s)
                self._site_adapter(s, op)
            if embed is not None and embed in self.refs:
                self._input_requires_grad(self.refs[embed])
                embed = None
            self._deaths(deaths_at.get(k))
            if k in self.proxy_holds:
                tr.touch(*self.proxy_holds.pop(k))
        tr.kind_default = "activation"
        if last is not None:
            return
        for r, k in die.items():
            if k == "F" and r not in self.inherited:
                t = self.refs.get(r) if r.startswith(("t", "a")) else self.ref(r)
                if t is not None and t.sid >= 0 and t.sid not in tr.uncached:
                    tr.pinned.add(t.sid)

    def _site_adapter(self, site: dict[str, Any], op: list[Any]) -> None:
        """peft's adapter after call site ``site``'s last op ``op`` (:func:`.kernels.lora_site`), in that op's grad
        mode: ``lora.Linear.forward`` (peft 0.21 tuners/lora/layer.py) runs in its caller's, so at a site recorded
        under ``torch.no_grad`` (its ops ``ng``: the DSA indexer) the adapter makes no autograd node either
        (:attr:`.learned_graph.Builder.grad_off`)."""
        self.b.grad_off = bool((op[3] if len(op) > 3 else {}).get("ng"))
        try:
            kernels.lora_site(self, site)
        finally:
            self.b.grad_off = False

    def _embedding_trains(self) -> bool:
        """The input embedding is in ``modules_to_save``: its output already requires grad, and peft's
        ``enable_input_require_grads`` hook leaves it as it is (``requires_grad_`` on a non-leaf that requires grad)."""
        ops = self.seg.get("ops", ())
        weight = next((dict(op[1]).get("weight") for op in ops if op[0] == "embedding"), None)
        return isinstance(weight, str) and weight.startswith("p:") and self.b.saved(weight[2:])

    def _input_requires_grad(self, t) -> None:
        """peft + checkpointing: ``enable_input_require_grads()`` hooks the input embedding so that its output
        requires grad as it is returned, before the ops after it run (GPT-2's position add, an embedding
        dropout, Gemma's scaling: those then save and pass gradients); a leaf, kept by AccumulateGrad until
        the backward ends."""
        t.rg = True
        self.b.tr.leaves.add(t.sid)
        self.b.embed_out = t

    def _site_output(self, site: dict[str, Any]) -> None:
        """The call site's output is what its module returns (the weight is read through a transposed copy, which
        is not the parameter): recorded for the trace's ``param_ops``."""
        out = self.refs.get(site["output"]) or self.ref(site["output"])
        if out is not None:
            module = site["module"].replace("{i}", str(self.layer)) if self.layer is not None else site["module"]
            self.b.tr.param_outs.setdefault(module + ".weight", []).append(out)

    def op(self, op: list[Any]) -> None:
        b, tr = self.b, self.b.tr
        name, args, outs = op[0], op[1], op[2]
        extra = op[3] if len(op) > 3 else {}
        ins = []
        for an, v in args:
            ins.append((an, [self.ref(x) for x in v] if isinstance(v, list) else self._recast(v, self.ref(v))))
        if "fsv" in extra:  # a custom autograd Function's node: its saves are the tensors ctx.save_for_backward kept
            extra = {**extra, "sv": [t for t in (self.ref(x) for x in extra["fsv"]) if t is not None]}
        pseudo = extra.get("pseudo")
        if pseudo == "dropout":
            kernels.dropout(self, ins, outs, extra)
            return
        if pseudo == "sdpa":
            kernels.sdpa(self, ins, outs, extra)
            return
        if name == "_to_copy" and len(outs) == 1 and outs[0] not in self.refs and ins and ins[0][1] is not None:
            src = ins[0][1]
            if self.b.dt(self.seg["t"][int(outs[0][1:])][1]) == src.dtype:
                # ``x.to(dtype)`` when x already has it (fp32 runs of a graph recorded in 16-bit) returns x
                self.refs[outs[0]] = src
                self.dropped_casts[outs[0]] = args[0][1]
                return
        if name == "view" and self.dropped_casts and self._reshape_copies(args, outs):
            return
        weight_cast = name == "_to_copy" and b.mixed and ins and ins[0][1] is not None and ins[0][1].param
        if weight_cast and ins[0][1].rg and ins[0][1].key in b.ac_cache:
            # autocast casts a leaf that requires grad once per forward (its cache): a chunked loss head's
            # later chunks find the LM head weight's copy there (:mod:`.loss_heads`)
            self.refs[outs[0]] = b.ac_cache[ins[0][1].key]
            return
        prev = tr.kind_default
        if weight_cast:
            tr.kind_default = "autocast"
        out_ts = []
        inplace = []
        written_views = []
        override = kernels.cuda_output_dtypes(name, ins, b.spec.device)
        for j, r in enumerate(outs):
            if r in self.refs:  # in place: a new version of the same storage
                old = self.refs[r]
                nt = tr.view(old)
                nt.base = old.base
                self.refs[r] = nt
                out_ts.append(nt)
                if not old.rg:
                    inplace.append(nt)
                if old.base is not None and not old.param:
                    written_views.append(old)
            else:
                t = self.new_tensor(self.seg["t"][int(r[1:])], name, override.get(j))
                self.refs[r] = t
                out_ts.append(t)
        tr.kind_default = prev
        if not written_views:
            b.emit(name, ins, out_ts, extra=extra)
        else:
            bases = {id(v): self._current_base(v) for v in written_views}
            base_rg = {k: bt is not None and bt.rg for k, bt in bases.items()}
            b.emit(name, ins, out_ts, extra=extra)
            for v in written_views:
                if bases[id(v)] is not None and tr.ops and any(t.rg for t in tr.ops[-1].outs):
                    self._copy_slices(tr.ops[-1], v, bases[id(v)], base_rg[id(v)])
        for t in inplace:
            if t.rg and t.sid >= 0:
                self._inplace_requires_grad(t.sid)
        if weight_cast and ins[0][1].rg and b.spec.loss in loss_heads.CHUNKED:
            b.ac_cache[ins[0][1].key] = out_ts[0]
        if weight_cast and not ins[0][1].rg:
            # autocast caches a weight's 16-bit copy only when the weight requires grad (a frozen base
            # weight under LoRA is cast at every use and freed after it)
            for t in out_ts:
                tr.uncached.add(t.sid)
            self.frozen_casts[outs[0]] = [ins[0][1], 0]

    def _recast(self, ref: str, t):
        """``t`` (the tensor ``ref`` names) as this op reads it: a frozen weight's autocast copy that an earlier op
        already read directly is cast again. The recording (full fine-tuning: the weight is a leaf that requires
        grad) took a module's second call's copy from autocast's cache (ProphetNet's ``out_proj`` and
        ``relative_pos_embeddings``, run on the main and the predicting streams); frozen under LoRA, the weight is
        cast at every call (aten/src/ATen/autocast_mode.cpp ``cached_cast``: only a leaf that requires grad is
        cached), each copy saved by its own ``mm`` where the input requires grad."""
        entry = self.frozen_casts.get(ref) if isinstance(ref, str) else None
        if entry is None or t is None:
            return t
        entry[1] += 1
        if entry[1] == 1:
            return t
        b, tr = self.b, self.b.tr
        prev, tr.kind_default = tr.kind_default, "autocast"
        c = tr.new(t.numel, t.dtype, False, ref + ".recast")
        tr.kind_default = prev
        b.emit("_to_copy", [("self", entry[0])], [c])
        tr.uncached.add(c.sid)
        self.refs[ref] = c  # this call's views of the copy are views of its own copy
        return c

    def _reshape_copies(self, args: list[Any], outs: list[str]) -> bool:
        """A recorded ``view`` of a cast the replay dropped, which the cast's input cannot give: ``reshape`` copies
        there (:mod:`.strides`). Emits the copy and returns True; False: the view stands."""
        src_ref = dict(args).get("self")
        if not isinstance(src_ref, str) or not self._reads_dropped_cast(src_ref):
            return False
        st = self.strides(src_ref)
        shape = self.shape_of(outs[0])
        if st is None or strides.view_strides(self.shape_of(src_ref), st, shape) is not None:
            return False
        src = self.ref(src_ref)
        t = self.b.tr.new(math.prod(shape), src.dtype, False, "clone")
        t.shape = shape
        self.b.emit("clone", [("self", src)], [t])
        self.refs[outs[0]] = t
        self._strides[outs[0]] = strides.contiguous(shape)
        return True

    def _reads_dropped_cast(self, r: str | None) -> bool:
        while isinstance(r, str) and r.startswith("t"):
            if r in self.dropped_casts:
                return True
            r = self.seg["t"][int(r[1:])][2]
        return False

    def shape_of(self, r: str) -> tuple[int, ...]:
        return tuple(self.dim(d) for d in self.seg["t"][int(r[1:])][0])

    def strides(self, r: str) -> tuple[int, ...] | None:
        """The strides tensor ``r`` has in this replay (None: unknown), a dropped cast being its input."""
        if r in self._strides:
            return self._strides[r]
        v = None
        if r in self.dropped_casts:
            v = self.strides(self.dropped_casts[r])
        elif r.startswith("t"):
            entry = self.seg["t"][int(r[1:])]
            if entry[2] is None or entry[2] == "const":
                v = strides.contiguous(self.shape_of(r))
            else:
                if self._producer is None:
                    self._producer = {}
                    for op in self.seg["ops"]:
                        for o in op[2]:
                            self._producer.setdefault(o, op)
                op = self._producer.get(r)
                src = dict(op[1]).get("self") if op is not None else None
                st = self.strides(src) if isinstance(src, str) else None
                if st is not None:
                    v = strides.derived(op[0], [str(d) for d in self.seg["t"][int(src[1:])][0]], self.shape_of(src),
                                        st, [str(d) for d in entry[0]], self.shape_of(r))
        self._strides[r] = v
        return v

    def _current_base(self, view):
        """The tensor ``view`` is a view of, at its current version (the ref the model's code holds): the one it was
        taken from when the model still holds that, else the storage's other non-view tensor."""
        owners = [t for t in self.refs.values() if t is not None and t.sid == view.sid and t.base is None and not t.param]
        return view.base if any(t is view.base for t in owners) else next(iter(owners), None)

    def _copy_slices(self, op, view, base, base_rg: bool) -> None:
        """An in-place op on a view whose result requires grad (``key[..., :d].copy_(k)``): autograd rebases the
        *base*'s history on a ``CopySlices`` node wrapping the op's backward (``rebase_history``), and the tensors
        that read the base afterwards send their gradient there. Its backward (torch 2.13,
        torch/csrc/autograd/functions/tensor.cpp ``CopySlices_apply_functional``) allocates ``result``, a copy of
        the incoming gradient at the base's size, and passes a contiguous clone of the view's slice of it to the
        op's backward; the op's gradients for its other inputs are computed from that clone (``copy_``'s ``src``
        gets the clone itself, ``grad.to(src_options)``), its gradient for the view (zeros for ``copy_``) is
        copied into ``result``'s slice, and ``result`` goes on as the gradient of the base's previous version,
        or is dropped when that version did not require grad (a ``new_empty`` buffer). The recorded op becomes
        that node: it receives the new base version's gradient and gives new buffers."""
        nb = self.b.tr.view(base)
        nb.rg = True
        for r, t in list(self.refs.items()):
            if t is base:
                self.refs[r] = nb
        grad_ins, kinds = [], []
        temp, clone_given = 0, False
        for t, k in zip(op.grad_ins, op.grad_kinds):
            if t is view:  # the view's own gradient: computed (new) or the clone passed through, then copied in
                temp += view.nbytes if k < 0 else 0
                continue
            if k >= 0 and not clone_given:
                clone_given = True  # the clone itself goes on
            grad_ins.append(t)
            kinds.append(-1)
        if not clone_given:
            temp += view.nbytes  # the clone, freed when the op's backward returns
        if base_rg:
            grad_ins.append(base)
            kinds.append(-1)
        else:
            temp += base.nbytes  # ``result``, dropped
        op.outs = (nb,)
        op.grad_ins, op.grad_kinds = tuple(grad_ins), tuple(kinds)
        op.bwd_temp += temp

    def _inplace_requires_grad(self, sid: int) -> None:
        """An in-place op whose result requires grad (``key[..., :d].copy_(k)`` into a ``new_empty`` buffer, as
        DeepSeek's ``expand_kv`` fills its keys) makes the base require grad and with it every view of that
        storage, earlier or later: autograd rebases the base's history on ``CopySlices`` and a differentiable
        view requires grad when its base does (torch/csrc/autograd/variable.cpp, ``rebase_history``;
        ``DifferentiableViewMeta::requires_grad``). The ops that read them afterwards then save what PyTorch
        saves (``bmm`` saves its other operand only when this one requires grad)."""
        for t in self.refs.values():
            if t is not None and t.sid == sid and not t.rg and not t.param and t.dtype in FLOAT:
                t.rg = True

    def _deaths(self, refs: list[str] | None) -> None:
        if not refs:
            return
        ts = []
        for r in refs:
            if r in self.inherited:
                continue
            t = self.refs.get(r) if r.startswith(("t", "a")) else self.ref(r)
            if t is not None and t.sid >= 0:
                ts.append(t)
        if ts:
            self.b.tr.touch(*ts)
