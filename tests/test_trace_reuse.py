"""One recording re-evaluated at another micro-batch and sequence length (``trace/symbolic.py``, ``trace/reuse.py``).

A template is a scenario's recording made with symbolic ``b`` and ``s``; at another ``(b, s)`` where its guards
hold, its sizes are evaluated instead of recording again. Each check compares the step trace built from a
re-evaluated template with the one a fresh recording gives (``record_afresh``, plain numbers), field by field:
every backward point, every work record, every saved label."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import attrs
import pytest

from fitplan.arch.architecture import load_config_json
from fitplan.trace import reuse, step_trace, symbolic
from fitplan.trace.step_trace import StepTrace, TraceSpec

CONFIGS = Path(__file__).parent / "data" / "configs"
MODELS = ["tiny-llama", "tiny-gemma2", "tiny-qwen3-moe", "tiny-gpt2", "tiny-phi3", "tiny-gpt-oss", "tiny-deepseek-v3"]
SHAPES = [(2, 100), (5, 33), (7, 4096)]
"""Micro-batch × sequence length to re-evaluate at (the templates are recorded at 3 × 48)."""


def spec_of(model: str, **changes) -> TraceSpec:
    arch = load_config_json(CONFIGS / model / "config.json")
    return attrs.evolve(TraceSpec(arch, 3, 48, "bf16-mixed", "sdpa", False, "full", 8, (), 0.0, "cuda", 512), **changes)


@pytest.fixture(autouse=True)
def _no_kept_templates():
    reuse.clear()
    yield
    reuse.clear()


def fresh(spec: TraceSpec) -> StepTrace:
    return step_trace.finished(step_trace.record_afresh(spec))


def from_template(tpl: reuse.Template, spec: TraceSpec) -> StepTrace | None:
    tr = tpl.at(spec)
    return None if tr is None else step_trace.finished(tr)


def symbolic_inside(x) -> bool:
    """A symbolic value anywhere in ``x`` (it compares equal to its plain value, so equality alone would not tell)."""
    if isinstance(x, symbolic.Sym):
        return True
    if isinstance(x, (tuple, list)):
        return any(symbolic_inside(y) for y in x)
    if attrs.has(type(x)):
        return any(symbolic_inside(getattr(x, f.name)) for f in attrs.fields(type(x)))
    return False


def assert_same(a: StepTrace, b: StepTrace) -> None:
    assert type(a) is type(b)
    assert not symbolic_inside(a) and not symbolic_inside(b)
    assert {f.name: getattr(a, f.name) for f in attrs.fields(type(a))} == \
           {f.name: getattr(b, f.name) for f in attrs.fields(type(b))}


def check_reevaluated(base: TraceSpec, shapes=SHAPES) -> int:
    """Every shape's trace from ``base``'s template (recorded at ``base``'s b and s) equals a fresh recording;
    returns how many shapes the template applied to (the others fail a guard and are not compared here)."""
    tpl = reuse.make(base, None, step_trace.record_afresh)
    applied = 0
    for b, s in shapes:
        spec = attrs.evolve(base, batch=b, seq=s)
        got = from_template(tpl, spec)
        if got is not None:
            applied += 1
            assert_same(got, fresh(spec))
    return applied


# --------------------------------------------------------------------------- symbolic values


def test_sizes_follow_b_and_s_through_the_traces_arithmetic():
    """The allocator's rounding of a b×s×4-byte tensor, a product, a float FLOP count with the float on the left,
    and a ceil division, each evaluated at another (b, s) against the same formula worked by hand."""
    tape, b, s = symbolic.start(3, 100)
    rounded = -(-(b * s * 4) // 512) * 512
    prod = math.prod([1, b, s, 32])
    flops = 2.0 * b * s * 7
    half = s // 2 + b % 2
    assert (rounded.v, prod.v, flops.v, half.v) == (1536, 9600, 4200.0, 51)  # (.v: comparing would be a guard)
    vals = tape.values(5, 77)
    assert vals is not None
    assert vals[rounded.n] == 2048  # 5 × 77 × 4 = 1,540 bytes: four blocks of 512
    assert vals[prod.n] == 12320 and vals[flops.n] == 5390.0 and vals[half.n] == 39
    assert type(vals[flops.n]) is float and type(vals[prod.n]) is int


def test_a_decision_is_a_guard_and_a_failed_guard_means_no_values():
    tape, b, s = symbolic.start(3, 100)
    assert b * s > 200  # decided True
    assert tape.values(2, 101) is not None  # 202 > 200
    assert tape.values(2, 100) is None  # 200 > 200 is False: the decision would change


@pytest.mark.parametrize("use", [str, hash, int, float, lambda x: f"{x}", lambda x: x.bit_length(), lambda x: range(x),
                                 lambda x: list(range(7))[:x % 7], lambda x: [0] * x, lambda x: tuple(range(7))[x % 7], round],
                         ids=["str", "hash", "int", "float", "format", "bit_length", "range", "slice", "repeat",
                              "index", "round-then-compare"])
def test_a_use_the_tape_does_not_follow_pins_the_value(use):
    """Formatting, hashing, conversions, a method of the number, a range bound, a slice, an index see the plain
    value and guard that it stays the same (a ``range`` of an int subclass would read the value unasked: a
    symbolic value is not one)."""
    tape, b, s = symbolic.start(3, 100)
    got = use(b * s)
    if isinstance(got, symbolic.Sym):  # round(): still symbolic until a decision
        assert got == 300
    assert tape.values(3, 100) is not None
    assert tape.values(3, 101) is None


# --------------------------------------------------------------------------- re-evaluated traces


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("changes", [{}, dict(checkpointing=True), dict(attn="eager", precision="32-true", device="cpu")],
                         ids=["full", "checkpointing", "eager-fp32-cpu"])
def test_a_reevaluated_trace_is_the_fresh_recording(model, changes):
    assert check_reevaluated(spec_of(model, **changes)) == len(SHAPES)


@pytest.mark.parametrize("changes", [
    dict(method="lora", lora_targets=("q_proj", "v_proj"), checkpointing=True),
    dict(method="qlora", lora_targets=("q_proj", "v_proj")),
    dict(method="qlora", lora_targets=("q_proj", "v_proj"), quant_bits=8),
    dict(loss="chunked"), dict(loss="liger"), dict(loss="cce"),
    dict(offload="torchtune", checkpointing=True), dict(offload="trl", checkpointing=True),
    dict(linear_saves_input=True, precision="bf16-true"), dict(precision="16-mixed"), dict(forward_only=True),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items() if k != "lora_targets"))
def test_setups_reevaluate_or_refuse_but_never_differ(changes):
    """Where a setup decides something by the sizes (torchtune's chunked loss splits the sequence in eight, the
    offloading plan's size threshold is applied later, by the replay), the template either still applies and
    gives the fresh trace, or a guard refuses it."""
    check_reevaluated(spec_of("tiny-llama", **changes), shapes=SHAPES + [(1, 48), (4, 8), (3, 49)])


def test_the_full_setup_reevaluates_at_every_shape_but_a_micro_batch_of_one():
    """The learned file decides by ``b != 1`` (the causal mask's path), so a template recorded at b = 3 refuses
    b = 1 and applies elsewhere."""
    tpl = reuse.make(spec_of("tiny-llama"), None, step_trace.record_afresh)
    assert tpl.at(spec_of("tiny-llama", batch=1)) is None
    assert tpl.at(spec_of("tiny-llama", batch=2, seq=3001)) is not None


def test_the_comparison_tells_an_unevaluated_size_apart(monkeypatch):
    """The control: a re-evaluation that leaves the kernels' work at the recorded shape's numbers (as a FLOP count
    escaping the tape would) is told apart by the comparison."""
    monkeypatch.setattr(reuse, "_work", lambda work, vals: type(work)(*[tuple(
        [type(k)(*[x.v if isinstance(x, symbolic.Sym) else x for x in k]) for k in ks]) for ks in work]))
    base = spec_of("tiny-llama")
    tpl = reuse.make(base, None, step_trace.record_afresh)
    spec = attrs.evolve(base, batch=5, seq=33)
    got = from_template(tpl, spec)
    assert got is not None
    with pytest.raises(AssertionError):
        assert_same(got, fresh(spec))


def test_the_comparison_tells_shapes_apart():
    with pytest.raises(AssertionError):
        assert_same(fresh(spec_of("tiny-llama", batch=2, seq=100)), fresh(spec_of("tiny-llama", batch=2, seq=101)))


def test_a_template_is_made_at_the_third_recording_and_reused_after(monkeypatch):
    """A scenario's first two recordings are plain (a command that estimates it and its advice's micro-batch-1
    variant pays nothing more); the third, at another shape, makes the template; the next are re-evaluated."""
    made = []
    real = reuse.make
    monkeypatch.setattr(reuse, "make", lambda *a: made.append(a[0]) or real(*a))
    before = dict(reuse.STATS)
    shapes = [(2, 100), (3, 200), (4, 300), (5, 301), (6, 17)]
    traces = [step_trace.finished(step_trace.record(spec_of("tiny-llama", batch=b, seq=s))) for b, s in shapes]
    assert [(k, reuse.STATS[k] - before[k]) for k in ("plain", "recorded", "reused")] == \
           [("plain", 2), ("recorded", 1), ("reused", 2)]
    assert [(m.batch, m.seq) for m in made] == [(4, 300)]
    for (b, s), got in zip(shapes, traces):
        assert_same(got, fresh(spec_of("tiny-llama", batch=b, seq=s)))


def test_a_relearned_file_is_not_served_by_an_old_template(monkeypatch):
    """A template serves only while ``archfile.load`` returns the learned file it was made from."""
    from fitplan.arch import archfile

    for b, s in [(2, 100), (3, 200), (4, 300)]:
        step_trace.record(spec_of("tiny-llama", batch=b, seq=s))
    assert reuse.STATS["recorded"] >= 1
    real = archfile.load
    monkeypatch.setattr(archfile, "load", lambda name: copy.copy(real(name)))  # a new object: as if relearned
    before = reuse.STATS["reused"]
    step_trace.record(spec_of("tiny-llama", batch=4, seq=300))
    assert reuse.STATS["reused"] == before


def test_a_symbolic_value_left_where_no_evaluation_reaches_refuses_the_template():
    """The walk over the template recording finds a symbolic value the re-evaluation would not evaluate (here put
    in the storages an autograd Function keeps) and the template is then never used."""
    base = spec_of("tiny-llama")
    tpl = reuse.make(base, None, step_trace.record_afresh)
    assert tpl.unevaluated is None and tpl.at(attrs.evolve(base, batch=5)) is not None
    tpl.tr.ctx_kept = {tpl.tensors[0].numel}
    tpl.unevaluated = reuse.unevaluated(tpl)
    assert tpl.unevaluated == "ctx_kept.0"
    assert tpl.at(attrs.evolve(base, batch=5)) is None


def _forget_traces() -> None:
    step_trace.build.cache_clear()
    step_trace._WHOLE.clear()
    step_trace._RECORDINGS.clear()
    reuse.clear()


def test_estimates_at_never_seen_shapes_are_those_of_fresh_recordings(monkeypatch):
    """What ``fitplan serve`` answers for never-seen shapes, after its templates are made: every value of each
    estimate (peak, its breakdown, the time model's) equals the estimate made with every recording fresh."""
    import fitplan

    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    scenario = dict(model="llama-2-7b", gpu="a100-80gb", precision="bf16-mixed", optim="adamw_torch_fused",
                    gradient_checkpointing=True, num_examples=10000, tokens_per_example=512)
    shapes = [(9, 3000), (1, 3000), (10, 3001), (1, 3001), (11, 3002), (1, 3002), (12, 3003)]

    def values() -> list[dict]:
        _forget_traces()
        return [fitplan.estimate(scenario, per_device_train_batch_size=b, max_seq_length=s).values for b, s in shapes]

    before = reuse.STATS["reused"]
    reused = values()
    assert reuse.STATS["reused"] - before >= 2
    monkeypatch.setattr(step_trace, "record", step_trace.record_afresh)
    fresh_values = values()
    _forget_traces()
    assert not any(symbolic_inside(list(v.values())) for v in reused)
    assert reused == fresh_values


def test_a_reevaluated_recording_keeps_no_copy_for_its_twin():
    """``build_sharing`` keeps a plain recording for the twin (the same scenario, checkpointing the other way); one
    re-evaluated from a template is not kept there (keeping its few thousand objects alive cost more in the
    garbage collector's walks: ``reuse.record`` keeps only the last two it re-evaluated, and this one was made
    with its template, so the twin re-evaluates it), and both traces are still the fresh ones."""
    for b, s in [(2, 100), (3, 200)]:  # the scenario's two plain recordings (build_sharing records it checkpointed)
        step_trace.record(spec_of("tiny-llama", batch=b, seq=s, checkpointing=True))
    step_trace._RECORDINGS.clear()
    spec = spec_of("tiny-llama", batch=4, seq=300)
    before = dict(reuse.STATS)
    got = step_trace.build_sharing(spec)  # the third recording: the template, re-evaluated at its own shape
    assert reuse.STATS["recorded"] - before["recorded"] == 1 and step_trace._RECORDINGS == {}
    twin = attrs.evolve(spec, checkpointing=True)
    got_twin = step_trace.build_sharing(twin)
    assert reuse.STATS["reused"] - before["reused"] == 1
    assert_same(got, step_trace.build_afresh(spec))
    assert_same(got_twin, step_trace.build_afresh(twin))


def _twins_from_one_reevaluation(monkeypatch, handed_out=None) -> tuple[dict, list]:
    """A checkpointed scenario's two asks at a never-seen shape, as ``fitplan serve`` makes them: its forward without
    checkpointing (forward only), then its whole step with it; both need the same recording (made with
    checkpointing on). Returns how the recordings were got and the traces next to fresh ones."""
    if handed_out is not None:
        monkeypatch.setattr(reuse, "handed_out", handed_out)
    for b, s in [(2, 100), (3, 200), (4, 300)]:  # two plain recordings, then the template
        step_trace.record(spec_of("tiny-llama", batch=b, seq=s, checkpointing=True))
    step_trace._RECORDINGS.clear()
    whole = spec_of("tiny-llama", batch=5, seq=301, checkpointing=True)
    forward = attrs.evolve(whole, checkpointing=False, forward_only=True)
    before = dict(reuse.STATS)
    got = [step_trace.build_sharing(forward), step_trace.build_sharing(whole)]
    counts = {k: reuse.STATS[k] - before[k] for k in before}
    return counts, [(g, fresh(spec)) for g, spec in zip(got, (forward, whole))]


def test_the_twin_ask_gets_the_same_reevaluation_again(monkeypatch):
    """The second ask is handed the first's re-evaluated recording again (``again``: no second evaluation of the
    template), a copy each caller may change: both traces equal fresh recordings field by field."""
    counts, pairs = _twins_from_one_reevaluation(monkeypatch)
    assert (counts["reused"], counts["again"], counts["recorded"], counts["plain"]) == (1, 1, 0, 0)
    for got, want in pairs:
        assert_same(got, want)


def test_the_twin_ask_without_a_copy_differs(monkeypatch):
    """Control: handing out the kept recording itself (no copy) lets the forward-only ask's changes (checkpointing
    off: no checkpointed segment) reach the whole step's trace, and the comparison sees it."""
    counts, pairs = _twins_from_one_reevaluation(monkeypatch, handed_out=lambda tr: tr)
    assert counts["again"] == 1
    assert_same(*pairs[0])
    with pytest.raises(AssertionError):
        assert_same(*pairs[1])
