"""One training step, instrumented: forward, ``loss.backward()``, ``optimizer.step()``,
``zero_grad(set_to_none=True)``, as the HF Trainer runs it (the model output is dropped right after
the loss is taken, so only what autograd saved outlives the forward).

A warm-up step first creates the optimizer states; the measured step then starts from the steady state
fitplan models: weights, buffers, optimizer states and the batch are live, gradients are not.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from . import _deps
from .build import autocast
from .loss_heads import loss_of
from .measure import LiveBytes, SavedTensors, optimizer_state_tensors, storage_bytes, storages


@attrs.define
class StepMeasurement:
    """What one measured step allocated (bytes, per rank)."""

    parameters: int
    buffers: int
    gradients: int
    optimizer_states: int
    inputs: int
    saved_tensors: int
    """Unique storages autograd saved outside checkpointed regions (saved_tensors_hooks), parameters excluded."""
    retained: int
    """Bytes the forward left alive for backward: live bytes at the start of backward minus live bytes before
    the forward, minus the loss scalar and any FSDP all-gathered parameters. Equals ``saved_tensors`` without
    checkpointing; with checkpointing it also holds the layer inputs checkpoint keeps."""
    peak: int
    peak_phase: str
    phase_peaks: dict[str, int]
    start: int
    """Live bytes when the step starts (parameters + buffers + optimizer states + batch)."""
    step_seconds: float
    gathered_params: int = 0
    """FSDP: bytes of all-gathered parameters still alive when backward starts (not counted in ``retained``)."""
    loss: float | None = None
    memtracker_peak: int | None = None
    memtracker_breakdown: dict[str, int] | None = None
    memtracker_error: str | None = None
    cuda: dict[str, Any] | None = None
    step_peaks: list[int] = attrs.field(factory=list)
    """The peak of every optimizer step, the first (warm-up) step included when a shared counter saw it (0 if not)."""
    peak_step: int = 0
    """Which optimizer step (1 = the first) holds ``peak``: the highest of ``step_peaks``."""

    def asdict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _params_and_buffers(model):
    """Parameters (with bitsandbytes' 4-bit quantization state, which lives beside them) and buffers."""
    from .qlora import quant_state_tensors

    return list(model.parameters()) + quant_state_tensors(model), list(model.buffers())


def train_step(model, optimizer, batch, *, precision: str, device_type: str, counter=None, saved=None,
               grads_out: list | None = None, start_params: set[int] | None = None,
               gathered_bytes: list | None = None, accumulation: int = 1, gathered_fn=None,
               loss_implementation: str = "hf") -> Any:
    """One optimizer step over ``accumulation`` micro-batches; ``counter`` (a LiveBytes) gets phase marks,
    ``saved`` wraps each forward.

    Returns the detached loss and the bytes the last forward left alive (per ``counter``: live bytes after
    the forward minus before it, FSDP's gathered parameters excluded; None without a counter). ``gathered_fn``:
    the bytes of gathered parameters alive after the forward, for wrappers whose ``parameters()`` do not show
    them (FSDP1's flat buffers); by default, the parameter storages that did not exist when the step began.
    ``loss_implementation``: how the loss head runs (:mod:`.loss_heads`).
    """
    mark = counter.set_phase if counter is not None else (lambda p: None)
    retained = None
    value = None
    for _ in range(max(1, accumulation)):
        mark("forward")
        before = counter.current if counter is not None else 0
        ctx_saved = saved if saved is not None else _Null()
        with ctx_saved, autocast(precision, device_type):
            loss = loss_of(model, batch, loss_implementation)
        if counter is not None:
            retained = counter.current - before
            if gathered_fn is not None:
                g = int(gathered_fn())
                retained -= g
                if gathered_bytes is not None:
                    gathered_bytes[0] = g
            elif start_params is not None:
                # FSDP keeps all-gathered parameters from forward to backward (reshard_after_forward=False, or
                # the root module): parameter memory, not activations
                gathered = [st for k, st in storages(model.parameters()).items() if k not in start_params]
                retained -= sum(st.nbytes() for st in gathered)
                if gathered_bytes is not None:
                    gathered_bytes[0] = sum(st.nbytes() for st in gathered)
        mark("backward")
        loss.backward()
        value = loss.detach()
        del loss
    if grads_out is not None:
        grads_out.append(storage_bytes(p.grad for p in model.parameters() if p.grad is not None))
    mark("optimizer_step")
    optimizer.step()
    mark("zero_grad")
    optimizer.zero_grad(set_to_none=True)
    mark("end")
    return value, retained


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def measure_step(model, optimizer, batch, *, precision: str, device_type: str, steps: int = 1,
                 warmup: int = 1, memtracker: bool = True, counter=None, barrier=None,
                 accumulation: int = 1, gathered_fn=None, loss_implementation: str = "hf") -> StepMeasurement:
    """Warm up, then measure ``steps`` steps: the categories are the last step's, ``peak`` (with its phase and
    the phase peaks) the highest step's, ``peak_step`` which step that is and ``step_peaks`` every step's peak.

    ``counter``: a :class:`LiveBytes` the caller entered before building anything (sharded runs: it
    then also sees DDP's buckets and FSDP's buffers); by default a fresh counter per measured step,
    seeded with the parameters, buffers, optimizer states and batch. ``barrier``: called between steps
    (distributed runs keep ranks in step).
    """
    torch = _deps.torch()
    cuda = device_type == "cuda"
    step_peaks: list[int] = []
    first: list[tuple[int, str, dict[str, int]]] = []
    for _ in range(warmup):
        if counter is not None:  # a shared counter sees the first step too (its optimizer states appear in it)
            counter.set_phase("setup")
            counter.reset_peak()
        train_step(model, optimizer, batch, precision=precision, device_type=device_type, accumulation=accumulation,
                   loss_implementation=loss_implementation, counter=counter)
        if counter is not None:
            first.append((counter.peak, counter.peak_phase, {k: v for k, v in counter.phase_peaks.items() if k != "setup"}))
        step_peaks.append(counter.peak if counter is not None else 0)
    timed = None
    if cuda:  # throughput from a step without the instruments (the dispatch mode costs Python time per op)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_step(model, optimizer, batch, precision=precision, device_type=device_type, accumulation=accumulation)
        torch.cuda.synchronize()
        timed = time.perf_counter() - t0
    params, buffers = _params_and_buffers(model)
    states = optimizer_state_tensors(optimizer)
    m: StepMeasurement | None = None
    highest: StepMeasurement | None = None
    for _ in range(max(1, steps)):
        if barrier is not None:
            barrier()
        own = counter is None
        c = LiveBytes() if own else counter
        c.track([*params, *buffers, *states, *batch.values()])
        c.set_phase("setup")
        c.reset_peak()
        start = c.current
        saved = SavedTensors(exclude=[*params, *buffers])
        grads: list[int] = []
        gathered = [0]
        start_params = set(storages(params))
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            cuda_start = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        with c if own else _Null():
            value, retained = train_step(model, optimizer, batch, precision=precision, device_type=device_type,
                                         counter=c, saved=saved, grads_out=grads, start_params=start_params,
                                         gathered_bytes=gathered, accumulation=accumulation, gathered_fn=gathered_fn,
                                         loss_implementation=loss_implementation)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        loss_bytes = value.numel() * value.element_size()
        peaks = dict(c.phase_peaks)
        peaks.pop("setup", None)
        m = StepMeasurement(
            parameters=storage_bytes(params), buffers=storage_bytes(buffers), gradients=grads[0] if grads else 0,
            optimizer_states=storage_bytes(optimizer_state_tensors(optimizer)),
            inputs=storage_bytes(batch.values()), saved_tensors=saved.bytes_at_exit,
            retained=retained - loss_bytes, peak=c.peak, peak_phase=c.peak_phase,
            phase_peaks=peaks, start=start, step_seconds=dt,
            loss=None if _is_fake(value) else float(value), gathered_params=gathered[0],
        )
        if cuda:
            m.cuda = {"max_memory_allocated": torch.cuda.max_memory_allocated(),
                      "max_memory_reserved": torch.cuda.max_memory_reserved(),
                      "memory_allocated_at_start": cuda_start, "uninstrumented_step_seconds": timed}
        step_peaks.append(m.peak)
        if highest is None or m.peak > highest.peak:
            highest = m
    m.peak, m.peak_phase, m.phase_peaks = highest.peak, highest.peak_phase, highest.phase_peaks
    for peak, phase, phases in first:
        if peak > m.peak:
            m.peak, m.peak_phase, m.phase_peaks = peak, phase, phases
    m.step_peaks = step_peaks
    m.peak_step = step_peaks.index(m.peak) + 1
    if memtracker:
        m.memtracker_peak, m.memtracker_breakdown, m.memtracker_error = memtracker_step(
            model, optimizer, batch, precision=precision, device_type=device_type, accumulation=accumulation,
            loss_implementation=loss_implementation)
    return m


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def memtracker_step(model, optimizer, batch, *, precision: str, device_type: str, accumulation: int = 1,
                    loss_implementation: str = "hf"):
    """The same step under ``torch.distributed._tools.mem_tracker.MemTracker``: its peak, the
    per-category snapshot at the peak (Parameter, Buffer, Gradient, Activation, Temp, Optstate, Other),
    and why it could not run (torch 2.13's MemTracker registers a gradient hook on every parameter of
    the modules it sees, which fails for frozen parameters: LoRA's base model)."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as e:
        return None, None, f"MemTracker unavailable: {e}"
    if any(not p.requires_grad for p in model.parameters()):
        return None, None, "MemTracker cannot track frozen parameters (hooks on tensors that do not require grad)"
    mt = MemTracker()
    mt.track_external(model, optimizer, *batch.values())
    try:
        with mt:
            train_step(model, optimizer, batch, precision=precision, device_type=device_type, accumulation=accumulation,
                       loss_implementation=loss_implementation)
    except Exception as e:  # noqa: BLE001 - the cross-check is optional; the primary counter already ran
        return None, None, f"MemTracker failed: {type(e).__name__}: {e}"
    peak = mt.get_tracker_snapshot("peak")
    if not peak:
        return None, None, "MemTracker recorded nothing"
    dev, snap = max(peak.items(), key=lambda kv: kv[1].get("Total", 0))
    breakdown = {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
    return int(breakdown.get("Total", 0)), breakdown, None
