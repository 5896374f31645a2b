"""Sizes a config keeps inside a nested config object, and the routing they set (issue #32, DBRX).

DbrxConfig keeps its attention and expert sizes in two sub-configs (transformers 5.24 configuration_dbrx.py:
``attn_config = DbrxAttentionConfig(kv_n_heads=1, ...)``, ``ffn_config = DbrxFFNConfig(ffn_hidden_size=3584,
moe_num_experts=4, moe_top_k=1, ...)``); modeling_dbrx.py reads them as sizes (``Wqkv`` is ``d_model +
2·kv_n_heads·head_dim`` wide, the router ``moe_num_experts`` wide). Expected values are read off those class
definitions by hand, or measured with torch, never taken from fitplan's output.
"""

from __future__ import annotations

import pytest

from fitplan.arch.archexpr import compile_expr


def _dbrx_resolved() -> dict:
    from fitplan_torch.learn import derive as D

    return D.hf_config({"model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 128,
                        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 10000},
                        "ffn_config": {"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 2}}).to_dict()


def test_dbrx_nested_sizes_are_variables():
    """The sizes of DBRX's two sub-configs become variables named by their key; ``ffn_config["hidden_size"]`` does
    not (DbrxConfig's ``attribute_map`` names ``d_model`` ``hidden_size``, and its ``__post_init__`` sets the nested
    one from ``d_model``: one name, two fields)."""
    from fitplan_torch.learn import derive as D

    got = D.nested_variables(_dbrx_resolved())
    for key, field in (("kv_n_heads", "attn_config"), ("ffn_hidden_size", "ffn_config"),
                       ("moe_num_experts", "ffn_config"), ("moe_top_k", "ffn_config")):
        assert got[key] == (field, key)
    assert "hidden_size" not in got
    assert "moe_loss_weight" in got  # a float factor in (0, 1], as before


def test_ints_of_a_plain_dict_field_stay_constants():
    """Control: integers inside a dict that is no sub-config (Llama-3 rope parameters' ``original_max_position_
    embeddings``, ``factor``) are not variables; only float factors in (0, 1] of such a dict are."""
    from fitplan_torch.learn import derive as D

    resolved = D.hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                            "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 8192}}).to_dict()
    got = D.nested_variables(resolved)
    assert "original_max_position_embeddings" not in got and "factor" not in got


def test_routing_reads_a_nested_expert_count():
    """DBRX's router (``router.layer``, ``moe_num_experts`` outputs) is fixed to balanced routing once its expert
    count and top-k, kept in ``ffn_config``, are known variables; without them the routing is not found (control)."""
    from fitplan_torch.learn import derive as D
    from fitplan_torch.learn import routing

    resolved = _dbrx_resolved()
    D.NESTED.clear()
    try:
        assert routing.fields(resolved) is None
        D.NESTED.update(D.nested_variables(resolved))
        assert routing.fields(resolved) == ("moe_num_experts", "moe_top_k")
    finally:
        D.NESTED.clear()


def _first_expert_rows(b: int, s: int, k: int, e: int) -> int:
    """Rows expert 0 receives under the learner's balanced scores, measured with torch's own top-k."""
    import torch

    from fitplan_torch.learn.routing import _balanced_scores

    scores = _balanced_scores(torch.zeros(b, s, e), e, k)
    return int((scores.view(-1, e).topk(k, dim=-1).indices == 0).sum())


def test_rows_of_the_first_expert_with_the_expert_count_held():
    """``ceil_div(k·b·s, E)`` with E held (a field the probes never move): the fit over probes where E does not
    divide every k·b·s, evaluated at a held-out size, gives the rows torch routes to expert 0 there. Control: the
    floor ``k·b·s//E`` fits the probes where E divides k·b·s but not this held-out size (63 rows over 4 experts)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.fit import Fitter

    probes = [(2, 16, 1), (3, 16, 1), (2, 20, 1), (2, 16, 2), (3, 22, 3)]  # base, b, s, k, joint
    env = [{"b": b, "s": s, "moe_top_k": k, "moe_num_experts": 4} for b, s, k in probes]
    y = [_first_expert_rows(b, s, k, 4) for b, s, k in probes]
    assert y == [8, 12, 10, 16, 50]  # by hand: ceil(k·b·s / 4)
    expr = Fitter(env, {"b": 1, "s": 2, "moe_top_k": 3}).fit(y)
    held_out = {"b": 3, "s": 21, "moe_top_k": 1, "moe_num_experts": 4}
    assert compile_expr(expr)(held_out) == _first_expert_rows(3, 21, 1, 4) == 16
    assert compile_expr("b*s*moe_top_k//moe_num_experts")(held_out) != 16


def _dbrx_recordings(accumulate: bool = True):
    """Tiny DBRX recorded with 4 and 8 experts under the learner's balanced routing (b = 2, s = 8, top-2)."""
    from fitplan_torch.learn import derive as D
    from fitplan_torch.learn import fold as F
    from fitplan_torch.learn import routing

    base = _dbrx_resolved()
    D.NESTED.clear()
    routing.FORCED.clear()
    D.RECENT.items.clear()
    real = F._accumulates
    try:
        if not accumulate:
            F._accumulates = lambda *a: set()
        D.NESTED.update(D.nested_variables(base))
        routing.FORCED.update({"experts": "moe_num_experts", "top_k": "moe_top_k"})
        recs = []
        for e in (4, 8):
            cfg = dict(base)
            D.put_var(cfg, "moe_num_experts", e)
            recs.append(D.run(cfg, "16", "sdpa", 2, 8))
        return recs
    finally:
        F._accumulates = real
        D.NESTED.clear()
        routing.FORCED.clear()
        D.RECENT.items.clear()


def test_the_expert_loop_folds_to_one_block():
    """DBRX loops over the experts hit (``for expert_idx in expert_hit``, modeling_dbrx.py ``DbrxExperts``), each
    block adding its rows back into ``next_states`` with ``index_add_``. Folded (fold.py, the in-place form), 4 and
    8 experts record the same ops; each layer has one repeated block run once per expert, whose ``nonzero`` (the
    expert's (slot, token) pairs) has the rows torch's own top-k routes to expert 0 (8 and 4 of k·b·s = 32).
    Control: without the in-place form the two counts record different ops (the refusal before this fold)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive as D

    recs = _dbrx_recordings()
    assert D.signature(recs[0]) == D.signature(recs[1])
    for rec, e in zip(recs, (4, 8)):
        assert [r["count"] for r in rec.repeats] == [e, e]  # n_layers = 2, one loop each
        r = rec.repeats[0]
        body = rec.ops[r["first"]:r["first"] + r["len"]]
        rows = [rec.tensors[o["outs"][0]]["shape"][0] for o in body if o["name"] == "nonzero"]
        assert rows == [_first_expert_rows(2, 8, 2, e)] == [32 // e]
        written = [o for o in body if o["name"] == "index_add_"]
        assert len(written) == 1 and written[0]["outs"][0] not in r["each"]  # the accumulator is no repetition's own
    unfolded = _dbrx_recordings(accumulate=False)
    assert D.signature(unfolded[0]) != D.signature(unfolded[1])


def test_a_held_expert_count_with_an_unfolded_loop_is_refused():
    """A loop the fold cannot take still holds the expert count; the learner then refuses, naming the loop."""
    from fitplan_torch.learn import derive as D
    from fitplan_torch.learn import routing

    routing.FORCED.clear()
    try:
        routing.FORCED.update({"experts": "moe_num_experts", "top_k": "moe_top_k"})
        with pytest.raises(D.LearnError, match="Python loop"):
            routing.refuse_held_experts({"moe_num_experts": 4})
        routing.refuse_held_experts({"kv_n_heads": 2})  # another held size: no refusal
    finally:
        routing.FORCED.clear()


def test_two_causal_convolutions_pad_by_both_kernels():
    """ZAYA pads its q/k states on the left by ``(cca_time0 - 1) + (cca_time1 - 1)`` before two convolutions
    (transformers 5.24 modeling_zaya.py ``conv_kernel_size``, ``F.pad(qk_states, (self.conv_kernel_size, 0))``): the
    padded length, measured with torch's ``F.pad`` at each probe, is fitted as a sum of three variables less 2 and
    gives torch's length at a held-out size. Control: no sum of two terms (plus or minus 1 or 2) fits these probes."""
    torch = pytest.importorskip("torch")
    from fitplan_torch.learn.fit import Fitter

    def padded(s, c0, c1):
        return torch.nn.functional.pad(torch.zeros(1, 1, s), ((c0 - 1) + (c1 - 1), 0)).shape[-1]

    probes = [(16, 2, 2), (20, 2, 2), (16, 3, 2), (16, 2, 3), (22, 4, 4), (18, 6, 5)]  # base, s, c0, c1, joints
    env = [{"s": s, "cca_time0": c0, "cca_time1": c1, "b": 2} for s, c0, c1 in probes]
    y = [padded(*p) for p in probes]
    fitter = Fitter(env, {"s": 1, "cca_time0": 2, "cca_time1": 3})
    expr = fitter.fit(y)
    assert compile_expr(expr)({"s": 37, "cca_time0": 5, "cca_time1": 7, "b": 2}) == padded(37, 5, 7) == 47
    deps = fitter.deps(tuple(y))
    assert all(fitter._sum2(deps, tuple(v - off for v in y)) is None for off in (0, -1, 1, -2, 2))


def test_histc_is_no_data_dependent_size():
    """``torch.histc`` returns ``bins`` entries whatever its input (measured), so a refusal next to it does not blame
    the routing; ``bincount`` (``max + 1`` entries) does."""
    torch = pytest.importorskip("torch")
    from fitplan_torch.learn.limits import data_dependent_note

    assert torch.histc(torch.tensor([0.0, 0.0]), bins=4, min=0, max=3).shape == torch.histc(
        torch.tensor([3.0, 1.0, 2.0]), bins=4, min=0, max=3).shape == (4,)
    assert torch.bincount(torch.tensor([0, 0])).shape != torch.bincount(torch.tensor([3])).shape
    assert data_dependent_note({"ops": [["histc"], ["mm"]]}) == ""
    assert "bincount" in data_dependent_note({"ops": [["bincount"]]})


def _mimo(head_dim: int, factor: float, other: float | None = None) -> dict:
    """A MiMo-V2-Flash config whose two layer types state ``partial_rotary_factor`` (configuration_mimo_v2_flash.py
    defaults: 0.334 for both)."""
    return {"model_type": "mimo_v2_flash", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": head_dim, "v_head_dim": 16, "num_hidden_layers": 2,
            "layer_types": ["full_attention", "sliding_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": factor},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                                      "partial_rotary_factor": factor if other is None else other}}}


def test_a_factor_stated_per_layer_type_is_one_variable():
    """MiMo-V2-Flash reads ``rope_parameters[layer_type]["partial_rotary_factor"]`` (modeling_mimo_v2_flash.py
    ``compute_default_rope_parameters``): stated alike in each layer type's dict, it is one variable, read from the
    first and written to every one. Control: two different factors are no one variable."""
    from fitplan_torch.learn import derive as D

    resolved = D.hf_config(_mimo(16, 0.334)).to_dict()
    got = D.nested_variables(resolved)
    assert got["partial_rotary_factor"] == ("rope_parameters", "*", "partial_rotary_factor")
    D.NESTED.clear()
    try:
        D.NESTED.update(got)
        assert D.get_var(resolved, "partial_rotary_factor") == 0.334
        D.put_var(resolved, "partial_rotary_factor", 0.5)
        assert [x["partial_rotary_factor"] for x in resolved["rope_parameters"].values()] == [0.5, 0.5]
        assert resolved["rope_parameters"]["sliding_attention"]["rope_theta"] == 1e4  # the rest kept
    finally:
        D.NESTED.clear()
    assert "partial_rotary_factor" not in D.nested_variables(D.hf_config(_mimo(16, 0.334, 0.5)).to_dict())


def _mimo_rotary(head_dim: int, factor: float) -> tuple[int, int]:
    """(inverse frequencies, width left unrotated) as MiMo-V2-Flash computes them: its own
    ``compute_default_rope_parameters``; ``apply_rotary_pos_emb`` rotates ``cos.shape[-1]`` = twice as many."""
    from transformers import AutoConfig
    from transformers.models.mimo_v2_flash import modeling_mimo_v2_flash as m

    cfg = AutoConfig.for_model(**_mimo(head_dim, factor))
    inv_freq, _ = m.MiMoV2FlashRotaryEmbedding.compute_default_rope_parameters(cfg, layer_type="full_attention")
    return inv_freq.shape[0], head_dim - 2 * inv_freq.shape[0]


def test_mimo_rotary_widths_from_the_factor():
    """The fit of MiMo's rotary widths at the probes the learner takes (head_dim 18, 36; factor 0.334, 0.668; a
    joint probe), evaluated at the published head_dim 192, gives what the model's own code computes there (32
    frequencies, 128 dims left). Control: ``int(f·head_dim)//2`` fits the frequencies at even rotary dims only."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.fit import Fitter

    probes = [(18, 0.334), (36, 0.334), (18, 0.668), (27 * 2, 0.5), (16, 0.334)]
    env = [{"head_dim": h, "partial_rotary_factor": f, "b": 2, "s": 16} for h, f in probes]
    fitter = Fitter(env, {"head_dim": 1, "partial_rotary_factor": 2}, ["partial_rotary_factor"])
    published = {"head_dim": 192, "partial_rotary_factor": 0.334, "b": 2, "s": 16}
    for k in (0, 1):
        y = [_mimo_rotary(h, f)[k] for h, f in probes]
        assert compile_expr(fitter.fit(y))(published) == _mimo_rotary(192, 0.334)[k] == (32, 128)[k]
    freqs = [_mimo_rotary(h, f)[0] for h, f in probes]
    assert not fitter.check("int(partial_rotary_factor*head_dim)//2", tuple(freqs))  # 16·0.334 -> 5 dims, 3 freqs


def test_the_shrink_keeps_the_rotary_width_even():
    """16 · 0.334 = 5.3 rotary dims (odd, unlike the published 192 · 0.334 = 64): the shrunk head_dim is raised to
    18 (6 dims); with a factor of 0.5 it stays 16 (control)."""
    from fitplan_torch.learn.shrink import shrunk_config

    assert shrunk_config(_mimo(192, 0.334))["head_dim"] == 18
    assert shrunk_config(_mimo(192, 0.5))["head_dim"] == 16


def test_a_precision_class_without_a_graph_is_refused_by_name():
    """A file whose learner left a precision class out (the model fails in it, as DBRX under autocast) refuses that
    class by name, with no suggestion to re-learn; a kernel missing within a learned class keeps the old message."""
    import copy

    from fitplan.api import FitplanError
    from fitplan.arch.archfile import load

    af = copy.copy(load("llama"))
    graphs = af.graphs
    env = {**af.symbols({"model_type": "llama"}), "b": 2, "s": 16}
    assert af.variant("mixed", "sdpa", env)["precision"] == "mixed"  # the file as bundled serves it
    af._graphs = {**graphs, "variants": [v for v in graphs["variants"] if v["precision"] != "mixed"]}
    with pytest.raises(FitplanError, match="does not run in precision class 'mixed'"):
        af.variant("mixed", "sdpa", env)
    af._graphs = {**graphs, "variants": [v for v in graphs["variants"]
                                         if not (v["precision"] == "mixed" and v["attn"] == "eager")]}
    with pytest.raises(FitplanError, match="no learned graph for precision class 'mixed' with 'eager'"):
        af.variant("mixed", "eager", env)


def test_a_regime_without_a_graph_names_the_learned_regimes():
    """A file whose graphs of one precision class and kernel hold under conditions this config meets none of (MiMo-
    V2-Flash's: no GQA graph, the learner's GQA setup does not run it) says where its graphs hold."""
    import copy

    from fitplan.api import FitplanError
    from fitplan.arch.archfile import load

    af = copy.copy(load("llama"))
    graphs = af.graphs
    env = {**af.symbols({"model_type": "llama"}), "b": 2, "s": 16}
    af._graphs = {**graphs, "variants": [{**v, "when": "b == 1"} for v in graphs["variants"]]}
    with pytest.raises(FitplanError, match="applies to this config .*b == 1"):
        af.variant("16", "sdpa", env)
    assert af.variant("16", "sdpa", {**env, "b": 1})["precision"] == "16"  # control: the regime it holds in


def _kimi_like_params() -> dict:
    """Per-layer parameter shapes as the learner fits them for Kimi-Linear's tiny config (layers 0-3 delta attention,
    layer 4 MLA: modeling_kimi_linear.py ``KimiLinearDeltaAttention.o_proj`` is ``Linear(linear_num_heads·
    linear_head_dim, hidden)``, ``KimiLinearAttention.o_proj`` ``Linear(num_attention_heads·v_head_dim, hidden)``)."""
    out = {}
    for i in range(5):
        wide = "num_attention_heads*v_head_dim" if i == 4 else "linear_head_dim*linear_num_heads"
        out[f"model.layers.{i}.self_attn.o_proj.weight"] = (["hidden_size", wide], "bf16")
        out[f"model.layers.{i}.input_layernorm.weight"] = (["hidden_size"], "bf16")
    return out


def test_a_name_two_layer_kinds_shape_differently_is_two_rows():
    """Kimi-Linear's ``o_proj`` is 128 wide in its delta-attention layers and 64 in its MLA layer (tiny config: 8
    heads × 16, 4 heads × 16): the file keeps one row per shape, each with its layers' kinds, so it counts 4·64·128 +
    64·64 = 36864 elements, as the model has; one row (the first layer's shape everywhere) counted 40960, the 4096
    too many the memory check found (1611008 bytes predicted, 1594624 measured, 32-true). The norm, one shape in
    every kind, stays one row (control)."""
    import types

    from fitplan_torch.learn.learner import _parameters

    kinds = ["0|1|0", "0|0|0", "0|0|0", "0|0|0", "1|0|1"]
    ref16 = {"params": _kimi_like_params(), "buffers": {}, "repeats": {}}
    meta = {"roles": {}, "conv1d": set()}
    params, _, _ = _parameters(types.SimpleNamespace(base={}), ref16, meta, kinds, "model.layers")
    o = [p for p in params if p[0] == "model.layers.{i}.self_attn.o_proj.weight"]
    assert [(p[1][1], p[3]) for p in o] == [("linear_head_dim*linear_num_heads", ["0|0|0", "0|1|0"]),
                                            ("num_attention_heads*v_head_dim", ["1|0|1"])]
    assert [p[3] for p in params if p[0].endswith("input_layernorm.weight")] == [["0|0|0", "0|1|0", "1|0|1"]]
    env = {"hidden_size": 64, "linear_head_dim": 16, "linear_num_heads": 8, "num_attention_heads": 4, "v_head_dim": 16}
    total = sum(compile_expr(p[1][0])(env) * compile_expr(p[1][1])(env) * sum(k in p[3] for k in kinds) for p in o)
    assert total == 4 * 64 * 128 + 64 * 64 == 36864


def test_the_core_reads_each_layer_s_own_shape():
    """A file with one row per shape (above) gives each layer its own row's shape, in the parameter list and where a
    segment looks a parameter up by name (``param_entry``); a file with one row per name is read as before."""
    import copy

    from fitplan.arch.archfile import load

    af = copy.copy(load("llama"))
    env = {**af.symbols({"model_type": "llama", "num_hidden_layers": 2}), "b": 2, "s": 16}
    row = next(p for p in af.params if p[0].endswith("self_attn.o_proj.weight"))
    narrow = [row[0], [row[1][0], "8"], row[2], ["B"], *row[4:]]
    af.params = [([*p[:3], ["A"], *p[4:]] if p is row else p) for p in af.params] + [narrow]
    af.param_index = {}
    for p in af.params:
        af.param_index.setdefault(p[0], []).append(p)
    af.layer_kinds = lambda e: ["A", "B"]
    got = {n: shape for n, shape, *_ in af.param_list(env) if n.endswith("o_proj.weight")}
    h = env["hidden_size"]
    assert got == {"model.layers.0.self_attn.o_proj.weight": (h, h), "model.layers.1.self_attn.o_proj.weight": (h, 8)}
    assert af.param_entry(row[0], {**env, "i": 1})[1] == [row[1][0], "8"]
    assert af.param_entry(row[0], {**env, "i": 0})[3] == ["A"]


def _tiny_longcat():
    from fitplan_torch.learn import derive as D

    return D.hf_config({"model_type": "longcat_flash", "hidden_size": 32, "num_layers": 1, "num_attention_heads": 2,
                        "num_key_value_heads": 2, "vocab_size": 64, "ffn_hidden_size": 48, "q_lora_rank": 16,
                        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
                        "moe_topk": 2, "n_routed_experts": 4, "zero_expert_num": 2, "expert_ffn_hidden_size": 24})


def test_a_router_that_returns_its_indices_is_fixed_by_them():
    """LongCat-Flash's router is no ``nn.Linear``: it scores ``n_routed_experts + zero_expert_num`` choices with
    ``F.linear`` on its ``classifier``'s weight and returns ``(logits, weights, indices)`` (transformers 5.24
    modeling_longcat_flash.py ``LongcatFlashTopkRouter``). Fixed by its indices, token t's j-th choice is
    ``(t·k + j) mod E`` over the 4 experts: every expert gets k·T/E = 2·16/4 = 8 rows (counted by hand from that
    rule) and the 2 identity ("zero") experts none. Control: without the hook the random router sends rows to the
    zero experts (measured), so the hook is what sets the counts."""
    torch = pytest.importorskip("torch")
    import transformers

    from fitplan_torch.learn import routing

    config = _tiny_longcat()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    found = routing.index_routers(model, 4)
    assert [type(m).__name__ for m in found] == ["LongcatFlashTopkRouter"]
    assert routing.routers(model, 4) == []  # no nn.Linear router with 4 outputs: the classifier has 6
    hidden = torch.randn(1, 16, 32)

    def counts():
        return torch.bincount(found[0](hidden)[2].flatten(), minlength=6).tolist()

    with routing.balanced(model, {"n_routed_experts": 4, "moe_topk": 2}) as fixed:
        assert fixed
        assert counts() == [8, 8, 8, 8, 0, 0]
    free = counts()
    assert sum(free) == 32 and free[4] + free[5] > 0


def test_grouped_mm_experts_state_no_routing():
    """Routers fixed by their indices state the routing only where a segment runs an op the data sizes (the experts
    -hit loop's ``nonzero``); ``grouped_mm`` experts size every tensor by k·T rows, so Mixtral's file states none.
    Control: a router fixed through its ``nn.Linear`` scores (JetMoE's) always states it."""
    from fitplan_torch.learn import routing

    seg_loop = {"layer": {"ops": [["nonzero", [], ["t3"]], ["index_add_", [], ["t1"]]]}}
    seg_grouped = {"layer": {"ops": [["histc", [], ["t3"]], ["_grouped_mm", [], ["t4"]]]}}
    routing.FORCED.clear()
    try:
        routing.FORCED.update({"experts": "num_local_experts", "top_k": "num_experts_per_tok", "by": "indices"})
        assert routing.sizes_the_step(seg_loop) and not routing.sizes_the_step(seg_grouped)
        routing.FORCED.pop("by")
        assert routing.sizes_the_step(seg_grouped)
        routing.FORCED.clear()
        assert not routing.sizes_the_step(seg_loop)
    finally:
        routing.FORCED.clear()


def test_a_layer_count_no_config_states_is_refused_by_name():
    """LongcatFlashConfig's ``num_hidden_layers`` is a property, ``2 * num_layers`` (configuration_longcat_flash.py),
    absent from the config's dict: a file reading it would have no layer count (the verification crashed with
    ``int(None)``). The learner refuses, naming the field. Control: Llama's, stated in the config, is mapped."""
    from transformers import LlamaConfig, LongcatFlashConfig

    from fitplan_torch.learn import configrules as C
    from fitplan_torch.learn import derive as D

    fields = {k: {"type": "int"} for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")}
    resolved = _tiny_longcat().to_dict()
    assert resolved.get("num_hidden_layers") is None and resolved["num_layers"] == 1
    with pytest.raises(D.LearnError, match="LongcatFlashConfig.num_hidden_layers"):
        C.spec_map(resolved, LongcatFlashConfig, fields)
    llama = D.hf_config({"model_type": "llama", "num_hidden_layers": 2}).to_dict()
    assert C.spec_map(llama, LlamaConfig, fields)["num_hidden_layers"] == "num_hidden_layers"
