"""A LLaMA-Factory training config (``examples/train_lora/*.yaml``) into scenario fields (:mod:`.recipe_reader` holds
the rule).

What LLaMA-Factory does with its keys (hiyouga/LLaMA-Factory @ ff6d4d1, ``src/llamafactory/hparams/`` and
``model/adapter.py``):

* ``model_name_or_path``: the Hub id; ``stage`` ``sft`` or ``pt`` (the others train reward models, PPO, DPO,
  KTO: refused); ``finetuning_type`` ``lora`` or ``full`` (``freeze`` and ``oft``: refused);
* ``lora_rank`` (default 8), ``lora_alpha`` (default twice the rank: ``finetuning_args.py``), ``lora_dropout``
  (default 0), ``lora_target`` (default ``all``: every linear layer but the output, peft's ``all-linear``),
  ``additional_target`` (peft's ``modules_to_save``);
* ``quantization_bit: 4`` with bitsandbytes: QLoRA (``double_quantization`` default true, compute dtype the
  load dtype); ``8``: LLM.int8 (``model/model_utils/quantization.py``: ``BitsAndBytesConfig(load_in_8bit=True)``,
  ``load_in_8bit``); LLaMA-Factory calls no ``prepare_model_for_kbit_training`` (``kbit_preparation = "none"``);
* the load dtype is the compute dtype (``parser.py``: ``bf16`` or ``pure_bf16`` -> bfloat16, ``fp16`` -> float16,
  else the checkpoint's); ``init_adapter`` casts the trainable parameters to fp32 unless ``pure_bf16`` or
  (unquantized) ZeRO-3: a full fine-tune then keeps fp32 weights under autocast (``bf16-mixed`` / ``16-mixed``),
  LoRA keeps fp32 adapters (peft's ``autocast_adapter_dtype``); with ``pure_bf16`` everything stays bf16;
* gradient checkpointing is on unless ``disable_gradient_checkpointing`` (``model_args.py``: default false);
  ``use_unsloth_gc`` makes it Unsloth's offloaded checkpointing (``activation_offloading = "unsloth"``);
* ``cutoff_len`` (default 2048), ``packing`` (default: on for ``stage: pt``) and ``neat_packing``, the HF
  TrainingArguments keys (batch, accumulation, epochs, ``optim``, ``deepspeed``), ``flash_attn``,
  ``enable_liger_kernel`` (Liger's fused linear cross-entropy: ``liger``).
"""

from __future__ import annotations

from fitplan.inputs.recipe_reader import Recipe

ATTENTION = {"auto": "sdpa", "sdpa": "sdpa", "fa2": "flash_attention_2", "disabled": "eager"}
"""``flash_attn``: ``auto`` lets transformers choose (SDPA in 5.24), ``disabled`` is eager attention."""
REFUSED = {
    "use_dora": "DoRA's magnitude vectors and norms", "use_unsloth": "Unsloth's kernels",
    "shift_attn": "LongLoRA's shifted attention",
    "mixture_of_depths": "mixture of depths", "upcast_layernorm": "fp32 layer norms",
    "upcast_lmhead_output": "an fp32 copy of the LM head's output", "use_galore": "GaLore (use optim galore_*)",
    "use_apollo": "APOLLO", "use_badam": "BAdam's block updates", "use_llama_pro": "LLaMA Pro's expanded blocks",
    "freeze_vision_tower": "a vision tower", "train_mm_proj_only": "a multimodal projector",
    "offload_folder": "weights offloaded to disk", "enable_activation_offload": "activations offloaded to the CPU",
}
"""Keys that change memory or time and that fitplan does not model: refused when set (true / non-empty)."""
IGNORED = (
    "trust_remote_code", "do_train", "dataset", "eval_dataset", "template", "max_samples", "overwrite_cache",
    "preprocessing_num_workers", "dataloader_num_workers", "output_dir", "logging_steps", "save_steps", "plot_loss",
    "overwrite_output_dir", "save_only_model", "report_to", "learning_rate", "lr_scheduler_type", "warmup_ratio",
    "warmup_steps", "ddp_timeout", "resume_from_checkpoint", "val_size", "per_device_eval_batch_size", "eval_strategy",
    "eval_steps", "dataset_dir", "media_dir", "tokenized_path", "use_rslora", "pissa_init", "pissa_convert",
    "loraplus_lr_ratio", "quantization_type", "weight_decay", "max_grad_norm", "seed", "run_name", "logging_dir",
    "save_strategy", "save_total_limit", "train_on_prompt", "mask_history", "default_system", "enable_thinking",
    "tool_format", "adapter_name_or_path", "create_new_adapter", "lora_bias", "new_special_tokens",
    "resize_vocab", "do_eval", "do_predict", "predict_with_generate", "include_num_input_tokens_seen",
    "buffer_size", "mix_strategy", "interleave_probs", "streaming", "hub_model_id", "push_to_hub", "use_reentrant_gc",
)
"""Keys that change neither memory nor time (data sources, templates, logging, schedules, saving)."""


def read(r: Recipe) -> None:
    """Fill ``r.fields`` from a LLaMA-Factory config (module doc)."""
    for key, why in REFUSED.items():
        r.refuse_if(key, lambda v: v not in (False, None, "", [], 0), why)
    stage = r.text("stage") or "sft"
    if stage not in ("sft", "pt"):
        raise r.refuse("stage", "a training stage fitplan does not model (reward model, PPO, DPO, KTO)", "sft or pt")
    r.set("model", r.text("model_name_or_path"))
    bf16 = bool(r.flag("bf16", False))
    fp16 = bool(r.flag("fp16", False))
    if r.has("deepspeed"):
        r.deepspeed("deepspeed", bf16=bf16 or bool(r.flag("pure_bf16", False)), fp16=fp16)
    quantized = _quantization(r)
    _method(r, quantized)
    _precision(r, bf16, fp16, quantized)
    _training(r, stage)
    r.ignore(*IGNORED)


def _quantization(r: Recipe) -> bool:
    bits = r.value("quantization_bit")
    if bits is None:
        return False
    method = r.text("quantization_method") or "bnb"
    if bits not in (4, 8) or method not in ("bnb", "bitsandbytes"):
        raise r.refuse("quantization_bit", f"{bits}-bit {method} quantization (fitplan models bitsandbytes' 4-bit "
                       "and 8-bit LoRA)", "quantization_bit: 4 or 8 with quantization_method: bnb")
    if bits == 8:  # model/model_utils/quantization.py: BitsAndBytesConfig(load_in_8bit=True)
        r.set("load_in_8bit", True)
    return True


def _method(r: Recipe, quantized: bool) -> None:
    kind = r.text("finetuning_type") or "lora"
    if kind not in ("lora", "full"):
        raise r.refuse("finetuning_type", "a fine-tuning type fitplan does not model", "lora or full")
    if kind == "full":
        if quantized:
            raise r.bad("quantization_bit", "a quantized model trains only through LoRA (adapter.py: 'Quantized "
                        "models can only be used for the LoRA or OFT tuning')")
        r.set("method", "full")
        return
    r.set("method", "qlora" if quantized else "lora")
    rank = r.integer("lora_rank") or 8
    r.set("lora_r", rank)
    r.set("lora_alpha", r.integer("lora_alpha") or rank * 2)
    r.set("lora_dropout", r.probability("lora_dropout"))
    targets = r.names("lora_target") or ("all",)
    r.set("lora_target_modules", ("all-linear",) if targets == ("all",) else targets)
    r.set("lora_modules_to_save", r.names("additional_target"))  # adapter.py: modules_to_save
    if quantized:
        r.set("kbit_preparation", "none")
        r.set("bnb_4bit_use_double_quant", r.flag("double_quantization", True))


def _precision(r: Recipe, bf16: bool, fp16: bool, quantized: bool) -> None:
    """The load dtype, the autocast flags and whether the trainable parameters are cast to fp32 (module doc)."""
    pure = bool(r.flag("pure_bf16", False))
    if bf16 or pure:
        r.set("dtype", "bfloat16")
    elif fp16:
        r.set("dtype", "float16")
    else:
        r.warn("neither bf16 nor fp16: LLaMA-Factory computes in the checkpoint's dtype (fitplan's dtype auto)")
    if r.fields.get("method") == "qlora" and "dtype" in r.fields:
        r.set("bnb_4bit_compute_dtype", r.fields["dtype"])
    zero3 = r.fields.get("zero_stage") == 3
    cast = not pure and not (zero3 and not quantized)
    if r.fields.get("stack") == "deepspeed":
        if r.fields.get("method") != "full":
            r.set("autocast_adapter_dtype", cast)
        return  # DeepSpeed's config decides the precision (its bf16 / fp16 optimizer)
    if pure:
        r.set("precision", "bf16-true")
        r.set("autocast_adapter_dtype", False)
    elif r.fields.get("method") == "full" and (bf16 or fp16):
        r.set("precision", "bf16-mixed" if bf16 else "16-mixed")  # fp32 weights (cast), autocast
    elif bf16:
        r.set("bf16", True)
    elif fp16:
        r.set("fp16", True)
    r.set("tf32", r.flag("tf32"))


def _training(r: Recipe, stage: str) -> None:
    r.set("max_seq_length", r.integer("cutoff_len") or 2048)
    packing = r.flag("packing")
    if packing is None:
        packing = stage == "pt"
    if r.flag("neat_packing", False):
        packing = True
    r.set("padding", "pack" if packing else "pad")
    if not packing:
        r.warn("without packing LLaMA-Factory pads each batch to its longest sample; fitplan estimates every sample "
               "at cutoff_len (give --dataset and --padding longest)")
    r.set("per_device_train_batch_size", r.integer("per_device_train_batch_size"))
    r.set("gradient_accumulation_steps", r.integer("gradient_accumulation_steps"))
    r.set("num_train_epochs", r.number("num_train_epochs"))
    ckpt = not r.flag("disable_gradient_checkpointing", False)
    r.set("gradient_checkpointing", ckpt)
    if r.flag("use_unsloth_gc", False) and ckpt:  # model/model_utils/checkpointing.py: the checkpointing function
        r.set("activation_offloading", "unsloth")
    optim = r.text("optim")
    if optim is not None:
        r.optim("optim", optim)
    attn = r.text("flash_attn")
    if attn is not None:
        if attn not in ATTENTION:
            raise r.bad("flash_attn", f"flash_attn must be one of {', '.join(ATTENTION)}, got {attn!r}")
        r.set("attn_implementation", ATTENTION[attn])
    if r.flag("enable_liger_kernel", False):
        r.set("loss_implementation", "liger")
        r.warn("enable_liger_kernel: the loss is Liger's fused linear cross-entropy; Liger's RMSNorm, SwiGLU and "
               "RoPE kernels are not modelled (the model's own ops are estimated)")
    r.set("torch_compile", r.flag("torch_compile"))
    if r.has("max_steps"):
        r.warn(f"max_steps ({r.value('max_steps')}) caps the steps: fitplan's time comes from the dataset size and "
               "num_train_epochs")
