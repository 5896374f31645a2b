"""Learned files read the fields the causal LM reads, count tied tensors once, and sit beside bundled presets
(issue #32: bart, bigbird_pegasus, blenderbot-small; bert, bert-generation, camembert, data2vec-text; qwen3_moe).

Every config is a real type's (its class defaults, as ``AutoConfig.for_model(...).to_dict()`` gives them, which is
what bench/learn_breadth.py learns from); expected values come from torch or from the transformers 5.24 code cited
at each test. These build tiny models: slow (marked referee/slow by tests/conftest.py's importorskip rule).
"""

from __future__ import annotations

import json

import pytest


def _defaults(model_type: str) -> dict:
    from transformers import AutoConfig

    return json.loads(json.dumps({**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type}))


@pytest.fixture
def arch_dir(tmp_path, monkeypatch):
    """A folder of learned files in force for the core (``FITPLAN_ARCH_DIR``), no disk cache."""
    from fitplan.api import clear_arch_caches

    d = tmp_path / "arch"
    d.mkdir()
    monkeypatch.setenv("FITPLAN_ARCH_DIR", str(d))
    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    clear_arch_caches()
    yield d
    clear_arch_caches()


@pytest.mark.parametrize("model_type", ["blenderbot-small", "bart", "bigbird_pegasus"])
def test_an_encoder_decoder_causal_lm_reads_the_decoder_fields(model_type):
    """BartConfig's ``attribute_map`` sends ``num_attention_heads`` to ``encoder_attention_heads`` and
    ``num_hidden_layers`` to ``encoder_layers`` (configuration_bart.py), but the causal LM is the decoder alone and
    its layers read ``decoder_attention_heads`` and ``decoder_layers`` (modeling_bart.py ``BartForCausalLM``,
    ``BartDecoder``). Built by torch with the two sides apart (2 encoder heads, 4 decoder heads; 1 encoder layer, 3
    decoder layers), the model's attention has the decoder's heads and layers; the spec reads those fields."""
    pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    from fitplan_torch.learn.configrules import config_class, resolve, spec_map

    sizes = {"d_model": 32, "encoder_attention_heads": 2, "decoder_attention_heads": 4, "encoder_layers": 1,
             "decoder_layers": 3, "encoder_ffn_dim": 48, "decoder_ffn_dim": 80, "vocab_size": 128,
             "max_position_embeddings": 64}
    if model_type == "bigbird_pegasus":
        sizes["attention_type"] = "original_full"
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **sizes))
    layers = model.model.decoder.layers
    assert len(layers) == 3 and layers[0].self_attn.num_heads == 4 and layers[0].fc1.out_features == 80
    fields = {k: {} for k in ("d_model", "decoder_attention_heads", "decoder_layers", "decoder_ffn_dim",
                              "vocab_size", "max_position_embeddings")}
    cfg = {**_defaults(model_type), **sizes}
    spec = spec_map(resolve(cfg), config_class(model_type), fields)
    assert (spec["hidden_size"], spec["num_attention_heads"], spec["num_hidden_layers"]) == \
        ("d_model", "decoder_attention_heads", "decoder_layers")
    assert (spec["head_dim"], spec["intermediate_size"]) == ("d_model//decoder_attention_heads", "decoder_ffn_dim")


def test_blenderbot_small_learns_a_file_its_memory_check_reads(arch_dir):
    """The README command on BlenderbotSmallConfig's defaults was refused at the memory check
    (``num_attention_heads must be an integer, got None``): the file's spec read the encoder's heads, which the
    decoder-only model never reads. Learned now, the file serves the shrunk config: its layers and heads are the
    decoder's, and its parameter count is torch's for the same config."""
    pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from fitplan.arch.architecture import spec_from_config
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.command import shrink
    from fitplan_torch.learn.files import write

    small = shrink(_defaults("blenderbot-small"))
    data, _, _ = derive.learn_full(small, log=lambda m: None)
    write(data, arch_dir)
    spec = spec_from_config(small)
    resolved = derive.hf_config(small)
    assert spec.num_attention_heads == resolved.decoder_attention_heads
    assert spec.num_hidden_layers == resolved.decoder_layers
    model = AutoModelForCausalLM.from_config(resolved)
    assert spec.param_count == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", ["bert", "bert-generation"])
def test_a_tied_vocabulary_bias_is_counted_once(arch_dir, model_type):
    """BERT's LM head ties ``cls.predictions.decoder.bias`` to ``cls.predictions.bias`` (and its weight to the word
    embedding) under ``tie_word_embeddings`` (modeling_bert.py ``BertLMHeadModel._tied_weights_keys``; transformers
    ties every key of that mapping and no other, modeling_utils.py ``get_expanded_tied_weights_keys``). The
    learner records untied tensors and wrote only the weight's tie, so the file counted the 512-entry bias twice:
    2048 B above the referee in 32-true. The learned file's parameter count is now torch's (``parameters()``
    counts a shared tensor once), tied and untied."""
    pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from fitplan.api import clear_arch_caches
    from fitplan.arch.architecture import spec_from_config
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.command import shrink
    from fitplan_torch.learn.files import write

    small = shrink(_defaults(model_type))
    data, _, _ = derive.learn_full(small, log=lambda m: None)
    assert ["lm_head.decoder.bias" if model_type != "bert" else "cls.predictions.decoder.bias",
            "lm_head.bias" if model_type != "bert" else "cls.predictions.bias", "tie_word_embeddings"] in data["tied"]
    write(data, arch_dir)
    clear_arch_caches()
    for tie in (True, False):
        cfg = {**small, "tie_word_embeddings": tie}
        model = AutoModelForCausalLM.from_config(derive.hf_config(cfg))
        assert spec_from_config(cfg).param_count == sum(p.numel() for p in model.parameters()), tie


def test_qwen3_moe_learns_beside_its_bundled_presets(arch_dir, cli_in_process):
    """Learning Qwen3MoeConfig's defaults (``norm_topk_prob = False``, configuration_qwen3_moe.py) was refused at
    its memory check: the estimate loaded the bundled rulesets, whose presets state ``norm_topk_prob = true``
    (rulesets/models/qwen3_moe.toml), and the loader validated them against the file being learned and rejected
    the whole directory ("invalid ruleset directory"). The memory check now runs (one case here: 32-true SDPA
    full fine-tuning, exact against the referee); installed, the file serves configs with its switches, the
    presets it cannot serve say so by name, and every other model estimates."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V
    from fitplan_torch.learn.command import shrink
    from fitplan_torch.learn.files import write

    small = shrink(_defaults("qwen3_moe"))
    data, _, _ = derive.learn_full(small, log=lambda m: None)
    assert data["flags"]["values"]["norm_topk_prob"] is False
    problems, rows = V.check_memory(data, small, lambda m: None, cases=[("32-true", "sdpa", False, "full")])
    assert problems == [] and len(rows) == 1
    write(data, arch_dir)
    (arch_dir / "config.json").write_text(json.dumps(small))
    common = ("--gpu", "h100-sxm", "--optim", "adamw_torch", "--precision", "bf16-mixed")
    ok = cli_in_process("estimate", "--model", str(arch_dir / "config.json"), *common)
    assert ok.returncode == 0, ok.stderr
    bad = cli_in_process("estimate", "--model", "qwen3-30b-a3b", *common)
    assert bad.returncode == 2 and "model preset 'qwen3-30b-a3b' is unavailable" in bad.stderr
    assert str(arch_dir / "qwen3_moe.json") in bad.stderr
    other = cli_in_process("estimate", "--model", "llama-3.2-1b", *common)
    assert other.returncode == 0, other.stderr
