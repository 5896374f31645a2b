"""A measured run of the user's own: ``[[time_calibration]]`` rows, written by ``fitplan calibrate``.

A row holds ``scale`` = the measured step time / the time model's step time for the run it was measured on.
Later estimates on the same GPU multiply their step time by it (``step_seconds``); a row that also names
the model and the method wins over one that names only the GPU. The estimate says so (``throughput_basis``).
"""

from __future__ import annotations

import json
import math

from fitplan.engine.declarations import quantity
from fitplan.errors import FitplanError


def most_specific(table: dict, rulesets, gpu_id: str, model: str, method: str):
    """The row of ``table`` (keyed ``(gpu, model, method)``, "" = any model / method) that applies to this GPU (named
    by its id or an alias), model and method, the most specific one (naming the model and the method wins), or None."""
    best = None
    for (gpu, m, meth), row in table.items():
        if gpu != gpu_id:
            try:
                gpu = rulesets.gpu(gpu).id
            except FitplanError:
                continue
        if gpu != gpu_id or (m and m != model) or (meth and meth != method):
            continue
        score = bool(m) + bool(meth)
        if best is None or score > best[0]:
            best = (score, row)
    return None if best is None else best[1]


def find_calibration(rulesets, gpu_id: str, model: str, method: str):
    """The most specific ``[[time_calibration]]`` row for this GPU, model and method, or None."""
    return rulesets.memo(("time_calibration", gpu_id, model, method),
                         lambda: most_specific(rulesets.time_calibrations, rulesets, gpu_id, model, method))


@quantity("row", type="object")
def step_time_calibration(gpu_spec, rulesets, model, method):
    """The ``[[time_calibration]]`` row that applies to this GPU, model and method (the most specific), or None."""
    if gpu_spec is None:
        return None
    return find_calibration(rulesets, gpu_spec.id, model or "", method)



def calibration_row(est, measurement, date: str) -> dict:
    """The ``[[time_calibration]]`` row for a measured run: the run's scenario is ``est`` (evaluated without
    this calibration's effect: an earlier calibration that applies is divided out) and ``measurement`` what its
    log says (:class:`fitplan.inputs.runlogs.RunMeasurement`). ``scale`` = measured step time / the model's
    = the model's tokens/s / the measured. :raises FitplanError: when the estimate has no time model to compare."""
    v = est.values
    s = est.scenario
    if v["gpu_spec"] is None:
        raise FitplanError("fitplan calibrate needs the GPU the run used", field="--gpu", suggestion="add --gpu ID")
    if v["step_seconds"] is None or v["assumed_mfu"] or v["tokens_per_second"] is not None \
            or v["measured_tokens_per_second"] is not None:
        raise FitplanError("fitplan calibrate compares the run with the time model: drop --tokens-per-second, "
                           "--throughput-source and --mfu (and any [[mfu_calibration]] for this GPU)",
                           field="--tokens-per-second")
    batch = s.training.per_device_train_batch_size
    if measurement.per_device_batch and measurement.per_device_batch != batch:
        raise FitplanError(f"the log's train_batch_size ({measurement.per_device_batch}) is not the scenario's "
                           f"per-device micro-batch ({batch})", field="--per-device-train-batch-size", value=batch,
                           suggestion=f"describe the run as it ran: --per-device-train-batch-size {measurement.per_device_batch}")
    world = v["world_size"]
    current = v["step_time_calibration"]
    predicted_step = v["step_seconds"] / (current.scale if current is not None else 1.0)
    predicted = v["tokens_per_step"] / predicted_step / world
    if measurement.seconds_per_step is not None:
        measured = v["tokens_per_step"] / measurement.seconds_per_step / world
    elif measurement.tokens_per_second is not None:
        measured = measurement.tokens_per_second / world
    else:
        measured = measurement.tokens_per_second_per_gpu
    if not (math.isfinite(measured) and measured > 0 and math.isfinite(predicted / measured) and predicted / measured > 0):
        raise FitplanError(f"the log gives {measured!r} tokens per second per GPU, which makes no calibration "
                           f"(the model gives {predicted:,.0f})", field="RUN_LOG", value=measured,
                           suggestion="check the log's runtime, steps and tokens")
    return {"gpu": v["gpu_spec"].id, "model": s.model.model or "", "method": s.model.method, "scale": predicted / measured,
            "measured_tokens_per_second_per_gpu": measured, "predicted_tokens_per_second_per_gpu": predicted,
            "source": f"fitplan calibrate: {measurement.basis} ({measurement.kind}); {world} GPU(s), micro-batch {batch} × "
                      f"{s.training.max_seq_length} tokens × {s.training.gradient_accumulation_steps} accumulation steps",
            "date": date}


def calibration_toml(row: dict) -> str:
    """The row as a ruleset file (load it with ``--ruleset-dir``)."""
    lines = ["# Written by `fitplan calibrate`: a measured run's step time over the time model's. Later estimates on",
             "# this GPU (and this model and method) multiply their step time by `scale` when this file's directory",
             "# is given with --ruleset-dir (docs/time-and-cost.md, \"Calibrating on your own runs\").", "",
             "[[time_calibration]]"]
    for key, value in row.items():
        lines.append(f"{key} = {json.dumps(value) if isinstance(value, str) else repr(float(value))}")
    return "\n".join(lines) + "\n"


QUANTITIES = (step_time_calibration,)
