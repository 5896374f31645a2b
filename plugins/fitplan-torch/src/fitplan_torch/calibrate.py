"""Calibrating fitplan's ``[framework]`` ruleset from a real CUDA run (``--calibrate-out FILE.toml``).

What is measured (after the measured step, on the scenario's device):

* ``cuda_context_bytes``: what the driver reports in use for this process beyond PyTorch's caching
  allocator, ``(total − free) − memory_reserved``: the CUDA context with cuBLAS/cuDNN kernels loaded.
  (The device must be otherwise idle: other processes' memory would be counted.)
* ``cublas_workspace_bytes``: the bytes ``torch._C._cuda_clearCublasWorkspaces()`` releases (cuBLAS
  workspaces are allocated through the caching allocator, one per handle/stream).
* ``allocator_reserve_ratio``: ``max_memory_reserved / max_memory_allocated`` over the step: the caching
  allocator's fragmentation and rounding at the peak.

The file written holds a ``[framework]`` table (schema: ``fitplan.rulesets.Framework``) and, when the
scenario names its GPU, an ``[[mfu_calibration]]`` row with the MFU measured in the step; load it with
``fitplan estimate --ruleset-dir DIR``.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from fitplan.api import FitplanError

from . import _deps

ALLOCATOR_BLOCK_BYTES = 512


def measure_cuda_overhead(measurement) -> dict[str, Any]:
    """Raw numbers from the current CUDA device (call right after the measured step)."""
    torch = _deps.torch()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    allocated = torch.cuda.memory_allocated()
    workspace = 0
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
        workspace = max(0, allocated - torch.cuda.memory_allocated())
    cuda = measurement.cuda or {}
    return {
        "device_name": torch.cuda.get_device_name(),
        "total_bytes": int(total),
        "free_bytes": int(free),
        "memory_reserved": int(reserved),
        "memory_allocated": int(allocated),
        "max_memory_allocated": int(cuda.get("max_memory_allocated", 0)),
        "max_memory_reserved": int(cuda.get("max_memory_reserved", 0)),
        "cublas_workspace_bytes": int(workspace),
        "torch_version": torch.__version__,
    }


def calibration_from_measurement(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``[framework]`` fields from :func:`measure_cuda_overhead`'s numbers (pure: testable without a GPU)."""
    for key in ("total_bytes", "free_bytes", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        if key not in raw:
            raise FitplanError(f"calibration measurement lacks {key!r}", field=key)
    if raw["max_memory_allocated"] <= 0:
        raise FitplanError("calibration needs a step that allocated CUDA memory (max_memory_allocated is 0)",
                           field="max_memory_allocated", value=raw["max_memory_allocated"])
    context = raw["total_bytes"] - raw["free_bytes"] - raw["memory_reserved"]
    ratio = raw["max_memory_reserved"] / raw["max_memory_allocated"]
    source = (f"measured by fitplan validate --calibrate-out on {raw.get('device_name', 'a CUDA GPU')} "
              f"(torch {raw.get('torch_version', '?')}, {datetime.date.today().isoformat()})")
    return {
        "cuda_context_bytes": int(max(0, context)),
        "cublas_workspace_bytes": int(raw.get("cublas_workspace_bytes", 0)),
        "allocator_reserve_ratio": round(max(1.0, ratio), 4),
        "allocator_block_bytes": ALLOCATOR_BLOCK_BYTES,
        "source": source,
    }


def write_framework_toml(path: str | Path, framework: dict[str, Any], mfu_rows: list[dict[str, Any]] = ()) -> Path:
    """Write ``[framework]`` (and optional ``[[mfu_calibration]]`` rows) to ``path`` with tomli_w."""
    try:
        import tomli_w
    except ImportError:
        raise FitplanError("writing a calibration file needs tomli-w", suggestion="pip install tomli-w") from None
    p = Path(path)
    if p.suffix != ".toml":
        raise FitplanError("the calibration file must end in .toml (fitplan reads *.toml from --ruleset-dir)",
                           field="--calibrate-out", value=str(p))
    doc: dict[str, Any] = {"framework": dict(framework)}
    if mfu_rows:
        doc["mfu_calibration"] = [dict(r) for r in mfu_rows]
    p.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by `fitplan validate --calibrate-out`: load with `fitplan estimate --ruleset-dir DIR`.\n"
    p.write_text(header + tomli_w.dumps(doc), encoding="utf-8")
    return p
