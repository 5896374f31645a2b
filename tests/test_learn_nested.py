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


def test_an_unfolded_expert_loop_is_refused():
    """DBRX loops over the experts hit (``for expert_idx in expert_hit``, modeling_dbrx.py): with the routing fixed,
    4 and 8 experts record different ops (measured), so the count is held and the learner refuses, naming the loop."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive as D
    from fitplan_torch.learn import routing

    base = _dbrx_resolved()
    D.NESTED.clear()
    routing.FORCED.clear()
    try:
        D.NESTED.update(D.nested_variables(base))
        routing.FORCED.update({"experts": "moe_num_experts", "top_k": "moe_top_k"})
        sigs = []
        for e in (4, 8):
            cfg = dict(base)
            D.put_var(cfg, "moe_num_experts", e)
            sigs.append(D.signature(D.run(cfg, "16", "sdpa", 2, 8)))
        assert sigs[0] != sigs[1]
        with pytest.raises(D.LearnError, match="Python loop"):
            routing.refuse_held_experts({"moe_num_experts": 4})
        routing.refuse_held_experts({"kv_n_heads": 2})  # another held size: no refusal
    finally:
        D.NESTED.clear()
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
