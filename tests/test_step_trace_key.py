"""Presets that share a step trace (``trace/step_trace.py`` ``trace_precision``): the trace reads its preset only
through the weight dtype, the compute dtype and whether autocast casts between them, so ``bf16-master`` (DeepSpeed's
fp32 master weights live outside the step's ops) and ``bf16-autocast`` (autocast over weights already in bf16) take
``bf16-true``'s trace. Each merge is checked by building both traces afresh (no cache) and comparing every field,
the time model's kernels included."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitplan.trace import step_trace
from fitplan.trace.step_trace import TraceSpec, trace_precision
from fitplan.arch.architecture import load_config_json
from fitplan.inputs.precision import PRESETS

CONFIGS = Path(__file__).parent / "data" / "configs"
CONFIG = CONFIGS / "tiny-llama" / "config.json"
MERGED = sorted(p for p in PRESETS if trace_precision(p) != p)


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
