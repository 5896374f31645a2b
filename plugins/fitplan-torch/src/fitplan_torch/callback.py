"""``FitplanCallback``: predicted vs measured peak memory and throughput during a real HF Trainer run.

::

    est = fitplan.estimate(model="config.json", precision="bf16-mixed", per_device_train_batch_size=8, max_seq_length=1024)
    trainer = Trainer(..., callbacks=[fitplan_torch.FitplanCallback(est)])
    trainer.train()
    trainer.callback_handler.callbacks[-1].summary()   # or keep a reference to the callback

Per optimizer step it records the measured peak (CUDA: ``torch.cuda.max_memory_allocated`` since the step
began; CPU: a live-storage counter, a ``TorchDispatchMode`` active from ``on_train_begin`` to
``on_train_end``), the step time and tokens/s (the scenario's ``b × s × accumulation × GPUs`` tokens per
optimizer step), and adds ``fitplan/*`` keys to the Trainer's logs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from . import _deps

log = logging.getLogger("fitplan_torch")


def _trainer_callback_base():
    return _deps.transformers().TrainerCallback


class _FitplanCallbackImpl:
    def _setup(self, estimate=None, *, measure_cpu: bool = True, **estimate_fields: Any) -> None:
        if estimate is None:
            from fitplan.api import estimate as estimate_of

            estimate = estimate_of(**estimate_fields)
        self.estimate = estimate
        self.measure_cpu = measure_cpu
        self.history: list[dict[str, Any]] = []
        self._counter = None
        self._t0 = None
        self._cuda = False
        s = estimate.scenario
        self.tokens_per_step = (s.training.per_device_train_batch_size * s.training.max_seq_length
                                * s.training.gradient_accumulation_steps * int(estimate["world_size"]))

    @property
    def predicted_peak(self) -> int:
        return int(self.estimate["peak_bytes"])

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        torch = _deps.torch()
        self._cuda = model is not None and next(model.parameters()).is_cuda
        if not self._cuda and self.measure_cpu:
            from .measure import LiveBytes, optimizer_state_tensors

            self._counter = LiveBytes()
            tensors = [*model.parameters(), *model.buffers()] if model is not None else []
            if optimizer is not None:
                tensors += optimizer_state_tensors(optimizer)
            self._counter.track(tensors)
            self._counter.__enter__()
        elif self._cuda:
            torch.cuda.reset_peak_memory_stats()

    def on_step_begin(self, args, state, control, **kwargs):
        torch = _deps.torch()
        if self._cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        elif self._counter is not None:
            self._counter.reset_peak()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        torch = _deps.torch()
        if self._t0 is None:
            return
        if self._cuda:
            torch.cuda.synchronize()
            measured = int(torch.cuda.max_memory_allocated())
        elif self._counter is not None:
            measured = int(self._counter.peak)
        else:
            measured = None
        dt = time.perf_counter() - self._t0
        predicted = self.predicted_peak
        row = {
            "step": int(state.global_step),
            "peak_predicted_bytes": predicted,
            "peak_measured_bytes": measured,
            "peak_relative_error": (predicted - measured) / measured if measured else None,
            "step_seconds": dt,
            "tokens_per_second": self.tokens_per_step / dt if dt > 0 else None,
        }
        self.history.append(row)
        log.info("fitplan step %d: peak predicted %s, measured %s bytes; %.1f tokens/s", row["step"], predicted, measured,
                 row["tokens_per_second"] or 0)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and self.history:
            last = self.history[-1]
            logs["fitplan/peak_predicted_bytes"] = last["peak_predicted_bytes"]
            logs["fitplan/peak_measured_bytes"] = last["peak_measured_bytes"]
            logs["fitplan/peak_relative_error"] = last["peak_relative_error"]
            logs["fitplan/tokens_per_second"] = last["tokens_per_second"]

    def on_train_end(self, args, state, control, **kwargs):
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None

    def summary(self) -> dict[str, Any]:
        """Worst step: the largest measured peak, and the median throughput."""
        rows = [r for r in self.history if r["peak_measured_bytes"] is not None]
        if not rows:
            return {"steps": len(self.history)}
        worst = max(rows, key=lambda r: r["peak_measured_bytes"])
        tps = sorted(r["tokens_per_second"] for r in self.history if r["tokens_per_second"])
        return {"steps": len(self.history), "peak_predicted_bytes": self.predicted_peak,
                "peak_measured_bytes": worst["peak_measured_bytes"], "peak_relative_error": worst["peak_relative_error"],
                "median_tokens_per_second": tps[len(tps) // 2] if tps else None}


_CLASS: list[type] = []


def _make_class() -> type:
    if not _CLASS:
        base = _trainer_callback_base()

        class FitplanCallback(_FitplanCallbackImpl, base):  # type: ignore[misc, valid-type]
            """A transformers ``TrainerCallback`` logging fitplan's predicted vs the measured peak memory and
            tokens/s per optimizer step. Pass an :class:`fitplan.Estimate`, or ``fitplan.estimate`` keyword
            arguments. ``measure_cpu=False`` skips the CPU live-storage counter (it slows big CPU runs)."""

            def __init__(self, estimate=None, *, measure_cpu: bool = True, **estimate_fields: Any) -> None:
                self._setup(estimate, measure_cpu=measure_cpu, **estimate_fields)

        FitplanCallback.__module__ = __name__
        _CLASS.append(FitplanCallback)
    return _CLASS[0]


def __getattr__(name: str):
    if name == "FitplanCallback":
        return _make_class()
    raise AttributeError(name)
