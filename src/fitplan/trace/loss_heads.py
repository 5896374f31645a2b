"""The loss head as the scenario's ``loss_implementation`` runs it, in the step trace (no torch).

A learned file records the model's own head: from the LM head's ``nn.Linear`` call site to the end of the
epilogue, transformers' ``ForCausalLMLoss`` (``loss/loss_utils.py``): the logits ``(b, s, V)`` in the compute
dtype, their fp32 copy (``.float()``), ``log_softmax`` (fp32, saved for backward) and ``nll_loss``. That is
``hf``, replayed as recorded. The other implementations replace the ops from the LM head's call site on:

* ``chunked``: torchtune's ``CEWithChunkedOutputLoss`` (torchtune/modules/loss/ce_chunked_output_loss.py,
  ``num_output_chunks = 8``) over a model whose output is a list of chunks (``TransformerDecoder`` with
  ``set_num_output_chunks``: ``[self.output(c) for c in h.tensor_split(8, dim=1)]``). Each chunk is a
  ``slice`` of the final hidden state (``tensor_split`` is CompositeImplicit: one ``SliceBackward`` per chunk,
  all made before the first LM head, so their backward runs after every head's; each allocates a zero gradient
  of the whole hidden state, summed out of place), its LM head output stays alive in the
  list until the loss returns, and ``compute_cross_entropy`` upcasts it (``.float()``) and runs
  ``F.cross_entropy(reduction="sum")``: eager ``log_softmax`` saves its fp32 output, so what the backward keeps
  is the fp32 log-probabilities of every chunk (4·b·s·V, as ``hf``); what chunking saves is the peak: one
  chunk's fp32 upcast and its gradients at a time instead of the whole. The recorded head is replayed once
  per chunk with ``s`` the chunk's length (so a model's own ops between the head and the loss, softcapping or
  scaling, run per chunk as well); the chunk losses are summed (``add``) and divided by the token count
  (``div``, which saves the 8-byte count).
* ``chunked_compiled``: the same head with ``compute_cross_entropy`` under ``torch.compile``, as torchtune's
  recipes run it with ``compile: True`` (recipes/lora_finetune_single_device.py: ``training.compile_loss``,
  which compiles ``compute_cross_entropy`` alone, ``CEWithChunkedOutputLoss.apply_compile_strategy``). AOTAutograd
  and Inductor make ``.float()`` + ``cross_entropy`` one graph per chunk: its forward keeps the 16-bit chunk itself
  (a graph input), the chunk's targets and two fp32 values per row (the row maximum and the log-sum-exp); the
  upcast and the log-probabilities are never stored. Its backward writes the 16-bit gradient of the chunk
  directly, beside one fp32 value per row. Measured on the CPU (torch 2.13 Inductor, tests/test_loss_heads.py:
  the saved tensors through ``saved_tensors_hooks``, the buffers from the generated code); the partition is
  Inductor's on CUDA as well. The targets are ``reshape`` copies of the ``(b, s/8)`` label chunks (b > 1).
* ``liger``: Liger-Kernel's ``LigerFusedLinearCrossEntropyFunction`` (src/liger_kernel/ops/
  fused_linear_cross_entropy.py @ 00eba634, ``fused_linear_cross_entropy_forward``), what transformers'
  ``use_liger_kernel`` installs for the loss (``LigerForCausalLMLoss``, transformers/model/loss_utils.py: labels
  padded by one and made contiguous, the hidden state viewed as ``(b·s, h)``). Its forward computes the
  gradients while it walks the tokens in chunks of :func:`liger_chunk_rows` rows: it allocates ``grad_input``
  (``zeros_like`` the hidden state), ``grad_weight`` (``zeros_like`` the LM head weight, its dtype, when the
  weight requires grad), ``loss_1d`` (fp32, one per token) and one chunk's logits (``chunk × V`` in the
  matmul's dtype, reused), and saves ``grad_input`` and ``grad_weight`` for the backward, which hands them on
  as the gradients (scaled in place): the logits never exist whole. The Triton kernels run on CUDA only, so
  no referee measures this; tests/test_loss_heads.py derives the bytes by hand.
* ``cce``: Apple's Cut Cross-Entropy (apple/ml-cross-entropy ``cut_cross_entropy/cce.py`` @ 3a798378,
  ``LinearCrossEntropyFunction``; ``cce_lse_forward.py``, ``cce_backward.py``), as ``cce_patch`` or axolotl's
  ``cut_cross_entropy`` install it: the forward computes only the fp32 log-sum-exp per token (``lse``) and,
  with the default ``filter_eps="auto"``, the fp32 logit average over the vocabulary (``logit_avg``), and saves
  them with the hidden state ``e`` (a view of it: the final norm's output stays alive, LoRA or not) and the
  classifier; the backward recomputes the logits blockwise and allocates ``zeros_like(e)`` and, when the LM head
  trains, ``zeros_like(c)`` (``accum_e_fp32``/``accum_c_fp32`` off by default), plus the argsort of
  ``logit_avg`` (``sort_logit_avg``: int64 then int32 per vocabulary entry). Its ``valids`` indices (int64 per
  labelled token, when labels are ignored or shifted) are not counted. Triton, CUDA only: derived by hand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitplan.trace import op_work
from fitplan.trace.fused_head import RULE as TRL_RULE, run as trl_head
from fitplan.trace.score_head import RULE as REWARD_RULE, run as reward_head
from fitplan.trace.logits_head import HEADS as LOGITS_LOSS_HEADS, RULE as LOGITS_LOSS_RULE, run as logits_loss_head
from fitplan.arch.archfile import BYTES
from fitplan.trace.lora_targets import lora_site_matches

if TYPE_CHECKING:
    from fitplan.trace.learned_segment import Segment

CHUNKS = 8
"""torchtune's ``CEWithChunkedOutputLoss(num_output_chunks=8)`` default."""
CHUNKED = ("chunked", "chunked_compiled")
"""The loss implementations whose head runs per chunk of the sequence."""
OWN_LIFETIMES = (*CHUNKED, *LOGITS_LOSS_HEADS)
"""Heads that replay the model's own ops up to its logits and let the epilogue's tensors go themselves (the model's
frames are gone before their loss runs); the others hold them until the head's loss is made."""

RULES = {
    # LigerFusedLinearCrossEntropyFunction: differentiable in the hidden state and the LM head weight; its saved
    # tensors are the gradients themselves (given explicitly, ``sv``), only the loss is a differentiable output
    "liger.fused_linear_cross_entropy": {"d": ["self", "weight"], "s": [], "p": [0, 0], "o": [1]},
    # cut_cross_entropy's LinearCrossEntropyFunction: differentiable in the embeddings and the classifier; saves
    # them, the fp32 log-sum-exp and the logit average (given explicitly, ``sv``); its backward allocates both
    # gradients (``zeros_like``)
    "cce.linear_cross_entropy": {"d": ["self", "weight"], "s": [], "p": [0, 0], "o": [1]},
    # torch.compile'd compute_cross_entropy (one AOTAutograd graph per chunk): differentiable in the chunk, whose
    # gradient is a new tensor; saves the chunk, the targets and the per-row max and log-sum-exp (``sv``)
    "torchtune.compiled_cross_entropy": {"d": ["self"], "s": [], "p": [0], "o": [1, 0, 0]},
    "trl.chunked_logprob": TRL_RULE,  # TRL's fused LM head (trace/fused_head.py)
    "reward.pool": REWARD_RULE,  # the reward model's score head (trace/score_head.py)
    "trl.logits_loss": LOGITS_LOSS_RULE,  # ORPO's and CPO's loss over the full logits (trace/logits_head.py)
}


def liger_chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Liger's chunk (rows of the ``(b·s, h)`` hidden state per matmul): ``inc_factor = ⌈V / h⌉``,
    ``chunk = min(next_pow2(⌈BT / inc_factor⌉), BT)`` (fused_linear_cross_entropy.py, "Bound transient logits
    to C x BT x H", ``chunk_mem_const = 1``)."""
    inc = -(-vocab // hidden)
    rows = -(-tokens // inc)
    return min(1 << (rows - 1).bit_length(), tokens)


def head_site(seg_inst: "Segment") -> dict[str, Any] | None:
    """The LM head's call site in the epilogue when the loss head is replaced, else None."""
    b = seg_inst.b
    if b.spec.loss == "hf" or "loss" not in seg_inst.seg:
        return None
    module = b.af.data.get("output_module") or "lm_head"
    site = next((s for s in seg_inst.seg.get("sites", ()) if s["module"] == module), None)
    if site is None:
        from fitplan.errors import FitplanError

        raise FitplanError(f"loss_implementation {b.spec.loss!r} needs the LM head's call site in the learned file",
                           file=str(b.af.path), field="loss_implementation", value=b.spec.loss,
                           suggestion="use loss_implementation = \"hf\", or re-learn the architecture")
    if b.lora and b.spec.loss in ("liger", "cce") and lora_site_matches(module, b.spec.lora_targets, b.af):
        from fitplan.errors import FitplanError

        raise FitplanError(f"LoRA on the LM head ({module}) with loss_implementation {b.spec.loss!r}: the fused loss "
                           "reads the head's weight alone (Liger's and Cut CE's patches take lm_head.weight), so the "
                           "adapter would not train; fitplan does not estimate that run", field="loss_implementation",
                           value=b.spec.loss, suggestion=f"drop {module} from lora_target_modules, or use hf or chunked")
    return site


def run(seg_inst: "Segment", site: dict[str, Any]) -> None:
    """Emit the replaced head from ``site`` on; sets the epilogue's loss reference."""
    heads = {"chunked": _chunked, "chunked_compiled": _chunked, "liger": _liger, "cce": _cce, "trl": trl_head, "trl_kto": trl_head,
             "trl_logp": trl_head, "trl_grpo": trl_head, "reward": reward_head,
             **{name: logits_loss_head for name in LOGITS_LOSS_HEADS}}
    loss = heads[seg_inst.b.spec.loss](seg_inst, site)
    seg_inst.refs[seg_inst.seg["loss"]] = loss


def _chunk_lengths(s: int, n: int) -> list[int]:
    """``tensor_split(n)``'s sizes: the first ``s mod n`` chunks one longer (empty chunks dropped)."""
    q, r = divmod(s, n)
    return [q + 1 if j < r else q for j in range(n) if q + (1 if j < r else 0) > 0]


def _chunked(seg_inst: "Segment", site: dict[str, Any]):
    """torchtune's order: the model's forward makes every chunk's LM head output (the final hidden state goes
    when it returns, unless a chunk's matmul saved it), then the recipe shifts the labels (``hstack``: a new
    ``(b, s)`` int64 tensor, alive until the loss returns) and the loss runs chunk by chunk."""
    b, tr, seg = seg_inst.b, seg_inst.b.tr, seg_inst.seg
    h = seg_inst.ref(site["input"])
    batch, hidden = b.spec.batch, h.numel // (b.spec.batch * b.spec.seq)
    loss_from = seg.get("logits_from", site["end"] + 1)
    pieces = []
    for length in _chunk_lengths(b.spec.seq, CHUNKS):  # tensor_split: every slice before the first LM head
        piece = tr.view(h, batch * length * hidden)
        piece.base = h.base if h.base is not None else h
        b.emit("slice.Tensor", [("self", h)], [piece])
        pieces.append((length, piece))
    chunks = []
    for length, piece in pieces:
        sub = type(seg_inst)(b, seg, [], None)
        sub.env = {**b.env, "s": length}
        sub.refs = dict(seg_inst.refs)
        sub.inherited = set(seg_inst.refs)
        sub.refs[site["input"]] = piece
        sub.run(first=site["start"], last=loss_from)
        chunks.append(sub)
    seg_inst._deaths([r for r, d in seg.get("die", {}).items() if isinstance(d, int) and d >= site["start"]])
    prev = tr.kind_default
    tr.kind_default = "logits"
    labels = tr.new(batch * b.spec.seq, "i64", False, "labels.hstack")
    b.emit("ne.Scalar", [("self", b.externals["labels"])], [labels])
    count = tr.new(1, "i64", False, "total_elements")  # (labels != ignore_index).sum(): saved by div
    b.emit("ne.Scalar", [("self", labels)], [count])
    tr.kind_default = prev
    losses = []
    if b.spec.loss == "chunked_compiled":  # the loss reshapes every target chunk before its loop
        targets = [_target_chunk(sub, labels) for sub in chunks]
        losses = [_compiled_cross_entropy(sub, target, seg["ops"][loss_from - 1][2][0])
                  for sub, target in zip(chunks, targets)]
    for sub in chunks if not losses else ():
        sub.run(first=loss_from)
        losses.append(sub.refs[seg["loss"]])
    tr.touch(labels)
    total = losses[0]
    for part in losses[1:]:
        acc = tr.new(1, "f32", False, "add")
        b.emit("add.Tensor", [("self", total), ("other", part)], [acc])
        total = acc
    loss = tr.new(1, "f32", False, "div")
    b.emit("div.Tensor", [("self", total), ("other", count)], [loss])
    return loss


def _target_chunk(sub: "Segment", labels):
    """``target_chunk.reshape(-1)`` of one ``(b, s/8)`` label chunk: a copy unless the batch is one row."""
    b, tr = sub.b, sub.b.tr
    tokens = b.spec.batch * sub.env["s"]
    if b.spec.batch == 1:
        return tr.view(labels, tokens)
    prev = tr.kind_default
    tr.kind_default = "logits"
    target = tr.new(tokens, "i64", False, "labels.chunk")
    tr.kind_default = prev
    b.emit("clone", [("self", labels)], [target])
    return target


def _compiled_cross_entropy(sub: "Segment", target, logits_ref: str):
    """One chunk's ``torch.compile``'d ``compute_cross_entropy`` (module doc, ``chunked_compiled``)."""
    b, tr = sub.b, sub.b.tr
    logits = sub.ref(logits_ref)
    tr.kind[logits.sid] = "logits"  # the 16-bit chunk: the compiled graph saves it for its backward
    tokens = b.spec.batch * sub.env["s"]
    prev = tr.kind_default
    tr.kind_default = "logits"
    row_max = tr.new(tokens, "f32", False, "compiled_ce.amax")
    lse = tr.new(tokens, "f32", False, "compiled_ce.logsumexp")
    tr.kind_default = prev
    loss = tr.new(1, "f32", False, "compiled_ce.loss")
    b.emit("torchtune.compiled_cross_entropy", [("self", logits), ("target", target)], [loss, row_max, lse],
           extra={"sv": [logits, target, row_max, lse]})
    op = tr.ops[-1]
    op.bwd_temp = 4 * tokens if op.outs else 0  # the backward's per-row fp32 sum beside the chunk's gradient
    op.work = _compiled_ce_work(logits.nbytes, tokens)
    return loss


def _compiled_ce_work(chunk_bytes: int, tokens: int) -> op_work.Work:
    """Inductor's kernels for one chunk: the forward reduces the 16-bit chunk per row (the maximum, then the sum of
    exponentials: two reads); the backward reads it once and writes its 16-bit gradient."""
    rows = 16 * tokens
    fwd = (op_work.Kernel("elementwise", "", 0, 2 * chunk_bytes + rows),)
    bwd = (op_work.Kernel("elementwise", "", 0, 2 * chunk_bytes + rows),)
    return op_work.Work(fwd, bwd)


def _head(seg_inst: "Segment", site: dict[str, Any]):
    """The LM head call site's pieces a fused loss reads: builder, trace, the hidden states, the head weight, and
    the token, hidden and vocabulary sizes."""
    b = seg_inst.b
    h = seg_inst.ref(site["input"])
    weight = seg_inst.ref("p:" + site["module"] + ".weight")
    tokens = b.spec.batch * b.spec.seq
    hidden = h.numel // tokens
    return b, b.tr, h, weight, tokens, hidden, weight.numel // hidden


def _liger(seg_inst: "Segment", site: dict[str, Any]):
    """Liger's fused linear cross-entropy (module doc)."""
    b, tr, h, weight, tokens, hidden, vocab = _head(seg_inst, site)
    compute = b.compute if b.mixed else h.dtype
    rows = liger_chunk_rows(tokens, vocab, hidden)
    prev = tr.kind_default
    tr.kind_default = "logits"
    grad_input = tr.new(h.numel, h.dtype, False, "liger.grad_input")
    saved = [grad_input]
    if weight.rg:
        saved.append(tr.new(weight.numel, weight.dtype, False, "liger.grad_weight"))
    transient = [tr.new(b.spec.batch * (b.spec.seq + 1), "i64", False, "labels.pad"),
                 tr.new(tokens, "i64", False, "shift_labels"), tr.new(tokens, "f32", False, "liger.loss_1d"),
                 tr.new(rows * vocab, compute, False, "liger.logits_chunk")]
    tr.kind_default = prev
    loss = tr.new(1, "f32", False, "liger.loss")
    b.emit("liger.fused_linear_cross_entropy", [("self", h), ("weight", weight)], [loss, *saved, *transient],
           extra={"sv": saved})
    op = tr.ops[-1]
    # the backward hands the saved gradients on (scaled in place): no new tensors where fitplan's backward
    # would allocate the input's and the weight's gradient
    op.bwd_temp = -sum(t.nbytes for t in saved) if op.outs else 0
    op.work = _liger_work(tokens, hidden, vocab, compute, h, weight, h.rg, weight.rg)
    return loss


def _cce(seg_inst: "Segment", site: dict[str, Any]):
    """Apple's Cut Cross-Entropy (module doc)."""
    b, tr, h, weight, tokens, hidden, vocab = _head(seg_inst, site)
    prev = tr.kind_default
    tr.kind_default = "logits"
    lse = tr.new(tokens, "f32", False, "cce.lse")
    logit_avg = tr.new(vocab, "f32", False, "cce.logit_avg")
    neg_dot = tr.new(tokens, "f32", False, "cce.neg_dot")
    tr.kind_default = prev
    loss = tr.new(1, "f32", False, "cce.loss")
    b.emit("cce.linear_cross_entropy", [("self", h), ("weight", weight)], [loss, lse, logit_avg, neg_dot],
           extra={"sv": [h, lse, logit_avg]})
    op = tr.ops[-1]
    # the backward's argsort of the logit average (int64, then int32: sort_logit_avg) and the gradients'
    # lock tensors: its transients beside the two gradients fitplan's backward allocates
    op.bwd_temp = 12 * vocab if op.outs else 0
    op.work = _cce_work(tokens, hidden, vocab, b.compute if b.mixed else h.dtype, h, weight)
    return loss


def _cce_work(tokens: int, hidden: int, vocab: int, compute: str, h, weight) -> op_work.Work:
    """Cut Cross-Entropy's kernels: the forward's blockwise logits GEMM (the log-sum-exp; logits never stored);
    the backward recomputes the logits blockwise and, fused with it, the embeddings' and classifier's gradient
    GEMMs (those that require grad)."""
    mm = op_work.gemm(tokens, hidden, vocab, compute, h.nbytes, weight.nbytes, 0, input_grad=h.rg,
                      weight_grad=weight.rg)
    return op_work.Work(mm.fwd, mm.fwd + mm.bwd)


def _liger_work(tokens: int, hidden: int, vocab: int, compute: str, h, weight, input_grad: bool,
                weight_grad: bool) -> op_work.Work:
    """Liger's kernels, all in the forward: per chunk the logits GEMM, the cross-entropy kernel over the logits
    (reads and overwrites them with their gradient), then ``grad_logits @ W`` into ``grad_input`` and
    ``grad_logits.T @ x`` into ``grad_weight``; the backward only scales them when the loss's gradient is not 1
    (the Trainer's is 1: nothing)."""
    e = BYTES[compute]
    logits = tokens * vocab * e
    kernels = list(op_work.gemm(tokens, hidden, vocab, compute, h.nbytes, weight.nbytes, logits,
                                input_grad=False, weight_grad=False).fwd)
    kernels.append(op_work.Kernel("elementwise", "", 0, 2 * logits))
    if input_grad:
        kernels += op_work.gemm(tokens, vocab, hidden, compute, logits, weight.nbytes, h.nbytes,
                                input_grad=False, weight_grad=False).fwd
    if weight_grad:
        kernels += op_work.gemm(vocab, tokens, hidden, compute, logits, h.nbytes, weight.nbytes,
                                input_grad=False, weight_grad=False).fwd
    return op_work.Work(tuple(kernels))


def chunk_count(seq: int) -> int:
    """How many chunks torchtune's head makes of ``seq`` tokens (``tensor_split`` drops none below 8)."""
    return len(_chunk_lengths(seq, CHUNKS))
