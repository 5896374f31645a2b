"""The second search for a layer form that the first templates of :mod:`.patterns` do not place.

:func:`.patterns.learn_pattern` first looks for one rule of its template family per form of a layer part. Where none
holds, the model code usually decides the form in one of three ways the family lacks (transformers 5.24):

* **a list the config states, or else the class derives from constants**: BeamConfig's ``mlp_layer_types`` (``"dense"``
  for the first ``min(3, num_hidden_layers)`` layers, configuration_beam.py), DeepseekV4Config's ``mlp_layer_types``
  (``"hash_moe"`` for the first ``default_num_hash_layers = 3``, configuration_deepseek_v4.py), MllamaTextConfig's
  ``cross_attention_layers`` (``[3, 8, 13, ..., 38]``, configuration_mllama.py), ZambaConfig's ``layers_block_type``
  (``"hybrid"`` at layer 2, then at ``i % attn_layer_period == attn_layer_offset`` counted from layer 3,
  configuration_zamba.py). The rule is fitted on the two sets of observations apart (:func:`split_rule`): one on the
  list where the config gives it, one over constants and integer fields where the class derives it, joined as
  ``(list rule) if L is not None else (derived rule)``;
* **a part whose form is a product of independent switches**: Inkling2's decoder layer class (``layer_types[i] ==
  "hybrid_sliding"``) and its ``is_block_boundary = layer_idx % n_layers_per_attn_res_block == 0``
  (modeling_inkling2.py): three forms of ``.`` that no single one-against-the-rest rule separates. The part is split
  into its components (:func:`components`: each module's class and parameter shapes, each varying attribute), and
  each component gets its own rule; together they place the same layers as the part's forms;
* **constants of the class code** (:func:`constant_rules`): ``i < 3``, ``i == 0`` (Inkling2's first layer has no
  ``attention_input``), the last layer (``i == num_hidden_layers - 1``: BeamConfig forces it to full attention),
  ``i % 5 == 3``, and a period with an offset counted from a constant layer.

Constants fitted at one layer count could carve any few layers, so the observations include configs at a second
layer count (:data:`.patterns.N_LAYERS_ALT`), where such a carving fails.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def components(sig: str | None) -> dict[str, str]:
    """A part's signature (:class:`.patterns.Projection`'s JSON list of ``[module, class, attributes, parameter
    shapes]``) split into components: per module its class and parameter shapes, per attribute its value. A module
    the layer lacks has no components (read back as None)."""
    if sig is None:
        return {}
    out = {}
    for name, cls, attrs, params in json.loads(sig):
        out[f"{name}:class"] = json.dumps([cls, params], sort_keys=True)
        for k, v in attrs.items():
            out[f"{name}.{k}"] = json.dumps(v, sort_keys=True)
    return out


def pattern_lists(resolved: dict[str, Any]) -> list[str]:
    """The resolved config's list fields that may say which layer is of which kind: lists of kinds, flags, layer
    indices, or one number per layer that differs between layers (gemma-3n's ``activation_sparsity_pattern``:
    ``Gemma3nTextMLP`` adds a Gaussian top-k where ``activation_sparsity_pattern[layer_idx] > 0``,
    modeling_gemma3n.py); one width for every layer (gemma-3n's ``intermediate_size``) is a size, not a pattern,
    and stays stated when the others are left out."""
    count = next((resolved[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if k in resolved), None)
    out = []
    for k, v in resolved.items():
        if not isinstance(v, list) or k == "architectures" or not all(isinstance(x, (str, int, bool, float)) for x in v):
            continue
        if _one_width(v, count) and not all(x in (0, 1) for x in v):
            continue
        if any(type(x) is float for x in v) and not (type(count) is int and len(v) == count and len(set(v)) > 1):
            continue
        out.append(k)
    return out


def _one_width(v: list, count: Any) -> bool:
    """One number per layer of ``count``, the same for each."""
    return type(count) is int and len(v) == count and len(set(v)) == 1 and all(type(x) in (int, float) for x in v)


def split_observed(name: str, observed) -> tuple[list[str], list]:
    """The components of part ``name`` that vary, and ``observed`` with each layer's features replaced by them."""
    split = [(given, rc, [components(f.get(name)) for f in fe]) for given, rc, fe in observed]
    keys = sorted({k for _, _, fe in split for f in fe for k in f})
    varying = [k for k in keys if len({f.get(k) for _, _, fe in split for f in fe}) > 1]
    return varying, split


def _layer_count(rc: dict[str, Any]) -> int:
    return next(rc[k] for k in LAYER_KEYS if isinstance(rc.get(k), int))


def constant_rules(ints: list[str], n_layers: int, layer_key: str) -> list[tuple[str, Any]]:
    """Rules over the layer index and constants of the class code, each with its negation: ``i == K``, ``i < K``,
    ``i % k == r`` (k up to 8), the last layer, and ``i >= K and (i - K) % P == Q`` for integer fields P, Q (Zamba's
    period and offset counted from layer 3)."""
    base: list[tuple[str, Any]] = []
    for k in range(n_layers):
        base.append((f"i == {k}", lambda i, c, k=k: i == k))
        if k:
            base.append((f"i < {k}", lambda i, c, k=k: i < k))
    for k in range(2, 9):
        for r in range(k):
            base.append((f"i % {k} == {r}", lambda i, c, k=k, r=r: i % k == r))
    base.append((f"i == {layer_key} - 1", lambda i, c: i == _layer_count(c[1]) - 1))
    for (p, q), k in itertools.product(itertools.permutations(ints, 2), range(1, 5)):
        base.append((f"i >= {k} and (i - {k}) % {p} == {q}",
                     lambda i, c, p=p, q=q, k=k: c[1][p] != 0 and i >= k and (i - k) % c[1][p] == c[1][q]))
    return base + [(f"not ({e})", lambda i, c, f=f: not f(i, c)) for e, f in base]


def rule_for(name: str, a: str, observed, rules, fit, conjunction) -> str | None:
    """One rule of ``rules`` that places the layers whose ``name`` is ``a`` over ``observed``, else a conjunction
    of them (``fit`` and ``conjunction``: :func:`.patterns._fit`, :func:`.patterns._conjunction`)."""
    if not observed:
        return None
    return fit(name, a, observed, rules) or conjunction(name, a, observed, rules)


def split_rule(name: str, a: str, observed, lists: dict[str, list], derived_rules, given, fit, conjunction):
    """``(list rule) if L is not None else (derived rule)``: per list field L (``lists``: L -> its rules), a rule
    on L over the observations where the config gives L (``given(c, L)``), and one of ``derived_rules`` (or a
    conjunction of them) over those where the class derives it; None when no list field gives both."""
    for f, list_rules in lists.items():
        stated = [o for o in observed if given((o[0], o[1]), f)]
        derived = [o for o in observed if not given((o[0], o[1]), f)]
        if not stated or not derived:
            continue
        on_list = fit(name, a, stated, list_rules)
        if on_list is None:  # the list and an integer field together (Flint: ``layer_idx not in mlp_only_layers and
            # (layer_idx + 1) % decoder_sparse_step == 0``, modeling_flint.py)
            on_list = conjunction(name, a, stated, list_rules + derived_rules)
        if on_list is None or f not in on_list:
            continue
        otherwise = rule_for(name, a, derived, derived_rules, fit, conjunction)
        if otherwise is not None:
            return f"({on_list}) if {f} is not None else ({otherwise})"
    return None


def _conjunction(name: str, a: str, observed, rules, most: int = 4) -> str | None:
    """A conjunction of at most ``most`` rules that holds exactly on the layers whose ``name`` is ``a`` (or the
    negation of one that holds exactly on the others), over every observation; None when there is none.

    Each term must hold on every layer of the wanted form (a necessary condition); terms are then taken greedily,
    the one ruling out most of the remaining other layers first, until none is left (a set cover)."""
    points = [(i, (given, rc), f.get(name) == a) for given, rc, fe in observed for i, f in enumerate(fe)]
    best: tuple[list[str], bool] | None = None
    for negate in (False, True):
        terms = _cover(points, rules, negate, most)
        if terms is not None and (best is None or len(terms) < len(best[0])):
            best = (terms, negate)
    if best is None:
        return None
    expr = " and ".join(f"({e})" for e in best[0])
    return f"not ({expr})" if best[1] else expr


def _cover(points, rules, negate: bool, most: int) -> list[str] | None:
    """The greedy cover of :func:`_conjunction`: terms true on every wanted point (``target != negate``) whose
    falsehoods together cover every other point."""
    def truth(pred, i, c):
        try:
            return bool(pred(i, c))
        except (IndexError, KeyError, TypeError, ZeroDivisionError):
            return None

    want = [(i, c) for i, c, t in points if t != negate]
    other = [(i, c) for i, c, t in points if t == negate]
    if not want or not other:
        return None
    necessary = []
    for e, pred in rules:
        if all(truth(pred, i, c) is True for i, c in want):
            vals = [truth(pred, i, c) for i, c in other]
            if None not in vals:
                necessary.append((e, frozenset(k for k, v in enumerate(vals) if not v)))
    left, terms = set(range(len(other))), []
    while left and len(terms) < most:
        e, kills = max(necessary, key=lambda r: len(r[1] & left), default=(None, frozenset()))
        if not kills & left:
            return None
        terms.append(e)
        left -= kills
    return None if left else terms



def _last_index(seq: list, x: Any, n: int) -> int:
    """The core's ``last_index`` (the file's rule is evaluated by the same function)."""
    from fitplan.api import compile_expr

    return compile_expr("last_index(L, x, n)")({"L": seq, "x": x, "n": n})


def tail_rules(ints: list[str], layer_key: str) -> list[tuple[str, Any]]:
    """``i >= L - P`` per integer field P, each with its negation: the last P layers (Gemma-3n's and Gemma-4's
    ``kv_sharing_modes``: the layers from ``num_hidden_layers - num_kv_shared_layers`` on reuse an earlier layer's
    K/V and have no K/V projections, transformers 5.24 models/gemma4/configuration_gemma4.py)."""
    base = [(f"i >= {layer_key} - {p}", lambda i, c, p=p: i >= _layer_count(c[1]) - c[1][p]) for p in ints]
    return base + [(f"not ({e})", lambda i, c, f=f: not f(i, c)) for e, f in base]


def last_of_kind_rules(lists: list[str], resolved: dict[str, Any], ints: list[str], layer_key: str, lv) -> \
        list[tuple[str, Any]]:
    """``i == last_index(L, L[i], end)`` per list of layer kinds L (its entries strings, two kinds or more): the layer
    is the last of its kind before ``end``, which is the layer count or the count less an integer field P (``lv``:
    how :mod:`.patterns` reads a list from an observation). Gemma-4's ``kv_sharing_modes`` marks ``"store"`` the last
    layer of each kind of ``layer_types[:num_hidden_layers - num_kv_shared_layers]``; its attention then keeps its K/V
    for the shared layers (``store_full_length_kv``, modeling_gemma4.py; Gemma-3n's the same, modeling_gemma3n.py)."""
    out: list[tuple[str, Any]] = []
    for f in lists:
        vals = resolved.get(f)
        if not isinstance(vals, list) or len(set(vals)) < 2 or not all(isinstance(x, str) for x in vals):
            continue
        ends = [(layer_key, lambda c: _layer_count(c[1]))]
        ends += [(f"{layer_key} - {p}", lambda c, p=p: _layer_count(c[1]) - c[1][p]) for p in ints]
        for end, n in ends:
            out.append((f"i == last_index({f}, {f}[i], {end})",
                        lambda i, c, f=f, n=n: i == _last_index(lv(c, f), lv(c, f)[i], n(c))))
    return out


def stated_rule(name: str, a: str, observed, lists: dict[str, list], extra, given, fit, conjunction) -> str | None:
    """A rule on a list L alone (``lists``: L -> its rules, with ``extra``: rules over integer fields and of the
    last of a kind, :func:`last_of_kind_rules`), fitted on the observations whose config states L: where no rule
    places the form when the class derives L (Gemma-3n's ``activation_sparsity_pattern``: ``[0.95] * 10`` then zeros
    above 10 layers, none below: configuration_gemma3n.py), the core refuses a config that leaves L out, naming it
    (:meth:`fitplan.arch.archfile.ArchFile.layer_kinds`); a published config states L (``to_dict`` writes it)."""
    for f, list_rules in lists.items():
        stated = [o for o in observed if given((o[0], o[1]), f)]
        if not stated:
            continue
        rules = list_rules + [(e, p) for e, p in extra if "last_index" not in e or f"last_index({f}," in e]
        rule = fit(name, a, stated, rules) or conjunction(name, a, stated, rules)
        if rule is not None and f in rule:
            return rule
    return None


def restated_count(cfg: dict[str, Any]) -> None:
    """:raises PatternError: the config class writes a layer count other than the one it builds (DoryConfig.to_dict
    writes each layer's attention and MLP as two ``layer_types`` entries and doubles ``num_hidden_layers``, which
    ``__post_init__`` halves back: configuration_dory.py). The core reads the count and lists as stated, so no rule
    over them places the layers the model builds."""
    from .derive import hf_config
    from .patterns import PatternError

    c = hf_config(cfg)
    for k in ("num_hidden_layers", "n_layer", "num_layers"):
        held, written = getattr(c, k, None), c.to_dict().get(k)
        if type(held) is int and type(written) is int and held != written:
            raise PatternError(f"the config class builds {held} layers where its config states {k} = {written} "
                               "(it rewrites the stated layer count and per-layer lists when it reads them): "
                               "the core reads them as stated")


def held_fields(ints: list[str], novel: dict[str, list[bool]], resolved: dict[str, Any], log) -> dict[str, Any]:
    """Integer fields whose every other value the class accepts builds a layer of a form the base config has none
    of (Gemma-4's ``num_kv_shared_layers``, 0 by default: any other value makes the last layers reuse K/V, without
    K/V projections, modeling_gemma4.py): the file has no graph for such a layer, so it serves the base value only
    (its ``held``: the core refuses another value, naming the field, with the command that learns that config)."""
    held = {f: resolved[f] for f in ints if novel.get(f) and all(novel[f])}
    if held:
        log(f"    held by the layer pattern (other values build layers of another form): {held}")
    return held
