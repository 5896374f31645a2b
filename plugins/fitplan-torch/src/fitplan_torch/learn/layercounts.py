"""A config at another layer count, as its config class accepts it (the layer-pattern search's probes).

The pattern search (:mod:`.patterns`) records a config at several layer counts. Setting the count alone leaves
fields that the class checks against it at their old size, and the class rejects the probe although the config
it came from is valid. Two such fields, each handled as the class itself would:

* **a layer-count field the class derives** when it is None (an integer named ``*layers*``), stated in the config
  as exactly what the class derives (the shrunk config was written out from the resolved class): left None again,
  so that the class derives it at the new count: Dory's ``n_recurrent_layers`` (``num_hidden_layers -
  n_input_layers - n_output_layers``; ``validate_architecture`` then requires the three sections to add up to the
  count: transformers/models/dory/configuration_dory.py, 5.24);
* **a list of one number per layer** (the class requires one entry per layer): resampled to the new count, entry
  ``j`` taken from the old entry ``j * old // new``, so that every run of equal values keeps its place in the
  stack and every value stays (gemma-3n's ``activation_sparsity_pattern``, ``[0.95] * 10 + [0.0] * 15`` once
  shrunk to 25 layers, which ``Gemma3nTextConfig.__post_init__`` requires to have ``num_hidden_layers`` entries:
  gemma3n/configuration_gemma3n.py; the class would derive no sparse layer at all below 11 layers, so the list
  is kept stated, as a published config states it).

* **a layer-count field the class does not derive** (an integer named ``*layers*`` below the count) that the
  new count breaks: the value nearest its share of the new count that the class accepts (gemma-3n's
  ``num_kv_shared_layers``: 5 of 25 layers leave no full-attention layer unshared at 8, which its
  ``kv_sharing_modes`` property refuses; 3 of 8 keep layer 4 unshared).

A class "accepts" a config when it builds it and its properties derive from it (:func:`rejection`). Only a probe
that the class rejects as set is changed; one it accepts is left as it is.
"""

from __future__ import annotations

import functools
from typing import Any


def _raising_properties(c: Any) -> dict[str, str]:
    """The config object's properties that raise, with the first line of each error."""
    out = {}
    for name in dir(type(c)):
        if not name.startswith("_") and isinstance(getattr(type(c), name, None), property):
            try:
                getattr(c, name)
            except Exception as e:  # noqa: BLE001 - what the property says is the point
                out[name] = str(e).splitlines()[0] if str(e) else type(e).__name__
    return out


@functools.cache
def _raising_at_defaults(cls) -> frozenset[str] | None:
    """The properties of ``cls`` that raise at its own defaults (not a per-layer property the count breaks), or
    None where the class rejects its defaults (no baseline: no property is held against a config)."""
    try:
        return frozenset(_raising_properties(cls()))
    except Exception:  # noqa: BLE001 - defaults the class rejects
        return None


def rejection(cfg: dict[str, Any]) -> str | None:
    """Why the config class rejects ``cfg``, or None: the class's own error, or a property that derives per-layer
    values from the config and raises here, not at the class defaults (gemma-3n's ``kv_sharing_modes``: "The set
    of layer types producing a cache is different than the set of layer types using them" when no unshared layer
    is a full-attention one; the model reads it when it builds its layers: configuration_gemma3n.py)."""
    from .derive import hf_config

    try:
        c = hf_config(cfg)
    except Exception as e:  # noqa: BLE001 - any rejection of the class
        from .limits import first_line

        return first_line(e)
    baseline = _raising_at_defaults(type(c))
    if baseline is None:
        return None
    bad = {k: v for k, v in _raising_properties(c).items() if k not in baseline}
    return next((f"{k}: {v}" for k, v in sorted(bad.items())), None)


def accepted(cfg: dict[str, Any]) -> bool:
    """Whether the config class accepts ``cfg`` (:func:`rejection`)."""
    return rejection(cfg) is None


def _nearest_accepted(after: dict[str, Any], k: int | str, v: int, count: int, n: int) -> int | None:
    """The value of the layer-count field ``k`` (``v`` of ``count`` layers) nearest ``v * n / count`` that makes
    the class accept ``after`` at ``n`` layers, or None."""
    scaled = round(v * n / count)
    for x in sorted(range(n + 1), key=lambda x: (abs(x - scaled), x)):
        if accepted({**after, k: x}):
            return x
    return None


def _derived_by_class(cfg: dict[str, Any], k: str) -> bool:
    """Whether the class defaults ``k`` to None and derives the value ``cfg`` states for it (``cfg`` as stated,
    at its own layer count)."""
    from .configrules import class_defaults, config_class
    from .derive import hf_config

    try:
        if class_defaults(config_class(cfg["model_type"])).get(k, 0) is not None:
            return False
        return hf_config({**cfg, k: None}).to_dict().get(k) == cfg[k]
    except Exception:  # noqa: BLE001 - the class rejects it without the field: not derived
        return False


def _per_layer_numbers(v: Any, count: int) -> bool:
    """Is ``v`` one number per layer of ``count`` (a list of that length, every entry an int or float)?"""
    return isinstance(v, list) and len(v) == count and count > 0 and \
        all(type(x) in (int, float) for x in v)


def fit_to_class(before: dict[str, Any], after: dict[str, Any], count: Any, n: int) -> None:
    """``after`` (``before`` set to ``n`` layers from ``count``) changed in place, where the class rejects it, so
    that it accepts it: see the module doc. ``before`` must be the config at ``count`` layers."""
    if type(count) is not int or count == n or accepted(after):
        return
    for k, v in before.items():
        if k == "model_type" or (k in after and after[k] != v):
            continue  # already set for the new count
        if _per_layer_numbers(v, count):
            after[k] = [v[j * count // n] for j in range(n)]
        elif isinstance(v, int) and not isinstance(v, bool) and "layers" in k and _derived_by_class(before, k):
            after[k] = None
    if accepted(after):
        return
    for k, v in before.items():  # a layer-count field the class does not derive: the nearest it accepts
        if type(v) is int and "layers" in k and 0 < v < count and after.get(k) == v:
            x = _nearest_accepted(after, k, v, count, n)
            if x is not None:
                after[k] = x
                return


def refuse_nested_layer_counts(base: dict[str, Any], cls) -> None:
    """:raises LearnError: the config states no layer count the causal LM reads, and nested configs count their
    own layers: several stacks of layers, which the file's one layer count and one layer pattern cannot express.
    BltConfig declares no ``num_hidden_layers``; its patcher, local encoder, global transformer and local decoder
    count theirs in ``patcher_config``, ``encoder_config``, ``global_config``, ``decoder_config`` (14, 1, 25 and 9
    by default: models/blt/configuration_blt.py, 5.24). Learned anyway, BLT ended in exit 70 ("int() argument must
    be ... not 'NoneType'") after 267 CPU s; the traceback was not captured, and a layer count of None, the cause of
    ProphetNet's same error before its decoder's count was read, is the likely one."""
    from . import configrules
    from . import derive as D

    from fitplan.api import decoder_config

    key = configrules.causal_field(cls, "num_hidden_layers")
    if type(base.get(key)) is int or decoder_config(base) != base:
        return  # a composite config (gemma-3's text_config): the learner reads its text part (learn/command.py)
    nested = {k: v["num_hidden_layers"] for k, v in base.items()
              if isinstance(v, dict) and type(v.get("num_hidden_layers")) is int}
    if nested:
        stacks = ", ".join(f"{k}.num_hidden_layers = {n}" for k, n in nested.items())
        raise D.LearnError(f"the config states no layer count the causal LM reads ({key}); {len(nested)} nested "
                           f"configs count layers of their own ({stacks}): several stacks of layers, which a "
                           "learned file's one layer count cannot express")
