"""The loss head of the measured step, as the scenario's ``loss_implementation`` runs it.

* ``hf``: the model's own loss (``model(**batch).loss``: transformers' ``ForCausalLMLoss`` over the whole
  fp32 logits);
* ``chunked``: torchtune's way (torchtune/modules/loss/ce_chunked_output_loss.py ``CEWithChunkedOutputLoss``,
  8 chunks, over a model whose output is a list of chunks: ``TransformerDecoder.chunked_output``): the final
  hidden state from the base model, the LM head applied to each of ``h.tensor_split(8, dim=1)``, the labels
  shifted as torchtune's recipes shift them (``hstack`` of ``labels[..., 1:]`` and an ignore column), each
  chunk upcast with ``.float()`` and given to ``F.cross_entropy(reduction="sum")`` one at a time, the sum
  divided by the number of labelled tokens. Eager (the recipes' ``compile: False``).

Liger-Kernel's fused linear cross-entropy and Apple's Cut Cross-Entropy run Triton kernels (CUDA only): refused
by :func:`check`; so is TRL's fused log-prob head as GRPO runs it (``trl_grpo``), which :mod:`.grpo` measures
inside TRL's trainer.
"""

from __future__ import annotations

from fitplan.api import FitplanError

from . import _deps

IGNORE_INDEX = -100
CHUNKS = 8


def check(loss_implementation: str) -> None:
    """Refuse what the referee cannot run."""
    if loss_implementation == "trl_grpo":
        raise FitplanError("the SFT referee does not run TRL's fused log-prob head: GRPO/RLOO's step is measured by "
                           "fitplan_torch.grpo.measure_grpo (TRL's own GRPOTrainer)", field="loss_implementation",
                           value=loss_implementation, suggestion="validate hf or chunked here")
    if loss_implementation == "chunked_compiled":
        raise FitplanError("the torch referee measures eager steps: Inductor's compiled buffers bypass the dispatcher "
                           "its meter watches (tests/test_loss_heads.py checks what the compiled loss saves)",
                           field="loss_implementation", value=loss_implementation, suggestion="validate chunked")
    if loss_implementation not in ("hf", "chunked"):
        raise FitplanError(f"the torch referee cannot run loss_implementation {loss_implementation!r}: Liger-Kernel's "
                           "and Cut Cross-Entropy's kernels are Triton (CUDA) code", field="loss_implementation",
                           value=loss_implementation, suggestion="validate hf or chunked")


def causal_parts(model):
    """(decoder, LM head) of a causal LM, through peft's wrapper."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def chunked_loss(model, batch, chunks: int = CHUNKS):
    """torchtune's chunked cross-entropy over ``model``'s final hidden state (module doc)."""
    torch = _deps.torch()
    decoder, head = causal_parts(model)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    h = decoder(**inputs).last_hidden_state
    logits = [head(piece) for piece in h.tensor_split(chunks, dim=1)]
    del h
    labels = batch["labels"]
    ignore = torch.full((labels.shape[0], 1), IGNORE_INDEX, dtype=labels.dtype, device=labels.device)
    labels = torch.hstack((labels[..., 1:], ignore))
    total_elements = (labels != IGNORE_INDEX).sum()
    targets = [t.reshape(-1) for t in labels.tensor_split(chunks, dim=1)]
    logits = [x.reshape(-1, x.size(-1)) for x in logits]
    total = 0.0
    for x, y in zip(logits, targets):
        total += torch.nn.functional.cross_entropy(x.float(), y, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / total_elements


def loss_of(model, batch, loss_implementation: str):
    """The step's loss tensor; only the loss outlives the call (the model output is dropped, as the HF Trainer
    and torchtune's ``del logits`` do)."""
    if loss_implementation == "chunked":
        return chunked_loss(model, batch)
    out = model(**batch)
    return out.loss
