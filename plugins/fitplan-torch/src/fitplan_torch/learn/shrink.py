"""Shrinking a config to a tiny model of the same type, as its transformers config class allows.

``fitplan learn-architecture`` learns from small recordings: widths of 64, two layers (or as many as it takes to
keep every kind of layer the config has), every switch as given. Shrinking must leave a config the class accepts
and that describes the same layers:

* **per-layer lists** (``layer_types``, ``no_rope_layers``, ``mlp_layer_types``, ``num_attention_heads_per_layer``,
  gemma-3n's ``intermediate_size`` per layer ...), lists of layer indices (``mlp_only_layers``) and dicts keyed by
  layer index (``per_layer_config``) are cut to the kept layers. The kept layers are the shortest prefix holding
  every distinct layer (the values of all per-layer fields at that index); a list the config did not give (the
  class derives it, from ``sliding_window_pattern`` or ``no_rope_layer_interval``) is left to the class when it
  derives the cut at the new count, else stated cut. The class's ``validate_layer_type`` requires one entry per
  layer (transformers/configuration_utils.py, 5.24);
* **layer-count fields** (``*_layers`` below the layer count: gemma-3n's ``num_kv_shared_layers``) are set so that
  the class derives every kind of layer again; those that make up the layer count together (Dory's input,
  recurrent and output sections) are scaled together. **Nested configs** (the class's ``sub_configs``: DBRX's
  ``attn_config``, ``ffn_config``) are shrunk like the top level;
* **per-dimension factor lists**: longrope's ``short_factor`` / ``long_factor`` hold ``int(head_dim *
  partial_rotary_factor) // 2`` numbers (transformers/modeling_rope_utils.py ``_validate_longrope_rope_parameters``;
  the class only warns, the model fails in its rotary embedding), resampled to the shrunk head size;
* a relation the class checks between widths (Mamba-2's ``hidden_size * expand == num_heads * head_dim``) that the
  shrunk widths break is repaired by leaving a field to the class (it derives it) or keeping one at its size;
  when nothing makes the class accept the config, the error names the fields and the class's message;
* a relation only the model needs (the class does not check it) is found by running the shrunk config once
  (:mod:`.shrink_run`): repaired from the error, or refused naming the field.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from fitplan.api import FitplanError

from .limits import first_line
from .shrink_names import layer_count_key, tiny_value

SMALL = {"hidden_size": 64, "n_embd": 64, "d_model": 64, "intermediate_size": 128, "ffn_hidden_size": 128,
         "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "vocab_size": 512,
         "max_position_embeddings": 256, "n_positions": 256, "model_max_length": 256, "num_attention_heads": 4, "n_head": 4,
         "num_key_value_heads": 2, "head_dim": 16, "d_head": 16, "num_local_experts": 4, "num_experts": 4,
         "n_routed_experts": 4, "num_experts_per_tok": 2, "num_experts_per_token": 2, "num_heads": 8, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_ssm": 128, "mamba_d_state": 16,
         "ssm_state_size": 16,
         "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "kv_lora_rank": 32, "q_lora_rank": 32,
         "n_group": 2, "topk_group": 1}
"""The tiny widths (a field is only ever made smaller). ``num_heads`` / ``mamba_n_heads`` with ``head_dim`` 16:
Mamba-2 heads of a 64-wide model expanded twice (8 × 16 = 2 × 64; Falcon-H1's ``mamba_d_ssm`` the same 128), a
state of 16 (Falcon-H1 learned at its default 1024-wide SSM and 256-wide state passed 4 GB resident); DeepSeek-style MLA widths and expert groups (2
groups of the 4 experts, 1 of them routed to)."""
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
MAX_KINDS = 8
"""More distinct layers than this: refused (the learner records one layer of each kind; patterns.N_LAYERS)."""
FACTOR_LISTS = ("short_factor", "long_factor")
INDEX_NAMES = ("_layers", "_idxs", "_indices", "_ids")
"""Names of fields that list layer indices (a list of every index is still one)."""


def shrink(cfg: dict[str, Any], log=lambda msg: None) -> dict[str, Any]:
    """A tiny config of ``cfg``'s model type that its config class accepts (module doc). When the model does not
    run with one layer of each kind but runs with two (Zamba ties its one shared attention block across its
    hybrid layers through ``_tied_weights_keys``, a pattern over the other hybrid layers' indices, and
    ``PreTrainedModel.get_expanded_tied_weights_keys`` rejects a pattern that matches no layer:
    transformers/models/zamba/modeling_zamba.py, modeling_utils.py, 5.24), it keeps two.

    :raises FitplanError: naming the field when a per-layer field cannot be cut or the class rejects every repair."""
    from .shrink_run import run_error, runnable

    out = shrunk_config(cfg, 1, log)
    err = run_error(out)
    if err is not None:
        twice = shrunk_config(cfg, 2)
        if twice != out and run_error(twice) is None:
            log("  shrink: two layers of each kind (the model does not run with one)")
            return twice
    return runnable(cfg, out, err, log)


def shrunk_config(cfg: dict[str, Any], each: int = 1, log=lambda msg: None) -> dict[str, Any]:
    """The shrunk config with ``each`` layers of each kind, before the model runs it (:func:`shrink` then runs
    it and repairs what only the model needs)."""
    from .derive import hf_config

    full = _resolved(cfg)
    out = _widths(cfg)
    for k in derived_widths(cfg, full):
        del out[k]  # the class derives it from the shrunk widths, as it did from the given ones
    layers_key = layer_count_key(cfg, full, LAYER_KEYS)
    if layers_key is not None:
        out = _cut_layers(cfg, out, full, layers_key, log, each)
        from .shrink_lists import derived_layer_widths

        for k in derived_layer_widths(cfg, full, full[layers_key]):
            out.pop(k, None)  # the class derives it again at the shrunk widths and layer count
    _even_rotary(out, full)
    _resize_factor_lists(out, full)
    from .shrink_lists import resize_partitions

    for k in resize_partitions(cfg, out, full.get(layers_key) if layers_key else None):
        log(f"  shrink: {k} = {out[k]} (its parts sum to the shrunk width, as the model requires)")
    _token_ids(out, full)
    try:
        hf_config(out)
    except Exception as e:  # noqa: BLE001 - the class rejects the shrunk widths: repair below
        out = _repair(cfg, out, e, log)
    return out


def _resolved(cfg: dict[str, Any]) -> dict[str, Any]:
    from .derive import hf_config

    try:
        return hf_config(cfg).to_dict()
    except Exception as e:  # noqa: BLE001 - the config as given is not one the class accepts
        raise FitplanError(f"transformers' config class rejects this config: {first_line(e)}", field="model_type",
                           value=cfg.get("model_type")) from None


def _widths(cfg: dict[str, Any]) -> dict[str, Any]:
    """The widths of :data:`SMALL`, also inside per-layer overrides (DotsNote's ``per_layer_config``)."""
    out = copy.deepcopy(cfg)
    for k, v in SMALL.items():
        if isinstance(out.get(k), int) and not isinstance(out[k], bool) and out[k] > v:
            out[k] = v
        elif isinstance(out.get(k), list) and out[k] and all(type(x) is int for x in out[k]):
            out[k] = [min(x, v) for x in out[k]]  # one width per layer (gemma-3n's intermediate_size)
    aliases = {field: std for std, field in _attribute_map(cfg).items()}
    for k, v in cfg.items():  # a field SMALL names by an alias, a kind in its name, another vocabulary (shrink_names)
        small = None if k in SMALL else tiny_value(k, aliases, SMALL)
        if small is not None and type(v) is int and v > small:
            out[k] = small
    heads, kv = out.get("num_attention_heads"), out.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and cfg.get("num_key_value_heads") == cfg.get("num_attention_heads"):
        out["num_key_value_heads"] = heads  # multi-head stays multi-head (DeepSeek's MLA runs only so)
    for k, v in out.items():
        if "layer" in k and isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()):
            out[k] = {key: _widths(x) for key, x in v.items()}
        elif k in sub_config_keys(cfg) and isinstance(v, dict):
            out[k] = _widths(v)  # DBRX's ffn_config: ffn_hidden_size 3584 behind a 64-wide model
    return out


def sub_config_keys(cfg: dict[str, Any]) -> set[str]:
    """The fields the config class keeps as nested config objects (its ``sub_configs``: DbrxConfig's
    ``attn_config`` and ``ffn_config``, transformers/models/dbrx/configuration_dbrx.py, 5.24); their widths are
    shrunk like the top level's (a multimodal type's other towers are not read: the CLI learns its text config)."""
    from .configrules import config_class

    if not isinstance(cfg.get("model_type"), str):
        return set()
    try:
        subs = getattr(config_class(cfg["model_type"]), "sub_configs", None) or {}
    except Exception:  # noqa: BLE001 - an unknown type: no nested configs known
        return set()
    return {k for k in subs if k not in ("text_config", "vision_config", "audio_config")}


def derived_widths(cfg: dict[str, Any], full: dict[str, Any]) -> list[str]:
    """The integer fields whose class default is None and that ``cfg`` states at the value the class's
    ``__post_init__`` derives without them (``head_dim`` = ``hidden_size // num_attention_heads`` for Llama, =
    ``qk_rope_head_dim`` for DeepSeek-V3; Zamba-2's ``attention_hidden_size`` = ``2 * hidden_size``, a width
    :data:`SMALL` does not name): left to the class, so they follow the shrunk widths they derive from instead
    of breaking the relation."""
    from .configrules import class_defaults, config_class
    from .derive import hf_config

    defaults = class_defaults(config_class(cfg["model_type"]))
    out = []
    for k in [*SMALL, *(k for k in cfg if k not in SMALL and not k.endswith("_token_id") and k not in LAYER_KEYS)]:
        if k not in cfg or not isinstance(cfg[k], int) or isinstance(cfg[k], bool) or defaults.get(k) is not None:
            continue  # a field with a default of its own is not derived (its value may just be the default)
        try:
            derived = hf_config({x: v for x, v in cfg.items() if x != k}).to_dict().get(k)
        except Exception:  # noqa: BLE001 - required: not derived
            continue
        if derived == full.get(k) and k not in attribute_targets(cfg):
            out.append(k)
    return out


def attribute_targets(cfg: dict[str, Any]) -> set[str]:
    """Fields that are aliases (``attribute_map`` values): never dropped, the alias would then read nothing."""
    return set(_attribute_map(cfg).values())


def _attribute_map(cfg: dict[str, Any]) -> dict[str, str]:
    """The config class's ``attribute_map`` (standard name -> its field); empty for an unknown type."""
    from .configrules import attribute_map, config_class

    try:
        return attribute_map(config_class(cfg["model_type"]))
    except Exception:  # noqa: BLE001
        return {}


# --------------------------------------------------------------------------- layers


def per_layer_fields(full: dict[str, Any], n: int) -> dict[str, str]:
    """The resolved config's fields sized by the layer count ``n``: ``{field: "list" | "indices" | "keys"}``
    (one entry per layer; layer indices; a dict keyed by layer index)."""
    out = {}
    for k, v in full.items():
        if k in ("architectures", "id2label", "label2id") or k.endswith("_token_id"):
            continue
        if isinstance(v, list) and v and all(type(x) is int and 0 <= x < n for x in v) and \
                all(a < b for a, b in zip(v, v[1:])) and (len(v) < n or k.endswith(INDEX_NAMES)):
            out[k] = "indices"  # Llama-4's moe_layers, LFM2's full_attn_idxs (every layer: still indices)
        elif isinstance(v, list) and len(v) == n and n > 0 and all(_scalar(x) for x in v):
            out[k] = "list"
        elif isinstance(v, dict) and v and "layer" in k and all(_index_key(x, n) is not None for x in v):
            out[k] = "keys"
    return out


def _scalar(x: Any) -> bool:
    return x is None or isinstance(x, (bool, int, float, str))


def _index_key(x: Any, n: int) -> int | None:
    try:
        i = int(x)
    except (TypeError, ValueError):
        return None
    return i if 0 <= i < n else None


def layer_signatures(full: dict[str, Any], fields: dict[str, str], n: int) -> list[str]:
    """Per layer, the values every per-layer field gives it (two layers alike have the same signature)."""
    sigs = []
    for i in range(n):
        row = []
        for k, how in fields.items():
            v = full[k]
            if how == "list":
                row.append(v[i])
            elif how == "indices":
                row.append(i in v)
            else:
                row.append(next((json.dumps(x, sort_keys=True, default=str) for key, x in v.items()
                                 if _index_key(key, n) == i), None))
        sigs.append(json.dumps(row, default=str))
    return sigs


def kept_layers(sigs: list[str], minimum: int = 2, each: int = 1) -> int:
    """The shortest prefix holding every distinct layer ``each`` times (or as often as there are), at least
    ``minimum`` layers (or all there are)."""
    need = {s: min(each, sigs.count(s)) for s in set(sigs)}
    seen: dict[str, int] = {}
    for i, s in enumerate(sigs):
        seen[s] = seen.get(s, 0) + 1
        if all(seen.get(k, 0) >= v for k, v in need.items()) and i + 1 >= minimum:
            return i + 1
    return len(sigs)


def _cut(value: Any, how: str, n: int, total: int) -> Any:
    if how == "list":
        return list(value[:n])
    if how == "indices":
        return [i for i in value if i < n]
    return {k: x for k, x in value.items() if _index_key(k, total) is not None and _index_key(k, total) < n}


def derived_layer_lists(c: Any, n: int) -> dict[str, list]:
    """The config object's properties that give one value per layer, which no config states: gemma-3n's and
    gemma-4's ``kv_sharing_modes`` (None, "store" or "reuse" per layer, derived from ``num_kv_shared_layers``:
    the last that many layers reuse the cache of an earlier layer of their type; the property raises when a
    type has no earlier layer: transformers/models/gemma3n/configuration_gemma3n.py, gemma4_unified/...)."""
    out = {}
    for name in dir(type(c)):
        if name.startswith("_") or not isinstance(getattr(type(c), name, None), property):
            continue
        try:
            v = getattr(c, name)
        except Exception:  # noqa: BLE001 - a property the class cannot derive at this config
            continue
        if isinstance(v, list) and len(v) == n and all(_scalar(x) for x in v):
            out[name] = v
    return out


def _with_derived(cfg: dict[str, Any], full: dict[str, Any], n: int) -> dict[str, Any] | None:
    """``full`` with the class's per-layer properties at ``n`` layers (:func:`derived_layer_lists`); None when
    the class rejects ``cfg``."""
    from .derive import hf_config

    try:
        return {**full, **derived_layer_lists(hf_config(cfg), n)}
    except Exception:  # noqa: BLE001
        return None


def _cut_layers(cfg, out, full, layers_key, log, each: int = 1) -> dict[str, Any]:
    total = full[layers_key]
    full = _with_derived(cfg, full, total) or full
    fields = per_layer_fields(full, total)
    sigs = layer_signatures(full, fields, total)
    if len(set(sigs)) > MAX_KINDS:
        varying = [k for k in fields if len({str(_col(full[k], fields[k], i, total)) for i in range(total)}) > 1]
        raise FitplanError(f"{len(set(sigs))} distinct layers (more than {MAX_KINDS}): the learner records one "
                           "layer of each kind", field=", ".join(varying[:4]) or layers_key, value=total,
                           suggestion="--no-shrink learns it at its own size")
    n = kept_layers(sigs, each=each) if total > 2 else total
    if n == total:
        return out
    trial = _cut_at(cfg, out, full, fields, layers_key, n, log)
    want = _kinds(out, fields, total)  # at the shrunk widths (gemma-4's per-layer head_dim override shrunk too)
    want = want if want is not None else set(layer_signatures(full, _not_widths(fields), total))
    if _kinds(trial, fields, n) == want:
        return trial
    return _layer_counts(cfg, out, full, fields, layers_key, n, want, log) or trial


def _kinds(trial: dict[str, Any], fields: dict[str, str], n: int) -> set[str] | None:
    """The distinct layers of the shrunk ``trial`` (its resolved per-layer fields and properties), or None when
    the class rejects it or does not derive every field."""
    from .derive import hf_config

    try:
        resolved = _with_derived(trial, hf_config(trial).to_dict(), n)
    except Exception:  # noqa: BLE001
        return None
    if resolved is None or any(k not in resolved for k in fields):
        return None
    return set(layer_signatures(resolved, _not_widths(fields), n))


def _not_widths(fields: dict[str, str]) -> dict[str, str]:
    """The per-layer fields that say which kind a layer is, not how wide it is (gemma-3n's ``intermediate_size``
    per layer is shrunk, so its values differ from the given ones)."""
    return {k: how for k, how in fields.items() if k not in SMALL}


def _is_property(cfg: dict[str, Any], k: str) -> bool:
    from .configrules import config_class

    return isinstance(getattr(config_class(cfg["model_type"]), k, None), property)


def _layer_counts(cfg, out, full, fields, layers_key, n, want, log) -> dict[str, Any] | None:
    """The cut config with a layer-count field (an integer field named ``*layers*`` below the layer count:
    gemma-3n's ``num_kv_shared_layers``) set so that the class derives every kind of layer again, at the
    fewest layers from ``n`` up: gemma-3n's 15 cache-sharing layers of 35 (period 5) become 5 of 10, so that
    both the sharing and the shared layers hold a full-attention layer; gemma-4 assistants share all (30 of 30
    become 6 of 6). None when no count does."""
    total = full[layers_key]
    counts = [k for k, v in cfg.items() if "layers" in k and type(v) is int and 0 < v <= total
              and k not in LAYER_KEYS and k not in fields]
    for m in range(n, total):
        for vals in _scaled_together(cfg, counts, m, total):
            trial = _cut_at({**cfg, **vals}, {**out, **vals}, full, fields, layers_key, m, lambda msg: None)
            if _kinds(trial, fields, m) == want and _counts_kept(cfg, trial):
                log(f"  shrink: {', '.join(f'{k} = {v}' for k, v in vals.items())} of {m} layers (was "
                    f"{', '.join(str(cfg[k]) for k in vals)} of {total}: every kind of layer kept)")
                return trial
        for k in counts:
            scaled = round(cfg[k] * m / total)
            for v in sorted(range(m + 1), key=lambda x: (abs(x - scaled), x)):
                trial = _cut_at({**cfg, k: v}, {**out, k: v}, full, fields, layers_key, m, lambda msg: None)
                if _kinds(trial, fields, m) == want and _counts_kept(cfg, trial):
                    log(f"  shrink: {k} = {v} of {m} layers (was {cfg[k]} of {total}: every kind of layer kept)")
                    return trial
    return None


def _scaled_together(cfg: dict[str, Any], counts: list[str], m: int, total: int):
    """Every layer-count field scaled to ``m`` of ``total`` layers at once, each rounded down or up (at least 1
    where it was above 0): the counts that make up the layer count together (Dory's ``n_input_layers +
    n_recurrent_layers + n_output_layers == num_hidden_layers``, configuration_dory.py ``validate_architecture``)
    are only accepted when they all move. Nothing for a single field (the loop over single fields tries it)."""
    import itertools
    import math

    if not 2 <= len(counts) <= 4:
        return
    options = []
    for k in counts:
        x = cfg[k] * m / total
        options.append(sorted({max(1, math.floor(x)), max(1, math.ceil(x))}))
    for combo in itertools.product(*options):
        yield dict(zip(counts, combo))


def _layer_count_fields(c) -> dict[str, tuple[int, int]]:
    """The config object's layer-count fields (``*_layers`` integers, stated or derived) with its layer count:
    ``{field: (value, layers)}``."""
    n = getattr(c, "num_hidden_layers", None)
    if type(n) is not int:
        return {}
    return {k: (getattr(c, k), n) for k in c.to_dict() if k.endswith("_layers") and k not in LAYER_KEYS
            and type(getattr(c, k, None)) is int}


def _counts_kept(cfg: dict[str, Any], trial: dict[str, Any]) -> bool:
    """Every layer-count field stands where it stood against the layer count: none, some (strictly between), or
    all of the layers. Dory's ``n_input_layers`` + ``n_recurrent_layers`` + ``n_output_layers`` make up the
    layer count (configuration_dory.py ``validate_architecture``): one of them set alone leaves another at
    every layer or none, which drops a kind of layer no per-layer field names."""
    from .derive import hf_config

    def where(v: int, n: int) -> int:
        return 0 if v <= 0 else 2 if v >= n else 1

    given, small = _layer_count_fields(hf_config(cfg)), _layer_count_fields(hf_config(trial))
    return all(k in small and where(*small[k]) == where(*v) for k, v in given.items())


def _cut_at(cfg, out, full, fields, layers_key, n, log) -> dict[str, Any]:
    """``out`` cut to its first ``n`` layers: the given per-layer fields cut, the derived ones left to the
    class when it derives the cut, else stated."""
    from .derive import hf_config

    total = full[layers_key]
    out = {**out, _given_key(cfg, layers_key): n}
    cut = {k: _cut(out.get(k, full[k]), how, n, total) for k, how in fields.items()}  # given: as shrunk
    trial = {**out, **{k: v for k, v in cut.items() if k in cfg}}  # given lists: cut
    for k in [k for k in fields if k not in cfg and not _is_property(cfg, k)]:  # derived: the class's, if it derives the cut
        try:
            derived = hf_config(trial).to_dict().get(k)
        except Exception:  # noqa: BLE001 - it cannot derive at n: state it
            derived = None
        if _same(derived, cut[k]):
            continue
        log(f"  shrink: {k} stated for the {n} kept layers (the class derives another list at {n} layers)")
        trial[k] = cut[k]
    if n > 2:
        log(f"  shrink: {n} layers keep every kind of layer of the {total}")
    return trial


def _col(v, how, i, total):
    if how == "list":
        return v[i]
    if how == "indices":
        return i in v
    return any(_index_key(k, total) == i for k in v)


def _given_key(cfg: dict[str, Any], layers_key: str) -> str:
    """The key the config itself uses for the layer count (an alias of the class's ``attribute_map``)."""
    return next((k for k in LAYER_KEYS if k in cfg), layers_key)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return {str(k): v for k, v in a.items()} == {str(k): v for k, v in b.items()}
    return a == b


def _token_ids(out: dict[str, Any], full: dict[str, Any]) -> None:
    """Token ids, given or the class's defaults (Phi3Config's ``pad_token_id`` 32000), inside the tiny vocabulary:
    ``nn.Embedding`` asserts ``padding_idx < num_embeddings`` (torch/nn/modules/sparse.py)."""
    vocab = out.get("vocab_size")
    if not isinstance(vocab, int):
        return
    for k, v in {**full, **out}.items():
        if k.endswith("_token_id") and (isinstance(v, list) or type(v) is int and v >= vocab):
            out[k] = 0 if k == "pad_token_id" else None


# --------------------------------------------------------------------------- per-dimension lists


def _rope_dicts(cfg: dict[str, Any]):
    """The rope parameter dicts of ``cfg`` (one, or one per layer type, as gemma-3's), with their head size."""
    for key in ("rope_parameters", "rope_scaling"):
        rp = cfg.get(key)
        if not isinstance(rp, dict):
            continue
        if any(isinstance(x, dict) for x in rp.values()):
            yield from (x for x in rp.values() if isinstance(x, dict))
        else:
            yield rp


def rotary_half(resolved: dict[str, Any], rp: dict[str, Any]) -> int | None:
    """``int(head_dim * partial_rotary_factor) // 2``, longrope's factor count (modeling_rope_utils.py)."""
    heads = resolved.get("num_attention_heads")
    head_dim = resolved.get("head_dim") or (resolved.get("hidden_size", 0) // heads if heads else None)
    if not head_dim:
        return None
    prf = rp.get("partial_rotary_factor", resolved.get("partial_rotary_factor", 1.0)) or 1.0
    return int(head_dim * prf) // 2


def _even_rotary(out: dict[str, Any], full: dict[str, Any]) -> None:
    """A shrunk ``head_dim`` raised by 2 (at most to the given one) while ``int(head_dim * partial_rotary_factor)`` is
    odd, as published configs never have it (:func:`.derive.typical`; MiMo-V2-Flash: 192 · 0.334 -> 64, 16 -> 5)."""
    hd, given = out.get("head_dim"), full.get("head_dim")
    fs = [f for f in [out.get("partial_rotary_factor")] + [rp.get("partial_rotary_factor") for rp in _rope_dicts(out)]
          if isinstance(f, float) and 0 < f < 1]
    while type(hd) is int and type(given) is int and hd < given and any(int(hd * f) % 2 for f in fs):
        out["head_dim"] = hd = hd + 2


def _resize_factor_lists(out: dict[str, Any], full: dict[str, Any]) -> None:
    from .derive import hf_config

    if not any(isinstance(rp.get(f), list) for rp in _rope_dicts(out) for f in FACTOR_LISTS):
        return
    try:
        small = hf_config({k: v for k, v in out.items() if k not in ("rope_parameters", "rope_scaling")}).to_dict()
    except Exception:  # noqa: BLE001
        small = {**full, **out}
    for rp in _rope_dicts(out):
        want = rotary_half({**small, **{k: out[k] for k in out if not isinstance(out[k], dict)}}, rp)
        for f in FACTOR_LISTS:
            vals = rp.get(f)
            if isinstance(vals, list) and want and len(vals) != want:
                rp[f] = [vals[j * len(vals) // want] for j in range(want)]  # evenly resampled, first kept


# --------------------------------------------------------------------------- repair


def _repair(cfg: dict[str, Any], out: dict[str, Any], first: Exception, log) -> dict[str, Any]:
    """The shrunk config with one field left to the class (it derives it) or kept at its size, whichever
    the class accepts first; else the error."""
    from .derive import hf_config

    tries: list[tuple[str, dict[str, Any]]] = []
    for k in out:
        if k in SMALL and k in cfg and out[k] != cfg[k]:
            tries.append((f"{k} left to the class", {x: v for x, v in out.items() if x != k}))
    for k in out:
        if k in SMALL and k in cfg and out[k] != cfg[k]:
            tries.append((f"{k} kept at {cfg[k]}", {**out, k: cfg[k]}))
    ids = {k: 0 for k, v in out.items() if k.endswith("_token_id") and v is None and cfg.get(k, 0) is not None}
    if ids:  # a class that types its token ids as int (CwmConfig: "Field 'bos_token_id' expected int")
        tries.insert(0, ("token ids inside the vocabulary set to 0", {**out, **ids}))
    small = sorted({v for k, v in out.items() if k in SMALL and type(v) is int})
    for k in out:  # a relation of two shrunk widths (DotsNote: num_key_value_heads == num_attention_heads)
        if k in SMALL and k in cfg and out[k] != cfg[k]:
            tries += [(f"{k} = {v}", {**out, k: v}) for v in small if v != out[k]]
    for what, trial in tries:
        try:
            hf_config(trial)
        except Exception:  # noqa: BLE001
            continue
        log(f"  shrink: {what} (the class rejects the tiny widths otherwise)")
        return trial
    changed = sorted(k for k in out if k in cfg and out[k] != cfg[k])
    raise FitplanError(f"the config class rejects every shrunk config of this type: {first_line(first)}",
                       field=", ".join(changed) or "model_type", value=cfg.get("model_type"),
                       suggestion="--no-shrink learns it at its own size")
