"""Layer patterns: which decoder layers are of which kind, as a rule over the layer index and the config.

Many architectures alternate layer kinds (sliding / global attention, dense / MoE MLP, layers without
rotary embeddings). The learner finds them from the model's own structure: it builds the model (no
forward, tiny widths, a few more layers) for several configs and writes a signature per layer (module
classes, parameter shapes, the modules' plain attributes such as ``sliding_window`` or ``use_rope``).
Each top-level part of a layer whose signature varies is a *feature*; a feature's value per layer is then
explained by the first rule of a small template family that holds over every config tried:

* a list field of the config: ``layer_types[i] == "sliding_attention"``, ``i in mlp_only_layers``,
  ``no_rope_layers[i]``;
* an integer field P: ``i >= P``, ``i < P``, ``(i + 1) % P == 0``, ``i % P == 0``, ``(i + 1) % P != 0``, and with
  a second one Q, ``i % P == Q`` (a period and an offset: Jamba's attention and expert layers).

When the config class derives a list (``layer_types``) from integer fields, the rule is written for both
cases: ``(rule on the list) if layer_types is not None else (rule on the integers)``. When no single rule holds,
the integer fields that move layers from one kind to another (found by varying each, sizes included: ERNIE's
start and end index) are varied together and the rule is a conjunction of rules over them (:func:`_conjunction`);
those fields are then layer positions, not sizes. A part of n forms gets n - 1 rules, each separating one form
from the rest (NemotronH's four mixers). The file's layer ``kind`` expression joins the features
(:func:`kind_expression`); :mod:`.derive` then records one layer of each kind.
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from .layercounts import fit_to_class

from .patternsearch import (_conjunction, _cover, components, constant_rules, last_of_kind_rules,  # noqa: F401
                            held_fields, pattern_lists, restated_count, rule_for, split_observed, split_rule,
                            stated_rule, tail_rules)


class PatternError(ValueError):
    """A layer pattern the templates above cannot express (``fitplan learn-architecture`` refuses the type,
    naming the layer part): no rule of the family, nor a conjunction of them, places one of its forms."""

SKIP_ATTRS = {"training", "_is_hf_initialized", "layer_idx", "_modules", "_parameters", "_buffers"}
N_LAYERS = 8
N_LAYERS_ALT = 12
"""A second layer count the observations include, where a rule over constants fitted at ``N_LAYERS`` alone (``i % 8
== 0`` for the first layer) fails."""


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


CONFIG_NUMBERS: set = set()


def _mask(attrs: dict[str, Any]) -> dict[str, Any]:
    """Numbers copied from the config (a window, a scale) change with the config, not with the kind of
    layer: keep only that they are set; flags, names and per-layer values (``is_sliding``, ``layer_type``,
    ``use_rope``) stay."""
    return {k: ("#" if isinstance(v, (int, float)) and not isinstance(v, bool) and v in CONFIG_NUMBERS else v)
            for k, v in attrs.items()}


def layer_structure(cfg: dict[str, Any], n_layers: int) -> list[dict[str, list]]:
    """Per layer: {top-level part: [(module name, class, plain attributes, parameter shapes)]} (the layer's
    own attributes under ``.``)."""
    from .derive import build
    from .record import decoder_layers

    c = copy.deepcopy(cfg)
    _set_layers(c, n_layers)
    _accepted_at(c, n_layers)
    try:
        model, _ = build(c, "16", "sdpa")
    except ValueError:  # a model without SDPA support (Gemma-2)
        model, _ = build(c, "16", "eager")
    out = []
    for layer in decoder_layers(model):
        parts: dict[str, list] = {}
        own = {k: v for k, v in vars(layer).items() if k not in SKIP_ATTRS and not k.startswith("_") and _scalar(v)}
        parts["."] = [["", type(layer).__name__, own, {}]]
        for name, child in layer.named_children():
            mods = []
            for sub_name, sub in child.named_modules():
                attrs = {k: v for k, v in vars(sub).items() if k not in SKIP_ATTRS and not k.startswith("_") and _scalar(v)}
                params = {k: tuple(p.shape) for k, p in sub.named_parameters(recurse=False)}
                mods.append([sub_name, type(sub).__name__, attrs, params])
            parts[name] = mods
        out.append(parts)
    return out


class Projection:
    """What distinguishes the layers of one config, applied to any config: per part, the module classes and
    parameter shapes, and the attributes whose values differ between that config's layers (numbers kept
    only as "set": a window copied from the config changes with the config, not with the kind of layer;
    0/1 flags such as ``use_rope`` are kept). An attribute equal to the layer's own index in every layer is
    its position, not its kind, whatever its name (``SKIP_ATTRS`` has ``layer_idx``; GPT-Neo's attention keeps
    ``self.layer_id = layer_id``: transformers/models/gpt_neo/modeling_gpt_neo.py)."""

    def __init__(self, base: list[dict[str, list]]) -> None:
        self.keys: dict[str, set] = {}
        for part in sorted({k for layer in base for k in layer}):
            seen: dict[tuple, set] = {}
            index: dict[tuple, bool] = {}
            for i, layer in enumerate(base):
                for name, cls, attrs, params in layer.get(part, []):
                    for k, v in attrs.items():
                        seen.setdefault((name, k), set()).add(json.dumps(v, default=str))
                        index[(name, k)] = index.get((name, k), True) and v == i and not isinstance(v, bool)
            self.keys[part] = {key for key, vals in seen.items() if len(vals) > 1 and not index[key]}

    @staticmethod
    def _norm(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, (int, float)):
            return v if v in (0, 1) else "#"
        return str(v)

    def __call__(self, layer: dict[str, list]) -> dict[str, str]:
        out = {}
        for part, keys in self.keys.items():
            mods = layer.get(part, [])
            sig = [[name, cls, {k: self._norm(v) for k, v in attrs.items() if (name, k) in keys}, params]
                   for name, cls, attrs, params in mods]
            out[part] = json.dumps(sig, sort_keys=True, default=str)
        return out


PROJECT: list[Projection] = []


def layer_features(cfg: dict[str, Any], n_layers: int) -> list[dict[str, str]]:
    """Per layer: {part: signature} under the current projection (see :class:`Projection`)."""
    raw = layer_structure(cfg, n_layers)
    if not PROJECT:
        return [{k: json.dumps(v, sort_keys=True, default=str) for k, v in layer.items()} for layer in raw]
    return [PROJECT[-1](layer) for layer in raw]


def _accepted_at(c: dict[str, Any], n: int) -> None:
    """:raises PatternError: the config class rejects ``c`` at ``n`` layers, a per-layer field that the layer
    count does not resize (gemma-3n's ``activation_sparsity_pattern``, one number per layer, which
    ``Gemma3nTextConfig.__post_init__`` requires to have ``num_hidden_layers`` entries:
    transformers/models/gemma3n/configuration_gemma3n.py, 5.24)."""
    from .layercounts import rejection

    why = rejection(c)  # the class's own message names the field (or the per-layer property that raises)
    if why is not None:
        raise PatternError(f"the config class rejects this config at {n} layers ({why}): a per-layer "
                           "field or a layer count that the layer pattern search cannot resize") from None


def with_layers(cfg: dict[str, Any], n: int) -> dict[str, Any]:
    """``cfg`` at ``n`` layers (:raises PatternError: the class rejects it there, :func:`_accepted_at`; Dory's
    section counts must add up to the layer count: configuration_dory.py ``validate_architecture``)."""
    c = copy.deepcopy(cfg)
    _set_layers(c, n)
    _accepted_at(c, n)
    return c


def _layer_types_key(cfg: dict[str, Any]) -> str:
    """The config's own name of ``layer_types``: the config class's ``attribute_map`` may alias it (Zamba2Config:
    ``"layer_types": "layers_block_type"``, transformers/models/zamba2/configuration_zamba2.py), and the class's
    ``validate_layer_type`` then checks that list's length against the layer count."""
    from .configrules import attribute_map, config_class

    try:
        return attribute_map(config_class(cfg["model_type"])).get("layer_types", "layer_types")
    except Exception:  # noqa: BLE001 - no class to ask: the standard name
        return "layer_types"


def _per_layer_kinds(k: str, v: list, count: Any, types_key: str) -> bool:
    """Is ``v`` (the config's ``k``) one entry per layer, to repeat at another layer count: ``layer_types``
    (under the class's own name), a 0/1 list named ``*_layers``, or a list of layer kinds (strings), one per
    current layer, of a field named for layers or kinds (GPT-Neo's ``attention_layers``, which the class takes as
    stated over the one it expands from ``attention_types``: transformers/models/gpt_neo/configuration_gpt_neo.py)
    or of any field where there are three layers or more (HYV4's ``indexer_types``, read per layer by
    ``HYV4Attention``: ``config.indexer_types[layer_idx]``, transformers/models/hy_v4/modeling_hy_v4.py; left at
    its length, the model built at more layers indexes past its end)."""
    if k == "mlp_only_layers" or not all(isinstance(x, (str, int, bool)) for x in v):
        return False
    if k in ("layer_types", types_key):
        return True
    if k.endswith(("layer_types", "_layers")) and all(isinstance(x, bool) or x in (0, 1) for x in v):
        return True
    named = "layer" in k or k.endswith("_types")
    return type(count) is int and len(v) == count and (named or count >= 3) and all(isinstance(x, str) for x in v)


def _set_layers(cfg: dict[str, Any], n: int) -> None:
    count = next((cfg[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if k in cfg), None)
    before = dict(cfg)
    for k in ("num_hidden_layers", "n_layer", "num_layers"):
        if k in cfg:
            cfg[k] = n
    # lists sized by the layer count (given explicitly) follow it: repeat their pattern
    types_key = _layer_types_key(cfg)
    for k, v in list(cfg.items()):
        if isinstance(v, list) and v and _per_layer_kinds(k, v, count, types_key):
            cfg[k] = [v[i % len(v)] for i in range(n)]
        elif isinstance(v, list) and _one_width(k, v, count):
            cfg[k] = [v[0]] * n  # gemma-3n's intermediate_size, one per layer, all alike once shrunk
    fit_to_class(before, cfg, count, n)  # what the class still rejects at n: Dory's sections, per-layer numbers


def _one_width(k: str, v: list, count: Any) -> bool:
    """Is ``v`` one number per layer, the same for every layer (of at least three, or of a field named for
    layers: Laguna's ``num_attention_heads_per_layer``, which LagunaConfig requires to have ``num_hidden_layers``
    entries, transformers/models/laguna/configuration_laguna.py)?"""
    return type(count) is int and (count >= 3 or "layer" in k) and len(v) == count and len(set(v)) == 1 and \
        all(type(x) in (int, float) for x in v)


def varying(feats: list[dict[str, str]]) -> list[str]:
    names = sorted({k for f in feats for k in f})
    return [k for k in names if len({f.get(k) for f in feats}) > 1]


DEFAULTS: dict[str, Any] = {}
"""The config class's own defaults (what the core sees for a list the config does not give)."""


def _given(c, f):
    """Whether the core sees a list for ``f``: the config's own value, else the class default (RecurrentGemma's
    ``block_types`` defaults to a 3-long list, Olmo3's ``layer_types`` to None, which the class then derives)."""
    return _lv(c, f) is not None


def _lv(c, f):
    """A list field as fitplan's core reads it: the config's own value, else the class default."""
    return c[0][f] if f in c[0] else DEFAULTS.get(f)


def candidates(cfg: dict[str, Any], ints: list[str], lists: list[str], resolved: dict[str, Any]) -> list[tuple[str, Any]]:
    """Boolean rules over (layer index, config): ``(expression, predicate(i, given config, resolved config))``.

    A rule on a list applies when the config gives the list; when it does not, the class derived it, so
    the rule falls back to one on integers or constants (written ``(list rule) if L is not None else (...)``)."""
    simple = _int_rules(ints)
    out: list[tuple[str, Any]] = list(simple)
    for f, list_rules in list_rule_sets(lists, resolved).items():
        out.extend(list_rules)
        for le, lf in list_rules:
            for se, sf in simple:
                # membership combined with an integer rule (qwen2_moe: in mlp_only_layers or off the step)
                out.append((f"({le}) and ({se})", lambda i, c, lf=lf, sf=sf: lf(i, c) and sf(i, c)))
                out.append((f"({le}) or ({se})", lambda i, c, lf=lf, sf=sf: lf(i, c) or sf(i, c)))
        for le, lf in list_rules:
            for se, sf in simple:
                # the list rule when the config gives the list, the fallback when the class derives it
                out.append((f"({le}) if {f} is not None else ({se})",
                            lambda i, c, f=f, lf=lf, sf=sf: lf(i, c) if _given(c, f) else sf(i, c)))
    return out


def list_rule_sets(lists: list[str], resolved: dict[str, Any]) -> dict[str, list[tuple[str, Any]]]:
    """Per list field, the rules on it alone: one per value of a list of layer kinds (its entry at ``i``, or at ``i``
    modulo its length), or membership and truth for a list of indices or flags."""
    out = {}
    for f in lists:
        vals = resolved.get(f)
        if not isinstance(vals, list):
            continue
        if vals and all(isinstance(x, str) for x in vals):
            list_rules = [(f'{f}[i] == "{x}"', lambda i, c, f=f, x=x: _lv(c, f)[i] == x) for x in sorted(set(vals))]
            # a list shorter than the layers, cycled by the class (RecurrentGemmaConfig.layers_block_type:
            # ``(block_types * 100)[:num_hidden_layers]``, configuration_recurrent_gemma.py)
            list_rules += [(f'{f}[i % len({f})] == "{x}"', lambda i, c, f=f, x=x: _lv(c, f)[i % len(_lv(c, f))] == x)
                           for x in sorted(set(vals))]
        else:
            list_rules = [(f"i in {f}", lambda i, c, f=f: i in (_lv(c, f) or ())),
                          (f"i not in {f}", lambda i, c, f=f: i not in (_lv(c, f) or ())),
                          (f"bool({f}[i])", lambda i, c, f=f: bool(_lv(c, f)[i])),
                          (f"not {f}[i]", lambda i, c, f=f: not _lv(c, f)[i])]
        out[f] = list_rules
    return out


def _int_rules(ints: list[str], bounds: bool = False) -> list[tuple[str, Any]]:
    """The rules over the layer index and integer fields (and constants), each with its negation; ``bounds``, for
    the conjunctions of :func:`_conjunction`, adds ``i > P`` (negated: ``i <= P``, ERNIE-4.5-MoE's end index) and
    leaves out the rules that read no field (constant periods could carve any few layers of one config)."""
    base: list[tuple[str, Any]] = []
    for p in ints:
        base.append((f"i >= {p}", lambda i, c, p=p: i >= c[1][p]))
        base.append((f"i < {p}", lambda i, c, p=p: i < c[1][p]))
        base.append((f"(i + 1) % {p} == 0", lambda i, c, p=p: c[1][p] != 0 and (i + 1) % c[1][p] == 0))
        base.append((f"i % {p} == 0", lambda i, c, p=p: c[1][p] != 0 and i % c[1][p] == 0))
        if bounds:
            base.append((f"i > {p}", lambda i, c, p=p: i > c[1][p]))
    for p, q in itertools.permutations(ints, 2):
        # a period and an offset (JambaConfig.layers_block_type: ``i % attn_layer_period == attn_layer_offset``)
        base.append((f"i % {p} == {q}", lambda i, c, p=p, q=q: c[1][p] != 0 and i % c[1][p] == c[1][q]))
    for k in () if bounds else (2, 3, 4, 5, 6, 8):
        base.append((f"(i + 1) % {k} == 0", lambda i, c, k=k: (i + 1) % k == 0))
        base.append((f"i % {k} == 0", lambda i, c, k=k: i % k == 0))
    if not bounds:
        base.append(("True", lambda i, c: True))
    return base + [(f"not ({e})", lambda i, c, f=f: not f(i, c)) for e, f in base]


def _vary(cfg: dict[str, Any], fields: list[str], observe, observed, names: list[str], moved: list[str]) -> None:
    """Observe ``cfg`` with each of ``fields`` set to 1, 2, 3, 4 in turn; a field whose value moves a layer from
    one kind to another joins ``moved`` (``observed[0]`` is ``cfg`` itself)."""
    for f in fields:
        for v in (1, 2, 3, 4):
            n = len(observed)
            observe({**cfg, f: v}, field=f if v != cfg.get(f) else None)
            if len(observed) > n and n and _kinds(observed[-1], names) != _kinds(observed[0], names) \
                    and f not in moved:
                moved.append(f)


def _kinds(obs, names: list[str]) -> tuple:
    """One observation's layer forms (its layer count included)."""
    return tuple(tuple(f.get(n) for n in names) for f in obs[2])


def feats_layers(cfg):
    from .derive import hf_config

    return range(int(hf_config(cfg).to_dict().get("num_hidden_layers") or 0))


def learn_pattern(cfg: dict[str, Any], variables: list[str], log) -> dict[str, Any] | None:
    """The layer-kind rule for ``cfg``'s model type, or None when every layer is alike.

    Returns ``{"rules": {feature: expression}, "record_layers": n, "cfg": config to record}``."""
    from .derive import hf_config

    restated_count(cfg)
    PROJECT.clear()
    PROJECT.append(Projection(layer_structure(cfg, N_LAYERS)))
    feats = layer_features(cfg, N_LAYERS)
    names = varying(feats)
    if not names:
        for f, v in _structural_ints(cfg, variables):
            for alt in (1, 2, 3):
                trial = {**cfg, f: alt}
                try:
                    fe = layer_features(trial, N_LAYERS)
                except Exception:  # noqa: BLE001
                    continue
                if varying(fe):
                    log(f"    layers alike at {f}={v}, not at {f}={alt}")
                    return learn_pattern(trial, variables, log)
        return None
    from .configrules import class_defaults

    resolved = hf_config(cfg).to_dict()
    DEFAULTS.clear()
    DEFAULTS.update(class_defaults(type(hf_config(cfg))))
    lists = pattern_lists(resolved)
    ints = [k for k, _ in _structural_ints(cfg, variables)]
    no_lists = {k: v for k, v in cfg.items() if k not in lists}  # widths per layer kept: not a pattern
    observed = []  # (config as given, resolved config, layer features)

    forms = {name: {f.get(name) for f in feats} for name in names}

    novel: dict[str, list[bool]] = {}  # a varied field -> per value the class accepts: a form the base lacks?

    def observe(c, n=N_LAYERS, field=None):
        try:
            used = with_layers(c, n)
            fe = layer_features(c, n)
            observed.append((used, hf_config(used).to_dict(), fe))
        except Exception:  # noqa: BLE001 - a value the class rejects
            return
        new = any(f.get(name) not in forms[name] for f in fe for name in names)
        if field is not None:
            novel.setdefault(field, []).append(new)
        if new:
            # a form the base config's layers do not have: the varied value shows in every layer of one kind
            # (Cohere2's sliding_window = 1 is kept as a 0/1 flag by the projection), so this config says
            # nothing about which layer is which kind
            observed.pop()

    # lists absent (the class derives them from integers or constants), integers varied
    observe(no_lists)
    moved: list[str] = []  # the integers whose value moves a layer from one kind to another
    _vary(no_lists, ints, observe, observed, names, moved)
    # lists given explicitly
    import random

    rnd = random.Random(0)
    for f in lists:
        base = resolved.get(f)
        if not isinstance(base, list):
            continue
        if base and all(isinstance(x, str) for x in base):
            vals = sorted(set(base))
            if len(vals) < 2:
                continue
            for _ in range(8):
                observe({**cfg, f: [rnd.choice(vals) for _ in range(N_LAYERS)]})
            for _ in range(4):  # shorter than the layers: cycled by a class that allows it, else refused
                observe({**cfg, f: [rnd.choice(vals) for _ in range(3)]})
        elif all(isinstance(x, (int, bool)) and x in (0, 1) for x in base) and len(base) == len(feats_layers(cfg)):
            for _ in range(6):
                observe({**cfg, f: [rnd.choice((0, 1)) for _ in range(N_LAYERS)]})
        elif any(type(x) is float for x in base):  # one number per layer (gemma-3n's sparsity): its values shuffled
            for _ in range(6):
                observe({**cfg, f: [rnd.choice(sorted(set(base))) for _ in range(N_LAYERS)]})
        else:  # a list of layer indices
            for _ in range(6):
                observe({**cfg, f: sorted(rnd.sample(range(N_LAYERS), rnd.randint(0, 3)))})
        flags = bool(base) and all(isinstance(x, (int, bool)) and x in (0, 1) for x in base) and \
            len(base) == len(feats_layers(cfg))
        for p in ints:  # a given list together with other integers
            for v in (2, 3):
                if base and all(isinstance(x, str) for x in base):
                    continue
                given = [rnd.choice((0, 1)) for _ in range(N_LAYERS)] if flags else sorted(rnd.sample(range(N_LAYERS), 2))
                observe({**cfg, p: v, f: given})
    observe(no_lists, N_LAYERS_ALT)  # the same configs at another layer count (see N_LAYERS_ALT)
    observe(cfg, N_LAYERS_ALT)
    rules: dict[str, Any] = {}
    cands = candidates(cfg, ints, lists, resolved)
    joint: list[bool] = []

    def widen():
        """A condition over several fields (ERNIE-4.5-MoE: ``(i + 1) % moe_layer_interval == 0 and i >=
        moe_layer_start_index and i <= moe_layer_end_index``, modeling_ernie4_5_moe.py): a field taken for a size
        may be a layer index (ERNIE's start and end, Inkling2's ``n_layers_per_attn_res_block``), so each is varied
        the same way, then the fields that move layers together."""
        if not joint:
            _vary(no_lists, [v for v in variables if v not in moved], observe, observed, names, moved)
            for _ in range(16):
                observe({**no_lists, **{f: rnd.randint(0, N_LAYERS - 1) for f in moved}})
            joint.append(True)
        return moved

    layer_key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in resolved), "num_hidden_layers")
    search = _Search(cands + tail_rules(ints, layer_key), ints, list_rule_sets(lists, resolved), widen, layer_key)
    search.stated = last_of_kind_rules(lists, resolved, ints, layer_key, _lv)
    for name in names:
        values = sorted({f.get(name) for f in feats}, key=str)
        found = search.part(name, values, observed)
        if found is None:  # the part's form is a product of independent switches: a rule per component
            comps, split = split_observed(name, observed)
            found = {}
            for comp in comps:
                vals = sorted({components(f.get(name)).get(comp) for f in feats}, key=str)
                got = search.part(comp, vals, split) if len(vals) > 1 else None
                found[f"{name}/{comp}"] = got[comp] if got else None
            if not found or None in found.values():
                raise PatternError(f"no rule of the layer-pattern family explains which layers have which {name!r}"
                                   f" ({len(values)} forms)")
        rules.update(found)
        log(f"    layer feature {name}: {found}")
    kinds_seen: dict[tuple, int] = {}
    for i, f in enumerate(feats):
        kinds_seen.setdefault(tuple(f.get(n) for n in names), i)
    return {"rules": rules, "names": names, "record_layers": max(2, max(kinds_seen.values()) + 1), "cfg": cfg,
            "positions": [v for v in moved if v in variables], "held": held_fields(ints, novel, resolved, log)}


class _Search:
    """One rule per form of a part (a part of two forms: one rule; NemotronH's mixer, four forms: three): the
    template family first, then a conjunction over the fields that move layers (:meth:`widen` varies them), then
    :mod:`.patternsearch`'s rules on a list or what the class derives without it, over constants too."""

    def __init__(self, cands, ints: list[str], lists: dict[str, list], widen, layer_key: str) -> None:
        self.cands, self.ints, self.lists, self.widen, self.layer_key = cands, ints, lists, widen, layer_key
        self.stated: list[tuple[str, Any]] = []
        """Rules on a list that only a config stating it can read (:func:`.patternsearch.stated_rule`)."""

    def part(self, name: str, values: list, observed) -> dict[str, Any] | None:
        """``{name: rule}`` (``{name: [rules]}`` for more than two forms), or None when a form has no rule."""
        out = []
        for a in values[:-1]:
            rule = self.form(name, a, observed)
            if rule is None:
                return None
            out.append(rule)
        return {name: out[0] if len(values) == 2 else out}

    def form(self, name: str, a: str, observed) -> str | None:
        rule = _fit(name, a, observed, self.cands)
        if rule is not None:
            return rule
        moved = self.widen()
        if moved:
            rule = _conjunction(name, a, observed, _int_rules(moved, bounds=True))
        if rule is not None:
            return rule
        fields = self.ints + [m for m in moved if m not in self.ints]
        ext = _int_rules(fields, bounds=True) + constant_rules(moved, N_LAYERS, self.layer_key)
        return (split_rule(name, a, observed, self.lists, ext, _given, _fit, _conjunction)
                or rule_for(name, a, observed, ext, _fit, _conjunction)
                or stated_rule(name, a, observed, self.lists, self.stated + ext + tail_rules(fields, self.layer_key),
                               _given, _fit, _conjunction))


def kind_expression(rules: dict[str, Any]) -> str:
    """The file's layer ``kind`` expression: per feature, ``"1"``/``"0"`` for a two-form rule (as before), or for a
    part of n forms the index of the first of its n - 1 one-against-the-rest rules that holds (``"n-1"`` when none
    does); the features joined by ``'|'``."""
    def one(r: Any) -> str:
        if isinstance(r, str):
            return f'("1" if ({r}) else "0")'
        out = f'"{len(r)}"'
        for k in reversed(range(len(r))):
            out = f'("{k}" if ({r[k]}) else {out})'
        return out

    return " + '|' + ".join(one(r) for r in rules.values())


def _structural_ints(cfg: dict[str, Any], variables: list[str]) -> list[tuple[str, int]]:
    from .derive import hf_config

    resolved = hf_config(cfg).to_dict()
    out = []
    for k, v in resolved.items():
        if isinstance(v, bool) or not isinstance(v, int) or k in variables or k.endswith("_token_id"):
            continue
        if k in ("num_hidden_layers", "n_layer", "max_position_embeddings", "n_positions", "chunk_size_feed_forward"):
            continue
        out.append((k, v))
    return out


def _fit(name: str, a: str, observed, cands):
    for expr, pred in cands:
        ok = bool(observed)
        for given, rc, fe in observed:
            for i, f in enumerate(fe):
                try:
                    p = bool(pred(i, (given, rc)))
                except (IndexError, KeyError, TypeError, ZeroDivisionError):
                    ok = False
                    break
                if p != (f.get(name) == a):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            return expr
    return None
