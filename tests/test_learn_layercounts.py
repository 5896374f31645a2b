"""The layer-pattern search's probes at other layer counts are configs the class accepts (issue #32,
``learn/layercounts.py``): a per-layer list of numbers follows the count (gemma-3n's
``activation_sparsity_pattern``), a layer-count field the class derives is left to it (Dory's
``n_recurrent_layers``), and a probe the class accepts as set is left alone.

Expected values come from the config classes (transformers 5.24, cited at each test), built and read back, or by
hand from the stated resampling rule; never from fitplan's output. Needs transformers (slow, marked by
tests/conftest.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")


def _resolved(cfg: dict) -> dict:
    from transformers import AutoConfig

    return AutoConfig.for_model(**cfg).to_dict()


def test_gemma3n_sparsity_pattern_follows_the_layer_count():
    """Gemma3nTextConfig requires one activation sparsity value per layer (``__post_init__``,
    models/gemma3n/configuration_gemma3n.py); its class default at 25 layers is ``[0.95] * 10 + [0.0] * 15``. At 8
    layers the probe takes entry ``j * 25 // 8`` (0, 3, 6, 9, 12, 15, 18, 21): four sparse layers, then four dense,
    and the class accepts it (it rejected the 25-long list: "Expected 8 values but got 25")."""
    from fitplan_torch.learn.patterns import with_layers

    cfg = {**_resolved({"model_type": "gemma3n_text", "num_hidden_layers": 25, "num_kv_shared_layers": 5}),
           "model_type": "gemma3n_text"}
    assert cfg["activation_sparsity_pattern"] == [0.95] * 10 + [0.0] * 15
    probe = with_layers(cfg, 8)
    assert probe["activation_sparsity_pattern"] == [0.95] * 4 + [0.0] * 4
    assert _resolved(probe)["activation_sparsity_pattern"] == [0.95] * 4 + [0.0] * 4


def test_gemma3n_shared_cache_layers_keep_a_full_attention_layer_unshared():
    """Gemma3nTextConfig's ``kv_sharing_modes`` (models/gemma3n/configuration_gemma3n.py) raises when the layers
    before the last ``num_kv_shared_layers`` lack a type the stack has; its layer types put full attention at
    every fifth layer (``(i + 1) % 5 == 0``). 5 shared of 25 leave layers 0-2 unshared at 8 layers, all sliding:
    refused. Its share of 8, round(5 * 8 / 25) = 2, leaves layers 0-5 unshared, layer 4 full: accepted, and the
    property derives two "reuse" layers at the end."""
    from transformers import AutoConfig

    from fitplan_torch.learn.patterns import with_layers

    cfg = {**_resolved({"model_type": "gemma3n_text", "num_hidden_layers": 25, "num_kv_shared_layers": 5}),
           "model_type": "gemma3n_text"}
    with pytest.raises(ValueError, match="producing a cache"):
        AutoConfig.for_model(**{**cfg, "num_hidden_layers": 8, "layer_types": None,
                                "activation_sparsity_pattern": None, "intermediate_size": cfg["intermediate_size"][0]}
                             ).kv_sharing_modes
    probe = with_layers(cfg, 8)
    assert probe["num_kv_shared_layers"] == 2
    modes = AutoConfig.for_model(**probe).kv_sharing_modes
    assert len(modes) == 8 and modes[-2:] == ["reuse", "reuse"] and "reuse" not in modes[:6]


def test_dory_recurrent_section_is_derived_by_the_class_at_each_count():
    """DoryConfig derives ``n_recurrent_layers = num_hidden_layers - n_input_layers - n_output_layers`` when it is
    None, and ``validate_architecture`` requires the three to add up (models/dory/configuration_dory.py); a config
    file states every count doubled (one attention and one mlp block a layer: ``to_dict``). At 8 blocks with 2
    input and 2 output blocks the recurrent section is 4; at 12 blocks the class derives 12 - 2 - 2 = 8."""
    from fitplan_torch.learn.patterns import with_layers

    cfg = {**_resolved({"model_type": "dory", "num_hidden_layers": 4, "n_input_layers": 1, "n_output_layers": 1,
                        "layer_types": None}), "model_type": "dory"}
    assert (cfg["num_hidden_layers"], cfg["n_recurrent_layers"]) == (8, 4)
    probe = with_layers(cfg, 12)
    out = _resolved(probe)
    assert (out["num_hidden_layers"], out["n_input_layers"], out["n_recurrent_layers"], out["n_output_layers"]) == \
        (12, 2, 8, 2)


def test_a_probe_the_class_accepts_is_left_as_set():
    """LlamaConfig keeps a field it does not declare as given, whatever its length: a 3-long list of numbers at 3
    layers stays 3 long at 6 layers (the class accepts it), where a rejected probe's list would be resampled."""
    from fitplan_torch.learn.patterns import with_layers

    cfg = {**_resolved({"model_type": "llama", "num_hidden_layers": 3}), "model_type": "llama",
           "extra_scales": [1.0, 2.0, 3.0]}
    assert with_layers(cfg, 6)["extra_scales"] == [1.0, 2.0, 3.0]
