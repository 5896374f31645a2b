"""Names derived from an evaluated estimate, for policy and advice conditions (docs/policies.md).

Each reads the evaluated values (``view.values.get``) and returns None when its inputs are unknown (no
GPU, no dataset, no price), which makes a comparison false.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fitplan.engine.declarations import Name
from fitplan.pluginmgr.hookspecs import hookimpl


def _hours(view: Any) -> float | None:
    s = view.values.get("train_seconds")
    return None if s is None else s / 3600


def _headroom_fraction(view: Any) -> float | None:
    h, u = view.values.get("headroom_bytes"), view.values.get("usable_bytes")
    return None if h is None or not u else h / u


def _gpu(view: Any) -> str | None:
    spec = view.values.get("gpu_spec")
    return spec.id if spec is not None else view.values.get("gpu")


def _instance(view: Any) -> str | None:
    choice = view.values.get("instance_choice")
    return None if choice is None else choice.instance.id


def _gpus_paid(view: Any) -> int | None:
    choice = view.values.get("instance_choice")
    return None if choice is None else choice.gpus_paid


def _deepspeed_precision(view: Any) -> str | None:
    """What DeepSpeed runs for this precision: its bf16/fp16 optimizer (16-bit weights, fp32 master weights)
    for a 16-bit one, as HF ``bf16=True``/``fp16=True`` give under DeepSpeed; fp32 stays fp32."""
    from fitplan.inputs.precision import PRESETS

    p = PRESETS.get(view.values.get("precision"))
    if p is None:
        return None
    return {"bf16": "bf16-master", "fp16": "16-master"}.get(p.compute_dtype, "32-true")


def _spot_saving(view: Any) -> float | None:
    od, spot = view.values.get("on_demand_cost_usd"), view.values.get("spot_cost_usd")
    return None if not od or spot is None else 1 - spot / od


def _gpu_has(dtype: str) -> Callable[[Any], bool | None]:
    def get(view: Any) -> bool | None:
        spec = view.values.get("gpu_spec")
        return None if spec is None else dtype in spec.peak_tflops

    return get


def _batch_per_gpu(view: Any) -> int | None:
    b, k = view.values.get("per_device_train_batch_size"), view.values.get("gradient_accumulation_steps")
    return None if b is None or k is None else b * k


_CHECKPOINT_INPUTS = ("trainable_param_count", "trainable_dtype_bytes", "master_weight_dtype_bytes", "optimizer_spec",
                      "optimizer_context")


def _checkpoint_bytes(view: Any) -> int | None:
    from fitplan.builtin.spot_risk import resumable_checkpoint_bytes

    args = [view.values.get(k) for k in _CHECKPOINT_INPUTS]
    return None if any(a is None for a in args) else resumable_checkpoint_bytes(*args)


NAMES = (
    Name("train_hours", _hours, "training time in hours (train_seconds / 3600)", ("train_seconds",), json_key="time.hours"),
    Name("headroom_fraction", _headroom_fraction, "free memory left on the GPU as a fraction of its usable memory",
         ("headroom_bytes", "usable_bytes")),
    Name("gpu", _gpu, "the GPU's ruleset id (aliases resolved)", ("gpu_spec", "gpu"), type="text"),
    Name("cost.provider", lambda view: view.values.get("provider"), "the provider the plan rents from", ("provider",),
         type="text"),
    Name("cost.instance", _instance, "the instance type rented", ("instance_choice",), type="text"),
    Name("instance_id", _instance, "the instance type rented", ("instance_choice",), type="text"),
    Name("gpus_paid", _gpus_paid, "GPUs paid for (whole instances)", ("instance_choice",)),
    Name("deepspeed_precision", _deepspeed_precision, "the precision DeepSpeed runs for this one (bf16 → bf16-master)",
         ("precision",), type="text"),
    Name("spot_saving_fraction", _spot_saving, "1 − spot cost / on-demand cost", ("on_demand_cost_usd", "spot_cost_usd")),
    Name("gpu_supports_bf16", _gpu_has("bf16"), "whether the GPU has bf16 tensor cores", ("gpu_spec",), type="bool"),
    Name("gpu_supports_fp8", _gpu_has("fp8"), "whether the GPU has fp8 tensor cores", ("gpu_spec",), type="bool"),
    Name("checkpoint_bytes_resumable", _checkpoint_bytes, "bytes of a resumable checkpoint (trainable weights, "
         "master copy, optimizer states), whatever the market", _CHECKPOINT_INPUTS),
    Name("batch_per_gpu", _batch_per_gpu, "sequences per GPU per optimizer step: micro-batch × accumulation steps",
         ("per_device_train_batch_size", "gradient_accumulation_steps")),
)


@hookimpl
def fitplan_register_names(register):
    for n in NAMES:
        register(n)
