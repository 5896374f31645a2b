"""Every ds_config key DeepSpeed 0.19.8 reads, and what fitplan does with it: read, named as not modelled, or
known to change neither memory nor time; and DeepSpeed's own refusals, raised the way it raises them.

The tables follow the pydantic models DeepSpeed validates a config with (``deepspeed/runtime/zero/config.py``
``DeepSpeedZeroConfig``, ``zero/offload_config.py``, ``runtime/precision_config.py``): they forbid extra keys
(``runtime/config_utils.py`` ``DeepSpeedConfigModel``: ``extra="forbid"``), so an unknown key inside
``zero_optimization``, an offload section, ``bf16`` or ``fp16`` is DeepSpeed's "Extra inputs are not
permitted": refused here with the file and key. Top-level keys are read one getter at a time
(``runtime/config.py`` ``_initialize_params``): an unknown one is ignored by DeepSpeed, and named here.
``"auto"`` values are dropped before validation (``DeepSpeedConfigModel.__init__``, non-strict).
"""

from __future__ import annotations

import difflib
from typing import Any

from fitplan.errors import FitplanError

READ = "read"
UNMODELLED = "unmodelled"
NO_EFFECT = "no effect"

# (default, kind, role); kind: "bool", "int>0", "int>=0", "number01", "device", "path", "object", "enum:..."
ZERO_KEYS: dict[str, tuple[Any, str, str]] = {
    "stage": (0, "enum:0,1,2,3", READ),
    "contiguous_gradients": (True, "bool", NO_EFFECT),  # fitplan's layout is the contiguous one
    "reduce_scatter": (True, "bool", UNMODELLED),
    "reduce_bucket_size": (500_000_000, "int>0", READ),
    "use_multi_rank_bucket_allreduce": (True, "bool", NO_EFFECT),
    "allgather_partitions": (True, "bool", UNMODELLED),
    "allgather_bucket_size": (500_000_000, "int>=0", NO_EFFECT),  # allocates nothing (runtime/utils.py:1019-1022)
    "overlap_comm": (None, "bool", READ),
    "compute_grad_norm": (True, "bool", UNMODELLED),
    "load_from_fp32_weights": (True, "bool", NO_EFFECT),
    "elastic_checkpoint": (False, "bool", NO_EFFECT),
    "offload_param": (None, "object", READ),
    "offload_optimizer": (None, "object", READ),
    "zenflow": (None, "object", UNMODELLED),
    "sub_group_size": (1_000_000_000, "int>=0", READ),
    "cpu_offload_param": (None, "bool", READ),  # deprecated -> offload_param
    "cpu_offload_use_pin_memory": (None, "bool", NO_EFFECT),  # deprecated, sets nothing
    "cpu_offload": (None, "bool", READ),  # deprecated -> offload_optimizer
    "stage3_prefetch_bucket_size": (50_000_000, "int>=0", READ),
    "stage3_param_persistence_threshold": (100_000, "int>=0", READ),
    "stage3_model_persistence_threshold": (2**63 - 1, "int>=0", UNMODELLED),
    "stage3_max_live_parameters": (1_000_000_000, "int>=0", READ),
    "stage3_max_reuse_distance": (1_000_000_000, "int>=0", READ),
    "stage3_gather_16bit_weights_on_model_save": (False, "bool", NO_EFFECT),  # at save time only
    "stage3_module_granularity_threshold": (0, "int>=0", UNMODELLED),
    "stage3_use_all_reduce_for_fetch_params": (False, "bool", UNMODELLED),
    "stage3_allgather_sequential": (False, "bool", UNMODELLED),
    "stage3_gather_fp16_weights_on_model_save": (False, "bool", NO_EFFECT),  # deprecated alias of the above
    "ignore_unused_parameters": (True, "bool", NO_EFFECT),
    "legacy_stage1": (False, "bool", UNMODELLED),
    "round_robin_gradients": (False, "bool", UNMODELLED),
    "parameter_alignment": (False, "bool", UNMODELLED),
    "zero_hpz_partition_size": (1, "int>=0", UNMODELLED),
    "zero_quantized_weights": (False, "bool", UNMODELLED),
    "zero_quantized_nontrainable_weights": (False, "bool", UNMODELLED),
    "zero_quantized_gradients": (False, "bool", UNMODELLED),
    "memory_efficient_linear": (True, "bool", UNMODELLED),
    "pipeline_loading_checkpoint": (False, "bool", NO_EFFECT),
    "override_module_apply": (True, "bool", NO_EFFECT),
    "log_trace_cache_warnings": (False, "bool", NO_EFFECT),
    "enable_sanity_checks": (False, "bool", NO_EFFECT),
    "save_muon_momentum_buffer_in_memory": (False, "bool", UNMODELLED),
    "leaf_module": (None, "object", UNMODELLED),
}
"""``DeepSpeedZeroConfig``'s fields (zero/config.py:90-380) under the name a config file uses (the
``stage3_`` alias where one exists), with their default and fitplan's role."""
ZERO_ALIASES = {"prefetch_bucket_size": "stage3_prefetch_bucket_size",
                "param_persistence_threshold": "stage3_param_persistence_threshold",
                "model_persistence_threshold": "stage3_model_persistence_threshold",
                "max_live_parameters": "stage3_max_live_parameters", "max_reuse_distance": "stage3_max_reuse_distance",
                "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
                "module_granularity_threshold": "stage3_module_granularity_threshold",
                "use_all_reduce_for_fetch_params": "stage3_use_all_reduce_for_fetch_params",
                "allgather_sequential": "stage3_allgather_sequential"}
"""Field names pydantic accepts beside the aliases (``populate_by_name=True``); both at once is an extra key."""
REMOVED_ZERO_KEYS = ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param")
REMOVED_TOP_KEYS = ("nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
                    "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning",
                    "progressive_layer_drop")
"""Keys DeepSpeed 0.19.8 refuses with ``DeepSpeedConfigError`` ("... has been removed"; runtime/config.py:81-141)."""

OFFLOAD_KEYS: dict[str, dict[str, tuple[Any, str, str]]] = {
    "offload_optimizer": {"device": ("none", "device", READ), "nvme_path": (None, "path", NO_EFFECT),
                          "buffer_count": (4, "int>=0", UNMODELLED), "pin_memory": (True, "bool", NO_EFFECT),
                          "pipeline_read": (False, "bool", UNMODELLED), "pipeline_write": (False, "bool", UNMODELLED),
                          "fast_init": (False, "bool", NO_EFFECT), "ratio": (1.0, "number01", UNMODELLED),
                          "super_offload": (False, "bool", UNMODELLED), "cpuadam_cores_perc": (0.8, "number01", UNMODELLED)},
    "offload_param": {"device": ("none", "device", READ), "nvme_path": (None, "path", NO_EFFECT),
                      "buffer_count": (5, "int>=0", UNMODELLED), "buffer_size": (100_000_000, "int>=0", UNMODELLED),
                      "max_in_cpu": (1_000_000_000, "int>=0", UNMODELLED), "pin_memory": (True, "bool", NO_EFFECT)},
}
"""``DeepSpeedZeroOffloadOptimizerConfig`` / ``DeepSpeedZeroOffloadParamConfig`` (zero/offload_config.py:21-105).
``pin_memory`` changes whether the host bytes are pinned, not how many."""

PRECISION_KEYS: dict[str, dict[str, tuple[Any, str, str]]] = {
    "bf16": {"enabled": (False, "bool", READ), "immediate_grad_update": (False, "bool", NO_EFFECT),
             "check_grad_overflow": (True, "bool", NO_EFFECT), "bf16_master_weights_and_grads": (False, "bool", UNMODELLED),
             "bf16_optimizer_states": (False, "bool", UNMODELLED)},
    "fp16": {"enabled": (False, "bool", READ), "auto_cast": (False, "bool", UNMODELLED), "loss_scale": (0, "number", NO_EFFECT),
             "initial_scale_power": (16, "int", NO_EFFECT), "loss_scale_window": (1000, "int", NO_EFFECT),
             "hysteresis": (2, "int", NO_EFFECT), "consecutive_hysteresis": (False, "bool", NO_EFFECT),
             "min_loss_scale": (1, "int", NO_EFFECT), "fp16_master_weights_and_grads": (False, "bool", UNMODELLED)},
}
"""``DeepSpeedBF16Config`` / ``DeepSpeedFP16Config`` (runtime/precision_config.py), built as ``Config(**section)``."""

TOP_KEYS: dict[str, str] = {
    **{k: READ for k in ("zero_optimization", "bf16", "bfloat16", "fp16", "optimizer", "train_batch_size",
                         "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_force_ds_cpu_optimizer")},
    **{k: UNMODELLED for k in ("activation_checkpointing", "communication_data_type", "seq_parallel_communication_data_type",
                               "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op",
                               "disable_allgather", "data_types", "compile", "torch_autocast", "tensor_parallel",
                               "expert_parallel", "pipeline", "flops_profiler", "hybrid_engine", "data_efficiency",
                               "weight_quantization", "aio", "managed_gradient_accumulation", "zenflow")},
    **{k: NO_EFFECT for k in ("steps_per_print", "wall_clock_breakdown", "dump_state", "disable_python_gc",
                              "memory_breakdown", "scheduler", "gradient_clipping", "zero_allow_untested_optimizer",
                              "checkpoint", "dataloader_drop_last", "log_level", "tensorboard", "wandb", "csv_monitor",
                              "comet", "comms_logger", "monitor_config", "autotuning", "timers", "datastates",
                              "use_data_before_expert_parallelism", "vocabulary_size", "data_parallel_group",
                              "global_rank", "mesh_param")},
}
"""Top-level keys ``DeepSpeedConfig._initialize_params`` reads (runtime/config.py:481-588), by fitplan's role.
``gradient_clipping`` is the HF Trainer's ``max_grad_norm`` (1.0 by default), which the time model counts."""

_UNMODELLED_TOP_DEFAULTS = {"communication_data_type": None, "seq_parallel_communication_data_type": "fp32",
                            "prescale_gradients": False, "gradient_predivide_factor": 1.0,
                            "gradient_allreduce_op": "mean", "disable_allgather": False,
                            "managed_gradient_accumulation": False}


def _refuse(message: str, path: str, field: str, value: Any, suggestion: str | None = None) -> FitplanError:
    return FitplanError(message, file=path, field=field, value=value, suggestion=suggestion)


def check_value(kind: str, value: Any, path: str, field: str) -> None:
    """One value as DeepSpeed's pydantic model validates it (``"auto"`` is dropped before: accepted)."""
    if value == "auto" or (value is None and kind in ("path", "object")):
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {"bool": isinstance(value, bool),
          "int>0": number and float(value).is_integer() and value > 0,
          "int>=0": number and float(value).is_integer() and value >= 0,
          "int": number and float(value).is_integer(),
          "number": number, "number01": number and 0 <= value <= 1,
          "device": value in ("none", "cpu", "nvme"), "path": isinstance(value, str),
          "object": isinstance(value, dict)}.get(kind)
    if kind.startswith("enum:"):
        ok = not isinstance(value, bool) and value in [int(x) for x in kind[5:].split(",")]
    if not ok:
        want = {"bool": "true or false", "int>0": "an integer > 0", "int>=0": "an integer >= 0", "int": "an integer",
                "number": "a number", "number01": "a number in [0, 1]", "device": "none, cpu or nvme",
                "path": "a path", "object": "an object"}.get(kind, "one of " + kind[5:])
        raise _refuse(f"{field.split('.', 1)[-1]} must be {want}, got {value!r}: DeepSpeed's config model refuses it "
                      "(deepspeed/runtime/zero/config.py, offload_config.py, precision_config.py)", path, field, value)


def check_section(data: Any, table: dict[str, tuple[Any, str, str]], path: str, where: str,
                  unmodelled: list[str]) -> dict[str, Any]:
    """A pydantic-validated section: every key known (extra keys are DeepSpeed's "Extra inputs are not
    permitted"), every value of its type; the keys that change memory or time and that fitplan does not model,
    set to a non-default value, appended to ``unmodelled``. Returns the section with aliases resolved."""
    if not isinstance(data, dict):
        raise _refuse(f"{where.split('.', 1)[-1]} must be an object, got {data!r}: DeepSpeed builds its config model "
                      "with Config(**section), a TypeError for anything else", path, where, data,
                      '{"enabled": true}' if where.endswith(("bf16", "fp16", "bfloat16")) else None)
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = ZERO_ALIASES.get(key, key) if table is ZERO_KEYS else key
        if name not in table or name in out:
            close = difflib.get_close_matches(key, list(table), n=1, cutoff=0.8)
            raise _refuse(f"{where.split('.', 1)[-1]}.{key}: Extra inputs are not permitted (DeepSpeed's config model "
                          "forbids unknown keys: deepspeed/runtime/config_utils.py extra=\"forbid\")", path,
                          f"{where}.{key}", value, f"did you mean {close[0]!r}?" if close else None)
        default, kind, role = table[name]
        check_value(kind, value, path, f"{where}.{key}")
        if role == UNMODELLED and value != "auto" and value != default and not isinstance(value, dict):
            unmodelled.append(f"{where.removeprefix('$.')}.{key}={_show(value)}")
        elif role == UNMODELLED and isinstance(value, dict):
            unmodelled.append(f"{where.removeprefix('$.')}.{key}")
        out[name] = value
    return out


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_top(data: dict[str, Any], path: str, root: str, unmodelled: list[str], warnings: list[str]) -> None:
    """Top-level keys: a removed feature is DeepSpeed's ``DeepSpeedConfigError``; a key that changes memory or
    time and that fitplan does not model is named; an unknown key (DeepSpeed ignores it) is named, with the
    key it looks like."""
    ignored = []
    for key, value in data.items():
        if key in REMOVED_TOP_KEYS:
            raise _refuse(f"{key}: DeepSpeed 0.19.8 refuses it, the feature has been removed (DeepSpeedConfigError, "
                          "deepspeed/runtime/config.py _reject_removed_config_keys)", path, f"{root}.{key}", value,
                          "remove the key")
        role = TOP_KEYS.get(key)
        if role is None:
            close = difflib.get_close_matches(key, list(TOP_KEYS), n=1, cutoff=0.8)
            ignored.append(f"{key} (did you mean {close[0]!r}?)" if close else key)
        elif role == UNMODELLED and value != "auto" and value != _UNMODELLED_TOP_DEFAULTS.get(key, object()):
            if not (isinstance(value, dict) and value.get("enabled") is False):
                unmodelled.append(key if isinstance(value, dict) else f"{key}={_show(value)}")
    if ignored:
        warnings.append(f"{path}: DeepSpeed 0.19.8 reads no top-level key " + ", ".join(ignored) + ": ignored")


def check_removed_zero(zero: dict[str, Any], path: str, root: str) -> None:
    for key in REMOVED_ZERO_KEYS:
        if key in zero:
            raise _refuse(f"zero_optimization.{key}: DeepSpeed 0.19.8 refuses it, the feature has been removed "
                          "(DeepSpeedConfigError, deepspeed/runtime/config.py)", path,
                          f"{root}.zero_optimization.{key}", zero[key], "remove the key")


def deprecated_offload(zero: dict[str, Any], path: str, root: str, warnings: list[str]) -> dict[str, Any]:
    """``cpu_offload`` / ``cpu_offload_param`` as DeepSpeed maps them (zero/config.py:188-220,
    ``DeepSpeedConfigModel._process_deprecated_field``): true -> ``offload_optimizer`` / ``offload_param`` on the
    CPU, false -> none, with its deprecation warning; beside the key that replaces it, its assertion "Cannot
    provide deprecated parameter ... and replacing parameter ... together"."""
    zero = dict(zero)
    for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
        if old not in zero:
            continue
        if new in zero:
            raise _refuse(f"Cannot provide deprecated parameter '{old}' and replacing parameter '{new}' together "
                          "(DeepSpeed's assertion, deepspeed/runtime/config_utils.py)", path,
                          f"{root}.zero_optimization.{old}", zero[old], f"remove {old}; keep {new}")
        value = zero.pop(old)
        if value:
            zero[new] = {"device": "cpu"}
        warnings.append(f"{path}: Config parameter {old} is deprecated use {new} instead (DeepSpeed's warning): read as "
                        + (f"{new}.device cpu" if value else f"no {new}"))
    if "cpu_offload_use_pin_memory" in zero:
        warnings.append(f"{path}: Config parameter cpu_offload_use_pin_memory is deprecated use offload_param or "
                        "offload_optimizer instead (DeepSpeed's warning): it sets nothing")
    return zero


def train_batch_check(train_batch: int, micro: int, accum: int, world: int, path: str, field: str) -> None:
    """DeepSpeed's ``_batch_assertion`` (runtime/config.py:590-605): ``train_batch_size`` must equal micro-batch
    × gradient accumulation × world size (the HF Trainer fills and checks the same product,
    transformers/integrations/deepspeed.py ``trainer_config_process``)."""
    if train_batch != micro * accum * world:
        raise _refuse("Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
                      f"gradient_acc_step * world_size {train_batch} != {micro} * {accum} * {world} (DeepSpeed's "
                      "_batch_assertion, deepspeed/runtime/config.py)", path, field, train_batch,
                      f'set train_batch_size to {micro * accum * world} or "auto"')
