"""Reading an accelerate config YAML (what ``accelerate config`` writes, ``--accelerate-config FILE``) as
accelerate 1.16 reads it, into scenario fields.

The loader is ``accelerate/commands/config/config_args.py`` (``ClusterConfig.from_yaml_file``: ``yaml.safe_load``,
``process_config``, unknown top-level keys refused); ``accelerate launch`` copies ``fsdp_config`` and
``deepspeed_config`` into its arguments (``commands/launch.py`` ``_validate_launch_command``, a missing
``fsdp_`` prefix added) and from there into the environment the plugins read (``utils/launch.py``;
``utils/dataclasses.py`` ``FullyShardedDataParallelPlugin`` / ``DeepSpeedPlugin.__post_init__``). What the
file sets that fitplan does not model is named in a warning; what accelerate refuses is a ``FitplanError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fitplan.errors import FitplanError

CLUSTER_KEYS = frozenset({
    "command_file", "commands", "compute_environment", "debug", "deepspeed_config", "distributed_type", "downcast_bf16",
    "dynamo_config", "enable_cpu_affinity", "fp8_config", "fsdp_config", "gpu_ids", "machine_rank", "main_process_ip",
    "main_process_port", "main_training_function", "megatron_lm_config", "mixed_precision", "mpirun_config",
    "num_machines", "num_processes", "parallelism_config", "rdzv_backend", "same_network", "tpu_env", "tpu_name",
    "tpu_use_cluster", "tpu_use_sudo", "tpu_vm", "tpu_zone", "use_cpu"})
"""``ClusterConfig``'s fields (config_args.py:178-215 with ``BaseConfig``'s); ``fp16`` and ``dynamo_backend``
are the old format, converted by ``process_config`` before the check."""
DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU",
                     "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM", "MULTI_HPU", "MULTI_NEURON")
"""``accelerate.utils.DistributedType`` (utils/dataclasses.py)."""
MODELLED_TYPES = ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP")
FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
"""``accelerate.utils.constants.FSDP_SHARDING_STRATEGY``: the string forms; the numeric form is index + 1."""
DS_LAUNCH_KEYS = frozenset({"deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
                            "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps",
                            "gradient_clipping", "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile",
                            "deepspeed_exclusion_filter", "deepspeed_inclusion_filter", "deepspeed_multinode_launcher",
                            "deepspeed_moe_layer_cls_names"})
"""``accelerate launch``'s DeepSpeed arguments (commands/launch.py:405-500)."""
DS_FILE_CONFLICTS = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                     "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                     "zero3_save_16bit_model", "mixed_precision")
"""What ``DeepSpeedPlugin._deepspeed_config_checks`` refuses beside a ``deepspeed_config_file``."""
FSDP_KEYS: dict[str, Any] = {
    "fsdp_version": 1, "fsdp_offload_params": False, "fsdp_min_num_params": 100_000_000, "fsdp_sharding_strategy": "FULL_SHARD",
    "fsdp_reshard_after_forward": True, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "fsdp_transformer_layer_cls_to_wrap": None, "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_state_dict_type": None,
    "fsdp_forward_prefetch": False, "fsdp_use_orig_params": True, "fsdp_cpu_ram_efficient_loading": True,
    "fsdp_sync_module_states": True, "fsdp_activation_checkpointing": False,
    "fsdp_activation_checkpointing_offload": False, "fsdp_ignored_modules": None}
"""``accelerate launch``'s FSDP arguments and their defaults (commands/launch.py:515-615)."""
FSDP_NO_EFFECT = ("fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states",
                  "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params")
"""Keys that change loading or saving only (``fsdp_min_num_params`` matters only under SIZE_BASED_WRAP, named then)."""


def _bad(path: str, field: str, value: Any, message: str, suggestion: str | None = None) -> FitplanError:
    return FitplanError(message, file=path, field=field, value=value, suggestion=suggestion)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The YAML as ``yaml.safe_load`` reads it (accelerate's loader); a syntax error names its line."""
    from fitplan.inputs.files import loads_yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise FitplanError(f"cannot read the accelerate config: {e.strerror or e}", file=str(p), field="--accelerate-config",
                           value=str(path)) from None
    data = loads_yaml(text, file=str(p), field="--accelerate-config", value=str(path))
    if not isinstance(data, dict):
        raise FitplanError("an accelerate config must be a mapping of keys", file=str(p), field="$", value=type(data).__name__)
    return data


def accelerate_fields(path: str | Path, warnings: list[str], checks: list[Any] | None = None) -> dict[str, Any]:
    """Scenario fields from an accelerate config YAML (module doc); ``warnings`` receives what it sets that fitplan
    does not model, ``checks`` what the DeepSpeed JSON it names checks against the final scenario."""
    p = str(path)
    data = dict(read_yaml(path))
    data.pop("fp16", None)  # process_config: the old format, only a mixed_precision fallback
    dynamo_backend = data.pop("dynamo_backend", None)
    env = data.get("compute_environment", "LOCAL_MACHINE")
    if env != "LOCAL_MACHINE":
        raise _bad(p, "$.compute_environment", env, f"compute_environment {env!r} is a SageMaker config: fitplan reads "
                   "LOCAL_MACHINE configs (ClusterConfig)", "estimate with the equivalent flags")
    extra = sorted(set(data) - CLUSTER_KEYS)
    if extra:
        raise _bad(p, f"$.{extra[0]}", data[extra[0]], f"The config file had unknown keys ({extra}): accelerate 1.16 refuses "
                   "them (ClusterConfig.from_yaml_file)", "remove them")
    dist = data.get("distributed_type")
    if dist is None:
        raise _bad(p, "$.distributed_type", None, "A `distributed_type` must be specified in the config file "
                   "(accelerate's process_config)", "one of " + ", ".join(MODELLED_TYPES))
    if dist not in DISTRIBUTED_TYPES:
        raise _bad(p, "$.distributed_type", dist, f"{dist!r} is not a valid DistributedType",
                   "one of " + ", ".join(DISTRIBUTED_TYPES))
    if dist not in MODELLED_TYPES:
        raise _bad(p, "$.distributed_type", dist, f"distributed_type {dist} is not modelled: fitplan estimates CUDA "
                   "GPUs under DDP, FSDP or DeepSpeed", "one of " + ", ".join(MODELLED_TYPES))
    unmodelled: list[str] = []
    out = _processes(data, p, dist)
    mixed = data.get("mixed_precision")
    if mixed not in (None, "no", "fp16", "bf16", "fp8"):
        raise _bad(p, "$.mixed_precision", mixed, f"mixed_precision must be no, fp16, bf16 or fp8, got {mixed!r}")
    if mixed == "fp8":
        unmodelled.append("mixed_precision=fp8 (estimated as bf16)")
        mixed = "bf16"
    if data.get("use_cpu") is True:
        out["device"] = "cpu"
    dynamo = data.get("dynamo_config") or ({"dynamo_backend": dynamo_backend} if dynamo_backend else {})
    if str(dynamo.get("dynamo_backend", "NO")).upper() != "NO":
        out["torch_compile"] = True
    for key in ("fp8_config", "parallelism_config", "megatron_lm_config"):
        if data.get(key):
            unmodelled.append(key)
    if dist == "FSDP":
        out.update(_fsdp(data.get("fsdp_config") or {}, p, mixed, unmodelled, warnings))
    elif dist == "DEEPSPEED":
        out.update(_deepspeed(data.get("deepspeed_config") or {}, p, mixed, "mixed_precision" in data and mixed is not None,
                              warnings, checks))
    if mixed in ("bf16", "fp16") and not (dist == "DEEPSPEED" and "precision" in out):
        out[mixed] = True  # TrainingArguments' flag: the preset follows from it and the load dtype (with_precision)
    if unmodelled:
        warnings.append(f"{p}: not modelled (fitplan estimates without it): " + ", ".join(unmodelled))
    return out


def _int(data: dict[str, Any], key: str, p: str, default: int) -> int:
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(p, f"$.{key}", v, f"{key} must be an integer, got {v!r}")
    return v


def _processes(data: dict[str, Any], p: str, dist: str) -> dict[str, Any]:
    """``num_processes`` is the total over all machines (accelerate launch); fitplan's ``num_gpus`` is per node."""
    machines = _int(data, "num_machines", p, 1)
    if machines < 1:
        raise _bad(p, "$.num_machines", machines, f"num_machines must be >= 1, got {machines}")
    procs = _int(data, "num_processes", p, 1 if dist == "NO" else -1)
    if procs == -1:
        return {"num_nodes": machines}  # accelerate launch then counts the visible GPUs: not in the file
    if procs < 1 or procs % machines:
        raise _bad(p, "$.num_processes", procs, f"num_processes ({procs}) is the total over num_machines ({machines}): "
                   "it must be a positive multiple of it", f"e.g. {machines * 8} for 8 GPUs per machine")
    return {"num_gpus": procs // machines, "num_nodes": machines}


def _flag(cfg: dict[str, Any], key: str, p: str) -> bool:
    """A boolean as accelerate launch passes it (``str(value).lower()`` then ``str_to_bool``)."""
    v = cfg.get(key, FSDP_KEYS[key])
    text = str(v).lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    raise _bad(p, f"$.fsdp_config.{key}", v, f"invalid truth value {v!r} (accelerate's str_to_bool)", "true or false")


def _strategy(v: Any, p: str, key: str) -> str:
    """An FSDP1 strategy in its string or numeric form (``FullyShardedDataParallelPlugin.__post_init__``)."""
    text = str(v).upper()
    if text.isdigit() and 1 <= int(text) <= len(FSDP_STRATEGIES):
        return FSDP_STRATEGIES[int(text) - 1]
    if text in FSDP_STRATEGIES:
        return text
    raise _bad(p, f"$.fsdp_config.{key}", v, f"{key} must be one of {', '.join(FSDP_STRATEGIES)} or 1-5, got {v!r}")


def _fsdp(cfg: dict[str, Any], p: str, mixed: str | None, unmodelled: list[str], warnings: list[str]) -> dict[str, Any]:
    cfg = {(k if k.startswith("fsdp") else "fsdp_" + k): v for k, v in cfg.items()}
    version = cfg.get("fsdp_version", 1)
    if str(version) not in ("1", "2"):
        raise _bad(p, "$.fsdp_config.fsdp_version", version, f"fsdp_version must be 1 or 2, got {version!r}")
    version = int(version)
    if version == 1:
        mode = _strategy(cfg.get("fsdp_sharding_strategy", "FULL_SHARD"), p, "fsdp_sharding_strategy")
        if mode in ("NO_SHARD", "HYBRID_SHARD_ZERO2"):
            raise _bad(p, "$.fsdp_config.fsdp_sharding_strategy", cfg.get("fsdp_sharding_strategy"),
                       f"FSDP1 {mode} is not modelled", "FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD")
        if mode != "FULL_SHARD":
            warnings.append(f"{p}: FSDP1 {mode}: accelerate launch runs it (FSDP_SHARDING_STRATEGY), but fitplan's FSDP1 "
                            "rules model FULL_SHARD (inputs/stacks.py effective_fsdp_mode)")
        if "fsdp_reshard_after_forward" in cfg:
            warnings.append(f"{p}: fsdp_reshard_after_forward is not read by FSDP1 (the sharding strategy decides)")
        if not _flag(cfg, "fsdp_use_orig_params", p):
            unmodelled.append("fsdp_use_orig_params=false")
    else:
        mode = "FULL_SHARD" if _flag(cfg, "fsdp_reshard_after_forward", p) else "SHARD_GRAD_OP"
        if "fsdp_sharding_strategy" in cfg:
            warnings.append(f"{p}: fsdp_sharding_strategy is not read by FSDP2: fsdp_reshard_after_forward decides "
                            f"({mode.lower()})")
    offload = _flag(cfg, "fsdp_offload_params", p)
    out: dict[str, Any] = {"stack": f"fsdp{version}", "fsdp": mode.lower(), "offload_params": offload,
                           "offload_optimizer": offload}
    if _flag(cfg, "fsdp_activation_checkpointing", p):
        out["gradient_checkpointing"] = True
    for key, default in FSDP_KEYS.items():
        v = cfg.get(key, default)
        if key in FSDP_NO_EFFECT or key in ("fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward",
                                            "fsdp_offload_params", "fsdp_activation_checkpointing", "fsdp_use_orig_params"):
            continue
        if str(v).lower() != str(default).lower():
            unmodelled.append(f"fsdp_config.{key}={v}")
    if str(cfg.get("fsdp_auto_wrap_policy")).upper() == "SIZE_BASED_WRAP":
        unmodelled.append(f"fsdp_config.fsdp_min_num_params={cfg.get('fsdp_min_num_params', FSDP_KEYS['fsdp_min_num_params'])}")
    unknown = sorted(set(cfg) - set(FSDP_KEYS))
    if unknown:
        warnings.append(f"{p}: fsdp_config keys accelerate launch does not read: {', '.join(unknown)} (ignored)")
    return out


def _deepspeed(cfg: dict[str, Any], p: str, mixed: str | None, mixed_in_file: bool, warnings: list[str],
               checks: list[Any] | None) -> dict[str, Any]:
    """``deepspeed_config``: a ``deepspeed_config_file`` (read by the DeepSpeed importer, relative to the YAML, else
    to the working directory as accelerate opens it), or the config ``DeepSpeedPlugin`` writes from the keys
    (stage default 2, offload devices default none: utils/dataclasses.py:1131-1221)."""
    from fitplan.inputs.importers import deepspeed_fields

    unknown = sorted(set(cfg) - DS_LAUNCH_KEYS)
    if unknown:
        warnings.append(f"{p}: deepspeed_config keys accelerate launch does not read: {', '.join(unknown)} (ignored)")
    file = cfg.get("deepspeed_config_file")
    if file not in (None, "none"):
        clash = [k for k in DS_FILE_CONFLICTS if k in cfg or (k == "mixed_precision" and mixed_in_file)]
        if clash:
            field = f"$.{clash[0]}" if clash[0] == "mixed_precision" else f"$.deepspeed_config.{clash[0]}"
            raise _bad(p, field, cfg.get(clash[0], mixed), "When using `deepspeed_config_file`, the following accelerate "
                       f"config variables will be ignored: {', '.join(clash)} (accelerate refuses them: "
                       "DeepSpeedPlugin._deepspeed_config_checks)", "set them in the DeepSpeed config file")
        ds = Path(str(file))
        if not ds.is_absolute() and (Path(p).parent / ds).is_file():
            ds = Path(p).parent / ds
        return deepspeed_fields(ds, warnings=warnings, checks=checks)
    stage = cfg.get("zero_stage", 2)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise _bad(p, "$.deepspeed_config.zero_stage", stage, f"zero_stage must be 0, 1, 2 or 3, got {stage!r}")
    out: dict[str, Any] = {"stack": "deepspeed", "zero_stage": stage}  # the precision: the flag over the load dtype
    for key, field in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_params")):
        dev = str(cfg.get(key, "none")).lower()
        if dev not in ("none", "cpu", "nvme"):
            raise _bad(p, f"$.deepspeed_config.{key}", cfg.get(key), f"{key} must be none, cpu or nvme, got {dev!r}")
        out[field] = dev != "none"
        if dev == "nvme":
            warnings.append(f"{p}: not modelled: deepspeed_config.{key}=nvme (estimated as cpu)")
    gas = cfg.get("gradient_accumulation_steps")
    if gas is not None and gas != "auto":
        if isinstance(gas, bool) or not isinstance(gas, int) or gas < 1:
            raise _bad(p, "$.deepspeed_config.gradient_accumulation_steps", gas,
                       f"gradient_accumulation_steps must be a positive integer, got {gas!r}")
        out["gradient_accumulation_steps"] = gas
    return out
