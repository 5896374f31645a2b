"""A training run's measured speed, read from its own logs (``fitplan calibrate``).

* **HF Trainer** ``trainer_state.json`` (the run's final log entry: ``train_runtime``, ``step``; with
  ``include_num_input_tokens_seen`` also ``num_input_tokens_seen``, the tokens of every process, padding
  included unless it was ``"non_padding"``) or ``train_results.json`` (``train_runtime``,
  ``train_steps_per_second``): transformers ``Trainer._inner_training_loop`` / ``speed_metrics``.
* **torchtune** ``log_*.txt`` of its ``DiskLogger`` (``Step N | loss:… tokens_per_second_per_gpu:…`` per
  line; torchtune 0.6 ``recipes/*_finetune_*.py``): the median over the logged steps after the first (the
  first includes compilation and warm-up).
* **litgpt** ``metrics.csv`` of its CSV logger (lightning's ``ThroughputMonitor``: ``device/items_per_sec``,
  tokens per second per device over the last 50 iterations, padding included): the last value.

The HF files count optimizer steps or tokens of the whole run; torchtune and litgpt report tokens per
second per GPU. ``train_runtime`` covers the whole ``trainer.train()`` call (evaluation and checkpoint saving
included when the run did them).
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from pathlib import Path
from typing import Any

from attrs import frozen

from fitplan.errors import FitplanError
from fitplan.inputs import files


@frozen
class RunMeasurement:
    """What a run's log says about its speed (one of the first three is set)."""

    kind: str
    """``hf_trainer``, ``torchtune`` or ``litgpt``."""
    basis: str
    """What was read, in words (for the calibration row's ``source``)."""
    tokens_per_second: float | None = None
    """Tokens per second of the whole run, all GPUs."""
    tokens_per_second_per_gpu: float | None = None
    seconds_per_step: float | None = None
    """Seconds per optimizer step (the tokens per step come from the scenario)."""
    per_device_batch: int | None = None
    """The per-device micro-batch the log records, to check against the scenario."""


def read_run_log(path: str | Path) -> RunMeasurement:
    """Read a run's measured speed from ``path`` (see the module doc). :raises FitplanError: naming the file."""
    p = Path(path)
    text = files.read_text(p, field="RUN_LOG")
    if p.suffix == ".json":
        return _hf(files.loads_json(text, file=str(p), field="RUN_LOG"), p)
    if p.suffix == ".csv":
        return _litgpt(text, p)
    return _torchtune(text, p)


def _number(value: Any, p: Path, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise FitplanError(f"{field} must be a number > 0, got {value!r}", file=str(p), field=field, value=value)
    return float(value)


def _ratio(a: float, b: float, p: Path, field: str) -> float:
    """``a / b`` of two logged numbers, which must be a finite number > 0 (a run of 1e-300 s is no run)."""
    value = a / b
    if not (math.isfinite(value) and value > 0):
        raise FitplanError(f"{field} gives {value!r}, not a speed: the logged numbers are out of range",
                           file=str(p), field=field, value=value)
    return value


def _hf(data: Any, p: Path) -> RunMeasurement:
    if not isinstance(data, dict):
        raise FitplanError("expected a JSON object (trainer_state.json or train_results.json)", file=str(p))
    batch = data.get("train_batch_size")
    if batch is not None and (type(batch) is not int or not 0 < batch <= 2**20):
        raise FitplanError(f"train_batch_size must be an integer from 1 to 2^20, got {batch!r:.60}", file=str(p),
                           field="train_batch_size", value=batch)
    if "log_history" in data:  # trainer_state.json
        if not isinstance(data["log_history"], list):
            raise FitplanError(f"log_history must be a list of log entries, got {type(data['log_history']).__name__}",
                               file=str(p), field="log_history")
        final = [e for e in data["log_history"] if isinstance(e, dict) and "train_runtime" in e]
        if not final:
            raise FitplanError("no final training entry (with train_runtime) in log_history: did the run finish?",
                               file=str(p), field="log_history",
                               suggestion="use the trainer_state.json written at the end of training")
        entry = final[-1]
        runtime = _number(entry["train_runtime"], p, "log_history[].train_runtime")
        tokens = entry.get("num_input_tokens_seen", data.get("num_input_tokens_seen"))
        if tokens:
            tokens = _number(tokens, p, "num_input_tokens_seen")
            return RunMeasurement("hf_trainer", f"{p.name}: {tokens:,.0f} input tokens in train_runtime {runtime:,.1f} s",
                                  tokens_per_second=_ratio(tokens, runtime, p, "num_input_tokens_seen / train_runtime"), per_device_batch=batch)
        steps = _number(entry.get("step", data.get("global_step")), p, "log_history[].step")
        return RunMeasurement("hf_trainer", f"{p.name}: {steps:,.0f} optimizer steps in train_runtime {runtime:,.1f} s",
                              seconds_per_step=_ratio(runtime, steps, p, "train_runtime / step"), per_device_batch=batch)
    if "train_runtime" in data:  # train_results.json / all_results.json
        if "train_steps_per_second" not in data:
            raise FitplanError("train_results.json without train_steps_per_second: no step count to measure",
                               file=str(p), field="train_steps_per_second", suggestion="use trainer_state.json")
        sps = _number(data["train_steps_per_second"], p, "train_steps_per_second")
        runtime = _number(data["train_runtime"], p, "train_runtime")
        return RunMeasurement("hf_trainer", f"{p.name}: train_steps_per_second {sps:g} (train_runtime "
                              f"{runtime:,.1f} s)", seconds_per_step=_ratio(1, sps, p, "train_steps_per_second"))
    raise FitplanError("not an HF Trainer file: neither log_history (trainer_state.json) nor train_runtime "
                       "(train_results.json)", file=str(p))


def _float(text: str, p: Path, field: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise FitplanError(f"{field} is not a number: {text!r}", file=str(p), field=field, value=text) from None
    return _number(value, p, field)


_TORCHTUNE = re.compile(r"^Step (\d+) \| (.*)$")


def _torchtune(text: str, p: Path) -> RunMeasurement:
    values = []
    for line in text.splitlines():
        m = _TORCHTUNE.match(line.strip())
        if not m:
            continue
        fields = dict(kv.split(":", 1) for kv in m.group(2).split() if ":" in kv)
        if "tokens_per_second_per_gpu" in fields:
            values.append(_float(fields["tokens_per_second_per_gpu"], p, "tokens_per_second_per_gpu"))
    if not values:
        raise FitplanError("no 'Step N | ... tokens_per_second_per_gpu:X' lines: not a torchtune DiskLogger log",
                           file=str(p), suggestion="pass the log_*.txt torchtune wrote, a trainer_state.json or a "
                                                   "litgpt metrics.csv")
    steady = values[1:] or values
    return RunMeasurement("torchtune", f"{p.name}: median tokens_per_second_per_gpu of {len(steady)} logged step(s)"
                          + (" after the first" if len(values) > 1 else ""),
                          tokens_per_second_per_gpu=statistics.median(steady))


def _litgpt(text: str, p: Path) -> RunMeasurement:
    rows = list(csv.DictReader(text.splitlines()))
    col = next((c for c in (rows[0].keys() if rows else ()) if c and c.endswith("device/items_per_sec")), None)
    found = [_float(r[col], p, col) for r in rows if r.get(col)] if col else []
    if not found:
        raise FitplanError("no device/items_per_sec column with values: not a litgpt metrics.csv", file=str(p))
    return RunMeasurement("litgpt", f"{p.name}: last {col} (tokens per second per device, window of 50 iterations)",
                          tokens_per_second_per_gpu=found[-1])
