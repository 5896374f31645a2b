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


def test_jamba_attention_and_expert_layers_follow_period_and_offset():
    """JambaConfig (configuration_jamba.py) derives the layer kinds from two integers each:
    ``layers_block_type[i]`` is attention when ``i % attn_layer_period == attn_layer_offset`` (8 and 4), and
    ``layers_num_experts[i]`` is ``num_experts`` when ``i % expert_layer_period == expert_layer_offset`` (2 and 1).
    The learner treated the four as sizes and explained the one layer pattern it saw with a constant,
    ``(i + 1) % 5 == 0`` (attention at 4, 9, 14 ... in ai21labs/Jamba-v0.1's 32 layers, where the class puts it at
    4, 12, 20, 28); they are now pattern fields, and the rules read them."""
    pytest.importorskip("transformers")
    from transformers import JambaConfig

    rules = _pattern(_defaults("jamba"))
    cls = JambaConfig(num_hidden_layers=32)
    env = {"attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1}
    attn = [compile_expr(rules["self_attn"])({**env, "i": i}) for i in range(32)]
    mlp = [compile_expr(rules["feed_forward"])({**env, "i": i}) for i in range(32)]
    assert _same_partition(attn, cls.layers_block_type) and cls.layers_block_type.count("attention") == 4
    assert _same_partition(mlp, cls.layers_num_experts) and cls.layers_num_experts.count(1) == 16


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


# --------------------------------------------------------------------------- data-dependent sizes


def test_balanced_scores_route_every_expert_alike():
    """The learner's declared routing (learn/routing.py): token t's j-th choice is expert (t·k + j) mod E, so
    torch.topk over the scores gives every expert k·T/E rows when E divides k·T, and the first ones one more
    otherwise (by hand: T = 6, k = 2, E = 4: 12 rows, 3 each; T = 7: 14 rows, experts 0 and 1 get 4)."""
    torch = pytest.importorskip("torch")
    from fitplan_torch.learn.routing import _balanced_scores

    for T, expected in ((6, [3, 3, 3, 3]), (7, [4, 4, 3, 3])):
        scores = _balanced_scores(torch.zeros(1, T, 4, dtype=torch.bfloat16), 4, 2)
        picked = scores.view(T, 4).topk(2, dim=-1).indices
        assert torch.bincount(picked.flatten(), minlength=4).tolist() == expected
        assert picked[1].tolist() == [2, 3]  # token 1: experts 2 and 3, in that order


def test_jetmoe_learns_its_routed_expert_sizes_and_matches_the_referee():
    """JetMoE's experts (modeling_jetmoe.py ``JetMoeParallelExperts.forward``) split their input by
    ``expert_size.tolist()``, the rows the router sent each expert, and run one ``F.linear`` per expert: before,
    no expression over the config fitted the split's sizes ("t27 (op split_with_sizes): ... fits the values [15,
    27, 21, ...]"). With the routers fixed to balanced routing while recording, the loop folds to one expert's
    block of ``ceil_div(k·b·s, E)`` rows, repeated E times; the file states the assumption, the graph check at
    held-out sizes (b=3, s=21: 126 rows over 4 experts, uneven) finds nothing, and the referee, whose router
    routes as its random weights say, measures the same activations and peak within 1 %."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V
    from fitplan_torch.learn.shrink import shrink

    cfg = shrink(_defaults("jetmoe"))
    data, results, specs = derive.learn_full(cfg, log=lambda *a: None, variants=(("16", "sdpa"),), first_only=True)
    assert data["assumed"]["routing"]["value"] == "balanced"
    rows_exprs = {e for seg in data["segments"].values() for t in seg["t"] for e in t[0] if "ceil_div" in str(e)}
    assert rows_exprs == {"ceil_div(b*num_experts_per_tok*s, num_local_experts)"}
    assert V.check_graph(data, results, specs, lambda *a: None) == []
    resolved = {k: v for k, v in derive.hf_config(cfg).to_dict().items()
                if k not in ("transformers_version", "architectures", "dtype", "torch_dtype")}
    cases = [("bf16-true", "sdpa", False, "full"), ("bf16-true", "sdpa", False, "lora")]
    problems, rows = V.check_memory(data, {**resolved, "model_type": "jetmoe"}, lambda *a: None, cases=cases)
    assert problems == [] and len(rows) == 2
    assert all(abs(r["activations"]) < 0.01 and abs(r["peak"]) < 0.01 for r in rows)


# --------------------------------------------------------------------------- layer skipping


def test_opt_with_layerdrop_learns_every_layer_and_bounds_the_referee():
    """OPT skips each decoder layer with probability ``layerdrop`` in training (modeling_opt.py ``if self.training
    and self.layerdrop > 0.0``). Learned from a config stating 0.1, the file records every layer and says so
    (``assumed``); the referee measures the same figures at layerdrop 0, and at 0.5 (one step, layers skipped at
    random) no more than the file's: parameters equal, gradients, optimizer states, activations and the peak at
    most what every layer running gives."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V
    from fitplan_torch.learn.shrink import shrink

    cfg = shrink(_defaults("opt", layerdrop=0.1))
    data, _, _ = derive.learn_full(cfg, log=lambda *a: None, variants=(("16", "sdpa"),), first_only=True)
    assert data["assumed"]["layerdrop"]["value"] == 0.0
    resolved = {k: v for k, v in derive.hf_config(cfg).to_dict().items()
                if k not in ("transformers_version", "architectures", "dtype", "torch_dtype")}
    cases = [("bf16-true", "sdpa", False, "full"), ("bf16-true", "sdpa", False, "lora")]
    problems, rows = V.check_memory(data, {**resolved, "model_type": "opt", "layerdrop": 0.0}, lambda *a: None,
                                    cases=cases)
    assert problems == [] and all(r["activations"] == 0 and r["peak"] == 0 for r in rows)
    _, rows = V.check_memory(data, {**resolved, "model_type": "opt", "layerdrop": 0.5}, lambda *a: None, cases=cases)
    assert len(rows) == 2 and all(r["parameters"] == 0 for r in rows)
    assert all(r[k] >= 0 for r in rows for k in ("gradients", "optimizer_states", "activations", "peak"))


def test_a_routing_assumption_is_said_with_every_estimate(tmp_path, monkeypatch):
    """A learned file whose routers the learner fixed (``"assumed": {"routing": {..., "always": true}}``) says so
    with every estimate (no config field states the routing, so there is nothing to compare it with), and the
    MoE routing statement gives each expert's rows under it: tiny-mixtral, 4 experts, 2 per token, b=2, s=31:
    124 rows, ceil(124 / 4) = 31 per expert (by hand)."""
    import json
    import shutil
    from pathlib import Path

    import fitplan
    from fitplan.arch import archfile

    root = Path(__file__).resolve().parents[1]
    d = tmp_path / "arch"
    d.mkdir()
    header = json.loads((root / "rulesets" / "architectures" / "mixtral.json").read_text())
    header["assumed"] = {"routing": {"value": "balanced", "why": "each expert receives k·b·s/E rows", "always": True}}
    (d / "mixtral.json").write_text(json.dumps(header))
    shutil.copy(root / "rulesets" / "architectures" / "mixtral.graphs.json", d / "mixtral.graphs.json")
    monkeypatch.setenv("FITPLAN_ARCH_DIR", str(d))
    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    archfile.load.cache_clear()
    try:
        e = fitplan.estimate(model=str(root / "tests" / "data" / "configs" / "tiny-mixtral" / "config.json"),
                             precision="bf16-mixed", optim="adamw_torch_fused", per_device_train_batch_size=2,
                             max_seq_length=31, device="cpu")
    finally:
        archfile.load.cache_clear()
    assert "mixtral's learned file assumes routing = 'balanced': each expert receives k·b·s/E rows" in e.warnings
    r = e["moe_routing"]
    assert r["expert_rows"] == 124 and "balanced routing (31 rows per expert, rounded up)" in r["assumption"]


# --------------------------------------------------------------------------- custom autograd Functions


def test_phimoe_router_multiplier_is_recorded_at_its_boundary():
    """PhiMoE's sparsemixer router multiplies by ``PhimoeMultiplier.apply`` twice per layer (modeling_phimoe.py:
    ``ctx.save_for_backward(multiplier, selected_experts, masked_gates)``): recorded as one ``autograd.Function``
    op each, with those three saves, not the ops inside it. The referee measures the same activations and peak
    within 1 % (bf16, full fine-tuning; LoRA on all-linear is refused for its tuple-returning router)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V
    from fitplan_torch.learn.shrink import shrink

    cfg = shrink(_defaults("phimoe"))
    data, _, _ = derive.learn_full(cfg, log=lambda *a: None, variants=(("16", "sdpa"),), first_only=True)
    layer_fns = [[o[3]["fn"], len(o[3]["fsv"])] for seg in data["segments"].values() for o in seg["ops"]
                 if o[0] == "autograd.Function"]
    assert layer_fns and all(f == ["PhimoeMultiplier", 3] for f in layer_fns) and len(layer_fns) % 2 == 0
    resolved = {k: v for k, v in derive.hf_config(cfg).to_dict().items()
                if k not in ("transformers_version", "architectures", "dtype", "torch_dtype")}
    problems, rows = V.check_memory(data, {**resolved, "model_type": "phimoe"}, lambda *a: None,
                                    cases=[("bf16-true", "sdpa", False, "full")])
    assert problems == [] and abs(rows[0]["activations"]) < 0.01 and abs(rows[0]["peak"]) < 0.01
