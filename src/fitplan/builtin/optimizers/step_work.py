"""What one optimizer step moves through device memory and how many kernels it launches: the time model prices
an update on memory bandwidth and its launches on the host (docs/time-and-cost.md). Attached to the built-in specs
as ``step_bytes`` / ``step_kernels``; a spec without them gets :meth:`OptimizerSpec.update_bytes`' single pass."""

from __future__ import annotations

import math

from fitplan.builtin.optimizers._common import BNB_BLOCK

FOREACH_CHUNK = 320 * 65536
"""Elements one ``multi_tensor_apply`` launch covers (320 blocks of 65,536: ATen/native/cuda/MultiTensorApply.cuh)."""
FOREACH_TENSORS = {2: 64, 3: 48, 4: 36}
"""Tensors one ``multi_tensor_apply`` launch takes, by the number of tensor lists (``depth_to_max_tensors``)."""


def foreach_launches(ctx, ops: int, depth: int) -> float:
    """Launches of ``ops`` foreach ops over ``depth`` tensor lists: one per chunk of tensors or of elements."""
    return ops * max(math.ceil(ctx.num_tensors / FOREACH_TENSORS[depth]), math.ceil(ctx.numel / FOREACH_CHUNK), 1)


def adamw_foreach_bytes(ctx):
    """torch 2.13 ``_multi_tensor_adam`` (decoupled weight decay, ``weight_decay = 0``: the HF default, so no
    ``_foreach_mul_`` of the parameters): ``lerp_(exp_avg, grad)``, ``mul_(exp_avg_sq)``, ``addcmul_(exp_avg_sq,
    grad, grad)``, ``sqrt(exp_avg_sq)`` (a new list), ``div_``, ``add_(eps)``, ``addcdiv_(param, exp_avg,
    denom)``: per element 14 state-sized reads and writes, 2 gradient reads, the parameter read and written."""
    return ctx.numel * (14 * ctx.state_bytes + 2 * ctx.param_bytes + 2 * ctx.param_bytes)


def adamw_foreach_kernels(ctx):
    """The seven foreach ops of ``_multi_tensor_adam`` over three tensor lists."""
    return foreach_launches(ctx, 7, 3)


def adamw_single_kernels(ctx):
    """``_single_tensor_adam``: seven kernels per parameter tensor (lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_)."""
    return 7 * ctx.num_tensors


def adamw_fused_bytes(ctx):
    """``_fused_adamw``: one kernel reads the parameter, gradient and both states and writes them back."""
    return ctx.numel * (2 * ctx.param_bytes + ctx.param_bytes + 4 * ctx.state_bytes)


def sgd_bytes(ctx):
    """``_foreach_add_(params, grads, alpha=-lr)``: the parameter read and written, the gradient read."""
    return ctx.numel * 3 * ctx.param_bytes


def sgd_momentum_bytes(ctx):
    """``mul_(bufs)``, ``add_(bufs, grads)``, ``add_(params, bufs)``: 5 state passes, a gradient read, the parameter."""
    return ctx.numel * (5 * ctx.state_bytes + 3 * ctx.param_bytes)


def adafactor_bytes(ctx):
    """HF ``Adafactor.step`` runs about ten fp32 passes over each parameter-sized tensor (the upcast gradient,
    ``grad**2 + eps``, the row and column means, the approximated squared gradient, ``update * grad``, its RMS,
    the clipping, ``p.add_``): 20 × 4 bytes per element, an approximation of its Python loop."""
    return ctx.numel * 80.0


def adam8bit_bytes(ctx):
    """bitsandbytes ``optimizer_update_8bit_blockwise``: one kernel per tensor reads the parameter, the gradient,
    two uint8 states and their absmax, and writes the parameter and states back."""
    return ctx.numel * (3 * ctx.param_bytes + 4) + 8 * ctx.numel / BNB_BLOCK
