"""Which part of a config ``fitplan learn-architecture`` learns from, and which of its fields the causal LM reads
(issue #32): a composite config's decoder (MusicGen's ``decoder``, the config ``MusicgenForCausalLM`` takes), and
the decoder's layer count of an encoder-decoder family whose ``num_hidden_layers`` is a property returning the
encoder's (ProphetNet).

Expected values are by hand from transformers 5.24's code cited at each test, or measured on the model torch
builds; never from fitplan's output.
"""

from __future__ import annotations

import json

import pytest

from fitplan.arch.architecture import decoder_config


def test_decoder_config_reads_the_part_a_causal_lm_is_built_from():
    """``PreTrainedConfig.get_text_config(decoder=True)`` looks for ``decoder``, ``generator`` and ``text_config``
    (configuration_utils.py, 5.24) and refuses more than one; a config with its own ``hidden_size`` is a flat one."""
    musicgen = {"model_type": "musicgen", "text_encoder": {"model_type": "t5"}, "audio_encoder": {},
                "decoder": {"model_type": "musicgen_decoder", "hidden_size": 8}}
    assert decoder_config(musicgen) == {"model_type": "musicgen_decoder", "hidden_size": 8}
    vlm = {"model_type": "mllama", "text_config": {"hidden_size": 8}, "vision_config": {"hidden_size": 4}}
    assert decoder_config(vlm) == {"model_type": "mllama", "hidden_size": 8}  # no model_type: the outer one's
    flat = {"model_type": "fuyu", "hidden_size": 8, "text_config": {"hidden_size": 4}}
    assert decoder_config(flat) == flat
    both = {"model_type": "x", "decoder": {"hidden_size": 8}, "text_config": {"hidden_size": 4}}
    assert decoder_config(both) == both  # ambiguous, as transformers says: left as given
    assert decoder_config({"model_type": "t5", "decoder_layers": 2}) == {"model_type": "t5", "decoder_layers": 2}


def test_musicgen_decoder_builds_its_causal_lm():
    """``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` lists ``musicgen -> MusicgenForCausalLM`` (modeling_auto.py), whose
    ``config_class`` is ``MusicgenDecoderConfig``, MusicgenConfig's ``decoder``; ``AutoModelForCausalLM.from_config``
    passes the outer config whole (auto_factory.py substitutes only a ``text_config``) and the decoder's layers read
    ``config.dropout``, which MusicgenConfig lacks. Built from its decoder part, the learner gets the class with one
    LM head per codebook (modeling_musicgen.py ``MusicgenForCausalLM.__init__``)."""
    pytest.importorskip("torch")
    from transformers import AutoConfig

    from fitplan_torch.learn import derive
    from fitplan_torch.learn.command import text_config

    cfg = text_config({**AutoConfig.for_model("musicgen").to_dict(), "model_type": "musicgen"})
    assert cfg["model_type"] == "musicgen_decoder"
    small = {**cfg, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "ffn_dim": 32,
             "vocab_size": 32, "num_codebooks": 3}
    model, _ = derive.build(small, "16", "eager")
    assert type(model).__name__ == "MusicgenForCausalLM"
    assert len(model.lm_heads) == 3


def test_prophetnet_causal_lm_reads_the_decoder_s_layer_count():
    """ProphetNetConfig's ``num_hidden_layers`` is a property returning ``num_encoder_layers`` (its setter raises)
    and its ``attribute_map`` sends ``num_attention_heads`` to ``num_encoder_attention_heads``
    (configuration_prophetnet.py, 5.24); ``ProphetNetForCausalLM`` is the decoder alone, whose layers are
    ``range(config.num_decoder_layers)`` with ``num_decoder_attention_heads`` heads (modeling_prophetnet.py). Measured:
    a model with 3 encoder and 2 decoder layers has 2 layers. Control: the property itself says 3, the encoder's."""
    pytest.importorskip("torch")
    from transformers import AutoConfig

    from fitplan_torch.learn import derive
    from fitplan_torch.learn.configrules import causal_field, config_class

    cls = config_class("prophetnet")
    assert causal_field(cls, "num_hidden_layers") == "num_decoder_layers"
    assert causal_field(cls, "num_attention_heads") == "num_decoder_attention_heads"
    small = {"model_type": "prophetnet", "hidden_size": 16, "num_encoder_layers": 3, "num_decoder_layers": 2,
             "num_encoder_attention_heads": 2, "num_decoder_attention_heads": 4, "encoder_ffn_dim": 32,
             "decoder_ffn_dim": 32, "vocab_size": 32}
    assert AutoConfig.for_model(**small).num_hidden_layers == 3
    model, _ = derive.build(small, "16", "eager")
    decoder = model.prophetnet.decoder
    assert len(decoder.layers) == small[causal_field(cls, "num_hidden_layers")] == 2
    assert decoder.layers[0].self_attn.num_attn_heads == small[causal_field(cls, "num_attention_heads")] == 4


def test_xlnet_float32_parameters_leave_bf16_true_out(tmp_path, monkeypatch):
    """XLNet creates its attention weights as ``torch.FloatTensor`` (modeling_xlnet.py
    ``XLNetRelativeAttention.__init__``): float32 under any default dtype. Measured here: saved and loaded back with
    ``from_pretrained(dtype=bfloat16)`` (core_model_loading.py keeps a parameter's own dtype where it differs), ``q``
    stays float32 and a bf16 training step raises, in transformers alone; loaded in float32 and run under bf16
    autocast (bf16-mixed), it trains: ``einsum`` is on autocast's lower-precision list, which casts both operands.
    So the shrunk config is kept (the learner learns bf16-mixed and leaves the 16-bit class out), naming the
    parameters; where the bf16-mixed step fails too (stubbed here), it is refused naming both. Control: before
    this change ``runnable`` raised the refusal for this config (the breadth row of xlnet,
    learn-9zzzzzz-d-misc8.json)."""
    pytest.importorskip("torch")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from fitplan import FitplanError
    from fitplan_torch.learn import shrink_run
    from fitplan_torch.learn.shrink_run import run_error, runnable

    small = {"model_type": "xlnet", "d_model": 16, "n_layer": 1, "n_head": 2, "d_inner": 32, "vocab_size": 32}
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**small)).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.transformer.layer[0].rel_attn.q.dtype == torch.float32
    assert loaded.transformer.word_embedding.weight.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="scalar type"):
        loaded(input_ids=ids, labels=ids)
    fp32 = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert torch.isfinite(fp32(input_ids=ids, labels=ids).loss)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(fp32(input_ids=ids, labels=ids).loss)
    said: list[str] = []
    assert runnable(small, small, run_error(small), said.append) == small
    assert "keeps 10 parameter(s) in float32" in said[0]  # 9 per layer and mask_emb (modeling_xlnet.py) and "it runs in bf16-mixed" in said[0]
    monkeypatch.setattr(shrink_run, "run_error", lambda cfg, precision="16": RuntimeError(f"stub {precision}"))
    with pytest.raises(FitplanError, match=r"keeps \d+ parameter\(s\) in float32 .*rel_attn\.q.*bf16-mixed step "
                                           r"fails too: RuntimeError: stub mixed"):
        runnable(small, small, RuntimeError("expected scalar type Float but found BFloat16"))


def test_a_width_the_class_pins_to_its_derivation_is_left_to_the_class():
    """XLNetConfig sets ``d_head = d_model // n_head`` when None, and its ``validate_architecture`` raises unless a
    stated ``d_head`` equals that (configuration_xlnet.py, 5.24): ``to_dict`` states it, so the learner's base
    left no probe able to change ``d_model`` or ``n_head`` alone (the file held all three at the tiny sizes,
    run). Expected by hand from that code: ``d_head`` alone. Controls: LlamaConfig derives ``head_dim`` the same
    way but accepts any stated value; RecurrentGemmaConfig derives ``num_key_value_heads`` from the heads and
    rejects only larger values (configuration_recurrent_gemma.py): neither is pinned."""
    from transformers import AutoConfig

    from fitplan_torch.learn.shrink_lists import pinned_widths

    xlnet = AutoConfig.for_model("xlnet", d_model=64, n_head=4, d_inner=128, n_layer=2, vocab_size=64).to_dict()
    assert xlnet["d_head"] == 16 and pinned_widths(xlnet) == ["d_head"]
    llama = AutoConfig.for_model("llama", hidden_size=64, num_attention_heads=4, num_hidden_layers=2).to_dict()
    assert llama["head_dim"] == 16 and pinned_widths(llama) == []
    rg = AutoConfig.for_model("recurrent_gemma", hidden_size=64, num_attention_heads=4).to_dict()
    assert rg["num_key_value_heads"] == 4 and pinned_widths(rg) == []


def test_xlnet_learns_bf16_mixed_and_refuses_the_16_bit_class_by_name(tmp_path, cli_in_process):
    """The README command on XLNet's class defaults: the learner leaves the 16-bit class out (bf16-true fails in
    transformers itself, previous test), learns and verifies bf16-mixed, and the file holds no size (``d_head``
    left to the class), so fitplan estimates the defaults (1024 wide, 16 heads) in bf16-mixed and refuses
    bf16-true and 32-true by name (exit 2), naming the presets that replay the 16-bit graph. Controls: before,
    the learning was refused (exit 2); with ``d_head`` stated, the estimate was refused for the held d_head,
    d_model and n_head (run)."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys

    from transformers import AutoConfig

    path = tmp_path / "config.json"
    path.write_text(json.dumps(AutoConfig.for_model("xlnet").to_dict(), default=str))
    proc = cli_in_process("learn-architecture", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "16/eager: left out, the model does not run in it (the model keeps" in said
    learned = json.loads((tmp_path / "out" / "xlnet.json").read_text())
    assert not learned.get("held") and learned["verified"]  # no size held (it held d_head, d_model, n_head)

    def estimate(precision):
        run = subprocess.run([sys.executable, "-m", "fitplan", "estimate", "--model", str(path), "--precision",
                              precision], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "FITPLAN_ARCH_DIR": str(tmp_path / "out"), "FITPLAN_NO_CACHE": "1"})
        return run.returncode, " ".join((run.stdout + run.stderr).split())

    rc, out = estimate("bf16-mixed")
    assert rc == 0, out[-2000:]
    for precision in ("bf16-true", "32-true"):
        rc, out = estimate(precision)
        assert rc == 2 and "Traceback" not in out, out[-2000:]
        assert "xlnet does not run in precision class '16'" in out and "32-true, bf16-true" in out


def test_musicgen_label_layout_is_refused_by_name():
    """MusicgenForCausalLM reads ``input_ids`` as ``(batch * num_codebooks, seq)`` and ``labels`` as ``(batch, seq,
    num_codebooks)`` (modeling_musicgen.py ``forward``, 5.24). Measured: the learner's batch (2 rows of 16 ids,
    labels = input_ids) with 2 codebooks gives 16 logit rows per codebook (one sample of 16 frames) against 2
    label rows, and the refusal says so (a hidden size of 32: no width the error quotes, which the shrink's repairs
    would try); control: the same model with the layout it documents trains."""
    pytest.importorskip("torch")
    import torch
    from transformers import AutoConfig

    from fitplan import FitplanError
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.command import text_config
    from fitplan_torch.learn.shrink_run import run_error, runnable

    cfg = text_config({**AutoConfig.for_model("musicgen").to_dict(), "model_type": "musicgen"})
    small = {**cfg, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "ffn_dim": 64,
             "vocab_size": 32, "num_codebooks": 2}
    with pytest.raises(FitplanError, match=r"another layout .* gives 16 logit rows against 2 label rows"):
        runnable(small, small, run_error(small))
    model, _ = derive.build(small, "16", "eager")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32, (2 * 2, 16), generator=g)  # 2 samples x 2 codebooks
    labels = torch.randint(0, 32, (2, 16, 2), generator=g)
    assert torch.isfinite(model(input_ids=ids, labels=labels).loss)


def test_olmo_hybrid_key_head_width_is_derived_as_the_class_does():
    """OlmoHybridConfig derives ``linear_key_head_dim = int(0.75 * hidden_size / linear_num_key_heads)`` when unset
    (configuration_olmo_hybrid.py ``__post_init__``, 5.24). The fitted rule, read by the core's expression
    evaluator, gives by hand's value at sizes the fit never saw (h=96, k=5: int(14.4) = 14; h=200, k=3: 50);
    control: the class resolves the same."""
    pytest.importorskip("transformers")
    from fitplan.api import compile_expr
    from fitplan_torch.learn.configrules import _class_derivation, resolve

    cfg = {"model_type": "olmo_hybrid", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
           "linear_num_key_heads": 4, "linear_num_value_heads": 4, "intermediate_size": 128}
    fields = ["hidden_size", "num_attention_heads", "linear_num_key_heads", "linear_num_value_heads"]
    expr = _class_derivation(cfg, "linear_key_head_dim", fields)
    assert expr is not None
    f = compile_expr(expr)
    for h, k in ((96, 5), (200, 3)):
        by_hand = int(0.75 * h / k)
        assert f({"hidden_size": h, "linear_num_key_heads": k, "num_attention_heads": 4}) == by_hand
        assert resolve({**cfg, "hidden_size": h, "linear_num_key_heads": k})["linear_key_head_dim"] == by_hand


def test_derived_fields_follow_what_they_read_through_a_chain():
    """The core reads a file's fields in order and derives each from those already read (ArchFile.symbols), so the
    learner writes a derived field after every field its derivation names, also through a chain. BailingHybridConfig
    sets ``linear_conv_kernel_dim = short_conv_kernel_size`` (models/bailing_hybrid/configuration_bailing_hybrid.py
    ``__post_init__``, 5.24); a field derived from ``linear_conv_kernel_dim`` in turn (``conv_pad`` here, the
    model's ``padding = conv_kernel_size - 1``) makes the chain. Expected by hand: ``short, linear, pad`` in that
    order, and a config stating ``short_conv_kernel_size`` 7 reads 7 and 6. Control: the single pass this replaces
    gave ``conv_pad, short_conv_kernel_size, linear_conv_kernel_dim``, and reading it failed ("cannot derive
    conv_pad (linear_conv_kernel_dim - 1): 'linear_conv_kernel_dim'")."""
    from types import SimpleNamespace

    from fitplan.arch.archfile import ArchFile
    from fitplan_torch.learn.configrules import _derived_last

    fields = {"conv_pad": {"type": "int", "default": None, "derive": "linear_conv_kernel_dim - 1"},
              "linear_conv_kernel_dim": {"type": "int", "default": None, "derive": "short_conv_kernel_size"},
              "short_conv_kernel_size": {"type": "int", "default": 4}}
    ordered = _derived_last(fields)
    assert list(ordered) == ["short_conv_kernel_size", "linear_conv_kernel_dim", "conv_pad"]
    fake = SimpleNamespace(config={"fields": ordered, "checks": []}, data={})
    env = ArchFile.symbols(fake, {"short_conv_kernel_size": 7})
    assert (env["linear_conv_kernel_dim"], env["conv_pad"]) == (7, 6)
    assert ArchFile.symbols(fake, {})["conv_pad"] == 3  # the class default 4, less one


def test_a_causal_lm_that_takes_no_labels_is_refused_naming_its_class(tmp_path, cli_in_process):
    """Gemma4AssistantForCausalLM's forward takes ``input_ids`` ("not actually used"), ``inputs_embeds`` and
    ``shared_kv_states`` (the target model's), and no ``labels``; it returns logits and no loss
    (models/gemma4_assistant/modeling_gemma4_assistant.py, 5.24): a speculative-decoding drafter, with no training
    step of token ids to learn. The README command refuses it by name before shrinking (exit 2), from the class
    defaults with the fixture the bench uses (the class's own check: no per-layer inputs). Controls: before, it
    ran and ended in the model's TypeError at modeling_gemma4.py (its breadth row); llama's causal LM takes
    labels, and the check lets it through."""
    from pathlib import Path

    from transformers import AutoConfig

    from fitplan_torch.learn.command import _check_takes_labels

    cfg = AutoConfig.for_model("gemma4_assistant", text_config={"hidden_size_per_layer_input": 0,
                                                                "vocab_size_per_layer_input": 0}).to_dict()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg, default=str))
    proc = cli_in_process("learn-architecture", str(path), "--out", str(tmp_path / "out"))
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in said, said[-2000:]
    assert "Gemma4AssistantForCausalLM takes no labels and returns no loss" in said and "shared_kv_states" in said
    assert _check_takes_labels("llama", Path("config.json")) is None


def test_a_nested_field_the_class_overwrites_follows_its_leader():
    """MoshiConfig sets ``depth_decoder_config["input_size"] = hidden_size`` whatever the config states
    (models/moshi/configuration_moshi.py ``__post_init__``, 5.24), so a probe that changes ``hidden_size`` alone
    changes the nested ``input_size`` with it. The learner took that as a second variable changing and dropped
    the probe, and the file held ``hidden_size`` at the regime's 192 (its memory check then refused the shrunk
    config's 64, the breadth row of moshi). Expected by hand from that code: ``input_size`` follows
    ``hidden_size``. Control: ``num_filters`` of ``audio_encoder_config``, which the class does not set from
    ``hidden_size``, does not."""
    from transformers import AutoConfig

    from fitplan_torch.learn import derive

    base = AutoConfig.for_model("moshi", hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                audio_encoder_config={"hidden_size": 64, "num_filters": 8},
                                depth_decoder_config={"hidden_size": 64}).to_dict()
    derive.NESTED.clear()
    derive.NESTED.update(derive.nested_variables(base))
    try:
        assert derive.NESTED["input_size"] == ("depth_decoder_config", "input_size")
        assert derive.follows(base, "input_size", "hidden_size", 96)
        # overwritten whatever it states: not a field of the file (its value read by the nested name)
        assert derive.derived_by_config(base, "input_size", derive.get_var(base, "input_size"))
        assert "num_filters" in derive.NESTED and not derive.follows(base, "num_filters", "hidden_size", 96)
    finally:
        derive.NESTED.clear()
