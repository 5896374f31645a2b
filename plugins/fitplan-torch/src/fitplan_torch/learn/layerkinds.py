"""A first layer that records other ops in one precision only: one layer rule over every variant.

Mamba's blocks keep the residual in fp32 (``residual_in_fp32``, transformers 5.24 modeling_mamba.py ``MambaBlock``:
``residual.to(torch.float32)``, and the next block casts its fp32 input back to the norm's dtype). In bf16 the
first block receives the embedding's bf16 output and the others an fp32 one, so its casts differ: two layer kinds.
With fp32 weights (``mixed``) every ``to`` is a no-op and every layer records the same ops: one kind. The file has
one layer rule for all variants (``layers.kind``), and the learner refused the type ("the layer pattern differs
between precisions").

:func:`first_layer_rule` finds that case (over all variants together, only the first layer differs from the
others), checks it at one layer more (the odd layer is the first, not the last), and returns the rule
``i == 0``; each variant then maps both kinds to its own segments (the same one where its layers agree).
"""

from __future__ import annotations

from typing import Any

FIRST = '("1" if (i == 0) else "0")'
"""The layer rule: kind ``"1"`` for the first layer, ``"0"`` for the others."""


def first_layer_rule(rec, entries: list[dict[str, Any]], log) -> str | None:
    """:data:`FIRST` where, over the variants together, the first layer alone differs and stays the odd one at one
    layer more; None otherwise (the caller refuses the type as before)."""
    from . import derive as D
    from .configrules import causal_field
    from .patterns import with_layers

    combined = list(zip(*[e["kinds"] for e in entries]))
    if len(combined) < 2 or len(set(combined)) != 2 or combined.count(combined[0]) != 1:
        return None
    odd = next(i for i, e in enumerate(entries) if len(set(e["kinds"])) > 1)
    precision, attn, reg = rec.specs[odd]
    n_name = causal_field(rec.cls, "num_hidden_layers")
    n = rec.base.get(n_name)
    if not isinstance(n, int):
        return None
    b = 1 if "b" in reg.fixed else 2
    try:
        cut = D.Cut(D.run(with_layers(reg.setup(dict(rec.base), b, 16), n + 1), precision, attn, b, 16), {})
    except Exception:  # noqa: BLE001 - no check possible: refused as before
        return None
    keys = [_shape_free(sg) for sg in cut.segments[1:-1]]
    if len(keys) != n + 1 or len(set(keys[1:])) != 1 or keys[0] == keys[1]:
        return None
    log(f"  the first layer records other ops in {precision}/{attn} only: learned as its own kind (i == 0)")
    return FIRST


def _shape_free(seg: dict[str, Any]) -> str:
    """A layer's ops and tensors without sizes and call-site numbers (each layer's Linear sites are its own)."""
    from .derive import digest

    return digest({"ops": [[o[0], o[1], o[2], {k: v for k, v in o[3].items() if k not in ("sc", "site")}]
                           for o in seg["ops"]], "t": [[len(t[0]), t[1], t[2]] for t in seg["tensors"]]})
