"""Shrinking a width the shrink table does not list by name (issue #32, item 4: each of these types passed 4 GB
resident in the learner with the field at its size; ``learn/shrink_names.py``).

Expected values are the tiny widths of ``shrink.SMALL`` (hidden 64, heads 4, key/value heads 2, head_dim 16,
intermediate 128, expert intermediate 32, 4 experts, 2 per token, vocabulary 512), and the shapes are the ones the
modeling files build from them, by hand; each is measured on the model torch builds from the shrunk class defaults.
Control: on the code before (the names unknown to the shrink table), each assertion fails (Longcat's experts hold
260 rows of 4096, Llama-4's dense feed-forward is 16384 wide, Inkling's sliding layers have 64 heads of 128, BLT's
and Blenderbot keeps 24 decoder layers). BLT's hash vocabulary is checked by name only: its shrunk config is
refused on another width (``hidden_size_global``), before and after.
"""

from __future__ import annotations

import json

import pytest


def _shrunk_model(model_type: str, **fields):
    from transformers import AutoConfig, AutoModelForCausalLM

    from fitplan_torch.learn.derive import hf_config
    from fitplan_torch.learn.shrink import shrink

    cfg = json.loads(json.dumps({**AutoConfig.for_model(model_type, **fields).to_dict(), "model_type": model_type},
                                default=str))
    out = shrink(cfg)
    return out, AutoModelForCausalLM.from_config(hf_config(out))


def test_names_give_the_kind_they_name():
    """The rules alone, by name: an alias the class declares, a kind with a prefix or a suffix, a count of
    experts, another vocabulary; names that only look alike are left alone."""
    from fitplan_torch.learn.shrink import SMALL
    from fitplan_torch.learn.shrink_names import tiny_value

    aliases = {"moe_topk": "num_experts_per_tok", "expert_ffn_hidden_size": "moe_intermediate_size"}
    assert tiny_value("moe_topk", aliases, SMALL) == 2
    assert tiny_value("expert_ffn_hidden_size", aliases, SMALL) == 32  # the alias wins over the suffix (128)
    assert tiny_value("swa_num_attention_heads", {}, SMALL) == 4
    assert tiny_value("swa_num_key_value_heads", {}, SMALL) == 2
    assert tiny_value("linear_head_dim", {}, SMALL) == 16
    assert tiny_value("intermediate_size_mlp", {}, SMALL) == 128
    assert tiny_value("zero_expert_num", {}, SMALL) == 4
    assert tiny_value("moe_num_experts", {}, SMALL) == 4
    assert tiny_value("encoder_hash_byte_group_vocab", {}, SMALL) == 512
    for other in ("num_expert_group", "expert_layer_period", "moe_layer_freq", "hidden_size_global",
                  "first_k_dense_replace", "sliding_window", "encoder_hash_byte_group_nb_functions"):
        assert tiny_value(other, {}, SMALL) is None, other


def test_longcat_experts_shrink_with_their_zero_experts():
    """LongcatFlashExperts holds ``n_routed_experts + zero_expert_num`` rows of ``2 * expert_ffn_hidden_size``
    by ``hidden_size`` (modeling_longcat_flash.py): 4 + 4 rows of 2 * 32 by 64; the router picks 2 (``moe_topk``,
    the class's ``num_experts_per_tok``)."""
    pytest.importorskip("torch")
    out, model = _shrunk_model("longcat_flash")
    assert (out["zero_expert_num"], out["expert_ffn_hidden_size"], out["moe_topk"]) == (4, 32, 2)
    shapes = {tuple(p.shape) for n, p in model.named_parameters() if n.endswith("experts.gate_up_proj")}
    assert shapes == {(8, 64, 64)}


def test_llama4_dense_feed_forward_and_inkling_sliding_heads():
    """Llama-4's dense layers (every second layer MoE here) build ``Llama4TextMLP`` at ``intermediate_size_mlp``:
    gate_proj 128 by 64. Inkling's sliding layers build their attention from the ``swa_`` widths: q_proj 4 heads
    of 16 by 64, k_proj 2 heads of 16 by 64 (modeling_inkling.py ``InklingAttention``)."""
    pytest.importorskip("torch")
    _, llama4 = _shrunk_model("llama4_text", interleave_moe_layer_step=2)
    dense = {tuple(p.shape) for n, p in llama4.named_parameters() if n.endswith("feed_forward.gate_proj.weight")}
    assert dense == {(128, 64)}
    out, inkling = _shrunk_model("inkling_text")
    sliding = [i for i, t in enumerate(out["layer_types"]) if "sliding" in t]
    attn = inkling.model.layers[sliding[0]].self_attn
    assert tuple(attn.q_proj.weight.shape) == (4 * 16, 64) and tuple(attn.k_proj.weight.shape) == (2 * 16, 64)


def test_blenderbot_keeps_two_decoder_layers():
    """Blenderbot's causal LM is its decoder, ``decoder_layers`` long (modeling_blenderbot.py
    ``BlenderbotForCausalLM``), while the class's ``attribute_map`` sends ``num_hidden_layers`` to the encoder's:
    two decoder layers kept (no per-layer field: the shrink's minimum of two)."""
    pytest.importorskip("torch")
    out, blender = _shrunk_model("blenderbot")
    assert out["decoder_layers"] == 2 and len(blender.model.decoder.layers) == 2
