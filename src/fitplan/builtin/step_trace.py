"""A symbolic trace of one training step, as PyTorch 2.13 and transformers 5.24 run it.

This module holds no plugin: ``builtin.activations`` and ``builtin.peak`` declare their quantities
from the :class:`StepTrace` it builds. Nothing here imports torch.

Why a trace and not a formula per term: what autograd keeps depends on which tensors share a storage
(a view of a fused projection keeps the whole projection alive), which ops see an input that requires
grad (LoRA's frozen base saves nothing before the first adapter), the dtype each op computes in
(RMSNorm upcasts to fp32, autocast casts per consuming Linear) and the device (CPU dropout keeps its
mask in the input dtype, CUDA in one byte). Writing each HF forward once, op by op, with the rule of
what each op saves taken from ``tools/autograd/derivatives.yaml``, gives the saved bytes exactly and,
replayed forwards and backwards, the live bytes at every op: the step's timeline.

Rules (each op helper below names its source):

* an op saves an input only when the derivative with respect to *another* input needs it and that
  other input requires grad (``mul``, ``mm``, ``bmm``); unary ops save their input (``silu``, ``gelu``,
  ``pow``) or result (``rsqrt``, ``tanh``, ``softmax``, ``log_softmax``);
* saved tensors are counted once per storage (views share their base's storage); parameters and
  buffers are not counted;
* a tensor is freed after its last use in the forward unless an op saved it or the model's Python
  code holds it (rotary cos/sin, position ids and the causal mask until the base model returns; the
  final hidden state and the logits until the forward returns; a norm's input during the norm);
* the backward runs the ops in reverse order (the CPU autograd engine executes ready nodes by
  decreasing sequence number); each op allocates the gradients of its inputs that require grad,
  frees the gradients of its outputs and releases what it alone still saved. Two gradients of one
  tensor are added out of place (``input_buffer.cpp``); gradients of views (chunks of a fused
  projection) are joined once, after the ops that used the views released their saved tensors
  (``SplitBackward0``); an autocast weight's 16-bit gradient becomes the fp32 ``.grad`` after the op's
  saved tensors are released (``ToCopyBackward0``); a tied embedding's gradient is added to the LM
  head's out of place;
* gradient checkpointing (non-reentrant, HF ``GradientCheckpointingLayer``) keeps each layer's
  arguments (hidden states, cos/sin, position ids, mask) and re-runs the layer's forward when its
  backward starts, up to its last op that saves something ("early stop").

Layers after the first are identical, so the trace builds the prologue, layer 0, one representative
layer standing for layers 1..L-1, and the epilogue; :func:`build` accounts for the repetition
exactly (saved bytes are additive, live bytes are affine in the number of repetitions).
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
from attrs import frozen

from fitplan.builtin import op_work

BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "bool": 1, "u8": 1}
PARTS = ("activations", "logits", "autocast_copies", "temporaries")
"""What live bytes above the model states are, at any instant of the replay: tensors saved for backward (or
kept by a checkpoint), the loss head's tensors (logits, their fp32 copy, log-softmax, targets), autocast's
16-bit weight copies, and everything else (transients of the op running, gradients flowing between ops, the
model's pinned tensors such as rotary cos/sin, the mask and the final hidden state)."""
ALLOCATOR_BLOCK = 512
"""PyTorch's CUDA caching allocator rounds each allocation up to a multiple of 512 bytes."""
DEBUG: list | None = None
"""Set to a list to collect the replay's timeline (tests and probes)."""


@frozen
class TraceSpec:
    """Everything the trace depends on (hashable: traces are cached)."""

    arch: Any
    batch: int
    seq: int
    precision: str
    attn: str
    checkpointing: bool
    method: str = "full"
    lora_r: int = 8
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.0
    device: str = "cuda"
    block: int = ALLOCATOR_BLOCK
    """CUDA's caching allocator rounds every block up to this many bytes (``[framework]`` ruleset)."""
    adapter_dtype: str = "fp32"
    """LoRA adapters' dtype: fp32 (peft's ``autocast_adapter_dtype``), bf16 (TRL casts them for 4-bit models)."""
    quant_compute: str | None = None
    """QLoRA: ``bnb_4bit_compute_dtype`` (None: the precision's compute dtype)."""
    linear_saves_input: bool = False
    """Every ``F.linear`` whose output is in the graph saves its input, frozen weight or not: DeepSpeed ZeRO-3
    replaces ``F.linear`` (the rule and its source: ``builtin/sharding/deepspeed.py``, ``zero3_linear_saves_input``)."""


@frozen
class StepTrace:
    """What :func:`build` returns. Byte counts are per GPU, before any sharding of model states.

    :ivar saved: ``(label, bytes)`` per saved storage class, for ``explain`` and the docs.
    :ivar retained_bytes: what the forward leaves alive for the backward, beyond what was alive before
        it (the batch and the model states), the loss scalar excluded: the referee's ``retained``.
    :ivar activation_bytes: the part of ``retained_bytes`` that is neither logits/loss nor autocast copies.
    :ivar logits_bytes: the loss head's saved tensors (log-softmax output, targets).
    :ivar autocast_copy_bytes: autocast's 16-bit weight copies kept for backward.
    :ivar forward_peak_bytes: the most the forward adds at any op over what was alive before it.
    :ivar backward_points: ``(other_bytes, param_grad_bytes, op_param_grad_bytes)`` at candidate instants
        of the backward: live bytes there are the step's resident bytes + other + param_grad (scaled by
        sharding); ``op_param_grad_bytes`` is the gradient the op is producing, the only extra when the
        gradients already exist (accumulation steps after the first).
    :ivar param_grad_bytes: gradients of all trainable parameters at the end of backward.
    :ivar buffer_bytes: the model's buffers (rotary ``inv_freq``, Gemma's ``embed_scale``).
    """

    saved: tuple[tuple[str, int], ...]
    retained_bytes: int
    activation_bytes: int
    logits_bytes: int
    autocast_copy_bytes: int
    forward_peak_bytes: int
    backward_points: tuple[tuple[int, int, int], ...]
    backward_frontier: tuple[tuple[int, int], ...]
    """The (other, param_grad) backward points no other point dominates (what the peak needs)."""
    backward_frontier_accumulating: tuple[tuple[int, int], ...]
    backward_frontier_layers: tuple[tuple[int, int], ...]
    """The (other, param_grad) frontier of the points inside decoder layers' backward only."""
    """Likewise for (other, op_param_grad): the points that matter when gradients already exist."""
    param_grad_bytes: int
    buffer_bytes: int
    layer_bytes: int = 0
    """What one decoder layer (a representative one: layer 1, or layer 0 of a one-layer model) keeps."""
    backward_after_head: tuple[int, int] = (0, 0)
    """(other, param_grad) bytes when the LM head and final norm are differentiated, before the last layer."""
    forward_before_last_layer_bytes: int = 0
    """Live bytes (over what was alive before the step) when the last decoder layer's forward starts."""
    loss_bytes: int = 4
    """The loss scalar: kept through the optimizer step by ``loss.detach()`` (the logged value)."""
    max_param_grad_bytes: int = 0
    """The largest parameter gradient one op produces (the transient of accumulating into existing grads)."""
    backward_before_grads: int = 0
    """The most the backward holds before the first parameter gradient exists (other bytes only)."""
    backward_frontier_bucketed: tuple[tuple[int, int], ...] = ()
    """The (other, op_param_grad) frontier of the points after the first parameter gradient: what matters when
    each gradient leaves for a bucket or partition as soon as it is produced (DeepSpeed ZeRO-2/3)."""
    work: tuple[op_work.OpWork, ...] = ()
    """The micro-step's kernels, phase by phase, for the time model (:func:`fitplan.builtin.op_work.step_work`)."""
    forward_peak_parts: tuple[int, int, int, int] = (0, 0, 0, 0)
    """``forward_peak_bytes`` split into :data:`PARTS` (sums to it)."""
    forward_before_last_layer_parts: tuple[int, int, int, int] = (0, 0, 0, 0)
    """``forward_before_last_layer_bytes`` split into :data:`PARTS`."""
    backward_parts: tuple[tuple[int, tuple[int, int, int, int]], ...] = ()
    """For each backward frontier point's ``other_bytes``: that value split into :data:`PARTS` (sums to it)."""
    param_ops: tuple[tuple[str, str, bool], ...] = ()
    """``(segment, label, output requires grad)`` of the ops that read a parameter. An op whose outputs do not
    require grad (under LoRA the embedding and the frozen Linears before the first adapter) never runs its
    backward, which DeepSpeed ZeRO-3 reads (``builtin/sharding/deepspeed.py``). Segments: ``prologue``,
    ``layer 0``, ``layers 1..L-1``, ``epilogue``."""

    def parts_of(self, other_bytes: int) -> tuple[int, int, int, int]:
        """The :data:`PARTS` of a backward point's ``other_bytes`` (all temporaries when unknown)."""
        for a, p in self.backward_parts:
            if a == other_bytes:
                return p
        return (0, 0, 0, int(other_bytes))


# --------------------------------------------------------------------------- symbolic tensors and ops


@attrs.define(slots=True, eq=False)
class T:
    """A symbolic tensor: ``numel`` elements of ``dtype`` in storage ``sid`` (views share it).

    ``layout`` matters where a reshape copies: ``"c"`` contiguous, ``"bshd"`` a (b, h, s, d) view of a
    (b, s, h, d) buffer (what ``view(...).transpose(1, 2)`` of a projection gives), ``"view"`` a strided
    view of a larger buffer (a chunk of a fused projection).
    """

    sid: int
    numel: int
    dtype: str
    rg: bool
    layout: str = "c"
    param: bool = False
    base: Any = None
    """The tensor this is a view of (gradients of views accumulate into their base's)."""

    @property
    def nbytes(self) -> int:
        return self.numel * BYTES[self.dtype]

    @property
    def key(self) -> int:
        return id(self.base if self.base is not None else self)


@attrs.define(slots=True)
class Op:
    name: str
    seg: int
    reads: tuple[int, ...]
    allocs: tuple[int, ...]
    saved: tuple[int, ...]
    outs: tuple[T, ...]
    grad_ins: tuple[T, ...]
    alias: bool = False
    param_grad: int = 0
    bwd_temp: int = 0
    bwd_temp_after: int = 0
    """Transient bytes once the incoming gradients are released (a tied weight's gradient sum)."""
    cast_grad: bool = False
    """The weight gradient reaches the parameter through autocast's cast (ToCopyBackward0): the
    16-bit gradient (``bwd_temp``) exists first, the parameter's gradient after the op's saved
    tensors are released."""
    work: Any = None
    """The kernels the op launches (:class:`fitplan.builtin.op_work.Work`; None: none)."""


def promote(a: str, b: str) -> str:
    if a == b:
        return a
    if "f32" in (a, b):
        return "f32"
    return a


class Trace:
    """Records the forward of one step (see the module doc)."""

    def __init__(self, spec: TraceSpec) -> None:
        self.spec = spec
        self.size: list[int] = []
        self.label: list[str] = []
        self.kind: list[str] = []
        self.ops: list[Op] = []
        self.seg = 0
        self.seg_names: list[str] = ["prologue"]
        self.seg_weight: list[int] = [1]
        self.seg_ckpt: list[bool] = [False]
        self.pinned: set[int] = set()
        self.ckpt_keep: dict[int, set[int]] = {}
        self.autocast_cache: dict[str, T] = {}
        self.param_grad_total = 0
        self.loss: T | None = None
        self.external: set[int] = set()
        self.kind_default = "activation"
        self.rounding = spec.device == "cuda"
        self.model_pins: set[int] = set()
        self.leaves: set[int] = set()
        """Non-parameter tensors that require grad as leaves: alive until the backward ends."""
        self.model_pins_end = -1
        self.param_ops: dict[tuple[str, str], bool] = {}
        """(segment, label) of the ops that read a parameter -> whether an output of one of them requires grad."""

    # ---- storages
    def _storage(self, nbytes: int, label: str) -> int:
        if self.rounding and nbytes:
            nbytes = -(-nbytes // self.spec.block) * self.spec.block
        self.size.append(nbytes)
        self.label.append(label)
        self.kind.append(self.kind_default)
        return len(self.size) - 1

    def new(self, numel: int, dtype: str, rg: bool, label: str, layout: str = "c") -> T:
        return T(self._storage(numel * BYTES[dtype], label), numel, dtype, rg, layout)

    def external_tensor(self, numel: int, dtype: str, label: str) -> T:
        """A tensor alive before the step (the batch): never counted, never freed."""
        sid = self._storage(0, label)
        self.external.add(sid)
        return T(sid, numel, dtype, False)

    @staticmethod
    def param(numel: int, dtype: str, rg: bool) -> T:
        return T(-1, numel, dtype, rg, param=True)

    @staticmethod
    def view(t: T, numel: int | None = None, layout: str | None = None) -> T:
        return T(t.sid, t.numel if numel is None else numel, t.dtype, t.rg, layout or t.layout, t.param,
                 t.base if t.base is not None else t)

    # ---- segments
    def segment(self, name: str, weight: int = 1, ckpt: bool = False) -> None:
        self.seg_names.append(name)
        self.seg_weight.append(weight)
        self.seg_ckpt.append(ckpt)
        self.seg = len(self.seg_names) - 1

    # ---- recording
    def record(self, name: str, ins: list[T], outs: list[T], saved: list[T | None] = (), *, alias: bool = False,
               param_grad: int = 0, bwd_temp: int = 0, grad_ins: list[T] | None = None,
               work: op_work.Work | None = None) -> None:
        reads = tuple(t.sid for t in ins if t is not None and t.sid >= 0)
        allocs = tuple(dict.fromkeys(t.sid for t in outs if t.sid >= 0 and t.sid not in reads))
        sv = tuple(dict.fromkeys(t.sid for t in saved if t is not None and not t.param and t.sid >= 0))
        if grad_ins is None:
            grad_ins = [t for t in ins if t is not None and t.rg and not t.param and t.dtype in ("f32", "bf16", "f16")]
        any_rg = any(t.rg for t in ins if t is not None)
        if any(t is not None and t.param for t in ins):
            key = (self.seg_names[self.seg], name)
            self.param_ops[key] = self.param_ops.get(key, False) or any(t.rg for t in outs)
        if not any_rg:
            sv, grad_ins, param_grad, bwd_temp = (), [], 0, 0
        if work is None:
            work = op_work.elementwise(ins, outs, [t for t in saved if t is not None and not t.param], grad_ins,
                                       param_grad, any_rg, alias)
        elif not any_rg:
            work = op_work.Work(work.fwd)
        self.param_grad_total += param_grad * self.seg_weight[self.seg]
        self.ops.append(Op(name, self.seg, reads, allocs, sv, tuple(t for t in outs if t.rg), tuple(grad_ins), alias,
                           param_grad, bwd_temp, work=work))

    # ------------------------------------------------------------------ primitive ops
    # Each helper mirrors one aten op; "saves" follows derivatives.yaml.

    def cast(self, x: T, dtype: str, label: str = "cast") -> T:
        """``x.to(dtype)``: a copy when the dtype changes (ToCopyBackward saves nothing)."""
        if x.dtype == dtype:
            return x
        out = self.new(x.numel, dtype, x.rg, label, x.layout)
        self.record(label, [x], [out])
        return out

    def unary(self, x: T, label: str, save: str | None, dtype: str | None = None, numel: int | None = None) -> T:
        """Elementwise op: ``save`` is ``"self"`` (silu, gelu, pow) or ``"result"`` (rsqrt, tanh, softmax)."""
        out = self.new(x.numel if numel is None else numel, dtype or x.dtype, x.rg, label, x.layout if numel is None else "c")
        saved = [x] if save == "self" else [out] if save == "result" else []
        self.record(label, [x], [out], saved)
        return out

    def reduce(self, x: T, numel: int, label: str, dtype: str | None = None) -> T:
        """``mean``/``sum`` over a dimension: saves nothing (sizes only)."""
        out = self.new(numel, dtype or x.dtype, x.rg, label)
        self.record(label, [x], [out])
        return out

    def mul(self, a: T, b: T | None, label: str) -> T:
        """``a * b`` (b None: a Python scalar). MulBackward0 saves ``b`` when ``a`` requires grad and
        ``a`` when ``b`` does; a parameter operand gets its gradient here."""
        if b is None:
            out = self.new(a.numel, a.dtype, a.rg, label, a.layout)
            self.record(label, [a], [out])
            return out
        big = a if a.numel >= b.numel else b
        out = self.new(big.numel, promote(a.dtype, b.dtype), a.rg or b.rg, label, big.layout)
        saved = ([b] if a.rg else []) + ([a] if b.rg else [])
        pg = sum(t.nbytes for t in (a, b) if t.param and t.rg)
        self.record(label, [a, b], [out], saved, param_grad=pg)
        return out

    def add(self, a: T, b: T | None, label: str) -> T:
        """``a + b``: saves nothing; the backward hands the incoming gradient to both inputs."""
        if b is None:
            out = self.new(a.numel, a.dtype, a.rg, label, a.layout)
            self.record(label, [a], [out], alias=True)
            return out
        big = a if a.numel >= b.numel else b
        out = self.new(max(a.numel, b.numel), promote(a.dtype, b.dtype), a.rg or b.rg, label, big.layout)
        self.record(label, [a, b], [out], alias=True)
        return out

    def contiguous(self, x: T, label: str) -> T:
        """``x.contiguous()`` / a reshape that cannot be a view: a copy unless already contiguous."""
        if x.layout == "c":
            return x
        out = self.new(x.numel, x.dtype, x.rg, label)
        self.record(label, [x], [out], alias=True)
        return out

    def bmm(self, a: T, b: T, out_numel: int, label: str, contract: int) -> T:
        """``torch.matmul`` of 4-D tensors: both operands are reshaped to 3-D (a copy when the layout is
        not viewable), BmmBackward0 saves ``self`` when ``mat2`` requires grad and ``mat2`` when ``self`` does.
        ``contract``: the length of the summed dimension (``2·out_numel·contract`` FLOPs)."""
        a3 = self.contiguous(a, label + ".self_copy")
        b3 = self.contiguous(b, label + ".mat2_copy")
        dt = promote(a.dtype, b.dtype)
        out = self.new(out_numel, dt, a.rg or b.rg, label)
        work = op_work.gemm(out_numel, contract, 1, dt, a3.nbytes, b3.nbytes, out.nbytes, input_grad=a3.rg,
                            weight_grad=b3.rg)
        self.record(label, [a3, b3], [out], ([b3] if a3.rg else []) + ([a3] if b3.rg else []), work=work)
        return out

    def dropout(self, x: T, p: float, label: str) -> T:
        """``F.dropout`` in training. p = 0: the input itself. CUDA (``native_dropout``): the output and a
        1-byte mask, NativeDropoutBackward0 saves the mask. CPU (``_dropout_impl``): a noise tensor in the
        input dtype multiplies the input, MulBackward0 saves the noise."""
        if p <= 0:
            return x
        if self.spec.device == "cuda":
            mask = self.new(x.numel, "bool", False, label + ".mask")
            out = self.new(x.numel, x.dtype, x.rg, label, x.layout)
            self.record(label, [x], [out, mask], [mask])
            return out
        noise = self.new(x.numel, x.dtype, False, label + ".noise", x.layout)
        self.record(label + ".bernoulli", [], [noise])
        return self.mul(x, noise, label)

    def embedding(self, ids: T, weight: T, dim: int, label: str) -> T:
        """``F.embedding``: EmbeddingBackward0 saves the indices (when the weight requires grad)."""
        out = self.new(ids.numel * dim, weight.dtype, weight.rg, label)
        gw = weight.numel * BYTES[weight.dtype] if weight.rg else 0
        self.record(label, [ids, weight], [out], [ids] if weight.rg else [], param_grad=gw)
        return out

    # ------------------------------------------------------------------ linear layers

    def linear(self, x: T, rows: int, in_f: int, out_f: int, label: str, *, trainable: bool, bias: bool = False,
               w_dtype: str | None = None, autocast: bool | None = None, quantized: bool = False) -> T:
        """``F.linear`` (or Conv1D's ``addmm``): MmBackward0/AddmmBackward0 saves the input when the
        weight requires grad and the weight when the input does. Under autocast the input is cast to
        the compute dtype (a new tensor per call: autocast caches only leaf weights that require grad)
        and the weight too (cached per forward when it requires grad); the saved weight is then that
        16-bit copy, which is not a parameter. QLoRA: bitsandbytes dequantises the NF4 weight to the
        compute dtype for the matmul (a transient) and saves nothing batch-sized."""
        c = self.cfg
        w_dtype = w_dtype or c.param_dtype
        ac = c.autocast if autocast is None else autocast
        out_dtype = c.compute_dtype if ac else promote(x.dtype, w_dtype)
        if quantized:  # bitsandbytes Linear4bit.forward (nn/modules.py:609-638): compute dtype in, input dtype out
            qc = c.quant_dtype
            xin = self.cast(x, qc, label + ".input_cast")
            deq = self.new(in_f * out_f, qc, False, label + ".dequantized")
            e = BYTES[qc]
            self.record(label + ".dequantize", [], [deq], work=op_work.dequant(in_f * out_f, e, backward=False))
            out = self.new(rows * out_f, qc, xin.rg, label)
            mm = op_work.gemm(rows, in_f, out_f, qc, xin.nbytes, deq.nbytes, out.nbytes,
                              input_grad=xin.rg, weight_grad=False)
            work = op_work.Work(mm.fwd, op_work.dequant(in_f * out_f, e, backward=True).bwd + mm.bwd if xin.rg else ())
            self.record(label, [xin, deq], [out], [], bwd_temp=in_f * out_f * e, work=work)
            return self.cast(out, x.dtype, label + ".output_cast")
        w = self.param(in_f * out_f, w_dtype, trainable)
        xin = x
        pg = (in_f * out_f + (out_f if bias else 0)) * BYTES[w_dtype] if trainable else 0
        temp = 0
        if ac:
            # autocast's F.linear wrapper casts its arguments right to left (C++ argument evaluation):
            # the weight copy is made before the input copy
            if w_dtype != c.compute_dtype:
                key = f"{self.seg}:{label}"
                w16 = self.autocast_cache.get(key) if trainable else None
                if w16 is None:
                    prev = self.kind_default
                    self.kind_default = "autocast"
                    w16 = self.new(in_f * out_f, c.compute_dtype, trainable, label + ".weight_copy")
                    self.kind_default = prev
                    read = op_work.Kernel("elementwise", "", 0, in_f * out_f * (BYTES[w_dtype] + BYTES[c.compute_dtype]))
                    self.record(label + ".weight_cast", [], [w16], work=op_work.Work((read,)))
                    if trainable:
                        self.autocast_cache[key] = w16
                        self.pinned_until_forward_end(w16)
                w = w16
                temp = in_f * out_f * BYTES[c.compute_dtype] if trainable else 0
            xin = self.cast(x, c.compute_dtype, label + ".input_cast")
        out = self.new(rows * out_f, out_dtype, xin.rg or trainable, label)
        saved = ([xin] if trainable else []) + ([w] if xin.rg else [])
        if self.spec.linear_saves_input and not (self.spec.arch.family == "gpt2" and label != "lm_head"):
            # an F.linear replaced by a custom Function that saves (input, weight, bias) whenever its node
            # exists; GPT-2's projections are transformers' Conv1D (torch.addmm, pytorch_utils.py:119), not
            # F.linear, and keep the rule above
            saved = [xin, w]
        # the 16-bit weight copy's gradient is bwd_temp (then cast into the parameter's .grad), not a
        # gradient handed on to another op
        self.record(label, [xin, w], [out], saved, param_grad=pg, bwd_temp=temp,
                    grad_ins=[xin] if xin.rg and not xin.param else [],
                    work=self._linear_work(xin, w, out, rows, in_f, out_f, trainable, bias, temp))
        self.ops[-1].cast_grad = bool(temp)
        return out

    def _linear_work(self, xin: T, w: T, out: T, rows: int, in_f: int, out_f: int, trainable: bool, bias: bool,
                     cast_grad: int) -> op_work.Work:
        """The forward GEMM; backward: the input- and weight-gradient GEMMs, the bias gradient (a reduction
        of the output gradient) and autocast's cast of the 16-bit weight gradient into the fp32 ``.grad``."""
        mm = op_work.gemm(rows, in_f, out_f, out.dtype, xin.nbytes, w.nbytes, out.nbytes, input_grad=xin.rg,
                          weight_grad=trainable)
        extra = []
        if trainable and bias:
            extra.append(op_work.Kernel("elementwise", "", 0, out.nbytes))
        if cast_grad:
            extra.append(op_work.Kernel("elementwise", "", 0, cast_grad + in_f * out_f * 4))
        return op_work.Work(mm.fwd, mm.bwd + tuple(extra))

    def release_model_pins(self) -> None:
        """The base model's forward returns: what only its locals held (rotary cos/sin, position ids,
        the causal mask) is released, unless saved or kept by checkpointing."""
        self.ops.append(Op("model_return", self.seg, (), (), (), (), ()))
        self.model_pins_end = len(self.ops) - 1

    def touch(self, *ts: T) -> None:
        """The model's Python code still holds ``ts`` here (a function argument or local variable alive
        past its last op): extends their lifetime, records nothing for backward."""
        reads = tuple(t.sid for t in ts if t is not None and t.sid >= 0)
        if reads:
            self.ops.append(Op("hold", self.seg, reads, (), (), (), ()))

    def pinned_until_forward_end(self, t: T) -> None:
        self.pinned.add(t.sid)

    # config shortcuts set by build()
    cfg: Any = None


# --------------------------------------------------------------------------- the trace's configuration


@frozen
class Cfg:
    """Derived settings: dtypes and switches for one trace."""

    param_dtype: str
    act_dtype: str
    compute_dtype: str
    autocast: bool
    adapter_dtype: str
    lora: bool
    qlora: bool
    quant_dtype: str = "bf16"


_TRACE_DTYPE = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


def make_cfg(spec: TraceSpec) -> Cfg:
    """The trace's dtypes from the precision preset (:data:`fitplan.inputs.precision.PRESETS`): autocast keeps
    fp32 weights and activations between the ops it casts; the other presets run in their weights' dtype."""
    from fitplan.inputs.precision import PRESETS

    p = PRESETS[spec.precision]
    param, compute = _TRACE_DTYPE[p.weight_dtype], _TRACE_DTYPE[p.compute_dtype]
    lora = spec.method in ("lora", "qlora")
    quant = _TRACE_DTYPE[spec.quant_compute or p.compute_dtype]
    return Cfg(param, param, compute, p.autocast, _TRACE_DTYPE[spec.adapter_dtype], lora, spec.method == "qlora", quant)


# --------------------------------------------------------------------------- model blocks (HF forwards, op by op)


def _targets(spec: TraceSpec, module: str) -> bool:
    if spec.method not in ("lora", "qlora"):
        return False
    t = spec.lora_targets
    return module in t or module.rsplit(".", 1)[-1] in t or ("all-linear" in t and module != "lm_head")


def linear_module(tr: Trace, x: T, rows: int, in_f: int, out_f: int, module: str, *, bias: bool = False,
                  trainable_full: bool = True) -> T:
    """A Linear as the scenario trains it: trained (full fine-tuning), frozen, or frozen + LoRA adapter.

    peft 0.21 ``lora.Linear.forward``: ``result = base_layer(x)``; ``x = x.to(lora_A.weight.dtype)``
    (adapters are fp32: ``autocast_adapter_dtype=True``); ``result = result + lora_B(lora_A(dropout(x)))
    * scaling``; ``result.to(base dtype)``. lora_A saves its (cast, dropped-out) input ``s·b·in`` and
    lora_B saves lora_A's output ``s·b·r``, in the adapter dtype (autocast: the compute dtype)."""
    spec, c = tr.spec, tr.cfg
    if not c.lora:
        return tr.linear(x, rows, in_f, out_f, module, trainable=trainable_full, bias=bias)
    base = tr.linear(x, rows, in_f, out_f, module, trainable=False, bias=bias, quantized=c.qlora and module != "lm_head")
    if not _targets(spec, module):
        return base
    xa = tr.cast(x, c.adapter_dtype, module + ".lora_input_cast")
    xd = tr.dropout(xa, spec.lora_dropout, module + ".lora_dropout")
    r = spec.lora_r
    a = tr.linear(xd, rows, in_f, r, module + ".lora_A", trainable=True, w_dtype=c.adapter_dtype)
    bb = tr.linear(a, rows, r, out_f, module + ".lora_B", trainable=True, w_dtype=c.adapter_dtype)
    sc = tr.mul(bb, None, module + ".lora_scaling")
    out = tr.add(base, sc, module + ".lora_add")
    return tr.cast(out, base.dtype, module + ".lora_result_cast")


def rms_norm(tr: Trace, x: T, rows: int, dim: int, label: str, *, gemma: bool = False) -> T:
    """HF RMSNorm (``LlamaRMSNorm``): ``x32 = x.to(fp32)`` (PowBackward0 and MulBackward0 save it),
    ``r = rsqrt(mean(x32²) + eps)`` (RsqrtBackward0 saves it, fp32, one per row), ``n = x32 * r``,
    ``weight * n.to(x.dtype)`` (MulBackward0 saves ``n.to(x.dtype)`` when the weight trains).
    Gemma: ``n * (1 + weight.float())`` then ``.to(x.dtype)``: saves ``n`` (fp32) and ``1 + w`` (fp32, per
    norm). Saved: ``4·rows·dim`` (the fp32 input; a copy unless x is fp32) ``+ 4·rows`` ``+ E·rows·dim``."""
    c = tr.cfg
    trainable = not c.lora
    x32 = tr.cast(x, "f32", label + ".upcast")
    sq = tr.unary(x32, label + ".pow", "self")
    var = tr.reduce(sq, rows, label + ".mean")
    ve = tr.add(var, None, label + ".eps")
    r = tr.unary(ve, label + ".rsqrt", "result")
    n = tr.mul(x32, r, label + ".normalize")
    w = tr.param(dim, c.param_dtype, trainable)
    if gemma:
        w32 = w if w.dtype == "f32" else tr.param(dim, "f32", trainable)
        w1 = tr.new(dim, "f32", trainable, label + ".one_plus_weight")
        tr.record(label + ".one_plus_weight", [w32], [w1], param_grad=dim * BYTES[c.param_dtype] if trainable else 0)
        o = tr.mul(n, w1, label + ".scale")
        out = tr.cast(o, x.dtype, label + ".downcast")
        tr.touch(x)
        return out
    nc = tr.cast(n, x.dtype, label + ".downcast")
    out = tr.mul(w, nc, label + ".weight")
    tr.touch(x)
    return out


def layer_norm(tr: Trace, x: T, rows: int, dim: int, label: str, *, params: bool = True) -> T:
    """``F.layer_norm`` (``native_layer_norm``): NativeLayerNormBackward0 saves the input, mean and rstd
    (one per row each: fp32 on CUDA for 16-bit inputs, the input dtype on the CPU). Under autocast
    layer_norm runs in fp32. OLMo's non-parametric norm casts to fp32 first (``params=False``)."""
    c, dev = tr.cfg, tr.spec.device
    trainable = params and not c.lora
    if not params:
        x = tr.cast(x, "f32", label + ".upcast")
    elif c.autocast:
        x = tr.cast(x, "f32", label + ".autocast")
    stat = "f32" if dev == "cuda" and x.dtype in ("bf16", "f16") else x.dtype
    out = tr.new(x.numel, promote(x.dtype, c.param_dtype) if params else x.dtype, x.rg or trainable, label)
    mean = tr.new(rows, stat, False, label + ".mean")
    rstd = tr.new(rows, stat, False, label + ".rstd")
    pg = 2 * dim * BYTES[c.param_dtype] if trainable else 0
    if params:
        w = tr.param(dim, c.param_dtype, trainable)
        tr.record(label, [x, w], [out, mean, rstd], [x, mean, rstd], param_grad=pg)
    else:
        tr.record(label, [x], [out, mean, rstd], [x, mean, rstd])
        out = tr.cast(out, tr.cfg.act_dtype, label + ".downcast")
    return out


def norm(tr: Trace, x: T, rows: int, label: str) -> T:
    arch = tr.spec.arch
    if arch.norm == "layernorm":
        return layer_norm(tr, x, rows, arch.hidden_size, label)
    if arch.norm == "none":
        return layer_norm(tr, x, rows, arch.hidden_size, label, params=False)
    return rms_norm(tr, x, rows, arch.hidden_size, label, gemma=arch.model_type in ("gemma", "gemma2"))


def rotary(tr: Trace, x: T, cos: T, sin: T, label: str, rot: int, full: int, *, cat_based: bool) -> T:
    """``apply_rotary_pos_emb``: ``x * cos + rotate_half(x) * sin`` (MulBackward0 saves cos and sin,
    shared by every layer: they are computed once per forward). Llama-style (``cat_based=False``): the
    result keeps the projection's (b, s, h, d) memory layout. Phi-3 / GPT-NeoX slice the rotary part and
    ``torch.cat`` it back with the pass-through part: a new contiguous (b, h, s, d) tensor."""
    n_rot = x.numel * rot // full
    xr = tr.view(x, n_rot) if cat_based else x
    a = tr.mul(xr, cos, label + ".cos")
    neg = tr.unary(xr, label + ".neg", None, numel=n_rot // 2)
    rh = tr.new(n_rot, x.dtype, x.rg, label + ".rotate_half", xr.layout)
    tr.record(label + ".rotate_half", [neg, xr], [rh], alias=True)
    b = tr.mul(rh, sin, label + ".sin")
    e = tr.add(a, b, label + ".add")
    if not cat_based:
        return e
    out = tr.new(x.numel, e.dtype, e.rg, label + ".cat")
    tr.record(label + ".cat", [e, x], [out], alias=True)
    return out


def attention_core(tr: Trace, q: T, k: T, v: T, mask: T | None, label: str, *, fp32_softmax: bool) -> T:
    """The attention of (b, a, s, d) q and (b, kv, s, d) k, v; returns the (b·s, a·d) input of the
    output projection.

    * ``sdpa`` (``F.scaled_dot_product_attention``, no mask, ``is_causal``): the flash kernel on CUDA for
      16-bit (cuDNN/flash: logsumexp (b, a, s) fp32), memory-efficient attention for fp32 on CUDA
      (logsumexp padded to a multiple of 32), ``_scaled_dot_product_flash_attention_for_cpu`` on the
      CPU; each saves q, k, v, the output and the logsumexp. GQA runs natively (``enable_gqa``: k, v are
      not repeated). The output has q's memory layout, so for Llama-style q the transpose back to
      (b, s, a·d) is free and the output projection saves the same storage. With dropout > 0 the CPU has
      no fused kernel and takes ``_scaled_dot_product_attention_math``, which upcasts 16-bit q, k, v to
      fp32 and materialises the scores: saves q, k, v (fp32), the softmax, the dropout noise and the
      dropped probabilities (each ``4·b·a·s²``). CUDA kernels drop out internally (an RNG state).
    * ``eager`` (HF ``eager_attention_forward``): ``repeat_kv`` copies k and v to all heads for GQA;
      ``matmul`` reshapes q and kᵀ to 3-D (a copy unless contiguous); the softmax runs in fp32
      (``dtype=torch.float32``; GPT-2: in the input dtype) and is cast back (a second s² tensor when
      16-bit); dropout; ``matmul`` with v; the output is transposed and copied.
    """
    spec, c = tr.spec, tr.cfg
    arch = spec.arch
    b, s, a, kvh, d = spec.batch, spec.seq, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    p = arch.attention_dropout
    if c.autocast:
        q = tr.cast(q, c.compute_dtype, label + ".q_autocast")
        k = tr.cast(k, c.compute_dtype, label + ".k_autocast")
        v = tr.cast(v, c.compute_dtype, label + ".v_autocast")
    E = q.dtype
    qn = b * a * s * d
    if spec.attn != "eager" and not (spec.device == "cpu" and p > 0):
        if spec.device == "cuda" and E == "f32":
            lse_n = b * a * (-(-s // 32) * 32)
        else:
            lse_n = b * a * s
        out_layout = "bshd" if q.layout in ("bshd", "view") else "c"
        out = tr.new(qn, E, q.rg or k.rg or v.rg, label + ".sdpa_out", out_layout)
        lse = tr.new(lse_n, "f32", False, label + ".logsumexp")
        extra = []
        if spec.device == "cuda" and p > 0:
            extra = [tr.new(2, "i64", False, label + ".rng_state")]
        tr.record(label + ".sdpa", [q, k, v], [out, lse, *extra], [q, k, v, out, lse, *extra],
                  work=op_work.flash(b, a, s, d, q, k, v, out, lse))
        return tr.contiguous(tr.view(out, layout="c" if out.layout == "bshd" else "bhsd"), label + ".transpose_copy")
    groups = a // kvh
    if spec.attn != "eager":  # CPU math path (dropout > 0)
        acc = "f32" if E in ("bf16", "f16") else E
        qm = tr.new(qn, acc, q.rg, label + ".math_q")
        tr.record(label + ".math_q", [q], [qm], alias=True)
        km = tr.new(qn, acc, k.rg, label + ".math_k")
        tr.record(label + ".math_k", [k], [km], alias=True)
        vm = tr.new(qn, acc, v.rg, label + ".math_v")
        tr.record(label + ".math_v", [v], [vm], alias=True)
        cmask = tr.new(s * s, acc, False, label + ".math_causal_mask")
        tr.record(label + ".math_causal_mask", [], [cmask])
        scores = tr.bmm(qm, km, b * a * s * s, label + ".math_qk", d)
        masked = tr.add(scores, cmask, label + ".math_mask")
        probs = tr.unary(masked, label + ".math_softmax", "result")
        dropped = tr.dropout(probs, p, label + ".math_dropout")
        o = tr.bmm(dropped, vm, qn, label + ".math_pv", s)
        o = tr.cast(o, E, label + ".math_out_cast")
        return tr.contiguous(tr.view(o, layout="bhsd"), label + ".transpose_copy")
    # eager
    if groups > 1:  # repeat_kv: expand + reshape copies k and v to every query head
        k2 = tr.new(qn, k.dtype, k.rg, label + ".repeat_k")
        tr.record(label + ".repeat_k", [k], [k2])
        v2 = tr.new(qn, v.dtype, v.rg, label + ".repeat_v")
        tr.record(label + ".repeat_v", [v], [v2])
        k, v = k2, v2
    scores = tr.bmm(q, k, b * a * s * s, label + ".qk", d)
    scaled = tr.mul(scores, None, label + ".scale")
    if mask is not None:
        scaled = tr.add(scaled, mask, label + ".mask")
    # Llama family: softmax(dtype=float32).to(q.dtype); GPT-2: softmax in the scores' dtype (fp32 once
    # the fp32 mask of autocast is added) then .type(v.dtype)
    if fp32_softmax:  # softmax(x, dtype=float32) is x.to(float32) then _softmax (and so in backward)
        scaled = tr.cast(scaled, "f32", label + ".softmax_upcast")
    probs = tr.unary(scaled, label + ".softmax", "result")
    probs = tr.cast(probs, E, label + ".softmax_cast")
    dropped = tr.dropout(probs, p, label + ".attn_dropout")
    o = tr.bmm(dropped, v, qn, label + ".pv", s)
    return tr.contiguous(tr.view(o, layout="bhsd"), label + ".transpose_copy")


def gated_mlp(tr: Trace, x: T, rows: int, inter: int, prefix: str = "", *, fused: bool = False) -> T:
    """Gated MLP ``down(act(gate(x)) * up(x))`` (Llama SwiGLU, Gemma GeGLU): the activation saves the
    gate output, the product saves both factors, down_proj saves the product: four ``E·rows·I`` tensors
    when trained (the gate output and its activation, the up output, the product). Phi-3 fuses gate and
    up (``gate_up_proj`` then ``chunk``): the activation and the product keep the fused ``2I`` storage."""
    arch = tr.spec.arch
    h = arch.hidden_size
    if fused:
        gu = linear_module(tr, x, rows, h, 2 * inter, prefix + "gate_up_proj", bias=arch.mlp_bias)
        gate = tr.view(gu, rows * inter, "view")
        up = tr.view(gu, rows * inter, "view")
        a = act(tr, gate, prefix + "act")
        m = tr.mul(up, a, prefix + "act_mul")
    else:
        g = linear_module(tr, x, rows, h, inter, prefix + "gate_proj", bias=arch.mlp_bias)
        a = act(tr, g, prefix + "act")
        u = linear_module(tr, x, rows, h, inter, prefix + "up_proj", bias=arch.mlp_bias)
        m = tr.mul(a, u, prefix + "act_mul")
    return linear_module(tr, m, rows, inter, h, prefix + "down_proj", bias=arch.mlp_bias)


def act(tr: Trace, x: T, label: str) -> T:
    """The MLP activation. ``silu``, ``gelu`` and ``gelu_pytorch_tanh`` are one op that saves its input.
    GPT-2's ``gelu_new`` (``NewGELUActivation``) is written out in Python:
    ``0.5 * x * (1 + tanh(sqrt(2/π) * (x + 0.044715 * x³)))``; autograd saves x (pow), the tanh result,
    ``0.5·x`` and ``1 + tanh``: four I-sized tensors."""
    name = tr.spec.arch.hidden_act
    if name in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh_python"):
        half = tr.mul(x, None, label + ".half")
        cube = tr.unary(x, label + ".pow3", "self")
        c = tr.mul(cube, None, label + ".coef")
        inner = tr.add(x, c, label + ".inner")
        e = tr.mul(inner, None, label + ".sqrt2pi")
        t = tr.unary(e, label + ".tanh", "result")
        one = tr.add(t, None, label + ".one_plus")
        return tr.mul(half, one, label + ".product")
    return tr.unary(x, label, "self")


def moe_block(tr: Trace, x: T, rows: int) -> T:
    """transformers 5 MoE (Mixtral, Qwen2-MoE) with the default ``grouped_mm`` experts: the router
    (``gate`` Linear, softmax in fp32: saves the probabilities, ``topk`` saves the indices, Mixtral's
    in-place renormalisation saves the original top-k values and their sum), then every (token,
    expert) pair, S = rows·k, is processed at once: ``hidden[perm // k]`` (IndexBackward0 saves the S
    indices), ``grouped_mm`` with the fused (E, 2I, h) weight (saves the S×h input and the per-expert
    offsets), the gated activation on the S×2I output, ``grouped_mm`` down (saves the S×I product), the
    routing weights multiply (saves the S×h output and the S weights), the un-permute (saves S indices).
    The S = k·rows rows are exact: every token goes to exactly k experts, however they are spread."""
    spec, c = tr.spec, tr.cfg
    arch = spec.arch
    h, E, k = arch.hidden_size, arch.num_experts, arch.num_experts_per_tok
    inter = arch.moe_intermediate_size or arch.intermediate_size
    S = rows * k
    shared = None
    if arch.shared_expert_intermediate_size:
        shared = gated_mlp(tr, x, rows, arch.shared_expert_intermediate_size, "shared_expert.")
    logits = linear_module(tr, x, rows, h, E, "gate")
    if arch.model_type == "mixtral":
        probs = tr.unary(tr.cast(logits, "f32", "router.float"), "router.softmax", "result")
    else:
        probs = tr.unary(logits, "router.softmax", "result", dtype="f32")
    topv = tr.new(S, "f32", probs.rg, "router.topk_values")
    topi = tr.new(S, "i64", False, "router.topk_indices")
    tr.record("router.topk", [probs], [topv, topi], [topi])
    if arch.model_type == "mixtral":  # router_top_value /= router_top_value.sum(-1, keepdim=True)
        ssum = tr.reduce(topv, rows, "router.sum")
        orig = tr.new(S, "f32", False, "router.div_original")
        tr.record("router.div_", [topv, ssum], [orig], [orig, ssum])
    else:
        topv = tr.cast(topv, logits.dtype, "router.weights_cast")
    srt = tr.new(S, "i64", False, "experts.sorted_ids")
    perm = tr.new(S, "i64", False, "experts.perm")
    tr.record("experts.sort", [topi], [srt, perm])
    idx = tr.new(S, "i64", False, "experts.token_idx")
    tr.record("experts.perm_div", [perm], [idx])
    sel = tr.new(S * h, x.dtype, x.rg, "experts.selected")
    tr.record("experts.gather", [x, idx], [sel], [idx], grad_ins=[x] if x.rg else [])
    swg = tr.new(S, topv.dtype, topv.rg, "experts.weights")
    tr.record("experts.weights_gather", [topv, perm], [swg], [perm], grad_ins=[topv] if topv.rg else [])
    hist = tr.new(S, "f32", False, "experts.histc_input")
    tr.record("experts.histc_input", [srt], [hist])
    cnt = tr.new(E, "f32", False, "experts.tokens_per_expert")
    offs = tr.new(E, "i32", False, "experts.offsets")
    tr.record("experts.offsets", [hist], [cnt, offs])
    trainable = not c.lora
    wd = c.param_dtype
    sel_c = tr.cast(sel, wd, "experts.input_cast")
    w_gu = tr.param(E * 2 * inter * h, wd, trainable)
    gu = tr.new(S * 2 * inter, wd, sel_c.rg or trainable, "experts.gate_up")
    tr.record("experts.grouped_mm_gate_up", [sel_c, w_gu, offs], [gu], ([sel_c] if trainable else []) + [offs],
              param_grad=w_gu.nbytes if trainable else 0,
              work=op_work.gemm(S, h, 2 * inter, wd, sel_c.nbytes, w_gu.nbytes, gu.nbytes, input_grad=sel_c.rg,
                                weight_grad=trainable))
    gate = tr.view(gu, S * inter, "view")
    up = tr.view(gu, S * inter, "view")
    a = act(tr, gate, "experts.act")
    m = tr.mul(a, up, "experts.act_mul")
    w_d = tr.param(E * h * inter, wd, trainable)
    dn = tr.new(S * h, wd, m.rg or trainable, "experts.down")
    tr.record("experts.grouped_mm_down", [m, w_d, offs], [dn], ([m] if trainable else []) + [offs],
              param_grad=w_d.nbytes if trainable else 0,
              work=op_work.gemm(S, inter, h, wd, m.nbytes, w_d.nbytes, dn.nbytes, input_grad=m.rg,
                                weight_grad=trainable))
    wo = tr.mul(dn, swg, "experts.routing_weights")
    inv = tr.new(S, "i64", False, "experts.inv_perm")
    ar = tr.new(S, "i64", False, "experts.arange")
    tr.record("experts.inv_perm", [perm], [inv, ar])
    wo2 = tr.new(S * h, wo.dtype, wo.rg, "experts.unpermuted")
    tr.record("experts.unpermute", [wo, inv], [wo2], [inv], grad_ins=[wo] if wo.rg else [])
    fin = tr.reduce(wo2, rows * h, "experts.sum_k")
    out = tr.cast(fin, x.dtype, "experts.out_cast")
    if shared is not None:
        sg = linear_module(tr, x, rows, h, 1, "shared_expert_gate")
        sig = tr.unary(sg, "shared_expert_gate.sigmoid", "result")
        sh = tr.mul(sig, shared, "shared_expert.gated")
        out = tr.add(out, sh, "moe.add_shared")
    return out


def llama_layer(tr: Trace, x: T, ctx: dict[str, Any]) -> T:
    """A decoder layer of the Llama family (Llama, Mistral, Qwen2/3, Gemma, Mixtral, OLMo) and Phi-3:
    pre-norm attention and MLP with residual adds (adds save nothing)."""
    spec = tr.spec
    arch = spec.arch
    b, s = spec.batch, spec.seq
    rows, h, qd, kvd, d = b * s, arch.hidden_size, arch.q_dim, arch.kv_dim, arch.head_dim
    phi3 = arch.family == "phi3"
    residual = x
    hn = norm(tr, x, rows, "input_layernorm")
    if phi3:
        qkv = linear_module(tr, hn, rows, h, qd + 2 * kvd, "qkv_proj", bias=arch.qkv_bias)
        q = tr.view(qkv, rows * qd, "view")
        k = tr.view(qkv, rows * kvd, "view")
        v = tr.view(qkv, rows * kvd, "view")
    else:
        q = tr.view(linear_module(tr, hn, rows, h, qd, "q_proj", bias=arch.qkv_bias), layout="bshd")
        k = tr.view(linear_module(tr, hn, rows, h, kvd, "k_proj", bias=arch.qkv_bias), layout="bshd")
        v = tr.view(linear_module(tr, hn, rows, h, kvd, "v_proj", bias=arch.qkv_bias), layout="bshd")
        if arch.qk_norm:
            q = tr.view(rms_norm(tr, q, rows * arch.num_attention_heads, d, "q_norm"), layout="bshd")
            k = tr.view(rms_norm(tr, k, rows * arch.num_key_value_heads, d, "k_norm"), layout="bshd")
    rot = ctx["rot"]
    q0, k0 = q, k
    q = rotary(tr, q, ctx["cos"], ctx["sin"], "rotary_q", rot, d, cat_based=phi3)
    k = rotary(tr, k, ctx["cos"], ctx["sin"], "rotary_k", rot, d, cat_based=phi3)
    tr.touch(q0, k0)  # query_states/key_states are rebound when apply_rotary_pos_emb returns
    o_in = attention_core(tr, q, k, v, ctx["mask"], "attn", fp32_softmax=True)
    tr.touch(v)
    o = linear_module(tr, o_in, rows, qd, h, "o_proj", bias=arch.o_bias)
    tr.touch(q, k)
    if arch.norms_per_layer == 4:  # Gemma-2: post-attention norm before the residual add
        o = norm(tr, o, rows, "post_attention_layernorm")
    o = tr.dropout(o, arch.hidden_dropout, "resid_attn_dropout")
    x = tr.add(residual, o, "residual_attn")
    residual = x
    hn = norm(tr, x, rows, "pre_feedforward_layernorm" if arch.norms_per_layer == 4 else "post_attention_layernorm")
    if arch.is_moe:
        m = moe_block(tr, hn, rows)
    else:
        m = gated_mlp(tr, hn, rows, arch.intermediate_size, fused=phi3)
    if arch.norms_per_layer == 4:
        m = norm(tr, m, rows, "post_feedforward_layernorm")
    m = tr.dropout(m, arch.hidden_dropout, "resid_mlp_dropout")
    return tr.add(residual, m, "residual_mlp")


def gpt_layer(tr: Trace, x: T, ctx: dict[str, Any]) -> T:
    """GPT-2, GPT-NeoX and Falcon layers: LayerNorm, a fused QKV projection with bias, GELU MLP, dropout
    after the attention and MLP outputs (GPT-2 ``resid_pdrop``, NeoX ``hidden_dropout``) and inside the
    attention. NeoX/Falcon: partial rotary on slices of q and k (concatenated back) and, by default, the
    parallel residual ``x + attn(ln1(x)) + mlp(ln2(x))``."""
    spec = tr.spec
    arch = spec.arch
    rows, h, qd, kvd, d = spec.batch * spec.seq, arch.hidden_size, arch.q_dim, arch.kv_dim, arch.head_dim
    gpt2 = arch.family == "gpt2"
    names = ("c_attn", "c_proj", "c_fc", "mlp.c_proj") if gpt2 else \
        ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")
    x_in = x
    hn = norm(tr, x, rows, "ln_1" if gpt2 else "input_layernorm")
    qkv = linear_module(tr, hn, rows, h, qd + 2 * kvd, names[0], bias=arch.qkv_bias)
    q = tr.view(qkv, rows * qd, "view")
    k = tr.view(qkv, rows * kvd, "view")
    v = tr.view(qkv, rows * kvd, "view")
    if ctx["cos"] is not None:
        q = rotary(tr, q, ctx["cos"], ctx["sin"], "rotary_q", ctx["rot"], d, cat_based=True)
        k = rotary(tr, k, ctx["cos"], ctx["sin"], "rotary_k", ctx["rot"], d, cat_based=True)
    o_in = attention_core(tr, q, k, v, ctx["mask"], "attn", fp32_softmax=not gpt2)
    a_out = linear_module(tr, o_in, rows, qd, h, names[1], bias=arch.o_bias)
    a_out = tr.dropout(a_out, arch.hidden_dropout, "attn_resid_dropout")
    if arch.parallel_residual:
        hn2 = hn if arch.norms_per_layer == 1 else norm(tr, x_in, rows, "post_attention_layernorm")
        mid = None
    else:
        mid = tr.add(a_out, x_in, "residual_attn")
        hn2 = norm(tr, mid, rows, "ln_2" if gpt2 else "post_attention_layernorm")
    f = linear_module(tr, hn2, rows, h, arch.intermediate_size, names[2], bias=arch.mlp_bias)
    g = act(tr, f, "mlp.act")
    m = linear_module(tr, g, rows, arch.intermediate_size, h, names[3], bias=arch.mlp_bias)
    m = tr.dropout(m, arch.hidden_dropout, "mlp_resid_dropout")
    if mid is None:
        return tr.add(tr.add(m, a_out, "parallel_sum"), x_in, "residual")
    return tr.add(mid, m, "residual_mlp")


# --------------------------------------------------------------------------- the whole step


def prologue(tr: Trace) -> tuple[T, dict[str, Any], T]:
    """Embedding, positions, rotary cos/sin and the eager causal mask (once per forward).

    * ``embed_tokens(input_ids)``: EmbeddingBackward0 saves the ids (the batch's own tensor, alive
      before the step: not counted); Gemma multiplies by ``embed_scale.to(dtype)`` (a 0-d tensor,
      saved); GPT-2 adds learned positions (saves the (1, s) int64 position ids) and drops out.
    * rotary: ``cos``/``sin`` of shape (1, s, d_rot) in the hidden dtype, held by the model's forward
      and saved by every layer's rotary multiply: ``2·s·d_rot·E`` once.
    * eager attention: ``create_causal_mask`` builds a (b, 1, s, s) additive mask in the hidden dtype,
      held for the forward (saved by nothing; kept by checkpointing).
    """
    spec, c = tr.spec, tr.cfg
    arch = spec.arch
    b, s = spec.batch, spec.seq
    rows, h, V = b * s, arch.hidden_size, arch.vocab_size
    full = not c.lora
    ids = tr.external_tensor(rows, "i64", "input_ids")
    labels = tr.external_tensor(rows, "i64", "labels")
    w = tr.param(V * h, c.param_dtype, full)
    # peft + gradient checkpointing: PeftModel.__init__ calls enable_input_require_grads() when the model
    # already checkpoints, so the (frozen) embedding output is a leaf that requires grad: autograd's
    # AccumulateGrad node keeps it alive until the backward has run.
    leaf = c.lora and spec.checkpointing
    scaled = arch.model_type in ("gemma", "gemma2")
    x = tr.new(rows * h, c.param_dtype, full or (leaf and not scaled), "embed_tokens")
    if leaf and not scaled:
        tr.leaves.add(x.sid)
    tied = arch.tie_word_embeddings
    gw = w.nbytes if full else 0
    # Tied with the LM head: the head's weight gradient waits in the autograd input buffer; the
    # embedding's dense gradient is added to it out of place (input_buffer.cpp), so for a moment two
    # more V×h tensors exist.
    tr.record("embed_tokens", [ids, w], [x], [ids] if full else [], param_grad=0 if tied else gw,
              bwd_temp=gw if tied else 0, work=op_work.embedding(rows, h, BYTES[c.param_dtype], V * h,
                                                                  BYTES[c.param_dtype] if full else 0))
    if tied:
        tr.ops[-1].bwd_temp_after = 2 * gw
    if scaled:  # GemmaScaledWordEmbedding: the module's output (what the hook marks) is the scaled one
        scale = tr.param(1, "f32", False) if c.param_dtype == "f32" else tr.new(1, c.param_dtype, False, "embed_scale")
        x = tr.mul(x, scale, "embed_scale")
        if leaf:
            x.rg = True
            tr.leaves.add(x.sid)
    pos = tr.new(s, "i64", False, "position_ids")
    tr.record("position_ids", [], [pos])
    tr.model_pins.add(pos.sid)
    if arch.learned_positions:
        wp = tr.param(arch.max_position_embeddings * h, c.param_dtype, full)
        pe = tr.new(s * h, c.param_dtype, full, "embed_positions")
        tr.record("embed_positions", [pos, wp], [pe], [pos] if full else [], param_grad=wp.nbytes if full else 0,
                  work=op_work.embedding(s, h, BYTES[c.param_dtype], wp.numel, BYTES[c.param_dtype] if full else 0))
        x = tr.add(x, pe, "embed_add")
    drop = arch.embedding_dropout
    x = tr.dropout(x, drop, "embed_dropout")
    ctx: dict[str, Any] = {"cos": None, "sin": None, "mask": None, "rot": arch.head_dim, "pos": pos}
    if not arch.learned_positions:
        rot = int(arch.head_dim * arch.partial_rotary_factor)
        rot -= rot % 2
        ctx["rot"] = rot
        freqs = tr.new(s * rot // 2, "f32", False, "rotary.freqs")
        tr.record("rotary.freqs", [pos], [freqs])
        emb = tr.new(s * rot, "f32", False, "rotary.emb")
        tr.record("rotary.cat", [freqs], [emb])
        trig = []
        for name in ("cos", "sin"):
            t = tr.new(s * rot, "f32", False, "rotary." + name)
            tr.record("rotary." + name, [emb], [t])
            t = tr.mul(t, None, "rotary.scaling_" + name)
            t = tr.cast(t, c.param_dtype, "rotary.cast_" + name)
            tr.model_pins.add(t.sid)
            trig.append(t)
        ctx["cos"], ctx["sin"] = trig
    if spec.attn == "eager":
        cmp = tr.new(s * s, "bool", False, "causal_mask.bool")
        tr.record("causal_mask.compare", [pos], [cmp])
        mask = tr.new(b * s * s, c.param_dtype, False, "causal_mask")
        tr.record("causal_mask.where", [cmp], [mask])
        tr.model_pins.add(mask.sid)
        ctx["mask"] = mask
    return x, ctx, labels


def epilogue(tr: Trace, x: T, labels: T) -> None:
    """Final norm, LM head and HF ``ForCausalLMLoss``: ``logits.float()`` (a copy when 16-bit),
    ``labels`` padded then shifted (``contiguous``: ``8·b·s`` bytes, saved by nll_loss),
    ``cross_entropy`` = ``log_softmax`` (saves its fp32 output, ``4·b·s·V``) + ``nll_loss`` (saves the
    targets and a 4-byte ``total_weight``). The logits stay alive until the forward returns (the output
    object holds them)."""
    spec, c = tr.spec, tr.cfg
    arch = spec.arch
    b, s = spec.batch, spec.seq
    rows, h, V = b * s, arch.hidden_size, arch.vocab_size
    hn = norm(tr, x, rows, "final_norm")
    tr.release_model_pins()  # the base model returns: its mask, cos/sin and position ids go
    tr.pinned.add(hn.sid)  # the final hidden state stays referenced by the model output
    logits = linear_module(tr, hn, rows, h, V, "lm_head")
    tr.pinned.add(logits.sid)
    prev = tr.kind_default
    tr.kind_default = "logits"
    lf = tr.cast(logits, "f32", "logits.float")
    padded = tr.new(b * (s + 1), "i64", False, "labels.pad")
    tr.record("labels.pad", [labels], [padded])
    if b == 1:  # labels[..., 1:] of a (1, s+1) tensor is already contiguous: a view, no copy
        shifted = tr.view(padded, rows)
    else:
        shifted = tr.new(rows, "i64", False, "labels.shift")
        tr.record("labels.shift", [padded], [shifted])
    ls = tr.unary(lf, "log_softmax", "result")
    loss = tr.new(1, "f32", ls.rg, "loss")
    tw = tr.new(1, "f32", False, "nll.total_weight")
    tr.record("nll_loss", [ls, shifted], [loss, tw], [ls, shifted, tw])
    tr.loss = loss
    tr.kind_default = prev


@functools.lru_cache(maxsize=512)
def build(spec: TraceSpec) -> StepTrace:
    """Trace one step of ``spec`` and replay it (see the module doc)."""
    arch = spec.arch
    tr = Trace(spec)
    tr.cfg = make_cfg(spec)
    layer = llama_layer if arch.family in ("llama", "phi3") else gpt_layer
    x, ctx, labels = prologue(tr)
    L = arch.num_hidden_layers
    keep = [t.sid for t in (ctx["cos"], ctx["sin"], ctx["pos"], ctx["mask"]) if t is not None]
    for name, weight in (("layer 0", 1), ("layers 1..L-1", L - 1)):
        if weight < 1:
            continue
        tr.segment(name, weight, spec.checkpointing)
        if spec.checkpointing:
            tr.ckpt_keep[tr.seg] = {x.sid, *keep}
        x = layer(tr, x, ctx)
    tr.segment("epilogue")
    epilogue(tr, x, labels)
    return attrs.evolve(replay(tr), work=op_work.step_work(tr), param_ops=tuple((*k, v) for k, v in tr.param_ops.items()))


# --------------------------------------------------------------------------- replay: forward and backward timelines


def replay(tr: Trace) -> StepTrace:
    """Walk the recorded forward, then the backward, counting live bytes (see the module doc)."""
    ops, size, nseg = tr.ops, tr.size, len(tr.seg_names)
    weight, ckpt = tr.seg_weight, tr.seg_ckpt
    alloc_seg: dict[int, int] = {}
    last_read: dict[int, int] = {}
    for i, op in enumerate(ops):
        for sid in op.allocs:
            alloc_seg.setdefault(sid, op.seg)
            last_read.setdefault(sid, i)
        for sid in op.reads:
            last_read[sid] = i
    carried = {sid for sid, i in last_read.items() if ops[i].seg != alloc_seg.get(sid, ops[i].seg)}
    savers: dict[int, int] = {}
    for op in ops:
        if not ckpt[op.seg]:
            for sid in op.saved:
                savers[sid] = savers.get(sid, 0) + 1
    keepers: dict[int, int] = {}
    for sids in tr.ckpt_keep.values():
        for sid in sids:
            keepers[sid] = keepers.get(sid, 0) + 1
    pinned = set(tr.pinned) | {tr.loss.sid} | tr.leaves
    model_pins = set(tr.model_pins)
    alive: set[int] = set()
    state = {"live": 0, "phantom": 0}
    # live and phantom bytes by category (PARTS: saved activations, logits/loss, autocast copies, temporaries)
    cat_of: dict[int, int] = {}
    first_cat: dict[int, int] = {}
    live_v, ph_v = [0, 0, 0, 0], [0, 0, 0, 0]

    def alloc(sid: int) -> None:
        alive.add(sid)
        state["live"] += size[sid]
        k = tr.kind[sid]
        c = 1 if k == "logits" else 2 if k == "autocast" else 0 if savers.get(sid, 0) > 0 or keepers.get(sid, 0) > 0 else 3
        cat_of[sid] = c
        first_cat.setdefault(sid, c)  # the category its forward phantom copies were counted under
        live_v[c] += size[sid]

    def held(sid: int) -> bool:
        return (savers.get(sid, 0) > 0 or keepers.get(sid, 0) > 0 or sid in pinned or sid in model_pins
                or sid in tr.external)

    def free(sid: int, cur_seg: int) -> None:
        if sid not in alive:
            return
        alive.discard(sid)
        state["live"] -= size[sid]
        live_v[cat_of[sid]] -= size[sid]
        sg = alloc_seg.get(sid, cur_seg)
        if sg != cur_seg and weight[sg] > 1 and sid not in carried:
            state["phantom"] -= (weight[sg] - 1) * size[sid]
            ph_v[first_cat[sid]] -= (weight[sg] - 1) * size[sid]

    # ---- forward
    seg_delta: dict[int, int] = {}
    seg_delta_v: dict[int, list[int]] = {}
    before_last, before_last_v = 0, [0, 0, 0, 0]
    peak, peak_v = 0, [0, 0, 0, 0]
    seg, seg_start, seg_max = 0, 0, 0
    seg_start_v, seg_max_v = list(live_v), [0, 0, 0, 0]
    for i, op in enumerate(ops):
        if op.seg != seg:
            seg_delta[seg] = state["live"] - seg_start
            seg_delta_v[seg] = [a - b for a, b in zip(live_v, seg_start_v)]
            if op.seg == nseg - 2:  # the last layer segment starts (its last repetition, with the phantom)
                before_last = state["live"] + state["phantom"]
                before_last_v = [a + b for a, b in zip(live_v, ph_v)]
            if weight[seg] > 1:
                delta = state["live"] - seg_start
                delta_v = [a - b for a, b in zip(live_v, seg_start_v)]
                if ckpt[seg]:  # what outlives a checkpointed layer is its output: the next layer's kept input
                    delta_v = [delta_v[0] + delta_v[3], delta_v[1], delta_v[2], 0]
                if seg_max + max(0, (weight[seg] - 1) * delta) > peak:
                    peak = seg_max + max(0, (weight[seg] - 1) * delta)
                    peak_v = [m + (weight[seg] - 1) * d * (delta > 0) for m, d in zip(seg_max_v, delta_v)]
                state["phantom"] += (weight[seg] - 1) * delta
                ph_v = [p + (weight[seg] - 1) * d for p, d in zip(ph_v, delta_v)]
            seg, seg_start, seg_max = op.seg, state["live"], 0
            seg_start_v = list(live_v)
        for sid in op.allocs:
            if sid not in alive:
                alloc(sid)
        cur = state["live"] + state["phantom"]
        if cur > peak:
            peak, peak_v = cur, [a + b for a, b in zip(live_v, ph_v)]
        if state["live"] > seg_max:
            seg_max, seg_max_v = state["live"], list(live_v)
        if DEBUG is not None:
            DEBUG.append(("forward", op.name, cur))
        for sid in (*op.reads, *op.allocs):
            if last_read.get(sid, -1) <= i and not held(sid):
                free(sid, seg)
        if i == tr.model_pins_end:
            released, model_pins = model_pins, set()
            for sid in released:
                if last_read.get(sid, -1) <= i and not held(sid):
                    free(sid, seg)
    forward_peak = peak
    pinned.clear()
    pinned.update({tr.loss.sid} | tr.leaves)  # the caller holds the loss, autograd the leaves
    for sid in list(alive):
        if not held(sid):
            free(sid, seg)
    pinned.clear()
    pinned.update(tr.leaves)
    retained_total = state["live"] + state["phantom"] - size[tr.loss.sid]
    saved_by_kind = {"activation": 0, "logits": 0, "autocast": 0}
    per_seg: dict[int, int] = {}
    labels: dict[str, int] = {}
    for sid in alive:
        if sid == tr.loss.sid:
            continue
        sg = alloc_seg.get(sid, 0)
        n = size[sid] * (1 if sid in carried else weight[sg])
        saved_by_kind[tr.kind[sid]] += n
        if sid not in carried:
            per_seg[sg] = per_seg.get(sg, 0) + size[sid]
        key = f"{tr.seg_names[sg]}: {tr.label[sid]}"
        labels[key] = labels.get(key, 0) + n

    # ---- backward
    points: list[tuple[int, int, int]] = []
    layer_points: list[tuple[int, int, int]] = []
    grads = {"live": 0, "phantom": 0}
    pending: dict[int, list[int]] = {}  # id(T) -> [bytes, refs]

    def gbytes(t: T) -> int:
        n = t.nbytes
        return -(-n // tr.spec.block) * tr.spec.block if tr.rounding else n

    def release(buf: list[int]) -> None:
        buf[1] -= 1
        if buf[1] == 0:
            state["live"] -= buf[0]

    def give(t: T, buf: list[int] | None) -> None:
        if buf is None:
            buf = [gbytes(t), 0]
            state["live"] += buf[0]
        buf[1] += 1
        if t.base is not None:  # a view's gradient waits for the view's backward (SplitBackward0: one cat)
            parts.setdefault(t.key, []).append(buf)
            return
        old = pending.get(t.key)
        if old is None:
            pending[t.key] = buf
            return
        summed = [gbytes(t), 1]  # InputBuffer accumulation: old + new, out of place
        state["live"] += summed[0]
        point()
        release(old)
        release(buf)
        pending[t.key] = summed

    def collect(t: T) -> list[int] | None:
        """The gradient of ``t`` when its producer's backward runs: the views' gradients are first joined into
        one tensor of ``t``'s size (after the ops that used the views released what they saved)."""
        got = pending.pop(t.key, None)
        views = parts.pop(t.key, None)
        if not views:
            return got
        joined = [gbytes(t), 1]
        state["live"] += joined[0]
        point()
        for b in views:
            release(b)
        if got is not None:
            release(got)
        return joined

    parts: dict[int, list[list[int]]] = {}

    seg_points: list[tuple[int, int, int]] = []
    seg_parts: list[list[int]] = []
    parts: dict[int, tuple[int, int, int, int]] = {}  # a point's other bytes -> its PARTS

    def point(extra: int = 0, name: str = "", op_grad: int = 0) -> None:
        seg_points.append((state["live"] + extra, grads["live"], op_grad))
        saved = live_v[0] + live_v[1] + live_v[2]
        seg_parts.append([live_v[0], live_v[1], live_v[2], state["live"] + extra - saved])
        if DEBUG is not None:
            DEBUG.append(("backward", name, state["live"] + extra + grads["live"] + state["phantom"] + grads["phantom"], state["live"], extra, grads["live"]))

    def flush(sg: int, start: tuple[int, int], start_v: list[int]) -> None:
        nonlocal ph_v
        w = weight[sg]
        pa, pg = state["phantom"], grads["phantom"]
        first = len(points)
        if w > 1:
            da, dg = state["live"] - start[0], grads["live"] - start[1]
            da_v = [live_v[i] - start_v[i] for i in range(3)]
            da_v.append(da - sum(da_v))
            for (a, g, o), pv in zip(seg_points, seg_parts):
                points.append((a + pa, g + pg, o))
                parts.setdefault(a + pa, tuple(x + y for x, y in zip(pv, ph_v)))
                points.append((a + pa + (w - 1) * da, g + pg + (w - 1) * dg, o))
                parts.setdefault(a + pa + (w - 1) * da, tuple(x + y + (w - 1) * d for x, y, d in zip(pv, ph_v, da_v)))
            state["phantom"] += (w - 1) * da
            ph_v = [p + (w - 1) * d for p, d in zip(ph_v, da_v)]
            grads["phantom"] += (w - 1) * dg
        else:
            points.extend((a + pa, g + pg, o) for a, g, o in seg_points)
            for (a, _, _), pv in zip(seg_points, seg_parts):
                parts.setdefault(a + pa, tuple(x + y for x, y in zip(pv, ph_v)))
        if 0 < sg < nseg - 1:
            layer_points.extend(points[first:])
        seg_points.clear()
        seg_parts.clear()

    def recompute(sg: int) -> None:
        seg_ops = [(i, op) for i, op in enumerate(ops) if op.seg == sg]
        # non-reentrant checkpoint stops recomputing once every saved tensor is back ("early stop")
        last_saving = max((k for k, (_, op) in enumerate(seg_ops) if op.saved), default=-1)
        seg_ops = seg_ops[:last_saving + 1]
        last_in: dict[int, int] = {}
        for i, op in seg_ops:
            for sid in (*op.reads, *op.allocs):
                last_in[sid] = i
        for i, op in seg_ops:
            for sid in op.saved:
                savers[sid] = savers.get(sid, 0) + 1
        for i, op in seg_ops:
            for sid in op.allocs:
                if sid not in alive:
                    alloc(sid)
            point()
            for sid in (*op.reads, *op.allocs):
                if last_in.get(sid, -1) <= i and alloc_seg.get(sid) == sg and not held(sid):
                    free(sid, sg)

    after_head = (0, 0)
    loss = tr.loss
    give(loss, None)
    pending[loss.key][1] += 1  # torch.autograd.backward holds the root's gradient (ones_like) until it returns
    seg = nseg - 1
    seg_start = (state["live"], grads["live"])
    seg_start_v = list(live_v)
    entered: set[int] = set()
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.seg != seg:
            if ckpt[seg] and seg in tr.ckpt_keep:  # the checkpoint's backward ends: its inputs go
                for sid in tr.ckpt_keep[seg]:
                    keepers[sid] -= 1
                    if not held(sid):
                        free(sid, seg)
            flush(seg, seg_start, seg_start_v)
            if seg == nseg - 1:
                after_head = (state["live"] + state["phantom"], grads["live"] + grads["phantom"])
            seg = op.seg
            seg_start = (state["live"], grads["live"])
            seg_start_v = list(live_v)
        if ckpt[seg] and seg not in entered:
            entered.add(seg)
            recompute(seg)
        incoming = [b for b in (collect(t) for t in op.outs) if b is not None]
        run = bool(incoming or op.param_grad)
        if run:
            for t in op.grad_ins:
                give(t, incoming[0] if op.alias and incoming else None)
            if not op.cast_grad:
                grads["live"] += op.param_grad
            point(op.bwd_temp, op.name, 0 if op.cast_grad else op.param_grad)
            for buf in incoming:
                release(buf)
        for sid in op.saved:
            savers[sid] = savers.get(sid, 0) - 1
            if not held(sid):
                free(sid, seg)
        if run and op.cast_grad:
            grads["live"] += op.param_grad
            point(op.bwd_temp, op.name + ".cast", op.param_grad)
        if run and op.bwd_temp_after:
            point(op.bwd_temp_after, op.name)
    flush(seg, seg_start, seg_start_v)
    if DEBUG is not None:
        DEBUG.append(("end", "alive: " + ", ".join(f"{tr.label[i]}={size[i]}" for i in sorted(alive)), state["live"]))
        DEBUG.append(("end", "pending: " + ", ".join(str(b) for b in pending.values()), 0))
    return StepTrace(
        saved=tuple(sorted(labels.items(), key=lambda kv: -kv[1])),
        backward_frontier=_frontier([(a, g) for a, g, _ in points]),
        backward_frontier_accumulating=_frontier([(a, o) for a, _, o in points]),
        backward_frontier_layers=_frontier([(a, g) for a, g, _ in layer_points]),
        backward_before_grads=max((a for a, g, _ in points if g == 0), default=0),
        backward_frontier_bucketed=_frontier([(a, o) for a, g, o in points if g > 0]),
        retained_bytes=int(retained_total),
        activation_bytes=int(retained_total - saved_by_kind["logits"] - saved_by_kind["autocast"]),
        logits_bytes=int(saved_by_kind["logits"]),
        autocast_copy_bytes=int(saved_by_kind["autocast"]),
        forward_peak_bytes=int(forward_peak),
        backward_points=tuple(points),
        param_grad_bytes=int(tr.param_grad_total),
        buffer_bytes=buffer_bytes(tr.spec.arch, BYTES[tr.cfg.param_dtype]),
        layer_bytes=int(seg_delta.get(nseg - 2, 0)),
        max_param_grad_bytes=max((op.param_grad for op in ops), default=0),
        loss_bytes=int(size[tr.loss.sid]),
        backward_after_head=(int(after_head[0]), int(after_head[1])),
        forward_before_last_layer_bytes=int(before_last + max(0, weight[nseg - 2] - 1) * seg_delta.get(nseg - 2, 0)),
        forward_peak_parts=tuple(int(x) for x in peak_v),
        forward_before_last_layer_parts=tuple(int(b + max(0, weight[nseg - 2] - 1) * d) for b, d in
                                              zip(before_last_v, seg_delta_v.get(nseg - 2, [0, 0, 0, 0]))),
        backward_parts=_frontier_parts(parts, points, layer_points),
    )


def _frontier_parts(parts: dict[int, tuple[int, int, int, int]], points: list, layer_points: list) -> tuple:
    """The PARTS of the points on the three frontiers only (what the peak's breakdown looks up)."""
    keep = {a for a, _ in _frontier([(a, g) for a, g, _ in points])}
    keep |= {a for a, _ in _frontier([(a, o) for a, _, o in points])}
    keep |= {a for a, _ in _frontier([(a, g) for a, g, _ in layer_points])}
    keep |= {a for a, _ in _frontier([(a, o) for a, g, o in points if g > 0])}  # DeepSpeed's bucketed backward
    keep.add(max((a for a, g, _ in points if g == 0), default=0))
    return tuple(sorted((a, p) for a, p in parts.items() if a in keep))


def _frontier(pairs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The pairs not dominated by another (for non-negative weights x, y the maximum of ``x·a + y·g`` is
    reached on these)."""
    out: list[tuple[int, int]] = []
    for a, g in sorted(set(pairs), key=lambda p: (-p[0], -p[1])):
        if not out or g > out[-1][1]:
            out.append((a, g))
    return tuple(out)


def buffer_bytes(arch, param_bytes: int = 4) -> int:
    """The model's buffers: rotary ``inv_freq`` and ``original_inv_freq`` (``d_rot/2`` fp32 each, computed in
    fp32 whatever the model dtype); Gemma's ``embed_scale`` (a 0-d tensor created in the model's dtype)."""
    if arch.is_bare:
        return 0
    n = 0
    if not arch.learned_positions:
        rot = int(arch.head_dim * arch.partial_rotary_factor)
        rot -= rot % 2
        n += 2 * (rot // 2) * 4
    if arch.model_type in ("gemma", "gemma2"):
        n += param_bytes
    return n
