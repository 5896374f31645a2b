"""``fitplan learn-architecture`` on configs whose per-layer lists and layer counts the learner used to break
(issue #32, the internal errors and shrinking / probe faults): a per-layer list of kinds the layer pattern
probe did not resize (HYV4), a per-layer width list the class derives (Laguna), a layer count the class derives
from a list (NemotronH), a recurrent-depth model (HRM-Text) and a coincidence of the shrunk widths taken for a
relation (Mamba-2).

Every config is a real type's (its class defaults, as ``AutoConfig.for_model(...).to_dict()`` gives them, what
bench/learn_breadth.py learns from); expected values are derived by hand from the modeling code cited at each
test, or measured on the model transformers builds. These build tiny models: slow (marked referee/slow by
tests/conftest.py's importorskip rule).
"""

from __future__ import annotations

import json

import pytest


def _defaults(model_type: str) -> dict:
    from transformers import AutoConfig

    return json.loads(json.dumps({**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type}))


def test_the_layer_pattern_probe_resizes_a_list_of_kinds_not_named_for_layers():
    """HYV4Attention reads ``config.indexer_types[layer_idx]`` (``skip_topk = ... == "shared"``,
    transformers/models/hy_v4/modeling_hy_v4.py). Shrinking keeps 3 layers (dense/full, sparse/full,
    sparse/shared: the first index where every kind of layer has occurred; defaults ``full, full, shared, shared,
    shared, full, ...``); the layer-pattern probe built 8 layers and left ``indexer_types`` at 3 entries, and the
    model indexed past its end (IndexError, exit 70). The list now repeats its pattern: layer i is shared where
    ``i % 3 == 2``, which the attention modules of the built model show."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.derive import build
    from fitplan_torch.learn.patterns import with_layers
    from fitplan_torch.learn.record import decoder_layers
    from fitplan_torch.learn.shrink import shrunk_config

    small = shrunk_config(_defaults("hy_v4"))
    assert small["num_hidden_layers"] == 3 and small["indexer_types"] == ["full", "full", "shared"]
    model, _ = build(with_layers(small, 8), "16", "eager")
    assert [layer.self_attn.skip_topk for layer in decoder_layers(model)] == [i % 3 == 2 for i in range(8)]


def test_a_per_layer_width_list_the_class_derives_is_left_to_it():
    """LagunaConfig sets ``num_attention_heads_per_layer = [num_attention_heads] * num_hidden_layers`` when it is
    None and requires one entry per layer (configuration_laguna.py); ``to_dict`` states it (48 heads, 40 times).
    Shrinking cut it to ``[48, 48]`` beside 4 heads, and the layer-pattern probe's 8 layers were refused
    (\"num_attention_heads_per_layer length (2) must equal num_hidden_layers (8)\", exit 70). Left to the class, it
    follows the shrunk heads and every layer count: each layer's ``q_proj`` is 4 heads * 16 = 64 wide (LagunaAttention:
    ``Linear(hidden_size, num_heads * head_dim)`` with the layer's head count), at 2 layers and at 8, and 12 * 16 at
    the GQA regime's 12 heads (the heads probe held ``num_key_value_heads`` when every layer kept 4 heads)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.derive import build
    from fitplan_torch.learn.learner import _base_config
    from fitplan_torch.learn.patterns import with_layers
    from fitplan_torch.learn.record import decoder_layers
    from fitplan_torch.learn.shrink import shrunk_config

    given = _defaults("laguna")
    assert given["num_attention_heads_per_layer"] == [48] * 40
    small = shrunk_config(given)
    assert "num_attention_heads_per_layer" not in small
    assert (small["num_attention_heads"], small["head_dim"], small["num_hidden_layers"]) == (4, 16, 2)
    for cfg, n in ((small, 2), (with_layers(small, 8), 8)):
        model, _ = build(cfg, "16", "eager")
        assert [layer.self_attn.q_proj.out_features for layer in decoder_layers(model)] == [4 * 16] * n
    base, _ = _base_config(small)  # the learner records from to_dict(), which states the list again: dropped
    assert "num_attention_heads_per_layer" not in base
    model, _ = build({**base, "num_attention_heads": 12, "num_key_value_heads": 6, "hidden_size": 192}, "16", "eager")
    assert [layer.self_attn.q_proj.out_features for layer in decoder_layers(model)] == [12 * 16] * 2


def test_a_stated_per_layer_list_the_class_does_not_derive_is_kept():
    """A list the class would not derive as stated (one layer with other heads) is no derived list: shrinking keeps
    it, cut to the kept layers (the class then checks its length)."""
    pytest.importorskip("transformers")
    from fitplan_torch.learn.shrink_lists import derived_layer_widths

    given = _defaults("laguna")
    full = dict(given)
    assert derived_layer_widths(given, full, 40) == ["num_attention_heads_per_layer"]
    odd = {**given, "num_attention_heads_per_layer": [48] * 39 + [32]}
    assert derived_layer_widths(odd, odd, 40) == []


def test_a_layer_count_the_class_derives_from_a_list_is_read_as_its_length():
    """NemotronHConfig's ``num_hidden_layers`` is a property, ``len(self.layers_block_type)``, that ignores a stated
    value, and ``to_dict`` leaves it out (configuration_nemotron_h.py). The learned file read the config's None and
    every estimate crashed (``int(None)`` in the layer count, exit 70). The file now derives it as the list's length,
    and the core reads 4 layers from the class defaults' 4 block types (and 8 from a list twice as long)."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from fitplan.arch.archexpr import compile_expr
    from fitplan_torch.learn import configrules

    cfg = _defaults("nemotron_h")
    assert "num_hidden_layers" not in cfg and len(cfg["layers_block_type"]) == 4
    probe = SimpleNamespace(cfg=cfg, env={"hidden_size": cfg["hidden_size"]})
    out = configrules.learn_config("nemotron_h", ["hidden_size", "layers_block_type", "num_hidden_layers"], [probe],
                                   lambda msg: None)
    spec = out["fields"]["num_hidden_layers"]
    assert spec["derive"] == "len(layers_block_type)"
    assert list(out["fields"]).index("num_hidden_layers") > list(out["fields"]).index("layers_block_type")
    blocks = cfg["layers_block_type"]
    assert compile_expr(spec["derive"])({"layers_block_type": blocks}) == 4
    assert compile_expr(spec["derive"])({"layers_block_type": blocks * 2}) == 8


def test_a_field_read_only_by_a_derivation_becomes_a_field():
    """ModernBertDecoderConfig derives ``sliding_window = local_attention // 2`` (configuration_modernbert_decoder.py)
    and the model reads only ``sliding_window``. The learned derivation read ``local_attention``, which the file did
    not hold: every estimate stopped at "unknown name 'local_attention'". The file now holds ``local_attention``
    with the class's default, before the field derived from it; the class itself gives the expected values."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from fitplan.arch.archexpr import compile_expr
    from fitplan_torch.learn import configrules

    base = _defaults("modernbert-decoder")
    probes = []
    for la in (128, 64, 96, 40):
        cfg = {**base, "local_attention": la}
        cfg.pop("sliding_window", None)
        probes.append(SimpleNamespace(cfg=cfg, env={"hidden_size": cfg["hidden_size"], "local_attention": la}))
    out = configrules.learn_config("modernbert-decoder", ["hidden_size", "sliding_window"], probes, lambda msg: None)
    fields = out["fields"]
    assert fields["local_attention"]["default"] == 128
    assert list(fields).index("local_attention") < list(fields).index("sliding_window")
    derive = compile_expr(fields["sliding_window"]["derive"])
    for la in (256, 130):
        expected = configrules.resolve({"model_type": "modernbert-decoder", "local_attention": la})["sliding_window"]
        assert derive({"local_attention": la}) == expected


def test_a_stated_layer_count_gets_no_length_rule():
    """Llama states ``num_hidden_layers`` (an integer field, 32 by default): no ``len(...)`` rule is learned."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from fitplan_torch.learn import configrules

    cfg = _defaults("llama")
    probe = SimpleNamespace(cfg=cfg, env={"hidden_size": cfg["hidden_size"]})
    out = configrules.learn_config("llama", ["hidden_size", "num_hidden_layers"], [probe], lambda msg: None)
    assert "derive" not in out["fields"]["num_hidden_layers"]


def test_a_layer_that_runs_more_than_once_is_a_refusal_naming_it():
    """HrmTextModel calls its L stack ``L_cycles`` times per H cycle and its H stack once (``H_cycles`` = 2,
    ``L_cycles`` = 3 by default: configuration_hrm_text.py; modeling_hrm_text.py ``HrmTextModel.forward``). The
    recorder hooks the first of the two stacks' layer lists (``L_module``, registered first), so each of its layers
    runs 2 * 3 = 6 times in one step. The epilogue then read the H stack's output, made outside every recorded
    layer, and the learner refused with no construct named (\"other\"); it now names the recurrent depth."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.derive import LearnError
    from fitplan_torch.learn.segments import Cut
    from fitplan_torch.learn.shrink import shrunk_config

    cfg = {**shrunk_config(_defaults("hrm_text")), "num_layers_per_stack": 1}
    rec = derive.run(cfg, "16", "sdpa", 2, 16)
    with pytest.raises(LearnError, match="decoder layer 0 runs 6 times in one training step"):
        Cut(rec, {})


def test_a_coincidence_of_the_shrunk_widths_is_no_product():
    """Mamba-2 needs ``hidden_size * expand == num_heads * head_dim`` (Mamba2Config checks it; modeling_mamba2.py
    splits ``in_proj`` by it). Shrunk: 64 wide, 8 heads of 16, expand 2, 8 groups, so ``hidden_size == num_heads *
    n_groups`` holds by chance, and doubling ``num_heads`` with ``hidden_size`` runs (128 * 2 == 16 * 16): the
    product probe took it for a relation. Checked at a second point, ``n_groups`` doubled with ``hidden_size``
    (128 * 2 != 8 * 16), it fails: no relation. Helium's ``hidden_size == num_attention_heads * head_dim``
    (modeling_helium.py ``o_proj``) holds at a second point too."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.relations import _holds_again
    from fitplan_torch.learn.shrink import shrink

    m = shrink(_defaults("mamba2"))
    assert (m["hidden_size"], m["num_heads"], m["head_dim"], m["expand"], m["n_groups"]) == (64, 8, 16, 2, 8)
    assert _holds_again(m, "hidden_size", "num_heads", "n_groups") is False
    h = shrink(_defaults("helium"))
    assert _holds_again(h, "hidden_size", "num_attention_heads", "head_dim") is True


def test_a_second_state_carried_between_layers_is_bound_not_refused():
    """HYV4's decoder layers return ``(hidden_states, topk_indices)`` and the model passes the indexer's top-k to the
    next layer as ``prev_topk_indices`` (modeling_hy_v4.py ``HYV4Model.forward``; a ``"shared"`` layer reuses it).
    Recorded, layer 1 takes a tensor made inside layer 0 (segment 1) that is not layer 0's hidden state: it was
    refused naming the argument; it is now noted as read from layer 0 (its maker's rule is fitted over every layer,
    tests/test_learn_cross_layer.py). Control: a tensor made outside every segment is still refused, naming it."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.derive import _foreign_argument, _layer_refs
    from fitplan_torch.learn.segments import Cut
    from fitplan_torch.learn.shrink import shrunk_config

    rec = derive.run(shrunk_config(_defaults("hy_v4")), "16", "eager", 2, 16)
    cut = Cut(rec, {})
    layer1 = cut.segments[2]
    foreign = [(tid, a) for tid, a in layer1["argmap"].items()
               if tid != cut.segments[1]["out_tid"] and (cut.owner_seg.get(tid) or (0,))[0] != 0]
    assert len(foreign) == 1
    tid, a = foreign[0]
    reads: dict = {}
    refs = _layer_refs(cut, layer1, 1, "k", reads)
    assert refs[a] is None and reads == {("k", a): [(1, 0, cut.owner_seg[tid][1])]}
    msg = _foreign_argument(cut, layer1, 1, a, None)
    assert f"layer 1 argument {a} (prev_topk_indices)" in msg and "made outside every layer" in msg


def test_an_attention_free_model_gives_the_core_its_ssm_heads():
    """Mamba2Config leaves ``num_attention_heads`` None and has ``num_heads`` (configuration_mamba2.py); the core
    requires an integer head count (src/fitplan/arch/architecture.py), so the learned file's estimate refused it in
    the memory check (\"num_attention_heads must be an integer, got None\"). The spec now reads the SSM heads; a
    model with attention keeps its own."""
    pytest.importorskip("transformers")
    from fitplan_torch.learn import configrules

    m = _defaults("mamba2")
    cls = configrules.config_class("mamba2")
    spec = configrules.spec_map(m, cls, {"hidden_size": {}, "num_heads": {}, "head_dim": {}, "vocab_size": {}})
    assert spec["num_attention_heads"] == "num_heads" and spec["num_key_value_heads"] == "num_heads"
    llama = _defaults("llama")
    spec = configrules.spec_map(llama, configrules.config_class("llama"),
                                {"hidden_size": {}, "num_attention_heads": {}, "num_heads": {}})
    assert spec["num_attention_heads"] == "num_attention_heads"
