"""Device kernels and library call sites, expanded into aten ops: what differs between CPU and CUDA,
and what peft / bitsandbytes insert at a Linear.

The learner records on the CPU and keeps two Python-level call sites whole (``F.dropout`` and
``F.scaled_dot_product_attention``), because what they expand to depends on the device, the dtype and
the dropout probability. The rules below choose the expansion, each from the PyTorch code that defines it:

* dropout in training (``aten/src/ATen/native/Dropout.cpp``): p = 0 returns the input; on CUDA
  ``is_fused_kernel_acceptable`` holds and ``native_dropout`` returns the output and a bool mask (the
  backward saves the 1-byte mask); on the CPU ``_dropout_impl`` makes ``noise = empty_like(input)
  .bernoulli_(1 - p).div_(1 - p)`` and returns ``input * noise`` (the noise, in the input dtype, is saved);
* SDPA (``aten/src/ATen/native/transformers/sdp_utils_cpp.cpp`` and ``cuda/sdp_utils.cpp``,
  ``attention.cpp``): a boolean mask is converted to q's dtype at every call (``convert_boolean_attn_mask``,
  a new tensor per layer); on the CPU without dropout, with q, k, v of one head dim and one head count
  (unequal head counts only with ``enable_gqa``) ``_scaled_dot_product_flash_attention_for_cpu`` (saves q,
  k, v, the mask, the output and a fp32 logsumexp per row and head); otherwise the composite math path
  (fp32 q, k, v for 16-bit inputs, materialised scores, softmax and dropout); on CUDA, 16-bit inputs
  without a mask, head dims equal and <= 256, one head count or ``enable_gqa``: flash attention (logsumexp
  (b, a, s) fp32 + RNG state); otherwise memory-efficient attention when q, k, v have one head count
  (logsumexp padded to a multiple of 32 rows, the mask padded to a key length multiple of 8), else the
  math path. Under ``torch.autocast``, SDPA is on the lower-precision list (``autocast_mode.cpp``): float
  inputs, a float mask too, are cast to the compute dtype first;
* LoRA (peft 0.21 ``lora.Linear.forward``): ``result = base_layer(x)``; ``x = x.to(lora_A.weight.dtype)``
  (adapters are fp32, ``autocast_adapter_dtype=True``); ``result = result + lora_B(lora_A(dropout(x))) *
  scaling``; ``result.to(result's dtype)``. Each adapter Linear is ``F.linear``'s aten expansion (``t``,
  ``view``, ``mm``, ``_unsafe_view``), with autocast's casts under ``*-mixed`` (the weight's 16-bit copy is
  cached for the forward because it is a leaf that requires grad);
* QLoRA (bitsandbytes ``Linear4bit`` -> ``matmul_4bit``): the NF4 weight is dequantised to the compute
  dtype for the matmul (a transient) and nothing batch-sized is saved beyond the input's cast; the
  backward dequantises again (a transient of the weight's size);
* 8-bit LoRA (bitsandbytes 0.50.2 ``Linear8bitLt`` -> ``bnb.matmul``): :func:`fitplan.trace.int8.int8_linear`.
"""

from __future__ import annotations

import math
from typing import Any

from fitplan.arch.archexpr import compile_expr
from fitplan.arch.archfile import BYTES
from fitplan.trace.int8 import int8_linear
from fitplan.trace.lora_targets import contiguous_input, embedding_matches, lora_site_matches

HALF = ("bf16", "f16")
CUDA_OUTPUT_DTYPES = {
    # aten/src/ATen/native/cuda/layer_norm_kernel.cu: mean and rstd are accumulated and returned in fp32
    # (acc_type) for 16-bit inputs; the CPU kernel (layer_norm_kernel.cpp) returns them in the input dtype
    "native_layer_norm": {1: "f32", 2: "f32"},
}


def cuda_output_dtypes(name: str, ins: list, device: str) -> dict[int, str]:
    """Output dtypes that differ on CUDA from the recorded (CPU) op, per the table above."""
    if device != "cuda" or name not in CUDA_OUTPUT_DTYPES:
        return {}
    first = next((t for _, t in ins if t is not None and not isinstance(t, list)), None)
    if first is None or first.dtype not in HALF:
        return {}
    return CUDA_OUTPUT_DTYPES[name]
EXTRA_RULES = {
    # bitsandbytes' MatMul4Bit autograd Function: the gradient of the input only; saves nothing batch-sized
    "bnb.matmul_4bit": {"d": ["A"], "s": [], "p": [0]},
    "bnb.dequantize_4bit": None,
    # bitsandbytes' MatMul8bitLt / MatMul8bitFp autograd Functions: the gradient of the input only; what they keep
    # is a ctx attribute (the fitplan op's explicit saves), the ops inside run with grad mode off
    "bnb.matmul_8bit": {"d": ["A"], "s": [], "p": []},
    "bnb.int8_vectorwise_quant": None,
    "bnb.int8_linear_matmul": None,
    "bnb.int8_vectorwise_dequant": None,
    # the math SDPA's grouped-query expansion (attention.cpp pre_process_group_query_attention_input):
    # CompositeImplicit (unsqueeze, expand, clone, view), so derivatives.yaml has no entry; differentiable,
    # saves nothing, its backward sums the gradient over the repeats (a new tensor)
    "repeat_interleave.self_int": {"d": ["self"], "s": [], "p": [0]},
    # Tensor.copy_: implemented by hand (torch/csrc/autograd/VariableTypeManual.cpp), so derivatives.yaml has no
    # entry; its node CopyBackwards (autograd/functions/tensor.cpp) saves nothing, gives ``self`` zeros_like(grad)
    # and ``src`` grad.to(src's options) (the incoming gradient itself when the dtype agrees)
    "copy_": {"d": ["self", "src"], "s": [], "p": [0, 1], "inplace": 1},
    # a custom torch.autograd.Function, recorded at its boundary (fitplan-torch learn/record.py): its node saves
    # what ctx.save_for_backward kept (the op's ``fsv``), its backward gives each input a gradient; the ops of
    # its forward ran with grad mode off and make no node (``ng``)
    "autograd.Function": {"d": ["inputs*"], "s": [], "p": []},
}


def _p(inst, extra: dict[str, Any]) -> float:
    field = extra.get("pf")
    if field:
        v = inst.env.get(field)
        return float(v or 0.0)
    return float((extra.get("sc") or {}).get("p", 0.0))


def dropout_tensor(inst, x, p: float, label: str = "dropout"):
    """``F.dropout(x, p, training=True)`` on the scenario's device; returns the output tensor."""
    b = inst.b
    tr = b.tr
    if p <= 0 or x is None:
        return x
    out = tr.new(x.numel, x.dtype, False, label)
    out.shape = getattr(x, "shape", None)
    if b.spec.device == "cuda":
        mask = tr.new(x.numel, "bool", False, label + ".mask")
        b.emit("native_dropout", [("input", x)], [out, mask], label=label)
        return out
    noise = tr.new(x.numel, x.dtype, False, label + ".noise")
    b.emit("empty_like", [("self", x)], [noise], label=label + ".noise")
    n2 = tr.view(noise)
    b.emit("bernoulli_.float", [("self", noise)], [n2], label=label + ".bernoulli")
    n3 = tr.view(n2)
    b.emit("div_.Scalar", [("self", n2)], [n3], label=label + ".div")
    b.emit("mul.Tensor", [("self", x), ("other", n3)], [out], label=label)
    return out


def dropout(inst, ins, out_refs: list[str], extra: dict[str, Any]) -> None:
    x = dict(ins).get("input")
    out = dropout_tensor(inst, x, _p(inst, extra), extra.get("label", "dropout"))
    inst.refs[out_refs[0]] = out


def _cast(inst, x, dtype: str, label: str):
    if x is None or x.dtype == dtype or x.dtype not in ("f32", "bf16", "f16"):
        return x
    b = inst.b
    out = b.tr.new(x.numel, dtype, False, label)
    out.shape = getattr(x, "shape", None)
    b.emit("_to_copy", [("self", x)], [out], label=label)
    return out


def sdpa(inst, ins, out_refs: list[str], extra: dict[str, Any]) -> None:
    b = inst.b
    tr = b.tr
    named = dict(ins)
    q, k, v, mask = named.get("query"), named.get("key"), named.get("value"), named.get("attn_mask")
    given = (q, k, v, mask)
    p = _p(inst, extra)
    if b.mixed:
        q, k, v = (_cast(inst, t, b.compute, "sdpa.autocast") for t in (q, k, v))
    mask = _float_mask(inst, mask, q)
    # autocast's casts and the converted mask are locals of the calls around the kernel (autocast_mode.cpp's
    # wrapper, attention.cpp ``scaled_dot_product_attention``): alive until the math path returns
    made = [t for t in (q, k, v, mask) if t is not None and t not in given]
    out = inst.new_tensor(inst.seg["t"][int(out_refs[0][1:])])
    out.dtype = q.dtype
    inst.refs[out_refs[0]] = out
    shape = getattr(q, "shape", None) or (1, 1, q.numel, 1)
    d = shape[-1]
    rows = q.numel // d  # b * heads * s
    s = shape[-2]
    args = [("query", q), ("key", k), ("value", v)] + ([("attn_mask", mask)] if mask is not None else [])
    same_dims = getattr(k, "shape", (d,))[-1] == d and getattr(v, "shape", (d,))[-1] == d
    same_heads, gqa_ok = _heads(q, k, v, bool((extra.get("sc") or {}).get("enable_gqa")))
    if b.spec.device == "cpu":
        # torch 2.13 sdp_utils_cpp.cpp use_flash_attention_cpp: no dropout (check_for_dropout), one head dim
        # (check_head_dim_size_cpp), one head count unless enable_gqa asks for grouped-query attention
        # (check_batch_size_and_num_heads_dense<true>), else the math path
        if p <= 0 and same_dims and (same_heads or gqa_ok):
            lse = tr.new(rows, "f32", False, "sdpa.logsumexp")
            b.emit("_scaled_dot_product_flash_attention_for_cpu", args, [out, lse], label="sdpa")
            return
        _math(inst, q, k, v, mask, out, p, s, gqa_ok)
        tr.touch(*made)
        return
    # cuda/sdp_utils.cpp: flash (check_for_attn_mask, 16-bit, head dim <= 256) accepts grouped-query attention
    # when enable_gqa asks for it (check_batch_size_and_num_heads_dense<true>); memory-efficient attention
    # needs one head count (<false>); else the math path
    if q.dtype in HALF and mask is None and same_dims and d <= 256 and (same_heads or gqa_ok):
        lse = tr.new(rows, "f32", False, "sdpa.logsumexp")
        seed = tr.new(2 if p > 0 else 0, "i64", False, "sdpa.rng_state")
        b.emit("_scaled_dot_product_flash_attention", [("query", q), ("key", k), ("value", v)], [out, lse, seed],
               label="sdpa.flash")
        return
    if same_heads:
        lse = tr.new(rows // s * (-(-s // 32) * 32), "f32", False, "sdpa.logsumexp")
        seed = tr.new(2 if p > 0 else 0, "i64", False, "sdpa.rng_state")
        mask = _aligned_bias(inst, mask)
        eargs = [("query", q), ("key", k), ("value", v)] + ([("attn_bias", mask)] if mask is not None else [])
        b.emit("_scaled_dot_product_efficient_attention", eargs, [out, lse, seed], label="sdpa.efficient")
        return
    _math(inst, q, k, v, mask, out, p, s, gqa_ok)
    tr.touch(*made)


def _heads(q, k, v, enable_gqa: bool) -> tuple[bool, bool]:
    """(q, k and v have one head count; grouped-query attention as ``check_grouped_query_attention`` accepts it:
    enable_gqa, k and v of one head count dividing q's). Heads are dimension -3 of the 4-D inputs; without
    shapes, a k of q's size per head dimension is taken for one head count."""
    shapes = [getattr(t, "shape", None) for t in (q, k, v)]
    if all(sh is not None and len(sh) >= 4 for sh in shapes):
        hq, hk, hv = (sh[-3] for sh in shapes)
    else:
        hq = q.numel // (shapes[0][-1] if shapes[0] else 1)
        hk = k.numel // (shapes[1][-1] if shapes[1] else 1)
        hv = hk
    same = hq == hk == hv
    return same, bool(enable_gqa and not same and hk == hv and hk and hq % hk == 0)


def _float_mask(inst, mask, q):
    """The mask every SDPA backend receives (torch 2.13 ``attention.cpp`` ``scaled_dot_product_attention``: each
    case calls ``convert_boolean_attn_mask(attn_mask_, query_.dtype())``): a boolean mask becomes, at every call,
    ``at::where(mask, 0, -inf)`` in q's dtype, a new tensor of the mask's (broadcast) shape, which the kernel
    saves: one per attention layer, not the shared boolean mask. Under ``torch.autocast`` a float mask is cast
    with q, k, v (``autocast_mode.cpp`` lower-precision list: every floating tensor argument). Measured on the
    CPU with ``TorchDispatchMode`` (``where.self`` then ``_scaled_dot_product_flash_attention_for_cpu``)."""
    if mask is None:
        return None
    b = inst.b
    if mask.dtype != "bool":
        return _cast(inst, mask, b.compute, "sdpa.autocast_mask") if b.mixed else mask
    shape = getattr(mask, "shape", None)
    fm = b.tr.new(math.prod(shape) if shape else mask.numel, q.dtype, False, "sdpa.mask")
    fm.shape = shape
    b.emit("where.self", [("condition", mask)], [fm], label="sdpa.mask")
    return fm


def _aligned_bias(inst, mask):
    """Memory-efficient attention's bias (``attention.cpp`` ``preprocess_mask``): when a stride or the last
    dimension is not a multiple of 8 (``aligned_tensor<8>``; a contiguous mask: the key length), ``pad_bias``
    pads the last dimension to the next multiple of 8 (a new tensor, the one saved) and slices it back; the
    expansion to (b, heads, s, s_k) is a view."""
    shape = getattr(mask, "shape", None) if mask is not None else None
    if not shape or shape[-1] % 8 == 0:
        return mask
    width = shape[-1] + 8 - shape[-1] % 8
    padded = inst.b.tr.new(math.prod(shape[:-1]) * width, mask.dtype, False, "sdpa.mask_padded")
    padded.shape = (*shape[:-1], width)
    inst.b.emit("constant_pad_nd", [("self", mask)], [padded], label="sdpa.mask_pad")
    view = inst.b.tr.view(padded)
    view.shape = shape
    return view


def _math(inst, q, k, v, mask, out, p: float, s: int, gqa: bool = False) -> None:
    """``_scaled_dot_product_attention_math`` (attention.cpp): q, k, v upcast to fp32 when 16-bit, a
    materialised causal mask, the scores, ``_safe_softmax``, dropout, the product with v, the cast back.
    k and v with fewer heads than q are repeated to every head with ``enable_gqa``
    (``pre_process_group_query_attention_input``); without it (one k/v head) ``at::matmul`` broadcasts them:
    ``expand`` then ``reshape`` to (b * heads, ...), a view when the batch is 1, else a copy. The function
    returns ``(out.to(dtype), attn.to(dtype))``: for 16-bit inputs the attention weights' 16-bit copy is made
    before the product with v and dropped when the call returns, with the function's other locals: the fp32
    copies of q and k and the materialised mask stay alive until then (measured under the torch profiler's
    allocator events, torch 2.13: freed after the output's cast). The mask is added in place (``attn.add_``);
    under a ``TorchDispatchMode`` (the referee's counter) ``areAnyTensorSubclassLike`` is true and the function
    takes its out-of-place branch instead (docs/accuracy.md)."""
    b = inst.b
    tr = b.tr
    orig = q.dtype
    acc = "f32" if orig in HALF else orig
    qm, km, vm = (_cast(inst, t, acc, "sdpa.math_acc") for t in (q, k, v))
    v_acc = vm
    d = getattr(q, "shape", (1,))[-1] or 1
    heads_rows = q.numel // d
    n_scores = heads_rows * s
    qs = tr.new(qm.numel, acc, False, "sdpa.math_q_scaled")
    b.emit("mul.Tensor", [("self", qm)], [qs], label="sdpa.math_scale_q")
    v_full = heads_rows * (getattr(v, "shape", (1,))[-1] or 1)
    batch = (getattr(q, "shape", None) or (1,))[0]
    if km.numel != qm.numel and gqa:  # grouped-query attention: repeat_interleave k and v to every head
        k2 = tr.new(qm.numel, acc, False, "sdpa.math_repeat_k")
        b.emit("repeat_interleave.self_int", [("self", km)], [k2], label="sdpa.math_repeat_k")
        v2 = tr.new(v_full, acc, False, "sdpa.math_repeat_v")
        b.emit("repeat_interleave.self_int", [("self", vm)], [v2], label="sdpa.math_repeat_v")
        km, vm = k2, v2
    ks = tr.new(km.numel, acc, False, "sdpa.math_k_scaled")
    b.emit("mul.Tensor", [("self", km)], [ks], label="sdpa.math_scale_k")
    if ks.numel != qm.numel:  # broadcast by at::matmul
        ks = _broadcast(inst, ks, qm.numel, batch, "sdpa.math_expand_k")
        vm = _broadcast(inst, vm, v_full, batch, "sdpa.math_expand_v")
    scores = tr.new(n_scores, acc, False, "sdpa.math_scores")
    b.emit("bmm", [("self", qs), ("mat2", ks)], [scores], label="sdpa.math_qk")
    cmask = mask
    if mask is None:
        cmask = tr.new(s * s, acc, False, "sdpa.math_causal_mask")
        b.emit("full", [], [cmask], label="sdpa.math_causal_mask")
    s2 = tr.view(scores)
    b.emit("add_.Tensor", [("self", scores), ("other", cmask)], [s2], label="sdpa.math_mask")
    probs = tr.new(n_scores, acc, False, "sdpa.math_softmax")
    b.emit("_safe_softmax", [("self", s2)], [probs], label="sdpa.math_softmax")
    dropped = dropout_tensor(inst, probs, p, "sdpa.math_dropout")
    weights = _cast(inst, dropped, orig, "sdpa.math_weights_cast")
    copied = vm is v_acc and _slice_of_heads(tr, v)
    if copied:
        # ``at::matmul`` reshapes v to (b * heads, s, d): a head-transposed slice of a fused projection cannot be
        # viewed so, and the copy is what bmm saves (LinearAlgebra.cpp _matmul_impl), not the projection. Its
        # fp32 copy (``value.to(kFloat)``) keeps the heads transposed (``empty_like`` with ``preserve_format``
        # infers dense strides in the input's order: TensorFactories.cpp), so a 16-bit v is copied again
        vm = tr.new(v.numel, acc, False, "sdpa.math_v_copy")
        b.emit("clone", [("self", v_acc)], [vm], label="sdpa.math_v_copy")
    o = tr.new(out.numel, acc, False, "sdpa.math_out")
    b.emit("bmm", [("self", dropped), ("mat2", vm)], [o], label="sdpa.math_pv")
    if acc != orig:
        b.emit("_to_copy", [("self", o)], [out], label="sdpa.math_out_cast")
    else:
        b.emit("clone", [("self", o)], [out], label="sdpa.math_out_copy")
    # the C++ locals (the fp32 copies of q and k, of v when copied again, the causal mask, the 16-bit weights) live
    # until the call returns
    tr.touch(*(t for t in (qm, km, v_acc if copied else None, weights, cmask)
               if t is not None and t not in (q, k, v, dropped, mask)))


def _broadcast(inst, t, numel: int, batch: int, label: str):
    """``t.expand(...).reshape(b * heads, ...)`` in ``at::matmul``: a view of ``t`` when the batch is 1, else a
    contiguous copy of ``numel`` elements."""
    if batch <= 1 or t.numel == numel:
        return t
    c = inst.b.tr.new(numel, t.dtype, False, label)
    inst.b.emit("clone", [("self", t)], [c], label=label)
    return c


def _slice_of_heads(tr, v) -> bool:
    """v (b, heads, s, d) is a head-transposed view into a larger storage (q, k, v split from one fused
    projection): not viewable as (b * heads, s, d) unless b or heads is 1."""
    shape = getattr(v, "shape", None)
    own = -(-v.nbytes // tr.spec.block) * tr.spec.block if tr.rounding else v.nbytes
    return (v.sid >= 0 and tr.size[v.sid] > own and shape is not None and len(shape) == 4
            and shape[0] > 1 and shape[1] > 1)


# --------------------------------------------------------------------------- Linear call sites


def _linear(inst, x, w, rows: int, in_f: int, out_f: int, rank: int, label: str):
    """``F.linear(x, w)`` without bias as aten runs it: ``t(w)``, then ``mm`` (a 3-D contiguous input is
    viewed as (rows, in) first and the result viewed back); under autocast the weight is cast once per
    forward (a leaf that requires grad: cached) and the input per call."""
    b = inst.b
    tr = b.tr
    if b.mixed:
        w = _autocast_weight(inst, w, label)
        x = _cast(inst, x, b.compute, label + ".input_cast")
    wt = tr.view(w)
    wt.param = False
    b.emit("t", [("self", w)], [wt], label=label + ".t")
    if rank >= 3:
        xv = tr.view(x)
        b.emit("view", [("self", x)], [xv], label=label + ".view")
    else:
        xv = x
    dtype = x.dtype if x.dtype == w.dtype else ("f32" if "f32" in (x.dtype, w.dtype) else x.dtype)
    o = tr.new(rows * out_f, dtype, False, label)
    b.emit("mm", [("self", xv), ("mat2", wt)], [o], label=label)
    if rank >= 3:
        o3 = tr.view(o)
        b.emit("_unsafe_view", [("self", o)], [o3], label=label + ".unview")
        o = o3
    return o


def _autocast_weight(inst, w, label: str):
    """Autocast's copy of weight ``w`` in the compute dtype: made once per forward for a leaf that requires grad
    (autocast's cache, kept until the forward ends), at every use otherwise."""
    b = inst.b
    tr = b.tr
    wc = b.ac_cache.get(w.key)
    if wc is None:
        prev = tr.kind_default
        tr.kind_default = "autocast"
        wc = tr.new(w.numel, b.compute, False, label + ".weight_copy")
        tr.kind_default = prev
        b.emit("_to_copy", [("self", w)], [wc], label=label + ".weight_cast")
        if w.rg:
            b.ac_cache[w.key] = wc
            tr.pinned.add(wc.sid)
    return wc


linear = _linear
"""``F.linear`` for a head emitted outside a recorded call site (trace/score_head.py)."""


def zero3_linear_input(inst, site: dict[str, Any]) -> None:
    """DeepSpeed ZeRO-3's ``F.linear`` (``LinearFunctionForZeroStage3``, runtime/zero/linear.py:100-105) saves the
    call site's input whenever its node exists, frozen weight or not: a save of the input recorded just before the
    site's ops, so that it is released after their backward. Conv1D (``torch.addmm``) and nn.Linear subclasses
    with their own forward (``custom``) do not call ``F.linear``."""
    if site.get("conv1d") or site.get("custom"):
        return
    x = inst.refs.get(site["input"]) or inst.ref(site["input"])
    if x is None or not x.rg:
        return
    inst.b.tr.emit(site["module"] + ".zero3_saved_input", [x], [], [x], [], [], True)


def lora_site(inst, site: dict[str, Any]) -> None:
    """After a Linear call site's last op: peft's adapter, when the site is targeted."""
    b = inst.b
    if not b.lora:
        return
    module = site["module"].replace("{i}", str(inst.layer)) if inst.layer is not None else site["module"]
    if not lora_site_matches(module, b.spec.lora_targets, b.af):
        return
    tr = b.tr
    x = inst.refs.get(site["input"]) or inst.ref(site["input"])
    base = inst.refs.get(site["output"]) or inst.ref(site["output"])
    in_f = int(compile_expr(site["in"])(inst.env))
    out_f = int(compile_expr(site["out"])(inst.env))
    rows = x.numel // in_f
    r = b.spec.lora_r
    label = module
    adapter = b.adapter
    A = tr.param(r * in_f, adapter, True)
    B = tr.param(out_f * r, adapter, True)
    A.name, B.name = module + ".lora_A", module + ".lora_B"
    xa = _cast(inst, x, b.adapter_input, label + ".lora_input_cast")
    xd = dropout_tensor(inst, xa, b.spec.lora_dropout, label + ".lora_dropout")
    if b.adapter_input != adapter:  # FSDP1: autocast casts the fp32 input back to the gathered adapter's dtype
        xd = _cast(inst, xd, adapter, label + ".lora_A.input_cast")
    xd = contiguous_input(inst, site, x, xd, label)  # the copy F.linear makes of a non-contiguous input
    a = _linear(inst, xd, A, rows, in_f, r, site.get("rank", 3), label + ".lora_A")
    bb = _linear(inst, a, B, rows, r, out_f, site.get("rank", 3), label + ".lora_B")
    result = _scaled_sum(inst, base, bb, label)
    if xa is not x:
        tr.touch(xa)  # peft's local ``x`` (the cast input) lives until the forward returns
    result.shape = getattr(base, "shape", None)
    _replace_output(inst, site, result)


def _scaled_sum(inst, base, bb, label: str):
    """peft's ``result + adapter_output * scaling``, cast back to the base output's dtype: the product (a new
    tensor in the adapter's dtype), the sum (type promotion: fp32 when either is) and the cast."""
    b, tr = inst.b, inst.b.tr
    sc = tr.new(bb.numel, bb.dtype, False, label + ".lora_scaling")
    b.emit("mul.Tensor", [("self", bb)], [sc], label=label + ".lora_scaling")
    dt = base.dtype if base.dtype == sc.dtype else ("f32" if "f32" in (base.dtype, sc.dtype) else base.dtype)
    summed = tr.new(base.numel, dt, False, label + ".lora_add")
    b.emit("add.Tensor", [("self", base), ("other", sc)], [summed], label=label + ".lora_add")
    return _cast(inst, summed, base.dtype, label + ".lora_result_cast")


def lora_embedding(inst, op: list[Any]) -> None:
    """After an ``embedding`` op of a targeted ``nn.Embedding``: peft 0.21's ``lora.Embedding.forward``
    (tuners/lora/layer.py): ``after_A = F.embedding(x, lora_embedding_A.T)`` (the transpose a view, the rows in
    the adapter's dtype), ``(after_A @ lora_embedding_B.T) * scaling`` (``F.linear``'s aten ops), added to the
    base output and cast back to its dtype (no input cast, unlike ``lora.Linear``)."""
    b = inst.b
    args = dict(op[1])
    if not b.lora or not str(args.get("weight", "")).startswith("p:"):
        return
    module = args["weight"][2:].rsplit(".", 1)[0]
    if not embedding_matches(module, b.spec.lora_targets):
        return
    tr = b.tr
    idx, weight, base = inst.ref(args["indices"]), inst.ref(args["weight"]), inst.refs[op[2][0]]
    rows = idx.numel
    dim = base.numel // rows
    num, r, adapter = weight.numel // dim, b.spec.lora_r, b.adapter
    A, B = tr.param(r * num, adapter, True), tr.param(dim * r, adapter, True)
    A.name, B.name = module + ".lora_embedding_A", module + ".lora_embedding_B"
    At = tr.view(A)
    At.param = False
    b.emit("t", [("self", A)], [At], label=module + ".lora_embedding_A.t")
    after = tr.new(rows * r, adapter, False, module + ".lora_embedding_A")
    b.emit("embedding", [("weight", At), ("indices", idx)], [after], label=module + ".lora_embedding_A")
    bb = _linear(inst, after, B, rows, r, dim, 3, module + ".lora_embedding_B")
    result = _scaled_sum(inst, base, bb, module)
    result.shape = getattr(base, "shape", None)
    inst.refs[op[2][0]] = result


def _replace_output(inst, site: dict[str, Any], t) -> None:
    """``t`` is the call site's output from here on. The recorded output may be a view (``_unsafe_view`` of
    the ``mm``); later views of it name that storage as their base, so the base is replaced too."""
    ref = site["output"]
    inst.refs[ref] = t
    if ref.startswith("t"):
        base = inst.seg["t"][int(ref[1:])][2]
        if isinstance(base, str) and base.startswith("t"):
            inst.refs[base] = t


def qlora_linear(inst, site: dict[str, Any]) -> None:
    """A QLoRA base layer in place of the recorded Linear: bitsandbytes 0.50.2 ``Linear4bit.forward``
    (nn/modules.py:609-638) casts the input to ``bnb_4bit_compute_dtype``, dequantizes the weight to it,
    runs ``matmul_4bit`` and returns the result in the input's dtype. 8-bit: :mod:`.int8`."""
    b = inst.b
    tr = b.tr
    x = inst.refs.get(site["input"]) or inst.ref(site["input"])
    in_f = int(compile_expr(site["in"])(inst.env))
    out_f = int(compile_expr(site["out"])(inst.env))
    if b.spec.quant_bits == 8:
        return int8_linear(inst, site, x, in_f, out_f, _replace_output)
    rows = x.numel // in_f
    xin = _cast(inst, x, b.quant, site["module"] + ".input_cast")
    deq = tr.new(in_f * out_f, b.quant, False, site["module"] + ".dequantized")
    b.emit("bnb.dequantize_4bit", [], [deq], label=site["module"] + ".dequantize")
    if site["output"].startswith("t"):  # the recorded output's shape; a fresh tensor (matmul_4bit's result),
        entry = inst.seg["t"][int(site["output"][1:])]  # not the view of the skipped mm it was recorded as
        out = inst.new_tensor([entry[0], entry[1], None], site["module"], b.quant)
    else:
        out = tr.new(rows * out_f, b.quant, False, site["module"])
    b.emit("bnb.matmul_4bit", [("A", xin), ("B", deq)], [out], label=site["module"],
           extra={"bt": str(in_f * out_f * BYTES[b.quant])})
    out = _cast(inst, out, x.dtype, site["module"] + ".output_cast")
    _replace_output(inst, site, out)


def param_lora(inst, name: str, template: str, mult: int):
    """peft 0.21's ``lora.ParamWrapper`` (LoRA on a parameter: MoE experts stored as 3-D tensors, a router
    weight), active for the owning module's forward through ``nn.utils.parametrize``: for a stack of E > 1
    experts, ``_LoraFactorsProxy``: ``baddbmm(W, B, A, alpha=scaling)`` on A reshaped to (E, r, in) and B to
    (E, out, r) (cast to the parameter's dtype), a new tensor of the whole stack; for a 2-D weight and for a
    stack of one expert (``ParamWrapper._activate_lora`` takes the factors only when ``num_experts > 1``),
    ``_LoraParameterProxy``: ``W + (B @ A) * scaling``, its delta (``get_delta_weight``, cast to the parameter's
    dtype) kept by the proxy until the owning module returns. The adapters are fp32 and trainable. Returns the
    parametrized weight and the tensors the proxy keeps (peft/tuners/lora/layer.py)."""
    b = inst.b
    tr = b.tr
    w = b.param(name, template)
    entry = b.af.param_entry(template, inst.env)
    env = inst.env
    shape = tuple(int(compile_expr(d)(env)) for d in entry[1]) if entry else (w.numel,)
    r = b.spec.lora_r * mult
    held: list[Any] = []
    if len(shape) >= 3 and shape[0] > 1:
        e, out_f, in_f = shape[0], shape[-2], shape[-1]
        A = tr.param(r * e * in_f, "f32", True)
        B = tr.param(out_f * r * e, "f32", True)
        lhs = tr.view(B)
        lhs.param = False
        b.emit("view", [("self", B)], [lhs], label=name + ".lora_B_view")
        rhs = tr.view(A)
        rhs.param = False
        b.emit("view", [("self", A)], [rhs], label=name + ".lora_A_view")
        lhs = _cast(inst, lhs, w.dtype, name + ".lora_B_cast")
        rhs = _cast(inst, rhs, w.dtype, name + ".lora_A_cast")
        out = tr.new(w.numel, w.dtype, False, name + ".lora_weight")
        b.emit("baddbmm", [("self", w), ("batch1", lhs), ("batch2", rhs)], [out], label=name + ".lora_baddbmm")
    else:
        # (E=1, in, out) as peft reads a stack (``ParamWrapper._get_in_out_features``), (out, in) a 2-D weight
        in_f, out_f = (shape[1], shape[2]) if len(shape) >= 3 else (shape[-1], shape[0])
        A = tr.param(r * in_f, "f32", True)
        B = tr.param(out_f * r, "f32", True)
        dt = "f32"
        if b.mixed:  # get_delta_weight runs inside the model's forward: autocast casts the factors for the mm
            B = _autocast_weight(inst, B, name + ".lora_B")  # mm's arguments in order: B @ A
            A, dt = _autocast_weight(inst, A, name + ".lora_A"), b.compute
        d = tr.new(out_f * in_f, dt, False, name + ".lora_delta")
        b.emit("mm", [("self", B), ("mat2", A)], [d], label=name + ".lora_delta")
        sc = tr.new(d.numel, dt, False, name + ".lora_scaling")
        b.emit("mul.Tensor", [("self", d)], [sc], label=name + ".lora_scaling")
        sc = _cast(inst, sc, w.dtype, name + ".lora_delta_cast")
        out = tr.new(w.numel, w.dtype, False, name + ".lora_weight")
        b.emit("add.Tensor", [("self", w), ("other", sc)], [out], label=name + ".lora_add")
        held.append(sc)
    out.shape = shape
    return out, held
