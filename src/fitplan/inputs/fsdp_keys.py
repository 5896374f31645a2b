"""An ``fsdp_config`` as transformers 5.24 and accelerate 1.16 read it, and their refusals, raised the way they
raise them: the TrainingArguments channel (``fsdp`` + ``fsdp_config``) whole, and the key checks the accelerate
YAML channel (``inputs/accelerate_config.py``) shares.

* ``TrainingArguments._process_fsdp_args`` (transformers/training_args.py:2775-2886): ``fsdp`` is ``True``, a
  string or a list of ``FSDPOption`` words; without it ``fsdp_config`` is never read. ``fsdp_`` prefixes are
  stripped; ``version`` defaults to 2; the words become ``fsdp_config`` entries
  (``_apply_legacy_fsdp_to_config``, :2888-2938: a strategy -> ``reshard_after_forward``, FSDP2 takes only
  ``full_shard`` / ``shard_grad_op``; ``offload`` -> ``cpu_offload``; anything else is "Unknown `fsdp` option");
  ``auto_wrap_policy`` must be one of accelerate's ``FSDP_AUTO_WRAP_POLICY``; booleans go through
  ``str_to_bool(str(value).lower())`` ("invalid truth value").
* ``FullyShardedDataParallelPlugin.__post_init__`` (accelerate/utils/dataclasses.py:1702-1940): FSDP2 wants a
  boolean ``reshard_after_forward``, FSDP1 a strategy; ``min_num_params`` an integer; ``backward_prefetch`` and
  ``state_dict_type`` one of ``FSDP_BACKWARD_PREFETCH`` / ``FSDP_STATE_DICT_TYPE`` (FSDP2: no
  ``LOCAL_STATE_DICT``); ``activation_checkpointing_offload`` needs ``activation_checkpointing`` and FSDP2.
* ``Trainer.__init__`` (transformers/trainer.py:879-884): FSDP's ``activation_checkpointing`` and the training
  argument ``activation_checkpointing`` (``gradient_checkpointing``, its deprecated alias) cannot both be true.
"""

from __future__ import annotations

from typing import Any

from fitplan.errors import FitplanError

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
"""``accelerate.utils.constants.FSDP_SHARDING_STRATEGY`` (the numeric form is index + 1)."""
AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
"""``FSDP_AUTO_WRAP_POLICY``."""
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
"""``FSDP_BACKWARD_PREFETCH``."""
STATE_DICT_TYPES = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
"""``FSDP_STATE_DICT_TYPE``."""
TRUTH = {**dict.fromkeys(("y", "yes", "t", "true", "on", "1"), True),
         **dict.fromkeys(("n", "no", "f", "false", "off", "0"), False)}
"""``str_to_bool`` (accelerate/utils/environment.py:59-71, transformers/training_args.py:2950-2962)."""
BOOL_KEYS = ("activation_checkpointing", "activation_checkpointing_offload", "cpu_ram_efficient_loading",
             "forward_prefetch", "use_orig_params", "sync_module_states", "limit_all_gathers", "offload_params")
"""Keys read through ``str_to_bool`` on either channel."""
TA_WORDS = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2", "offload", "auto_wrap")
"""``trainer_utils.FSDPOption``'s values."""


def _bad(path: str, field: str, value: Any, message: str, suggestion: str | None = None) -> FitplanError:
    return FitplanError(message, file=path, field=field, value=value, suggestion=suggestion)


def truth(value: Any, path: str, field: str) -> bool:
    """``str_to_bool(str(value).lower())``: ``true``/``false``/``yes``/``1``/... or accelerate's "invalid truth value"."""
    got = TRUTH.get(str(value).lower())
    if got is None:
        raise _bad(path, field, value, f"invalid truth value {str(value).lower()!r} (accelerate's and transformers' "
                   "str_to_bool refuse it)", "true or false")
    return got


def _one_of(value: Any, allowed: tuple[str, ...], path: str, field: str, what: str) -> str:
    text = str(value).upper()
    if text.isdigit() and 1 <= int(text) <= len(allowed):
        return allowed[int(text) - 1]
    if text not in allowed:
        raise _bad(path, field, value, f"{what} must be one of {', '.join(allowed)}, got {value!r} "
                   "(accelerate's FullyShardedDataParallelPlugin refuses it: accelerate/utils/dataclasses.py)",
                   "one of " + ", ".join(allowed))
    return text


def check_keys(cfg: dict[str, Any], version: int, path: str, field: Any) -> None:
    """The keys both channels share, checked as accelerate's FSDP plugin checks them (module doc). ``cfg`` has
    its ``fsdp_`` prefixes stripped; ``field(key)`` is the key's location in the user's file.
    ``activation_checkpointing_offload`` reaches the plugin from ``accelerate launch`` only (the Trainer never
    passes it: the caller leaves it out of ``cfg``)."""
    for key in BOOL_KEYS:
        if key in cfg and cfg[key] is not None:
            truth(cfg[key], path, field(key))
    policy = cfg.get("auto_wrap_policy")
    if policy is not None and str(policy).upper() not in AUTO_WRAP_POLICIES:
        raise _bad(path, field("auto_wrap_policy"), policy, f"`auto_wrap_policy` must be one of "
                   f"{list(AUTO_WRAP_POLICIES)}, got {policy} (transformers/training_args.py:2834, "
                   "accelerate/utils/dataclasses.py:1786)", "one of " + ", ".join(AUTO_WRAP_POLICIES))
    n = cfg.get("min_num_params")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise _bad(path, field("min_num_params"), n, f"`min_num_params` must be an integer, got {n!r} "
                   "(accelerate/utils/dataclasses.py:1806)")
    if cfg.get("backward_prefetch") is not None:
        _one_of(cfg["backward_prefetch"], BACKWARD_PREFETCH, path, field("backward_prefetch"), "backward_prefetch")
    if cfg.get("state_dict_type") is not None:
        kind = _one_of(cfg["state_dict_type"], STATE_DICT_TYPES, path, field("state_dict_type"), "state_dict_type")
        if version == 2 and kind == "LOCAL_STATE_DICT":
            raise _bad(path, field("state_dict_type"), cfg["state_dict_type"], "FSDP2 does not support LOCAL_STATE_DICT "
                       "(accelerate/utils/dataclasses.py:1935)", "SHARDED_STATE_DICT or FULL_STATE_DICT")
    if cfg.get("activation_checkpointing_offload") is not None and truth(
            cfg["activation_checkpointing_offload"], path, field("activation_checkpointing_offload")):
        if not truth(cfg.get("activation_checkpointing", False), path, field("activation_checkpointing")):
            raise _bad(path, field("activation_checkpointing_offload"), True, "`activation_checkpointing_offload=True` "
                       "requires `activation_checkpointing=True` (accelerate/utils/dataclasses.py:1843)")
        if version != 2:
            raise _bad(path, field("activation_checkpointing_offload"), True, "`activation_checkpointing_offload=True` "
                       "requires `fsdp_version=2` (accelerate/utils/dataclasses.py:1845)")


def version_of(cfg: dict[str, Any], path: str, field: str) -> int:
    """``cfg``'s ``version``, 2 when absent (the Trainer's default), else 1 or 2 (axolotl's recipes share it)."""
    v = cfg.get("version", 2)
    if isinstance(v, bool) or str(v) not in ("1", "2"):
        raise _bad(path, field, v, f"fsdp_config.version must be 1 or 2, got {v!r} (transformers/training_args.py:2826 "
                   "reads int(version); accelerate has FSDP1 and FSDP2 only)", "2 (the default) or 1")
    return int(v)


def _words(fsdp: Any, path: str) -> list[str]:
    """``fsdp`` as a list of words (``True``: none), refusing what ``_apply_legacy_fsdp_to_config`` refuses."""
    if not isinstance(fsdp, (str, list)):
        return []  # any other true value is fsdp=True (training_args.py:2790-2793)
    words = fsdp.split() if isinstance(fsdp, str) else list(fsdp)
    if not words or not all(isinstance(w, str) for w in words):
        raise _bad(path, "$.fsdp", fsdp, f"fsdp must be true, a string or a list of strings, got {fsdp!r}: "
                   "transformers reads each word with .upper() (training_args.py:2917)",
                   'true with fsdp_config, or "full_shard auto_wrap"')
    for w in words:
        if w.upper() not in SHARDING_STRATEGIES and w not in ("offload", "auto_wrap"):
            import difflib

            close = difflib.get_close_matches(w, TA_WORDS, n=1)
            raise _bad(path, "$.fsdp", fsdp, f"Unknown `fsdp` option: {w} (transformers/training_args.py:2938)",
                       f"did you mean {close[0]!r}?" if close else "one of " + ", ".join(TA_WORDS))
    return words


def ta_fsdp(data: dict[str, Any], path: str, warnings: list[str]) -> dict[str, Any]:
    """Scenario fields from a TrainingArguments' ``fsdp`` and ``fsdp_config`` (module doc): the stack
    (``fsdp2`` unless ``version`` is 1), the strategy, offload and FSDP's activation checkpointing."""
    fsdp, raw = data.get("fsdp"), data.get("fsdp_config")
    if not fsdp:
        if raw:
            warnings.append(f"{path}: fsdp_config is ignored without fsdp (TrainingArguments._process_fsdp_args)")
        return {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _bad(path, "$.fsdp_config", raw, f"fsdp_config must be an object, got {type(raw).__name__}",
                   'inline it: "fsdp_config": {"version": 2, ...}')
    original = {k.removeprefix("fsdp_"): k for k in raw}
    cfg = {k.removeprefix("fsdp_"): v for k, v in raw.items()}

    def field(key: str) -> str:
        return f"$.fsdp_config.{original.get(key, key)}"

    version = version_of(cfg, path, field("version"))
    words = _words(fsdp, path)
    for w in words:  # _apply_legacy_fsdp_to_config: setdefault, so fsdp_config's own value and the first word win
        if w.upper() in SHARDING_STRATEGIES:
            if version == 2 and w not in ("full_shard", "shard_grad_op"):
                raise _bad(path, "$.fsdp", fsdp, f"`fsdp={w}` is only available with FSDP1 (transformers/"
                           "training_args.py:2927)", "set fsdp_config.version to 1, or use full_shard / shard_grad_op")
            cfg.setdefault("reshard_after_forward", w == "full_shard" if version == 2 else w)
        elif w == "offload":
            cfg.setdefault("cpu_offload", True)
    if cfg.pop("activation_checkpointing_offload", None) is not None:
        warnings.append(f"{path}: fsdp_config.activation_checkpointing_offload is not passed to accelerate by the "
                        "Trainer (training_args.py:2825-2886): ignored")
    check_keys(cfg, version, path, field)
    mode = _ta_mode(cfg.get("reshard_after_forward"), version, path, field("reshard_after_forward"))
    offload = cfg.get("cpu_offload", False)
    if not isinstance(offload, bool):
        raise _bad(path, field("cpu_offload"), offload, f"cpu_offload must be true or false, got {offload!r}: "
                   "transformers tests it for truth (training_args.py:2830), so \"false\" would offload")
    out: dict[str, Any] = {"stack": f"fsdp{version}", "fsdp": mode}
    if offload:
        out.update(offload_params=True, offload_optimizer=True)
    if truth(cfg.get("activation_checkpointing", False), path, field("activation_checkpointing")):
        if data.get("activation_checkpointing", data.get("gradient_checkpointing")) is True:
            key = "activation_checkpointing" if data.get("activation_checkpointing") is not None else "gradient_checkpointing"
            raise _bad(path, f"$.{key}", True, "`fsdp_config['activation_checkpointing']` (FSDP's own activation "
                       f"checkpointing) and the `{key}` training argument can't both be set to True "
                       "(transformers/trainer.py:879)", "use FSDP's activation checkpointing only")
        out["gradient_checkpointing"] = True
    return out


def _ta_mode(value: Any, version: int, path: str, field: str) -> str:
    """The strategy from ``reshard_after_forward``: FSDP2 a truth value (full_shard / shard_grad_op), FSDP1 a
    strategy name or number (accelerate/utils/dataclasses.py:1740-1758)."""
    if version == 2:
        return "full_shard" if value is None or truth(value, path, field) else "shard_grad_op"
    if value is None:
        return "full_shard"
    if isinstance(value, bool):
        raise _bad(path, field, value, f"reshard_after_forward set to {value}. This is not supported with FSDP1, please "
                   "set to a `str` (accelerate/utils/dataclasses.py:1756)", "full_shard, shard_grad_op or hybrid_shard")
    mode = _one_of(value, SHARDING_STRATEGIES, path, field, "reshard_after_forward").lower()
    if mode in ("no_shard", "hybrid_shard_zero2"):
        raise _bad(path, field, value, f"FSDP1 {mode.upper()} is not modelled", "full_shard, shard_grad_op or hybrid_shard")
    return mode
