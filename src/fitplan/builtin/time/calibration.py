"""A measured run of the user's own: ``[[time_calibration]]`` rows, written by ``fitplan calibrate``.

A row holds ``scale`` = the measured step time / the time model's step time for the run it was measured on.
Later estimates on the same GPU multiply their step time by it (``step_seconds``); a row that also names
the model and the method wins over one that names only the GPU. The estimate says so (``throughput_basis``).
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity
from fitplan.errors import FitplanError


def find_calibration(rulesets, gpu_id: str, model: str, method: str):
    """The most specific ``[[time_calibration]]`` row for this GPU (by id or alias), model and method, or None."""
    def find():
        best = None
        for (gpu, m, meth), cal in rulesets.time_calibrations.items():
            if gpu != gpu_id:
                try:
                    gpu = rulesets.gpu(gpu).id
                except FitplanError:
                    continue
            if gpu != gpu_id or (m and m != model) or (meth and meth != method):
                continue
            score = bool(m) + bool(meth)
            if best is None or score > best[0]:
                best = (score, cal)
        return None if best is None else best[1]

    return rulesets.memo(("time_calibration", gpu_id, model, method), find)


@quantity("row", type="object")
def time_calibration(gpu_spec, rulesets, model, method):
    """The ``[[time_calibration]]`` row that applies to this GPU, model and method (the most specific), or None."""
    if gpu_spec is None:
        return None
    return find_calibration(rulesets, gpu_spec.id, model or "", method)


QUANTITIES = (time_calibration,)
