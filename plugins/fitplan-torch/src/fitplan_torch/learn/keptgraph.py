"""A module that keeps a tensor with autograd history as an attribute past its forward (RecurrentGemma's
``RecurrentGemmaRglru.recurrent_states = recurrent_states``, transformers 5.24 modeling_recurrent_gemma.py).

Without checkpointing this holds one tensor: the backward runs every node of its history (they lead to the
loss) and frees what they saved. Under non-reentrant gradient checkpointing the layer's forward runs again in
the backward, and the recomputation's pack hook returns the tensor it packs (torch 2.13
torch/utils/checkpoint.py ``_recomputation_hook.pack_hook``: ``return x``), so the recomputed graph's nodes
hold what they saved. Normally that graph goes when the early stop unwinds the layer; the attribute keeps the
recomputed tensor, so its whole history in the recomputed layer (every tensor its ancestors saved) stays alive
through the rest of the backward and the optimizer step, until the layer's next forward replaces it. Measured
on a tiny RecurrentGemma (3 layers, b = 3, s = 21, fp32): 523856 bytes left after the backward beyond the
gradients with checkpointing, 1540 without, 4 (the loss) once the attribute is dropped. The replay does not
model that graph; the learned file names the attributes (``kept_graphs``) and the core refuses checkpointing
for it, naming them.
"""

from __future__ import annotations

from typing import Any


def attributes_with_history(model) -> list[str]:
    """``Class.attribute`` of every module attribute (not a parameter or buffer) holding a tensor with a
    ``grad_fn`` now (after the forward), sorted, each once."""
    import torch

    out = set()
    for mod in model.modules():
        for name, v in vars(mod).items():
            if isinstance(v, torch.Tensor) and v.grad_fn is not None:
                out.add(f"{type(mod).__name__}.{name}")
    return sorted(out)


def rows(names: list[str]) -> dict[str, Any]:
    """The learned file's ``kept_graphs`` (absent when empty: old files and most models)."""
    return {"kept_graphs": list(names)} if names else {}
