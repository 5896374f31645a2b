"""A torchtune recipe config (``recipes/configs/*/*.yaml``) into scenario fields (:mod:`.recipe_reader` holds the rule).

What the recipes do with their keys (torchtune @ 30b8519, the commit of its README's memory table):

* ``model._component_``: a model builder (``torchtune.models.llama3_1.lora_llama3_1_8b``): ``lora_`` builds LoRA
  adapters, ``qlora_`` the same over a base quantized to NF4 by torchao (priced as bitsandbytes NF4 with double
  quantization: blocks of 64, the block scales quantized in blocks of 256; the output projection is not quantized,
  ``models/llama3_1/_component_builders.py``: "quantize_base is not applied to final output_proj"), neither a
  full fine-tune. The builder's name gives the catalog model (:data:`BUILDERS`).
* ``lora_attn_modules`` (``q_proj``, ``k_proj``, ``v_proj``, ``output_proj``), ``apply_lora_to_mlp`` (``w1``,
  ``w2``, ``w3``) and ``apply_lora_to_output`` (the output projection): the HF module names of
  :data:`MODULES`. torchtune's ``LoRALinear`` keeps its adapters in the model's dtype (no fp32 upcast:
  ``autocast_adapter_dtype = false``) and leaves the rest of a QLoRA model in it (``kbit_preparation = "none"``).
* ``dtype``: ``bf16`` loads and trains every parameter in bf16 with no autocast (``bf16-true``); ``fp32``:
  ``32-true``.
* ``loss._component_``: ``CEWithChunkedOutputLoss`` is fitplan's ``chunked`` (8 chunks); with ``compile: True``
  ``chunked_compiled`` (``training.compile_loss`` compiles its ``compute_cross_entropy``).
* ``optimizer._component_``: :data:`OPTIMIZERS`; ``optimizer_in_bwd`` (``training/memory.py``
  ``register_optim_in_bwd_hooks``) is the scenario's ``optimizer_in_bwd``; ``enable_activation_offloading`` is
  ``activation_offloading = "torchtune"`` (``training/_activation_offloading.py`` ``OffloadActivations()``: streams
  on torch >= 2.5, the output projection under ``NoOpManager``, the loss outside the hooks: ``trace/offload.py``).
* ``batch_size``, ``gradient_accumulation_steps``, ``epochs``, ``tokenizer.max_seq_len``, ``dataset.packed``,
  ``enable_activation_checkpointing``, ``compile``.
"""

from __future__ import annotations

from fitplan.inputs.recipe_reader import Recipe

BUILDERS = {
    "llama2_7b": "llama-2-7b", "llama2_13b": "llama-2-13b", "llama2_70b": "llama-2-70b", "code_llama2_7b": "codellama-7b",
    "llama3_8b": "llama-3-8b", "llama3_1_8b": "llama-3.1-8b", "llama3_1_70b": "llama-3.1-70b",
    "llama3_1_405b": "llama-3.1-405b", "llama3_2_1b": "llama-3.2-1b", "llama3_2_3b": "llama-3.2-3b",
    "llama3_3_70b": "llama-3.3-70b", "mistral_7b": "mistral-7b", "gemma_2b": "gemma-2b", "gemma_7b": "gemma-7b",
    "gemma2_2b": "gemma-2-2b", "gemma2_9b": "gemma-2-9b", "gemma2_27b": "gemma-2-27b", "qwen2_5_0_5b": "qwen2.5-0.5b",
    "qwen2_5_1_5b": "qwen2.5-1.5b", "qwen2_5_3b": "qwen2.5-3b", "qwen2_5_7b": "qwen2.5-7b", "qwen2_5_14b": "qwen2.5-14b",
    "qwen2_5_32b": "qwen2.5-32b", "qwen2_5_72b": "qwen2.5-72b", "qwen3_0_6b": "qwen3-0.6b", "qwen3_4b": "qwen3-4b",
    "qwen3_8b": "qwen3-8b",
}
"""torchtune builder (without ``lora_`` / ``qlora_`` and a ``_base`` / ``_instruct`` suffix) -> fitplan's catalog id:
the same checkpoints (torchtune's ``mistral_7b`` is Mistral-7B-v0.1, its ``llama3_8b`` Meta-Llama-3-8B)."""
MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
"""torchtune's attention projections -> the HF module names (torchtune's checkpointers convert between them:
``models/convert_weights.py`` ``_FROM_HF``)."""
MLP = ("gate_proj", "down_proj", "up_proj")
"""``apply_lora_to_mlp``: torchtune's ``w1``, ``w2``, ``w3`` are HF's ``gate_proj``, ``down_proj``, ``up_proj``."""
OPTIMIZERS = {
    "torch.optim.AdamW": "adamw_torch", "torch.optim.Adam": "adamw_torch", "torch.optim.SGD": "sgd",
    "bitsandbytes.optim.PagedAdamW8bit": "paged_adamw_8bit", "bitsandbytes.optim.PagedAdamW": "paged_adamw_32bit",
    "bitsandbytes.optim.PagedAdamW32bit": "paged_adamw_32bit", "bitsandbytes.optim.AdamW8bit": "adamw_bnb_8bit",
}
"""``optimizer._component_`` -> the HF ``optim`` name with the same states: torch's AdamW (``fused: True``:
``adamw_torch_fused``), bitsandbytes' paged and 8-bit AdamW. ``torch.optim.Adam`` keeps AdamW's two states."""
LOSSES = {"torchtune.modules.loss.CEWithChunkedOutputLoss": "chunked"}
IGNORED = ("output_dir", "checkpointer", "resume_from_checkpoint", "save_adapter_weights_only", "seed",
           "shuffle", "lr_scheduler", "metric_logger", "log_every_n_steps", "log_peak_memory_stats", "log_level",
           "profiler", "device", "clip_grad_norm", "max_steps_per_epoch", "run_val_every_n_steps", "dataset_val",
           "inference")
"""Keys that change neither memory nor time (paths, logging, schedules; ``max_steps_per_epoch`` and ``clip_grad_norm``
are named: the first caps the steps, which fitplan counts from the dataset; the second's norm pass is small)."""


def read(r: Recipe) -> None:
    """Fill ``r.fields`` from a torchtune config (module doc)."""
    _model(r)
    _precision(r)
    _training(r)
    _optimizer(r)
    _loss(r)
    _unmodelled(r)
    r.ignore(*IGNORED)
    if r.has("max_steps_per_epoch"):
        r.warn("max_steps_per_epoch caps the steps: fitplan's time comes from the dataset size and epochs")


def _model(r: Recipe) -> None:
    comp = r.text("model._component_") or ""
    builder = comp.rsplit(".", 1)[-1]
    method = "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "full"
    base = builder.removeprefix("qlora_").removeprefix("lora_").removesuffix("_instruct").removesuffix("_base")
    if base not in BUILDERS:
        from fitplan.errors import did_you_mean

        raise r.bad("model._component_", f"torchtune builder {comp!r} is not one fitplan knows the model of",
                    did_you_mean(base, BUILDERS) or "builders: " + ", ".join(sorted(BUILDERS)))
    r.set("model", BUILDERS[base])
    r.set("method", method)
    if method == "full":
        return
    r.set("lora_r", r.integer("model.lora_rank"))
    alpha = r.number("model.lora_alpha")
    r.set("lora_alpha", int(alpha) if alpha is not None and alpha.is_integer() else alpha)
    r.set("lora_dropout", r.probability("model.lora_dropout"))
    r.set("lora_target_modules", _targets(r))
    r.set("autocast_adapter_dtype", False)
    if method == "qlora":
        r.set("kbit_preparation", "none")
        r.set("bnb_4bit_use_double_quant", True)
    r.refuse_if("model.use_dora", bool, "DoRA adds a magnitude vector and a weight-norm pass per adapted layer")
    r.refuse_if("model.quantize_base", bool, "quantize_base on a lora_ builder quantizes the base to NF4")


def _targets(r: Recipe) -> tuple[str, ...]:
    attn = r.names("model.lora_attn_modules") or ()
    bad = [m for m in attn if m not in MODULES]
    if bad:
        raise r.bad("model.lora_attn_modules", f"lora_attn_modules {', '.join(bad)} is not a torchtune attention "
                    "projection", "q_proj, k_proj, v_proj, output_proj")
    targets = [MODULES[m] for m in attn]
    if r.flag("model.apply_lora_to_mlp", False):
        targets += MLP
    if r.flag("model.apply_lora_to_output", False):
        targets.append("lm_head")
    if not targets:
        raise r.bad("model.lora_attn_modules", "a LoRA builder with no module to adapt",
                    "name lora_attn_modules or set apply_lora_to_mlp")
    return tuple(targets)


def _precision(r: Recipe) -> None:
    dtype = r.text("dtype") or "fp32"  # the recipes' default: training.get_dtype(cfg.dtype) with None -> fp32
    if dtype in ("bf16", "bfloat16"):
        r.set("dtype", "bfloat16")
        r.set("precision", "bf16-true")
        if r.fields.get("method") == "qlora":
            r.set("bnb_4bit_compute_dtype", "bfloat16")  # torchao's NF4 dequantizes to the bf16 input's dtype
    elif dtype in ("fp32", "float32"):
        r.set("dtype", "float32")
        r.set("precision", "32-true")
    else:
        raise r.bad("dtype", f"torchtune dtype {dtype!r} is not bf16 or fp32 (torchtune refuses fp16 training)",
                    "bf16 or fp32")


def _training(r: Recipe) -> None:
    r.set("per_device_train_batch_size", r.integer("batch_size"))
    r.set("gradient_accumulation_steps", r.integer("gradient_accumulation_steps"))
    epochs = r.number("epochs")
    r.set("num_train_epochs", epochs)
    r.set("gradient_checkpointing", r.flag("enable_activation_checkpointing"))
    seq = r.integer("tokenizer.max_seq_len")
    r.set("max_seq_length", seq)
    packed = r.flag("dataset.packed", False)
    r.set("padding", "pack" if packed else "pad")
    if not packed:
        r.warn("dataset.packed is false: torchtune pads each batch to its longest sample; fitplan estimates every "
               "sample at max_seq_length (give --dataset and --padding longest for the data's own lengths)")
    if seq is None:
        r.warn("tokenizer.max_seq_len is null: samples are as long as the data makes them; fitplan estimates "
               "--max-seq-length (default 2048)")
    if r.flag("compile", False):
        r.set("torch_compile", True)
        r.warn("compile: True: torch.compile's time is modelled, and the compiled chunked loss's memory "
               "(chunked_compiled); the compiled decoder layers' memory is estimated as eager")


def _optimizer(r: Recipe) -> None:
    comp = r.text("optimizer._component_")
    if comp is None:
        return
    if comp not in OPTIMIZERS:
        raise r.refuse("optimizer._component_", "an optimizer fitplan has no states for",
                       "one of " + ", ".join(sorted(OPTIMIZERS)))
    name = OPTIMIZERS[comp]
    if comp == "torch.optim.AdamW" and r.flag("optimizer.fused", False):
        name = "adamw_torch_fused"
    r.optim("optimizer._component_", name)
    if name.endswith("8bit") and r.fields.get("method") == "full":
        r.warn(f"{comp}: fitplan prices the HF Trainer's 32-bit states for the embeddings (its bitsandbytes "
               "override); torchtune registers none, so the embedding states are overestimated (about 6 bytes per "
               "embedding parameter)")
    if name.startswith("paged_"):
        r.warn(f"{comp}: paged states live in CUDA managed memory, outside torch's allocator; fitplan counts them "
               "on the GPU (torch.cuda.max_memory_allocated, which torchtune logs, does not)")
    if r.flag("optimizer_in_bwd", False):  # one optimizer per parameter, stepped in its gradient's hook
        r.set("optimizer_in_bwd", True)


def _loss(r: Recipe) -> None:
    comp = r.text("loss._component_")
    if comp is None:
        return
    if comp not in LOSSES:
        raise r.refuse("loss._component_", "a loss head fitplan does not model (it models CEWithChunkedOutputLoss as "
                       "chunked)")
    chunks = r.value("loss.num_output_chunks")
    if chunks not in (None, 8):
        raise r.refuse("loss.num_output_chunks", "fitplan's chunked loss has torchtune's default of 8 chunks")
    # training.compile_loss (training/_compile.py) compiles compute_cross_entropy alone when compile is on
    compiled = LOSSES[comp] == "chunked" and r.fields.get("torch_compile")
    r.set("loss_implementation", "chunked_compiled" if compiled else LOSSES[comp])


def _unmodelled(r: Recipe) -> None:
    """Keys that change memory or time and are not modelled (refused), and the distributed recipes' sharding."""
    r.refuse_if("device", lambda v: v != "cuda", "fitplan estimates torchtune recipes on CUDA devices")
    if r.flag("enable_activation_offloading", False):
        r.set("activation_offloading", "torchtune")
    r.refuse_if("tensor_parallel_dim", lambda v: v != 1, "torchtune's tensor parallelism")
    for key in ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "custom_sharded_layers", "dp_shard", "dp_replicate"):
        if key in r.data:
            r.value(key)
            _distributed(r)
            return


def _distributed(r: Recipe) -> None:
    """A distributed recipe (FSDP2's ``fully_shard`` on every layer, ``training/_distributed.py``
    ``shard_model``): sharded like the HF Trainer's FSDP2; the process count is the launcher's."""
    reshard = r.flag("fsdp_reshard_after_forward", True)
    r.set("fsdp", "full_shard" if reshard else "shard_grad_op")
    if r.flag("fsdp_cpu_offload", False):
        r.set("offload_params", True)
        r.set("offload_optimizer", True)
    r.warn("a distributed recipe: the GPU count is tune run's --nproc_per_node, not the config's: give --num-gpus")
