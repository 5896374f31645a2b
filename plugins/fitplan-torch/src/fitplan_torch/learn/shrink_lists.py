"""Per-layer lists a shrunk config leaves to its config class, which derives them again at the tiny widths.

A ``config.json`` written from a config object (``to_dict``) states every list the class derived: LagunaConfig's
``num_attention_heads_per_layer`` is ``[num_attention_heads] * num_hidden_layers`` when not given
(transformers/models/laguna/configuration_laguna.py ``__post_init__``). Shrinking cuts such a list to the kept
layers but cannot shrink its widths (48 heads per layer beside 4 heads), and the layer pattern search, which
records at other layer counts, would have to resize it too. Dropped, the class derives it at every config the
learner builds, as it did for the given one. The learner's own base config (``to_dict`` of the shrunk one) states
them again: dropped there too, or the heads probe changed ``num_attention_heads`` while every layer kept 4 heads.
"""

from __future__ import annotations

from typing import Any


def derived_layer_widths(cfg: dict[str, Any], full: dict[str, Any], n: Any) -> list[str]:
    """Per-layer width lists (one integer per layer, all alike) whose class default is None and that ``cfg``
    states exactly as the class derives them without it: LagunaConfig's ``num_attention_heads_per_layer =
    [num_attention_heads] * num_hidden_layers`` (transformers/models/laguna/configuration_laguna.py
    ``__post_init__``). Left to the class, they follow the shrunk widths and the kept layer count; stated, they
    kept 48 heads per layer beside 4 and a length the layer pattern search did not resize."""
    from .configrules import class_defaults, config_class
    from .derive import hf_config
    from .shrink import attribute_targets, per_layer_fields

    if type(n) is not int:
        return []
    defaults = class_defaults(config_class(cfg["model_type"]))
    out = []
    for k, v in cfg.items():
        if not (isinstance(v, list) and len(v) == n and len(set(v)) == 1 and all(type(x) is int for x in v)) \
                or defaults.get(k) is not None or per_layer_fields(full, n).get(k) != "list":
            continue
        try:
            derived = hf_config({x: y for x, y in cfg.items() if x != k}).to_dict().get(k)
        except Exception:  # noqa: BLE001 - required: not derived
            continue
        if derived == v and k not in attribute_targets(cfg):
            out.append(k)
    return out
