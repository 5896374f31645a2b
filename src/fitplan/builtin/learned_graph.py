"""Replaying a learned architecture file as the step trace's ops (no torch, no per-model code).

A learned file (:mod:`.archfile`) holds the model's forward as recorded by ``fitplan learn-architecture``:
aten ops, the tensors they read and return (symbolic shapes, dtypes, which are views of which), when
Python lets each storage go, where the decoder layers, the ``nn.Linear`` call sites and the input
embedding are. :class:`Builder` turns it into :class:`~.step_trace.Op` records for the scenario, applying
what varies with the scenario through rules shared by every architecture:

* what autograd saves and which outputs require grad: PyTorch's ``derivatives.yaml`` rules per aten op
  (``rulesets/architectures/autograd.json``), evaluated on the scenario's requires-grad pattern
  (full fine-tuning, LoRA: frozen base, trainable adapters);
* the precision: the file records a 16-bit step and a ``torch.autocast`` step; ``32-true`` is the 16-bit
  graph in fp32 (a cast to the dtype a tensor already has is no op), fp16 the 16-bit graph in fp16;
* LoRA at ``nn.Linear`` / ``Conv1D`` call sites (peft 0.21 ``lora.Linear.forward``), QLoRA's 4-bit base
  layers, dropout and SDPA per device (:mod:`.kernels`), gradient checkpointing (the replay's recompute),
  DeepSpeed ZeRO-3's ``F.linear`` that saves its input at every ``nn.Linear`` site (``linear_saves_input``);
* the backward: per op, whether each input gradient is a new tensor or the incoming one passed through
  (the table's formula, or what the learner saw), the node's transient bytes, and AccumulateGrad.
"""

from __future__ import annotations

import math
from typing import Any

from .archexpr import compile_expr
from .archfile import BYTES, ArchFile, autograd_table
from . import kernels, op_work
from .lora_targets import lora_site_matches, parameter_targets

FLOAT = ("f32", "bf16", "f16", "f64", "c64")
"""The dtypes autograd differentiates: floating and complex (``isDifferentiableType``,
torch/csrc/autograd/variable.h, torch 2.13). Complex counts: Llama-4's and DeepSeek-V2's rotary embedding
multiplies ``view_as_complex`` views, and q and k keep requiring grad through them."""


_TRACE_DTYPE = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


def dtype_map(precision: str) -> tuple[str, dict[str, str]]:
    """(recorded graph, dtype renaming) for a precision preset (:data:`fitplan.inputs.precision.PRESETS`):
    autocast presets replay the graph recorded under autocast, the others the 16-bit graph with bf16
    renamed to the preset's weight dtype."""
    from fitplan.inputs.precision import PRESETS

    p = PRESETS[precision]
    if p.autocast:
        return "mixed", {"bf16": _TRACE_DTYPE[p.compute_dtype]}
    return "16", {"bf16": _TRACE_DTYPE[p.weight_dtype]}


class Builder:
    """Instantiates one learned file's segments into a :class:`~.step_trace.Trace`."""

    def __init__(self, tr, af: ArchFile, env: dict[str, Any]) -> None:
        self.tr = tr
        self.af = af
        self.spec = tr.spec
        self.env = {**env, "b": self.spec.batch, "s": self.spec.seq}
        self.table = {**autograd_table(), **af.graphs.get("autograd", {}), **kernels.EXTRA_RULES}
        self.graph_precision, self.dmap = dtype_map(self.spec.precision)
        self.variant = af.variant(self.graph_precision, "eager" if self.spec.attn == "eager" else "sdpa", self.env)
        self.mixed = self.graph_precision == "mixed"
        self.compute = self.dmap.get("bf16", "bf16")
        from fitplan.inputs.precision import PRESETS

        self.adapter = _TRACE_DTYPE[self.spec.adapter_dtype]
        """LoRA adapters' dtype (peft keeps them in fp32; TRL and DeepSpeed's module cast change it)."""
        self.quant = _TRACE_DTYPE[self.spec.quant_compute or PRESETS[self.spec.precision].compute_dtype]
        """QLoRA: ``bnb_4bit_compute_dtype``, the dtype of the 4-bit layers' matmuls."""
        self.lora = self.spec.method in ("lora", "qlora")
        self.params: dict[str, Any] = {}
        self.ac_cache: dict[str, Any] = {}
        self.param_dtypes = {p[0]: p[5] if len(p) > 5 else "bf16" for p in af.params}
        self.param_uses: dict[int, int] = {}
        self.embed_out = None
        self.param_targets: dict[str, int] = {}
        self.tied = af.tie(self.env)
        """Parameter name -> the parameter it is (tied embeddings: ``lm_head.weight`` is the input embedding)."""
        if self.lora:
            self.param_targets = parameter_targets(af, tuple(self.spec.lora_targets))

    # ------------------------------------------------------------------ tensors
    def dt(self, code: str) -> str:
        return self.dmap.get(code, code)

    def param(self, name: str, template: str | None = None):
        t = self.params.get(name)
        if t is None and name in self.tied:
            t = self.params[name] = self.tied_param(name)
        if t is None:
            code = self.param_dtypes.get(template or name, "bf16")
            if self.mixed:
                dtype = "f32" if code in ("bf16", "f32") else code
            else:
                dtype = self.dt(code)
            numel = self.param_numel(template or name, name)
            trainable = not self.lora and dtype in FLOAT
            t = self.tr.param(numel, dtype, trainable)
            t.name = name
            self.params[name] = t
        return t

    def tied_param(self, name: str):
        """A tied parameter: the tensor it is tied to under its own name (the ops that read it stay its module's),
        one gradient (:attr:`.step_trace.T.key` is the target's): autograd's ``AccumulateGrad`` of the shared tensor
        waits in its input buffer until every use has contributed (torch/csrc/autograd/engine.cpp dependencies), so
        the output embedding's gradient stays alive from the head's backward to the input embedding's."""
        src = self.param(self.tied[name])
        t = self.tr.param(src.numel, src.dtype, src.rg)
        t.name, t.tie = name, src
        return t

    def param_numel(self, template: str, name: str) -> int:
        i = _layer_of(name)
        env = self.env if i is None else {**self.env, "i": i}
        entry = self.af.param_entry(template, env)
        if entry is None:
            return 1
        return math.prod(int(compile_expr(d)(env)) for d in entry[1])

    def buffer(self, name: str, template: str):
        t = self.params.get("b:" + name)
        if t is None:
            entry = self.af.buffer_index.get(template)
            numel, code = 1, "f32"
            if entry is not None:
                i = _layer_of(name)
                env = self.env if i is None else {**self.env, "i": i}
                numel = math.prod(int(compile_expr(d)(env)) for d in entry[1])
                code = entry[2]
            dtype = ("f32" if code == "bf16" else code) if self.mixed else self.dt(code)
            t = self.tr.param(numel, dtype, False)
            self.params["b:" + name] = t
        return t

    # ------------------------------------------------------------------ one aten op
    def emit(self, name: str, args: list[tuple[str, Any]], outs: list[Any], *, extra: dict[str, Any] | None = None,
             label: str | None = None) -> None:
        """Record aten op ``name`` reading ``args`` (``(arg name, T or [T])``) and returning ``outs`` (T; an
        input T for in-place ops): requires-grad, saves and the backward from PyTorch's rules."""
        tr = self.tr
        extra = extra or {}
        if name not in self.table:
            from ..errors import FitplanError

            raise FitplanError(f"aten op {name!r} is not in the autograd rules table", file=str(self.af.path),
                               suggestion="re-learn the architecture with this fitplan (fitplan learn-architecture)")
        rule = self.table[name]
        named: dict[str, Any] = {}
        flat_in: list[Any] = []
        for an, v in args:
            named[an] = v
            if isinstance(v, list):
                flat_in.extend(x for x in v if x is not None)
            elif v is not None:
                flat_in.append(v)
        edges: list[Any] = []
        if rule is not None:
            for d in rule["d"]:
                v = named.get(d.rstrip("*"))
                if isinstance(v, list):
                    edges.extend(v)
                else:
                    edges.append(v)
        any_rg = any(t is not None and t.rg and t.dtype in FLOAT for t in edges)
        node = rule is not None and any_rg
        odiff = rule.get("o") if rule else None
        rnames = rule.get("r", ["result"] if len(outs) == 1 else [f"result{k}" for k in range(len(outs))]) if rule else []
        for k, o in enumerate(outs):
            o.rg = bool(node and o.dtype in FLOAT and (odiff is None or (k < len(odiff) and odiff[k])))
        saved, clones = self.saves(rule, named, outs, rnames, label or name) if node else ([], [])
        explicit = extra.get("sv")
        if explicit is not None and any_rg:
            saved = explicit
            clones = []
        kinds = extra.get("g")
        grad_ins: list[tuple[Any, int]] = []
        params: list[tuple[Any, int]] = []
        if node:
            passes = rule.get("p", [])
            for e, t in enumerate(edges):
                if t is None or not t.rg or t.dtype not in FLOAT:
                    continue
                k = -1
                if kinds is not None and e < len(kinds):
                    if kinds[e] == "p":
                        k = 0
                elif e < len(passes) and passes[e] and outs and outs[0].numel == t.numel and outs[0].dtype == t.dtype:
                    k = 0
                if t.param:
                    params.append((t, k))
                else:
                    grad_ins.append((t, k))
        saved = saved if node else []
        work = op_work.aten(name, named, outs, saved, [t for t, _ in grad_ins], [k for _, k in grad_ins],
                            sum(p.nbytes for p, _ in params), node)
        tr.emit(label or name, flat_in, outs + clones, saved, grad_ins, params, node,
                bwd_temp=int(compile_expr(extra["bt"])(self.env)) if node and extra.get("bt") else 0, work=work)

    def saves(self, rule: dict[str, Any], named: dict[str, Any], outs: list[Any], rnames: list[str],
              label: str) -> tuple[list[Any], list[Any]]:
        """What the op's node saves (the table's ``s`` entries whose guard input requires grad), and the clones an
        in-place op makes of ``self`` for it (:meth:`original_self`)."""
        saved: list[Any] = []
        clones: list[Any] = []
        for sname, guard in rule["s"]:
            if guard is not None:
                g = named.get(guard)
                if g is None or isinstance(g, list) or not g.rg:
                    continue
            t = named.get(sname)
            if sname == "self" and rule.get("inplace") and t is not None and not isinstance(t, list):
                t = self.original_self(t, label)
                clones.append(t)
            if t is None and sname in rnames:
                k = rnames.index(sname)
                t = outs[k] if k < len(outs) else None
            if t is None and sname == "original_self":
                continue
            if isinstance(t, list):
                saved.extend(x for x in t if x is not None)
            elif t is not None:
                saved.append(t)
        return saved, clones

    def original_self(self, t, label: str):
        """What an in-place op saves for ``self``: the generated ``VariableType`` kernel saves
        ``original_self = self.clone()`` before the op overwrites it (torchgen/packaged/autograd/
        gen_variable_type.py ``save_variables``, torch 2.13), a new contiguous storage of ``self``'s elements,
        not ``self``'s storage (which the op mutates, and which a later op may save as well)."""
        c = self.tr.new(t.numel, t.dtype, False, label + ".original_self")
        c.shape = t.shape
        return c

    # ------------------------------------------------------------------ segments
    def run(self) -> None:
        tr, af, v = self.tr, self.af, self.variant
        self.externals = {"input_ids": tr.external_tensor(self.spec.batch * self.spec.seq, "i64", "input_ids"),
                          "labels": tr.external_tensor(self.spec.batch * self.spec.seq, "i64", "labels")}
        kinds = af.layer_kinds(self.env)
        pro = self.segment(af.segments[v["prologue"]], "prologue", args=[], layer=None)
        self.prologue = pro
        plan = self.layer_plan(kinds)
        h = None
        for first, count, weight in plan:
            tr.segment(f"layers {first}..{first + count * weight - 1}" if weight > 1 or count > 1 else f"layer {first}",
                       weight, self.spec.checkpointing)
            for j in range(count):
                i = first + j
                kind = kinds[i]
                seg = af.segments[v["layers"][kind]]
                bind = []
                for ref in v["layer_args"][kind]:
                    if ref == "h":
                        bind.append(h if h is not None else pro.refs["t" + v["first_input"][1:]])
                    else:
                        bind.append(pro.refs["t" + ref[1:]])
                if self.spec.checkpointing:  # each layer is its own checkpoint (GradientCheckpointingLayer)
                    tr.ckpt_keep[i] = {t.sid for t in bind if t is not None and t.sid >= 0}
                tr.unit = i
                inst = self.segment(seg, f"layer {i}", args=bind, layer=i)
                tr.unit = -1
                h = inst.refs[seg["out"]]
        tr.segment("epilogue")
        epi = self.segment(af.segments[v["epilogue"]], "epilogue", args=[h], layer=None)
        tr.loss = epi.refs[af.segments[v["epilogue"]]["loss"]]
        tr.buffer_bytes = self.buffer_bytes()

    def buffer_bytes(self) -> int:
        """The model's buffers (rotary ``inv_freq``, ...), as the learned file lists them."""
        total = 0
        L = self.af.n_layers(self.env)
        for name, dims, code, per_layer in self.af.buffers:
            dtype = ("f32" if code == "bf16" else code) if self.mixed else self.dt(code)
            for i in (range(L) if per_layer else (None,)):
                env = self.env if i is None else {**self.env, "i": i}
                total += math.prod(int(compile_expr(d)(env)) for d in dims) * BYTES[dtype]
        return total

    def layer_plan(self, kinds: list[str]) -> list[tuple[int, int, int]]:
        """``(first layer, layers per block, repetitions)``: layer 0 alone (its input does not require grad
        under LoRA), then the rest as a repeated block of the smallest period of the kind pattern (and of
        the LoRA targets, which may name layers), then what is left one layer at a time."""
        L = len(kinds)
        sig = [(k, self.lora_signature(i)) for i, k in enumerate(kinds)]
        plan = [(0, 1, 1)]
        rest = sig[1:]
        if not rest:
            return plan
        n = len(rest)
        period = n
        for p in range(1, min(n, 16) + 1):
            if all(rest[j] == rest[j + p] for j in range(n - p)):
                period = p
                break
        reps = n // period
        if reps >= 2:
            plan.append((1, period, reps))
            done = 1 + period * reps
        else:
            done = 1
        for i in range(done, L):
            plan.append((i, 1, 1))
        return plan

    def lora_signature(self, i: int) -> tuple:
        if not self.lora:
            return ()
        return tuple(lora_site_matches(m.replace("{i}", str(i)), self.spec.lora_targets, self.af)
                     for m in self.af.layer_sites)

    def segment(self, seg: dict[str, Any], name: str, *, args: list[Any], layer: int | None) -> "_Instance":
        inst = _Instance(self, seg, args, layer)
        inst.run()
        return inst


class _Instance:
    """One instantiation of a segment (the prologue, a layer, the epilogue)."""

    def __init__(self, b: Builder, seg: dict[str, Any], args: list[Any], layer: int | None) -> None:
        self.b = b
        self.seg = seg
        self.layer = layer
        self.env = b.env if layer is None else {**b.env, "i": layer}
        self.refs: dict[str, Any] = {f"a{j}": t for j, t in enumerate(args)}
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
                    t = kernels.param_lora(self, concrete, name, mult)
                    self.refs[r] = t  # the parametrized weight, cached for the owning module's forward
                    return t
            return b.param(concrete, name) if r[0] == "p" else b.buffer(concrete, name)
        if r.startswith("x:"):
            return b.externals[r[2:]]
        if r.startswith("P"):
            return b.prologue.refs["t" + r[1:]]
        if r.startswith("t"):
            entry = self.seg["t"][int(r[1:])]
            if entry[2] == "const":  # a constant the model keeps (not a buffer): alive before the step
                shape = tuple(int(compile_expr(d)(self.env)) for d in entry[0])
                t = b.tr.external_tensor(math.prod(shape), b.dt(entry[1]), "constant")
                t.shape = shape
                self.refs[r] = t
                return t
        raise KeyError(f"unknown reference {r!r}")

    def new_tensor(self, entry: list[Any], label: str = "t", dtype: str | None = None):
        dims, base = entry[0], entry[2]
        shape = tuple(int(compile_expr(d)(self.env)) for d in dims)
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

    def run(self) -> None:
        b, tr, seg = self.b, self.b.tr, self.seg
        tensors = seg["t"]
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
        for k, op in enumerate(seg["ops"]):
            if logits_from is not None and k >= logits_from:
                tr.kind_default = "logits"
            site = quantized.get(k)
            if b.spec.linear_saves_input and site is None:
                for s in self.site_start.get(k, ()):
                    kernels.zero3_linear_input(self, s)
            if site is not None:
                kernels.qlora_linear(self, site)
                skip.update(range(site["start"] + 1, site["end"] + 1))
            elif k not in skip:
                self.op(op)
            for s in self.site_end.get(k, ()):
                self._site_output(s)
                kernels.lora_site(self, s)
            if embed is not None and embed in self.refs:
                self._input_requires_grad(self.refs[embed])
                embed = None
            self._deaths(deaths_at.get(k))
        tr.kind_default = "activation"
        for r, k in die.items():
            if k == "F":
                t = self.refs.get(r) if r.startswith(("t", "a")) else self.ref(r)
                if t is not None and t.sid >= 0 and t.sid not in tr.uncached:
                    tr.pinned.add(t.sid)

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
            ins.append((an, [self.ref(x) for x in v] if isinstance(v, list) else self.ref(v)))
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
                return
        weight_cast = name == "_to_copy" and b.mixed and ins and ins[0][1] is not None and ins[0][1].param
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
        bases = {id(v): self._current_base(v) for v in written_views}
        base_rg = {k: bt is not None and bt.rg for k, bt in bases.items()}
        b.emit(name, ins, out_ts, extra=extra)
        for v in written_views:
            if bases[id(v)] is not None and tr.ops and any(t.rg for t in tr.ops[-1].outs):
                self._copy_slices(tr.ops[-1], v, bases[id(v)], base_rg[id(v)])
        for t in inplace:
            if t.rg and t.sid >= 0:
                self._inplace_requires_grad(t.sid)
        if weight_cast and not ins[0][1].rg:
            # autocast caches a weight's 16-bit copy only when the weight requires grad (a frozen base
            # weight under LoRA is cast at every use and freed after it)
            for t in out_ts:
                tr.uncached.add(t.sid)

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
            t = self.refs.get(r) if r.startswith(("t", "a")) else self.ref(r)
            if t is not None and t.sid >= 0:
                ts.append(t)
        if ts:
            self.b.tr.touch(*ts)


def _layer_of(name: str) -> int | None:
    import re

    m = re.search(r"\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def _template(name: str) -> str:
    import re

    return re.sub(r"\.(\d+)\.", ".{i}.", name, count=1)
