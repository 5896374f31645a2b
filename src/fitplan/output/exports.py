"""Writing a plan in the formats training stacks read: a DeepSpeed config JSON, an accelerate config YAML,
HF TrainingArguments JSON, and fitplan's own scenario TOML (the lossless one).

Every file is deterministic (fixed key order, no timestamps). Read back with ``--deepspeed`` and
``--training-args`` (plus the flags those formats cannot carry, listed in the returned notes), or the
scenario TOML as ``fitplan estimate plan.toml``, they give the plan's estimate again
(``tests/test_exports.py`` checks the round trips).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fitplan.inputs import scenario as sc
from fitplan.errors import FitplanError
from fitplan.inputs.precision import HF_WORD, PRESETS
from fitplan.output.yaml_text import to_yaml

KINDS = ("deepspeed", "accelerate", "training-args", "skypilot", "scenario")
FILENAMES = {"deepspeed": "ds_config.json", "accelerate": "accelerate_config.yaml",
             "training-args": "training_args.json", "skypilot": "sky_task.yaml", "scenario": "fitplan-plan.toml"}
NEEDS = {"training-args": ("deepspeed",), "accelerate": ("deepspeed",),
         "skypilot": ("deepspeed", "accelerate", "training-args")}
"""The files a kind names (written with it): DeepSpeed's only for a DeepSpeed plan."""
DS_KEYS = ("reduce_bucket_size", "overlap_comm", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
           "stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size")
"""The ``zero_optimization`` keys fitplan models, written when the plan sets them (absent: DeepSpeed's default)."""
HF_OPTIMIZERS = frozenset({"adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adamw_8bit", "adamw_bnb_8bit",
                           "paged_adamw_8bit", "adamw_hf", "adamw_apex_fused", "adamw_anyprecision", "lion_8bit",
                           "lion_32bit", "paged_lion_8bit", "paged_lion_32bit", "paged_adamw_32bit", "adagrad",
                           "rmsprop", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "adamw_torch_xla",
                           "adamw_torch_npu_fused", "galore_adamw", "galore_adamw_8bit", "galore_adafactor", "lomo",
                           "adalomo", "grokadamw", "schedule_free_adamw", "schedule_free_sgd", "ademamix",
                           "ademamix_8bit", "paged_ademamix_8bit", "paged_ademamix_32bit", "apollo_adamw",
                           "adamw_torch_4bit", "adamw_torch_8bit", "stable_adamw"})
"""``TrainingArguments.optim`` values (transformers ``OptimizerNames``)."""


def uses_deepspeed(s: sc.Scenario) -> bool:
    """A plan runs under DeepSpeed when its stack is DeepSpeed (``inputs/stacks.py``: ZeRO, offload without
    FSDP, DeepSpeed's 16-bit optimizer, or ``--stack deepspeed``)."""
    from fitplan.inputs import stacks

    p = s.parallel
    return stacks.resolve(p.stack, p.zero_stage, p.fsdp, p.offload_optimizer, p.offload_params, s.training.precision,
                          world(s) // p.tensor_parallel) == "deepspeed"


def _ds_number(value: str) -> Any:
    if value == "auto":
        return value
    x = float(value)
    return int(x) if x.is_integer() else x


def world(s: sc.Scenario) -> int:
    return s.hardware.num_gpus * s.hardware.num_nodes


def deepspeed_config(s: sc.Scenario) -> dict[str, Any]:
    """The DeepSpeed config JSON of a plan (what ``--deepspeed`` reads back).

    :raises FitplanError: the plan does not use DeepSpeed (no ZeRO, no offload, no ``*-master`` precision).
    """
    if not uses_deepspeed(s):
        raise FitplanError("this plan does not use DeepSpeed (no ZeRO stage, offload or bf16-master/16-master precision)",
                           field="--emit deepspeed", value=s.training.precision,
                           suggestion="emit training-args (and accelerate) instead")
    p, t = s.parallel, s.training
    flag = hf_flag(s)  # DeepSpeed's 16-bit optimizer: the flag of a *-master preset, or TrainingArguments' flag
    zero: dict[str, Any] = {"stage": p.zero_stage}
    if p.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if p.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if p.zero_stage >= 1:
        zero["contiguous_gradients"] = True
    for key in DS_KEYS:
        value = getattr(p, key)
        if value is None or key.startswith(("stage3", "sub_group")) and p.zero_stage != 3:
            continue
        zero[key] = bool(value) if key == "overlap_comm" else _ds_number(value)
    if p.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    out: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "train_batch_size": t.per_device_train_batch_size * t.gradient_accumulation_steps * world(s),
        "bf16": {"enabled": flag == "bf16"},
        "fp16": {"enabled": flag == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "zero_optimization": zero,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    return out


def hf_flag(s: sc.Scenario) -> str | None:
    """TrainingArguments' 16-bit flag (``bf16``/``fp16``) for a scenario: its preset's, or the flag the user gave
    when the preset is not decided yet (the HF words: ``bf16``/``fp16`` over the load dtype)."""
    t = s.training
    if t.precision is None:
        return "bf16" if t.bf16 else "fp16" if t.fp16 else None
    return PRESETS[t.precision].hf_flag


def load_dtype_note(s: sc.Scenario) -> str | None:
    """What loading the model needs that TrainingArguments cannot say: the load dtype (a preset's weights, which
    with the ``bf16``/``fp16`` key reproduce it: :func:`fitplan.inputs.precision.hf_precision`); nothing for
    ``dtype="auto"`` or DeepSpeed's ``*-master`` (its engine casts the model)."""
    t = s.training
    if t.precision is None:
        word = t.dtype
    else:
        p = PRESETS[t.precision]
        word = None if p.master else HF_WORD[p.weight_dtype]
    if word in (None, "auto"):
        return None
    return (f"load the model with from_pretrained(..., dtype=torch.{word}) (or dtype=\"auto\" on a {word} checkpoint); "
            f"TrainingArguments has no key for it; fitplan reads it back with --dtype {word}")


def training_args(s: sc.Scenario, deepspeed_file: str | None = None,
                  save_steps: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """HF ``TrainingArguments`` keys for a plan, and notes on what they cannot carry (to pass as flags or
    model-loading arguments). ``save_steps``: the spot model's checkpoint interval in optimizer steps
    (:func:`fitplan.output.skypilot_task.save_steps`), written with ``save_strategy`` and ``save_total_limit``.

    Checkpointing is ``activation_checkpointing``: transformers 5.24 keeps ``gradient_checkpointing`` as a
    deprecated alias (transformers/training_args.py, ``__post_init__``)."""
    t, p = s.training, s.parallel
    flag = hf_flag(s)
    notes: list[str] = []
    out: dict[str, Any] = {
        "output_dir": "outputs",
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "activation_checkpointing": t.gradient_checkpointing,
        "optim": t.optim,
        "bf16": flag == "bf16",
        "fp16": flag == "fp16",
        "num_train_epochs": t.num_train_epochs,
    }
    if t.tf32:
        out["tf32"] = True
    if save_steps is not None:
        from fitplan.output.skypilot_task import SAVE_TOTAL_LIMIT

        out.update({"save_strategy": "steps", "save_steps": save_steps, "save_total_limit": SAVE_TOTAL_LIMIT})
    if t.optim not in HF_OPTIMIZERS:
        notes.append(f"optim {t.optim!r} is not a TrainingArguments optimizer name: pass it to the Trainer as a "
                     f"custom optimizer (fitplan reads it back with --optim {t.optim})")
    note = load_dtype_note(s)
    if note:
        notes.append(note)
    if uses_deepspeed(s):
        out["deepspeed"] = deepspeed_file or FILENAMES["deepspeed"]
    if p.fsdp:
        out["fsdp"] = True
        out["fsdp_config"] = fsdp_config(s)
        if p.fsdp == "hybrid_shard" and p.stack != "fsdp1":
            notes.append("hybrid_shard under FSDP2: TrainingArguments' fsdp_config has no key for it (transformers "
                         "5.24 offers it under FSDP1 only); written as full_shard: shard within each node with a "
                         "device mesh yourself")
    if s.model.method != "full":
        notes.append(f"method {s.model.method}: build the model with peft LoraConfig(r={s.lora.lora_r}, "
                     f"lora_alpha={s.lora.lora_alpha}, target_modules="
                     + (repr(list(s.lora.lora_target_modules)) if s.lora.lora_target_modules is not None else "None")
                     + ")"
                     + (_quantization_note(s) if s.model.method == "qlora" else ""))
    if s.training.attn_implementation != "sdpa":
        notes.append(f"attention: load the model with attn_implementation=\"{s.training.attn_implementation}\"")
    notes.append(f"sequence length {t.max_seq_length}: TRL SFTConfig(max_length={t.max_seq_length}) or your tokenizer's truncation")
    return out, notes


def _quantization_note(s: sc.Scenario) -> str:
    """How a QLoRA scenario's base weights are loaded: LLM.int8 with ``load_in_8bit`` (bitsandbytes ``Linear8bitLt``),
    else 4-bit NF4."""
    if getattr(s.lora, "load_in_8bit", False):
        return ", loaded in 8-bit LLM.int8 (BitsAndBytesConfig(load_in_8bit=True))"
    return (", loaded in 4-bit NF4 (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", "
            f"bnb_4bit_use_double_quant={s.lora.bnb_4bit_use_double_quant}))")


def fsdp_config(s: sc.Scenario) -> dict[str, Any]:
    """TrainingArguments' ``fsdp_config`` for ``fsdp: true`` (transformers 5.24 deprecates the string form:
    training_args.py ``_apply_legacy_fsdp_to_config``): the version, ``reshard_after_forward`` (FSDP2: a bool,
    true for full_shard; FSDP1: the strategy's name), ``cpu_offload``, and the transformer-layer wrap policy."""
    p = s.parallel
    v1 = p.stack == "fsdp1"
    return {"version": 1 if v1 else 2,
            "reshard_after_forward": p.fsdp if v1 else p.fsdp != "shard_grad_op",
            "cpu_offload": bool(p.offload_params or p.offload_optimizer),
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}


def accelerate_config(s: sc.Scenario, deepspeed_file: str | None = None) -> str:
    """An ``accelerate launch --config_file`` YAML for a plan."""
    n, m = s.hardware.num_gpus, s.hardware.num_nodes
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    mixed = hf_flag(s) or "no"
    if uses_deepspeed(s):
        ds: dict[str, Any] = {"deepspeed_config_file": deepspeed_file or FILENAMES["deepspeed"]}
        if s.parallel.zero_stage == 3:
            ds["zero3_init_flag"] = True
        cfg["deepspeed_config"] = ds
        cfg["distributed_type"] = "DEEPSPEED"
    elif s.parallel.fsdp:
        cfg["distributed_type"] = "FSDP"
        v1 = s.parallel.stack == "fsdp1"
        cfg["fsdp_config"] = {
            "fsdp_version": 1 if v1 else 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_offload_params": bool(s.parallel.offload_params or s.parallel.offload_optimizer),
            # FSDP1 reads the strategy, FSDP2 only reshard_after_forward (accelerate/utils/dataclasses.py:1719-1752);
            # FSDP1's is the one fitplan modelled: fsdp_sharding_strategy, else FULL_SHARD (inputs/stacks.py)
            **({"fsdp_sharding_strategy": (s.parallel.fsdp_sharding_strategy or "full_shard").upper()} if v1 else
               {"fsdp_reshard_after_forward": s.parallel.fsdp != "shard_grad_op"}),
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
        cfg["mixed_precision"] = mixed
    else:
        cfg["distributed_type"] = "MULTI_GPU" if n * m > 1 else "NO"
        cfg["mixed_precision"] = mixed
    cfg.update({"machine_rank": 0, "main_training_function": "main", "num_machines": m, "num_processes": n * m,
                "rdzv_backend": "static", "same_network": True, "use_cpu": False})
    return to_yaml(cfg)


def scenario_toml(s: sc.Scenario) -> str:
    """The scenario as a fitplan scenario TOML file: every field that differs from its default, by section."""
    import tomli_w

    default = sc.Scenario()
    out: dict[str, dict[str, Any]] = {}
    for section in sc.SECTIONS:  # plugin settings included, each where its declaration puts it (sc.ORDER)
        here, there = sc.section_values(s, section), sc.section_values(default, section)
        diff = {k: (list(v) if isinstance(v, tuple) else v) for k, v in here.items() if v != there[k] and v is not None}
        if diff:
            out[section] = diff
    return "# fitplan scenario: `fitplan estimate THIS_FILE` reproduces the plan\n" + tomli_w.dumps(out)


def render_exports(kind: str, s: sc.Scenario, est=None,
                   market: str | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """The files of export ``kind`` (or ``all``) for scenario ``s``: ``[(file name, text)]`` and notes.

    :param est: the plan's estimate, which ``skypilot`` needs (the instance, the step time, the spot interval).
    :param market: the plan's market (``spot``: the checkpoint interval goes into the TrainingArguments).
    :raises FitplanError: an unknown kind; ``deepspeed`` for a plan without DeepSpeed; ``skypilot`` without an
        estimate.
    """
    if kind != "all" and kind not in KINDS:
        from fitplan.errors import unknown

        raise unknown("export format", kind, [*KINDS, "all"], field="--emit")
    kinds = _kinds(kind, s, est)
    from fitplan.output.skypilot_task import save_steps, skypilot_task

    steps = save_steps(est, market)
    files: list[tuple[str, str]] = []
    notes: list[str] = []
    for k in kinds:
        if k == "deepspeed":
            text = json.dumps(deepspeed_config(s), indent=2) + "\n"
        elif k == "training-args":
            data, more = training_args(s, save_steps=steps)
            notes += more
            text = json.dumps(data, indent=2) + "\n"
        elif k == "accelerate":
            text = accelerate_config(s)
        elif k == "skypilot":
            text, more = skypilot_task(s, est, market, FILENAMES)
            notes += more
        else:
            text = scenario_toml(s)
        files.append((FILENAMES[k], text))
    return files, notes


def _kinds(kind: str, s: sc.Scenario, est) -> list[str]:
    """The kinds ``--emit KIND`` writes: the kind and the files it names, in :data:`KINDS` order."""
    wanted = set(KINDS) if kind == "all" else {kind, *NEEDS.get(kind, ())}
    if kind == "all" and est is None:
        wanted.discard("skypilot")
    if kind == "skypilot" and est is None:
        raise FitplanError("a SkyPilot task needs the plan's estimate (its instance and step time)", field="--emit",
                           value=kind)
    if not uses_deepspeed(s) and kind != "deepspeed":
        wanted.discard("deepspeed")
    return [k for k in KINDS if k in wanted]


def exports_batch(directory: str | Path, files: list[tuple[str, str]], batch=None):
    """Add rendered export files (and their folder, created if needed) to a
    :class:`~fitplan.files.Batch`, written with the command's other files: all or none."""
    from fitplan.files import Batch

    batch = batch if batch is not None else Batch()
    d = batch.folder(directory, "--emit")
    for name, text in files:
        batch.add(d / name, text.encode("utf-8"), "--emit")
    return batch


def write_exports(directory: str | Path, files: list[tuple[str, str]]) -> list[Path]:
    """Write rendered export files into ``directory`` (created if needed): all of them whole, or none."""
    return exports_batch(directory, files).commit()


def emit(kind: str, s: sc.Scenario, directory: str | Path, est=None,
         market: str | None = None) -> tuple[list[Path], list[str]]:
    """Render and write export ``kind`` for ``s`` into ``directory``: the files written and the notes."""
    files, notes = render_exports(kind, s, est, market)
    return write_exports(directory, files), notes
