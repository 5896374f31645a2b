"""Layer patterns the layer-pattern family could not express before (issue #32, the pattern8 class): the layer that
stores its kind's K/V for the shared layers after it (``last_index``), the last P layers, a per-layer number list
(gemma-3n's activation sparsity) and a stated list together with an integer field (Flint's dense MLP layers).

Each learned rule is checked on models transformers 5.24 builds at configs the learner never saw (the layer forms
read off the built modules: the model code cited at each test decides them, not fitplan); ``last_index`` by hand.
"""

from __future__ import annotations

import pytest

from fitplan.arch.archexpr import compile_expr
from test_learn_patterns import _defaults, _kind, _same_partition

patterns = pytest.importorskip("fitplan_torch.learn.patterns")


def test_last_index_is_the_last_position_of_a_value_before_an_end():
    """``last_index(L, x, n)``: the last ``j < n`` with ``L[j] == x``, -1 when none; ``n`` past the list's end reads
    the whole list, ``n <= 0`` none of it (values worked out by hand)."""
    f = compile_expr("last_index(L, x, n)")
    L = ["s", "s", "f", "s", "f", "s"]
    for x, n, want in (("s", 6, 5), ("f", 6, 4), ("s", 5, 3), ("f", 4, 2), ("f", 2, -1), ("s", 9, 5), ("s", 0, -1),
                       ("s", -2, -1), ("g", 6, -1)):
        assert f({"L": L, "x": x, "n": n}) == want, (x, n)
    # Gemma-4's store layers at 8 layers, 3 shared: the last "s" and the last "f" of the first five
    g = compile_expr("i == last_index(layer_types, layer_types[i], num_hidden_layers - num_kv_shared_layers)")
    env = {"layer_types": ["s", "s", "f", "s", "s", "f", "s", "f"], "num_hidden_layers": 8, "num_kv_shared_layers": 3}
    assert [i for i in range(8) if g({**env, "i": i})] == [2, 4]


def _pattern(cfg: dict) -> dict:
    """What the layer-pattern search returns for ``cfg`` (as :func:`test_learn_patterns._kind` learns it)."""
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.learner import _base_config
    from fitplan_torch.learn.shrink import shrink

    base, _ = _base_config(shrink(cfg))
    return patterns.learn_pattern(base, derive.size_variables(base), lambda *a: None)


def _attention_forms(model) -> list[tuple]:
    """Per decoder layer: whether its attention reuses an earlier layer's K/V, stores its own for them, slides."""
    return [(a.is_kv_shared_layer, a.store_full_length_kv, a.is_sliding) for a in (x.self_attn for x in model.layers)]


def test_gemma3n_places_its_shared_store_and_sparse_layers():
    """Gemma3nTextConfig.kv_sharing_modes: the last ``num_kv_shared_layers`` layers reuse K/V ("reuse": no K/V
    projections), the last layer of each kind of ``layer_types[:num_hidden_layers - num_kv_shared_layers]`` stores
    them ("store"), configuration_gemma3n.py; Gemma3nTextMLP adds a Gaussian top-k where
    ``activation_sparsity_pattern[layer_idx] > 0`` (modeling_gemma3n.py). Refused before ("no rule of the
    layer-pattern family explains which layers have which 'mlp'"); the learned rule places every layer of models
    built at other layer counts, shared counts, layer types and sparsity lists."""
    pytest.importorskip("transformers")
    from transformers import Gemma3nTextConfig, Gemma3nTextModel

    found = _pattern(_defaults("gemma3n_text"))  # learned with shared layers: the count is a symbol, not held
    assert found["held"] == {}
    f = compile_expr(patterns.kind_expression(found["rules"]))
    tiny = dict(vocab_size=32, vocab_size_per_layer_input=32, hidden_size=16, hidden_size_per_layer_input=4,
                intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8, laurel_rank=4)
    s, F = "sliding_attention", "full_attention"
    for n, shared, types, sparse in ((9, 4, [s, s, F, s, F, s, s, s, F], [0.95] * 3 + [0.0] * 6),
                                     (7, 2, [F, s, s, F, s, s, F], [0.0, 0.5, 0.0, 0.5, 0.0, 0.0, 0.0]),
                                     (12, 5, None, [0.95] * 10 + [0.0] * 2)):
        cfg = Gemma3nTextConfig(**tiny, num_hidden_layers=n, num_kv_shared_layers=shared, layer_types=types,
                                activation_sparsity_pattern=sparse)
        model = Gemma3nTextModel(cfg)
        forms = [a + (m.mlp.activation_sparsity > 0,) for a, m in zip(_attention_forms(model), model.layers)]
        env = cfg.to_dict()  # every list stated, as a published config.json states it
        got = [f({**env, "i": i}) for i in range(n)]
        assert _same_partition(got, forms) and len(set(forms)) >= 4, (n, shared, got, forms)


def test_gemma4_places_the_layers_that_store_their_kinds_kv():
    """Gemma4TextConfig.kv_sharing_modes marks "store" the last layer of each kind of ``layer_types`` (no layer
    shared: ``num_kv_shared_layers = 0``, the class default the learner starts from), configuration_gemma4.py;
    Gemma4TextAttention keeps that layer's K/V (``store_full_length_kv``, modeling_gemma4.py): four forms of
    ``self_attn`` that no rule of the family separated. The learned rule places the layers of models built at
    other layer counts and layer types; the shared layers any other ``num_kv_shared_layers`` builds are a form it
    never saw, so the file holds the count at its learned 0 (the core refuses another, naming it)."""
    pytest.importorskip("transformers")
    from transformers import Gemma4TextConfig, Gemma4TextModel

    found = _pattern(_defaults("gemma4_text"))
    f = compile_expr(patterns.kind_expression(found["rules"]))
    tiny = dict(vocab_size=32, vocab_size_per_layer_input=32, hidden_size=16, hidden_size_per_layer_input=4,
                intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8, global_head_dim=8)
    # any shared layer is a form the learned layers lack (no K/V projections): the file holds the count at 0
    shared = Gemma4TextModel(Gemma4TextConfig(**tiny, num_hidden_layers=8, num_kv_shared_layers=2))
    assert [hasattr(x.self_attn, "k_proj") for x in shared.layers] == [True] * 6 + [False] * 2
    assert found["held"] == {"num_kv_shared_layers": 0}
    s, F = "sliding_attention", "full_attention"
    for n, types in ((9, [s, s, F, s, F, s, s, s, F]), (7, [F, s, s, F, s, s, F]), (13, None)):
        cfg = Gemma4TextConfig(**tiny, num_hidden_layers=n, layer_types=types)
        forms = _attention_forms(Gemma4TextModel(cfg))
        env = cfg.to_dict()
        got = [f({**env, "i": i}) for i in range(n)]
        assert _same_partition(got, forms) and len(set(forms)) == 4, (n, got, forms)


def test_flint_places_its_dense_layers_by_the_stated_list_and_the_sparse_step():
    """FlintDecoderLayer builds a FlintSparseMoeBlock where ``layer_idx not in mlp_only_layers and (layer_idx + 1) %
    decoder_sparse_step == 0`` (modeling_flint.py); FlintConfig's ``mlp_only_layers`` defaults to ``[0, 1]``
    (configuration_flint.py). Refused before: the rule on the stated list needs the integer field too. The learned
    rule places the MLPs of models built with the list stated and left to the class, at other sparse steps."""
    pytest.importorskip("transformers")
    from transformers import FlintConfig, FlintModel

    f = compile_expr(_kind(_defaults("flint")))
    tiny = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                shared_expert_intermediate_size=8)
    classes: set[str] = set()
    for n, step, stated in ((9, 2, [3]), (7, 1, None), (10, 3, [0, 5, 8]), (6, 1, [])):
        cfg = FlintConfig(**tiny, num_hidden_layers=n, decoder_sparse_step=step, mlp_only_layers=stated)
        model = FlintModel(cfg)
        forms = [(type(x.mlp).__name__, x.self_attn.sliding_window is not None) for x in model.layers]
        env = {**cfg.to_dict(), "mlp_only_layers": stated, "layer_types": None}  # the class's default lists left out
        got = [f({**env, "i": i}) for i in range(n)]
        assert _same_partition(got, forms), (n, step, stated, got, forms)
        classes |= {m for m, _ in forms}
    assert len(classes) == 2  # dense and MoE layers among the configs (none dense with an empty list)


def test_dory_is_refused_naming_the_layer_count_its_class_rewrites():
    """DoryConfig.to_dict writes each layer's attention and MLP as two ``layer_types`` entries and doubles
    ``num_hidden_layers``; ``__post_init__`` halves them back (configuration_dory.py), so the model has half the
    layers its config.json states (measured below on a model transformers builds). The core reads the stated count:
    the learner refuses, naming it, where it said before that no rule of the family explains the layers."""
    pytest.importorskip("transformers")
    from transformers import DoryConfig, DoryModel

    stated = DoryConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=8, num_hidden_layers=6, n_input_layers=2,
                        n_output_layers=2).to_dict()
    assert len(DoryModel(DoryConfig(**stated)).layers) * 2 == stated["num_hidden_layers"] == 12
    with pytest.raises(patterns.PatternError, match="builds 4 layers where its config states num_hidden_layers = 8"):
        _pattern(_defaults("dory"))
