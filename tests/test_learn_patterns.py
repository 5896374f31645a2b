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
    from fitplan_torch.learn.learner import _base_config
    from fitplan_torch.learn.shrink import shrink

    base, _ = _base_config(shrink(cfg))  # untied, token ids inside the vocabulary: as record_model starts
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


# --------------------------------------------------------------------------- the second search (patternsearch.py)


def test_a_part_is_split_into_the_class_and_attributes_of_its_modules():
    """A part's signature (module, class, attributes, parameter shapes) becomes one component per module (class and
    shapes) and one per attribute; a module the layer lacks has none."""
    import json

    from fitplan_torch.learn import patternsearch

    sig = json.dumps([["", "SlidingLayer", {"is_block_boundary": True}, {}], ["norm", "RMSNorm", {}, {"weight": [16]}]])
    got = patternsearch.components(sig)
    assert got == {":class": '["SlidingLayer", {}]', ".is_block_boundary": "true",
                   "norm:class": '["RMSNorm", {"weight": [16]}]'}
    assert patternsearch.components(None) == {}


def _dense_first(n: int, k: int = 3) -> list[dict[str, str]]:
    """BeamConfig's derived ``mlp_layer_types``: ``"dense"`` for the first ``min(3, n)`` layers (configuration_beam.py)."""
    return [{"mlp": "dense" if i < min(k, n) else "sparse"} for i in range(n)]


def test_a_list_rule_and_a_rule_over_constants_for_the_derived_list_are_fitted_apart():
    """Where the config states the list, the layer follows it; where it does not, the class derives the first three
    layers dense. The joined rule places configs the search never saw: a stated list and three layer counts."""
    from fitplan_torch.learn import patterns, patternsearch

    observed = []
    for n in (8, 12):  # derived: the list absent
        observed.append(({"L": None, "num_hidden_layers": n}, {"num_hidden_layers": n}, _dense_first(n)))
    rnd = random.Random(2)
    for _ in range(6):  # stated
        types = [rnd.choice(("dense", "sparse")) for _ in range(8)]
        observed.append(({"L": types, "num_hidden_layers": 8}, {"num_hidden_layers": 8},
                         [{"mlp": t} for t in types]))
    patterns.DEFAULTS.clear()
    lists = {"L": [('L[i] == "dense"', lambda i, c: c[0]["L"][i] == "dense")]}
    rules = patternsearch.constant_rules([], 8, "num_hidden_layers")
    expr = patternsearch.split_rule("mlp", "dense", observed, lists, rules, patterns._given, patterns._fit,
                                    patterns._conjunction)
    assert expr is not None
    f = compile_expr(expr)
    for n in (4, 20, 61):
        assert [f({"L": None, "num_hidden_layers": n, "i": i}) for i in range(n)] == \
            [x["mlp"] == "dense" for x in _dense_first(n)], (expr, n)
    stated = ["sparse", "dense", "sparse", "dense", "dense"]
    assert [f({"L": stated, "i": i}) for i in range(5)] == [t == "dense" for t in stated]


def test_a_rule_over_constants_must_hold_at_the_second_layer_count():
    """Only the first layer differs (Inkling2's first decoder layer has no ``attention_input``: modeling_inkling2.py
    ``... if layer_idx > 0 else None``). At eight layers alone ``i % 8 == 0`` places it as well as ``i == 0``; with
    twelve layers observed too, the rule found places the first layer only, at any layer count."""
    from fitplan_torch.learn import patterns, patternsearch

    def first(n):
        return [{"attention_input": "none" if i == 0 else "residual"} for i in range(n)]

    rules = patternsearch.constant_rules([], 8, "num_hidden_layers")
    one = [({"num_hidden_layers": 8}, {"num_hidden_layers": 8}, first(8))]
    assert patterns._fit("attention_input", "none", one, [r for r in rules if r[0] == "i % 8 == 0"])
    two = one + [({"num_hidden_layers": 12}, {"num_hidden_layers": 12}, first(12))]
    expr = patternsearch.rule_for("attention_input", "none", two, rules, patterns._fit, patterns._conjunction)
    f = compile_expr(expr)
    assert [f({"num_hidden_layers": 24, "i": i}) for i in range(24)] == [i == 0 for i in range(24)], expr


def _beam_forms(n: int, **kw) -> tuple[list, dict]:
    """Per layer of a tiny BeamModel: its MLP class and whether its attention slides (modeling_beam.py
    ``BeamDecoderLayer``), and the config as given (lists absent unless stated)."""
    from transformers import BeamConfig, BeamModel

    tiny = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, n_group=1, topk_group=1)
    model = BeamModel(BeamConfig(**tiny, num_hidden_layers=n, **kw))
    forms = [(type(layer.mlp).__name__, layer.self_attn.sliding_window is not None) for layer in model.layers]
    return forms, {"num_hidden_layers": n, "layer_types": None, "mlp_layer_types": None, **kw}


def test_beam_places_the_dense_mlps_and_full_attention_layers_its_class_derives():
    """BeamConfig derives ``mlp_layer_types`` (``"dense"`` for the first ``min(3, num_hidden_layers)``) and
    ``layer_types`` (full attention every sixth layer and at the last one) when a config states neither
    (configuration_beam.py ``__post_init__``): refused before ("no rule of the layer-pattern family explains which
    layers have which 'mlp'"). The learned rule places the layers of models transformers builds at three layer
    counts, and at a stated pattern."""
    pytest.importorskip("transformers")
    f = compile_expr(_kind(_defaults("beam")))
    for n, kw in ((5, {}), (9, {}), (13, {}),
                  (6, {"mlp_layer_types": ["sparse", "dense"] * 3, "layer_types": ["full_attention"] * 3 +
                       ["sliding_attention", "full_attention", "full_attention"]})):
        forms, env = _beam_forms(n, **kw)
        got = [f({**env, "i": i}) for i in range(n)]
        assert _same_partition(got, forms) and len(set(forms)) > 1, (n, kw, got, forms)


def test_zamba_places_its_hybrid_layers_counted_from_the_third():
    """ZambaConfig derives ``layers_block_type``: layers 0 and 1 Mamba, layer 2 hybrid, then hybrid where ``(i - 3) %
    attn_layer_period == attn_layer_offset`` (configuration_zamba.py); ZambaModel builds a ZambaHybridLayer there
    (modeling_zamba.py). Refused before; the learned rule places the layers of models built at three (layers,
    period, offset)."""
    pytest.importorskip("transformers")
    from transformers import ZambaConfig, ZambaModel

    f = compile_expr(_kind(_defaults("zamba")))
    tiny = dict(vocab_size=32, hidden_size=16, num_attention_heads=2, num_key_value_heads=2, n_mamba_heads=2,
                intermediate_size=32, mamba_d_state=4, mamba_dt_rank=4)
    for n, period, offset in ((9, 3, 1), (14, 6, 4), (11, 2, 0)):
        forms = [type(layer).__name__ for layer in ZambaModel(ZambaConfig(
            **tiny, num_hidden_layers=n, attn_layer_period=period, attn_layer_offset=offset)).layers]
        env = {"num_hidden_layers": n, "attn_layer_period": period, "attn_layer_offset": offset,
               "layers_block_type": None}
        got = [f({**env, "i": i}) for i in range(n)]
        assert _same_partition(got, forms), (n, period, offset, got, forms)


def test_mllama_places_its_cross_attention_layers_stated_or_default():
    """MllamaTextModel builds a cross-attention layer where ``layer_idx in cross_attention_layers``
    (modeling_mllama.py); MllamaTextConfig's default is ``[3, 8, 13, ..., 38]`` (configuration_mllama.py). The
    learned rule places a stated list and the default's layers, at three layer counts."""
    pytest.importorskip("transformers")
    from transformers import MllamaTextConfig
    from transformers.models.mllama.modeling_mllama import MllamaTextModel

    f = compile_expr(_kind(_defaults("mllama")["text_config"]))  # the text config, as the CLI reads it
    tiny = dict(vocab_size=32, pad_token_id=0, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                num_key_value_heads=1)
    for n, stated in ((6, [1, 4]), (9, None), (14, None)):
        cfg = MllamaTextConfig(**tiny, num_hidden_layers=n, **({"cross_attention_layers": stated} if stated else {}))
        forms = [type(layer).__name__ for layer in MllamaTextModel(cfg).layers]
        got = [f({"cross_attention_layers": stated, "num_hidden_layers": n, "i": i}) for i in range(n)]
        assert _same_partition(got, forms) and len(set(forms)) == 2, (n, stated, got, forms)


def test_inkling2_places_its_layers_by_class_block_boundary_and_first_layer():
    """Inkling2TextModel builds a full or sliding layer by ``layer_types[i]`` (``"hybrid"`` every sixth layer when
    derived, configuration_inkling2.py), marks ``is_block_boundary = layer_idx % n_layers_per_attn_res_block == 0``
    and gives the first layer no ``attention_input`` (modeling_inkling2.py): three forms of the layer's own part
    that no one-against-the-rest rule separated. Split into components, the rule places the layers of models built
    at three (layers, block) settings."""
    pytest.importorskip("transformers")
    from transformers import Inkling2TextConfig, Inkling2TextModel

    f = compile_expr(_kind(_defaults("inkling2_text")))
    tiny = dict(vocab_size=32, unpadded_vocab_size=32, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                head_dim=8, swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=8,
                moe_intermediate_size=8, n_routed_experts=4, num_experts_per_tok=2)
    for n, block in ((8, 3), (13, 2), (7, 4)):
        model = Inkling2TextModel(Inkling2TextConfig(**tiny, num_hidden_layers=n, n_layers_per_attn_res_block=block))
        forms = [(type(layer).__name__, layer.is_block_boundary, layer.attention_input is None) for layer in model.layers]
        env = {"num_hidden_layers": n, "n_layers_per_attn_res_block": block, "layer_types": None}
        got = [f({**env, "i": i}) for i in range(n)]
        assert _same_partition(got, forms), (n, block, got, forms)
