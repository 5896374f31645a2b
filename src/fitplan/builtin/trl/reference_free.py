"""TRL 1.16's ORPO and CPO steps (``trl.experimental``): preference pairs without a reference model.

``ORPOTrainer`` and ``CPOTrainer`` (trl/experimental/orpo/orpo_trainer.py, trl/experimental/cpo/cpo_trainer.py)
share one step, ``concatenated_forward``, per micro-batch of ``b`` pairs of ``s`` tokens:

1. the batch (``DPODataCollatorWithPadding``, trl/experimental/utils.py): ``chosen_`` and ``rejected_``
   ``input_ids``, ``attention_mask`` and ``labels``, int64 ``b × s`` each (and the prompt's two, ``b × p``:
   not counted, fitplan does not know the prompt's length); ``concatenated_inputs`` concatenates each
   triple into ``2b × s`` (three int64 tensors alive through the forward);
2. one forward of the policy over the ``2b`` sequences with the model's own LM head: the full logits
   ``(2b, s, V)`` (no fused head, no chunking), then the loss (:mod:`fitplan.trace.logits_head`): the NLL term over the
   chosen half (ORPO always, CPO unless ``cpo_alpha == 0``: ``loss_type="alphapo"`` sets it so), the
   per-sequence log-probabilities of all ``2b`` rows, the odds-ratio (ORPO) or CPO loss (``sigmoid``,
   ``hinge``, ``ipo``, ``simpo``: scalars per pair, no bytes that matter);
3. the backward and the optimizer step, as SFT's. No reference model, no no-grad forward.

The phases are SFT's (``forward``, ``backward``, ``optimizer_step``) over ``2b`` sequences. TRL's refusals of a
CPO config are :func:`fitplan.inputs.trl_checks.check_cpo`'s.
"""

from __future__ import annotations

from fitplan.builtin.activations import trace_for
from fitplan.trace.logits_head import FP32_OUTPUTS
from fitplan.engine.declarations import reducer
from fitplan.pluginmgr.hookspecs import hookimpl

REFERENCE_FREE = ("orpo", "cpo")
"""The preference trainers without a reference model modelled here (docs/trl.md)."""


def _is_reference_free(trainer) -> bool:
    return trainer in REFERENCE_FREE


def head(trainer: str, cpo_alpha: float | None, loss_type: str | None, precision: str) -> str:
    """The step trace's loss head (:mod:`fitplan.trace.logits_head`): ORPO's; CPO's with or without the NLL term
    (``cpo_alpha`` default 1.0; ``loss_type="alphapo"`` sets it to 0, ``CPOConfig.__post_init__``); under
    autocast (``precision``'s preset) the twin that reads accelerate's fp32 copy of the logits."""
    from fitplan.inputs.precision import PRESETS

    alpha = 1.0 if cpo_alpha is None else cpo_alpha
    name = "trl_orpo" if trainer == "orpo" else "trl_cpo_no_nll" if loss_type == "alphapo" or alpha == 0 else "trl_cpo"
    preset = PRESETS.get(precision)
    return name + (FP32_OUTPUTS if preset is not None and preset.autocast else "")


def _trace(trainer, cpo_alpha, loss_type, arch, b, s, trace_setup, attn_implementation, ckpt, method, lora_r,
           lora_target_modules, lora_dropout, device, framework, lora_modules_to_save):
    precision, adapter, quant, linear_input = trace_setup
    return trace_for(arch, 2 * b, s, precision, attn_implementation, ckpt, method, lora_r, lora_target_modules,
                     lora_dropout, device, framework, adapter, quant, linear_input,
                     head(trainer, cpo_alpha, loss_type, precision),
                     lora_modules_to_save)


@reducer("step_trace_without_checkpointing", when=lambda trainer: _is_reference_free(trainer))
def reference_free_trace(value, trainer, cpo_alpha, loss_type, arch, per_device_train_batch_size, realized_seq_length,
                         trace_setup, attn_implementation, method, lora_r, lora_target_modules, lora_dropout, device,
                         framework, lora_modules_to_save):
    """ORPO/CPO: the policy's step over ``2·b`` sequences (chosen then rejected, one batch), the model's full
    logits and the trainer's loss (trace/logits_head.py)."""
    if value is None:
        return None
    return _trace(trainer, cpo_alpha, loss_type, arch, per_device_train_batch_size, realized_seq_length, trace_setup,
                  attn_implementation, False, method, lora_r, lora_target_modules, lora_dropout, device, framework,
                  lora_modules_to_save)


@reducer("step_trace", when=lambda trainer: _is_reference_free(trainer))
def reference_free_trace_checkpointed(value, trainer, cpo_alpha, loss_type, arch, per_device_train_batch_size,
                                      realized_seq_length, trace_setup, attn_implementation, gradient_checkpointing,
                                      method, lora_r, lora_target_modules, lora_dropout, device, framework,
                                      lora_modules_to_save):
    """The ORPO/CPO step as configured (:func:`reference_free_trace`, with checkpointing when on)."""
    if value is None:
        return None
    return _trace(trainer, cpo_alpha, loss_type, arch, per_device_train_batch_size, realized_seq_length, trace_setup,
                  attn_implementation, bool(gradient_checkpointing), method, lora_r, lora_target_modules, lora_dropout,
                  device, framework, lora_modules_to_save)


def _rounded(n: int, device, framework) -> int:
    if device == "cuda" and n:
        block = framework.allocator_block_bytes
        return -(-n // block) * block
    return n


@reducer("batch_bytes", when=lambda trainer: _is_reference_free(trainer))
def reference_free_batch(value, arch, per_device_train_batch_size, realized_seq_length, device, framework):
    """``DPODataCollatorWithPadding``: six int64 ``b × s`` tensors (``chosen_``/``rejected_`` ``input_ids``,
    ``attention_mask``, ``labels``); the prompt's two are not counted (module doc)."""
    if arch.is_bare:
        return value
    return 6 * _rounded(8 * per_device_train_batch_size * realized_seq_length, device, framework)


@reducer("phase_rows", when=lambda trainer: _is_reference_free(trainer))
def reference_free_phases(value, arch, per_device_train_batch_size, realized_seq_length, device, framework):
    """The forward also holds ``concatenated_inputs``'s three int64 ``2b × s`` tensors (made before the model's
    forward, gone when ``concatenated_forward`` returns)."""
    if arch.is_bare:
        return value
    rows = {ph: dict(r) for ph, r in value.items()}
    concat = 3 * _rounded(8 * 2 * per_device_train_batch_size * realized_seq_length, device, framework)
    rows["forward"]["temporaries"] = rows["forward"].get("temporaries", 0) + concat
    return rows


@reducer("flops_per_token", when=lambda trainer: _is_reference_free(trainer))
def reference_free_flops_per_token(value):
    """FLOPs per token of an example (a pair): the training FLOPs of both sequences (no reference forward)."""
    return 2 * value


def assumed_lines(trainer: str, beta, cpo_alpha, loss_type) -> list[str]:
    """The report's assumed defaults for ORPO/CPO (``builtin/defaults.py`` adds them in place of the loss's)."""
    out = ["loss the model's full logits (ORPO/CPO: no fused head), per-row log-softmax"]
    if beta is None:
        out.append(f"beta 0.1 ({trainer.upper()}Config default)")
    if trainer == "cpo":
        if loss_type is None:
            out.append("loss_type sigmoid (CPOConfig default)")
        if cpo_alpha is None and loss_type != "alphapo":
            out.append("cpo_alpha 1.0 (CPOConfig default: the NLL term is computed)")
    out.append("no reference model (ORPO/CPO)")
    return out


@hookimpl
def fitplan_register_reducers(register):
    for r in (reference_free_trace, reference_free_trace_checkpointed, reference_free_batch, reference_free_phases,
              reference_free_flops_per_token):
        register(r)
