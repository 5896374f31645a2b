"""The step peak: the maximum of live tensor bytes over a training step, phase by phase.

A steady-state step (the optimizer states exist; ``zero_grad(set_to_none=True)`` freed the gradients)
as the HF Trainer and fitplan-torch run it: ``forward`` (``out = model(**batch); loss = out.loss;
del out``), ``backward`` (``loss.backward()``), ``optimizer_step``. Resident throughout: weights,
master weights, optimizer states, buffers, the batch and communication buffers (``resident_bytes``).

* ``forward``: resident + FSDP's gathered parameters + the most the forward adds at any op (the step trace's forward timeline: saved
  activations accumulating, each op's transients, the logits and their fp32 upcast and log-softmax at
  the end), + the gradients of earlier micro-batches when accumulating (k > 1);
* ``backward``: resident + FSDP's gathered parameters + the maximum over the backward timeline of what is left of the activations,
  the gradients flowing between ops, each op's transients and the parameter gradients produced so far
  (the step trace replays autograd op by op, in reverse order). Typically at the start (the loss
  gradient: two fp32 ``b·s·V`` tensors while everything is still saved) or at the end (every gradient,
  plus the embedding's dense gradient). With k > 1 the gradients already exist: each op only adds the
  gradient it is accumulating;
* ``optimizer_step``: resident + all gradients + the optimizer's step temporaries (foreach AdamW: one
  state-sized list, ``exp_avg_sq.sqrt()``).

``peak_bytes`` is what ``torch.cuda.max_memory_allocated`` (or fitplan-torch's live-storage counter on
the CPU) reports; ``peak_phase`` names the phase it falls in (``forward``, ``backward``,
``optimizer_step``). On ``device = cuda`` every tensor is rounded up to the allocator block (512 B).
"""

from __future__ import annotations

import math

from fitplan.engine.declarations import quantity
from fitplan.pluginmgr.hookspecs import hookimpl

PHASES = ("forward", "backward", "optimizer_step")


@quantity("bytes", category="memory")
def model_state_bytes(weight_bytes, master_weight_bytes, gradient_bytes, optimizer_state_bytes):
    """Weights + master weights + gradients + optimizer states, per GPU after sharding."""
    return weight_bytes + master_weight_bytes + gradient_bytes + optimizer_state_bytes


@quantity("bytes", role="saved")
def saved_for_backward_bytes(activation_bytes, logits_bytes, autocast_weight_copy_bytes):
    """Everything the forward leaves alive for the backward beyond what was alive before it (parameters,
    states and the batch excluded; fitplan-torch's ``retained``): layer activations + the loss head's
    tensors + autocast's 16-bit weight copies. Without checkpointing this is what
    ``saved_tensors_hooks`` sees, less the input ids the embedding saves (they belong to the batch)."""
    return activation_bytes + logits_bytes + autocast_weight_copy_bytes


@quantity("bytes")
def buffer_bytes(step_trace):
    """The model's buffers: rotary ``inv_freq`` and ``original_inv_freq`` (``d_rot/2`` fp32 each, whatever the
    model dtype) and Gemma's 0-d ``embed_scale`` (in the model's dtype)."""
    return 0 if step_trace is None else step_trace.buffer_bytes


@quantity("bytes")
def batch_bytes(arch, per_device_train_batch_size, max_seq_length, device, framework):
    """The micro-batch on the device: ``input_ids`` and ``labels``, int64 ``b·s`` each (no attention mask:
    packed or unpadded batches)."""
    if arch.is_bare:
        return 0
    return 2 * _round(8 * per_device_train_batch_size * max_seq_length, device, framework)


def _round(n: int, device: str, framework) -> int:
    if device != "cuda" or n == 0:
        return int(n)
    block = framework.allocator_block_bytes
    return int(-(-n // block) * block)


@quantity("bytes")
def allocator_rounding_bytes(trainable_tensors, arch, weight_dtype_bytes, trainable_dtype_bytes, optimizer_spec,
                             optimizer_state_dtype_bytes, method, device, framework):
    """CUDA's caching allocator rounds every block up to ``allocator_block_bytes`` (512 B, ``[framework]``):
    the bytes this adds to the model states (one block per parameter, gradient and per-element optimizer
    state tensor). Small tensors (norms, biases) lose most. 0 on the CPU."""
    if device != "cuda" or arch.is_bare:
        return 0
    block = framework.allocator_block_bytes

    def pad(n_bytes: float) -> float:
        return -(-n_bytes // block) * block - n_bytes if n_bytes else 0

    total = 0.0
    for g in arch.param_groups():
        total += pad(g.numel * weight_dtype_bytes) * g.count
    states = int(optimizer_spec.states_per_param)
    for shape, count in trainable_tensors:
        n = math.prod(shape)
        adapters = 2 if method != "full" else 1  # LoRA adapters: their weights and their gradients
        total += pad(n * trainable_dtype_bytes) * count * adapters
        total += pad(n * optimizer_state_dtype_bytes) * count * states
    return int(total)


@quantity("bytes")
def resident_bytes(weight_bytes, master_weight_bytes, optimizer_state_bytes, buffer_bytes, batch_bytes,
                   comm_buffer_bytes):
    """Alive for the whole step: weights, master weights, optimizer states, buffers, the batch and the
    communication buffers (DDP's gradient buckets, DeepSpeed's reduce bucket)."""
    return weight_bytes + master_weight_bytes + optimizer_state_bytes + buffer_bytes + batch_bytes + comm_buffer_bytes


@quantity("bytes", json_key="memory.phases_bytes", type="object")
def phase_bytes(step_trace, resident_bytes, gradient_bytes, optimizer_step_temp_bytes, saved_for_backward_bytes,
                gradient_accumulation_steps, allocator_rounding_bytes, gathered_param_bytes):
    """The peak of live bytes within each phase of a step (see the module doc): ``forward``,
    ``backward``, ``optimizer_step``."""
    resident = resident_bytes + allocator_rounding_bytes
    gf, gb = gathered_param_bytes["forward"], gathered_param_bytes["backward"]
    if step_trace is None:  # a bare parameter count: activations as estimated, no timeline
        act = saved_for_backward_bytes
        return {"forward": resident + gf + act, "backward": resident + gb + act + gradient_bytes // 32,
                "optimizer_step": resident + gradient_bytes + optimizer_step_temp_bytes}
    t = step_trace
    act_scale = saved_for_backward_bytes / t.retained_bytes if t.retained_bytes else 1.0
    grad_scale = gradient_bytes / t.param_grad_bytes if t.param_grad_bytes else 0.0
    carried = gradient_bytes if gradient_accumulation_steps > 1 else 0
    loss = t.loss_bytes  # loss.detach(), kept for logging, shares the loss's storage
    before = resident + (carried + loss if carried else 0)
    forward = max(before + gf + int(t.forward_peak_bytes * act_scale),
                  before + gathered_param_bytes["forward_spike"] + int(t.forward_before_last_layer_bytes * act_scale)
                  if gathered_param_bytes["forward_spike"] else 0)
    if carried:
        backward = carried + loss + max(a * act_scale + o * grad_scale for a, o in t.backward_frontier_accumulating)
    else:
        backward = max(a * act_scale + g * grad_scale for a, g in t.backward_frontier)
    if gathered_param_bytes.get("backward_in_layer"):
        # FSDP stage 3 inside a layer's backward: prefetched next layer, unsharded gradients (sharding.py)
        in_layer = max((a * act_scale + g * grad_scale for a, g in t.backward_frontier_layers), default=0)
        backward = max(backward, in_layer + gathered_param_bytes["backward_in_layer"] - gb)
    return {
        "forward": int(forward),
        "backward": int(resident + gb + backward),
        "optimizer_step": int(resident + gradient_bytes + optimizer_step_temp_bytes + loss),
    }


@quantity("phase", json_key="memory.peak_phase", type="text")
def peak_phase(phase_bytes):
    """The phase of the step where the peak falls: ``forward``, ``backward`` or ``optimizer_step``."""
    return max(phase_bytes, key=phase_bytes.__getitem__)


@quantity("bytes", category="memory", label="peak", json_key="memory.per_gpu_bytes.peak", short="peak", role="peak")
def peak_bytes(phase_bytes, peak_phase):
    """Peak of allocated tensor bytes in one step: the maximum over its phases."""
    return phase_bytes[peak_phase]


@hookimpl
def fitplan_register_quantities(register):
    for q in (model_state_bytes, saved_for_backward_bytes, buffer_bytes, batch_bytes, allocator_rounding_bytes,
              resident_bytes, phase_bytes, peak_phase, peak_bytes):
        register(q)
