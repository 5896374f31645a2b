"""8-bit LoRA's base layers: bitsandbytes' LLM.int8 ``Linear8bitLt`` in the step trace (:func:`int8_linear`).

Its autograd Functions' rules are in :data:`fitplan.trace.kernels.EXTRA_RULES`; the weights' bytes in
``builtin/lora.py`` (``qlora``, ``load_in_8bit``)."""

from __future__ import annotations

from typing import Any

from fitplan.arch.archfile import BYTES


def int8_linear(inst, site: dict[str, Any], x, in_f: int, out_f: int, replace_output) -> None:
    """An 8-bit LoRA base layer: bitsandbytes 0.50.2 ``Linear8bitLt.forward`` (nn/modules.py:1180-1194) calls
    ``bnb.matmul(x, weight, state=...)``, whose training path is ``MatMul8bitLt`` on CUDA and ``MatMul8bitFp`` on
    the CPU and XPU (autograd/_functions.py:389-404). The weight is frozen: its int8 ``CB`` and fp32 row scales
    ``SCB`` exist, so neither Function quantizes it again.

    * CUDA, ``MatMul8bitLt.forward`` (101-199): the input cast to fp16 (a copy unless it is fp16), quantized row by
      row (``int8_vectorwise_quant``, backends/cuda/ops.py:213-250: int8 ``rows·in`` and one fp32 per row; with the
      default ``llm_int8_threshold`` 6.0, ``A.abs() >= 6`` (fp16 and bool ``rows·in``) finds the outlier columns,
      whose number depends on the data: fitplan assumes none, so ``subA`` is empty), ``int8_linear_matmul`` (an
      int32 ``rows·out`` accumulator) dequantized to the input's dtype (the output). ``ctx.tensors = (CAt, subA,
      A)`` keeps the input as a ``ctx`` attribute, not through ``save_for_backward``: no saved-tensor hook sees it,
      so under gradient checkpointing it stays from the forward to the layer's backward (a checkpoint input that
      is not recomputed) and activation offloading does not move it (``Trace.ctx_kept``).
    * CPU, ``MatMul8bitFp.forward`` (245-271): the weight dequantized to the input's dtype (a transient) and
      ``F.linear``; ``ctx.A`` keeps the input as well.
    * backward (both): ``CB.to(dtype_A, copy=True).mul_(SCB / 127)``, the whole weight in the input's dtype (a
      transient), then the input's gradient ``grad_output @ CB``.

    The recomputation of a checkpointed layer makes a second copy of such an input while the first is still held;
    fitplan counts one. ``x``, ``in_f``, ``out_f``: the site's input and widths, as the caller read them;
    ``replace_output``: the caller's (:mod:`.kernels`) way of making ``out`` the site's output."""
    b = inst.b
    tr = b.tr
    rows = x.numel // in_f
    label = site["module"]
    reads = [("A", x)]
    if b.spec.device == "cuda":
        a16 = x
        if x.dtype != "f16":
            a16 = tr.new(x.numel, "f16", False, label + ".int8.input_fp16")
            b.emit("_to_copy", [("self", x)], [a16], label=label + ".int8.input_fp16", extra={"ng": True})
        parts = [tr.new(x.numel, "f16", False, label + ".int8.abs"), tr.new(x.numel, "bool", False, label + ".int8.outliers"),
                 tr.new(x.numel, "i8", False, label + ".int8.CA"), tr.new(rows, "f32", False, label + ".int8.SCA")]
        b.emit("bnb.int8_vectorwise_quant", [("A", a16)], parts, label=label + ".int8.quant")
        acc = tr.new(rows * out_f, "i32", False, label + ".int8.acc")
        b.emit("bnb.int8_linear_matmul", [("A", parts[2])], [acc], label=label + ".int8.matmul")
        reads += [("acc", acc), ("SCA", parts[3])]
    else:
        deq = tr.new(in_f * out_f, x.dtype, False, label + ".dequantized")
        b.emit("bnb.int8_vectorwise_dequant", [], [deq], label=label + ".dequantize")
        reads.append(("deq", deq))
    if site["output"].startswith("t"):  # the recorded output's shape; a fresh tensor
        entry = inst.seg["t"][int(site["output"][1:])]
        out = inst.new_tensor([entry[0], entry[1], None], label, x.dtype)
    else:
        out = tr.new(rows * out_f, x.dtype, False, label)
    ckpt = b.spec.checkpointing and tr.unit >= 0
    tr.ctx_kept.add(x.sid)
    if ckpt and x.rg and x.sid >= 0:  # kept by the node, not the checkpoint's hooks: until the layer's backward ends
        keep = tr.ckpt_keep.setdefault(tr.unit, {})
        keep[x.sid] = keep.get(x.sid, False)
    weight = tr.param(in_f * out_f, x.dtype, False)  # CB as the GEMM reads it (its time); not a tensor of the step
    b.emit("bnb.matmul_8bit", [*reads, ("B", weight)], [out], label=label,
           extra={"sv": [] if ckpt else [x], "bt": str(in_f * out_f * BYTES[x.dtype] + 4 * out_f)})
    replace_output(inst, site, out)
