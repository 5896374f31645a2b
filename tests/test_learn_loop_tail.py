"""The ops a model's decoder loop runs itself after a layer module returns (issue #32, "a layer or the epilogue reads
what an earlier layer made"): XLM's loop calls ``attentions[i]`` as the layer and then ``layer_norm1[i]``,
``ffns[i]`` and ``layer_norm2[i]`` inline (transformers 5.24 models/xlm/modeling_xlm.py ``XLMModel.forward``);
fitplan_torch/learn/looptail.py makes them the layer's tail.

These record tiny models of the real types (marked referee/slow by tests/conftest.py's importorskip rule).
"""

from __future__ import annotations

import json

import pytest


def _record(model_type: str):
    from transformers import AutoConfig

    from fitplan_torch.learn import derive
    from fitplan_torch.learn.shrink import shrunk_config

    cfg = shrunk_config(json.loads(json.dumps({**AutoConfig.for_model(model_type).to_dict(),
                                               "model_type": model_type})))
    return derive.run(cfg, "16", "eager", 2, 16)


def _params(seg) -> set[str]:
    """The parameters a segment's ops read, as the file names them (``{i}`` for the layer's index)."""
    out = set()
    for _, ins, _, _, _ in seg["ops"]:
        for _, v in ins:
            out.update(x[2:] for x in (v if isinstance(v, list) else [v]) if isinstance(x, str) and x.startswith("p:"))
    return out


def test_xlm_layers_take_the_block_the_loop_runs_after_the_attention_module():
    """By hand from ``XLMModel.forward``: after ``attentions[i]`` the loop runs ``layer_norm1[i]``, ``ffns[i]``,
    ``layer_norm2[i]`` (and the padding mask); so layer ``i``'s segment reads the parameters of those lists' module
    ``i`` (``{i}`` in the file) and of no other layer, the epilogue none of them, and the next layer's input (its argument 0) is made in
    layer ``i``'s segment and is the segment's output. Control: cut at the attention modules only (the bounds
    before the tail), the epilogue's read of the last block is refused, naming the loop's ops between the layers."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import looptail
    from fitplan_torch.learn.derive import LearnError
    from fitplan_torch.learn.segments import Cut

    rec = _record("xlm")
    cut = Cut(rec, {})
    layers = [s for s in cut.segments if s["kind"] == "layer"]
    assert len(layers) == len(rec.layers) >= 2
    lists = ("attentions", "layer_norm1", "ffns", "layer_norm2")
    for seg in layers:
        params = _params(seg)
        # every list's parameters of this layer, templated on the layer index, and none of another layer
        for lst in lists:
            assert any(p.startswith(f"transformer.{lst}.{{i}}.") for p in params), (seg["layer"], lst, params)
        assert all("{i}" in p for p in params if p.split(".")[1] in lists), params
    assert not any(p.split(".")[1:2] and p.split(".")[1] in lists for p in _params(cut.segments[-1]))
    for a, b in zip(layers, layers[1:]):
        nxt = next(tid for tid, k in b["argmap"].items() if k == 0)
        assert nxt == a["out_tid"] and cut.owner_seg[nxt][0] == cut.segments.index(a)

    def module_bounds(r):
        return [(L["index"], L["start"], L["end"]) for L in r.layers]

    orig = looptail.layer_bounds
    looptail.layer_bounds = module_bounds
    try:
        with pytest.raises(LearnError, match="between layers 0 and 1"):
            Cut(rec, {})
    finally:
        looptail.layer_bounds = orig


def test_gemma4_per_layer_slice_stays_outside_the_layers():
    """Gemma-4's loop runs only ``per_layer_inputs[:, :, i, :]`` (``select.int``) between the layers
    (modeling_gemma4.py ``Gemma4TextModel.forward``): the loop's indexing, not the layer's work; the layer segments
    end where the modules end (the select form, crosslayer.per_layer_slice, reads that view). Control: the gaps hold
    ops (every layer after the first reads such a view), so the test sees a gap it leaves out."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import looptail

    rec = _record("gemma4_text")
    bounds = looptail.layer_bounds(rec)
    assert [b[2] for b in bounds] == [L["end"] for L in rec.layers]
    gaps = [rec.ops[a["end"]:b["start"]] for a, b in zip(rec.layers, rec.layers[1:])]
    assert gaps and all(g and {o["name"] for o in g} == {"select.int"} for g in gaps)


def test_the_epilogue_binds_an_earlier_layers_tensor_by_the_rule_with_i_the_layer_count():
    """``epilogue_args`` (trace/learned_graph.py ``Builder.epilogue_args``): the last layer's output, then each
    ``["layer", expr, "t<k>"]`` is tensor ``t<k>`` of the layer ``expr`` names with ``i`` the layer count (the
    epilogue's place in the loop). By hand: 6 layers, ``i - 2`` names layer 4. A file without the field binds the
    hidden state alone. Control: a rule naming the epilogue's own place (``i``, layer 6 of 6) is refused (exit 2)."""
    from types import SimpleNamespace

    from fitplan.errors import FitplanError
    from fitplan.trace.learned_graph import Builder

    made = {m: SimpleNamespace(refs={"t3": f"layer {m} t3"}) for m in range(6)}
    b = SimpleNamespace(env={"num_hidden_layers": 6})
    v = {"epilogue_args": ["h", ["layer", "i - 2", "t3"]]}
    assert Builder.epilogue_args(b, v, "H", made, 6) == ["H", "layer 4 t3"]
    assert Builder.epilogue_args(b, {}, "H", None, 6) == ["H"]
    with pytest.raises(FitplanError, match="no earlier layer") as e:
        Builder.epilogue_args(b, {"epilogue_args": ["h", ["layer", "i", "t3"]]}, "H", made, 6)
    assert e.value.exit_code == 2


def test_inkling2_epilogue_reads_the_block_states_a_boundary_layers_tail_made():
    """Inkling2TextModel.forward: after a block boundary layer (``layer_idx % n_layers_per_attn_res_block == 0``)
    the loop concatenates that layer's input onto ``block_states``; every later layer and ``final_input`` (the
    epilogue) read it. By hand at the shrunk config (6 layers, one block of 6: layer 0 the only boundary): layer 0's
    segment holds the loop's ``unsqueeze`` and ``cat``, the last layer's second argument is their output, and the
    epilogue reads that same tensor as its argument 1, noted as read from layer 0 at the epilogue's place 6.
    Control: no other layer has a tail (their gaps are empty)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive, looptail
    from fitplan_torch.learn.segments import Cut

    rec = _record("inkling2_text")
    assert [L["index"] for L in rec.layers] == list(range(6))
    bounds = looptail.layer_bounds(rec)
    tails = [rec.ops[L["end"]:b[2]] for L, b in zip(rec.layers, bounds)]
    assert [o["name"] for o in tails[0]] == ["unsqueeze", "cat"] and not any(tails[1:])
    cut = Cut(rec, {})
    block = rec.layers[-1]["args"][1][1]
    assert rec.tensors[block]["op"] == rec.layers[0]["end"] + 1  # the cat after layer 0
    epi = cut.segments[-1]
    assert epi["argmap"].get(block) == 1
    reads: dict = {}
    assert derive._epilogue_refs(cut, 6, reads) == ["h", None]
    assert reads == {(derive.EPILOGUE, 1): [(6, 0, cut.owner_seg[block][1])]}
