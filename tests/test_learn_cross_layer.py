"""A layer that reads a tensor made elsewhere than the previous layer's hidden state (issue #32, the class "a layer
or the epilogue reads what an earlier layer made"): HYV4's top-k carried from layer to layer, Gemma-3n's shared
layers reading their store layer's K/V, Gemma-4's per-layer inputs sliced from a prologue tensor
(fitplan_torch/learn/crosslayer.py).

Each test records a tiny model of the real type and checks what the learner states against the model transformers
builds (its attention modules' own flags) or against the modeling code by hand. These build tiny models: slow
(marked referee/slow by tests/conftest.py's importorskip rule).
"""

from __future__ import annotations

import json

import pytest


def _defaults(model_type: str) -> dict:
    from transformers import AutoConfig

    return json.loads(json.dumps({**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type}))


def _reads(cut) -> dict[int, list[tuple[int, int]]]:
    """Layer -> ``(maker layer, maker's local tensor)`` of each argument made by an earlier layer's segment."""
    out: dict[int, list[tuple[int, int]]] = {}
    for seg in cut.segments:
        if seg["kind"] != "layer":
            continue
        prev_out = next((s.get("out_tid") for s in cut.segments if s.get("layer") == seg["layer"] - 1), None)
        for tid in seg["argmap"]:
            where = cut.owner_seg.get(tid)
            if tid != prev_out and where is not None and where[0] > 0:
                out.setdefault(seg["layer"], []).append((cut.segments[where[0]]["layer"], where[1]))
    return out


def test_hyv4_carries_the_previous_layers_topk_as_an_argument_from_layer_i_minus_1():
    """HYV4Model.forward passes each layer's indexer top-k to the next as ``prev_topk_indices``
    (modeling_hy_v4.py): every layer after the first reads one tensor that the layer before it made, an int32
    index tensor; the maker rule is ``i - 1`` (by hand from the loop). Control: the same reads said to come from
    two layers back fit no rule of previous layers (``i - 2`` fits only where stated)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import crosslayer, derive
    from fitplan_torch.learn.segments import Cut
    from fitplan_torch.learn.shrink import shrunk_config

    cfg = shrunk_config(_defaults("hy_v4"))
    rec = derive.run(cfg, "16", "eager", 2, 16)
    cut = Cut(rec, {})
    reads = _reads(cut)
    n = len([s for s in cut.segments if s["kind"] == "layer"])
    assert sorted(reads) == list(range(1, n)) and all(len(r) == 1 for r in reads.values())
    assert all(reads[i][0][0] == i - 1 for i in reads)
    for i, [(m, k)] in reads.items():
        t = rec.tensors[next(tid for tid, kk in cut.segments[m + 1]["local"].items() if kk == k)]
        # ``HYV4Indexer.forward``: ``index_scores.topk(topk, dim=-1).indices.to(torch.int32)``, ``[B, S, topk]``
        assert t["dtype"] == "i32" and list(t["shape"][:2]) == [2, 16] and len(t["shape"]) == 3
    env = derive.hf_config(cfg).to_dict()
    pairs = [(i, m) for i, [(m, _)] in reads.items()]
    assert crosslayer.maker_rule(env, n, pairs) == "i - 1"
    assert crosslayer.maker_rule(env, n, [(i, m - 1) for i, m in pairs if m >= 1]) in (None, "i - 2")


def _gemma3n(n: int, shared: int, types: list[str]) -> dict:
    tiny = dict(vocab_size=32, vocab_size_per_layer_input=32, hidden_size=16, hidden_size_per_layer_input=4,
                intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8, laurel_rank=4,
                altup_num_inputs=2, activation_sparsity_pattern=[0.0] * n)
    return {**_defaults("gemma3n_text"), **tiny, "num_hidden_layers": n, "num_kv_shared_layers": shared,
            "layer_types": types}


def test_gemma3n_shared_layers_read_their_store_layers_kv_by_a_rule_that_holds_at_other_shapes():
    """Gemma3nTextAttention: a ``reuse`` layer takes ``shared_kv_states[layer_type]``, put there by the ``store``
    layer of its type (modeling_gemma3n.py). Recorded, exactly the layers the built model flags
    ``is_kv_shared_layer`` read tensors of an earlier layer, and that layer is the one flagged
    ``store_full_length_kv`` of the same ``layer_type``; the rule fitted on one config names the store layer of
    models built at other layer counts, shared counts and types (the model's flags, not the rule, are the
    expectation). Control: the rule fitted says another layer than ``i - 1`` (a carried state would)."""
    pytest.importorskip("torch")
    from transformers import Gemma3nTextConfig, Gemma3nTextModel

    from fitplan.api import compile_expr
    from fitplan_torch.learn import crosslayer, derive
    from fitplan_torch.learn.segments import Cut

    s, F = "sliding_attention", "full_attention"
    cfg = _gemma3n(7, 3, [s, F, s, F, s, F, s])
    rec = derive.run(cfg, "16", "sdpa", 2, 16)
    reads = _reads(Cut(rec, {}))
    model = Gemma3nTextModel(Gemma3nTextConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    attn = [x.self_attn for x in model.layers]
    shared = [i for i, a in enumerate(attn) if a.is_kv_shared_layer]
    assert sorted(reads) == shared == [4, 5, 6]
    store = {a.layer_type: i for i, a in enumerate(attn) if a.store_full_length_kv}
    assert all({m for m, _ in reads[i]} == {store[attn[i].layer_type]} for i in shared)
    env = derive.hf_config(cfg).to_dict()
    rule = crosslayer.maker_rule(env, 7, [(i, m) for i in shared for m, _ in reads[i]])
    assert rule is not None and rule != "i - 1"
    f = compile_expr(rule)
    for n, k, types in ((9, 4, [s, s, F, s, F, s, s, s, F]), (6, 2, [F, s, s, F, s, s]), (8, 5, [s, F] * 4)):
        c = Gemma3nTextConfig(**{**{x: v for x, v in _gemma3n(n, k, types).items() if x != "model_type"}})
        m = Gemma3nTextModel(c)
        a = [x.self_attn for x in m.layers]
        st = {y.layer_type: i for i, y in enumerate(a) if y.store_full_length_kv}
        envn = c.to_dict()
        assert [f({**envn, "i": i}) for i, y in enumerate(a) if y.is_kv_shared_layer] == \
            [st[y.layer_type] for y in a if y.is_kv_shared_layer], (n, k, types)


def test_gemma4_per_layer_inputs_are_slices_of_one_prologue_tensor():
    """Gemma4TextModel.forward makes ``per_layer_inputs`` once, ``[b, s, num_hidden_layers,
    hidden_size_per_layer_input]``, and passes layer i ``per_layer_inputs[:, :, i, :]`` (modeling_gemma4.py): an
    ``aten.select`` the loop runs between the layers, in no segment (layer 0's in the prologue). Each later layer's
    second argument is stated as
    slice i on dimension 2 of that prologue tensor, whose recorded shape is the one by hand. Control: a tensor
    that is no such slice (the first layer's hidden state) gives None."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import crosslayer, derive
    from fitplan_torch.learn.segments import Cut

    from fitplan_torch.learn.shrink import shrunk_config

    cfg = shrunk_config(_defaults("gemma4_text"))
    L, width = cfg["num_hidden_layers"], cfg["hidden_size_per_layer_input"]
    rec = derive.run(cfg, "16", "sdpa", 2, 16)
    cut = Cut(rec, {})
    layers = [s for s in cut.segments if s["kind"] == "layer"]
    got = []
    for seg in layers[1:]:  # (layer 0's slice runs before the first layer starts: a prologue tensor)
        tid = next(t for t, a in seg["argmap"].items() if a == 1)
        got.append(crosslayer.per_layer_slice(cut, tid, seg["layer"]))
    tid0 = next(t for t, a in layers[0]["argmap"].items() if a == 1)
    assert cut.owner_seg[tid0][0] == 0 and crosslayer.per_layer_slice(cut, tid0, 0) is None
    assert all(g is not None and g[0] == "select" and g[2] == 2 for g in got) and len({g[1] for g in got}) == 1
    base = next(tid for tid, k in cut.segments[0]["local"].items() if f"P{k}" == got[0][1])
    assert list(rec.tensors[base]["shape"]) == [2, 16, L, width] and len(layers) == L >= 3
    h0 = next(t for t, a in layers[0]["argmap"].items() if a == 0)
    assert crosslayer.per_layer_slice(cut, h0, 0) is None
    tid1 = next(t for t, a in layers[1]["argmap"].items() if a == 1)
    assert crosslayer.per_layer_slice(cut, tid1, 2) is None  # slice 1 is not layer 2's


def test_the_replay_refuses_a_maker_it_cannot_place_naming_the_expression():
    """The core evaluates a ``["layer", expr, "t<k>"]`` argument's rule per layer (trace/layer_refs.py
    ``maker``): a config that leaves the rule's list out, or a rule naming no earlier layer, is a clear
    refusal (exit 2), not a KeyError. Control: the same rule over a stated list gives the store layer by hand
    (layers 0..4 of types s F s F s with the last 2 shared: layer 3 reads layer 1, layer 4 reads layer 2)."""
    from types import SimpleNamespace

    from fitplan.errors import FitplanError
    from fitplan.trace.layer_refs import maker

    rule = "last_index(layer_types, layer_types[i], num_hidden_layers - num_kv_shared_layers)"
    env = {"layer_types": ["s", "F", "s", "F", "s"], "num_hidden_layers": 5, "num_kv_shared_layers": 2}
    b = SimpleNamespace(env=env)
    assert [maker(b.env, rule, i) for i in (3, 4)] == [1, 2]
    with pytest.raises(FitplanError, match="cannot tell which layer's tensor layer 3 reads") as e:
        maker({**env, "layer_types": None}, rule, 3)
    assert e.value.exit_code == 2
    with pytest.raises(FitplanError, match="which is no earlier layer"):
        maker(b.env, rule, 1)  # layer 1 is its own kind's last before the shared ones: itself


def test_layers_built_one_by_one_give_the_figures_of_the_weighted_block(tmp_path, monkeypatch):
    """Where a layer reads another layer's tensor the replay builds every layer on its own (``layer_refs.cross_layer``
    not None) instead of one block weighted by its repetitions (``layer_plan``); the replay accounts for the
    repetition exactly (trace/step_trace.py), so the two give the same bytes. Tiny Gemma-2 (sliding and full
    layers alternating) at 7 layers, with and without checkpointing, full and LoRA. Control: the plans differ
    (layer 0, then a 2-layer block weighted 3, against 7 single layers)."""
    import json
    from pathlib import Path

    import fitplan
    from fitplan.arch import archfile
    from fitplan.builtin import activations
    from fitplan.trace import learned_graph as LG
    from fitplan.trace import step_trace

    src = Path(__file__).resolve().parent / "data" / "configs" / "tiny-gemma2" / "config.json"
    cfg = json.loads(src.read_text())
    cfg["num_hidden_layers"] = 7
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = [cfg["layer_types"][i % len(cfg["layer_types"])] for i in range(7)]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    plans: list = []

    from fitplan.trace import layer_refs

    cross, plan = layer_refs.cross_layer, LG.Builder.layer_plan
    monkeypatch.setattr(LG.Builder, "layer_plan", lambda self, kinds: plans.append(plan(self, kinds)) or plans[-1])

    def _clear() -> None:
        archfile.load.cache_clear()
        step_trace.build.cache_clear()
        activations._TRACES.clear()
        step_trace._WHOLE.clear()

    def figures(one_by_one: bool, **kw) -> tuple:
        _clear()
        monkeypatch.setattr(layer_refs, "cross_layer", (lambda v: {}) if one_by_one else cross)
        e = fitplan.estimate(model=str(tmp_path / "config.json"), device="cpu", per_device_train_batch_size=2,
                             max_seq_length=64, **kw)
        return e["activation_bytes"], e["saved_for_backward_bytes"], e["peak_bytes"]

    for kw in ({"precision": "bf16-true"}, {"precision": "bf16-true", "gradient_checkpointing": True},
               {"precision": "bf16-mixed", "gradient_checkpointing": True, "method": "lora",
                "lora_target_modules": "all-linear"}):
        plans.clear()
        block = figures(False, **kw)
        assert plans and all(p == [(0, 1, 1), (1, 2, 3)] for p in plans)  # the weighted block was planned
        plans.clear()
        single = figures(True, **kw)
        assert not plans  # one by one: no block planned
        assert single == block, kw
    _clear()


def test_gemma4_sizes_made_of_the_layer_count_scale_with_it():
    """The probes hold the layer count, so the per-layer inputs' sizes were fitted as numbers and a file learned at
    30 layers sliced a 30-wide tensor at any count (refused at the held-out count: "layer 30 reads slice 30").
    By hand from Gemma4TextModel (modeling_gemma4.py): ``embed_tokens_per_layer`` is ``num_hidden_layers *
    hidden_size_per_layer_input`` wide, and so is ``per_layer_model_projection``'s output; the per-layer inputs
    are ``[b, s, num_hidden_layers, hidden_size_per_layer_input]``. ``crosslayer.count_scaled`` (fitted at n and
    n + 1 layers) is checked against a recording at n + 3 layers, which it never saw: every prologue tensor and
    parameter shape. Control: the sizes as fitted (numbers) miss the n + 3 recording."""
    pytest.importorskip("torch")
    from fitplan.api import compile_expr
    from fitplan_torch.learn import crosslayer, derive
    from fitplan_torch.learn.patterns import with_layers
    from fitplan_torch.learn.segments import Cut
    from fitplan_torch.learn.shrink import shrunk_config

    cfg = shrunk_config(_defaults("gemma4_text"))
    rec = derive.run(cfg, "16", "eager", 2, 16)
    cut, n = Cut(rec, {}), len(rec.layers)
    pro = {"t": [[[str(x) for x in t[0]], t[1], t[2]] for t in cut.segments[0]["tensors"]]}
    params = {k: ([str(x) for x in rec.tensors[v]["shape"]], rec.tensors[v]["dtype"]) for k, v in rec.params.items()}
    fitted = {k: list(v[0]) for k, v in params.items()}
    res = {"probes": [derive.Probe(cfg, 2, 16, {})], "rec": rec, "cut": cut, "params": params}
    out = crosslayer.count_scaled(res, pro, "16", "eager", n)
    far = with_layers(cfg, n + 3)
    rec3 = derive.run(far, "16", "eager", 2, 16)
    env = {**derive.hf_config(far).to_dict(), "num_hidden_layers": n + 3}

    def shape(dims):
        return [compile_expr(str(e))(env) for e in dims]

    seg3 = Cut(rec3, {}).segments[0]
    assert [shape(t[0]) for t in out["t"]] == [list(t[0]) for t in seg3["tensors"]]
    assert all(shape(params[k][0]) == list(rec3.tensors[rec3.params[k]]["shape"]) for k in params)
    hpl = cfg["hidden_size_per_layer_input"]
    assert list(rec3.tensors[rec3.params["model.embed_tokens_per_layer.weight"]]["shape"])[1] == (n + 3) * hpl
    # control: the numbers fitted at n layers
    assert [shape(t[0]) for t in pro["t"]] != [list(t[0]) for t in seg3["tensors"]]
    assert shape(fitted["model.embed_tokens_per_layer.weight"]) != \
        list(rec3.tensors[rec3.params["model.embed_tokens_per_layer.weight"]]["shape"])
