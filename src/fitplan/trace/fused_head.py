"""TRL 1.16's fused LM head in the step trace (no torch).

``DPOTrainer`` patches the policy (and its reference model) with ``add_fused_lm_head``
(trl/trainer/utils.py): called with ``fused_lm_head=True``, the model's forward runs the backbone, drops the
last position (``last_hidden_state[:, :-1]``) and the first label, and hands the hidden states to
``ChunkedLogProbFunction`` (trl/kernels/chunked_logprob.py), which returns per-token log-probabilities
without materialising the ``(b, s, V)`` logits:

* the hidden states as ``(N, h)``, ``N = b·(s-1)``: on CUDA with Triton the labelled rows only
  (``hidden_states[mask]``, a copy), elsewhere every row (``reshape``, a copy of the strided slice). fitplan
  takes every row on both: on CUDA that is the bound when every token is labelled;
* forward: seven fp32 accumulators of ``N`` (``running_max`` ... ``target_logit``) and one buffer
  ``mm_buf`` of ``min(N, 4096) × 32768`` in the compute dtype (``TOKEN_CHUNK_SIZE``, and
  ``_CHUNKED_LOGPROB_CHUNK_SIZE`` in utils.py: the buffer has this width whatever the vocabulary), filled
  tile by tile by ``torch.mm`` (n rows × c = min(32768, V) columns) and folded: by a Triton kernel on CUDA (no
  tensors), by ``_forward_tile`` in torch elsewhere, whose live fp32 tile-sized tensors peak at three
  (``z``, ``z - max``, ``exp``; with ``entropy`` the product ``e * z``) plus the bool ``before_target`` mask
  when ``is_top1`` is asked for: ``13·n·c`` bytes, ``12·n·c`` for log-probabilities alone (the reference
  model's head: ``outputs=("log_probs",)``);
* saved for backward: the ``(N, h)`` hidden copy, the weight, the int64 targets (``labels.clamp(min=0)``),
  ``log_z`` and the entropy (fp32 ``N``);
* backward: fp32 ``grad_hidden`` (``N × h``) and, when the LM head trains, fp32 ``grad_weight`` (``V × h``),
  a second ``mm_buf``, and per tile ``_backward_tile``'s fp32 tensors (``y``, ``z``, ``log_p``, ``p``,
  ``grad``, the bool ``is_target``, then ``is_target.float() - p`` and its product with the incoming
  gradient): ``7·4·n·c + n·c`` bytes (CUDA: none). The gradients are returned cast to the hidden states' and
  weight's dtypes (no copy when those are fp32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitplan.trace import op_work
from fitplan.arch.archfile import BYTES

if TYPE_CHECKING:
    from fitplan.trace.learned_segment import Segment

TOKEN_CHUNK = 4096
"""``TOKEN_CHUNK_SIZE`` (trl/kernels/chunked_logprob.py): rows of the hidden states per tile."""
VOCAB_CHUNK = 32768
"""``_CHUNKED_LOGPROB_CHUNK_SIZE`` (trl/trainer/utils.py): columns of ``mm_buf`` and of each tile."""
ACCUMULATORS = 7
"""fp32 per-row statistics the forward allocates (``running_max`` ... ``target_logit``)."""
RULE = {"d": ["self", "weight"], "s": [], "p": [0, 0], "o": [1, 1, 0, 0, 0, 0, 0]}
"""``ChunkedLogProbFunction``: differentiable in the hidden states and the weight; its outputs: log-probs and
entropy differentiable, the rest not (``mark_non_differentiable``); saves given explicitly. (The outputs
after the log-probabilities are not differentiable when entropy is not asked for: every head that trains
asks for it.)"""
OUTPUTS = {"trl": ("log_probs", "entropy", "mean_logits", "is_top1"), "trl_kto": ("log_probs", "entropy", "mean_logits"),
           "trl_logp": ("log_probs",), "trl_grpo": ("log_probs", "entropy")}
"""The outputs each head asks for (``add_fused_lm_head(outputs=...)``): DPO's policy (dpo_trainer.py), KTO's
policy (kto_trainer.py), a separate reference model (the default, log-probabilities only), GRPO's and RLOO's
policy (grpo_trainer.py, rloo_trainer.py: ``outputs=("log_probs", "entropy")``)."""


def tile_sizes(rows: int, vocab: int) -> list[tuple[int, int]]:
    """The (rows, columns) of each tile: rows in steps of 4096, columns in steps of 32768."""
    out = []
    for r0 in range(0, rows, TOKEN_CHUNK):
        for c0 in range(0, vocab, VOCAB_CHUNK):
            out.append((min(TOKEN_CHUNK, rows - r0), min(VOCAB_CHUNK, vocab - c0)))
    return out


def forward_fold_bytes(rows: int, vocab: int, top1: bool, device: str) -> int:
    """The most ``_forward_tile`` holds at once over the tiles (module doc): ``13·n·c`` with top-1 (its bool
    ``before_target`` mask beside three fp32 tiles: the policy's head in DPO), ``12·n·c`` without (KTO's
    policy, a reference model's head); 0 on CUDA (Triton)."""
    if device == "cuda":
        return 0
    per = 13 if top1 else 12
    return max(per * n * c for n, c in tile_sizes(rows, vocab))


def backward_fold_bytes(rows: int, vocab: int, device: str) -> int:
    """The most ``_backward_tile`` holds at once: seven fp32 tiles and the bool ``is_target`` (``29·n·c``)."""
    if device == "cuda":
        return 0
    return max(29 * n * c for n, c in tile_sizes(rows, vocab))


def mm_buf_bytes(rows: int, compute: str) -> int:
    """``mm_buf``: ``min(N, 4096) × 32768`` elements of the compute dtype (whatever the vocabulary)."""
    return min(rows, TOKEN_CHUNK) * VOCAB_CHUNK * BYTES[compute]


def run(seg_inst: "Segment", site: dict[str, Any]):
    """Emit the fused head from the LM head's call site (``seg_inst.b.spec.loss``, :data:`OUTPUTS`)."""
    b = seg_inst.b
    tr = b.tr
    h = seg_inst.ref(site["input"])
    weight = seg_inst.ref("p:" + site["module"] + ".weight")
    hidden = h.numel // (b.spec.batch * b.spec.seq)
    rows = b.spec.batch * (b.spec.seq - 1)
    vocab = weight.numel // hidden
    compute = b.compute if b.mixed else h.dtype
    asked = OUTPUTS[b.spec.loss]
    sliced = tr.view(h, rows * hidden)
    sliced.base = h.base if h.base is not None else h
    b.emit("slice.Tensor", [("self", h)], [sliced])
    flat = tr.new(rows * hidden, h.dtype, False, "trl.hidden_rows")
    b.emit("clone", [("self", sliced)], [flat])
    prev = tr.kind_default
    tr.kind_default = "logits"
    made = {"log_probs": tr.new(rows, "f32", False, "trl.log_probs"), "entropy": tr.new(rows, "f32", False, "trl.entropy"),
            "mean_logits": tr.new(rows, "f32", False, "trl.mean_logits"),
            "is_top1": tr.new(rows, "bool", False, "trl.is_top1")}
    outs = [made[k] for k in ("log_probs", "entropy", "mean_logits", "is_top1") if k in asked]
    targets, log_z = tr.new(rows, "i64", False, "trl.targets"), tr.new(rows, "f32", False, "trl.log_z")
    fold = (mm_buf_bytes(rows, compute) + ACCUMULATORS * 4 * rows
            + forward_fold_bytes(rows, vocab, "is_top1" in asked, b.spec.device)
            + _cast_bytes(rows, hidden, h.dtype, compute))
    transient = tr.new(fold, "bool", False, "trl.fold")
    tr.kind_default = prev
    saved = [flat, targets, log_z] + ([made["entropy"]] if "entropy" in asked else [])
    b.emit("trl.chunked_logprob", [("self", flat), ("weight", weight)], [*outs, targets, log_z, transient],
           extra={"sv": saved})
    op = tr.ops[-1]
    if op.outs:
        op.bwd_temp = _backward_temp(rows, hidden, vocab, flat, weight, compute, b.spec.device)
    op.work = head_work(rows, hidden, vocab, compute, flat, weight, bool(op.outs))
    loss = tr.new(1, "f32", False, "trl.loss")
    b.emit("sum.dim_IntList", [("self", outs[0])], [loss])
    seg_inst.refs[seg_inst.seg["loss"]] = loss
    return loss


def head_work(rows: int, hidden: int, vocab: int, compute: str, flat, weight, backward: bool) -> op_work.Work:
    """The head's kernels: the forward's tiled logits GEMM (``N × h × V``; the fold's elementwise passes read
    the tiles); the backward recomputes every tile and runs the hidden states' and the weight's gradient GEMMs
    (those that require grad), accumulated in fp32."""
    mm = op_work.gemm(rows, hidden, vocab, compute, flat.nbytes, weight.nbytes, 0, input_grad=flat.rg,
                      weight_grad=weight.rg)
    return op_work.Work(mm.fwd, mm.fwd + mm.bwd if backward else ())


def _cast_bytes(rows: int, hidden: int, h_dtype: str, compute: str) -> int:
    """``hidden_chunk = hidden[...].to(compute)``, a local alive through the tiles, when the dtypes differ
    (autocast over fp32 weights). The weight chunk's cast is a temporary of the ``torch.mm`` call in the
    forward, freed before the fold."""
    return min(rows, TOKEN_CHUNK) * hidden * BYTES[compute] if h_dtype != compute else 0


def _backward_temp(rows: int, hidden: int, vocab: int, flat, weight, compute: str, device: str) -> int:
    """What the backward holds beyond the gradients fitplan's backward allocates (the hidden states' and, when
    trained, the weight's, in their dtypes): ``mm_buf``, and the larger of the tile fold's tensors and, on the
    CPU with a 16-bit compute dtype, ``_addmm_fp32``'s fp32 copies of a tile and a weight chunk. When a
    gradient's dtype is not fp32, its fp32 accumulator is alive throughout and the cast result only at the end,
    after the tiles: the peak is then the larger of the tiles' and the casts' instants. The hidden and weight
    chunks cast to the compute dtype (``hidden_chunk``, ``w_chunk``: locals) stay alive to the end."""
    buf = mm_buf_bytes(rows, compute)
    trained = weight.rg
    acc = (4 * rows * hidden if flat.dtype != "f32" else 0) + (4 * weight.numel if trained and weight.dtype != "f32" else 0)
    cast = (flat.nbytes if flat.dtype != "f32" else 0) + (weight.nbytes if trained and weight.dtype != "f32" else 0)
    n, c = min(rows, TOKEN_CHUNK), min(vocab, VOCAB_CHUNK)
    copies = 4 * n * c + 4 * c * hidden if compute != "f32" and device != "cuda" else 0
    chunks = _cast_bytes(rows, hidden, flat.dtype, compute) + (c * hidden * BYTES[compute] if weight.dtype != compute else 0)
    return buf + acc + chunks + max(backward_fold_bytes(rows, vocab, device), copies, cast) - cast
