"""Layer patterns and derived counts the learner could not express (issue #32): a part of more than two forms, a
condition over several integer fields, a layer's own index kept as an attribute, a default the config class
replaces by the layer count, a field the class copies from another. Each checked on a tiny config of a real
transformers 5.24 type that uses it (those tests need transformers: slow, marked by tests/conftest.py), and the
two searches on synthetic layers.

Expected values come from the config classes and the model code cited at each test (built by transformers and
read back), never from fitplan's output.
"""

from __future__ import annotations

import random

import pytest

from fitplan.arch.archexpr import compile_expr


def _defaults(model_type: str) -> dict:
    """The config class's defaults as a config.json states them."""
    from transformers import AutoConfig

    return {**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type}


def _kind(cfg: dict) -> str:
    """The layer ``kind`` expression the learner writes for ``cfg`` (shrunk, then resolved by the class, as
    ``learn_full`` does)."""
    from fitplan_torch.learn import derive, patterns
    from fitplan_torch.learn.shrink import shrink

    base = derive.hf_config(shrink(cfg)).to_dict()
    found = patterns.learn_pattern(base, derive.size_variables(base), lambda *a: None)
    assert found is not None, "every layer alike"
    return patterns.kind_expression(found["rules"])


def _same_partition(a: list, b: list) -> bool:
    """``a`` and ``b`` split the layers the same way (each value of one maps to exactly one value of the other)."""
    return len(set(zip(a, b))) == len(set(a)) == len(set(b))


# --------------------------------------------------------------------------- the searches, on synthetic layers


def _ernie_like(interval: int, start: int, end: int, n: int = 8) -> list[dict[str, str]]:
    return [{"mlp": "moe" if (i + 1) % interval == 0 and start <= i <= end else "dense"} for i in range(n)]


def test_a_conjunction_of_three_integer_conditions_is_found_and_holds_on_unseen_values():
    """Layers MoE exactly when ``(i + 1) % P == 0 and i >= S and i <= E`` (the condition of
    modeling_ernie4_5_moe.py, written here by hand): observed over random (P, S, E), the conjunction the search
    returns places every layer of configs it never saw, at another layer count too."""
    from fitplan_torch.learn import patterns

    rnd = random.Random(1)
    observed = []
    for _ in range(24):
        c = {"P": rnd.randint(1, 4), "S": rnd.randint(0, 7), "E": rnd.randint(0, 7)}
        observed.append((c, c, _ernie_like(c["P"], c["S"], c["E"])))
    expr = patterns._conjunction("mlp", "dense", observed, patterns._int_rules(["P", "S", "E"], bounds=True))
    assert expr is not None
    f = compile_expr(expr)
    for p, s, e in ((2, 3, 9), (3, 0, 11), (1, 5, 5), (5, 1, 10)):
        want = [x["mlp"] == "dense" for x in _ernie_like(p, s, e, n=12)]
        assert [bool(f({"P": p, "S": s, "E": e, "i": i})) for i in range(12)] == want, (expr, p, s, e)


def test_no_conjunction_is_claimed_where_none_of_the_rules_explains_the_layers():
    """Layers 1 and 6 of eight (no period, bound or offset of the family places exactly them): no rule."""
    from fitplan_torch.learn import patterns

    c = {"P": 2}
    feats = [{"mlp": "moe" if i in (1, 6) else "dense"} for i in range(8)]
    assert patterns._conjunction("mlp", "moe", [(c, c, feats)], patterns._int_rules(["P"], bounds=True)) is None


def test_a_part_of_n_forms_is_written_as_the_first_rule_that_holds():
    """Three one-against-the-rest rules place four forms: a layer takes the index of the first rule that holds,
    the last index where none does; a two-form part keeps the "1"/"0" of the bundled files."""
    from fitplan_torch.learn import patterns

    expr = patterns.kind_expression({"mixer": ['t[i] == "a"', 't[i] == "m"', 't[i] == "e"'], "norm": "i == 0"})
    types = ["a", "m", "e", "x", "m"]
    got = [compile_expr(expr)({"t": types, "i": i}) for i in range(5)]
    assert got == ["0|1", "1|0", "2|0", "3|0", "1|0"]


# --------------------------------------------------------------------------- real types


def test_gpt_neo_places_its_attention_layers_despite_the_layer_id_they_keep():
    """GPTNeoAttention and GPTNeoSelfAttention keep ``self.layer_id = layer_id`` (modeling_gpt_neo.py): four
    forms of ``attn`` (global / local × the index 0, 1 or "many"), so the learner refused the type ("layer part
    'attn' takes 4 forms"). An attribute equal to the layer's index is its position, not its kind: the rule
    reads ``attention_layers``, which GPTNeoConfig expands from ``attention_types`` (configuration_gpt_neo.py),
    and places a stated pattern that is not an alternation."""
    pytest.importorskip("transformers")
    from transformers import GPTNeoConfig

    f = compile_expr(_kind(_defaults("gpt_neo")))
    layers = GPTNeoConfig(num_layers=8, attention_types=[[["global"], 2], [["local", "global"], 3]]).attention_layers
    assert layers.count("global") == 5
    got = [f({"attention_layers": layers, "i": i}) for i in range(8)]
    assert _same_partition(got, layers)


def test_nemotron_h_places_its_four_block_types():
    """NemotronHBlock picks one of four mixers by ``layers_block_type[i]`` (Mamba-2, attention, MLP, MoE:
    modeling_nemotron_h.py); NemotronHConfig builds the list from the legacy ``hybrid_override_pattern``
    (configuration_nemotron_h.py ``_pattern_to_list``). Only two-form parts were learned; the rule now places
    all four as the class's list does."""
    pytest.importorskip("transformers")
    from transformers import NemotronHConfig

    f = compile_expr(_kind(_defaults("nemotron_h")))
    layers = NemotronHConfig(hybrid_override_pattern="M-M*-ME*MEE-").layers_block_type
    assert len(set(layers)) == 4
    got = [f({"layers_block_type": layers, "i": i}) for i in range(len(layers))]
    assert _same_partition(got, layers)


def _ernie_moe_layers(n: int, interval: int, start: int, end: int) -> tuple[list[bool], dict]:
    """Which layers of a tiny Ernie4_5_MoeModel are sparse, read from the built model, and its resolved config."""
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeModel

    cfg = Ernie4_5_MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                             num_key_value_heads=1, moe_num_experts=2, moe_k=1, moe_intermediate_size=8,
                             num_hidden_layers=n, moe_layer_interval=interval, moe_layer_start_index=start,
                             moe_layer_end_index=end)
    model = Ernie4_5_MoeModel(cfg)
    return ["Sparse" in type(layer.mlp).__name__ for layer in model.layers], cfg.to_dict()


def test_ernie4_5_moe_places_its_moe_layers_by_interval_start_and_end():
    """Ernie4_5_MoeDecoderLayer is sparse when ``(layer_idx + 1) % moe_layer_interval == 0 and layer_idx >=
    moe_layer_start_index and layer_idx <= moe_layer_end_index`` (modeling_ernie4_5_moe.py): refused before ("no
    rule of the layer-pattern family"). The learned rule places the layers of models built at other layer counts
    and indices as transformers builds them."""
    pytest.importorskip("transformers")
    f = compile_expr(_kind(_defaults("ernie4_5_moe")))
    for n, interval, start, end in ((10, 2, 3, 7), (12, 3, 0, 8), (6, 1, 1, -1)):
        sparse, resolved = _ernie_moe_layers(n, interval, start, end)
        got = [f({**resolved, "i": i}) for i in range(n)]
        assert _same_partition(got, sparse) and any(sparse) and not all(sparse), (n, interval, start, end)


def test_a_default_the_class_replaces_by_the_layer_count_is_derived_from_it():
    """Ernie4_5_MoeConfig replaces ``moe_layer_end_index = -1`` by ``num_hidden_layers - 1``
    (configuration_ernie4_5_moe.py ``__post_init__``): the file derives it so, where before a config that left it
    out read -1 (no MoE layer); a default the class keeps is not derived."""
    pytest.importorskip("transformers")
    from transformers import Ernie4_5_MoeConfig

    from fitplan_torch.learn import configrules as C

    cls = C.config_class("ernie4_5_moe")
    expr = C._layer_count_default(cls, "moe_layer_end_index", "int", C.attribute_map(cls))
    for n in (4, 28, 54):
        assert compile_expr(expr)({"num_hidden_layers": n}) == Ernie4_5_MoeConfig(num_hidden_layers=n).moe_layer_end_index
    assert C._layer_count_default(cls, "moe_layer_start_index", "int", C.attribute_map(cls)) is None


def test_zamba2_key_value_heads_are_derived_as_the_attention_heads():
    """Zamba2Config sets ``num_key_value_heads = num_attention_heads`` when None (configuration_zamba2.py): over
    probes where the heads change only with other sizes no expression over a single variable fits, and the
    learner's memory check was refused ("num_key_value_heads must be a positive integer, got missing"). The
    file now derives it as the field the class copies."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers import Zamba2Config

    from fitplan_torch.learn import configrules as C

    sizes = ((64, 4), (128, 8), (96, 4))
    # n_mamba_heads equals the heads in every probe by coincidence: the class does not copy it (checked)
    probes = [SimpleNamespace(cfg={"model_type": "zamba2", "hidden_size": h, "num_attention_heads": a,
                                   "n_mamba_heads": a}) for h, a in sizes]
    derived = [Zamba2Config(hidden_size=h, num_attention_heads=a).num_key_value_heads for h, a in sizes]
    fields = ["hidden_size", "n_mamba_heads", "num_attention_heads", "num_key_value_heads"]
    assert C._same_as("num_key_value_heads", fields, probes, derived) == "num_attention_heads"
    assert C._same_as("num_key_value_heads", fields, probes[:1], derived[:1]) is None  # one value: a constant fits


def test_bamba_head_width_is_left_to_the_class_that_derives_it_from_auto():
    """BambaConfig derives ``mamba_d_head`` from ``"auto"`` as ``mamba_expand * hidden_size // mamba_n_heads`` and
    rejects a stated head width that no longer matches (configuration_bamba.py ``validate_architecture``). The
    learner's base stated the derived 16, so its GQA regime (hidden size widened to 192) was rejected and the file
    had no GQA graph. The base now keeps ``"auto"``, and the class accepts the widened config."""
    pytest.importorskip("transformers")
    from transformers import BambaConfig

    from fitplan_torch.learn import configrules as C

    tiny = dict(hidden_size=64, mamba_n_heads=8, mamba_expand=2, num_attention_heads=4, num_key_value_heads=2)
    resolved = {**BambaConfig(**tiny).to_dict(), "model_type": "bamba"}
    assert resolved["mamba_d_head"] == 16
    found = C.sentinels(resolved, BambaConfig)
    assert found == {"mamba_d_head": "auto"}
    assert C.replaced(BambaConfig, "mamba_d_head") and not C.replaced(BambaConfig, "hidden_act")  # "silu" is kept
    assert BambaConfig(**{**tiny, "hidden_size": 192, "mamba_d_head": "auto"}).mamba_d_head == 48
    with pytest.raises(Exception, match="Mamba head state"):
        BambaConfig(**{**tiny, "hidden_size": 192, "mamba_d_head": 16})


def test_mamba2_in_proj_width_fits_as_a_sum_of_three_products():
    """BambaMixer's ``in_proj`` is ``intermediate_size + conv_dim + num_heads`` wide, with ``conv_dim =
    intermediate_size + 2 * n_groups * ssm_state_size`` and ``intermediate_size = mamba_expand * hidden_size``
    (modeling_bamba.py): three terms once the widths vary, past the two-term sums of the fitter. The fitted
    expression reproduces the width at sizes no probe used."""
    from fitplan_torch.learn.fit import Fitter

    def width(e):  # by hand, from the lines cited above
        inter = e["mamba_expand"] * e["hidden_size"]
        return inter + (inter + 2 * e["mamba_n_groups"] * e["mamba_d_state"]) + e["mamba_n_heads"]

    base = {"hidden_size": 64, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_n_heads": 8}
    env, single = [dict(base)], {}
    for k in base:
        single[k] = len(env)
        env.append({**base, k: base[k] * 2 + (k == "mamba_d_state")})
    env += [{k: v * m for k, v in base.items()} for m in (3, 5)]
    # the three-term stage itself (the earlier stages, tried first by ``fit``, take seconds over five fields)
    expr = Fitter(env, single)._sum3(frozenset(base), tuple(width(e) for e in env))
    assert expr is not None
    unseen = {"hidden_size": 96, "mamba_expand": 3, "mamba_n_groups": 4, "mamba_d_state": 24, "mamba_n_heads": 6}
    assert compile_expr(expr)(unseen) == width(unseen)
