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
        if on_list is None:
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

