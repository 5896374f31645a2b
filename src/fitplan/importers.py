"""Reading formats users already have: DeepSpeed config JSON (and, later, TrainingArguments JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import FitplanError


def _read_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FitplanError("file not found", file=str(p)) from None
    except json.JSONDecodeError as e:
        raise FitplanError(f"malformed JSON: {e.msg} (line {e.lineno}, column {e.colno})", file=str(p)) from None
    if not isinstance(data, dict):
        raise FitplanError("expected a JSON object", file=str(p), value=type(data).__name__)
    return data


def deepspeed_fields(path: str | Path) -> dict[str, Any]:
    """Scenario fields from a DeepSpeed config: ZeRO stage, offload, bf16/fp16 (16-bit weights with fp32
    master weights and states: the ``*-master`` presets), micro-batch and accumulation when not "auto"."""
    data = _read_json(path)
    out: dict[str, Any] = {}
    zero = data.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise FitplanError("zero_optimization must be an object", file=str(path), field="$.zero_optimization", value=zero)
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise FitplanError(f"zero_optimization.stage must be 0-3, got {stage!r}", file=str(path),
                           field="$.zero_optimization.stage", value=stage)
    out["zero_stage"] = stage
    for key, field in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
        dev = (zero.get(key) or {}).get("device", "none") if isinstance(zero.get(key), dict) else "none"
        if dev not in ("none", "cpu", "nvme"):
            raise FitplanError(f"zero_optimization.{key}.device must be none, cpu or nvme, got {dev!r}",
                               file=str(path), field=f"$.zero_optimization.{key}.device", value=dev)
        out[field] = dev in ("cpu", "nvme")
    for key, preset in (("bf16", "bf16-master"), ("fp16", "16-master")):
        sect = data.get(key)
        if isinstance(sect, dict) and sect.get("enabled") in (True, "auto"):
            out["precision"] = preset
    for key, field in (("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
                       ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        v = data.get(key)
        if v is None or v == "auto":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FitplanError(f"{key} must be a positive integer or \"auto\", got {v!r}", file=str(path), field=f"$.{key}", value=v)
        out[field] = v
    return out
