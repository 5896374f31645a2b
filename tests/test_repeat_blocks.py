"""Repeated blocks in learned graphs (issue #25): ops a model runs once per head, kept once and unrolled per scenario.

StableLM's per-head q/k LayerNorm (transformers 5.24 modeling_stablelm.py ``StableLmLayerNormPerHead``) is
``torch.cat([norm(h) for norm, h in zip(self.norms, torch.split(x, 1, dim=1))], dim=1)``: one ``split.Tensor``
with one output per head, one ``native_layer_norm`` per head (its own ``norms.<h>.weight``), one ``cat`` over the
results. The expected segments below are written out by hand from that code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fitplan
from fitplan.arch.learned_repeat import template, unroll

CONFIGS = Path(__file__).parent / "data" / "configs"

# a folded loop: a0 [b, heads, s, d] -> split (t0, one piece per head) -> LayerNorm per piece (t1 out, t2 mean,
# t3 rstd) -> cat (t4); t0 dies at the cat, the LayerNorm's statistics when the forward returns
FOLDED = {
    "t": [[["b", "1", "s", "d"], "bf16", "a0"],
          [["b", "1", "s", "d"], "bf16", None],
          [["b", "1", "s", "1"], "f32", None],
          [["b", "1", "s", "1"], "f32", None],
          [["b", "heads", "s", "d"], "bf16", None]],
    "ops": [["split.Tensor", [["self", "a0"]], ["t0"], {"sc": {"dim": 1}}],
            ["native_layer_norm", [["input", "t0"], ["weight", "p:norms.{h}.weight"]], ["t1", "t2", "t3"], {"g": "nn"}],
            ["cat", [["tensors", ["t1"]]], ["t4"]],
            ["mul.Tensor", [["self", "t4"], ["other", "t4"]], ["t4"]]],
    "args": ["hidden_states"],
    "die": {"t0": 2, "t1": 3, "t2": "F", "t3": "F", "t4": "F"},
    "sites": [{"module": "after", "start": 3, "end": 3, "input": "t4", "output": "t4", "in": "d", "out": "d", "rank": 4}],
    "rep": [{"n": "heads", "first": 1, "len": 1, "each": ["t0", "t1", "t2", "t3"]}],
}


def test_a_repeated_block_unrolls_to_one_op_per_head():
    seg = unroll(FOLDED, {"heads": 3})
    # repetition r of t0..t3 is t0..t3 for r = 0, then new tensors in order: t5..t8 (r = 1), t9..t12 (r = 2)
    assert [op[0] for op in seg["ops"]] == ["split.Tensor"] + ["native_layer_norm"] * 3 + ["cat", "mul.Tensor"]
    assert seg["ops"][0][2] == ["t0", "t5", "t9"]  # the split's outputs: one per head
    assert [op[1] for op in seg["ops"][1:4]] == [
        [["input", "t0"], ["weight", "p:norms.0.weight"]],
        [["input", "t5"], ["weight", "p:norms.1.weight"]],
        [["input", "t9"], ["weight", "p:norms.2.weight"]]]
    assert [op[2] for op in seg["ops"][1:4]] == [["t1", "t2", "t3"], ["t6", "t7", "t8"], ["t10", "t11", "t12"]]
    assert seg["ops"][4][1] == [["tensors", ["t1", "t6", "t10"]]]  # the cat reads every head's result
    assert len(seg["t"]) == 5 + 2 * 4
    assert seg["t"][5] == [["b", "1", "s", "d"], "bf16", "a0"]  # a view of the same input (a0 is not repeated)
    assert seg["t"][6][2] is None and seg["t"][8][1] == "f32"
    # positions after the loop move by (3 - 1) * 1: the pieces die at the cat, now op 4; the site is op 5
    assert seg["die"] == {"t0": 4, "t5": 4, "t9": 4, "t1": 5, "t6": 5, "t10": 5,
                          "t2": "F", "t7": "F", "t11": "F", "t3": "F", "t8": "F", "t12": "F", "t4": "F"}
    assert (seg["sites"][0]["start"], seg["sites"][0]["end"]) == (5, 5)
    assert "rep" not in seg and seg["ops"][1][3] == {"g": "nn"}
    assert FOLDED["ops"][0][2] == ["t0"]  # the file's segment is not changed


def test_a_repeated_block_at_its_recorded_count_is_the_recording():
    seg = unroll(FOLDED, {"heads": 1})
    assert seg["ops"] == [["split.Tensor", [["self", "a0"]], ["t0"], {"sc": {"dim": 1}}],
                          ["native_layer_norm", [["input", "t0"], ["weight", "p:norms.0.weight"]], ["t1", "t2", "t3"],
                           {"g": "nn"}],
                          ["cat", [["tensors", ["t1"]]], ["t4"]],
                          ["mul.Tensor", [["self", "t4"], ["other", "t4"]], ["t4"]]]
    assert seg["die"] == FOLDED["die"] and seg["t"] == FOLDED["t"]


def test_a_tensor_that_dies_inside_the_body_dies_in_its_own_repetition():
    folded = {**FOLDED, "die": {**FOLDED["die"], "t0": 1}}  # each piece released by the LayerNorm that read it
    seg = unroll(folded, {"heads": 4})
    assert [seg["die"][t] for t in ("t0", "t5", "t9", "t13")] == [1, 2, 3, 4]


def test_repeated_parameter_names_map_to_their_template():
    known = {"model.layers.{i}.self_attn.q_layernorm.norms.{h}.weight": []}
    assert template("model.layers.{i}.self_attn.q_layernorm.norms.7.weight", known) == \
        "model.layers.{i}.self_attn.q_layernorm.norms.{h}.weight"
    assert template("model.layers.{i}.mlp.up_proj.weight", known) == "model.layers.{i}.mlp.up_proj.weight"


def test_stablelm_2_12b_parameters_count_one_layernorm_per_head():
    # stabilityai/stablelm-2-12b config.json (rulesets/models/stablelm.toml): per layer, q_layernorm has 32
    # LayerNorm(head_dim = 5120/32 = 160, bias=False) and k_layernorm 8: 40 * 160 = 6,400 weights per layer
    # (transformers 5.24 modeling_stablelm.py StableLmLayerNormPerHead). Per layer: q and o 5120*5120, k and v
    # 5120*(8*160), gate/up/down 3*5120*13824, the input LayerNorm with its bias 2*5120 (a parallel block has no
    # post-attention LayerNorm: StableLmDecoderLayer sets it to None), the per-head norms. Plus the embedding and
    # the untied head 2*100352*5120 and the final LayerNorm 2*5120. (The model card's 12,143,605,760 is 419,840
    # more, 41 LayerNorms of 2*5120: not what transformers 5.24 builds.)
    layer = 2 * 5120 * 5120 + 2 * 5120 * 1280 + 3 * 5120 * 13824 + 2 * 5120 + 40 * 160
    total = 40 * layer + 2 * 100352 * 5120 + 2 * 5120
    assert total == 12_143_185_920
    est = fitplan.estimate(model="stablelm-2-12b", precision="bf16-true", optim="adamw_torch_fused")
    assert est.arch.param_count == total


@pytest.mark.parametrize(("precision", "method", "ckpt"), [("bf16-true", "full", False), ("bf16-mixed", "lora", True)])
def test_stablelm_per_head_norms_with_parallel_blocks_match_the_referee(precision, method, ckpt):
    """stablelm-2-12b's switches (qk_layernorm and use_parallel_residual) on a tiny sibling, 4 heads and 2 key/value
    heads: every memory category within 1 % of a real step measured by torch (fitplan-torch's CPU referee)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import fitplan_torch

    cfg = CONFIGS / "switch-stablelm-2-12b" / "config.json"
    assert json.loads(cfg.read_text())["qk_layernorm"] is True
    est = fitplan.estimate(model=str(cfg), precision=precision, optim="adamw_torch", method=method,
                           gradient_checkpointing=ckpt, per_device_train_batch_size=2, max_seq_length=32,
                           **({"lora_target_modules": ("all-linear",)} if method == "lora" else {}))
    report = fitplan_torch.validate(est, mode="cpu", memtracker=False)
    off = {k: c["relative_error"] for k, c in report["components"].items()
           if c["measured"] and abs(c["relative_error"]) > 0.01}
    assert off == {}


@pytest.mark.parametrize(("heads", "kv"), [(4, 2), (8, 4)])
def test_the_unrolled_layer_is_the_layer_torch_runs(heads, kv):
    """The bundled stablelm file's layer graph, unrolled at ``heads`` / ``kv``, is op for op what the model records
    (fitplan-torch's recorder, without folding): one LayerNorm per query head and one per key/value head."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fitplan.arch.archfile import load
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.record import record

    cfg = {**json.loads((CONFIGS / "switch-stablelm-2-12b" / "config.json").read_text()),
           "num_attention_heads": heads, "num_key_value_heads": kv, "hidden_size": 16 * heads}
    model, config = derive.build(cfg, "16", "sdpa")
    rec = record(model, derive.batch_for(config, 2, 16))
    layer = rec.layers[1]
    torch_ops = [o["name"] for o in rec.ops[layer["start"]:layer["end"]]]
    assert torch_ops.count("native_layer_norm") == 1 + heads + kv  # the input LayerNorm, then one per head

    af = load("stablelm")
    env = {**af.symbols(cfg), "b": 2, "s": 16}
    v = af.variant("16", "sdpa", env)
    seg = unroll(af.segments[v["layers"][af.layer_kinds(env)[1]]], env)
    assert [op[0] for op in seg["ops"]] == torch_ops


def test_the_learner_folds_a_loop_over_heads_to_one_repetition():
    pytest.importorskip("torch")
    from fitplan_torch.learn.fold import fold
    from fitplan_torch.learn.record import Recording

    rec = Recording()
    rec.tensors = [{"shape": [2, 3, 4, 8], "dtype": "bf16", "sid": 0, "origin": "input", "op": None}]
    rec.storages = [{"nbytes": 384, "owner": 0, "death": 5}]
    ops = [("split.Tensor", [("self", 0)], [1, 2, 3])]
    # tensors 1-3 the pieces, 4-6 / 7-9 / 10-12 the LayerNorms' (out, mean, rstd), 13-15 the weights, 16 the cat
    for j in range(3):
        ops.append(("native_layer_norm", [("input", 1 + j), ("weight", 13 + j)], [4 + 3 * j, 5 + 3 * j, 6 + 3 * j]))
    ops.append(("cat", [("tensors", [4, 7, 10])], [16]))
    ops.append(("mul.Tensor", [("self", 16), ("other", 16)], [17]))
    for i, (name, args, outs) in enumerate(ops):
        rec.ops.append({"name": name, "args": args, "outs": outs, "scalars": {}, "inplace": False})
    for t in range(1, 18):
        op = next((i for i, o in enumerate(ops) if t in o[2]), None)
        rec.tensors.append({"shape": [1], "dtype": "bf16", "sid": t, "origin": "op" if op is not None else "param", "op": op})
        rec.storages.append({"nbytes": 2, "owner": t, "death": None})
    for j in range(3):
        rec.storages[1 + j]["death"] = 1 + j  # each piece when its LayerNorm returns
        rec.storages[4 + 3 * j]["death"] = 4  # each LayerNorm output at the cat
    rec.params = {f"layers.0.attn.q_norm.norms.{j}.weight": 13 + j for j in range(3)}
    rec.accumulate = {f"layers.0.attn.q_norm.norms.{j}.weight": "steal" for j in range(3)}
    rec.layers = [{"index": 0, "start": 0, "end": 6, "args": []}]
    rec.backward = {k: {"op": k} for k in range(6)}
    rec.backward_order = [5, 4, 3, 2, 1, 0]
    rec.forward_end = 6
    fold(rec)
    assert [o["name"] for o in rec.ops] == ["split.Tensor", "native_layer_norm", "cat", "mul.Tensor"]
    assert rec.ops[0]["outs"] == [1] and rec.ops[2]["args"] == [("tensors", [4])]
    assert rec.repeats == [{"first": 1, "len": 1, "count": 3, "each": [1, 4, 5, 6]}]
    assert rec.params == {"layers.0.attn.q_norm.norms.{h}.weight": 13}
    assert rec.param_repeats == {"layers.0.attn.q_norm.norms.{h}.weight": 3}
    assert rec.accumulate == {"layers.0.attn.q_norm.norms.{h}.weight": "steal"}
    # deaths: piece 0 at its LayerNorm (op 1); pieces 1 and 2 died inside removed repetitions: at the cat (new op 2);
    # LayerNorm outputs at the cat (old 4 -> new 2); x at the mul (old 5 -> new 3)
    assert [rec.storages[s]["death"] for s in (1, 2, 3, 4, 0)] == [1, 2, 2, 2, 3]
    assert rec.layers[0]["end"] == 4 and rec.forward_end == 4
    assert sorted(rec.backward) == [0, 1, 2, 3] and rec.backward[2] == {"op": 4}
    assert rec.backward_order == [3, 2, 1, 0]


def test_a_split_whose_pieces_are_not_gathered_in_a_list_is_not_folded():
    """GPT-2's ``c_attn(x).split(embed_dim, dim=2)`` then the same view/transpose on q, k and v: the three results
    go to attention as separate arguments, not as one list, so nothing is folded."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.fold import fold
    from fitplan_torch.learn.record import Recording

    rec = Recording()
    rec.tensors = [{"shape": [1], "dtype": "bf16", "sid": 0, "origin": "op", "op": None} for _ in range(8)]
    rec.storages = [{"nbytes": 2, "owner": 0, "death": None}]
    rec.ops = [{"name": "split.Tensor", "args": [("self", 0)], "outs": [1, 2, 3], "scalars": {}, "inplace": False}]
    rec.ops += [{"name": "transpose.int", "args": [("self", 1 + j)], "outs": [4 + j], "scalars": {}, "inplace": False}
                for j in range(3)]
    rec.ops.append({"name": "sdpa", "args": [("query", 4), ("key", 5), ("value", 6)], "outs": [7], "scalars": {},
                    "inplace": False})
    rec.forward_end = 5
    fold(rec)
    assert len(rec.ops) == 5 and rec.repeats == []


# a folded loop over the sequence (Mamba's reference scan): t0 the initial state, then per position a select of
# a0 (t1), the new state t2 = t1 * state, and a select of it (t3); a stack over every position's t3 (t4). The
# first repetition reads t0; repetition r >= 1 reads repetition r - 1's t2 (the carry)
SCAN = {
    "t": [[["b", "d"], "f32", None],
          [["b", "d"], "f32", "a0"],
          [["b", "d"], "f32", None],
          [["b"], "f32", "t2"],
          [["b", "s"], "f32", None]],
    "ops": [["zeros", [], ["t0"]],
            ["select.int", [["self", "a0"]], ["t1"]],
            ["mul.Tensor", [["self", "t1"], ["other", "t0"]], ["t2"], {"g": "yy"}],
            ["select.int", [["self", "t2"]], ["t3"]],
            ["stack", [["tensors", ["t3"]]], ["t4"]]],
    "args": ["x"],
    "die": {"t0": "F", "t1": "F", "t2": "F", "t3": "F", "t4": "F"},
    "rep": [{"n": "s", "first": 1, "len": 3, "each": ["t1", "t2", "t3"], "carry": {"t0": "t2"}}],
}


def test_a_loop_over_the_sequence_unrolls_with_its_carried_state():
    """Written out by hand from the loop: ``state = a[:, i] * state; outs.append(state[:, 0])``, ``stack(outs)``."""
    seg = unroll(SCAN, {"s": 3})
    assert [op[0] for op in seg["ops"]] == ["zeros"] + ["select.int", "mul.Tensor", "select.int"] * 3 + ["stack"]
    # repetition 1's tensors are t5 t6 t7, repetition 2's t8 t9 t10
    assert [op[1] for op in seg["ops"][2:9:3]] == [[["self", "t1"], ["other", "t0"]],
                                                   [["self", "t5"], ["other", "t2"]],
                                                   [["self", "t8"], ["other", "t6"]]]
    assert seg["ops"][10][1] == [["tensors", ["t3", "t7", "t10"]]]
    assert seg["t"][7] == [["b"], "f32", "t6"]  # repetition 1's select is a view of its own state
    assert seg["t"][5] == [["b", "d"], "f32", "a0"]
    # control: without the carry every repetition would read the initial state
    plain = unroll({**SCAN, "rep": [{k: v for k, v in SCAN["rep"][0].items() if k != "carry"}]}, {"s": 3})
    assert plain["ops"][5][1] == [["self", "t5"], ["other", "t0"]]
