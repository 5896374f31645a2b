"""Liger-Kernel's fused kernels as transformers' Trainer installs them (``use_liger_kernel``), in the step trace.

``TrainingArguments(use_liger_kernel=True)`` makes the Trainer call Liger's ``_apply_liger_kernel_to_instance`` on
the loaded model (transformers 5.24 trainer.py ``apply_liger_kernel``, integrations/liger.py). That looks the
``model_type`` up in ``MODEL_TYPE_TO_APPLY_LIGER_FN`` and runs ``apply_liger_kernel_to_<type>(model=...)`` with its
defaults (Liger-Kernel 0.8.2, ead96b61, src/liger_kernel/transformers/monkey_patch.py); a type it does not list is
left as it is (only a log line). For an existing instance only what the function patches on the instance, or
looks up at call time, changes: for Llama, Mistral, Ministral, Qwen2, Qwen3 and SmolLM3 (:func:`modelled_types`, the shared table ``liger.json``)

* the final norm and each layer's ``input_layernorm`` and ``post_attention_layernorm`` get
  ``LigerRMSNorm.forward`` (``_patch_rms_norm_module``: casting mode ``llama``, ``in_place=True``); Qwen3's
  ``q_norm`` / ``k_norm`` are not patched on an instance and keep the model's own ops;
* each layer's ``mlp`` gets ``LigerSwiGLUMLP.forward``: ``down_proj(LigerSiLUMulFunction(gate_proj(x), up_proj(x)))``;
* the modeling module's ``apply_rotary_pos_emb`` becomes ``liger_rotary_pos_emb`` (a global the attention reads
  at call time);
* the model's ``forward`` becomes the fused linear cross-entropy one, which runs when the model is given the labels
  (the Trainer's loss: the loss head ``liger``, :mod:`.loss_heads`; TrainingArguments' ``use_liger_kernel`` sets
  both). A script that computes its loss from the logits itself (NeMo AutoModel's ``MaskedCrossEntropy``) keeps
  its own loss head (``loss_implementation``) beside the other kernels.

What each kernel allocates, saves and moves (src/liger_kernel/ops/, the same commit):

* **RMSNorm** (rms_norm.py ``LigerRMSNormFunction``): the forward allocates ``Y`` (the input's dtype and shape)
  and ``RSTD`` (fp32, one per row) and saves ``X``, ``W``, ``RSTD``; one kernel reads ``X`` and ``W`` and writes
  ``Y`` and ``RSTD``. The backward (``rms_norm_backward``, ``in_place=True``) writes ``dX`` into ``dY``'s storage
  (the incoming gradient passes on, no new tensor) and the weight's partial sums into ``_dW`` (fp32,
  ``sm_count × h``), which ``_dW.sum(0).to(W.dtype)`` reduces (two more kernels; the cast only when ``W`` is not
  fp32); it does so whether ``W`` trains or not (a frozen norm under LoRA too).
* **SwiGLU** (swiglu.py ``LigerSiLUMulFunction``): the forward allocates ``c`` (``empty_like(a)``) and saves the
  gate and up projections ``a``, ``b``; one kernel reads both and writes ``c`` (``silu(a)`` is never stored). The
  backward recomputes ``silu(a)`` and writes ``da`` and ``db`` into ``a``'s and ``b``'s own storage (one kernel
  reading ``dc``, ``a``, ``b``): no new gradient tensor.
* **RoPE** (rope.py ``LigerRopeFunction``): ``q`` and ``k`` (``(b, heads, s, d)`` views of the projections'
  ``(b, s, heads, d)`` outputs, contiguous once transposed back) are rotated in place by one kernel that reads
  ``cos`` and ``sin``; it saves ``cos`` and ``sin`` only, and its backward rotates ``dq`` and ``dk`` in place
  (one kernel): the gradients pass on.

The replay finds each patched construct in the learned file's ops: an RMSNorm by its weight parameter and the
recorded ``_to_copy, pow, mean, add, rsqrt, mul, _to_copy, mul(weight)`` chain of the model's ``*RMSNorm`` (the
llama casting mode), the SwiGLU by its module's ``gate_proj`` / ``up_proj`` / ``down_proj`` call sites joined by
``silu`` and ``mul``, RoPE by ``q·cos + cat(-x₂, x₁)·sin`` on q and k; each becomes one fused op in place of the
recorded ones, whose intermediate tensors are then never made. A patched norm or MLP whose recorded ops do not
have that form is refused, naming it. The Triton kernels run on CUDA only: no referee measures them here
(tests/test_liger_kernels.py derives the bytes by hand from the rules above).
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from attrs import frozen

from fitplan.arch.archfile import BYTES, data_file
from fitplan.errors import FitplanError
from fitplan.trace import op_work

if TYPE_CHECKING:
    from fitplan.trace.learned_segment import Segment

SM_COUNT = 132
"""``torch.cuda.get_device_properties().multi_processor_count``, the rows of RMSNorm's fp32 ``_dW``: an H100 SXM's
(an A100 has 108); the trace does not know the GPU, and the difference is ``24·h·4`` bytes per norm backward."""


@frozen
class Patch:
    """What ``apply_liger_kernel_to_<type>(model=...)`` changes on an instance (module names as the learned file's
    parameters spell them, ``{i}`` the layer)."""

    norms: tuple[str, ...]
    mlp: str | None
    rope: bool


@functools.lru_cache(maxsize=1)
def _table() -> tuple[dict[str, Patch], frozenset[str]]:
    """The shared table ``liger.json`` (beside the bundled architectures, with its source): the model types Liger
    patches at all (``MODEL_TYPE_TO_APPLY_LIGER_FN``'s keys, monkey_patch.py) and, for those whose patch fitplan
    models, what ``apply_liger_kernel_to_<type>(model=...)`` changes on an instance. ``llama``, ``mistral``,
    ``ministral``, ``qwen2``, ``qwen3``, ``smollm3`` with their defaults (rope, rms_norm, swiglu,
    fused_linear_cross_entropy on; cross_entropy off) patch the same modules; Granite's, with the same modules,
    swaps the loss for Liger's unfused cross-entropy kernel (its logits are scaled), which is not modelled: refused."""
    path = data_file("liger.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        kinds = {k: Patch(tuple(v["norms"]), v["mlp"], bool(v["rope"])) for k, v in data["patches"].items()}
        return {t: kinds[k] for t, k in data["modelled"].items()}, frozenset(data["patched_types"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FitplanError(f"cannot read Liger's patch table: {e}", file=str(path)) from None


def modelled_types() -> dict[str, Patch]:
    """Model type -> the patch fitplan models for it (:func:`_table`)."""
    return _table()[0]


def patched_types() -> frozenset[str]:
    """The model types Liger patches at all (:func:`_table`)."""
    return _table()[1]


RULES = {
    # LigerRMSNormFunction: differentiable in X and W; dX is written into dY (passes); saves X, RSTD (``sv``)
    "liger.rms_norm": {"d": ["X", "W"], "s": [], "p": [1, 0], "o": [1, 0]},
    # LigerSiLUMulFunction: saves a and b (``sv``); its gradients overwrite them (``bwd_temp``)
    "liger.swiglu": {"d": ["a", "b"], "s": [], "p": [0, 0], "o": [1]},
    # LigerRopeFunction: q and k rotated in place, their gradients too; saves cos and sin (``sv``)
    "liger.rope": {"d": ["q", "k"], "s": [], "p": [1, 1], "o": [1, 1]},
}


def patch_for(model_type: str) -> Patch | None:
    """What ``use_liger_kernel`` changes for ``model_type`` (None: Liger does not patch it).

    :raises FitplanError: a type Liger patches whose patch fitplan does not model."""
    if model_type not in patched_types():
        return None
    patch = modelled_types().get(model_type)
    if patch is None:
        raise FitplanError(f"use_liger_kernel on model_type {model_type!r}: Liger's apply_liger_kernel_to_{model_type} "
                           "patches kernels fitplan does not model for this type", field="liger_kernel", value=True,
                           suggestion="modelled for " + ", ".join(sorted(modelled_types())) + "; estimate without liger_kernel "
                           "(the model's own ops) or with loss_implementation = \"liger\" alone")
    return patch


def unpatched_loss(model_type: str, loss: str) -> str:
    """The loss head when ``use_liger_kernel`` meets a type Liger does not patch: Liger changes nothing, its fused
    linear cross-entropy included (it comes with the type's patch), so ``liger`` is the model's own loss (``hf``)."""
    return "hf" if loss == "liger" and model_type not in patched_types() else loss


# --------------------------------------------------------------------------- finding the patched constructs


def plan(seg: dict[str, Any], patch: Patch, where: str) -> dict[int, tuple]:
    """Op index -> what replaces it: ``("skip",)`` (an op of a fused construct) or ``(kind, refs)``, the fused op,
    at the construct's last op."""
    ops = seg.get("ops", ())
    writer, readers = {}, {}
    for k, op in enumerate(ops):
        for r in op[2]:
            writer.setdefault(r, k)
        for _, v in _args(op):
            for r in v if isinstance(v, list) else [v]:
                if isinstance(r, str):
                    readers.setdefault(r, set()).add(k)
    out: dict[int, tuple] = {}
    for k, op in enumerate(ops):
        if op[0] == "mul.Tensor":
            weight = next((v for _, v in _args(op) if isinstance(v, str) and v.startswith("p:")), None)
            if weight is not None and weight[2:].removesuffix(".weight") in patch.norms:
                _place(out, _rms_norm_region(ops, k, weight, writer, readers, where), seg)
    if patch.mlp is not None:
        sites = {s["module"]: s for s in seg.get("sites", ())}
        if patch.mlp + ".down_proj" in sites:
            _place(out, _swiglu_region(ops, sites, patch.mlp, writer, readers, where), seg)
    if patch.rope:
        found = [r for k, op in enumerate(ops) if op[0] == "add.Tensor"
                 for r in [_rope_region(ops, k, writer, readers)] if r is not None]
        for q, kk in zip(found[::2], found[1::2]):
            region = q[0] | kk[0]
            _place(out, (region, max(region), ("rope", {"q": q[1], "k": kk[1], "cos": q[2], "sin": q[3],
                                                         "q_out": q[4], "k_out": kk[4]})), seg)
    return out


def _args(op) -> list[tuple[str, Any]]:
    a = op[1]
    return list(a.items()) if isinstance(a, dict) else list(a)


def _place(out: dict[int, tuple], found, seg) -> None:
    region, at, action = found
    for j in region:
        out[j] = ("skip",)
    out[at] = action


def _refuse(where: str, construct: str, why: str):
    from fitplan.errors import FitplanError

    return FitplanError(f"use_liger_kernel: {construct} in {where}: {why}, so Liger's kernel cannot be placed",
                        field="liger_kernel", value=True,
                        suggestion="estimate without liger_kernel, or re-learn the architecture")


def _private(region: set[int], produced: list[str], readers: dict[str, set[int]]) -> bool:
    """Every tensor ``produced`` inside the region is read only inside it."""
    return all(readers.get(r, set()) <= region for r in produced)


def _rms_norm_region(ops, k, weight, writer, readers, where):
    """The llama-mode RMSNorm chain ending at op ``k`` (``weight * hs.to(dtype)``); its two casts are recorded only
    where they copy (a 16-bit input), so either may be absent."""
    name = weight[2:].removesuffix(".weight")
    chain = (("_to_copy", True), ("mul.Tensor", False), ("rsqrt", False), ("add.Tensor", False), ("mean.dim", False),
             ("pow.Tensor_Scalar", False), ("_to_copy", True))
    cur = next((v for _, v in _args(ops[k]) if v != weight), None)
    region, produced, x0 = {k}, [], None
    for expect, optional in chain:
        j = writer.get(cur)
        if j is None or ops[j][0] != expect:
            if optional:
                continue
            raise _refuse(where, f"the RMSNorm {name}", "its recorded ops are not the llama-mode RMSNorm chain")
        region.add(j)
        produced.append(cur)
        args = dict(_args(ops[j]))
        if expect == "mul.Tensor":  # x_f32 * rsqrt(...): follow the rsqrt side, remember x_f32
            x0, cur = args.get("self"), args.get("other")
        else:
            cur = args.get("self")
    if x0 != cur and not (writer.get(x0) in region and ops[writer[x0]][0] == "_to_copy"):
        raise _refuse(where, f"the RMSNorm {name}", "what it normalises is not its input")
    if not _private(region, produced, readers):
        raise _refuse(where, f"the RMSNorm {name}", "an intermediate tensor is read outside the norm")
    return region - {k}, k, ("rms_norm", {"x": cur, "w": weight, "out": ops[k][2][0]})


def _swiglu_region(ops, sites, mlp, writer, readers, where):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` of module ``mlp``: the silu is dropped, the mul fused."""
    gate, up, down = (sites.get(f"{mlp}.{p}") for p in ("gate_proj", "up_proj", "down_proj"))
    if gate is None or up is None:
        raise _refuse(where, f"the MLP {mlp}", "it has no gate_proj and up_proj call sites")
    m = writer.get(down["input"])
    if m is None or ops[m][0] != "mul.Tensor":
        raise _refuse(where, f"the MLP {mlp}", "down_proj's input is not a product")
    pair = [v for _, v in _args(ops[m])]
    act = next((v for v in pair if writer.get(v) is not None and ops[writer[v]][0] == "silu"), None)
    if act is None or up["output"] not in pair or dict(_args(ops[writer[act]])).get("self") != gate["output"]:
        raise _refuse(where, f"the MLP {mlp}", "its recorded ops are not silu(gate_proj(x)) * up_proj(x)")
    s = writer[act]
    if not _private({s, m}, [act], readers):
        raise _refuse(where, f"the MLP {mlp}", "the activation is read outside the product")
    return {s}, m, ("swiglu", {"a": gate["output"], "b": up["output"], "out": ops[m][2][0]})


def _rope_region(ops, k, writer, readers):
    """``x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin`` ending at op ``k`` (transformers' ``rotate_half``), or
    None: (ops, x, cos, sin, output)."""
    a = dict(_args(ops[k]))
    m1, m2 = writer.get(a.get("self")), writer.get(a.get("other"))
    if m1 is None or m2 is None or ops[m1][0] != "mul.Tensor" or ops[m2][0] != "mul.Tensor":
        return None
    x, cos = dict(_args(ops[m1])).get("self"), dict(_args(ops[m1])).get("other")
    rot, sin = dict(_args(ops[m2])).get("self"), dict(_args(ops[m2])).get("other")
    c = writer.get(rot)
    if c is None or ops[c][0] != "cat":
        return None
    parts = dict(_args(ops[c])).get("tensors") or []
    if len(parts) != 2 or writer.get(parts[0]) is None or ops[writer[parts[0]]][0] != "neg":
        return None
    n = writer[parts[0]]
    s2, s1 = writer.get(dict(_args(ops[n])).get("self")), writer.get(parts[1])
    if any(j is None or ops[j][0] != "slice.Tensor" or dict(_args(ops[j])).get("self") != x for j in (s1, s2)):
        return None
    region = {k, m1, m2, c, n, s1, s2}
    produced = [a["self"], a["other"], rot, parts[0], parts[1], dict(_args(ops[n]))["self"]]
    if not _private(region, produced, readers):
        return None
    return region, x, cos, sin, ops[k][2][0]


# --------------------------------------------------------------------------- the fused ops


def run(seg_inst: "Segment", action: tuple) -> None:
    """Emit the fused op ``action`` (:func:`plan`) in place of the recorded construct."""
    if action[0] == "skip":
        return
    {"rms_norm": _rms_norm, "swiglu": _swiglu, "rope": _rope}[action[0]](seg_inst, action[1])


def _rms_norm(seg_inst: "Segment", refs: dict[str, str]) -> None:
    b, tr = seg_inst.b, seg_inst.b.tr
    x, w = seg_inst.ref(refs["x"]), seg_inst.ref(refs["w"])
    hidden = w.numel
    rows = x.numel // hidden
    y = tr.new(x.numel, x.dtype, False, "liger.rms_norm")
    y.shape = x.shape
    rstd = tr.new(rows, "f32", False, "liger.rms_norm.rstd")
    b.emit("liger.rms_norm", [("X", x), ("W", w)], [y, rstd], extra={"sv": [x, rstd]})
    op = tr.ops[-1]
    partial = SM_COUNT * hidden * 4
    if op.outs and y.rg:
        op.bwd_temp = b._rounded(partial) + b._rounded(4 * hidden)  # _dW and its fp32 sum
    op.work = rms_norm_work(x.nbytes, rows, hidden, w.dtype, backward=y.rg)
    seg_inst.refs[refs["out"]] = y


def rms_norm_work(x_bytes: int, rows: int, hidden: int, w_dtype: str, *, backward: bool) -> op_work.Work:
    """Liger's RMSNorm kernels (module doc): forward reads X and W, writes Y and the fp32 RSTD; backward reads dY, X,
    W and RSTD, writes dX and the fp32 partial sums ``_dW``, then sums them and casts the sum to W's dtype."""
    w_bytes = hidden * BYTES[w_dtype]
    fwd = (op_work.Kernel("elementwise", "", 0, 2 * x_bytes + w_bytes + 4 * rows),)
    if not backward:
        return op_work.Work(fwd)
    partial = SM_COUNT * hidden * 4
    bwd = [op_work.Kernel("elementwise", "", 0, 3 * x_bytes + w_bytes + 4 * rows + partial),
           op_work.Kernel("elementwise", "", 0, partial + 4 * hidden)]
    if w_dtype != "f32":
        bwd.append(op_work.Kernel("elementwise", "", 0, 4 * hidden + w_bytes))
    return op_work.Work(fwd, tuple(bwd))


def _swiglu(seg_inst: "Segment", refs: dict[str, str]) -> None:
    b, tr = seg_inst.b, seg_inst.b.tr
    a, up = seg_inst.ref(refs["a"]), seg_inst.ref(refs["b"])
    c = tr.new(a.numel, a.dtype, False, "liger.swiglu")
    c.shape = a.shape
    b.emit("liger.swiglu", [("a", a), ("b", up)], [c], extra={"sv": [a, up]})
    op = tr.ops[-1]
    if op.outs and c.rg:
        op.bwd_temp = -sum(t.nbytes for t in (a, up) if t.rg)  # da, db overwrite a, b: no new tensors
    op.work = swiglu_work(a.nbytes, backward=c.rg)
    seg_inst.refs[refs["out"]] = c


def swiglu_work(n_bytes: int, *, backward: bool) -> op_work.Work:
    """Liger's SwiGLU kernels: forward reads a and b, writes c; backward reads dc, a and b, writes da and db."""
    fwd = (op_work.Kernel("elementwise", "", 0, 3 * n_bytes),)
    return op_work.Work(fwd, (op_work.Kernel("elementwise", "", 0, 5 * n_bytes),) if backward else ())


def _rope(seg_inst: "Segment", refs: dict[str, str]) -> None:
    b, tr = seg_inst.b, seg_inst.b.tr
    q, k, cos, sin = (seg_inst.ref(refs[n]) for n in ("q", "k", "cos", "sin"))
    outs = []
    for t in (q, k):
        v = tr.view(t)
        v.base = t.base if t.base is not None else t
        outs.append(v)
    b.emit("liger.rope", [("q", q), ("k", k), ("cos", cos), ("sin", sin)], outs,
           extra={"sv": [cos, sin], "g": "pp"})
    tr.ops[-1].work = rope_work(q.nbytes + k.nbytes, cos.nbytes + sin.nbytes, backward=outs[0].rg or outs[1].rg)
    seg_inst.refs[refs["q_out"]], seg_inst.refs[refs["k_out"]] = outs


def rope_work(qk_bytes: int, table_bytes: int, *, backward: bool) -> op_work.Work:
    """Liger's RoPE kernel: reads q, k, cos and sin and writes q and k in place; the backward does the same on dq, dk."""
    kernel = (op_work.Kernel("elementwise", "", 0, 2 * qk_bytes + table_bytes),)
    return op_work.Work(kernel, kernel if backward else ())
