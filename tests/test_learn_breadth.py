"""``fitplan learn-architecture`` on the breadth of transformers 5.24's causal-LM types (issue #32): a config
read as transformers reads it, a shrunk config that the model (not only its class) runs, repaired from the
model's own error or refused naming the field, and held-out configs that run.

Every config is a real type's (its class defaults, as ``AutoConfig.for_model(...).to_dict()`` gives them, which
is what bench/learn_breadth.py learns from); expected values are derived by hand from the modeling code cited at
each test. These build and step tiny models: slow (marked referee/slow by tests/conftest.py's importorskip rule).
"""

from __future__ import annotations

import json
import math

import pytest

from fitplan import FitplanError


def _defaults(model_type: str) -> dict:
    from transformers import AutoConfig

    return json.loads(json.dumps({**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type}))


def test_a_config_with_infinity_is_read_shrunk_and_runs(tmp_path):
    """Mamba2Config defaults ``time_step_limit`` to ``(0.0, inf)`` (configuration_mamba2.py); ``save_pretrained``
    of an older transformers wrote ``Infinity``, which ``json.loads`` (and so transformers'
    ``_dict_from_json_file``) reads. fitplan refused the file (\"non-finite number Infinity\"); it now reads it
    as transformers does, and the shrunk model runs a step."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.command import _read_config
    from fitplan_torch.learn.shrink import shrink
    from fitplan_torch.learn.shrink_run import run_error

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_defaults("mamba2")))  # json.dumps writes inf as Infinity
    assert "Infinity" in path.read_text()
    cfg = _read_config(str(path))
    assert cfg["time_step_limit"] == [0.0, math.inf]
    small = shrink(cfg)
    assert small["time_step_limit"] == [0.0, math.inf] and small["hidden_size"] == 64
    assert run_error(small) is None


def test_shrink_repairs_a_relation_only_the_model_needs():
    """CodeGenConfig defaults ``rotary_dim`` to 64 and does not check it against the head width; the model rotates
    ``rotary_dim`` channels of each head (modeling_codegen.py ``apply_rotary_pos_emb``). Shrunk to ``n_embd`` 64
    over 4 heads, a head is 16 wide and the step failed (\"size of tensor a (16) must match the size of tensor b
    (64)\"). The error quotes 64, the value of ``rotary_dim`` (a field shrinking did not touch): tried at 32 (still
    wider than a head, fails), then 16, which runs."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.derive import hf_config
    from fitplan_torch.learn.shrink import shrink
    from fitplan_torch.learn.shrink_run import run_error

    small = shrink(_defaults("codegen"))
    r = hf_config(small).to_dict()
    assert (r["n_embd"], r["n_head"]) == (64, 4)
    assert r["rotary_dim"] == 64 // 4
    assert run_error(small) is None
    err = run_error({**small, "rotary_dim": 64})  # the unrepaired config does not run: the repair is needed
    assert err is not None and "(64)" in str(err)


def test_shrink_refuses_an_unset_field_the_model_reads_by_name():
    """DeepseekV2Config defaults ``num_experts_per_tok`` to None (configuration_deepseek_v2.py); the MoE block sets
    ``self.top_k = config.num_experts_per_tok`` and calls ``torch.topk(scores, k=self.top_k)``
    (modeling_deepseek_v2.py), which raises a TypeError. The refusal names that field (the one the failing line
    reads, not the other None fields of the block) and the model line."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.shrink import shrink

    with pytest.raises(FitplanError) as e:
        shrink(_defaults("deepseek_v2"))
    assert e.value.field == "num_experts_per_tok" and e.value.value is None
    assert "modeling_deepseek_v2.py" in str(e.value) and "torch.topk" in str(e.value)
    cfg = {**_defaults("deepseek_v2"), "num_experts_per_tok": 2}  # a published config states it: shrinks and runs
    assert shrink(cfg)["num_experts_per_tok"] == 2


def test_heldout_configs_run():
    """The held-out config of the graph check must run, or it checks nothing (issue #32: about half the types
    failed verification on their own held-out configs). CodeGen with ``rotary_dim`` a variable: 5/2 of 16 is 40,
    which its class accepts but a 16-wide head cannot rotate (modeling_codegen.py); with the run check every larger
    candidate fails and ``rotary_dim`` stays at a size that runs."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.shrink import shrink
    from fitplan_torch.learn.verify import heldout, steps

    base = derive.hf_config(shrink(_defaults("codegen"))).to_dict()
    as_given = derive.Regime("as given", None)
    runs = steps("16", "eager")
    unchecked, b, s = heldout(base, ["rotary_dim"], as_given, 2, 16)
    assert unchecked["rotary_dim"] == 40 and not runs(unchecked, b, s)  # what the held-out config was
    cfg, b, s = heldout(base, ["rotary_dim"], as_given, 2, 16, runs=runs)
    assert cfg["rotary_dim"] <= 16 and runs(cfg, b, s)


def test_a_config_that_does_not_run_names_the_model_line():
    """A failure the learner cannot repair names the exception and the transformers model line it came from
    (verify.failing_line), so a report says which construct: CodeGen's rotary embedding above."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.shrink import shrink
    from fitplan_torch.learn.shrink_run import run_error
    from fitplan_torch.learn.verify import failing_line

    small = shrink(_defaults("codegen"))
    line = failing_line(run_error({**small, "rotary_dim": 64}))
    assert line.startswith("RuntimeError: The size of tensor a (16) must match the size of tensor b (64)")
    assert "models/codegen/modeling_codegen.py:" in line and "rotate_every_two" in line


def test_a_sum_with_a_large_constant_term_is_fitted():
    """Bamba's ``in_proj`` is ``intermediate_size + conv_dim + num_heads`` wide, ``conv_dim = intermediate_size +
    2 * n_groups * ssm_state_size`` (modeling_bamba.py ``BambaMixer.__init__``). Shrunk: intermediate 2 × 64 =
    128 and 8 heads held, so the width is 2·128 + 8 + 2·n_groups·d_state = 264 + 2·n_groups·d_state; over the
    probes (d_state 256 or 384, n_groups 1 or 2) that is 776, 1032, 1288, 1800. A constant term above 64 was
    refused (\"no expression ... fits\"), so Bamba, Falcon-H1, NemotronH and GraniteMoeHybrid did not learn."""
    from fitplan_torch.learn.fit import Fitter

    env = [{"mamba_d_state": d, "mamba_n_groups": g} for d, g in ((256, 1), (384, 1), (256, 2), (384, 2))]
    expr = Fitter(env, {"mamba_d_state": 1, "mamba_n_groups": 2}).fit([776, 1032, 1288, 1800])
    assert expr == "264 + 2*mamba_d_state*mamba_n_groups"
    with pytest.raises(ValueError, match="no expression"):  # a coefficient above 64 on a variable stays refused
        Fitter(env, {"mamba_d_state": 1, "mamba_n_groups": 2}).fit([100 * d * g for d, g in ((256, 1), (384, 1),
                                                                                             (256, 2), (384, 2))])


def test_a_causal_convolution_s_length_is_fitted():
    """Bamba's (and every Mamba's) ``conv1d`` pads ``d_conv - 1`` on both sides and the step keeps the first
    ``s`` outputs (modeling_bamba.py ``torch_forward``: ``self.conv1d(...)[..., :seq_len]``): the convolution's
    output is ``s + d_conv - 1`` long, two terms and a constant, which no two-term sum fits."""
    from fitplan_torch.learn.fit import Fitter

    env = [{"mamba_d_conv": d, "s": s} for d, s in ((4, 16), (6, 16), (4, 20), (6, 22))]
    assert Fitter(env, {"mamba_d_conv": 1, "s": 2}).fit([s + d - 1 for d, s in ((4, 16), (6, 16), (4, 20),
                                                                                  (6, 22))]) == "mamba_d_conv + s - 1"


def test_verification_leaves_out_checkpointing_a_model_cannot_do():
    """``CTRLLMHeadModel.supports_gradient_checkpointing`` is False (modeling_ctrl.py; ``gradient_checkpointing_enable``
    raises "does not support activation checkpointing", modeling_utils.py): the memory check ran its
    checkpointing cases anyway and the learning ended in an internal error. Llama's is True."""
    pytest.importorskip("transformers")
    from fitplan_torch.learn.verify import supports_checkpointing

    assert supports_checkpointing(_defaults("ctrl")) is False
    assert supports_checkpointing(_defaults("llama")) is True


def test_a_held_width_is_a_constant_of_the_spec():
    """Once CodeGen's ``rotary_dim`` is repaired to the head width (16), no probe can change ``n_embd`` or ``n_head``
    alone: the learning holds them (``held``: constants of the sizes, not symbols of the file). The spec was built
    from the file's symbols only, so ``hidden_size`` went missing and ``intermediate_size`` became ``4*None``: every
    estimate, the verification's first, ended in an internal error (exit 70). A held field is now its value:
    hidden 64 over 4 heads, a head 64 // 4 = 16 wide, and CodeGenConfig's ``n_inner`` None gives the MLP
    ``4 * n_embd`` = 256 rows (modeling_codegen.py ``CodeGenBlock``: ``inner_dim = config.n_inner if
    config.n_inner is not None else 4 * config.n_embd``)."""
    pytest.importorskip("transformers")
    from fitplan.arch.archexpr import compile_expr
    from fitplan_torch.learn.configrules import config_class, resolve, spec_map

    fields = {k: {} for k in ("vocab_size", "n_positions", "n_layer", "tie_word_embeddings")}
    cfg = {**_defaults("codegen"), "n_embd": 64, "n_head": 4, "rotary_dim": 16}
    spec = spec_map(resolve(cfg), config_class("codegen"), fields, {"n_embd": 64, "n_head": 4, "rotary_dim": 16})
    env = {"vocab_size": 50400, "n_positions": 2048, "n_layer": 28, "tie_word_embeddings": False}
    got = {k: compile_expr(v)(env) for k, v in spec.items() if isinstance(v, str)}
    assert (got["hidden_size"], got["num_attention_heads"], got["num_key_value_heads"]) == (64, 4, 4)
    assert (got["head_dim"], got["intermediate_size"], got["num_hidden_layers"]) == (16, 256, 28)
    assert spec_map(resolve(cfg), config_class("codegen"), fields).get("intermediate_size") is None  # no width: none


def test_codegen_learns_and_verifies_from_its_class_defaults(tmp_path):
    """The README command on CodeGenConfig's defaults (as bench/learn_breadth.py writes them) ended in exit 70 at the
    verification; it now learns, verifies and writes the file, which serves the shrunk config: 2 layers (the
    shrink's count), hidden 64, MLP 4 * 64 = 256 (see the test above)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.command import shrink
    from fitplan_torch.learn.learner import learn_and_check

    written = learn_and_check(shrink(_defaults("codegen")), tmp_path, verify=True, tolerance=0.01, log=lambda m: None)
    assert tmp_path / "codegen.json" in written
    spec = json.loads((tmp_path / "codegen.json").read_text())["spec"]
    assert (spec["hidden_size"], spec["intermediate_size"]) == ("64", "4*64")


def test_the_layer_pattern_probe_resizes_an_aliased_layer_types():
    """Zamba2Config names ``layer_types`` ``layers_block_type`` (its ``attribute_map``) and checks its length against
    ``num_hidden_layers`` (``validate_layer_type``). Shrinking keeps the 7 layers up to the first hybrid one
    (defaults: hybrid at 6, configuration_zamba2.py); the layer-pattern probe builds 8 layers and resized only lists
    named ``*layer_types``, so the class refused the probe (\"num_hidden_layers (8) must be equal to the number of
    layer_types (7)\", exit 70). The aliased list now follows the count, its pattern repeated: layer 7 is layer
    0's kind (linear attention) and the class derives the hybrid layers [6] from it."""
    pytest.importorskip("transformers")
    import copy

    from fitplan_torch.learn.derive import hf_config
    from fitplan_torch.learn.patterns import _set_layers
    from fitplan_torch.learn.shrink import shrink

    small = shrink(_defaults("zamba2"))
    assert small["num_hidden_layers"] == 7 and small["layers_block_type"][6] == "hybrid"
    c = copy.deepcopy(small)
    _set_layers(c, 8)
    assert c["layers_block_type"] == small["layers_block_type"] + ["linear_attention"]
    assert hf_config(c).hybrid_layer_ids == [6]


def test_jetmoe_verification_leaves_out_checkpointing():
    """``JetMoeForCausalLM.supports_gradient_checkpointing = False`` (modeling_jetmoe.py); the README command
    stopped at the checkpointed memory cases (\"does not support activation checkpointing\"). The check that
    leaves them out for CTRL covers it: the class attribute, read through the causal-LM mapping."""
    pytest.importorskip("transformers")
    from fitplan_torch.learn.verify import supports_checkpointing

    assert supports_checkpointing(_defaults("jetmoe")) is False


def test_the_layer_pattern_probe_resizes_a_stated_list_of_layer_kinds():
    """GPTNeoConfig expands ``attention_types`` (``[[["global", "local"], 12]]``) into ``attention_layers`` and
    requires one per layer (``validate_architecture``, configuration_gpt_neo.py); a stated ``attention_layers``
    is taken as given. Shrunk to 2 layers, the config states ``["global", "local"]``; the layer-pattern probe built
    8 layers and left the list at 2, so the class refused the probe (exit 70). The list now repeats: 8 entries
    alternating global / local, as the defaults' expansion has them."""
    pytest.importorskip("transformers")
    import copy

    from fitplan_torch.learn.derive import hf_config
    from fitplan_torch.learn.patterns import _set_layers
    from fitplan_torch.learn.shrink import shrink

    small = shrink(_defaults("gpt_neo"))
    assert small["num_layers"] == 2 and small["attention_layers"] == ["global", "local"]
    c = copy.deepcopy(small)
    _set_layers(c, 8)
    assert hf_config(c).attention_layers == ["global", "local"] * 4
    c = {**copy.deepcopy(small), "time_step_limit": [0.0, 1.0]}  # two numbers, not per layer: left alone
    _set_layers(c, 8)
    assert c["time_step_limit"] == [0.0, 1.0]
