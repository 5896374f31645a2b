"""The work of one training step, op by op: FLOPs, bytes moved and kernel launches, for the time model.

The step trace (:mod:`fitplan.trace.step_trace`) replays every aten op of one micro-step, as a learned
architecture file records it, with its tensors' sizes and dtypes. Each op also carries a :class:`Work`
(:func:`aten`, from the op's name and its tensors): the kernels its forward and its backward launch, each
with its class, the dtype whose FLOP peak applies, its FLOPs and the bytes it reads and writes. When the
trace is built, :func:`step_work` turns them into the flat, documented record list the time model prices
(:class:`OpWork`, ``StepTrace.work``; docs/time-and-cost.md, "The step trace's work records"): any replay
that provides the same list (a measured profile's) gets the same time model.

How the work of each kind of op is counted (the rules come from how the kernels run):

* **views** (``view``, ``t``, ``expand``, ``slice``...: every output aliases an input) launch nothing forward; the
  backward of ``slice`` and ``select`` fills a tensor of the input's size and copies the gradient into it, that of
  ``expand`` sums the gradient over the broadcast dimensions.
* **GEMM** (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_grouped_mm``): ``2·M·K·N`` FLOPs; bytes = both operands and the output once each.
  Backward: the input gradient (same FLOPs: ``grad_out @ W``) when the input requires grad and the weight
  gradient (``grad_outᵀ @ x``) when the weight trains, two kernels (``MmBackward0``); ``addmm`` with a
  trained bias also reduces the output gradient. A frozen weight
  (LoRA's base) has no weight-gradient GEMM.
* **attention** (SDPA flash / memory-efficient kernels): ``4·b·a·s²·d`` FLOPs forward (QKᵀ and PV), halved
  for the causal mask (the kernels skip the blocks above the diagonal: FlashAttention-2, Dao 2023, §3.1);
  backward ``2.5×`` the forward FLOPs (five matmuls of the same size against two, QKᵀ recomputed). Bytes:
  q, k, v, the output and the logsumexp (forward); those, the output gradient and dq, dk, dv (backward).
  Eager attention is GEMMs and elementwise ops on the materialised ``s²`` scores.
* **elementwise** (casts, norms' pieces, activations, adds, copies, dropout, softmax, the loss): no FLOPs
  that matter; bytes = inputs read + outputs written. Backward: the saved tensors and the input gradients,
  and a kernel per gradient the op computes, each reading the incoming gradient (:func:`elementwise`); ops
  whose backward only forwards the gradient (``add``, views, copies) launch nothing.
* **dequant** (QLoRA): bitsandbytes' ``dequantize_4bit`` reads the packed 4-bit weight (0.5 B/element plus
  the absmax) and writes it in the compute dtype before every use: forward, and again in the backward
  (``MatMul4Bit.backward`` dequantizes to compute the input gradient).
* **embedding**: a gather of ``b·s`` rows forward; backward (when the table trains) zero-fills the table's
  gradient and scatter-adds the rows (``embedding_dense_backward``).

``torch.compile`` (Inductor) fuses each run of consecutive elementwise ops between two GEMMs or attention
kernels into one kernel that reads the run's inputs once and writes only what is used later (by a later
op, or saved for the backward); its backward is fused likewise. The records carry both forms (``mode``
``eager`` / ``compiled``); GEMMs, attention and dequantization are the same in both.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from attrs import frozen

from fitplan.arch.archfile import BYTES
from fitplan.trace.symbolic import as_int

KINDS = ("gemm", "attention", "elementwise", "dequant", "embedding")
"""Op classes: ``gemm`` and ``attention`` are priced on the FLOP peak, the others on memory bandwidth."""
PHASES = ("forward", "backward", "recompute")
CAUSAL_FRACTION = 0.5
"""Share of the ``s²`` score blocks a causal flash kernel computes (those on or below the diagonal)."""
FLASH_BACKWARD_FLOPS = 2.5
"""FlashAttention-2's backward runs five ``s²·d`` matmuls against the forward's two (Dao 2023, §3.2)."""
NF4_BYTES_PER_ELEMENT = 0.5 + 4 / 64
"""bitsandbytes NF4: two weights per byte plus one fp32 absmax per block of 64."""


class Kernel(NamedTuple):
    """One kernel (or ``n`` identical ones): its class, the dtype of its FLOPs, FLOPs and bytes moved. (A named
    tuple, not an attrs class: a trace records a few hundred, and a frozen attrs class takes five times as long to
    make.)"""

    kind: str
    dtype: str
    flops: float
    bytes: float
    n: int = 1


class Work(NamedTuple):
    """What one recorded op launches: its forward kernels and, when it runs in the backward, those too."""

    fwd: tuple[Kernel, ...]
    bwd: tuple[Kernel, ...] = ()


@frozen
class OpWork:
    """One record of ``StepTrace.work``: ``count`` executions per micro-step of a kernel class.

    :ivar kind: one of :data:`KINDS`.
    :ivar phase: ``forward``, ``backward`` or ``recompute`` (the second forward of checkpointed layers).
    :ivar dtype: the dtype whose peak FLOP/s applies (``f32``, ``bf16``, ``f16``; "" for memory-bound kinds).
    :ivar flops: FLOPs of one execution.
    :ivar bytes: bytes read and written by one execution.
    :ivar count: executions per micro-step (a layer's op counts once per layer).
    :ivar mode: ``eager`` or ``compiled`` when the record applies only without / with ``torch.compile``;
        "" for both.
    """

    kind: str
    phase: str
    dtype: str
    flops: float
    bytes: float
    count: int
    mode: str = ""


# --------------------------------------------------------------------------- the work of primitive ops


def elementwise(ins, outs, saved, grad_ins, param_grad: int, backward: bool, passes_gradient: bool,
                computed=None) -> Work:
    """An elementwise op: reads its inputs, writes its outputs; its backward reads the saved tensors and writes
    the input (and parameter) gradients, unless it only passes the gradient on. Each gradient it computes
    (``computed``: the inputs whose gradient is a formula, default all of ``grad_ins``; and the parameter's) is
    its own formula in torch's ``derivatives.yaml`` (``mul``: ``self: grad * other``, ``other: grad * self``),
    so one kernel each, each reading the incoming gradient; an input smaller than the output (a broadcast norm
    weight or statistic) gets its gradient at the output's shape first, which ``at::sum_to`` then reduces
    (autograd's ``validate_outputs``, torch/csrc/autograd/engine.cpp): the full-size product is written and read
    once more."""
    fwd = (Kernel("elementwise", "", 0, _nbytes(ins) + _nbytes(outs)),)
    if not backward or passes_gradient:
        return Work(fwd)
    grad = _nbytes([t for t in outs if t.rg])
    computed = list(grad_ins) if computed is None else computed
    full = max((t.nbytes for t in outs if t.rg), default=0)
    sizes = [t.nbytes for t in computed] + ([param_grad] if param_grad else [])
    kernels = max(1, len(sizes))
    reduced = sum(2 * full for size in sizes if size < full)
    bwd = kernels * grad + _nbytes(saved) + _nbytes(grad_ins) + param_grad + reduced
    return Work(fwd, (Kernel("elementwise", "", 0, bwd / kernels, kernels),))


def gemm(rows: int, k: int, n: int, dtype: str, a_bytes: float, b_bytes: float, out_bytes: float, *,
         input_grad: bool, weight_grad: bool, count: int = 1) -> Work:
    """``(rows × k) @ (k × n)``: ``2·rows·k·n`` FLOPs. Backward: one GEMM per operand that needs a gradient,
    each reading the output gradient and the other operand and writing the gradient (``count`` GEMMs of the
    same shape: a batched matmul)."""
    flops = 2.0 * rows * k * n * count
    io = a_bytes + b_bytes + out_bytes
    fwd = (Kernel("gemm", dtype, flops, io),)
    bwd = tuple(Kernel("gemm", dtype, flops, io) for need in (input_grad, weight_grad) if need)
    return Work(fwd, bwd)


def attention(b: int, heads: int, s: int, d: int, dtype: str, io_bytes: float, *, causal: bool, backward: bool) -> Work:
    """A fused attention kernel (see the module doc): ``4·b·a·s²·d`` FLOPs (× 0.5 causal), backward × 2.5."""
    flops = 4.0 * b * heads * s * s * d * (CAUSAL_FRACTION if causal else 1.0)
    fwd = (Kernel("attention", dtype, flops, io_bytes),)
    if not backward:
        return Work(fwd)
    return Work(fwd, (Kernel("attention", dtype, FLASH_BACKWARD_FLOPS * flops, 2 * io_bytes),))


def dequant(numel: int, out_elem_bytes: int, *, backward: bool) -> Work:
    """NF4 dequantization of ``numel`` weights to the compute dtype, before the forward GEMM and again before
    the backward's input-gradient GEMM."""
    k = Kernel("dequant", "", 0, numel * (NF4_BYTES_PER_ELEMENT + out_elem_bytes))
    return Work((k,), (k,) if backward else ())


def embedding(rows: int, dim: int, elem_bytes: int, table_numel: int, grad_bytes: int) -> Work:
    """A row gather forward; with a trained table, a zero-filled table gradient plus a scatter-add of the rows."""
    fwd = (Kernel("embedding", "", 0, 2 * rows * dim * elem_bytes + 8 * rows),)
    if not grad_bytes:
        return Work(fwd)
    return Work(fwd, (Kernel("embedding", "", 0, grad_bytes * table_numel + 2 * rows * dim * elem_bytes + 8 * rows, 2),))


def _nbytes(ts) -> int:
    return sum(t.nbytes for t in ts if t is not None)


# --------------------------------------------------------------------------- the step's records


def step_work(tr: Any) -> tuple[OpWork, ...]:
    """The records of one micro-step from a recorded trace (:class:`fitplan.trace.step_trace.Trace`):
    forward and backward of every op, × the repetition of its segment; the recomputed forward of the
    checkpointed segments (non-reentrant checkpointing re-runs a layer up to its last op that saves a
    tensor); and the fused form of every elementwise run for ``torch.compile``. Identical records merge."""
    acc: dict[tuple, int] = {}

    def add(kind, phase, dtype, flops, nbytes, count, mode=""):
        key = (kind, phase, dtype, float(flops), float(nbytes), mode)
        acc[key] = acc.get(key, 0) + count

    ops = tr.ops
    last_read = _last_reads(ops)
    saved_anywhere = {sid for op in ops for sid in op.saved} | set(tr.pinned) | {tr.loss.sid}
    by_seg: dict[int, list[int]] = {}  # segment -> its ops that launch kernels, in order
    for i, op in enumerate(ops):
        if op.work is not None:
            by_seg.setdefault(op.seg, []).append(i)
    for seg in range(len(tr.seg_names)):
        weight = tr.seg_weight[seg]
        idx = by_seg.get(seg)
        if not idx:
            continue
        recomputed = set()
        if tr.seg_ckpt[seg]:
            saving = [i for i in idx if ops[i].saved]
            recomputed = {i for i in idx if saving and i <= saving[-1]}
        for i in idx:
            w = ops[i].work
            fusible = _fusible(w)
            mode = "eager" if fusible else ""
            for k in w.fwd:
                add(k.kind, "forward", k.dtype, k.flops, k.bytes, weight * k.n, mode)
                if i in recomputed:
                    add(k.kind, "recompute", k.dtype, k.flops, k.bytes, weight * k.n, mode)
            for k in w.bwd:
                add(k.kind, "backward", k.dtype, k.flops, k.bytes, weight * k.n, mode)
        for nbytes in accumulated_gradients(op for op in ops if op.seg == seg):
            add("elementwise", "backward", "", 0, 3 * nbytes, weight, "eager")
        for run in _runs(ops, idx):
            fwd, bwd = _fused_bytes(tr, ops, run, last_read, saved_anywhere)
            add("elementwise", "forward", "", 0, fwd, weight, "compiled")
            if any(i in recomputed for i in run):
                add("elementwise", "recompute", "", 0, fwd, weight, "compiled")
            if bwd:
                add("elementwise", "backward", "", 0, bwd, weight, "compiled")
    return tuple(OpWork(k[0], k[1], k[2], k[3], k[4], n, k[5]) for k, n in acc.items())


def accumulated_gradients(ops) -> list[int]:
    """The bytes of each gradient sum the backward of ``ops`` runs: a tensor that several ops differentiate
    receives one gradient from each, and autograd's engine adds each further one into the first (``InputBuffer::add``
    -> ``accumulate``: ``old_var.add_(var)`` or ``old_var + var``, torch/csrc/autograd/input_buffer.cpp), a kernel
    reading two gradients and writing one (3 × the tensor's bytes; compiled, the sums fuse into the backward's
    kernels). A hidden state read by a norm and a residual add, a norm's output cast for three projections."""
    seen: dict[int, tuple[Any, int]] = {}
    for op in ops:
        for t in op.grad_ins:
            t0, n = seen.get(id(t), (t, 0))
            seen[id(t)] = (t0, n + 1)
    return [t.nbytes for t, n in seen.values() for _ in range(n - 1)]


def _fusible(w: Work) -> bool:
    return all(k.kind == "elementwise" for k in w.fwd)


def _last_reads(ops) -> dict[int, int]:
    out: dict[int, int] = {}
    for i, op in enumerate(ops):
        for sid in (*op.reads, *op.allocs):
            out[sid] = i
    return out


def _runs(ops, idx: list[int]) -> list[list[int]]:
    """Maximal runs of consecutive fusible ops (ops without work, such as ``hold``, do not break a run)."""
    runs: list[list[int]] = []
    cur: list[int] = []
    for i in idx:
        if _fusible(ops[i].work):
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def _fused_bytes(tr, ops, run: list[int], last_read: dict[int, int], saved_anywhere: set[int]) -> tuple[float, float]:
    """Bytes of one fused kernel for the run, forward and backward: what enters the run from outside and what
    leaves it (read after the run, or saved for the backward); backward: the gradients of what leaves, the
    saved tensors, the gradients of what entered."""
    produced = {sid for i in run for sid in ops[i].allocs}
    reads = {sid for i in run for sid in ops[i].reads} - produced
    end = run[-1]
    leaving = {sid for sid in produced if last_read.get(sid, -1) > end or sid in saved_anywhere}
    size = tr.size
    fwd = sum(size[s] for s in reads) + sum(size[s] for s in leaving)
    if not any(ops[i].work.bwd for i in run):
        return float(fwd), 0.0
    grad_out = {t.sid: t.nbytes for i in run for t in ops[i].outs if t.sid in leaving}
    grad_in = {t.sid: t.nbytes for i in run for t in ops[i].grad_ins if t.sid in reads}
    kept = {sid for i in run for sid in ops[i].saved}
    bwd = sum(grad_out.values()) + sum(grad_in.values()) + sum(size[s] for s in kept)
    return float(fwd), float(bwd)


# --------------------------------------------------------------------------- the work of a recorded aten op

GEMMS = {"mm": ("self", "mat2"), "addmm": ("mat1", "mat2"), "bmm": ("self", "mat2"),
         "baddbmm": ("batch1", "batch2"), "_grouped_mm": ("self", "mat2"), "bnb.matmul_4bit": ("A", "B"),
         "bnb.matmul_8bit": ("A", "B")}
"""Matrix products and their two operands (the argument names of ``native_functions.yaml``; bitsandbytes'
``matmul_4bit`` reads the dequantized weight)."""
FUSED_ATTENTION = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_flash_attention_for_cpu")


def aten(name: str, named: dict[str, Any], outs, saved, grad_ins, grad_kinds, param_grad: int, backward: bool):
    """The kernels of one recorded aten op (a learned architecture's replay): ``named`` maps its argument
    names to tensors (or lists of them). None when the op launches nothing: every output is a view of an
    input (``view``, ``t``, ``expand``, ``slice``...; an in-place op, whose name ends in ``_``, writes)."""
    flat = [t for v in named.values() for t in (v if isinstance(v, list) else [v]) if t is not None]
    if outs and not name.split(".", 1)[0].endswith("_"):
        sids = {t.sid for t in flat}
        if all(o.sid in sids for o in outs):
            return _view_backward(name, outs, grad_ins, grad_kinds, backward)
    if name in GEMMS:
        return _aten_gemm(name, named, outs[0], backward)
    if name in FUSED_ATTENTION:
        return _aten_attention(named, outs, backward)
    if name == "embedding":
        w, idx = named["weight"], named["indices"]
        rows = idx.numel
        return embedding(rows, outs[0].numel // max(rows, 1), BYTES[w.dtype], w.numel,
                         BYTES[w.dtype] if (w.rg and backward) else 0)
    if name in ("bnb.dequantize_4bit", "bnb.int8_vectorwise_dequant"):
        return dequant(outs[0].numel, BYTES[outs[0].dtype], backward=False)
    passes = bool(grad_kinds) and all(k >= 0 for k in grad_kinds) and not param_grad
    computed = [t for t, k in zip(grad_ins, grad_kinds) if k < 0] if grad_kinds else list(grad_ins)
    work = elementwise(flat, outs, saved, grad_ins, param_grad, backward, passes, computed)
    if name == "div.Tensor" and work.bwd and any(t is named.get("other") for t in computed):
        return Work(work.fwd, (*work.bwd, _divisor_gradient_passes(_nbytes([named.get("self")]) or outs[0].nbytes,
                                                                   named["other"].nbytes, outs[0].nbytes)))
    extra = BACKWARD_PREPASSES.get(name, 0)
    if not (extra and work.bwd and saved):
        return work
    size = max(t.nbytes for t in saved if t is not None)
    return Work(work.fwd, (*work.bwd, Kernel("elementwise", "", 0, 2 * size, extra)))


def _divisor_gradient_passes(x: int, y: int, full: int) -> Kernel:
    """The kernels the divisor's gradient of ``x / y`` runs before its product with the incoming gradient (torch's
    derivatives.yaml: ``other: div_tensor_other_backward(grad, self, other)``, FunctionsManual.cpp: ``-grad * ((self /
    other) / other)``): ``self / other`` and its quotient by ``other`` again (each reading its two operands and writing an
    output-sized tensor) and ``-grad`` (reading and writing one); the product itself is the formula's own kernel
    (:func:`elementwise`; ``x``, ``y``, ``full``: the bytes of the dividend, the divisor and the output). Measured on
    torch's dispatch: div, div, neg, mul for the divisor; one div for the dividend."""
    return Kernel("elementwise", "", 0, ((x + y + full) + (full + y + full) + 2 * full) / 3, 3)


VIEW_SCATTER_BACKWARD = ("slice.Tensor", "select.int")
"""Views whose backward scatters the incoming gradient into a new tensor of the input's size (torch's
``slice_backward`` / ``select_backward``, aten/src/ATen/native/TensorShape.cpp: ``at::zeros(input_sizes)``, then
``grad_input.slice(...).copy_(grad)``): a fill of the input's size and a copy of the gradient, two kernels. Measured on
torch's profiler: tests/test_time_backward_work.py."""


VIEW_REDUCE_BACKWARD = ("expand",)
"""Views whose backward sums the incoming gradient over the dimensions they broadcast (derivatives.yaml: ``expand``:
``self: at::sum_to(grad, self.sym_sizes())``): one reduction reading the gradient and writing the input's size (GQA's
``repeat_kv`` expands k and v before the attention). Measured on torch's dispatch: tests/test_time_backward_work.py."""


def _view_backward(name: str, outs, grad_ins, grad_kinds, backward: bool) -> Work | None:
    """A view launches nothing forward; its backward launches nothing either, unless it gives its input a new
    gradient: a part of it (:data:`VIEW_SCATTER_BACKWARD`: ``rotate_half``'s two halves) or a sum of a broadcast
    (:data:`VIEW_REDUCE_BACKWARD`)."""
    fresh = [t for t, k in zip(grad_ins, grad_kinds) if k < 0]
    if not (backward and fresh):
        return None
    if name in VIEW_SCATTER_BACKWARD:
        return Work((), (Kernel("elementwise", "", 0, fresh[0].nbytes), Kernel("elementwise", "", 0, 2 * outs[0].nbytes)))
    if name in VIEW_REDUCE_BACKWARD:
        return Work((), (Kernel("elementwise", "", 0, outs[0].nbytes + fresh[0].nbytes),))
    return None


BACKWARD_PREPASSES = {"pow.Tensor_Scalar": 2, "rsqrt": 2, "reciprocal": 2, "sqrt": 1}
"""Kernels an op's gradient formula runs on its saved tensor before the product with the incoming gradient, each
reading and writing a tensor of that size (torch's derivatives.yaml and FunctionsManual.cpp: ``pow_backward`` is
``grad * (exponent * self.pow(exponent - 1))``: a power and a scale, then the product; ``rsqrt``: ``-0.5 * grad *
result.pow(3)``; ``reciprocal``: ``-grad * (result * result)``; ``sqrt``: ``grad / (2 * result)``). Measured on
torch's dispatch: tests/test_time_backward_work.py."""


def _contract(a, b, out) -> int:
    """The summed dimension of ``a @ b``: ``a``'s last dimension when its shape is known, else from the sizes
    (``(M·K)·(K·N)/(M·N) = K²`` for a matrix product)."""
    if a.shape:
        return as_int(a.shape[-1])
    return max(1, round((a.numel * b.numel / max(out.numel, 1)) ** 0.5))


def _aten_gemm(name: str, named: dict[str, Any], out, backward: bool) -> Work:
    an, bn = GEMMS[name]
    a, b = named[an], named[bn]
    k = _contract(a, b, out)
    quantized = name in ("bnb.matmul_4bit", "bnb.matmul_8bit")
    mm = gemm(out.numel, k, 1, out.dtype, a.nbytes, b.nbytes, out.nbytes, input_grad=backward and a.rg,
              weight_grad=backward and b.rg and not quantized)
    extra: tuple[Kernel, ...] = ()
    bias = named.get("self") if name == "addmm" else None
    if backward and bias is not None and bias.rg:
        extra = (Kernel("elementwise", "", 0, out.nbytes),)  # the bias gradient: a reduction of the output's
    if quantized and backward and a.rg:  # MatMul4Bit.backward dequantizes again for the input gradient
        extra = dequant(b.numel, BYTES[b.dtype], backward=True).bwd
    return Work(mm.fwd, extra + mm.bwd)


def _aten_attention(named: dict[str, Any], outs, backward: bool) -> Work:
    q, k, v = named["query"], named["key"], named["value"]
    shape = q.shape or (1, 1, q.numel, 1)
    s, d = as_int(shape[-2]), as_int(shape[-1])
    bh = q.numel // max(s * d, 1)
    io = q.nbytes + k.nbytes + v.nbytes + sum(o.nbytes for o in outs[:2])
    masked = named.get("attn_mask") is not None or named.get("attn_bias") is not None
    return attention(1, bh, s, d, q.dtype, io, causal=not masked, backward=backward and (q.rg or k.rg or v.rg))
