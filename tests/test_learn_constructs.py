"""Constructs the learner could not express (issue #32, part B), each checked on a real tiny transformers 5.24
model of a type that uses it: layer patterns the config class derives or cycles, data-dependent sizes under a
declared routing assumption, layer skipping, custom autograd Functions.

Expected values come from the config classes and model code cited at each test, or from the referee (``fitplan
validate``'s CPU run, through the learner's own ``verify.check_memory``), never from fitplan's output.
"""

from __future__ import annotations

import pytest

from fitplan.arch.archexpr import compile_expr


def _defaults(model_type: str, **overrides) -> dict:
    """The config class's defaults as a config.json states them, without what ``overrides`` drops (None)."""
    from transformers import AutoConfig

    cfg = {**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type}
    for k, v in overrides.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def _pattern(cfg: dict) -> dict:
    """The layer-kind rules the learner finds for ``cfg`` (shrunk, then resolved by the class, as learn_full does)."""
    from fitplan_torch.learn import derive, patterns
    from fitplan_torch.learn.shrink import shrink

    base = derive.hf_config(shrink(cfg)).to_dict()
    found = patterns.learn_pattern(base, derive.size_variables(base), lambda *a: None)
    assert found is not None, "every layer alike"
    return found["rules"]


def _same_partition(a: list, b: list) -> bool:
    """``a`` and ``b`` split the layers the same way (each value of one maps to exactly one value of the other)."""
    return len(set(zip(a, b))) == len(set(a)) == len(set(b))


# --------------------------------------------------------------------------- layer patterns


def test_cohere2_learns_its_nope_full_layers_without_layer_types():
    """Cohere2Config (configuration_cohere2.py ``__post_init__``) derives ``layer_types`` when a config omits it:
    layer i is full attention when ``(i + 1) % sliding_window_pattern == 0`` (4, a keyword the class pops), and
    Cohere2Attention gives full-attention layers no rotary embedding (modeling_cohere2.py: ``if self.sliding_window
    is not None`` around ``apply_rotary_pos_emb``). Before, the learner tried ``sliding_window`` = 1, which every
    sliding layer copies, so no rule explained the layers ("no rule explains which layers have which 'self_attn'").
    The rule, read by the core for the 40-layer default without ``layer_types``, splits the layers as the class."""
    pytest.importorskip("transformers")
    from transformers import Cohere2Config

    rules = _pattern(_defaults("cohere2", layer_types=None))
    assert list(rules) == ["self_attn"]
    expected = Cohere2Config(num_hidden_layers=40).layer_types
    f = compile_expr(rules["self_attn"])
    got = [f({"layer_types": None, "i": i}) for i in range(40)]
    assert _same_partition(got, expected) and expected.count("full_attention") == 10


def test_recurrent_gemma_block_types_are_cycled_as_the_class_does():
    """RecurrentGemmaConfig.layers_block_type (configuration_recurrent_gemma.py) is ``(block_types * 100)[:
    num_hidden_layers]``: google/recurrentgemma-2b states three block types for 26 layers. The learned rule read
    ``block_types[i]``, which the core could not evaluate past layer 2 (the list is 3 long); it now reads the
    list cycled, as the class does."""
    pytest.importorskip("transformers")
    from transformers import RecurrentGemmaConfig

    rules = _pattern(_defaults("recurrent_gemma"))
    blocks = ["recurrent", "recurrent", "attention"]
    expected = RecurrentGemmaConfig(num_hidden_layers=26, block_types=blocks).layers_block_type
    f = compile_expr(rules["temporal_block"])
    got = [f({"block_types": blocks, "i": i}) for i in range(26)]
    assert _same_partition(got, expected) and expected.count("sliding_attention") == 8


def test_cohere2_without_layer_types_learns_and_matches_the_referee():
    """Learned from a published-style Cohere2 config (no ``layer_types``; shrunk to 4 layers: 3 sliding, 1 full
    without RoPE), one variant (bf16, SDPA): both layer kinds get a graph and the referee measures the same
    activations and peak within 1 %, full fine-tuning and LoRA. Before, learning stopped at the layer pattern."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V
    from fitplan_torch.learn.shrink import shrink

    cfg = shrink(_defaults("cohere2", layer_types=None))
    data, _, _ = derive.learn_full(cfg, log=lambda *a: None, variants=(("16", "sdpa"),), first_only=True)
    assert len(data["layers"]["kinds"]) == 2
    resolved = {k: v for k, v in derive.hf_config(cfg).to_dict().items()
                if k not in ("transformers_version", "architectures", "dtype", "torch_dtype")}
    cases = [("bf16-true", "sdpa", False, "full"), ("bf16-true", "sdpa", False, "lora")]
    problems, rows = V.check_memory(data, {**resolved, "model_type": "cohere2"}, lambda *a: None, cases=cases)
    assert problems == [] and len(rows) == 2
    assert all(abs(r["activations"]) < 0.01 and abs(r["peak"]) < 0.01 for r in rows)
