"""A Python loop over the sequence folded to one repeated block that carries its state (issue #32; learn/seqloop.py).

Mamba's reference scan off CUDA (transformers 5.24 modeling_mamba.py, the "Recurrent iteration" of the selective
scan): per position ``ssm_state = discrete_A[:, :, i] * ssm_state + deltaB_u[:, :, i]``, a ``matmul`` with
``C[:, i]`` and ``scan_outputs.append(...)``, then one ``torch.stack``. Position 0 reads ``torch.zeros`` (no
gradient: its ``mul`` saves one tensor, the others two), so the loop that repeats is positions 1 .. s-1.
"""

from __future__ import annotations

import pytest


def _recording(ops: list[tuple[str, list, list[int]]], n_tensors: int):
    from fitplan_torch.learn.record import Recording

    rec = Recording()
    made = {t: i for i, (_, _, outs) in enumerate(ops) for t in outs}
    for t in range(n_tensors):
        rec.tensors.append({"shape": [2, 8], "dtype": "f32", "sid": t, "origin": "op" if t in made else "input",
                            "op": made.get(t)})
        rec.storages.append({"nbytes": 64, "owner": t, "death": None})
    for name, args, outs in ops:
        rec.ops.append({"name": name, "args": args, "outs": outs, "scalars": {}, "inplace": False, "saves": [],
                        "layer": 0})
    rec.layers = [{"index": 0, "start": 0, "end": len(ops), "args": []}]
    rec.forward_end = len(ops)
    return rec


def _scan(positions: int, tail: tuple = ()):
    """``state = zeros; for i: state = a[i] * state; out.append(state[0])``; stack; tensor 0 is ``a``; then
    ``tail``'s ops."""
    ops = [("zeros", [], [1])]
    state, t, outs = 1, 2, []
    for _ in range(positions):
        ops += [("select.int", [("self", 0)], [t]), ("mul.Tensor", [("self", t), ("other", state)], [t + 1]),
                ("select.int", [("self", t + 1)], [t + 2])]
        state, outs, t = t + 1, outs + [t + 2], t + 3
    ops.append(("stack", [("tensors", outs)], [t]))
    ops += list(tail)
    return _recording(ops, t + 1 + len(tail))


def test_a_scan_folds_to_one_iteration_with_its_carry():
    pytest.importorskip("torch")
    from fitplan_torch.learn.seqloop import fold_loops

    rec = fold_loops(_scan(5))  # by hand: 1 + 3*5 + 1 ops; one body of 3 ops, 5 times; state 3 made by position 0
    assert [o["name"] for o in rec.ops] == ["zeros", "select.int", "mul.Tensor", "select.int", "stack"]
    assert rec.repeats == [{"first": 1, "len": 3, "count": 5, "each": [2, 3, 4], "carry": {1: 3}}]
    assert rec.ops[4]["args"] == [("tensors", [4])]


def test_a_state_read_alone_after_the_loop_is_never_folded_away():
    """Control: the same ops, but what follows reads position 2's state alone (no list over every position). A fold
    from position 0 would drop it (the file could not say which repetition it means), so the loop is folded only
    from position 2 on, where it is the first repetition's: positions 0 and 1 stay as recorded (by hand)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.seqloop import fold_loops

    rec = fold_loops(_scan(5, tail=(("neg", [("self", 9)], [18]),)))  # tensor 9: position 2's state, 3 per position
    assert rec.repeats == [{"first": 7, "len": 3, "count": 3, "each": [8, 9, 10], "carry": {6: 9}}]
    assert [o["name"] for o in rec.ops][:7] == ["zeros"] + ["select.int", "mul.Tensor", "select.int"] * 2
    assert rec.ops[-1]["args"] == [("self", 9)] and rec.ops[-2]["args"] == [("tensors", [4, 7, 10])]


def test_mamba_learns_its_reference_scan_and_the_referee_measures_the_same():
    """Tiny Mamba (its class defaults, shrunk): the scan folds to ``s - 1`` repetitions of one carried block, the
    file says it assumes the reference scan, and a real training step measured by torch (fitplan-torch's CPU
    referee, bf16, full fine-tuning and LoRA) has the file's activations and peak within 1 % and the same
    parameters, gradients and optimizer states. Control: the same file without the carry (each repetition reading
    the initial zeros, which need no gradient) is refused by the same check."""
    pytest.importorskip("torch")
    import copy

    from transformers import AutoConfig

    from fitplan.arch.archexpr import compile_expr
    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V
    from fitplan_torch.learn.shrink import shrink

    cfg = shrink({**AutoConfig.for_model("mamba").to_dict(), "model_type": "mamba"})
    data, _, _ = derive.learn_full(cfg, log=lambda *a: None, variants=(("16", "eager"),), first_only=True)
    reps = [r for seg in data["segments"].values() for r in seg.get("rep", ())]
    assert reps and all(compile_expr(r["n"])({"s": 21}) == 20 and len(r["carry"]) == 1 for r in reps)
    assert data["assumed"]["scan"]["value"] == "reference" and data["assumed"]["scan"]["always"] is True
    resolved = {k: v for k, v in derive.hf_config(cfg).to_dict().items()
                if k not in ("transformers_version", "architectures", "dtype", "torch_dtype")}
    cases = [("bf16-true", "eager", False, "full"), ("bf16-true", "eager", False, "lora")]
    problems, rows = V.check_memory(data, {**resolved, "model_type": "mamba"}, lambda *a: None, cases=cases)
    assert problems == [] and all(abs(r["activations"]) < 0.01 and abs(r["peak"]) < 0.01 for r in rows)
    broken = copy.deepcopy(data)
    for seg in broken["segments"].values():
        for r in seg.get("rep", ()):
            r.pop("carry", None)
    problems, _ = V.check_memory(broken, {**resolved, "model_type": "mamba"}, lambda *a: None, cases=cases[:1])
    assert problems and "activations" in problems[0]


def test_a_loop_that_does_not_fold_is_named_with_its_module_and_why():
    """Qwen4-Exp's QSA indexer loops over (batch, position) with ``torch.nonzero`` of the mask row (transformers 5.24
    modeling_qwen4_exp.py): the refusal names the module and the data-dependent op. Fake recordings: 3 ops per
    position in ``m.indexer`` (one a ``nonzero``), 1 per position in ``m.other`` (by hand: 12 and 4 more at s + 4)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.seqloop import unfolded_loop_note

    def run(cfg, precision, attn, b, s):
        rec = _recording([], 0)
        rec.ops = ([{"name": n, "module": "m.indexer", "args": [], "outs": []} for _ in range(s)
                    for n in ("nonzero", "index_select", "mm")]
                   + [{"name": "neg", "module": "m.other", "args": [], "outs": []} for _ in range(s)])
        return rec

    note = unfolded_loop_note(run, {}, "16", "eager", 2, 16)
    assert note == ("; the loop runs in m.indexer (12 more ops at 20 positions than at 16): its iterations differ "
                    "in size: nonzero sizes them by the data")

    def plain(cfg, precision, attn, b, s):  # control: no data-dependent op
        rec = run(cfg, precision, attn, b, s)
        rec.ops = [o for o in rec.ops if o["name"] != "nonzero"]
        return rec

    assert "not one repeated block" in unfolded_loop_note(plain, {}, "16", "eager", 2, 16)
