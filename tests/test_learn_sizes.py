"""Shrinking, fitting and building what ``fitplan learn-architecture`` learns from, on the real types of
transformers 5.24 that used to fail there (issue #32: gemma3n, gemma4 assistants, zamba, emu3, mllama, mamba2).

Expected values are derived by hand from the config classes and model code cited at each test, never from
fitplan's output.
"""

from __future__ import annotations

import pytest

from fitplan import FitplanError
from fitplan.arch.archexpr import compile_expr


def _defaults(model_type: str) -> dict:
    """The config class's defaults, as a published config.json states them."""
    from transformers import AutoConfig

    return {**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type}


def _resolved(cfg: dict):
    from fitplan_torch.learn.derive import hf_config

    return hf_config(cfg)


# --------------------------------------------------------------------------- layer counts the class derives from


def test_shrink_keeps_gemma3n_cache_sharing_layers():
    """Gemma3nTextConfig's defaults (configuration_gemma3n.py): 35 layers, ``layer_types`` 4 sliding then 1 full,
    ``activation_sparsity_pattern`` 0.95 for the first 10 layers and 0 after, ``num_kv_shared_layers`` 15. Its
    ``kv_sharing_modes`` property makes the last 15 layers "reuse", the last earlier layer of each type "store"
    (18 sliding, 19 full) and the rest None, and raises when a type reusing a cache has no earlier layer of its
    type. 8 kinds of layer: (sliding|full) x (sparse, None | dense, None | dense, store | dense, reuse). By hand,
    the fewest layers that keep them: sparse 0..9 (full at 4 and 9), a dense full at 14, so the stores come at
    18 and 19 at the earliest, and the reusing layers need a full one: 20..24, 25 layers of which 5 share.
    Cutting the layers alone kept 15 sharing layers of 5 (the class raised)."""
    pytest.importorskip("transformers")
    from fitplan_torch.learn.shrink import shrunk_config

    cfg = _defaults("gemma3n_text")
    full = _resolved(cfg)
    small = shrunk_config(cfg)
    c = _resolved(small)
    assert (c.num_hidden_layers, c.num_kv_shared_layers) == (25, 5)
    want = {(t, p > 0, m) for t, p, m in zip(full.layer_types, full.activation_sparsity_pattern, full.kv_sharing_modes)}
    got = [(t, p > 0, m) for t, p, m in zip(c.layer_types, c.activation_sparsity_pattern, c.kv_sharing_modes)]
    assert len(want) == 8 and set(got) == want
    assert got[18:20] == [("sliding_attention", False, "store"), ("full_attention", False, "store")]
    # widths: the per-layer intermediate sizes and the per-layer input vocabulary (262144 rows) are tiny too
    assert set(c.intermediate_size) == {128} and c.vocab_size_per_layer_input == 512


def test_shrink_keeps_a_gemma4_assistant_sharing_every_layer():
    """Gemma4UnifiedAssistantConfig sets its text config's ``num_kv_shared_layers`` to its layer count (30 of 30:
    every layer reads the target model's cache; configuration_gemma4_unified_assistant.py ``__post_init__``).
    The cut to 6 layers (5 sliding, 1 full) keeps them all sharing (6 of 6; 30 of 6 made the class raise). The
    model then needs the target's ``shared_kv_states``, which a step from token ids alone has not: refused
    naming that line, not the config class's cache-sharing error."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.command import text_config
    from fitplan_torch.learn.shrink import shrink, shrunk_config

    cfg = text_config(_defaults("gemma4_unified_assistant"))
    c = _resolved(shrunk_config(cfg))
    assert c.num_hidden_layers == c.num_kv_shared_layers == 6
    assert set(c.kv_sharing_modes) == {"reuse"}
    with pytest.raises(FitplanError) as e:
        shrink(cfg)
    assert "shared_kv_states" in str(e.value) and "producing a cache" not in str(e.value)


def test_shrink_keeps_every_dory_layer_role():
    """DoryConfig: ``n_input_layers`` + ``n_recurrent_layers`` + ``n_output_layers`` == ``num_hidden_layers``
    (``validate_architecture``; the recurrent count derived when not given), 8 + 20 + 8 of 36 layers by default
    (stated doubled, as attention and mlp blocks). A layer-count field set alone must not leave another at no
    layer or at every layer: after shrinking, each of the three roles still holds at least one layer and not all."""
    pytest.importorskip("transformers")
    from fitplan_torch.learn.shrink import shrunk_config

    full = _resolved(_defaults("dory"))
    assert (full.n_input_layers, full.n_recurrent_layers, full.n_output_layers) == (8, 20, 8)
    c = _resolved(shrunk_config(_defaults("dory")))
    counts = (c.n_input_layers, c.n_recurrent_layers, c.n_output_layers)
    assert c.num_hidden_layers < full.num_hidden_layers and sum(counts) == c.num_hidden_layers
    assert all(0 < v < c.num_hidden_layers for v in counts)


def test_shrink_keeps_two_zamba_hybrid_layers():
    """ZambaModel ties its one shared attention block across the hybrid layers: ``_tied_weights_keys`` maps
    every other hybrid layer (``layers.(?!2\\.)\\d+.shared_transf``) to the first, and
    ``get_expanded_tied_weights_keys`` raises when that pattern matches no layer (modeling_zamba.py,
    modeling_utils.py). ZambaConfig's ``layers_block_type``: 2 mamba layers, a hybrid one, then hybrid where
    ``i % 6 == 4`` over the rest (configuration_zamba.py), so the second hybrid layer is index 3 + 4 = 7: 8
    layers. The shrunk model runs a training step."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.shrink import shrink

    small = shrink(_defaults("zamba"))
    c = _resolved(small)
    assert c.num_hidden_layers == 8
    assert [i for i, t in enumerate(c.layers_block_type) if t == "hybrid"] == [2, 7]
    assert derive.run(small, "16", "sdpa", 2, 16).ops


# --------------------------------------------------------------------------- text configs of multimodal types


@pytest.mark.parametrize(("model_type", "text_type", "cls"), [
    ("emu3", "emu3_text_model", "Emu3ForCausalLM"),
    ("mllama", "mllama_text_model", "MllamaForCausalLM"),
])
def test_a_text_config_builds_the_outer_type_s_causal_lm(model_type, text_type, cls):
    """``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` lists ``emu3 -> Emu3ForCausalLM`` and ``mllama ->
    MllamaForCausalLM`` (modeling_auto.py), classes whose ``config_class`` is the text config; their text types
    are not listed, so ``AutoModelForCausalLM.from_config`` refused the text config the CLI reads. The learner
    builds that class from the text config, as ``from_config`` does for the outer config."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.command import text_config
    from fitplan_torch.learn.shrink import shrink

    cfg = text_config(_defaults(model_type))
    assert cfg["model_type"] == text_type
    model, _ = derive.build(shrink(cfg), "16", "sdpa")
    assert type(model).__name__ == cls


# --------------------------------------------------------------------------- fitting


def test_fit_a_held_size_over_one_variable():
    """Mamba-2's ``repeat_interleave(num_heads // num_groups, ...)`` (modeling_mamba2.py ``mamba2_chunk_scan``)
    with the heads held at the shrunk 8: 8 // 8 = 1 at the base and 8 // 4 = 2 where the n_groups probe halves
    the groups. No product or sum of powers of n_groups gives it; ``8//n_groups`` does."""
    from fitplan_torch.learn.fit import FitError, Fitter

    groups = [8, 8, 8, 8, 8, 8, 4, 8, 8, 4]
    fitter = Fitter([{"n_groups": g} for g in groups], {"n_groups": 6})
    assert fitter.fit([8 // g for g in groups]) == "8//n_groups"
    with pytest.raises(FitError):  # two probes at 4 groups that disagree (2, 5): no function of n_groups
        fitter.fit([1, 1, 1, 1, 1, 1, 2, 1, 1, 5])


# --------------------------------------------------------------------------- cost


@pytest.mark.parametrize("model_type", ["llama", "qwen3_5_text"])
@pytest.mark.parametrize("backward", [False, True], ids=["lifetimes", "backward"])
def test_a_recorded_model_is_released(backward, model_type, monkeypatch):
    """The recorder marks a storage's death with a ``weakref.finalize`` callback bound to itself; the recorder
    holds the model, and the model its parameters, buffers and gradients, so the callbacks of those storages
    kept every recorded model alive through finalize's global registry (Jamba's learning grew by a few hundred
    MB per variant, past 4 GB). After a recording, with or without its backward, the model is garbage, and so is
    the recorder: a callback still pending held it, and it held the forward's autograd nodes; a tensor the
    saved-tensor hook stored bare, saved by the node that made it (``exp`` in Qwen3.5's gated delta rule, in a
    branch the loss does not reach), held that node through autograd's C++ (record.py ``_release_model``)."""
    pytest.importorskip("torch")
    import gc
    import weakref

    from fitplan_torch.learn import derive
    from fitplan_torch.learn.record import _Recorder
    from fitplan_torch.learn.shrink import shrink

    built = []
    build = derive.build

    def tracked(*a, **k):
        model, config = build(*a, **k)
        built.append(weakref.ref(model))
        return model, config

    monkeypatch.setattr(derive, "build", tracked)
    cfg = shrink({**_defaults(model_type), "num_hidden_layers": 2} if model_type == "llama" else _defaults(model_type))
    derive.RECENT.clear()
    assert derive._run(cfg, "16", "sdpa", 2, 16, backward=backward).ops
    gc.collect()
    assert built and all(ref() is None for ref in built)
    assert not [o for o in gc.get_objects() if isinstance(o, _Recorder)]


def test_a_layer_count_named_n_layers_is_cut():
    """MptConfig names its layer count ``n_layers`` (``attribute_map`` num_hidden_layers -> n_layers, default 24:
    transformers/models/mpt/configuration_mpt.py, 5.24); left at 24 it cost MPT's learning past 4 GB."""
    pytest.importorskip("transformers")
    from fitplan_torch.learn.derive import hf_config
    from fitplan_torch.learn.shrink import shrunk_config

    cfg = _defaults("mpt")
    assert cfg["n_layers"] == 24
    out = shrunk_config(cfg)
    assert out["n_layers"] < 24 and hf_config(out).num_hidden_layers == out["n_layers"]


def test_a_width_rounded_up_to_a_multiple_of_a_field():
    """xLSTM's feed-forward width: ``round_up_to_next_multiple_of(hidden_size * ffn_proj_factor,
    ffn_round_up_to_multiple_of)`` (transformers 5.24 configuration_xlstm.py), the values computed with that
    function itself. The multiple's own probe (64 -> 96) and the factor's (2.667 -> 2.5) leave the width at 192, so
    the size depends on ``hidden_size`` alone by the probes; the joint probe moves all three. The fit, at a held-out
    config, gives the function's value there. Control: the plain ``int(f·h)`` does not fit (the rounding is
    there), nor does the rounding with the multiple held at the base's 64 (the joint probe's 48 shows)."""
    from fitplan_torch.learn.fit import Fitter
    from transformers.models.xlstm.configuration_xlstm import round_up_to_next_multiple_of as up

    probes = [(64, 64, 2.667), (96, 64, 2.667), (64, 96, 2.667), (64, 64, 2.5), (80, 48, 3.0)]  # base, singles, joint
    env = [{"b": 1, "s": 16, "hidden_size": h, "ffn_round_up_to_multiple_of": m, "ffn_proj_factor": f}
           for h, m, f in probes]
    y = [up(h * f, m) for h, m, f in probes]
    assert y == [192, 256, 192, 192, 240]  # by hand: 170.7 -> 192, 256.03 -> 256 (x + m - 1 floored), 170.7 -> 192, 160 -> 192, 240
    single = {"hidden_size": 1, "ffn_round_up_to_multiple_of": 2, "ffn_proj_factor": 3}
    fitter = Fitter(env, single, ["ffn_proj_factor"])
    expr = fitter.fit(y)
    held_out = {"b": 1, "s": 16, "hidden_size": 200, "ffn_round_up_to_multiple_of": 72, "ffn_proj_factor": 2.667}
    assert compile_expr(expr)(held_out) == up(200 * 2.667, 72) == 576
    assert not fitter.check("int(ffn_proj_factor*hidden_size)", tuple(y))
    assert not fitter.check("64*ceil_div(int(ffn_proj_factor*hidden_size), 64)", tuple(y))
