"""fitplan-torch: the referee that runs a fine-tuning step in PyTorch and compares it with fitplan's estimate.

Importing this package never imports torch; everything that needs torch imports it inside functions,
so fitplan keeps working (and ``fitplan validate`` explains what to install) when torch is missing.

Python API::

    import fitplan, fitplan_torch
    est = fitplan.estimate(model="tests/data/configs/tiny-llama/config.json", precision="bf16-true",
                           per_device_train_batch_size=2, max_seq_length=64)
    report = fitplan_torch.validate(est, mode="cpu")
    report["components"]["peak"]   # {"predicted": ..., "measured": ..., "relative_error": ...}
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["FitplanCallback", "validate", "__version__"]


def validate(estimate, *, mode: str = "auto", steps: int = 1, calibrate_out: str | None = None, **options: Any) -> dict[str, Any]:
    """Run ``estimate.scenario`` for real (or under FakeTensorMode) and compare with ``estimate``.

    :param estimate: a :class:`fitplan.Estimate`.
    :param mode: ``auto``, ``cpu``, ``fake`` or ``cuda``.
    :param steps: measured steps after one warm-up step.
    :param calibrate_out: on CUDA, write the measured framework overhead to this TOML file.
    :returns: the report (see :func:`fitplan_torch.plugin.fitplan_validate`).
    """
    from .runner import run_validation

    return run_validation(estimate.scenario, estimate, {"mode": mode, "steps": steps, "calibrate_out": calibrate_out, **options})


def __getattr__(name: str):
    if name == "FitplanCallback":
        from .callback import FitplanCallback

        return FitplanCallback
    raise AttributeError(name)
