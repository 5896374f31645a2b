"""Parameters the training step leaves without a gradient (issue #32): the learned file's ``no_grad``.

A causal LM taken from an encoder-decoder family (``BartForCausalLM``, transformers 5.24 models/bart/modeling_bart.py)
builds each decoder layer's cross-attention (``encoder_attn``, ``encoder_attn_layer_norm``) and runs it only
``if encoder_hidden_states is not None`` (``BartDecoderLayer.forward``), which a causal-LM step never passes: those
parameters keep ``.grad = None`` and AdamW gives them no state (torch/optim/adam.py ``Adam._init_group``, which
AdamW inherits: only ``p.grad is not None`` joins the step). peft still wraps such a Linear (it matches names), so its
adapters are weights without a gradient.

The core's rules are checked on tiny-llama with a ``no_grad`` row added by hand (values derived from the shapes);
the recorder's measurement on a tiny ``BartForCausalLM`` against torch itself (one AdamW step). The test that builds
a model is slow (referee/slow through tests/conftest.py's importorskip).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "tests" / "data" / "configs" / "tiny-llama" / "config.json")
V_PROJ = "model.layers.{i}.self_attn.v_proj.weight"


@pytest.fixture
def with_no_grad(tiny_llama_with):
    """``estimate(no_grad, **kw)``: fitplan's estimate of tiny-llama with the learned file's ``no_grad`` set."""
    def estimate(no_grad, model=CONFIG, **kw):
        return tiny_llama_with({"no_grad": no_grad} if no_grad else {}, model=model, **kw)

    return estimate


def test_a_parameter_without_gradient_has_no_gradient_state_or_trainable_count(with_no_grad):
    """tiny-llama (hidden 64, 2 layers, 4 heads of 16, 4 KV heads: ``v_proj`` is 64 × 64), bf16-true full
    fine-tuning with ``adamw_torch``, ``v_proj`` listed ``no_grad``: the weights stay; the gradients lose
    2 × 4096 × 2 bytes; the states 2 × (4096 × 2 × 2 + 4) bytes (``exp_avg``, ``exp_avg_sq`` in bf16, ``step`` a
    0-d fp32 tensor); the trainable count 8192; the estimate says so, naming the module."""
    full = with_no_grad([])
    part = with_no_grad([V_PROJ])
    assert part["weight_bytes"] == full["weight_bytes"]
    assert full["gradient_bytes"] - part["gradient_bytes"] == 2 * 4096 * 2
    assert full["optimizer_state_bytes"] - part["optimizer_state_bytes"] == 2 * (4096 * 2 * 2 + 4)
    assert full["trainable_param_count"] - part["trainable_param_count"] == 8192
    said = [w for w in part.warnings if "receive no gradient" in w]
    assert len(said) == 1 and said[0].startswith("8192 parameters receive no gradient in this step: "
                                                 "model.layers.{i}.self_attn.v_proj.* ")
    assert not [w for w in full.warnings if "receive no gradient" in w]


def test_lora_adapters_on_a_module_without_gradient_are_weights_only(with_no_grad):
    """LoRA r = 8 on ``q_proj`` and ``v_proj`` (both 64 × 64), ``v_proj`` listed ``no_grad``: peft still creates
    its A (8 × 64) and B (64 × 8) in every layer (fp32: peft's ``autocast_adapter_dtype``), so the weights stay;
    they get no gradient (2 layers × 1024 × 4 bytes) and no AdamW state (2 layers × 2 tensors × (2 × 512 × 4 + 4))."""
    kw = dict(method="lora", lora_r=8, lora_target_modules=("q_proj", "v_proj"))
    full = with_no_grad([], **kw)
    part = with_no_grad([V_PROJ], **kw)
    assert part["weight_bytes"] == full["weight_bytes"]
    assert part["adapter_param_count"] == full["adapter_param_count"] == 2 * 2 * (8 * 64 + 64 * 8)
    assert full["gradient_bytes"] - part["gradient_bytes"] == 2 * 1024 * 4
    assert full["optimizer_state_bytes"] - part["optimizer_state_bytes"] == 2 * 2 * (2 * 512 * 4 + 4)
    assert full["trainable_param_count"] - part["trainable_param_count"] == 2 * 1024


def test_a_parameter_tied_to_one_with_a_gradient_gets_one(with_no_grad, tmp_path):
    """BigBird's ``cls.predictions.bias`` is unread while the learner records (untied: the head reads its own
    ``decoder.bias``) but is that bias when ``tie_word_embeddings`` ties them: one tensor, with a gradient. Here
    tiny-llama's input embedding (1000 × 64) listed ``no_grad``: untied it loses 64000 × 2 gradient bytes; tied to
    ``lm_head.weight``, which the step reads, nothing."""
    untied_full, untied = with_no_grad([]), with_no_grad(["model.embed_tokens.weight"])
    assert untied_full["gradient_bytes"] - untied["gradient_bytes"] == 1000 * 64 * 2
    tied_cfg = tmp_path / "tied.json"
    tied_cfg.write_text(json.dumps({**json.loads(Path(CONFIG).read_text()), "tie_word_embeddings": True}))
    tied_full = with_no_grad([], model=str(tied_cfg))
    tied = with_no_grad(["model.embed_tokens.weight"], model=str(tied_cfg))
    assert tied["gradient_bytes"] == tied_full["gradient_bytes"]
    assert not [w for w in tied.warnings if "receive no gradient" in w]


def test_the_learner_lists_rows_whose_parameters_all_lack_a_gradient():
    """A row is ``no_grad`` when every parameter of it lacks a gradient; one where some layers have one is named in
    the log and left out; a name that is no parameter row is dropped."""
    from fitplan_torch.learn.nograd import no_grad_rows

    def template(n):
        return n.replace(".0.", ".{i}.").replace(".1.", ".{i}.")

    logged = []
    rows = {"l.{i}.x.weight", "l.{i}.y.weight", "l.{i}.z.weight"}
    out = no_grad_rows(["l.0.x.weight", "l.1.x.weight", "l.1.y.weight", "b.weight"], ["l.0.y.weight", "l.0.z.weight"],
                       template, rows, logged.append)
    assert out == {"no_grad": ["l.{i}.x.weight"]}
    assert len(logged) == 1 and "l.{i}.y.weight" in logged[0]
    assert no_grad_rows([], ["l.0.x.weight"], template, rows, logged.append) == {}


def test_the_recorder_measures_bart_cross_attention_without_gradient():
    """A tiny ``BartForCausalLM`` (the class defaults shrunk as ``learn-architecture`` shrinks them): the recorder's
    ``no_grad`` is exactly the decoder layers' ``encoder_attn`` and ``encoder_attn_layer_norm`` parameters
    (modeling_bart.py runs them only with encoder states), and torch agrees: after one backward and one AdamW step
    those have ``.grad`` None and no optimizer state, every other parameter has both."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    from fitplan_torch.learn import derive
    from fitplan_torch.learn.command import shrink

    cfg = shrink(json.loads(json.dumps({**AutoConfig.for_model("bart").to_dict(), "model_type": "bart"})))
    rec = derive.run(cfg, "16", "eager", 2, 16, backward=True)
    model, config = derive.build(cfg, "16", "eager")
    cross = sorted(n for n, _ in model.named_parameters() if ".encoder_attn." in n or ".encoder_attn_layer_norm." in n)
    assert len(cross) == config.decoder_layers * (4 * 2 + 2)  # q, k, v, out_proj weight and bias; the norm's two
    assert rec.no_grad == cross
    batch = derive.batch_for(config, 2, 16)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    model(**batch).loss.backward()
    opt.step()
    for n, p in model.named_parameters():
        assert (p.grad is None) == (n in cross), n
        assert (len(opt.state[p]) == 0) == (n in cross), n


# --------------------------------------------------------------------------- a head the class does not tie


def test_the_output_is_tied_by_role_only_where_the_class_ties_something():
    """``tied_rows``: the output projection is tied to the input embedding when the class's expanded
    ``_tied_weights_keys`` name it, or where they cannot be read (None); an empty mapping ties nothing (transformers
    5.24 modeling_utils.py ``get_expanded_tied_weights_keys`` returns the class's own mapping, and ``tie_weights``
    ties exactly those)."""
    from fitplan_torch.learn.ties import tied_rows

    def params():
        return [["emb.weight", ["v", "h"], "embedding", None, None, "bf16"],
                ["head.weight", ["v", "h"], "output", None, None, "bf16"]]

    base = {"tie_word_embeddings": True}
    for keys in (None, {"head.weight": "emb.weight"}):
        rows = params()
        assert tied_rows(base, rows, keys, str) == [["head.weight", "emb.weight", "tie_word_embeddings"]]
        assert rows[1][4] == "not tie_word_embeddings"
    rows = params()
    assert tied_rows(base, rows, {}, str) == [] and rows[1][4] is None


@pytest.mark.parametrize("model_type", ["cpmant", "bigbird_pegasus"])
def test_a_class_with_no_tied_keys_keeps_its_own_head(model_type):
    """CPM-Ant (``_tied_weights_keys = {}``: its head is a vocabulary-sized slice of the input embedding,
    modeling_cpmant.py) and BigBirdPegasus's causal LM build ``lm_head`` as a tensor of its own even with
    ``tie_word_embeddings`` on (torch: not the input embedding's Parameter, counted in ``parameters()``); the
    learner reads an empty mapping for them, so its file counts the head."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    from fitplan_torch.learn import derive
    from fitplan_torch.learn.command import shrink
    from fitplan_torch.learn.ties import tied_keys

    cfg = shrink(json.loads(json.dumps({**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type})))
    cfg["tie_word_embeddings"] = True
    with torch.device("meta"):
        model, _ = derive.build(cfg, "16", "eager")
    head, emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head is not emb and any(p is head for p in model.parameters())
    assert tied_keys(model) == {}


@pytest.mark.parametrize("keys, cond", [({}, None), (None, "not tie_word_embeddings"),
                                        ({"head.weight": "emb.weight"}, "not tie_word_embeddings")])
def test_the_head_row_is_conditional_only_where_the_class_may_tie_it(keys, cond):
    """The learner's parameter rows: the output projection is left out when ``tie_word_embeddings`` holds (it is
    then the embedding, counted once) unless the class ties nothing (an empty mapping: CPM-Ant, whose 512 × 64
    head went uncounted at the flag's default, 32768 fp32 parameters)."""
    from types import SimpleNamespace

    from fitplan_torch.learn.learner import _parameters

    rec = SimpleNamespace(base={"tie_word_embeddings": True})
    ref16 = {"params": {"emb.weight": (["v", "h"], "bf16"), "head.weight": (["v", "h"], "bf16")},
             "buffers": {}, "repeats": {}}
    meta = {"roles": {"emb.weight": "embedding", "head.weight": "output"}, "conv1d": set(), "tied_keys": keys}
    params, _, _ = _parameters(rec, ref16, meta, [], "model.layers")
    assert [p[4] for p in params] == [None, cond]
