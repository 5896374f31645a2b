"""TRL 1.16's DPO and KTO steps: the policy over its batch of sequences, the reference model, their phases.

KTO (``KTOTrainer._compute_loss``, trl/trainer/kto_trainer.py) is the same step over ``b`` unpaired sequences
with three no-grad forwards instead of one (the policy's KL forward before its own, the reference model's KL
and main forwards after it), and a batch with ``KL_`` twins: the tables below say what differs; docs/trl.md
has both. DPO:

``DPOTrainer._compute_loss`` (trl/trainer/dpo_trainer.py) runs, per micro-batch:

1. the policy's forward over the collated batch: ``DataCollatorForPreference`` puts the ``b`` chosen and the
   ``b`` rejected sequences (prompt + completion, padded to the longest) in one ``(2b, s)`` batch with its
   ``attention_mask`` and ``completion_mask`` (int64 each); ``labels`` (``input_ids`` with the prompt
   masked to -100, int64) are made before the forward and live until the loss returns. The model is
   called with ``fused_lm_head=True``: TRL's fused head (:mod:`.fused_head`) instead of logits and
   cross-entropy. fitplan's step trace replays this forward at batch ``2b`` with that head;
2. the reference forward, after the policy's and under ``torch.no_grad()``: a second full model
   (``ref_model``, loaded in the policy's dtype, ``create_model_from_path``; its fused head asks for
   log-probabilities only) for full fine-tuning, the policy itself with its adapters disabled
   (``use_adapter``, peft's base model: no second copy) under LoRA, none with ``precompute_ref_log_probs``
   (computed once before training, ``_precompute_ref_logps``). Everything the policy's forward saved for
   backward is alive meanwhile: its peak is a phase of its own, ``reference_forward``: resident + the
   reference weights + the policy's saved tensors + the most the no-grad forward holds (a trace of the same
   model with no parameter training, :attr:`~fitplan.trace.step_trace.TraceSpec.frozen`);
3. the loss (``-logsigmoid(beta · ...)`` over ``2b`` sums: bytes), the backward, the optimizer step.

The reference model's weights are resident for the whole step (``reference_model_bytes``, shown in the
breakdown's ``weights`` row).
"""

from __future__ import annotations

from fitplan.builtin.activations import trace_for
from fitplan.trace.step_trace import PARTS, TraceSpec, build, trace_precision
from fitplan.engine.declarations import quantity, reducer
from fitplan.pluginmgr.hookspecs import hookimpl

PREFERENCE = ("dpo", "kto")
"""The preference trainers modelled here (docs/trl.md)."""
BETA = {"dpo": 0.1, "kto": 0.1}
"""TRL 1.16's default ``beta`` per trainer (trl/trainer/dpo_config.py, kto_config.py)."""
ROWS = {"dpo": 2, "kto": 1}
"""Sequences per example in the policy's batch: DPO's chosen and rejected, KTO's one completion."""
HEAD = {"dpo": "trl", "kto": "trl_kto"}
"""The policy's fused head (trace/fused_head.py ``OUTPUTS``)."""
BATCH_TENSORS = {"dpo": 3, "kto": 6}
"""int64 ``rows × s`` tensors of the collated batch: DPO's ``input_ids``, ``attention_mask``,
``completion_mask``; KTO's the same three and their ``KL_`` twins (``DataCollatorForUnpairedPreference``)."""
REFERENCE_FORWARDS = {"dpo": 1, "kto": 3}
"""No-grad forwards of ``rows × s`` per micro-batch: DPO's reference forward; KTO's KL forward of the policy
(``_compute_kl_logps``, before its forward), and the reference model's KL and main forwards."""


def _is_preference(trainer) -> bool:
    return trainer in PREFERENCE


def _policy_trace(trainer, arch, b, s, trace_setup, attn_implementation, ckpt, method, lora_r, lora_target_modules,
                  lora_dropout, device, framework, lora_modules_to_save):
    precision, adapter, quant, linear_input = trace_setup
    return trace_for(arch, ROWS[trainer] * b, s, precision, attn_implementation, ckpt, method, lora_r,
                     lora_target_modules, lora_dropout, device, framework, adapter, quant, linear_input, HEAD[trainer],
                     lora_modules_to_save)


@reducer("step_trace_without_checkpointing", when=lambda trainer: _is_preference(trainer))
def preference_policy_trace(value, trainer, arch, per_device_train_batch_size, realized_seq_length, trace_setup,
                            attn_implementation, method, lora_r, lora_target_modules, lora_dropout, device, framework,
                            lora_modules_to_save):
    """DPO: the policy's step over ``2·b`` sequences (chosen then rejected, one batch), KTO: over ``b``, with
    TRL's fused LM head (trace/fused_head.py) instead of the model's logits and cross-entropy."""
    if value is None:
        return None
    return _policy_trace(trainer, arch, per_device_train_batch_size, realized_seq_length, trace_setup, attn_implementation,
                         False, method, lora_r, lora_target_modules, lora_dropout, device, framework,
                         lora_modules_to_save)


@reducer("step_trace", when=lambda trainer: _is_preference(trainer))
def preference_policy_trace_checkpointed(value, trainer, arch, per_device_train_batch_size, realized_seq_length, trace_setup,
                                         attn_implementation, gradient_checkpointing, method, lora_r,
                                         lora_target_modules, lora_dropout, device, framework,
                                         lora_modules_to_save):
    """The policy's step as configured (:func:`preference_policy_trace`, with checkpointing when on)."""
    if value is None:
        return None
    return _policy_trace(trainer, arch, per_device_train_batch_size, realized_seq_length, trace_setup, attn_implementation,
                         bool(gradient_checkpointing), method, lora_r, lora_target_modules, lora_dropout, device,
                         framework, lora_modules_to_save)


@reducer("batch_bytes", when=lambda trainer: _is_preference(trainer))
def preference_batch(value, trainer, arch, per_device_train_batch_size, realized_seq_length, device, framework):
    """The collated batch (:data:`BATCH_TENSORS`): DPO's ``DataCollatorForPreference``, int64 ``2b × s`` each
    (trl/trainer/dpo_trainer.py ``torch_call``); KTO's ``DataCollatorForUnpairedPreference``, int64 ``b × s``
    each, and its ``label`` (one byte per example: bool labels) (trl/trainer/kto_trainer.py ``torch_call``)."""
    if arch.is_bare:
        return value

    def rounded(n: int) -> int:
        if device == "cuda" and n:
            block = framework.allocator_block_bytes
            return -(-n // block) * block
        return n

    b = per_device_train_batch_size
    out = BATCH_TENSORS[trainer] * rounded(8 * ROWS[trainer] * b * realized_seq_length)
    return out + (rounded(b) if trainer == "kto" else 0)


@quantity("bytes", category="memory", label="reference model", short="reference")
def reference_model_bytes(trainer, method, precompute_ref_log_probs, weight_bytes, buffer_bytes):
    """The reference model kept beside the policy: full fine-tuning without ``precompute_ref_log_probs``, a
    second copy of the weights in the policy's dtype and its buffers (``DPOTrainer.__init__``: ``ref_model``
    from ``create_model_from_path`` with ``dtype=self.model.dtype``, prepared for evaluation); 0 under LoRA
    (the adapters are disabled for the reference forward) and with precomputed log-probabilities. 0 for the
    other trainers."""
    if not _is_preference(trainer) or method != "full" or precompute_ref_log_probs:
        return 0
    return int(weight_bytes + buffer_bytes)


@quantity("trace", type="object")
def reference_trace(trainer, method, precompute_ref_log_probs, arch, per_device_train_batch_size, realized_seq_length,
                    trace_setup, attn_implementation, device, framework):
    """The reference forward as a step trace (``torch.no_grad()``: nothing saved): the model at the policy's
    batch (``2·b`` for DPO, ``b`` for KTO) with no parameter training; under LoRA the policy's base with its adapters disabled (peft
    ``lora.Linear.forward`` calls ``base_layer`` alone) and the policy's fused head (every output), for a
    separate reference model its own head (log-probabilities only). None without a reference forward."""
    if not _is_preference(trainer) or precompute_ref_log_probs or arch.is_bare:
        return None
    precision = trace_precision(trace_setup[0])  # presets with the same trace share it
    block = framework.allocator_block_bytes if framework is not None else 512
    attn = "sdpa" if attn_implementation == "flash_attention_2" else attn_implementation
    spec = TraceSpec(arch, ROWS[trainer] * int(per_device_train_batch_size), int(realized_seq_length), precision, attn,
                     False, device=device, block=int(block), loss="trl_logp" if method == "full" else HEAD[trainer],
                     frozen=True)
    return build(spec)


@quantity("bytes")
def reference_forward_bytes(reference_trace, reference_model_bytes, step_trace_without_checkpointing):
    """The most the reference forward adds over what was alive before it (:func:`reference_trace`'s forward
    peak; 0 without a reference forward). A separate reference model under autocast over fp32 weights adds
    the 16-bit copies of its Linear weights: they require grad (``create_model_from_path`` leaves them so), so
    autocast caches each cast (torch's ``cached_cast``: fp32 leaf that requires grad, whatever the grad mode)
    until the autocast context that wraps the whole loss exits: as many bytes as the policy's own autocast
    copies (the same Linears; the fused head casts the LM head explicitly, uncached)."""
    if reference_trace is None:
        return 0
    cache = step_trace_without_checkpointing.autocast_copy_bytes if reference_model_bytes else 0
    return int(reference_trace.forward_peak_bytes + cache)


@reducer("micro_step_time", when=lambda trainer: _is_preference(trainer))
def reference_forward_time(value, trainer, reference_trace, gpu_spec, kernel_efficiency, torch_compile, tf32,
                           tensor_parallel):
    """The micro-step adds the no-grad forwards (:data:`REFERENCE_FORWARDS`: DPO's reference forward, KTO's
    three): the roofline over :func:`reference_trace`'s kernels (nothing to differentiate) times their count,
    added by kernel class and phase, and kept as ``reference_forward``. The policy's forward and backward are
    already over its batch (its trace)."""
    if value is None or reference_trace is None or kernel_efficiency is None or "gpu" not in value:
        return value
    from fitplan.builtin.time import roofline

    ts = roofline.terms(reference_trace.work, gpu_spec.peak_tflops, gpu_spec.bandwidth_gbps,
                        compiled=bool(torch_compile), tf32=bool(tf32), split=tensor_parallel)
    ref = roofline.price(ts, kernel_efficiency)
    out = dict(value)
    n = REFERENCE_FORWARDS[trainer]
    for k, v in ref.items():
        out[k] = out.get(k, 0.0) + n * v
    out["reference_forward"] = n * ref["micro_step"]
    return out


@quantity("bytes")
def preference_loss_inputs_bytes(trainer, arch, per_device_train_batch_size, realized_seq_length):
    """``labels`` (int64 ``rows × s``, made before the policy's forward) and the fused head's bool label mask
    (``rows × (s-1)``, kept in its output): alive through the forwards until the loss returns."""
    if not _is_preference(trainer) or arch.is_bare:
        return 0
    rows = ROWS[trainer] * per_device_train_batch_size
    return 8 * rows * realized_seq_length + rows * (realized_seq_length - 1)


@quantity("bytes")
def reference_phase_inputs_bytes(trainer, preference_loss_inputs_bytes):
    """What the reference phase holds beside the reference forward's own peak: the labels and mask of
    :func:`preference_loss_inputs_bytes`, and for KTO the KL forward's ``KL_labels`` and mask (same sizes:
    ``_compute_kl_logps`` makes them, the reference model's KL forward runs with the completion's labels
    alive)."""
    return preference_loss_inputs_bytes * (2 if trainer == "kto" else 1)


@reducer("phase_rows", when=lambda trainer: _is_preference(trainer))
def preference_phases(value, reference_model_bytes, reference_forward_bytes, preference_loss_inputs_bytes,
                      reference_phase_inputs_bytes, activation_bytes, logits_bytes, autocast_weight_copy_bytes,
                      precompute_ref_log_probs):
    """The phases (module doc): the reference model's weights in every phase (in the ``weights`` row), the
    labels in the forward, and the
    ``reference_forward`` phase: the forward's resident rows + the policy's saved tensors + the reference
    forward's peak and the labels (temporaries)."""
    rows = {ph: dict(r) for ph, r in value.items()}
    for r in rows.values():  # the breakdown's weights row (a row of its own would recolour every SFT chart)
        r["weights"] = r.get("weights", 0) + reference_model_bytes
    rows["forward"]["temporaries"] = rows["forward"].get("temporaries", 0) + preference_loss_inputs_bytes
    if not precompute_ref_log_probs:
        ref = {k: v for k, v in rows["forward"].items() if k not in PARTS}
        ref.update(activations=activation_bytes, logits=logits_bytes, autocast_copies=autocast_weight_copy_bytes,
                   temporaries=reference_forward_bytes + reference_phase_inputs_bytes)
        rows = {"forward": rows["forward"], "reference_forward": ref,
                **{k: v for k, v in rows.items() if k != "forward"}}
    return rows


@reducer("flops_per_token", when=lambda trainer: _is_preference(trainer))
def preference_flops_per_token(value, trainer, flops_param_count, attention_flops_per_token, precompute_ref_log_probs):
    """FLOPs per token of an example. DPO (a pair: its chosen and its rejected sequence, each ``s`` tokens):
    the policy's training FLOPs twice, and the reference forward of both sequences, ``2·(2·N + 4·L·h·s)``
    (the forward third of ``attention_flops_per_token``). KTO: the policy's training FLOPs, and three
    forwards (the policy's KL forward, the reference model's KL and main forwards), ``3·(2·N + 4·L·h·s)``.
    Precomputed reference log-probabilities drop the reference model's forwards."""
    fwd = 2 * flops_param_count + attention_flops_per_token / 3
    n = REFERENCE_FORWARDS[trainer] - (0 if not precompute_ref_log_probs else 1 if trainer == "dpo" else 2)
    return ROWS[trainer] * (value + n * fwd)


def assumed_lines(trainer, beta, method, precompute_ref_log_probs) -> list[str]:
    """The preference trainers' phrases for the report's assumed defaults (``builtin/defaults.py`` adds them in
    place of the loss's): TRL's fused LM head for the loss (whatever ``loss_implementation``), ``beta`` when not
    given (``DPOConfig.beta`` / ``KTOConfig.beta``, 0.1; it changes no byte or FLOP), and the reference model
    (module doc)."""
    out = ["loss TRL fused LM head (chunked log-probs, no logits)"]
    if beta is None:
        out.append(f"beta {BETA[trainer]} ({trainer.upper()}Config default)")
    if precompute_ref_log_probs:
        out.append("reference log-probs precomputed (no reference model in the step)")
    elif method == "full":
        out.append("reference model: a second copy of the weights (no ref_model given)")
    else:
        out.append("reference model: the policy with its adapters disabled")
    return out


@hookimpl
def fitplan_register_quantities(register):
    for q in (reference_model_bytes, reference_trace, reference_forward_bytes, preference_loss_inputs_bytes,
              reference_phase_inputs_bytes):
        register(q)


@hookimpl
def fitplan_register_reducers(register):
    for r in (preference_policy_trace, preference_policy_trace_checkpointed, preference_batch, preference_phases,
              reference_forward_time, preference_flops_per_token):
        register(r)
