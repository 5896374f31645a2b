"""A step trace's forward figures alone (``trace/step_trace.py``: ``TraceSpec.forward_only``, ``ForwardTrace``).

A scenario with gradient checkpointing reads of its trace without checkpointing only what the forward decides
(the activations it would keep, one layer's share: ``builtin/activations.py``), so that trace is replayed forward
only. Each forward figure must be the one the whole trace (forward and backward replayed) has: every check builds
both afresh, with no cache, and compares them field by field."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from fitplan.arch.architecture import load_config_json
from fitplan.trace import step_trace
from fitplan.trace.step_trace import FORWARD_FIELDS, ForwardTrace, StepTrace, TraceSpec

CONFIGS = Path(__file__).parent / "data" / "configs"
MODELS = ["tiny-llama", "tiny-gemma2", "tiny-qwen3-moe", "tiny-gpt2", "tiny-phi3", "tiny-gpt-oss", "tiny-deepseek-v3"]


# These tests check the recording ``build_sharing`` keeps for a twin, which a recording re-evaluated from a
# template does not keep (trace/reuse.py): no template from an earlier test.
pytestmark = pytest.mark.usefixtures("no_trace_templates")


def spec_of(model: str, **changes) -> TraceSpec:
    arch = load_config_json(CONFIGS / model / "config.json")
    return attrs.evolve(TraceSpec(arch, 3, 48, "bf16-mixed", "sdpa", False, "full", 8, (), 0.0, "cuda", 512), **changes)


def assert_forward_of(whole: StepTrace, forward: ForwardTrace) -> None:
    assert isinstance(whole, StepTrace) and isinstance(forward, ForwardTrace)
    assert {f: getattr(forward, f) for f in FORWARD_FIELDS} == {f: getattr(whole, f) for f in FORWARD_FIELDS}


def test_the_forward_fields_are_step_trace_fields_and_nothing_of_the_backward():
    whole = {f.name for f in attrs.fields(StepTrace)}
    assert set(FORWARD_FIELDS) <= whole
    assert not any(f.startswith("backward") for f in FORWARD_FIELDS) and "work" not in FORWARD_FIELDS


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("precision", "attn", "device", "loss"), [
    ("bf16-mixed", "sdpa", "cuda", "hf"), ("32-true", "eager", "cpu", "chunked"), ("bf16-true", "sdpa", "cuda", "liger")])
def test_a_forward_only_trace_has_the_whole_traces_forward_figures(model, precision, attn, device, loss):
    spec = spec_of(model, precision=precision, attn=attn, device=device, loss=loss)
    assert_forward_of(step_trace.build_afresh(spec), step_trace.build_afresh(attrs.evolve(spec, forward_only=True)))


@pytest.mark.parametrize(("method", "changes"), [
    ("lora", dict(lora_targets=("q_proj", "v_proj"))),
    ("lora", dict(lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                  lora_dropout=0.1)),
    ("qlora", dict(lora_targets=("q_proj", "v_proj"), quant_compute="bf16")),
    ("qlora", dict(lora_targets=("q_proj", "v_proj"), quant_bits=8)),
    ("full", dict(offload="torchtune")),
    ("full", dict(offload="trl")),
    ("full", dict(linear_saves_input=True, precision="bf16-true")),
])
def test_the_forward_figures_under_lora_qlora_and_offloading(method, changes):
    """The offloading plan's host and copy bytes are forward figures too (trace/offload.py: planned before the
    replay); LoRA's adapters and ZeRO-3's saved Linear inputs change what the forward keeps."""
    spec = spec_of("tiny-llama", method=method, **changes)
    assert_forward_of(step_trace.build_afresh(spec), step_trace.build_afresh(attrs.evolve(spec, forward_only=True)))


def test_the_comparison_tells_forward_figures_apart():
    """The comparison above can fail: a longer sequence keeps more."""
    short, long = spec_of("tiny-llama"), spec_of("tiny-llama", seq=96)
    with pytest.raises(AssertionError):
        assert_forward_of(step_trace.build_afresh(short), step_trace.build_afresh(attrs.evolve(long, forward_only=True)))


def test_a_backward_figure_of_a_forward_only_trace_is_an_error_not_a_number():
    forward = step_trace.build_afresh(spec_of("tiny-llama", forward_only=True))
    for name in ("backward_frontier", "backward_points", "work", "param_ops"):
        with pytest.raises(AttributeError):
            getattr(forward, name)


def test_a_forward_only_trace_leaves_its_recording_to_both_whole_traces(monkeypatch):
    """What a scenario with checkpointing asks for, in the engine's order: the forward without checkpointing first
    (recorded once, with checkpointing on), then the whole checkpointed trace, from the kept recording; the same
    scenario without checkpointing then replays its whole plain trace from the recording kept for it."""
    spec = spec_of("tiny-llama", forward_only=True)
    whole = attrs.evolve(spec, forward_only=False)
    twin = attrs.evolve(whole, checkpointing=True)
    step_trace._RECORDINGS.clear()
    assert_forward_of(step_trace.build_afresh(whole), step_trace.build_sharing(spec))
    assert list(step_trace._RECORDINGS) == [(twin, ""), (whole, "")]
    with monkeypatch.context() as m:
        m.setattr(step_trace, "record", no_recording)
        shared_twin = step_trace.build_sharing(twin)
        shared_whole = step_trace.build_sharing(whole)
    assert shared_twin == step_trace.build_afresh(twin) and shared_whole == step_trace.build_afresh(whole)
    assert step_trace._RECORDINGS == {}


def test_a_recording_kept_for_the_whole_plain_trace_serves_its_forward_and_stays(monkeypatch):
    """The other order (the checkpointed trace first, as a search may ask): the recording kept for the plain twin
    serves its forward-only ask, with nothing recorded again, and is still kept for the whole plain trace."""
    ckpt = spec_of("tiny-gemma2", checkpointing=True)
    plain = attrs.evolve(ckpt, checkpointing=False)
    step_trace._RECORDINGS.clear()
    step_trace.build_sharing(ckpt)
    with monkeypatch.context() as m:
        m.setattr(step_trace, "record", no_recording)
        forward = step_trace.build_sharing(attrs.evolve(plain, forward_only=True))
        assert list(step_trace._RECORDINGS) == [(plain, "")]
        shared = step_trace.build_sharing(plain)
    assert_forward_of(step_trace.build_afresh(plain), forward)
    assert shared == step_trace.build_afresh(plain) and step_trace._RECORDINGS == {}


def test_an_estimate_with_checkpointing_replays_its_plain_trace_forward_only(monkeypatch):
    """With checkpointing on, the estimate replays the plain trace's forward only and the checkpointed trace whole
    (``DEBUG`` lists each replay); with it off, the plain trace whole and nothing else."""
    import fitplan
    from fitplan.builtin import activations

    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    monkeypatch.setattr(activations, "_TRACES", {})
    step_trace.build.cache_clear()
    config = str(CONFIGS / "tiny-llama" / "config.json")
    replays = []
    monkeypatch.setattr(step_trace, "DEBUG", replays)
    expected = {(True, 61): [("replay forward", False), ("replay", True)], (False, 67): [("replay", False)],
                (True, 67): [("replay", True)]}  # the last: the forward's figures copied from the whole trace
    for (ckpt, seq), replayed in expected.items():  # sequence lengths no other test asks for
        replays.clear()
        est = fitplan.estimate(model=config, per_device_train_batch_size=2, max_seq_length=seq,
                               gradient_checkpointing=ckpt, optim="adamw_torch", precision="bf16-mixed")
        mine = [(e[0], e[1].checkpointing) for e in replays if e[0] in ("replay", "replay forward")
                and e[1].seq == seq and e[1].batch == 2]
        assert mine == replayed
        assert type(est.values["step_trace_without_checkpointing"]) is (ForwardTrace if ckpt else StepTrace)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3-moe"])
def test_the_forward_of_a_whole_trace_is_the_forward_only_trace(model):
    spec = spec_of(model)
    assert step_trace.forward_of(step_trace.build_afresh(spec)) == step_trace.build_afresh(
        attrs.evolve(spec, forward_only=True))


def no_recording(spec):
    raise AssertionError(f"recorded again: {spec}")
