"""Presets that share a step trace (``trace/step_trace.py`` ``trace_precision``): the trace reads its preset only
through the weight dtype, the compute dtype and whether autocast casts between them, so ``bf16-master`` (DeepSpeed's
fp32 master weights live outside the step's ops) and ``bf16-autocast`` (autocast over weights already in bf16) take
``bf16-true``'s trace. Each merge is checked by building both traces afresh (no cache) and comparing every field,
the time model's kernels included."""

from __future__ import annotations

from pathlib import Path

import attrs

import pytest

from fitplan.trace import step_trace
from fitplan.trace.step_trace import TraceSpec, trace_precision
from fitplan.arch.architecture import load_config_json
from fitplan.inputs.precision import PRESETS

CONFIGS = Path(__file__).parent / "data" / "configs"
CONFIG = CONFIGS / "tiny-llama" / "config.json"
MERGED = sorted(p for p in PRESETS if trace_precision(p) != p)


# These tests check the recording ``build_sharing`` keeps for a twin, which a recording re-evaluated from a
# template does not keep (trace/reuse.py): no template from an earlier test.
pytestmark = pytest.mark.usefixtures("no_trace_templates")


def test_the_merged_presets_are_those_the_weights_and_compute_dtypes_say():
    # by hand from inputs/precision.py's table: same weight dtype, compute dtype and casting as an earlier preset
    assert {p: trace_precision(p) for p in MERGED} == {"bf16-master": "bf16-true", "16-master": "16-true",
                                                     "bf16-autocast": "bf16-true"}
    assert trace_precision("bf16-mixed") == "bf16-mixed" and trace_precision("16-mixed") == "16-mixed"


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gemma2", "tiny-qwen3-moe"])  # dense, soft-capped, MoE
@pytest.mark.parametrize("precision", MERGED)
@pytest.mark.parametrize(("method", "ckpt"), [("full", False), ("full", True), ("lora", True)])
def test_a_merged_preset_builds_the_same_trace(model, precision, method, ckpt):
    arch = load_config_json(CONFIGS / model / "config.json")
    targets = ("q_proj", "v_proj") if method == "lora" else ()

    def fresh(p: str):
        return step_trace.build_afresh(TraceSpec(arch, 3, 48, p, "sdpa", ckpt, method, 8, targets, 0.0, "cuda", 512))

    assert fresh(precision) == fresh(trace_precision(precision))


def test_the_comparison_tells_traces_apart():
    """The comparison above can fail: autocast over fp32 weights (``bf16-mixed``) keeps 16-bit weight copies and
    casts that ``bf16-true`` has not."""
    arch = load_config_json(CONFIG)
    a, b = (step_trace.build_afresh(TraceSpec(arch, 3, 48, p, "sdpa", False, "full", 8, (), 0.0, "cuda", 512))
            for p in ("bf16-true", "bf16-mixed"))
    assert a != b and b.autocast_copy_bytes > 0 == a.autocast_copy_bytes


# --------------------------------------------------------------------------- one recording, both checkpointing ways


SHARED = ["tiny-llama", "tiny-gemma2", "tiny-qwen3-moe", "tiny-gpt2", "tiny-phi3", "tiny-gpt-oss", "tiny-deepseek-v3"]


@pytest.mark.parametrize("model", SHARED)
@pytest.mark.parametrize(("precision", "attn", "device", "loss"), [
    ("bf16-mixed", "sdpa", "cuda", "hf"), ("32-true", "eager", "cpu", "chunked"), ("bf16-true", "sdpa", "cuda", "liger")])
@pytest.mark.parametrize("first", [False, True])
def test_one_recording_serves_both_checkpointing_ways(model, precision, attn, device, loss, first, monkeypatch):
    """``build_sharing`` records a full fine-tuning step once (with checkpointing on) and keeps the recording for
    the twin spec: both traces must equal those recorded separately by ``build_afresh`` (every field, the time
    model's kernels included), whichever of the two is asked for first."""
    arch = load_config_json(CONFIGS / model / "config.json")
    spec = TraceSpec(arch, 3, 48, precision, attn, first, "full", 8, (), 0.0, device, 512, loss=loss)
    twin = attrs.evolve(spec, checkpointing=not first)
    step_trace._RECORDINGS.clear()
    assert step_trace.build_sharing(spec) == step_trace.build_afresh(spec)
    assert list(step_trace._RECORDINGS) == [(twin, "")]  # kept for the twin, which then records nothing
    with monkeypatch.context() as m:
        m.setattr(step_trace, "record", no_recording)
        shared = step_trace.build_sharing(twin)
    assert shared == step_trace.build_afresh(twin) and step_trace._RECORDINGS == {}


@pytest.mark.parametrize(("frozen", "loss"), [(True, "hf"), (False, "trl_logp"), (False, "cce")])
def test_one_recording_serves_a_frozen_forward_and_the_trl_heads(frozen, loss):
    """The same for TRL's reference forward (nothing trains) and fused loss heads."""
    arch = load_config_json(CONFIG)
    spec = TraceSpec(arch, 2, 40, "bf16-mixed", "sdpa", False, "full", 8, (), 0.0, "cuda", 512, loss=loss,
                     frozen=frozen)
    step_trace._RECORDINGS.clear()
    assert step_trace.build_sharing(spec) == step_trace.build_afresh(spec)
    twin = attrs.evolve(spec, checkpointing=True)
    assert step_trace.build_sharing(twin) == step_trace.build_afresh(twin) and step_trace._RECORDINGS == {}


def test_the_checkpointed_and_plain_traces_differ_so_the_comparison_can_fail():
    arch = load_config_json(CONFIG)
    plain, ckpt = (step_trace.build_afresh(TraceSpec(arch, 3, 48, "bf16-mixed", "sdpa", c, "full", 8, (), 0.0, "cuda",
                                                     512)) for c in (False, True))
    assert ckpt.activation_bytes < plain.activation_bytes and ckpt.work != plain.work


def test_a_kept_recording_is_not_used_once_the_learned_file_is_loaded_again(monkeypatch):
    """``fitplan learn-architecture``'s verification relearns a file and clears ``archfile.load``: the twin's kept
    recording, made from the old file, is then recorded again."""
    from fitplan.arch import archfile

    arch = load_config_json(CONFIG)
    spec = TraceSpec(arch, 3, 48, "bf16-mixed", "sdpa", True, "full", 8, (), 0.0, "cuda", 512)
    step_trace._RECORDINGS.clear()
    step_trace.build_sharing(spec)
    archfile.load.cache_clear()
    calls = []
    real = step_trace.record
    monkeypatch.setattr(step_trace, "record", lambda s: calls.append(s.checkpointing) or real(s))
    twin = attrs.evolve(spec, checkpointing=False)
    assert step_trace.build_sharing(twin) == step_trace.build_afresh(twin) and calls[:1] == [True]


def test_lora_records_each_way_on_its_own():
    """Under LoRA, checkpointing changes the recording itself (peft's input-require-grads hook on the embedding's
    output): nothing is shared, and each trace is the one recorded for it."""
    arch = load_config_json(CONFIG)
    spec = TraceSpec(arch, 3, 48, "bf16-mixed", "sdpa", False, "lora", 8, ("q_proj", "v_proj"), 0.0, "cuda", 512)
    step_trace._RECORDINGS.clear()
    assert step_trace.build_sharing(spec) == step_trace.build_afresh(spec) and step_trace._RECORDINGS == {}
    ckpt = attrs.evolve(spec, checkpointing=True)
    assert step_trace.build_sharing(ckpt) == step_trace.build_afresh(ckpt)


def no_recording(spec):
    raise AssertionError(f"recorded again: {spec}")


# --------------------------------------------------------------------------- a parameter's gradient is its own


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true"])
def test_every_lora_adapter_has_a_gradient_of_its_own(precision):
    """A parameter's gradient is known by :attr:`~fitplan.trace.step_trace.T.key`, its ``id``: a LoRA adapter that
    nothing held once its call site was recorded left that ``id`` to a later site's adapter, whose gradient (and
    autocast copy) was then taken for the same one, depending on where Python allocated it (before the fix this test
    found 22 to 26 of tiny-llama's 28 QLoRA adapters, the count changing with what ran before). By hand: ``all-linear`` puts an adapter pair on the
    7 Linears of each of the 2 layers (28 parameters), r = 8, fp32 (peft's adapter dtype): q, k, v, o are 64 -> 64,
    ``r·(64 + 64)`` = 1,024 parameters each; gate and up 64 -> 176 and down 176 -> 64, ``r·(64 + 176)`` = 1,920 each;
    ``2 · (4·1,024 + 3·1,920) · 4`` bytes = 78,848 (what the referee measures as QLoRA's gradients)."""
    arch = load_config_json(CONFIG)
    spec = TraceSpec(arch, 2, 32, precision, "sdpa", False, "qlora", 8, ("all-linear",), 0.0, "cuda", 512)
    tr = step_trace.record(spec)
    trace = step_trace.finished(tr)
    assert len({key for op in tr.ops for key, *_ in op.params}) == 28
    assert trace.param_grad_bytes == 2 * (4 * 1024 + 3 * 1920) * 4 == 78_848


def test_the_garbage_collector_is_off_while_a_trace_is_built_and_as_it_was_after(monkeypatch):
    """``build`` records and replays with Python's cyclic collector off (``step_trace.gc_paused``); pauses nest
    (threads of ``fitplan serve``), and the collector ends as it was: on, or off when the caller had turned it off."""
    import gc

    seen = []
    monkeypatch.setattr(step_trace, "build_sharing", lambda spec, fingerprint="": seen.append(gc.isenabled()) or "t")
    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    was = gc.isenabled()
    try:
        gc.enable()
        step_trace.build.__wrapped__(TraceSpec(load_config_json(CONFIG), 5, 17, "bf16-true", "sdpa", False, "full", 8,
                                               (), 0.0, "cuda", 512))
        assert seen == [False] and gc.isenabled()
        with step_trace.gc_paused():
            with step_trace.gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()
        gc.disable()
        with step_trace.gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
