"""Reading formats users already have: DeepSpeed config JSON (and, later, TrainingArguments JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fitplan.errors import FitplanError
from fitplan.inputs import settings
from fitplan.inputs.precision import MASTER_FOR_FLAG


def _read_json(path: str | Path) -> dict[str, Any]:
    from fitplan.inputs.files import read_json

    p = Path(path)
    data = read_json(p)
    if not isinstance(data, dict):
        raise FitplanError("expected a JSON object", file=str(p), value=type(data).__name__)
    return data


def deepspeed_fields(path: str | Path, *, bf16: bool | None = None, fp16: bool | None = None,
                     warnings: list[str] | None = None, checks: list[Any] | None = None) -> dict[str, Any]:
    """Scenario fields from a DeepSpeed config: ZeRO stage, offload, precision (:func:`deepspeed_precision`),
    the optimizer section (:func:`deepspeed_optimizer`), micro-batch and accumulation when not "auto".

    ``bf16``/``fp16``: the TrainingArguments flags (None: not stated), which resolve ``"enabled": "auto"`` the
    way ``transformers.integrations.deepspeed`` does; ``warnings`` receives what fitplan had to assume;
    ``checks`` receives functions of the final scenario (the ``train_batch_size`` assertion)."""
    return deepspeed_fields_from(_read_json(path), str(path), "$", bf16=bf16, fp16=fp16, warnings=warnings,
                                 checks=checks)


def deepspeed_fields_from(data: dict[str, Any], path: str, root: str = "$", *, bf16: bool | None = None,
                          fp16: bool | None = None, warnings: list[str] | None = None,
                          checks: list[Any] | None = None) -> dict[str, Any]:
    """:func:`deepspeed_fields` on an already-read config (``root``: its JSON path inside ``path``). Every key
    is checked as DeepSpeed 0.19.8 checks it (:mod:`fitplan.inputs.ds_keys`); the keys that change memory or
    time and that fitplan does not model are named in one warning."""
    from fitplan.inputs import ds_keys

    warnings = [] if warnings is None else warnings
    unmodelled: list[str] = []
    ds_keys.check_top(data, path, root, unmodelled, warnings)
    out: dict[str, Any] = {"stack": "deepspeed"}
    zero = data.get("zero_optimization", {})
    if isinstance(zero, bool):  # the old format: true = stage 1 (zero/config.py read_zero_config_deprecated)
        warnings.append(f"{path}: zero_optimization {str(zero).lower()} is DeepSpeed's deprecated format: stage "
                        f"{int(zero)}")
        zero = {"stage": int(zero)}
    if not isinstance(zero, dict):
        raise FitplanError("zero_optimization must be an object", file=str(path), field=f"{root}.zero_optimization", value=zero)
    ds_keys.check_removed_zero(zero, path, root)
    zero = ds_keys.deprecated_offload(zero, path, root, warnings)
    zero = ds_keys.check_section(zero, ds_keys.ZERO_KEYS, path, f"{root}.zero_optimization", unmodelled)
    out["zero_stage"] = zero.get("stage", 0) if zero.get("stage") != "auto" else 0
    out.update(_ds_zero_keys(zero, path, root))
    for key, field in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
        sect = zero.get(key) or {}
        sect = ds_keys.check_section(sect, ds_keys.OFFLOAD_KEYS[key], path, f"{root}.zero_optimization.{key}", unmodelled)
        out[field] = sect.get("device", "none") in ("cpu", "nvme")
        if sect.get("device") == "nvme":
            unmodelled.append(f"zero_optimization.{key}.device=nvme (estimated as cpu)")
    for key in ("bf16", "bfloat16", "fp16"):
        if key in data:
            ds_keys.check_section(data[key], ds_keys.PRECISION_KEYS["fp16" if key == "fp16" else "bf16"], path,
                                  f"{root}.{key}", unmodelled)
    if data.get("zero_force_ds_cpu_optimizer") is False and out["offload_optimizer"]:
        unmodelled.append("zero_force_ds_cpu_optimizer=false (fitplan models DeepSpeedCPUAdam under offload)")
    out["precision"] = deepspeed_precision(data, path, root, bf16=bf16, fp16=fp16, warnings=warnings)
    out.update(deepspeed_optimizer(data, path, root, warnings))
    for key, field in (("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
                       ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        v = data.get(key)
        if v is None or v == "auto":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FitplanError(f"{key} must be a positive integer or \"auto\", got {v!r}", file=str(path), field=f"{root}.{key}", value=v)
        out[field] = v
    _train_batch(data.get("train_batch_size"), path, root, checks)
    if unmodelled:
        warnings.append(f"{path}: not modelled (fitplan estimates DeepSpeed's default for each): " + ", ".join(unmodelled))
    return out


def _train_batch(v: Any, path: str, root: str, checks: list[Any] | None) -> None:
    """An explicit ``train_batch_size``: checked against the final scenario (DeepSpeed's ``_batch_assertion``)."""
    if v is None or v == "auto":
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise FitplanError(f"train_batch_size must be a positive integer or \"auto\", got {v!r}: DeepSpeed asserts "
                           "'Train batch size ... has to be greater than 0'", file=str(path), field=f"{root}.train_batch_size", value=v)
    if checks is not None:
        from fitplan.inputs.ds_keys import train_batch_check

        def check(s: Any) -> None:
            world = s.hardware.num_gpus * s.hardware.num_nodes // s.parallel.tensor_parallel
            train_batch_check(v, s.training.per_device_train_batch_size, s.training.gradient_accumulation_steps,
                              world, path, f"{root}.train_batch_size")

        checks.append(check)


DS_SIZE_KEYS = {"reduce_bucket_size": "reduce_bucket_size", "stage3_prefetch_bucket_size": "stage3_prefetch_bucket_size",
                "stage3_param_persistence_threshold": "stage3_param_persistence_threshold",
                "stage3_max_live_parameters": "stage3_max_live_parameters",
                "stage3_max_reuse_distance": "stage3_max_reuse_distance", "sub_group_size": "sub_group_size"}
"""``zero_optimization`` size keys (aliases already resolved by :func:`fitplan.inputs.ds_keys.check_section`) ->
scenario fields: a number of elements, or "auto" (resolved from the model as transformers/integrations/deepspeed.py:
232-241 does). 0 stays 0 where DeepSpeed accepts it (``ge=0``); ``reduce_bucket_size`` 0 is refused (``gt=0``)."""


def _ds_zero_keys(zero: dict[str, Any], path: str, root: str) -> dict[str, Any]:
    """The bucket, prefetch, persistence, reuse and sub-group keys fitplan models (values already checked);
    absent keys stay absent (DeepSpeed's defaults)."""
    out: dict[str, Any] = {}
    for key, field in DS_SIZE_KEYS.items():
        if key in zero:
            v = zero[key]
            out[field] = v if v == "auto" else str(int(v))
    if "overlap_comm" in zero and zero["overlap_comm"] != "auto":
        out["overlap_comm"] = zero["overlap_comm"]
    return out


def deepspeed_precision(data: dict[str, Any], path: str, root: str = "$", *, bf16: bool | None = None,
                        fp16: bool | None = None, warnings: list[str] | None = None) -> str:
    """The precision preset a DeepSpeed config runs, decided as transformers 5.24 and DeepSpeed decide it:

    * ``"enabled": "auto"`` takes the TrainingArguments value (``HfTrainerDeepSpeedConfig.trainer_config_process``:
      ``fill_match("bf16.enabled", args.bf16 or args.bf16_full_eval)``); an explicit value must *equal* it, or
      ``deepspeed_init`` raises "Please correct the following DeepSpeed config values that mismatch
      TrainingArguments values" (``transformers/integrations/deepspeed.py``): refused here the same way;
    * a missing section is added by accelerate when TrainingArguments asks for that dtype
      (``DeepSpeedPlugin.set_mixed_precision``);
    * fp16 and bf16 both enabled: DeepSpeed asserts "bfloat16 and fp16 modes cannot be simultaneously enabled"
      (``deepspeed/runtime/config.py``): refused;
    * 16-bit: DeepSpeed's bf16 / fp16 optimizer keeps fp32 master weights and states (``bf16-master`` /
      ``16-master``); neither: fp32 (``32-true``).

    ``bf16``/``fp16`` None: no TrainingArguments precision stated; fitplan then takes the config's explicit
    values and resolves "auto" with the TrainingArguments defaults (false), with a warning for each assumption.
    """
    warnings = [] if warnings is None else warnings
    stated = bf16 is not None or fp16 is not None
    ta = {"bf16": bool(bf16), "fp16": bool(fp16)}
    enabled = {}
    for key in ("bf16", "fp16"):
        sect = data.get(key, data.get("bfloat16") if key == "bf16" else None)
        value = sect.get("enabled", False) if isinstance(sect, dict) else None
        where = f"{root}.{key}.enabled"
        if value == "auto":
            enabled[key] = ta[key]
            if not stated:
                warnings.append(f"{path}: {key}.enabled is \"auto\" and no TrainingArguments precision was given: "
                                f"resolved with the HF default {key}=false (pass --{key} or --training-args)")
        elif value is None:
            enabled[key] = ta[key]  # accelerate adds {"enabled": true} for the TrainingArguments' dtype
        elif not isinstance(value, bool):
            raise FitplanError(f"{key}.enabled must be true, false or \"auto\", got {value!r}", file=path,
                               field=where, value=value)
        elif stated and value != ta[key]:
            raise FitplanError(f"{key}.enabled is {str(value).lower()} but TrainingArguments {key} is "
                               f"{str(ta[key]).lower()}: the HF Trainer refuses the mismatch (deepspeed_init)",
                               file=path, field=where, value=value, suggestion=f"set {key}.enabled to \"auto\"")
        else:
            enabled[key] = value
            if not stated and value:
                warnings.append(f"{path}: {key}.enabled is true; fitplan assumes TrainingArguments {key}=true "
                                "(the HF Trainer refuses a mismatch)")
    if enabled["bf16"] and enabled["fp16"]:
        raise FitplanError("bf16 and fp16 are both enabled: DeepSpeed asserts 'bfloat16 and fp16 modes cannot be "
                           "simultaneously enabled' (deepspeed/runtime/config.py)", file=path, field=f"{root}.fp16.enabled",
                           value=True, suggestion="enable one of them")
    return MASTER_FOR_FLAG["bf16"] if enabled["bf16"] else MASTER_FOR_FLAG["fp16"] if enabled["fp16"] else "32-true"


DEEPSPEED_OPTIMIZERS = {"adam": "adamw_torch_fused", "adamw": "adamw_torch_fused"}
"""A DeepSpeed ``optimizer`` section builds DeepSpeed's own optimizer (FusedAdam on the GPU; DeepSpeedCPUAdam with
offload: ``deepspeed/runtime/engine.py`` ``_configure_basic_optimizer``) and the HF Trainer ignores
``TrainingArguments.optim``: fitplan models FusedAdam like fused torch AdamW (two states, no step temporaries)."""


def deepspeed_optimizer(data: dict[str, Any], path: str, root: str, warnings: list[str]) -> dict[str, Any]:
    """``{"optim": ...}`` when the config has an ``optimizer`` section fitplan models (see
    :data:`DEEPSPEED_OPTIMIZERS`), with a warning that it overrides ``optim``."""
    opt = data.get("optimizer")
    if not isinstance(opt, dict):
        return {}
    kind = str(opt.get("type", "")).lower()
    if kind not in DEEPSPEED_OPTIMIZERS:
        raise FitplanError(f"DeepSpeed optimizer type {opt.get('type')!r} is not modelled", file=path,
                           field=f"{root}.optimizer.type", value=opt.get("type"),
                           suggestion="use Adam / AdamW, or remove the section to use TrainingArguments.optim")
    warnings.append(f"{path}: the optimizer section builds DeepSpeed's {opt.get('type')} (TrainingArguments.optim is "
                    "ignored): estimated as fused AdamW")
    return {"optim": DEEPSPEED_OPTIMIZERS[kind]}


TRAINING_ARGS_FIELDS = {
    "per_device_train_batch_size": "per_device_train_batch_size",
    "per_gpu_train_batch_size": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_checkpointing": "gradient_checkpointing",
    "activation_checkpointing": "gradient_checkpointing",  # transformers 5.24's name; read last, so it wins
    "optim": "optim",
    "num_train_epochs": "num_train_epochs",
    "tf32": "tf32",
    "torch_compile": "torch_compile",
    "max_seq_length": "max_seq_length",
    "max_length": "max_seq_length",
    "optim_args": "optim_args",
    "optim_target_modules": "optim_target_modules",
}
"""TrainingArguments (and TRL SFTConfig) keys fitplan reads -> scenario fields. ``bf16``, ``fp16``,
``deepspeed`` and ``fsdp`` are read too (see :func:`training_args_fields`); every other key is ignored."""
_TA_OTHER = ("bf16", "fp16", "deepspeed", "fsdp", "fsdp_config", "max_steps", "auto_find_batch_size", "bf16_full_eval",
             "fp16_full_eval", "liger_kernel_config", "beta", "precompute_ref_log_probs", "sync_ref_model", "loss_type",
             "loss_weights", "padding_free", "cpo_alpha")


def training_args_fields(path: str | Path, known_optimizers: Any = None,
                         checks: list[Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Scenario fields from an HF ``TrainingArguments`` JSON (``TrainingArguments.to_json_string()`` or a
    hand-written ``args.json``), and warnings.

    * ``bf16``/``fp16`` -> the scenario's ``bf16``/``fp16``: autocast over the weights ``from_pretrained`` loads
      (transformers 5.24: the checkpoint's dtype, ``fitplan.estimation.with_precision``); with a DeepSpeed config (``deepspeed``: a path, relative to this file, or an inline object)
      its ZeRO stage, offload and 16-bit optimizer (``bf16-master``) win;
    * ``fsdp`` (``true``, ``"full_shard auto_wrap"``, ``"shard_grad_op"``, ``"full_shard offload"``, or a list) and
      ``fsdp_config`` -> the FSDP stack, strategy, offload and checkpointing, checked as transformers and
      accelerate check them (:mod:`fitplan.inputs.fsdp_keys`);
    * what ``TrainingArguments.__post_init__`` refuses is refused (:mod:`fitplan.inputs.ta_checks`);
    * ``activation_checkpointing`` (5.24's name) wins over ``gradient_checkpointing``, its deprecated alias;
    * keys fitplan does not model are ignored; a key that looks like a misspelt one it reads is a warning;
    * ``checks`` receives the DeepSpeed config's checks of the final scenario (its ``train_batch_size``).

    :raises FitplanError: known keys with bad values (a batch size of 0, bf16 and fp16 both true, an
        unknown optimizer with a suggestion, a malformed ``deepspeed`` value), naming the file and key.
    """
    from fitplan.inputs import fsdp_keys, ta_checks

    p = Path(path)
    data = _read_json(p)
    warnings: list[str] = []

    def bad(key: str, message: str, suggestion: str | None = None) -> FitplanError:
        return FitplanError(message, file=str(p), field=f"$.{key}", value=data.get(key), suggestion=suggestion)

    ta_checks.check(data, str(p))
    out = _ta_plain_fields(data, bad, known_optimizers)
    out.update(_ta_settings(data, bad))
    bf16, fp16 = data.get("bf16"), data.get("fp16")
    for key, v in (("bf16", bf16), ("fp16", fp16)):
        if v is not None and not isinstance(v, bool):
            raise bad(key, f"{key} must be true or false, got {v!r}")
    if bf16 and fp16:
        raise bad("fp16", "bf16 and fp16 are both true", "choose one (TrainingArguments refuses both)")
    if bf16 or fp16:  # the preset follows from the flag and the load dtype (estimation.with_precision)
        out["bf16" if bf16 else "fp16"] = True
    if data.get("max_steps") not in (None, -1, 0):
        warnings.append(f"{p}: max_steps ({data['max_steps']}) is not modelled: fitplan's time comes from the dataset size "
                        "and num_train_epochs (or --total-tokens)")
    if data.get("auto_find_batch_size"):
        warnings.append(f"{p}: auto_find_batch_size is true: the Trainer may halve the batch after an OOM; "
                        "`fitplan recommend --max micro-batch` finds the largest that fits")
    out.update(_ta_liger(data, p, bad, warnings))
    out.update(_ta_trl(data, p, bad, warnings))
    out.update(fsdp_keys.ta_fsdp(data, str(p), warnings))
    ds = data.get("deepspeed")
    if ds is not None:
        # "auto" is filled with bf16 or bf16_full_eval (transformers/integrations/deepspeed.py)
        ds_bf16, ds_fp16 = bool(bf16 or data.get("bf16_full_eval")), bool(fp16 or data.get("fp16_full_eval"))
        if isinstance(ds, str):
            ds_path = Path(ds) if Path(ds).is_absolute() else p.parent / ds
            out.update(deepspeed_fields(ds_path, bf16=ds_bf16, fp16=ds_fp16, warnings=warnings, checks=checks))
        elif isinstance(ds, dict):
            out.update(deepspeed_fields_from(ds, str(p), "$.deepspeed", bf16=ds_bf16, fp16=ds_fp16, warnings=warnings,
                                             checks=checks))
        else:
            raise bad("deepspeed", f"deepspeed must be a path or an object, got {type(ds).__name__}")
    warnings += _ta_misspelt(data, p)
    return out, warnings


def _ta_plain_fields(data: dict[str, Any], bad: Any, known_optimizers: Any) -> dict[str, Any]:
    """The TrainingArguments keys that map one to one onto scenario fields, checked."""
    out: dict[str, Any] = {}
    for key, field in TRAINING_ARGS_FIELDS.items():
        if key not in data or data[key] is None:
            continue
        v = data[key]
        if field in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_seq_length"):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad(key, f"{key} must be a positive integer, got {v!r}")
        elif field in ("gradient_checkpointing", "tf32", "torch_compile"):
            if not isinstance(v, bool):
                raise bad(key, f"{key} must be true or false, got {v!r}")
        elif field == "num_train_epochs":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise bad(key, f"num_train_epochs must be a number > 0, got {v!r}")
            v = float(v)
        elif field == "optim":
            if not isinstance(v, str):
                raise bad(key, f"optim must be a string, got {v!r}")
            if known_optimizers is not None and v not in known_optimizers:
                from fitplan.errors import did_you_mean

                raise bad(key, f"optim {v!r} is not an optimizer fitplan knows",
                          did_you_mean(v, known_optimizers) or "see `fitplan plugins` for the optimizers")
        elif field == "optim_args":
            if not isinstance(v, str):
                raise bad(key, f"optim_args must be a string like \"rank=64,momentum=0.9\", got {v!r}")
        elif field == "optim_target_modules":  # a list of names, or one string (a regular expression, all-linear)
            if isinstance(v, str):
                v = (v,)
            elif isinstance(v, list) and all(isinstance(x, str) for x in v):
                v = tuple(v)
            else:
                raise bad(key, f"optim_target_modules must be a list of strings or a string, got {v!r}")
        out[field] = v
    return out


def _ta_settings(data: dict[str, Any], bad: Any) -> dict[str, Any]:
    """The plugin settings a TrainingArguments key sets (``Setting.keys["training_args"]``), translated and
    checked by their declarations (:mod:`fitplan.inputs.settings`; TRL's ``activation_offloading``:
    ``builtin/activations.py``)."""
    out: dict[str, Any] = {}
    for s in settings.declared().values():
        key = s.keys.get("training_args")
        if key is not None and data.get(key) is not None:
            try:
                value = s.from_key(key, data[key])
            except FitplanError as e:
                raise bad(key, e.message, e.suggestion) from None
            if value is not None:
                out[s.name] = value
    return out


def _ta_liger(data: dict[str, Any], p: Path, bad: Any, warnings: list[str]) -> dict[str, Any]:
    """``use_liger_kernel: true`` (read as the ``liger_kernel`` setting, builtin/activations.py): the Trainer patches
    the model with Liger-Kernel (transformers 5.24 integrations/liger.py, ``_apply_liger_kernel_to_instance``), which
    trace/liger.py models; said in a warning, with ``liger_kernel_config`` (the apply function's keyword arguments),
    which fitplan does not read: Liger's defaults are estimated. The Trainer gives the model the labels, so the loss is
    Liger's fused linear cross-entropy (``loss_implementation`` ``liger``, trace/loss_heads.py)."""
    v = data.get("use_liger_kernel")
    if v is not None and not isinstance(v, bool):  # JSON's own true / false (the setting would take "yes")
        raise bad("use_liger_kernel", f"use_liger_kernel must be true or false, got {v!r}")
    if v is not True:
        return {}
    warnings.append(f"{p}: use_liger_kernel: estimated with Liger-Kernel's fused RMSNorm, SwiGLU, RoPE and linear "
                    "cross-entropy kernels where its patch for the model type puts them (llama, mistral, ministral, qwen2, qwen3, smollm3; "
                    "a type Liger does not patch runs unchanged), derived from Liger's source, not measured")
    config = data.get("liger_kernel_config")
    if config:
        warnings.append(f"{p}: liger_kernel_config {config!r} is not modelled: Liger's defaults are estimated")
    return {"loss_implementation": "liger"}


def _ta_trl(data: dict[str, Any], p: Path, bad: Any, warnings: list[str]) -> dict[str, Any]:
    """A TRL config (``DPOConfig.to_json_string()`` or a hand-written one; docs/trl.md): ``beta``,
    ``precompute_ref_log_probs``, ``cpo_alpha`` and a single ``loss_type`` -> the ``[trl]`` fields (the trainer itself is said by ``--trainer``: a TRL
    config names no trainer). What TRL 1.16 refuses is refused with its message: ``loss_weights`` of another
    length than ``loss_type`` (trl/trainer/dpo_config.py ``__post_init__``), ``sync_ref_model`` with
    ``precompute_ref_log_probs`` (trl/trainer/dpo_trainer.py ``__init__``); ``padding_free: true`` is warned
    (TRL 1.16's DPOTrainer falls back to padding)."""
    out: dict[str, Any] = {}
    beta = data.get("beta")
    if beta is not None:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or beta < 0:
            raise bad("beta", f"beta must be a number >= 0, got {beta!r}")
        out["beta"] = float(beta)
    pre = data.get("precompute_ref_log_probs")
    if pre is not None:
        if not isinstance(pre, bool):
            raise bad("precompute_ref_log_probs", f"precompute_ref_log_probs must be true or false, got {pre!r}")
        out["precompute_ref_log_probs"] = pre
    alpha = data.get("cpo_alpha")
    if alpha is not None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
            raise bad("cpo_alpha", f"cpo_alpha must be a number >= 0, got {alpha!r}")
        out["cpo_alpha"] = float(alpha)
    if isinstance(data.get("loss_type"), str):
        out["loss_type"] = data["loss_type"]  # CPO's (its refusals: builtin/trl/reference_free.py check_cpo)
    types, weights = data.get("loss_type"), data.get("loss_weights")
    types = [types] if isinstance(types, str) else types
    if isinstance(types, list) and isinstance(weights, list) and len(weights) != len(types):
        raise bad("loss_weights", "`loss_weights` must have the same length as `loss_type` when combining multiple "
                  f"losses. Got {len(weights)} weights for {len(types)} loss types.")
    if data.get("sync_ref_model") and pre:
        raise bad("sync_ref_model", "You cannot use `sync_ref_model=True` together with `precompute_ref_log_probs=True`. "
                  "`precompute_ref_log_probs=True` assumes a fixed reference model, but with `sync_ref_model=True` the "
                  "reference model is updated during training, making the precomputed log-probs stale.",
                  "set precompute_ref_log_probs or sync_ref_model to false")
    if data.get("padding_free"):
        warnings.append(f"{p}: padding_free: TRL 1.16's DPOTrainer disables it (\"temporarily unavailable after a "
                        "refactor\") and pads: estimated padded")
    return out


def _ta_misspelt(data: dict[str, Any], p: Path) -> list[str]:
    """A warning for each ignored key that looks like a misspelt key fitplan reads."""
    import difflib

    read = set(TRAINING_ARGS_FIELDS) | set(_TA_OTHER) | {k for s in settings.declared().values()
                                                        if (k := s.keys.get("training_args"))}
    out = []
    for key in sorted(data):
        if key in read:
            continue
        close = difflib.get_close_matches(key, sorted(read), n=1, cutoff=0.85)
        if close:
            out.append(f"{p}: key {key!r} is ignored (did you mean {close[0]!r}?)")
    return out
