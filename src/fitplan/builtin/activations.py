"""Activations: the tensors the forward pass keeps for the backward pass, per GPU.

The default rule (``activation_bytes``, ``logits_bytes``, ``autocast_weight_copy_bytes``) comes from a
symbolic trace of the step (:mod:`fitplan.trace.step_trace`): each Hugging Face forward (transformers
5.24) written op by op, with what autograd saves for each op (PyTorch 2.13 ``derivatives.yaml``),
counted once per storage. Per decoder layer, with E bytes per activation element, T = b·s tokens,
h hidden, I intermediate, q/kv the query and key/value widths, a heads:

* Llama family, trained (full fine-tuning): RMSNorm ×2 ``(4 + 2E)·T·h + 4·T`` each (the fp32 input,
  its normalised fp32 product cast back to E, the fp32 rsqrt) and their outputs ``E·T·h`` as the next
  Linear's input; q, k (after rotary) and v ``E·T·(q + 2·kv)``; the attention output ``E·T·q``
  (shared with o_proj's input); SwiGLU/GeGLU ``4·E·T·I``; the attention core: SDPA keeps a fp32
  logsumexp ``4·a·T``, eager keeps the fp32 softmax ``4·a·s·T`` plus its E copy when E = 2, copies
  of q, kᵀ, v for ``matmul`` and a copy of its output. Rotary cos/sin ``2·s·d·E`` once per step.
* Phi-3 / GPT-NeoX / GPT-2: fused QKV projections, whose value view keeps the whole ``E·T·(q+2kv)``
  projection alive; LayerNorm keeps its input and two per-row statistics; GPT-2's ``gelu_new`` keeps
  five ``E·T·I`` tensors; dropout keeps a mask (1 byte per element on CUDA, the input dtype on CPU).
* MoE (Mixtral): every token goes to k experts, processed together (S = k·T rows): ``E·S·(h + 4I)``
  plus routing indices and weights; the router's fp32 probabilities ``4·T·n_experts``.
* LoRA: frozen Linears save no input; each adapter saves its fp32-cast input ``4·T·in`` and its rank
  intermediate ``4·T·r``; ops before the first adapter save nothing (nothing requires grad yet).
* bf16-mixed (autocast): every Linear casts its input to 16-bit (one copy per consuming Linear) and
  keeps a 16-bit copy of its weight (``autocast_weight_copy_bytes``); the residual stream stays fp32.
* Gradient checkpointing (non-reentrant): each layer keeps its arguments (hidden states ``E·T·h``,
  cos/sin, position ids, the eager mask); one layer is recomputed during its backward.

The sequence length s is ``realized_seq_length`` (builtin/dataset.py): ``max_seq_length``, or with
``--dataset`` the length the padding mode realizes (the longest example when padding to the longest).

Korthikanti et al. 2022's GPT formula stays available as ``activation_bytes_korthikanti`` (a named
approximation: 22 % low to 19 % high for bf16 Llama). docs/memory-model.md lists every rule.
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity, reducer
from fitplan.errors import FitplanError
from fitplan.inputs.settings import Setting
from fitplan.pluginmgr.hookspecs import hookimpl
from fitplan.trace import liger
from fitplan.trace.offload import OFFLOAD_MODES
from fitplan.trace.step_trace import ForwardTrace, StepTrace, TraceSpec, build, trace_precision


_TRACES: dict[tuple, tuple] = {}
"""Traces by the identity of their architecture and the other inputs: the search asks for the same trace many
times, and hashing a :class:`TraceSpec` hashes the whole architecture. Each value keeps its architecture alive so
that its id stays unique."""


def trace_for(arch, b, s, precision, attn, ckpt, method, lora_r, lora_target_modules, lora_dropout, device,
              framework=None, adapter_dtype: str = "fp32", quant_compute: str | None = None,
              linear_saves_input: bool = False, loss: str = "hf", saved: tuple[str, ...] = (),
              offload: str = "none", quant_bits: int = 4, forward_only: bool = False,
              liger_kernel: bool = False) -> StepTrace | ForwardTrace | None:
    """The step trace of these inputs (``forward_only``: its forward's figures, :class:`ForwardTrace`), built once per
    process (:data:`_TRACES`, ``build``) and kept on disk (``build``). ``liger_kernel``: Liger's patch for the model
    type (trace/liger.py); on a type Liger does not patch nothing changes, its ``liger`` loss included."""
    if arch.is_bare:
        return None
    if liger_kernel:
        loss = liger.unpatched_loss(arch.model_type, loss)
    liger_kernel = bool(liger_kernel) and liger.patch_for(arch.model_type) is not None
    attn = "sdpa" if attn == "flash_attention_2" else attn
    precision = trace_precision(precision)  # presets with the same trace share it
    targets = tuple(lora_target_modules or ()) if method != "full" else ()
    block = framework.allocator_block_bytes if framework is not None else 512
    key = (id(arch), b, s, precision, attn, ckpt, method, lora_r, targets, lora_dropout, device, block, adapter_dtype,
           quant_compute if method == "qlora" else None, linear_saves_input, loss, saved, offload, quant_bits, liger_kernel)
    if forward_only:
        key = (*key, "forward")
    hit = _TRACES.get(key)
    if hit is None:
        if len(_TRACES) > 4096:
            _TRACES.clear()
        trace = build(TraceSpec(arch, int(b), int(s), precision, attn, bool(ckpt), method, int(lora_r), targets,
                                float(lora_dropout) if method != "full" else 0.0, device, int(block),
                                adapter_dtype if method != "full" else "fp32", quant_compute if method == "qlora" else None,
                                bool(linear_saves_input), str(loss), tuple(saved) if method != "full" else (),
                                offload=str(offload), quant_bits=int(quant_bits) if method == "qlora" else 4,
                                liger=liger_kernel, forward_only=bool(forward_only)))
        hit = _TRACES[key] = (arch, trace)
    return hit[1]


TRUE_TWIN = {"bf16-mixed": "bf16-true", "16-mixed": "16-true"}


@quantity("preset", type="object")
def trace_setup(precision, sharding_kind, method, kbit_preparation, bnb_4bit_compute_dtype, autocast_adapter_dtype,
                zero3_linear_saves_input, load_in_8bit, activation_offloading, trainer, gradient_checkpointing):
    """How the step's ops run, when the stack or the QLoRA script changes it from ``precision``:
    ``(precision, adapter dtype, 4-bit compute dtype, Linears save their input)``.

    * accelerate FSDP under ``*-mixed``: parameters are gathered in 16 bits by FSDP's mixed-precision policy
      and the forward runs on them (builtin/sharding/fsdp.py): the ``*-true`` trace, no autocast copies; the
      LoRA adapters too are gathered in 16 bits (FSDP2 casts every sharded parameter to ``param_dtype``:
      torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``init_dtype_attrs``, 586-601; FSDP1 every flat
      parameter: _flat_param.py 1265-1300), so under FSDP2 peft casts no input to fp32 for them (measured,
      fitplan-torch). FSDP1 (``hf_fsdp1``) wraps each adapter Linear as its own unit, and peft reads
      ``lora_A.weight.dtype`` on it before that unit's pre-forward has gathered it: the fp32 shard
      (``use_orig_params`` views into the sharded flat parameter), so it casts its input to fp32
      (peft 0.21 tuners/lora/layer.py:1100 ``_cast_input_dtype``), and accelerate's autocast around the model's
      forward (accelerator.py:1791-1801; FSDP1's ``cast_forward_inputs`` is off for non-root units,
      torch/distributed/fsdp/_runtime_utils.py:398-405, accelerate/utils/dataclasses.py:2011-2013) casts it back to
      16 bits inside ``F.linear``, whose ``mm`` saves that copy: adapter dtype ``"bf16<fp32"`` (trace/kernels.py
      ``lora_site``); QLoRA under FSDP (not measured: the referee refuses it) keeps the plain rule;
    * QLoRA with ``kbit_preparation = "peft"`` (``prepare_model_for_kbit_training``, peft/utils/other.py:204-209)
      casts every non-quantized parameter to fp32, so the residual stream, norms, attention and LM head run in
      fp32 (``Linear4bit`` returns its input's dtype): the ``32-true`` trace with 4-bit matmuls in
      ``bnb_4bit_compute_dtype``; ``trl`` casts the adapters to bf16 (trl/trainer/sft_trainer.py:908-911);
    * DeepSpeed with 16-bit weights casts the whole module, LoRA adapters included, to 16 bits
      (runtime/engine.py:2080-2088): the adapters run in the weights' dtype;
    * ``autocast_adapter_dtype = false`` (peft's option): adapters in the weights' dtype;
    * DeepSpeed ZeRO-3 replaces ``F.linear`` by a function that saves its input also for a frozen weight
      (``zero3_linear_saves_input``, builtin/sharding/deepspeed.py)."""
    if load_in_8bit and method != "qlora":
        from fitplan.errors import FitplanError

        raise FitplanError(f"Lora.load_in_8bit quantizes the base model of a LoRA run (k-bit training), not of a {method} "
                           "run", field="load_in_8bit", value=True, suggestion="method = \"qlora\" with load_in_8bit")
    if trainer != "sft" and (load_in_8bit or activation_offloading != "none"):
        from fitplan.errors import FitplanError

        what = "load_in_8bit" if load_in_8bit else "activation_offloading"
        raise FitplanError(f"{what} is modelled for the HF Trainer's step (trainer sft); TRL's {trainer} trainer builds "
                           "its own traces (builtin/trl/), which do not model it", field=what,
                           value=True if load_in_8bit else activation_offloading, suggestion="trainer = \"sft\"")
    if activation_offloading == "unsloth" and not gradient_checkpointing:
        from fitplan.errors import FitplanError

        raise FitplanError("activation_offloading \"unsloth\" is a gradient checkpointing function (it offloads each "
                           "checkpointed layer's input)", field="activation_offloading", value="unsloth",
                           suggestion="gradient_checkpointing = true")
    trace = precision
    if sharding_kind.startswith("hf_fsdp"):
        trace = TRUE_TWIN.get(precision, precision)
    from fitplan.inputs.precision import PRESETS

    adapter = "fp32" if autocast_adapter_dtype else PRESETS[precision].weight_dtype
    if sharding_kind.startswith("hf_fsdp") and PRESETS[precision].autocast:
        shard = adapter
        adapter = PRESETS[precision].compute_dtype  # FSDP gathers the adapters in param_dtype too (module doc)
        if sharding_kind == "hf_fsdp1" and method == "lora":
            adapter += "<" + shard  # peft casts the input to the unsharded adapter's shard dtype (docstring)
    if sharding_kind.startswith("ds") and PRESETS[precision].master:
        adapter = PRESETS[precision].weight_dtype  # DeepSpeed casts every parameter, adapters too (engine.py:2080-2088)
    if method == "qlora":
        if kbit_preparation == "peft" and precision in TRUE_TWIN.values():
            trace = "32-true"
        if kbit_preparation == "trl":
            adapter = "bf16"
    return (trace, adapter, bnb_4bit_compute_dtype or PRESETS[precision].compute_dtype, bool(zero3_linear_saves_input))


@quantity("trace", type="object")
def step_trace_without_checkpointing(arch, per_device_train_batch_size, realized_seq_length, trace_setup, attn_implementation,
                                     method, lora_r, lora_target_modules, lora_dropout, device, framework, loss_implementation,
                                     lora_modules_to_save, activation_offloading, load_in_8bit, gradient_checkpointing,
                                     liger_kernel):
    """The symbolic trace of one step without gradient checkpointing (trace/step_trace.py): saved tensors
    per storage, the forward and backward live-byte timelines. ``flash_attention_2`` saves what SDPA's
    flash kernel saves. ``loss_implementation``: how the loss head runs (trace/loss_heads.py); ``liger_kernel``:
    Liger-Kernel's patch as the Trainer applies it (trace/liger.py);
    ``activation_offloading``: which saved tensors the hooks move to the host (trace/offload.py). With gradient
    checkpointing on, only its forward's figures (``ForwardTrace``): what the activations without checkpointing
    and one layer's share read of it; the step's timelines are the checkpointed trace's (:func:`step_trace`)."""
    precision, adapter, quant, linear_input = trace_setup
    return trace_for(arch, per_device_train_batch_size, realized_seq_length, precision, attn_implementation, False, method,
                     lora_r, lora_target_modules, lora_dropout, device, framework, adapter, quant, linear_input,
                     loss_implementation, lora_modules_to_save, activation_offloading, 8 if load_in_8bit else 4,
                     forward_only=bool(gradient_checkpointing), liger_kernel=liger_kernel)


@quantity("trace", type="object")
def step_trace(step_trace_without_checkpointing, gradient_checkpointing, arch, per_device_train_batch_size,
               realized_seq_length, trace_setup, attn_implementation, method, lora_r, lora_target_modules, lora_dropout,
               device, framework, loss_implementation, lora_modules_to_save, activation_offloading, load_in_8bit,
               liger_kernel):
    """The symbolic trace of one step as configured (with gradient checkpointing when it is on). Refused with
    checkpointing where the learned file names module attributes that keep a tensor with autograd history
    (``arch.kept_graphs``): torch's recomputation then leaves that tensor's recomputed history alive to the next
    forward, which the replay does not model (fitplan-torch learn/keptgraph.py)."""
    if not gradient_checkpointing:
        return step_trace_without_checkpointing
    if arch.kept_graphs:
        raise FitplanError(
            f"{arch.model_type} keeps a tensor with autograd history as a module attribute past its forward "
            f"({', '.join(arch.kept_graphs)}): under gradient checkpointing torch's recomputation leaves that "
            "tensor's recomputed history (every tensor its ancestors in the layer saved) alive until the layer's "
            "next forward, which fitplan does not model", field="gradient_checkpointing", value=True,
            suggestion="gradient_checkpointing = false")
    precision, adapter, quant, linear_input = trace_setup
    return trace_for(arch, per_device_train_batch_size, realized_seq_length, precision, attn_implementation, True, method,
                     lora_r, lora_target_modules, lora_dropout, device, framework, adapter, quant, linear_input,
                     loss_implementation, lora_modules_to_save, activation_offloading, 8 if load_in_8bit else 4,
                     liger_kernel=liger_kernel)


@quantity("bytes")
def activation_bytes_per_layer(step_trace_without_checkpointing):
    """What one decoder layer keeps for backward without checkpointing (a layer after the first, whose
    input already requires grad), from the step trace."""
    t = step_trace_without_checkpointing
    return 0 if t is None else t.layer_bytes


@quantity("bytes")
def activation_bytes_korthikanti(arch, per_device_train_batch_size, realized_seq_length, attn_implementation):
    """Korthikanti et al. 2022 (GPT block, 16-bit): ``L·s·b·h·(34 + 5·a·s/h)``; memory-efficient attention
    drops the ``5·a·s²·b`` term. A named approximation, shown by ``explain`` for comparison."""
    b, s, h, a = per_device_train_batch_size, realized_seq_length, arch.hidden_size, arch.num_attention_heads
    if arch.is_bare:
        return 0
    per = 34 * s * b * h + (5 * a * s * s * b if attn_implementation == "eager" else 0)
    return arch.num_hidden_layers * per


@quantity("bytes", category="memory", label="activations", json_key="memory.per_gpu_bytes.activations", short="activations", row="activations")
def activation_bytes(step_trace_without_checkpointing):
    """Saved activations without checkpointing: everything the forward keeps for the backward except the
    loss head's tensors (``logits_bytes``) and autocast's weight copies, from the step trace (the
    per-block rules are in the module doc and docs/memory-model.md). Checkpointing and tensor
    parallelism are reducers on this value."""
    t = step_trace_without_checkpointing
    return 0 if t is None else t.activation_bytes


@reducer("activation_bytes", when=lambda gradient_checkpointing: gradient_checkpointing)
def gradient_checkpointing(value, step_trace):
    """Full recomputation (Chen et al. 2016; HF ``gradient_checkpointing_enable``, non-reentrant): each
    layer keeps only its arguments (hidden states ``E·b·s·h``, cos/sin, position ids, the eager mask),
    and re-runs its forward when its backward starts (one layer's activations during the backward,
    counted in the peak's timeline). Outside the layers nothing changes."""
    return value if step_trace is None else step_trace.activation_bytes


@reducer("activation_bytes", when=lambda tensor_parallel: tensor_parallel > 1, after=("gradient_checkpointing",))
def tensor_parallel_activations(value, tensor_parallel):
    """Tensor parallelism with sequence parallelism splits saved activations across the t ranks
    (Korthikanti et al. 2022: ``(s·b·h/t)·(34 + 5·a·s/h)``)."""
    return value // tensor_parallel


@quantity("bytes", category="memory", label="logits + loss", json_key="memory.per_gpu_bytes.logits", short="logits", row="logits")
def logits_bytes(step_trace):
    """The loss head's saved tensors (HF ``ForCausalLMLoss``): the fp32 ``log_softmax`` output ``4·b·s·V``
    (the logits are upcast with ``.float()`` first), the shifted labels ``8·b·s`` and nll_loss's 4-byte
    ``total_weight``. The E-byte logits themselves are only alive until the forward returns (peak)."""
    return 0 if step_trace is None else step_trace.logits_bytes


@quantity("bytes", category="memory", label="autocast weight copies", short_label="autocast copies", json_key="memory.per_gpu_bytes.autocast_copies", row="autocast_copies")
def autocast_weight_copy_bytes(step_trace):
    """Autocast (``*-mixed``) casts each trained Linear's fp32 weight to 16-bit once per forward (cached:
    leaf tensors that require grad) and the matmul saves the copy: 2 B per Linear weight element (LM head
    included, embeddings excluded). Frozen weights (LoRA) are cast per use and kept only where the
    input requires grad. With checkpointing the copies inside layers are not kept (recomputed)."""
    return 0 if step_trace is None else step_trace.autocast_copy_bytes


ACTIVATION_OFFLOADING = Setting(
    "activation_offloading", "training", type="text", default="none", choices=OFFLOAD_MODES,
    after="loss_implementation",
    help="none (default) | torchtune (its recipes' enable_activation_offloading: saved tensors to pinned host memory "
         "on a second CUDA stream, the loss outside the hooks) | trl (TRL's OffloadActivations as axolotl's "
         "activation_offloading: true runs it) | trl_sync (without streams: axolotl's legacy) | unsloth (Unsloth's "
         "offloaded checkpointing, LLaMA-Factory's use_unsloth_gc: only the layer inputs). With checkpointing the "
         "layer inputs move.",
    keys={"training_args": "activation_offloading"}, key_values={True: "trl", False: None})
"""The one declaration of ``activation_offloading`` (a field of ``[training]``): saved tensors moved to pinned host
memory in the forward and brought back in the backward: ``torchtune`` (its recipes' ``enable_activation_offloading``:
copies on a second CUDA stream, the last five kept on the GPU, the loss outside the hooks), ``trl`` (TRL's
``OffloadActivations`` as axolotl's ``activation_offloading: true`` runs it: the same, the model's own loss inside the
hooks), ``trl_sync`` (``use_streams=False``, axolotl's ``legacy``); with gradient checkpointing the layer inputs move;
``unsloth`` (Unsloth's offloaded checkpointing, LLaMA-Factory's ``use_unsloth_gc``: only the layer inputs, with
checkpointing) (trace/offload.py ``OFFLOAD_MODES``). TRL's ``SFTConfig.activation_offloading: true`` in a
TrainingArguments JSON is ``trl`` (trl 1.16 trainer/sft_trainer.py: ``training_step`` runs inside
``get_act_offloading_ctx_manager(model)``, with streams, ``lm_head`` under ``NoOpManager``, the model's loss inside;
checkpointing as configured); ``false`` sets nothing. Where it applies: :func:`trace_setup` and the reducers below."""


@quantity("bytes", label="pinned host RAM for offloaded activations")
def activation_offload_host_bytes(step_trace):
    """Activation offloading (``activation_offloading``, trace/offload.py): the pinned host memory one GPU's
    process holds for the tensors its hooks packed in one forward, each pack rounded up to a power of two by the
    caching host allocator (torch 2.13 ``ATen/core/CachingHostAllocator.h``), which keeps the blocks for the next
    step. With gradient checkpointing about one layer input ``E·b·s·h`` per decoder layer. 0 without offloading.
    Reported within ``cpu_offload_bytes`` (JSON ``memory.cpu_offload_bytes``, the table's "CPU RAM (offload)")."""
    return 0 if step_trace is None else step_trace.offload_host_bytes


@quantity("bytes")
def activation_offload_copy_bytes(step_trace):
    """Bytes the offloading hooks copy to the host in one micro-step's forward (and back in its backward)."""
    return 0 if step_trace is None else step_trace.offload_copy_bytes


@reducer("offload_host_bytes", when=lambda activation_offloading: activation_offloading != "none")
def offloaded_activations_on_host(value, activation_offload_host_bytes):
    """Activation offloading adds its pinned host tensors to the host memory of each GPU's process (category
    ``activations``), so ``cpu_offload_bytes`` counts them per node."""
    return {**value, "activations": int(activation_offload_host_bytes)}


@reducer("offload_seconds_per_step", when=lambda activation_offloading: activation_offloading in ("torchtune", "trl"))
def streamed_activation_copies(value, activation_offload_copy_bytes, gradient_accumulation_steps):
    """Activation offloading with streams: every micro-step copies its packed tensors to the host and back on a
    second CUDA stream (torchtune/TRL ``OffloadActivations``), overlapped with the compute as the other offload
    copies are (``exposed_transfer_seconds``): ``2 · copied bytes · k`` at the PCIe host rate."""
    from fitplan.builtin.time.comm import PCIE_HOST_GBPS

    return value + 2 * activation_offload_copy_bytes * gradient_accumulation_steps / (PCIE_HOST_GBPS * 1e9)


@reducer("exposed_transfer_seconds", when=lambda activation_offloading: activation_offloading in ("trl_sync", "unsloth"))
def synchronous_activation_copies(value, activation_offload_copy_bytes, gradient_accumulation_steps):
    """Activation offloading without streams (axolotl's ``legacy``): the copies run on the compute stream (pack:
    ``copy_(non_blocking=True)`` on the current stream; unpack: ``.to("cuda")``), so nothing hides them."""
    from fitplan.builtin.time.comm import PCIE_HOST_GBPS

    if value is None:
        return None
    return value + 2 * activation_offload_copy_bytes * gradient_accumulation_steps / (PCIE_HOST_GBPS * 1e9)


@quantity("routing")
def moe_routing(arch, per_device_train_batch_size, max_seq_length):
    """How MoE memory depends on routing, and what fitplan assumes (None for dense models).

    transformers 5 runs experts with ``grouped_mm`` by default: the b·s tokens are sorted by expert and all
    k·b·s (token, expert) rows go through one grouped matmul per projection, so every saved tensor and
    transient is sized by k·b·s, whatever the router chooses: the activations do not depend on the
    routing. Per expert the rows range from k·b·s/E (balanced routing, what FLOPs and time assume) to
    b·s (a bound: each token visits an expert at most once, so one expert gets at most every token).
    The ``eager`` experts implementation (a Python loop over the experts hit) allocates per expert and is
    not modelled. A learned file whose experts loop over the rows each one received (JetMoE's split by
    ``expert_size``) was learned under balanced routing (``arch.routing``): each expert's rows are
    ``ceil(k·T/E)`` there, the saved activations summed over experts still k·T rows."""
    if not getattr(arch, "num_experts", 0):
        return None
    k, E = arch.num_experts_per_tok or 1, arch.num_experts
    T = int(per_device_train_batch_size) * int(max_seq_length)
    if getattr(arch, "routing", None) == "balanced":
        return {"experts": E, "top_k": k, "expert_rows": k * T, "rows_per_expert_balanced": k * T / E,
                "rows_per_expert_bound": T,
                "assumption": f"experts loop over the rows each one receives; the learned file assumes balanced routing "
                              f"({-(-k * T // E)} rows per expert, rounded up): the saved activations ({k * T} rows over "
                              f"all experts) do not depend on routing, each expert's transient does (at most {T} rows)"}
    return {"experts": E, "top_k": k, "expert_rows": k * T, "rows_per_expert_balanced": k * T / E,
            "rows_per_expert_bound": T,
            "assumption": f"grouped_mm experts: all {k * T} (token, expert) rows are processed together, so memory does "
                          f"not depend on routing; balanced routing ({k * T / E:g} rows per expert) is assumed for "
                          f"FLOPs; one expert receives at most {T} rows"}


@hookimpl
def fitplan_register_quantities(register):
    for q in (trace_setup, step_trace_without_checkpointing, step_trace, activation_bytes_per_layer, activation_bytes_korthikanti, activation_bytes, logits_bytes,
              autocast_weight_copy_bytes, activation_offload_host_bytes, activation_offload_copy_bytes, moe_routing):
        register(q)


@hookimpl
def fitplan_register_reducers(register):
    register(gradient_checkpointing)
    register(tensor_parallel_activations)
    for r in (offloaded_activations_on_host, streamed_activation_copies, synchronous_activation_copies):
        register(r)


LIGER_KERNEL = Setting(
    "liger_kernel", "training", type="bool", default=False, after="activation_offloading",
    help="Liger-Kernel as the HF Trainer applies it (TrainingArguments use_liger_kernel): for the model types whose "
         "patch fitplan models (llama, mistral, ministral, qwen2, qwen3, smollm3) its fused RMSNorm, SwiGLU and RoPE kernels (the loss: "
         "loss_implementation, liger when the model computes it from the labels); a type Liger does not patch runs "
         "unchanged; the others are refused.",
    keys={"training_args": "use_liger_kernel"})
"""The one declaration of ``liger_kernel`` (a field of ``[training]``; trace/liger.py)."""


@hookimpl
def fitplan_register_settings(register):
    register(ACTIVATION_OFFLOADING)
    register(LIGER_KERNEL)
