"""A recorded trace tells its parameters apart: an op records a parameter by its tensor's ``id``
(``step_trace.T.key``), so the trace keeps every parameter tensor it made (``Trace.param``); a LoRA adapter made
inside a call site's function and let go would hand its id to the next site's adapter, and the two would share
one gradient (its bytes counted once, at the wrong op)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from fitplan.arch.architecture import load_config_json
from fitplan.trace import step_trace
from fitplan.trace.step_trace import TraceSpec

CONFIG = Path(__file__).parent / "data" / "configs" / "tiny-llama" / "config.json"


def test_every_lora_adapter_has_its_own_gradient():
    # tiny-llama (hidden 64, intermediate 176, 2 layers), peft's all-linear targets (every Linear but lm_head),
    # r = 8: q/k/v/o 64->64 take 8*64 + 64*8 = 1024 adapter parameters each, gate/up 64->176 and down 176->64
    # take 8*64 + 176*8 = 1920 each: 4*1024 + 3*1920 = 9856 a layer, 19,712 in all; fp32 adapters (peft's
    # autocast_adapter_dtype under bf16-mixed), 4 bytes each
    arch = load_config_json(CONFIG)
    spec = TraceSpec(arch, 2, 32, "bf16-mixed", "sdpa", False, "lora", 8, ("all-linear",), 0.0, "cuda", 512)
    trace = step_trace.build_afresh(spec)
    assert trace.param_grad_bytes == 19_712 * 4


def test_the_parameter_tensors_outlive_the_recording(monkeypatch):
    """Whether two adapters meet at one id depends on the allocator's state (the first test can pass by luck: an
    estimate's llama-3.2-1b QLoRA trace after other traces lost 2 MB of adapter gradients this way); that every
    parameter tensor is alive when the recording ends does not."""
    raw = step_trace.Trace.__dict__["param"]
    made = []

    def spy(self, *args):
        t = raw.__get__(self, step_trace.Trace)(*args)
        made.append(weakref.ref(t))
        return t

    monkeypatch.setattr(step_trace.Trace, "param", spy)
    arch = load_config_json(CONFIG)
    spec = TraceSpec(arch, 2, 32, "bf16-mixed", "sdpa", False, "lora", 8, ("all-linear",), 0.0, "cuda", 512)
    tr = step_trace.record(spec)
    gc.collect()
    assert len(made) >= 2 * 7 * 2  # A and B of 7 Linears in 2 layers, and the base weights
    assert [r for r in made if r() is None] == []
    del tr
