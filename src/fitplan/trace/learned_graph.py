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

from fitplan.arch.learned_repeat import unroll as unroll_repeats
from fitplan.arch.archexpr import compile_expr
from fitplan.arch.archfile import BYTES, FLOAT, ArchFile, autograd_table
from fitplan.trace import kernels, layer_refs, liger, loss_heads, op_work
from fitplan.trace.learned_segment import Segment
from fitplan.trace.symbolic import as_int
from fitplan.trace.lora_targets import lora_site_matches, parameter_targets

_TRACE_DTYPE = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
BACKWARD_TEMPORARIES = {"pow.Tensor_Scalar": ("self", 2), "linalg_solve_triangular": ("self", 1)}
"""Ops whose derivative formula allocates intermediates beside the gradient it returns: ``(input, count)``, that
many tensors of the input's size and dtype alive with the gradient. The autograd table (derivatives.yaml) says
what is saved, not what the formula computes. ``pow.Tensor_Scalar``: ``pow_backward`` (torch 2.13,
torch/csrc/autograd/FunctionsManual.cpp) returns ``grad * (exponent * self.pow(exponent - 1))``, whose two
temporaries (``self.pow(exponent - 1)`` and its product with the exponent) live until the full expression
ends: measured, ``x.pow(2)``'s backward holds three ``x``-sized tensors (every RMSNorm's variance).
``linalg_solve_triangular`` (``A X = B``): ``linalg_solve_triangular_backward`` computes ``gA = -gB.matmul(X.mH())``
then ``gA.tril()`` (or ``triu``): the matmul's product and its negation are both alive before the projection, one
``A``-sized tensor beside the gradients it returns (the gated delta rule's UT solve: Qwen3-Next, OLMo-Hybrid). Where
``B`` needs no gradient, ``gB`` is a temporary too, which this does not count."""


def dtype_map(precision: str) -> tuple[str, dict[str, str]]:
    """(recorded graph, dtype renaming) for a precision preset (:data:`fitplan.inputs.precision.PRESETS`):
    autocast over weights of another dtype replays the graph recorded under autocast (its weights, recorded
    fp32, take the preset's weight dtype: :meth:`Builder.param`); the others the 16-bit graph with bf16 renamed
    to the preset's weight dtype. Autocast over weights already in its dtype (``bf16-autocast``) is the 16-bit
    graph: the lower-precision ops (``mm``, ``addmm``, SDPA, ...: torch/csrc/autocast_mode.cpp) find their inputs
    in the compute dtype and cast nothing, and the models' own upcasts (RMSNorm, softmax, the loss) are in the
    recorded ops. On CUDA, ops on autocast's fp32 list (``layer_norm``, ``softmax`` and ``log_softmax`` without a
    dtype, ``pow``, ``rsqrt``, ...) would return fp32 for 16-bit inputs; the CPU referee's list has none of them
    for the ops the bundled models record, so a CUDA step of a model calling ``nn.LayerNorm`` on 16-bit inputs
    is modelled with 16-bit LayerNorm outputs (docs/memory-model.md, known misses)."""
    from fitplan.inputs.precision import PRESETS

    p = PRESETS[precision]
    if p.graph_class == "mixed":
        return "mixed", {"bf16": _TRACE_DTYPE[p.compute_dtype]}
    return "16", {"bf16": _TRACE_DTYPE[p.weight_dtype]}


class Builder:
    """Instantiates one learned file's segments into a :class:`~.step_trace.Trace`."""

    def __init__(self, tr, af: ArchFile, env: dict[str, Any]) -> None:
        self.tr = tr
        self.af = af
        self.spec = tr.spec
        self.env = {**env, "b": self.spec.batch, "s": self.spec.seq}
        self.dargs: dict[str, list[str]] = {}
        """Op name -> :meth:`differentiable_args`."""
        self.table = {**autograd_table(), **af.graphs.get("autograd", {}), **kernels.EXTRA_RULES, **loss_heads.RULES,
                      **liger.RULES}
        self.graph_precision, self.dmap = dtype_map(self.spec.precision)
        self.variant = af.variant(self.graph_precision, "eager" if self.spec.attn == "eager" else "sdpa", self.env)
        self.mixed = self.graph_precision == "mixed"
        self.compute = self.dmap.get("bf16", "bf16")
        from fitplan.inputs.precision import PRESETS

        self.weight = _TRACE_DTYPE[PRESETS[self.spec.precision].weight_dtype]
        """The dtype the weights were loaded in (fp32 for ``*-mixed``; 16-bit for ``bf16-autocast-fp16w``)."""

        adapter, _, adapter_input = self.spec.adapter_dtype.partition("<")
        self.adapter = _TRACE_DTYPE[adapter]
        self.grad_off = False
        """Ops emitted now run with grad mode off: peft's adapter at a call site recorded under ``no_grad``
        (:meth:`.learned_segment.Segment._site_adapter`); autograd makes no node for them
        (torch/csrc/autograd/functions/utils.h ``compute_requires_grad`` is false while grad mode is off)."""
        """LoRA adapters' dtype (peft keeps them in fp32; TRL and DeepSpeed's module cast change it)."""
        self.adapter_input = _TRACE_DTYPE[adapter_input or adapter]
        """The dtype peft casts an adapter's input to (``lora_A.weight.dtype`` when peft reads it: FSDP1's shard)."""
        self.quant = _TRACE_DTYPE[self.spec.quant_compute or PRESETS[self.spec.precision].compute_dtype]
        """QLoRA: ``bnb_4bit_compute_dtype``, the dtype of the 4-bit layers' matmuls."""
        self.lora = self.spec.method in ("lora", "qlora")
        self.params: dict[str, Any] = {}
        self.unrolled: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        """id(segment) -> (the segment, kept alive; its repeated blocks unrolled for this scenario)."""
        self.ac_cache: dict[str, Any] = {}
        self.lora_pairs: dict[str, tuple[Any, Any]] = {}
        self.param_dtypes = {p[0]: p[5] if len(p) > 5 else "bf16" for p in af.params}
        self.frozen = set(af.data.get("frozen") or ())  # parameters the model creates with requires_grad=False
        self.param_uses: dict[int, int] = {}
        self.embed_out = None
        self.param_targets: dict[str, int] = {}
        self.tied = af.tie(self.env)
        """Parameter name -> the parameter it is (tied embeddings: ``lm_head.weight`` is the input embedding)."""
        if self.lora:
            self.param_targets = parameter_targets(af, tuple(self.spec.lora_targets))
        self.liger = liger.patch_for(self.spec.arch.model_type) if self.spec.liger else None
        """What ``use_liger_kernel`` patches (:mod:`.liger`); None: nothing."""
        self.liger_plans: dict[int, dict[int, tuple]] = {}

    # ------------------------------------------------------------------ tensors

    def adapters(self, module: str, a_numel: int, b_numel: int, dtype: str) -> tuple[Any, Any]:
        """peft's ``lora_A`` and ``lora_B`` weights of ``module``: one pair per module (peft 0.21
        tuners/lora/layer.py ``LoraLayer.update_layer``), shared by every call of it in the step (ProphetNet's
        n-gram attention runs ``out_proj`` and ``relative_pos_embeddings`` on the main and the predicting streams):
        one autocast copy each (autocast's cache of a leaf that requires grad), one gradient each."""
        pair = self.lora_pairs.get(module)
        if pair is None:
            a, b = self.tr.param(a_numel, dtype, True), self.tr.param(b_numel, dtype, True)
            a.name, b.name = module + ".lora_A", module + ".lora_B"
            pair = self.lora_pairs[module] = (a, b)
        return pair
    def dt(self, code: str) -> str:
        return self.dmap.get(code, code)

    def param(self, name: str, template: str | None = None):
        t = self.params.get(name)
        if t is None and name in self.tied:
            t = self.params[name] = self.tied_param(name)
        if t is None:
            code = self.param_dtypes.get(template or name, "bf16")
            if self.mixed:
                dtype = self.weight if code in ("bf16", "f32") else code
            else:
                dtype = self.dt(code)
            numel = self.param_numel(template or name, name)
            trainable = ((not self.lora or self.saved(name)) and not self.spec.frozen and dtype in FLOAT
                         and (template or name) not in self.frozen)  # requires_grad=False in the model
            t = self.tr.param(numel, dtype, trainable)
            t.name = name
            self.params[name] = t
        return t

    def saved(self, name: str) -> bool:
        """Is parameter ``name`` in a module of peft's ``modules_to_save`` (the trained copy's parameter)?
        peft's rule: the module's full name ends with a listed name (utils/other.py ``_set_trainable``)."""
        module = name.rsplit(".", 1)[0]
        return any(module.endswith(m) for m in self.spec.lora_saved)

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
            from fitplan.errors import FitplanError

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
        any_rg = False
        if rule is not None:
            for d in self.differentiable_args(name, rule):
                v = named.get(d)
                if isinstance(v, list):
                    edges.extend(v)
                    any_rg = any_rg or any(t is not None and t.rg and t.dtype in FLOAT for t in v)
                else:
                    edges.append(v)
                    any_rg = any_rg or (v is not None and v.rg and v.dtype in FLOAT)
        # ng: recorded with grad mode off (a custom autograd Function's forward, a ``torch.no_grad`` block): no node
        node = rule is not None and any_rg and not extra.get("ng") and not self.grad_off
        if node:
            odiff = rule.get("o")
            for k, o in enumerate(outs):
                o.rg = o.dtype in FLOAT and (odiff is None or (k < len(odiff) and bool(odiff[k])))
            rnames = rule["r"] if "r" in rule else ["result"] if len(outs) == 1 else [f"result{k}" for k in range(len(outs))]
            saved, clones = self.saves(rule, named, outs, rnames, label or name)
        else:
            for o in outs:
                o.rg = False
            saved, clones = [], []
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
        reduced, cast = self.broadcast_gradients(rule, edges, outs) if node else (0, 0)
        work = op_work.aten(name, named, outs, saved, [t for t, _ in grad_ins], [k for _, k in grad_ins],
                            sum(p.nbytes for p, _ in params), node)
        temp = self.backward_temporaries(name, named, extra) + reduced if node else 0
        tr.emit(label or name, flat_in, outs + clones, saved, grad_ins, params, node, bwd_temp=temp, work=work,
                cast_temp=cast)

    def backward_temporaries(self, name: str, named: dict[str, Any], extra: dict[str, Any]) -> int:
        """Bytes the op's backward holds beside the gradients it returns: the file's ``bt`` (an expression),
        :data:`BACKWARD_TEMPORARIES`, and ``bti``, a custom autograd Function's measured transient as a multiple of
        its first input's bytes (its backward is Python code no derivatives.yaml entry describes: the learner saw
        it run, fitplan-torch learn/autograd_rules.py ``function_temporaries``)."""
        temp = as_int(compile_expr(extra["bt"])(self.env)) if extra.get("bt") else 0
        arg, count = BACKWARD_TEMPORARIES.get(name, (None, 0))
        if extra.get("bti"):
            arg, count = "inputs", extra["bti"]
        t = named.get(arg) if arg else None
        if isinstance(t, list):
            t = next((x for x in t if x is not None), None)
        if t is not None and t.rg and count:  # whole tensors of the input's size, each its own allocation
            whole, n = int(count), t.nbytes
            temp += whole * self._rounded(n)
            if count != whole:  # a fraction of the input (a plain number: n may be symbolic, trace/symbolic.py)
                temp += self._rounded(as_int(round((count - whole) * n)))
        return temp

    def broadcast_gradients(self, rule: dict[str, Any], edges: list[Any], outs: list[Any]) -> tuple[int, int]:
        """Bytes a pointwise op's backward holds beyond its inputs' gradients for the inputs it broadcast (the
        table's ``pw``): a formula that does not pass the gradient through (``grad * other`` for ``mul``) computes
        each input's gradient at the output's shape, and autograd's engine reduces one of a smaller input to that
        input's shape only after the node returns and its incoming gradient is freed (``validate_outputs``,
        ``at::sum_to``: torch/csrc/autograd/engine.cpp). At the node's peak each such gradient is then the
        output's size, not its input's: the difference is a temporary. Measured on torch 2.13 CPU: an MoE's
        ``proj_out * sample_weights_g.unsqueeze(-1)`` holds a second ``tokens × top_k × hidden`` tensor for the
        routing weights' gradient (transformers integrations/moe.py ``grouped_mm_experts_forward``). The sum itself
        is not an instant of its own: there the reduced gradient is alive too, with the node's saved tensors where
        nothing frees them first (without checkpointing; a recomputed layer's unpacked ones are freed when the node
        returns), at most the broadcast input's bytes more (``b·s·4`` for a norm's statistic).

        The same holds for the dtype: such a formula computes in the dtype of the incoming gradient, the output's
        (``mul_tensor_backward`` is ``grad * other``, FunctionsManual.cpp, with no cast to the input's type), and
        the engine casts a gradient to its input's dtype in ``validate_outputs`` after the node returns. An input
        of a narrower dtype than the op's promoted output (a bf16 ``proj_out`` times fp32 routing weights: an
        fp32 product) has its gradient at the output's width at the node's peak. Unlike a broadcast's sum, the
        cast is an instant of its own: ``validate_outputs`` replaces ``grads[i]`` with ``grad.to(dtype)``, input
        by input in edge order, while the node's incoming gradient (``call_function``'s ``inputs``) and the
        gradients of the later inputs, still at the output's width, are alive; at that instant input ``i``'s
        gradient is there in both widths. Measured on torch 2.13 CPU: the Mamba-2 chunked scan's ``G * L``
        (``G`` a bf16 ``bmm`` under autocast, ``L`` fp32: transformers models/nemotron_h/modeling_nemotron_h.py
        ``mamba2_chunk_scan``) peaks with ``G``'s gradient in fp32 and in bf16.

        Returns the bytes held at the node's return beyond the gradients at their inputs' sizes and widths, and
        those held at the latest cast's instant (0: no cast); the replay records the cast's instant after the
        node's, when a recomputed layer's unpacked saved tensors are gone (:meth:`.step_trace.Replay._backward_op`)."""
        if not rule.get("pw") or not outs:
            return 0, 0
        out, passes, steps = outs[0], rule.get("p", []), []
        for e, t in enumerate(edges):
            if t is None or not t.rg or t.dtype not in FLOAT or (e < len(passes) and passes[e]):
                continue
            if t.numel <= out.numel and t.nbytes < out.nbytes:
                cast = BYTES[t.dtype] < BYTES[out.dtype]  # (after the sum to its shape, if it broadcast)
                steps.append((self._rounded(out.nbytes) - self._rounded(t.nbytes),
                              self._rounded(t.numel * BYTES[out.dtype]) if cast else 0))
        held = later = sum(d for d, _ in steps)
        cast = 0
        for d, wide in steps:  # input by input: this one's gradient at both widths, the later ones' still wide
            later -= d
            if wide:
                cast = max(cast, later + wide)
        return held, cast

    def _rounded(self, n: int) -> int:
        """``n`` bytes as the CUDA caching allocator hands them out (rounded up to its block), else as they are."""
        tr = self.tr
        return -(-n // tr.spec.block) * tr.spec.block if tr.rounding else n

    def differentiable_args(self, name: str, rule: dict[str, Any]) -> list[str]:
        """The argument names of op ``name``'s differentiable inputs (its rule's ``d``, a list's ``*`` mark dropped)."""
        names = self.dargs.get(name)
        if names is None:
            names = self.dargs[name] = [d.rstrip("*") for d in rule["d"]]
        return names

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
        made = layer_refs.cross_layer(v)
        plan = self.layer_plan(kinds) if made is None else [(i, 1, 1) for i in range(len(kinds))]
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
                    elif isinstance(ref, list) and ref[0] == "layer":  # ["layer", expr, "t<k>"]: an earlier layer's
                        bind.append(made[layer_refs.maker(self.env, ref[1], i)].refs[ref[2]])
                    elif isinstance(ref, list):  # ["select", "P<k>", d]: the prologue tensor's slice i on dim d
                        bind.append(self.select(pro.refs["t" + ref[1][1:]], ref[2], i))
                    else:
                        bind.append(pro.refs["t" + ref[1:]])
                if self.spec.checkpointing:  # each layer is its own checkpoint (GradientCheckpointingLayer)
                    # the hidden states are its one positional argument, saved through the saved-tensor hooks
                    # (torch/utils/checkpoint.py save_inputs); the keyword ones stay in a functools.partial
                    # (transformers/modeling_layers.py GradientCheckpointingLayer.__call__)
                    tr.ckpt_keep[i] = {}
                    for ref, t in zip(v["layer_args"][kind], bind):
                        if t is not None and t.sid >= 0:
                            tr.ckpt_keep[i][t.sid] = tr.ckpt_keep[i].get(t.sid, False) or ref == "h"
                tr.unit = i
                inst = self.segment(seg, f"layer {i}", args=bind, layer=i)
                if made is not None:
                    made[i] = inst
                tr.unit = -1
                h = inst.refs[seg["out"]]
        tr.segment("epilogue")
        epi = self.segment(af.segments[v["epilogue"]], "epilogue", args=self.epilogue_args(v, h, made, len(kinds)),
                           layer=None)
        tr.loss = epi.refs[af.segments[v["epilogue"]]["loss"]]
        tr.buffer_bytes = self.buffer_bytes()

    def epilogue_args(self, v: dict[str, Any], h, made: dict[int, Segment] | None, n: int) -> list[Any]:
        """The epilogue's arguments: the last layer's output, then (``epilogue_args``) tensors earlier layers made,
        ``["layer", expr, "t<k>"]`` with ``i`` the layer count (the epilogue's place in the loop: Inkling2's
        ``final_input`` reads the ``block_states`` its block boundary layers made)."""
        bind = [h]
        for ref in v.get("epilogue_args", ["h"])[1:]:
            bind.append(made[layer_refs.maker(self.env, ref[1], n)].refs[ref[2]])
        return bind

    def select(self, base, d: int, i: int):
        """``base[..., i, ...]`` on dimension ``d``, the op the model's loop runs before layer ``i``
        (``aten.select.int``): a view, no new storage; its backward (``select_backward``) gives a gradient of
        ``base``'s size, as the autograd table says."""
        shape = tuple(base.shape[:d]) + tuple(base.shape[d + 1:])
        if not 0 <= i < base.shape[d]:
            from fitplan.errors import FitplanError

            raise FitplanError(f"layer {i} reads slice {i} of a prologue tensor of shape {list(base.shape)} on "
                               f"dimension {d}", field="$.num_hidden_layers", value=i + 1)
        t = self.tr.view(base, math.prod(shape))
        t.shape = shape
        t.param = False
        t.base = base.base if base.base is not None else base
        self.emit("select.int", [("self", base)], [t], extra={"sc": {"dim": d}})
        return t

    def buffer_bytes(self) -> int:
        """The model's buffers (rotary ``inv_freq``, ...), as the learned file lists them: a layer's in every layer
        of the kinds that hold it (every layer where the file names no kinds)."""
        total = 0
        L = self.af.n_layers(self.env)
        kinds = self.af.layer_kinds(self.env)
        for name, dims, code, per_layer, *where in self.af.buffers:
            dtype = ("f32" if code == "bf16" else code) if self.mixed else self.dt(code)
            layers = [i for i in range(L) if not where or kinds[i] in where[0]]
            for i in (layers if per_layer else (None,)):
                env = self.env if i is None else {**self.env, "i": i}
                total += math.prod(as_int(compile_expr(d)(env)) for d in dims) * BYTES[dtype]
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

    def liger_plan(self, seg: dict[str, Any]) -> dict[int, tuple]:
        """Op index -> Liger's fused op replacing it in ``seg`` (:func:`.liger.plan`; empty without Liger)."""
        if self.liger is None:
            return {}
        key = id(seg)
        if key not in self.liger_plans:
            self.liger_plans[key] = liger.plan(seg, self.liger, str(self.af.path))
        return self.liger_plans[key]

    def segment(self, seg: dict[str, Any], name: str, *, args: list[Any], layer: int | None) -> Segment:
        """Replay ``seg`` (its repeated blocks unrolled for this scenario: :mod:`fitplan.arch.learned_repeat`)."""
        if seg.get("rep"):
            key = id(seg)
            if key not in self.unrolled:
                self.unrolled[key] = (seg, unroll_repeats(seg, self.env))
            seg = self.unrolled[key][1]
        inst = Segment(self, seg, args, layer)
        inst.run()
        return inst


def _layer_of(name: str) -> int | None:
    import re

    m = re.search(r"\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def _template(name: str) -> str:
    import re

    return re.sub(r"\.(\d+)\.", ".{i}.", name, count=1)
