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


def resize_partitions(cfg: dict[str, Any], out: dict[str, Any], layers: Any = None) -> list[str]:
    """Lists of two or more positive integers that split a width shrinking changed (their sum is its given value,
    the list not one entry per layer), rescaled in ``out`` to sum to the shrunk width, each part at least 1 and
    the last taking the rounding: Reformer's axial position embeddings are ``axial_pos_embds_dim`` wide per axis
    and concatenated into the hidden state, and the model raises unless they sum to ``hidden_size``
    (transformers/models/reformer/modeling_reformer.py ``AxialPositionEmbeddings.__init__``, 5.24; the class does
    not check it): (64, 192) of 256 become (16, 48) of 64. Returns the fields changed. Over the 196 causal-LM
    types' class defaults, Reformer's is the only such list."""
    from .shrink import SMALL

    shrunk = {k: v for k, v in cfg.items() if k in SMALL and type(v) is int and type(out.get(k)) is int
              and out[k] < v}
    changed = []
    for k, v in cfg.items():
        if not (isinstance(v, list) and len(v) >= 2 and len(v) != layers and all(type(x) is int and x > 0 for x in v)):
            continue
        w = next((w for w, total in shrunk.items() if sum(v) == total), None)
        if w is None or out[w] < len(v):
            continue
        parts = [max(1, x * out[w] // cfg[w]) for x in v[:-1]]
        out[k] = [*parts, out[w] - sum(parts)]
        changed.append(k)
    return changed


def pinned_widths(cfg: dict[str, Any]) -> list[str]:
    """Integer fields whose class default is None, that ``cfg`` states exactly as the class derives them without
    them, and whose every other value the class rejects: XLNetConfig's ``d_head = d_model // n_head`` when None,
    and its ``validate_architecture`` raises unless a stated ``d_head`` equals it
    (transformers/models/xlnet/configuration_xlnet.py, 5.24). Stated in the learner's base config (``to_dict``
    states it), no probe could change ``d_model`` or ``n_head`` alone, and the file held all three at the tiny
    sizes; dropped, the class derives it at every config the learner builds, and the file reads the fields it
    follows from."""
    from .configrules import class_defaults, config_class
    from .derive import alternatives, hf_config

    defaults = class_defaults(config_class(cfg["model_type"]))
    out = []
    for k, v in cfg.items():
        if type(v) is not int or v < 1 or k not in defaults or defaults[k] is not None:
            continue
        try:
            if hf_config({x: y for x, y in cfg.items() if x != k}).to_dict().get(k) != v:
                continue
        except Exception:  # noqa: BLE001 - required: not derived
            continue
        if all(_rejects(cfg, k, alt) for alt in alternatives(k, v)):
            out.append(k)
    return out


def _rejects(cfg: dict[str, Any], k: str, alt: int) -> bool:
    from .derive import hf_config

    try:
        hf_config({**cfg, k: alt})
    except Exception:  # noqa: BLE001 - the class rejects the value
        return True
    return False
