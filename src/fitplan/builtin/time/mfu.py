"""An MFU the user states or measured: ``--mfu`` and ``[[mfu_calibration]]`` rows.

When one applies, one step's compute is ``FLOPs / (peak × MFU)`` instead of the roofline: the user's own
measurement of this GPU (``fitplan validate --calibrate-out`` writes the rows) is worth more than a model.
The published pretraining ``[[mfu]]`` rows (``rulesets/mfu/``) are not used for fine-tuning time: they are
kept apart (docs/time-and-cost.md).
"""

from __future__ import annotations

from fitplan.builtin.time.calibration import most_specific
from fitplan.engine.declarations import quantity


def _calibration(rulesets, gpu_id, model, method):
    return rulesets.memo(("mfu_calibration", gpu_id, model, method),
                         lambda: most_specific(rulesets.mfu_calibrations, rulesets, gpu_id, model, method))


@quantity("fraction")
def mfu_calibrated(gpu_spec, rulesets, model, method):
    """An MFU measured on this GPU (``[[mfu_calibration]]``, written by ``fitplan validate --calibrate-out``):
    the row that also names this model and method wins over one that names only the GPU. None when none applies."""
    if gpu_spec is None:
        return None
    cal = _calibration(rulesets, gpu_spec.id, model or "", method)
    return None if cal is None else cal.mfu


@quantity("fraction", json_key="time.assumed_mfu")
def assumed_mfu(mfu, gpu_spec, rulesets, model, method):
    """The MFU a step's compute is priced at when one is given (``--mfu``) or measured on this GPU
    (``[[mfu_calibration]]``, as ``mfu_calibrated``); None otherwise: the roofline prices the step."""
    if mfu is not None or gpu_spec is None:
        return mfu
    cal = _calibration(rulesets, gpu_spec.id, model or "", method)
    return None if cal is None else cal.mfu


QUANTITIES = (mfu_calibrated, assumed_mfu)
