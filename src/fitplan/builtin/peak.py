"""The step peak: the maximum of live tensor bytes over the phases of one training step.

Phases (a steady-state step: states exist, ``zero_grad(set_to_none=True)`` freed the gradients):

* ``forward``: weights, master weights, optimizer states, saved activations, logits, autocast copies,
  communication buffers, and the gradients of earlier micro-steps when accumulating (k > 1);
* ``backward_start``: the same plus the loss-gradient temporaries and the first gradients backward produces;
* ``backward_end``: activations are freed, every gradient exists;
* ``optimizer_step``: all model states plus the optimizer's step temporaries.

``peak_bytes`` is comparable to ``torch.cuda.max_memory_allocated``; ``peak_phase`` names where it falls.
"""

from __future__ import annotations

from ..declarations import quantity
from ..hookspecs import hookimpl


@quantity("bytes", category="memory")
def model_state_bytes(weight_bytes, master_weight_bytes, gradient_bytes, optimizer_state_bytes):
    """Weights + master weights + gradients + optimizer states, per GPU after sharding."""
    return weight_bytes + master_weight_bytes + gradient_bytes + optimizer_state_bytes


@quantity("bytes")
def saved_for_backward_bytes(activation_bytes, logits_bytes, autocast_weight_copy_bytes):
    """Everything autograd keeps for backward (what ``saved_tensors_hooks`` sees, parameters excluded):
    layer activations + logits/loss tensors + autocast's 16-bit weight copies."""
    return activation_bytes + logits_bytes + autocast_weight_copy_bytes


@quantity("bytes")
def backward_first_grad_bytes(arch, method, gradient_bytes, param_count):
    """Gradients that already exist while almost every activation is still alive: those of the first
    modules backward reaches, the LM head (``V·h``) and the last decoder layer (full fine-tuning), or one
    layer's adapters (LoRA), as a share of ``gradient_bytes`` (so sharding applies to them too)."""
    if arch.family == "bare":
        return gradient_bytes // 32
    if method != "full":
        return gradient_bytes // arch.num_hidden_layers
    layer = sum(g.total for g in arch.param_groups() if g.layer) // arch.num_hidden_layers
    share = (arch.vocab_size * arch.hidden_size + layer) / param_count
    return int(gradient_bytes * min(1.0, share))


@quantity("bytes")
def phase_bytes(weight_bytes, master_weight_bytes, gradient_bytes, optimizer_state_bytes, activation_bytes, logits_bytes,
                autocast_weight_copy_bytes, loss_backward_temp_bytes, optimizer_step_temp_bytes, comm_buffer_bytes,
                gradient_accumulation_steps, backward_first_grad_bytes):
    """Live bytes at the end of each phase of a step (see the module doc)."""
    resident = weight_bytes + master_weight_bytes + optimizer_state_bytes
    carried = gradient_bytes if gradient_accumulation_steps > 1 else 0
    fwd = resident + carried + activation_bytes + logits_bytes + autocast_weight_copy_bytes + (comm_buffer_bytes if carried else 0)
    return {
        "forward": fwd,
        "backward_start": fwd + loss_backward_temp_bytes + (0 if carried else backward_first_grad_bytes),
        "backward_end": resident + gradient_bytes + comm_buffer_bytes,
        "optimizer_step": resident + gradient_bytes + optimizer_step_temp_bytes,
    }


@quantity("phase")
def peak_phase(phase_bytes):
    """The phase of the step where the peak falls."""
    return max(phase_bytes, key=phase_bytes.__getitem__)


@quantity("bytes", category="memory")
def peak_bytes(phase_bytes, peak_phase):
    """Peak of allocated tensor bytes in one step: the maximum over its phases."""
    return phase_bytes[peak_phase]


@hookimpl
def fitplan_register_quantities(register):
    for q in (model_state_bytes, saved_for_backward_bytes, backward_first_grad_bytes, phase_bytes, peak_phase, peak_bytes):
        register(q)
