"""An axolotl config (``examples/*/*.yml``) into scenario fields (:mod:`.recipe_reader` holds the rule).

What axolotl does with its keys (axolotl-ai-cloud/axolotl @ 067b021, ``src/axolotl/utils/schemas/``,
``loaders/model.py``, ``loaders/adapter.py``):

* ``base_model``: the Hub id (fitplan's catalog resolves ids and aliases); ``adapter`` ``lora`` / ``qlora``
  (``qlora`` with ``load_in_4bit``: bitsandbytes NF4, double quantization, compute dtype the load dtype);
  ``lora`` with ``load_in_8bit``: LLM.int8 (``loaders/model.py``: ``BitsAndBytesConfig(load_in_8bit=True)``;
  fitplan's ``method = "qlora"`` with ``load_in_8bit``);
* the load dtype (``normalize_config``): ``bf16`` / ``bfloat16`` -> bfloat16, ``fp16`` / ``float16`` -> float16,
  else float32; ``bf16: auto`` (the default) is taken as true (a GPU with bf16); the Trainer's ``bf16`` / ``fp16``
  autocast follows ``bf16`` / ``fp16``; ``bfloat16`` / ``float16`` without them train with no autocast;
* QLoRA and 8-bit LoRA: ``prepare_model_for_kbit_training`` upcasts the non-quantized parameters to fp32, then
  ``_configure_embedding_dtypes`` casts the norms and the embeddings back to the load dtype
  (``kbit_preparation = "none"``, the LoRA adapters fp32);
* ``lora_target_linear: true`` is peft's ``all-linear``; ``lora_target_modules`` the names;
  ``lora_modules_to_save`` peft's ``modules_to_save``;
* ``sequence_len`` (default 512), ``sample_packing`` (-> ``pack``), ``micro_batch_size`` (default 1),
  ``gradient_accumulation_steps``, ``num_epochs``, ``optimizer`` (an HF ``optim`` name; default
  ``adamw_torch_fused``), ``gradient_checkpointing``, ``attn_implementation`` / ``flash_attention`` /
  ``sdp_attention``, ``deepspeed`` (a config path), ``fsdp`` / ``fsdp_config`` / ``fsdp_version``, Liger's
  ``liger_fused_linear_cross_entropy`` (``liger``) and ``cut_cross_entropy`` (``cce``), ``torch_compile``, ``tf32``.
"""

from __future__ import annotations

from typing import Any

from fitplan.inputs.recipe_reader import Recipe

ATTENTION = {"flash_attention_2": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}
ATTENTION_FLAGS = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager"}
REFUSED = {
    "xformers_attention": "xformers' attention kernels", "s2_attention": "shifted-sparse attention",
    "flash_attn_cross_entropy": "flash-attn's cross-entropy kernel", "flash_attn_rms_norm": "flash-attn's RMSNorm",
    "flash_attn_fuse_qkv": "fused QKV projections", "flash_attn_fuse_mlp": "fused MLP projections",
    "unsloth_lora_mlp": "Unsloth's LoRA MLP kernels", "unsloth_lora_qkv": "Unsloth's LoRA QKV kernels",
    "unsloth_lora_o": "Unsloth's LoRA output kernels", "unsloth_cross_entropy_loss": "Unsloth's cross-entropy",
    "lora_mlp_kernel": "axolotl's LoRA MLP Triton kernels", "lora_qkv_kernel": "axolotl's LoRA QKV Triton kernels",
    "lora_o_kernel": "axolotl's LoRA output Triton kernels", "peft_use_dora": "DoRA's magnitude vectors and norms",
    "relora_steps": "ReLoRA's restarts", "lisa_n_layers": "LISA's layer sampling", "reward_model": "a reward model head",
    "gptq": "GPTQ-quantized weights", "tensor_parallel_size": "tensor parallelism", "context_parallel_size":
    "context parallelism", "sequence_parallel_degree": "sequence parallelism", "fp8": "FP8 training",
    "qat": "quantization-aware training", "rl": "preference or RL training (a reference model, several forwards)",
    "unfrozen_parameters": "a partially frozen full fine-tune",
}
"""Keys that change memory or time and that fitplan does not model: refused when set (a true / non-empty value)."""
IGNORED = (
    "datasets", "test_datasets", "dataset_prepared_path", "val_set_size", "output_dir", "lora_model_dir", "wandb_project",
    "wandb_entity", "wandb_watch", "wandb_name", "wandb_log_model", "wandb_mode", "wandb_run_id", "lr_scheduler",
    "learning_rate", "warmup_ratio", "warmup_steps", "logging_steps", "evals_per_epoch", "saves_per_epoch",
    "eval_steps", "save_steps", "weight_decay", "special_tokens", "tokens", "resume_from_checkpoint",
    "train_on_inputs", "early_stopping_patience", "local_rank", "debug", "strict", "seed", "hub_model_id",
    "tokenizer_type", "model_type", "tokenizer_config", "trust_remote_code", "is_llama_derived_model",
    "is_mistral_derived_model", "is_qwen_derived_model", "loss_watchdog_threshold", "loss_watchdog_patience",
    "eval_sample_packing", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon", "dataset_processes",
    "shuffle_merged_datasets", "save_total_limit", "save_strategy", "eval_strategy", "eval_batch_size",
    "eval_table_size", "eval_max_new_tokens", "do_bench_eval", "chat_template", "default_system_message",
    "lora_fan_in_fan_out", "peft_use_rslora", "gradient_checkpointing_kwargs", "plugins", "embeddings_skip_upcast",
    "cosine_min_lr_ratio", "lr_quadratic_warmup", "save_safetensors", "hub_strategy", "mlflow_experiment_name",
    "use_tensorboard", "save_first_step", "deduplicate", "dataloader_num_workers", "dataloader_pin_memory",
    "dataloader_prefetch_factor", "remove_unused_columns", "auto_resume_from_checkpoints", "base_model_config",
    "use_ray", "eot_tokens",
)
"""Keys that change neither memory nor time (data sources, logging, schedules, saving; ``plugins`` names the
integrations whose own keys are read)."""


def read(r: Recipe) -> None:
    """Fill ``r.fields`` from an axolotl config (module doc)."""
    for key, why in REFUSED.items():
        r.refuse_if(key, lambda v: v not in (False, [], {}, 0, ""), why)
    r.set("model", r.text("base_model"))
    bf16, fp16 = _precision(r)
    _method(r, bf16)
    _training(r)
    _attention(r)
    _kernels(r)
    _sharding(r, bf16, fp16)
    r.ignore(*IGNORED)


def _precision(r: Recipe) -> tuple[bool, bool]:
    """The load dtype and the Trainer's autocast flags (module doc); returns the flags (bf16, fp16)."""
    bf16 = r.value("bf16")
    if bf16 is None:
        bf16 = "auto"
    if bf16 == "auto":
        r.warn("bf16: auto is taken as true (axolotl enables bf16 on a GPU that supports it)")
        bf16 = True
    elif not isinstance(bf16, bool):
        raise r.bad("bf16", f"bf16 must be true, false or auto, got {bf16!r}")
    fp16 = bool(r.flag("fp16", False)) and not bf16
    pure_bf16, pure_fp16 = r.flag("bfloat16", False), r.flag("float16", False)
    if bf16 or pure_bf16:
        r.set("dtype", "bfloat16")
    elif fp16 or pure_fp16:
        r.set("dtype", "float16")
    else:
        r.set("dtype", "float32")
    if bf16:
        r.set("bf16", True)
    elif fp16:
        r.set("fp16", True)
    elif pure_bf16 or pure_fp16:
        r.set("precision", "bf16-true" if pure_bf16 else "16-true")
    r.set("tf32", r.flag("tf32"))
    return bool(bf16), fp16


def _method(r: Recipe, bf16: bool) -> None:
    adapter = r.text("adapter")
    four = r.flag("load_in_4bit", False)
    eight = r.flag("load_in_8bit", False)
    if adapter is None:
        if four or eight:
            key = "load_in_4bit" if four else "load_in_8bit"
            raise r.bad(key, f"{key} without an adapter: a quantized model trains only through LoRA",
                        "adapter: qlora" if four else "adapter: lora")
        r.set("method", "full")
        return
    if four and eight:
        raise r.bad("load_in_8bit", "load_in_8bit and load_in_4bit together: one quantization", "keep one")
    if adapter not in ("lora", "qlora"):
        raise r.refuse("adapter", "an adapter fitplan does not model", "lora or qlora")
    if adapter == "qlora" and not four:
        raise r.bad("adapter", "adapter: qlora needs load_in_4bit: true (axolotl's config check)")
    method = "qlora" if four or eight else "lora"
    r.set("method", method)
    if eight:  # loaders/model.py _set_quantization_config: adapter lora with load_in_8bit
        r.set("load_in_8bit", True)
    r.set("lora_r", r.integer("lora_r"))
    r.set("lora_alpha", r.integer("lora_alpha"))
    r.set("lora_dropout", r.probability("lora_dropout"))
    r.set("lora_target_modules", _targets(r))
    r.set("lora_modules_to_save", r.names("lora_modules_to_save"))
    if method == "qlora":
        r.set("kbit_preparation", "none")
        if four:
            r.set("bnb_4bit_use_double_quant", True)
            r.set("bnb_4bit_compute_dtype", r.fields["dtype"])
        r.warn("QLoRA: axolotl's prepare_model_for_kbit_training upcast is undone for the norms and embeddings "
               "(loaders/model.py _configure_embedding_dtypes): estimated with kbit_preparation = \"none\"")


def _targets(r: Recipe) -> tuple[str, ...] | None:
    names = r.names("lora_target_modules")
    if r.flag("lora_target_linear", False):
        extra = [n for n in names or () if n in ("lm_head", "embed_tokens")]
        if extra:
            raise r.refuse("lora_target_modules", f"all linear layers plus {', '.join(extra)}: fitplan's targets "
                           "are all-linear or a list of names", "list the modules instead of lora_target_linear")
        return ("all-linear",)
    return names


def _checkpointing(r: Recipe) -> None:
    """``gradient_checkpointing`` and ``activation_offloading`` (axolotl @ 067b021). ``gradient_checkpointing:
    offload`` is ``true`` with ``activation_offloading: true`` (``utils/schemas/validation.py``
    ``check_gradient_checkpointing_w_offload``). With offloading axolotl turns the HF Trainer's checkpointing off
    (``core/builders/base.py`` ``_configure_gradient_checkpointing``) and enters TRL's ``OffloadActivations`` around
    each ``training_step`` (``core/trainers/mixins/activation_checkpointing.py``: streams, except ``legacy``); for a
    full fine-tune it wraps the decoder layers in non-reentrant checkpoints again (``loaders/model.py``
    ``_apply_activation_checkpointing``, ``ac_wrap_hf_model``), for an adapter it does not (every saved tensor moves)."""
    ckpt = r.value("gradient_checkpointing")
    offload = r.value("activation_offloading")
    if ckpt == "offload":
        ckpt, offload = True, offload or True
    elif isinstance(ckpt, str):
        raise r.refuse("gradient_checkpointing", "offloaded checkpointing to disk")
    if offload in ("disk", "hidden_states"):
        raise r.refuse("activation_offloading", "activations offloaded to disk, or the hidden states offloaded inside "
                       "reentrant checkpoints")
    if offload not in (None, False, True, "legacy"):
        raise r.bad("activation_offloading", f"activation_offloading must be true, false, legacy, disk or "
                    f"hidden_states, got {offload!r}")
    if offload:
        r.set("activation_offloading", "trl_sync" if offload == "legacy" else "trl")
        r.set("gradient_checkpointing", r.text("adapter") is None)
        return
    if ckpt is not None and not isinstance(ckpt, bool):
        raise r.bad("gradient_checkpointing", f"gradient_checkpointing must be true, false, offload or offload_disk, "
                    f"got {ckpt!r}")
    r.set("gradient_checkpointing", ckpt)


def _training(r: Recipe) -> None:
    r.set("max_seq_length", r.integer("sequence_len") or 512)
    r.set("per_device_train_batch_size", r.integer("micro_batch_size"))
    r.set("gradient_accumulation_steps", r.integer("gradient_accumulation_steps"))
    r.set("num_train_epochs", r.number("num_epochs"))
    _checkpointing(r)
    if r.flag("sample_packing", False):
        r.set("padding", "pack")
    else:
        r.set("padding", "pad")
        if not r.flag("pad_to_sequence_len", False):
            r.warn("without sample_packing or pad_to_sequence_len axolotl pads each batch to its longest sample; "
                   "fitplan estimates every sample at sequence_len (give --dataset and --padding longest)")
    optim = r.text("optimizer")
    if optim is not None:
        r.optim("optimizer", optim)
    compile_ = r.value("torch_compile")
    if compile_ is not None:
        if compile_ not in (True, False, "auto"):
            raise r.bad("torch_compile", f"torch_compile must be true, false or auto, got {compile_!r}")
        r.set("torch_compile", compile_ is not False)
    if r.has("max_steps"):
        r.warn(f"max_steps ({r.value('max_steps')}) caps the steps: fitplan's time comes from the dataset size and "
               "num_epochs")


def _attention(r: Recipe) -> None:
    impl = r.text("attn_implementation")
    if impl is not None:
        if impl not in ATTENTION:
            raise r.refuse("attn_implementation", "an attention kernel fitplan does not model",
                           ", ".join(ATTENTION))
        r.set("attn_implementation", ATTENTION[impl])
    for key, name in ATTENTION_FLAGS.items():
        if r.flag(key, False) and impl is None:
            r.set("attn_implementation", name)


def _kernels(r: Recipe) -> None:
    """Liger's fused linear cross-entropy and Cut Cross-Entropy (axolotl's plugins); Liger's other kernels warned."""
    if r.flag("liger_fused_linear_cross_entropy", False):
        r.set("loss_implementation", "liger")
    if r.flag("cut_cross_entropy", False):
        r.set("loss_implementation", "cce")
    other = [k for k in ("liger_rms_norm", "liger_glu_activation", "liger_rope", "liger_layer_norm",
                         "liger_cross_entropy") if r.flag(k, False)]
    if other:
        r.warn(f"{', '.join(other)}: Liger's kernels other than the fused linear cross-entropy are not modelled (the "
               "model's own ops are estimated)")


def _sharding(r: Recipe, bf16: bool, fp16: bool) -> None:
    workers = r.integer("ray_num_workers")
    if workers is not None and r.flag("use_ray", False):
        r.set("num_gpus", workers)  # one GPU per Ray Train worker (axolotl's ray_train_func)
    if r.has("deepspeed"):
        r.deepspeed("deepspeed", bf16=bf16, fp16=fp16)
    fsdp = r.value("fsdp")
    cfg = r.value("fsdp_config")
    if not fsdp and not cfg:
        return
    r.fields.update(_fsdp_words(fsdp or ["full_shard"], r))
    r.fields.update(_fsdp_config(cfg, r.value("fsdp_version"), r))


def _fsdp_words(fsdp: Any, r: Recipe) -> dict[str, Any]:
    """``fsdp`` (``"full_shard auto_wrap"``, ``"shard_grad_op"``, ``"full_shard offload"``, or a list)."""
    words = fsdp.split() if isinstance(fsdp, str) else list(fsdp) if isinstance(fsdp, list) else None
    if not words or not all(isinstance(w, str) for w in words):
        raise r.bad("fsdp", f"fsdp must be a string or a list of strings, got {fsdp!r}")
    modes = [w for w in words if w in ("full_shard", "shard_grad_op", "hybrid_shard")]
    if not modes:
        raise r.bad("fsdp", f"fsdp {fsdp!r} names no sharding strategy",
                    "one of full_shard, shard_grad_op, hybrid_shard (with offload / auto_wrap)")
    out: dict[str, Any] = {"fsdp": modes[0]}
    if "offload" in words:
        out.update(offload_params=True, offload_optimizer=True)
    return out


def _fsdp_config(cfg: Any, version: Any, r: Recipe) -> dict[str, Any]:
    """``fsdp_config`` (its ``fsdp_`` prefixes accepted, as accelerate's plugin takes them) and ``fsdp_version``,
    read and checked by the rules the TrainingArguments and accelerate channels share
    (:mod:`fitplan.inputs.fsdp_keys`): the version (the Trainer's default is 2: training_args.py:2826), every
    key accelerate's FSDP plugin checks, ``offload_params``, ``reshard_after_forward: false`` (FSDP2's
    SHARD_GRAD_OP) and ``activation_checkpointing`` (every wrapped layer checkpointed: accelerator.py:1944-1960,
    what ``gradient_checkpointing`` models)."""
    from fitplan.inputs import fsdp_keys

    if cfg is not None and not isinstance(cfg, dict):
        raise r.bad("fsdp_config", f"fsdp_config must be an object, got {type(cfg).__name__}")
    original = {k.removeprefix("fsdp_"): k for k in cfg or {}}
    merged = {k.removeprefix("fsdp_"): v for k, v in (cfg or {}).items()}
    if version is not None:
        merged.setdefault("version", version)

    def field(key: str) -> str:
        if key == "version" and key not in original:
            return "$.fsdp_version"
        return f"$.fsdp_config.{original.get(key, key)}"

    v = fsdp_keys.version_of(merged, r.path, field("version"))
    fsdp_keys.check_keys(merged, v, r.path, field)
    out: dict[str, Any] = {"stack": f"fsdp{v}"}
    if merged.get("offload_params") is not None and fsdp_keys.truth(merged["offload_params"], r.path, field("offload_params")):
        out.update(offload_params=True, offload_optimizer=True)
    if merged.get("reshard_after_forward") is False:
        out["fsdp"] = "shard_grad_op"
    if fsdp_keys.truth(merged.get("activation_checkpointing", False), r.path, field("activation_checkpointing")):
        out["gradient_checkpointing"] = True
    return out
