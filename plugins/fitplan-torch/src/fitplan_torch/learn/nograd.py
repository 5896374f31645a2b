"""The parameters a training step leaves without a gradient: the learned file's ``no_grad``.

A trainable parameter that no op of the step reads gets no gradient: ``loss.backward()`` never reaches its
``AccumulateGrad`` node, so its ``.grad`` stays None, and torch's optimizers create no state for it
(torch/optim/adam.py ``Adam._init_group``, which AdamW inherits: only ``p.grad is not None`` joins the step).
The case in transformers 5.24: a causal LM taken from an encoder-decoder family (``BartForCausalLM``,
``TrOCRForCausalLM``, ``MarianForCausalLM`` ...) builds each decoder layer's cross-attention (``encoder_attn``)
and runs it only ``if encoder_hidden_states is not None`` (models/bart/modeling_bart.py ``BartDecoderLayer``),
which a causal-LM step never passes.

The recorder measures it (``record.py``: the names whose ``.grad`` is None after the recorded backward); this
module turns those names into the file's parameter names (``{i}`` for the layer index). A name is listed when
every parameter of its row is without a gradient; a row whose layers differ (some with a gradient, some
without) is not expressible as one row, and is named in the log and left out (the estimate then counts its
gradient, which the verification catches).
"""

from __future__ import annotations

from typing import Any, Callable


def no_grad_rows(no_grad: list[str], with_grad: list[str], template: Callable[[str], str], rows: set[str],
                 log) -> dict[str, Any]:
    """The file's ``{"no_grad": [names]}`` (empty when every parameter gets a gradient): the row names
    (``template`` of a parameter name) whose parameters are all in ``no_grad`` and none in ``with_grad``,
    restricted to the file's parameter ``rows``."""
    idle = {template(n) for n in no_grad}
    used = {template(n) for n in with_grad}
    mixed = sorted(idle & used)
    if mixed:
        log(f"  some but not all parameters of {', '.join(mixed)} get a gradient: counted as trained")
    names = sorted((idle - used) & rows)
    return {"no_grad": names} if names else {}
