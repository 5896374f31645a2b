"""The step peak: the maximum of live tensor bytes over a training step, phase by phase.

A steady-state step, the second or any later one (the optimizer states exist; ``zero_grad(set_to_none=True)``
freed the gradients) as the HF Trainer and fitplan-torch run it: ``forward`` (``out = model(**batch);
loss = out.loss; del out``), ``backward`` (``loss.backward()``), ``optimizer_step``. Resident throughout: weights,
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

torchtune's ``optimizer_in_bwd`` (recipes/full_finetune_single_device.py, ``training/memory.py``
``register_optim_in_bwd_hooks``: one optimizer per parameter, ``step()`` and ``zero_grad()`` in the parameter's
post-accumulate-grad hook) holds no gradient after the op that completes it: the backward's instants are what is
left of the activations plus the gradients that op completed and the step temporaries of their parameters (the
optimizer's step temporaries in proportion to their bytes); the ``optimizer_step`` phase holds no gradient.

``peak_bytes`` is what ``torch.cuda.max_memory_allocated`` (or fitplan-torch's live-storage counter on
the CPU) reports; ``peak_phase`` names the phase it falls in (``forward``, ``backward``,
``optimizer_step``). On ``device = cuda`` every tensor is rounded up to the allocator block (512 B).
"""

from __future__ import annotations

import functools
import math

from fitplan.trace.step_trace import PARTS
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
def batch_bytes(arch, per_device_train_batch_size, realized_seq_length, device, framework):
    """The micro-batch on the device: ``input_ids`` and ``labels``, int64 ``b·s`` each (no attention mask:
    packed or unpadded batches)."""
    if arch.is_bare:
        return 0
    return 2 * _round(8 * per_device_train_batch_size * realized_seq_length, device, framework)


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
    adapters = 2 if method != "full" else 1  # LoRA adapters: their weights and their gradients
    args = (trainable_tensors, arch, weight_dtype_bytes, trainable_dtype_bytes, int(optimizer_spec.states_per_param),
            optimizer_state_dtype_bytes, adapters, framework.allocator_block_bytes)
    try:
        return _rounding(*args)
    except TypeError:  # a plugin's reducer made the tensors a list (unhashable): computed, not memoized
        return _rounding.__wrapped__(*args)


@functools.lru_cache(maxsize=256)
def _rounding(trainable_tensors, arch, weight_dtype_bytes, trainable_dtype_bytes, states, optimizer_state_dtype_bytes,
              adapters, block) -> int:
    """:func:`allocator_rounding_bytes` once per distinct input (a pure function of its arguments; a search
    varies micro-batch and sequence length, which it does not read)."""

    def pad(n_bytes: float) -> float:
        return -(-n_bytes // block) * block - n_bytes if n_bytes else 0

    total = 0.0
    for g in arch.param_groups():
        total += pad(g.numel * weight_dtype_bytes) * g.count
    for shape, count in trainable_tensors:
        n = math.prod(shape)
        total += pad(n * trainable_dtype_bytes) * count * adapters
        total += pad(n * optimizer_state_dtype_bytes) * count * states
    return int(total)


def _add(rows: dict[str, float], **parts: float) -> dict[str, float]:
    for k, v in parts.items():
        rows[k] = rows.get(k, 0) + v
    return rows


def _scaled(parts, scale: float) -> dict[str, float]:
    """A trace's PARTS (saved activations, logits, autocast copies, temporaries) scaled like its bytes."""
    return {k: v * scale for k, v in zip(PARTS, parts)}


def _exact(rows: dict[str, float], total: int) -> dict[str, int]:
    """``rows`` as integers summing to ``total`` exactly: the phase's value is computed in floats and truncated
    once, so the rounding (a few bytes) is carried by ``temporaries``."""
    out = {k: int(v) for k, v in rows.items()}
    out["temporaries"] = out.get("temporaries", 0) + total - sum(out.values())
    return out


@quantity("bytes", type="object")
def phase_rows(step_trace, weight_bytes, master_weight_bytes, optimizer_state_bytes, comm_buffer_bytes,
               other_resident_bytes, gradient_bytes, optimizer_step_temp_bytes, saved_for_backward_bytes,
               activation_bytes, logits_bytes, autocast_weight_copy_bytes, gradient_accumulation_steps,
               gathered_param_bytes, optimizer_in_bwd, num_gpus):
    """The peak of live bytes within each phase of a step (see the module doc), as breakdown rows: weights,
    master weights, optimizer states, communication buffers, other (buffers, batch, allocator rounding, the
    logged loss), gathered parameters, gradients, and what the step trace says the rest is at the peak instant
    (saved activations, logits and loss, autocast copies, temporaries). Each phase's rows sum to its peak.

    The stack's terms (``gathered_param_bytes``, builtin/sharding) add gathered parameters, say how gradients
    are held in the backward (``grad_mode``: ``accumulate``, every gradient kept; ``bucketed``, each gradient
    leaves for a bucket as it is produced, DeepSpeed ZeRO-2/3), keep a persistent gradient partition
    (``persistent_grads``) and replace the optimizer step's bytes (``step``: DeepSpeed's flattened fp32
    partition gradients and its group-by-group temporaries)."""
    stack = gathered_param_bytes
    resident = dict(weights=weight_bytes, master_weights=master_weight_bytes, optimizer_states=optimizer_state_bytes,
                    comm_buffers=comm_buffer_bytes, other=other_resident_bytes,
                    gradients=gradient_bytes if stack.get("persistent_grads") else 0)
    gf, gb = stack["forward"], stack["backward"]
    step_total = stack.get("step")
    if step_total is None:
        step_parts = dict(gradients=gradient_bytes, temporaries=optimizer_step_temp_bytes)
    else:
        grads = min(gradient_bytes, step_total)
        step_parts = dict(gradients=grads, temporaries=step_total - grads)
    if step_trace is None:  # a bare parameter count: activations as estimated, no timeline
        saved = dict(activations=activation_bytes, logits=logits_bytes, autocast_copies=autocast_weight_copy_bytes)
        rows = {"forward": _add(dict(resident), gathered_params=gf, **saved),
                "backward": _add(dict(resident), gathered_params=gb, gradients=gradient_bytes // 32, **saved),
                "optimizer_step": _add(dict(resident), **step_parts)}
        return {ph: _exact(r, int(sum(r.values()))) for ph, r in rows.items()}
    t = step_trace
    act_scale = saved_for_backward_bytes / t.retained_bytes if t.retained_bytes else 1.0
    carried = gradient_bytes if gradient_accumulation_steps > 1 else 0
    loss = t.loss_bytes  # loss.detach(), kept for logging, shares the loss's storage
    before = _add(dict(resident), gradients=carried, other=loss if carried else 0)
    forward = _add(dict(before), gathered_params=gf, **_scaled(t.forward_peak_parts, act_scale))
    if stack["forward_spike"]:
        spike = _add(dict(before), gathered_params=stack["forward_spike"],
                     **_scaled(t.forward_before_last_layer_parts, act_scale))
        forward = max(forward, spike, key=lambda r: sum(r.values()))
    if optimizer_in_bwd:
        _single_stack(stack, num_gpus)
        backward = _in_backward_rows(t, resident, gb, act_scale, optimizer_step_temp_bytes)
        step_parts = {}
    else:
        backward = _backward_rows(t, resident, gb, stack, act_scale, gradient_bytes, carried, loss)
    step = _add(dict(resident), other=loss, **step_parts)
    return {"forward": _exact(forward, int(sum(forward.values()))),
            "backward": _exact(backward, int(sum(backward.values()))),
            "optimizer_step": _exact(step, int(sum(step.values())))}


def _point(resident, gathered, act_scale, a, grads, temporaries=0.0, t=None) -> dict[str, float]:
    """The rows of one backward instant: resident, gathered parameters, gradients, the trace's parts of ``a``."""
    return _add(dict(resident), gathered_params=gathered, gradients=grads,
                **_add(_scaled(t.parts_of(a), act_scale), temporaries=temporaries))


def _backward_rows(t, resident, gb, stack, act_scale, gradient_bytes, carried, loss) -> dict[str, float]:
    """The backward phase's rows at its peak instant: the frontier point with the most live bytes."""
    grad_scale = stack.get("backward_grads", gradient_bytes) / t.param_grad_bytes if t.param_grad_bytes else 0.0
    if carried:
        a, o = max(t.backward_frontier_accumulating, key=lambda p: p[0] * act_scale + p[1] * grad_scale)
        return _add(_point(resident, gb, act_scale, a, carried, o * grad_scale, t), other=loss)
    if stack.get("grad_mode") == "bucketed":
        return _bucketed_rows(t, resident, gb, stack, act_scale)
    first = stack.get("grad_first", 0)
    a, g = max(t.backward_frontier, key=lambda p: p[0] * act_scale + p[1] * grad_scale + (first if p[1] else 0))
    rows = _point(resident, gb, act_scale, a, g * grad_scale + (first if g else 0), t=t)
    candidates = [rows]
    if stack.get("reduce_end"):  # DeepSpeed ZeRO-0/1 reduce every gradient when the backward ends
        a, g = t.backward_frontier[-1]
        candidates.append(_point(resident, gb, act_scale, a, g * grad_scale + stack["reduce_end"], t=t))
    if stack.get("backward_in_layer") and t.backward_frontier_layers:
        # FSDP stage 3 inside a layer's backward: prefetched next layer, unsharded gradients (sharding.py)
        a2, g2 = max(t.backward_frontier_layers, key=lambda p: p[0] * act_scale + p[1] * grad_scale)
        candidates.append(_point(resident, stack["backward_in_layer"], act_scale, a2, g2 * grad_scale, t=t))
    return max(candidates, key=lambda r: sum(r.values()))


def _single_stack(stack, num_gpus) -> None:
    """``optimizer_in_bwd`` is modelled on one GPU (torchtune's single-device recipes)."""
    if num_gpus > 1 or any(stack.get(k) for k in ("forward", "backward", "grad_mode", "step")):
        from fitplan.errors import FitplanError

        raise FitplanError("optimizer_in_bwd is modelled on one GPU without ZeRO or FSDP (torchtune's single-device "
                           "recipes); fitplan does not estimate it sharded", field="optimizer_in_bwd", value=True,
                           suggestion="num_gpus = 1 without deepspeed or fsdp, or optimizer_in_bwd = false")


def _in_backward_rows(t, resident, gb, act_scale, step_temp) -> dict[str, float]:
    """``optimizer_in_bwd`` (module doc): the backward instant with the most activations + the gradients the op
    completed + their parameters' step temporaries (``step_temp`` in proportion to the gradient bytes)."""
    ratio = step_temp / t.param_grad_bytes if t.param_grad_bytes else 0.0
    a, o = max(((a, o) for a, _, o in t.backward_points), key=lambda p: p[0] * act_scale + p[1] * (1 + ratio),
               default=(t.backward_before_grads, 0))
    return _point(resident, gb, act_scale, a, o, o * ratio, t=t)


def _bucketed_rows(t, resident, gb, stack, act_scale) -> dict[str, float]:
    """DeepSpeed ZeRO-2/3: each gradient leaves for the IPG bucket as it is produced; the gradient partition
    exists from the first flush (``flush_at`` bytes of gradients). Candidates: before any parameter gradient,
    the most before and after the first flush, and the end (the last bucket reduced)."""
    op_scale = stack.get("op_grad_scale", 1.0)
    early, late = _split_backward(t, stack.get("flush_at", 0) / op_scale, act_scale, op_scale)
    first, flushed = stack.get("grad_resident", 0), stack.get("grad_flushed", 0)
    candidates = [_point(resident, gb, act_scale, t.backward_before_grads, 0, t=t)]
    for hit, grads in ((early, first), (late, first + flushed)):
        if hit is not None:
            a, o = hit
            candidates.append(_point(resident, gb, act_scale, a, grads, o * op_scale, t=t))
    a, _ = t.backward_frontier[-1]
    candidates.append(_point(resident, gb, act_scale, a, first + flushed, t=t))
    return max(candidates, key=lambda r: sum(r.values()))


_SPLIT: dict = {}


def _split_backward(t, threshold: float, act_scale: float, op_scale: float):
    """The backward point (other bytes, op gradient bytes) with the most ``other + op gradient`` among those
    that have produced parameter gradients, split at ``threshold`` gradient bytes (when DeepSpeed's first
    bucket fills and its gradient partition is allocated): (before, after), None where there is no such point.
    Cached per trace and arguments."""
    key = (id(t), threshold, act_scale, op_scale)
    hit = _SPLIT.get(key)
    if hit is not None and hit[0] is t:
        return hit[1]
    early = late = None
    for a, g, o in t.backward_points:
        if not g:
            continue
        x = a * act_scale + o * op_scale
        if g < threshold:
            early = (a, o) if early is None or x > early[0] * act_scale + early[1] * op_scale else early
        else:
            late = (a, o) if late is None or x > late[0] * act_scale + late[1] * op_scale else late
    if len(_SPLIT) > 256:
        _SPLIT.clear()
    _SPLIT[key] = (t, (early, late))
    return early, late


@quantity("bytes", json_key="memory.phases_bytes", type="object")
def phase_bytes(phase_rows):
    """The peak of live bytes within each phase of a step (see the module doc): ``forward``,
    ``backward``, ``optimizer_step``: the sum of the phase's rows."""
    return {ph: sum(rows.values()) for ph, rows in phase_rows.items()}


@quantity("phase", json_key="memory.peak_phase", type="text")
def peak_phase(phase_bytes):
    """The phase of the step where the peak falls: ``forward``, ``backward`` or ``optimizer_step``."""
    return max(phase_bytes, key=phase_bytes.__getitem__)


@quantity("bytes", category="memory", label="peak", json_key="memory.per_gpu_bytes.peak", short="peak", role="peak")
def peak_bytes(phase_bytes, peak_phase):
    """Peak of allocated tensor bytes in one step: the maximum over its phases. The step is a steady-state one:
    the second optimizer step and every later one. The first runs its forward and backward before the optimizer
    creates its states (torch.optim initialises them lazily in ``step()``), so its peak is lower whenever the peak
    falls in the forward or backward; fitplan-torch's referee runs at least four steps and reports the highest
    (``peak_step``): step 2 where the peak is in the forward or backward, every step alike where it is in the
    optimizer step (DeepSpeed ZeRO-0 bf16), on every stack measured (docs/accuracy-stacks.md)."""
    return phase_bytes[peak_phase]


@quantity("bytes", json_key="memory.peak_breakdown_bytes", type="object", role="breakdown")
def peak_breakdown(phase_rows, peak_phase):
    """What the peak is made of: the rows of the peak phase (their keys are the breakdown rows declared by the
    memory quantities' ``row`` metadata), summing exactly to ``peak_bytes``."""
    return dict(phase_rows[peak_phase])


@quantity("bytes", category="memory", label="other (buffers, batch, allocator rounding)", short_label="other",
          json_key="memory.per_gpu_bytes.other", row="other")
def other_resident_bytes(buffer_bytes, batch_bytes, allocator_rounding_bytes):
    """Resident for the whole step besides the model states: the model's buffers (rotary ``inv_freq``), the
    micro-batch (``input_ids``, ``labels``) and CUDA's 512-byte allocator rounding of the model states."""
    return buffer_bytes + batch_bytes + allocator_rounding_bytes


@quantity("bytes", category="memory", label="gathered parameters (FSDP / ZeRO-3)", short_label="gathered params",
          json_key="memory.per_gpu_bytes.gathered_params", row="gathered_params")
def gathered_at_peak_bytes(peak_breakdown):
    """Parameters gathered from the other ranks and alive at the peak instant (FSDP / ZeRO-3)."""
    return peak_breakdown.get("gathered_params", 0)


@quantity("bytes", category="memory", label="temporaries (at the peak)", short_label="temporaries",
          json_key="memory.per_gpu_bytes.temporaries", row="temporaries")
def temporary_bytes(peak_breakdown):
    """Transients alive at the peak instant: the running op's buffers, gradients flowing between ops, the
    optimizer step's temporaries, the model's pinned tensors (rotary cos/sin, mask, final hidden state)."""
    return peak_breakdown.get("temporaries", 0)


@hookimpl
def fitplan_register_quantities(register):
    for q in (model_state_bytes, saved_for_backward_bytes, buffer_bytes, batch_bytes, allocator_rounding_bytes,
              other_resident_bytes, phase_rows, phase_bytes, peak_phase, peak_bytes, peak_breakdown, gathered_at_peak_bytes,
              temporary_bytes):
        register(q)
