"""A tensor the prologue makes for every layer and the last layer frees (issue #32: the BART family's eager
activations).

The replay builds layer 0 alone and one copy of the layers after it, weighted by their count (trace/step_trace.py
``Replay``): what that copy leaves alive is added once per other copy. BART's decoder has no norm after its
layers, so the causal mask (a local of ``BartDecoder.forward``, transformers 5.24 models/bart/modeling_bart.py)
dies as the last layer returns: the learned layer frees it, once in the model, but the copy's delta carried that
free into every other copy (bart, marian, mvp, trocr: 10 × 3 × 21 × 21 × 4 = 52920 bytes of activations below the
referee's measurement; blenderbot-small with 8 layers, 6 × 5292 = 31752).

A hand-made trace: each layer saves its input (``n`` bytes) and reads the prologue's mask (``m`` bytes), and the
layer's last op holds the mask. Expected values by hand; the same trace with every layer its own segment (no
weighting) must agree. Control: with the free counted per copy (the code before this fix) the retained bytes were
``(w - 1) × m`` low and the forward peak ``(w - 1) × m`` low too, and both assertions failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitplan.arch.architecture import spec_from_config
from fitplan.trace.step_trace import Replay, Trace, TraceSpec

CONFIG = Path(__file__).parent / "data" / "configs" / "tiny-llama" / "config.json"
N, M, LOSS = 4 * 256, 4 * 100, 4
"""A layer's saved input (256 fp32 elements), the mask (100 fp32 elements), the loss scalar: bytes."""


def _trace(plan: list[int], ckpt: bool = False) -> Trace:
    """Prologue (the input ``h0``, the mask), the layers as ``plan`` groups them (a weight per segment), the
    loss. Each layer: ``h' = f(h, mask)`` saving ``h``, then a hold of the mask (the model's code still has it)."""
    arch = spec_from_config(json.loads(CONFIG.read_text()))
    tr = Trace(TraceSpec(arch, 1, 4, "32-true", "eager", ckpt, device="cpu"))
    h = tr.new(N // 4, "f32", True, "h0")
    mask = tr.new(M // 4, "f32", False, "mask")
    tr.emit("embedding", [], [h], [], [], [], False)
    tr.emit("where", [], [mask], [], [], [], False)
    for k, weight in enumerate(plan):
        tr.segment(f"layers {k}", weight)
        out = tr.new(N // 4, "f32", True, "h")
        tr.emit("add", [h, mask], [out], [h], [(h, -1)], [], True)
        tr.touch(mask)
        h = out
    tr.segment("epilogue")
    loss = tr.new(1, "f32", True, "loss")
    tr.emit("sum", [h], [loss], [h], [(h, -1)], [], True)
    tr.loss = loss
    tr.finish()
    return tr


@pytest.mark.parametrize("layers", [3, 5, 12])
def test_a_prologue_tensor_the_last_layer_frees_goes_once(layers):
    """``L`` layers save ``L`` inputs and the loss the last output: ``(L + 1) × n`` retained (the mask is saved by
    nothing). The forward's peak is the last layer's op: every layer output, the input and the mask alive:
    ``(L + 1) × n + m``; before the last layer ``L × n + m``; a layer after the first keeps ``n``."""
    weighted = Replay(_trace([1, layers - 1])).run()
    unrolled = Replay(_trace([1] * layers)).run()
    assert weighted.retained_bytes == unrolled.retained_bytes == (layers + 1) * N
    assert weighted.forward_peak_bytes == unrolled.forward_peak_bytes == (layers + 1) * N + M
    assert weighted.forward_before_last_layer_bytes == unrolled.forward_before_last_layer_bytes == layers * N + M
    assert weighted.layer_bytes == N  # (unrolled, the last layer's own delta: its input kept, the mask freed)
    assert weighted.forward_peak_parts == unrolled.forward_peak_parts
    assert max(a for a, _, _ in weighted.backward_points) == max(a for a, _, _ in unrolled.backward_points)
