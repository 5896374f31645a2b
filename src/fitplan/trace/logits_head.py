"""ORPO's and CPO's loss over the model's full logits, in the step trace (no torch).

``ORPOTrainer`` and ``CPOTrainer`` (trl/experimental/orpo/orpo_trainer.py, trl/experimental/cpo/cpo_trainer.py,
TRL 1.16) call the model without labels and without TRL's fused head: the model's own LM head returns the
logits ``(2b, s, V)`` of the chosen and the rejected sequences (one batch, ``concatenated_forward``), in the
LM head's dtype (the weights', or autocast's 16-bit). This module replays the model's ops up to its logits (the
recorded ``logits_from``: LoRA, autocast and soft-capping as recorded) and then emits ``concatenated_forward``'s
loss as one op (``trl.logits_loss``) whose bytes are worked out here from the source, per ``R = 2b`` rows,
``n = s - 1`` shifted positions, ``V`` the vocabulary, ``e`` the logits' bytes per element:

* the NLL term (ORPO always; CPO when ``cpo_alpha != 0``): ``cross_entropy_loss(all_logits[:b], labels[:b])``
  copies the chosen half's shifted logits (``[..., :-1, :].contiguous()``, ``b·n·V·e``; no copy when ``b = 1``:
  that slice of one row is contiguous), and
  ``F.cross_entropy`` runs ``log_softmax`` (its output saved, ``b·n·V·e``) and ``nll_loss`` (saves the int64
  targets); the copy goes when the function returns. Under autocast the loss reads fp32 logits: accelerate
  converts the model's outputs (:func:`_outputs_to_fp32`);
* ``get_batch_logps`` (``selective_log_softmax``, trl/trainer/utils.py) over all ``R`` rows of
  ``logits[:, :-1, :]``: on the CPU with fp32 logits ``gather`` (saves the logits: they stay alive to the
  backward) and a loop of ``logsumexp`` per row (one ``n × V`` fp32 temporary at a time); with 16-bit logits a
  loop of ``log_softmax`` per row (each output saved: ``R·n·V·e`` in all; the logits themselves are saved by
  nothing and go when the loss returns); on CUDA TRL's Triton kernel (``_LogProbEntropyFunction``,
  trl/kernels/logprob_entropy.py: four fp32 ``R·n`` outputs, saves the logits);
* the labels: ``R × s`` int64 (ORPO's ``torch.where`` over the attention mask, CPO's clone), the shifted
  labels and the loss mask (``R·n`` int64 and bool), the targets of ``nll_loss`` (``b·n`` int64).

The backward, in autograd's order (the log-prob path was built after the NLL term, so it runs first): on the CPU
with fp32 logits each row's ``logsumexp`` backward (``grad · exp(x - lse)``: two ``n × V`` temporaries beside the
row gradients), ``unbind``'s backward stacking the ``R`` row gradients (``G = R·n·V·e``), ``gather``'s backward
(``new_zeros``, ``G``, filled in place by ``scatter_add_``) while the stacked gradient waits: ``2·G`` beside the
saved logits (under a dispatch mode the fill is out of place, one ``G`` more: fitplan-torch's referee runs it in
place, as a step without the mode does, fitplan_torch/plain_backward.py); with 16-bit logits each row's ``gather`` and ``log_softmax`` backward, then the stack
(``2·G``); on CUDA the kernel's ``grad_logits`` (``G``). ``slice``'s backward then makes the logits' gradient
(``L = R·s·V·e``), which waits for the NLL term's: ``nll_loss``'s and ``log_softmax``'s gradients (``b·n·V·e``
each, with its saved output), the two ``slice`` backwards (``b·s·V·e``, then ``L``) and the sum of the two
gradients of the logits (``L``): ``3·L`` at that instant. :func:`loss_bytes` lists these instants;
tests/test_trl_orpo.py checks them against torch running TRL's own functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from fitplan.trace import op_work
from fitplan.arch.archfile import BYTES

if TYPE_CHECKING:
    from fitplan.trace.learned_segment import Segment

RULE = {"d": ["self"], "s": [], "p": [0], "o": [1]}
"""``trl.logits_loss``: differentiable in the logits; its saves are given explicitly (``sv``); the logits'
gradient is new (``slice``'s backward)."""
NLL = {"trl_orpo": True, "trl_cpo": True, "trl_cpo_no_nll": False}
"""Whether the head computes the NLL term: ORPO always, CPO unless ``cpo_alpha == 0`` (then
``nll_loss = torch.tensor(0.0)``)."""
FP32_OUTPUTS = "_f32"
"""The suffix of a head whose trainer runs under autocast (``bf16``/``fp16``): accelerate converts the model's
outputs to fp32 (:func:`_outputs_to_fp32`), whatever the weights' dtype."""
HEADS = tuple(name + suffix for name in NLL for suffix in ("", FP32_OUTPUTS))


def has_nll(head: str) -> bool:
    """Whether ``head`` (one of :data:`HEADS`) computes the NLL term."""
    return NLL[head.removesuffix(FP32_OUTPUTS)]


@attrs.frozen
class LossBytes:
    """What ``concatenated_forward``'s loss holds beyond the logits (module doc).

    :ivar saved: bytes of each tensor saved for the backward (new storages).
    :ivar logits_saved: whether the logits' storage is saved too (fp32 on the CPU, and CUDA).
    :ivar forward_peak: the most the loss holds at once in the forward, beyond the logits.
    :ivar backward_peak: the most it holds at once in the backward, beyond what was alive before it and the
        logits' storage (counted in ``saved`` terms as the backward frees them).
    """

    saved: tuple[int, ...]
    logits_saved: bool
    forward_peak: int
    backward_peak: int


def loss_bytes(rows: int, seq: int, vocab: int, e: int, nll: bool, device: str) -> LossBytes:
    """The instants of the module doc, for ``rows = 2b`` sequences of ``seq`` tokens, logits of ``e`` bytes per
    element."""
    b, n = rows // 2, seq - 1
    logits = rows * seq * vocab * e
    ls = b * n * vocab * e if nll else 0
    ints = 8 * rows * seq + 8 * rows * n + rows * n + (8 * b * n if nll else 0)
    g = rows * n * vocab * e
    if device == "cuda":
        path, kept = "kernel", 16 * rows * n
    elif e == 4:
        path, kept = "logsumexp", 4 * rows * n
    else:
        path, kept = "log_softmax", g
    saved = tuple(x for x in (ls, kept, ints) if x)
    # forward: the NLL term's copy and output; then the log-prob path's kept tensors (CPU ``logsumexp``
    # allocates no row-sized temporary: measured)
    copy = b * n * vocab * e if b > 1 else 0  # one pair: the chosen row's shifted slice is contiguous already
    fwd = [copy + ls if nll else 0, ls + kept]
    held = logits if path != "log_softmax" else 0  # the logits, saved until the log-prob path's backward ends
    if path == "logsumexp":
        logp = [held + ls + g + 2 * n * vocab * 4, held + ls + 2 * g]
    elif path == "log_softmax":
        logp = [ls + g + 2 * n * vocab * e, ls + 2 * g]
    else:
        logp = [held + ls + g]
    tail = [ls + g + logits]  # slice's backward: the logits' gradient made, the row gradients not yet freed
    if nll:
        tail += [logits + 3 * ls, logits + b * seq * vocab * e + logits, 3 * logits]
    return LossBytes(saved, path != "log_softmax", max(fwd) + ints, max(logp + tail))


def run(seg_inst: "Segment", site: dict[str, Any]):
    """Replay the model's ops from the LM head's call site to its logits, then emit the loss (module doc)."""
    b, tr, seg = seg_inst.b, seg_inst.b.tr, seg_inst.seg
    logits_from = seg["logits_from"]
    seg_inst.run(first=site["start"], last=logits_from)  # the model's own LM head (LoRA, autocast, soft-capping)
    logits = seg_inst.ref(seg["ops"][logits_from][1][0][1])
    # the model's forward returns here: what its frames held to the end (the final hidden state) goes
    seg_inst._deaths([r for r, d in seg.get("die", {}).items() if isinstance(d, int) and d >= logits_from])
    if b.spec.loss.endswith(FP32_OUTPUTS):
        # autocast's cache goes as accelerate's autocast context exits with the model's forward: the 16-bit weight
        # copies no backward node saved (all of them under gradient checkpointing) are freed before the loss
        tr.release([sid for sid in tr.pinned if tr.kind[sid] == "autocast"])
        if logits.dtype != "f32":
            logits = _outputs_to_fp32(b, logits)
    rows, seq = b.spec.batch, b.spec.seq
    vocab = logits.numel // (rows * seq)
    e = BYTES[logits.dtype]
    lb = loss_bytes(rows, seq, vocab, e, has_nll(b.spec.loss), b.spec.device)
    prev = tr.kind_default
    tr.kind_default = "logits"
    kept = [tr.new(n, "bool", False, "trl.logits_loss.saved") for n in lb.saved]
    transient = tr.new(max(0, lb.forward_peak - sum(lb.saved)), "bool", False, "trl.logits_loss.transient")
    tr.kind_default = prev
    loss = tr.new(1, "f32", False, "trl.logits_loss")
    saved = kept + ([logits] if lb.logits_saved else [])
    b.emit("trl.logits_loss", [("self", logits)], [loss, *kept, transient], extra={"sv": saved})
    op = tr.ops[-1]
    if op.outs:
        # the point of this op's backward counts what it saved and the logits' new gradient
        op.bwd_temp = lb.backward_peak - sum(lb.saved) - (logits.nbytes if lb.logits_saved else 0) - logits.nbytes
    op.work = _work(logits.nbytes, has_nll(b.spec.loss))
    return loss


def _outputs_to_fp32(b, logits):
    """Under autocast (``bf16``/``fp16``, over fp32 or 16-bit weights) accelerate wraps the model's forward in ``convert_outputs_to_fp32``
    (accelerate/accelerator.py ``prepare_model``, accelerate/utils/operations.py): the 16-bit logits are copied
    to fp32 as the forward returns and the copy is what the loss reads; the 16-bit ones go then (nothing saved
    them: the LM head's GEMM saves its inputs), so they are not held to the end of the forward (``uncached``:
    not pinned)."""
    tr = b.tr
    prev = tr.kind_default
    tr.kind_default = "logits"
    out = tr.new(logits.numel, "f32", False, "convert_outputs_to_fp32")
    tr.kind_default = prev
    b.emit("_to_copy", [("self", logits)], [out])
    tr.uncached.add(logits.sid)
    return out


def _work(logits: int, nll: bool) -> op_work.Work:
    """Memory-bound passes over the logits: the forward reads them for the log-probabilities (and the NLL term's
    copy and ``log_softmax`` over half of them), the backward writes their gradient and reads them back."""
    fwd = op_work.Kernel("elementwise", "", 0, 2 * logits + (2 * logits if nll else 0))
    bwd = op_work.Kernel("elementwise", "", 0, 4 * logits + (2 * logits if nll else 0))
    return op_work.Work((fwd,), (fwd, bwd))
