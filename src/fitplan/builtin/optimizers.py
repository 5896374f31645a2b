"""Built-in optimizers: what each stores per trainable tensor, and its step temporaries.

HF TrainingArguments ``optim`` names. Element counts come from the trainable tensors, so
per-tensor effects (AdamW's ``step`` scalar, Adafactor's factored statistics, bitsandbytes'
small-tensor fallback) are exact.
"""

from __future__ import annotations

import math

from fitplan.inputs.optimizer import OptimizerSpec
from fitplan.pluginmgr.hookspecs import hookimpl

BNB_BLOCK = 256
"""bitsandbytes' blockwise 8-bit optimizers quantise states in blocks of 256 with one fp32 absmax each."""
BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes keeps tensors with fewer elements than this in 32-bit states (``min_8bit_size``)."""


def _adamw_states(ctx):
    """torch.optim.AdamW (``_init_group``): ``exp_avg`` and ``exp_avg_sq`` are ``torch.zeros_like(param)``
    (the parameter's dtype), and ``step`` is a 0-d fp32 tensor per parameter tensor, created on the CPU
    (``torch.tensor(0.0)``) unless fused or capturable: 4 bytes per tensor in CPU runs, none in GPU memory."""
    steps = 4 * ctx.num_tensors if ctx.device == "cpu" else 0
    return 2 * ctx.numel * ctx.state_bytes + steps


def _adamw_fused_states(ctx):
    """Fused AdamW keeps ``step`` on the parameter's device (fp32, 4 bytes per tensor)."""
    return 2 * ctx.numel * ctx.state_bytes + 4 * ctx.num_tensors


def _foreach_temp(ctx):
    """``_multi_tensor_adam``: decoupled weight decay, ``lerp_``, ``mul_`` and ``addcmul_`` work in place;
    ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`` allocates one tensor per parameter (the
    whole device/dtype group at once), then ``div_``, ``add_`` and ``addcdiv_`` in place: one state-sized list."""
    return ctx.numel * ctx.state_bytes


def _sequence(ctx):
    """The trainable tensors' element counts in ``model.parameters()`` order, as (block, repeats) pairs:
    consecutive entries with the same count > 1 are one decoder layer's tensors, repeated per layer."""
    blocks: list[tuple[list[int], int]] = []
    for shape, count in ctx.tensors:
        n = math.prod(shape)
        if blocks and count > 1 and blocks[-1][1] == count:
            blocks[-1][0].append(n)
        else:
            blocks.append(([n], count))
    return blocks


def _single_tensor_temp(ctx):
    """``_single_tensor_adam``: ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)``: the sqrt
    and the quotient exist together (2 × the tensor), while ``denom`` of the previous parameter is still
    bound: max over parameters of ``(2·n_i + n_(i-1))`` × state bytes."""
    best, prev = 0, 0
    for numels, reps in _sequence(ctx):
        for _ in range(min(reps, 2)):
            for n in numels:
                best = max(best, 2 * n + prev)
                prev = n
    return best * ctx.state_bytes


def _adafactor_temp(ctx):
    """transformers 5.24 ``Adafactor.step``, per parameter (beta1=None): 16-bit gradients and parameters are
    upcast (``grad.float()``, ``p.float()``: 4 bytes per element each); ``update = grad**2 + eps`` (two
    tensors at once); factored matrices build ``r_factor`` (rows) and ``c_factor`` (columns) and
    ``torch.mul(r_factor, c_factor)`` while ``update`` is still bound (again two tensors); ``-update`` in
    ``p.add_(-update)`` likewise. Max over parameters of ``8·n (+ 8·n when 16-bit) + 4·(rows + cols)``,
    + the new 4-byte RMS scalar."""
    best = 0
    for shape, _count in ctx.tensors:
        n = math.prod(shape)
        t = 8 * n + (8 * n if ctx.param_bytes < 4 else 0)
        if len(shape) >= 2:
            t += 4 * (math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1])
        best = max(best, t)
    return best + 4 if best else 0


def _sgd_states(ctx):
    return 0


def _sgd_momentum_states(ctx):
    return ctx.numel * ctx.state_bytes


def _adafactor_states(ctx):
    # transformers.optimization.Adafactor (beta1=None): factored second moment for >= 2-D tensors
    # (rows: shape[:-1], columns: shape[:-2] + shape[-1:]), a full one for 1-D, in fp32 (grads are
    # upcast), plus one fp32 RMS scalar per tensor.
    total = 0
    for shape, count in ctx.tensors:
        if len(shape) >= 2:
            rows = math.prod(shape[:-1])
            cols = math.prod(shape[:-2]) * shape[-1]
            total += count * 4 * (rows + cols + 1)
        else:
            total += count * 4 * (math.prod(shape) + 1)
    return total


def _adam8bit_states(ctx):
    # bitsandbytes 8-bit blockwise Adam: two uint8 states + one fp32 absmax per 256-element block per
    # state + two 256-entry fp32 quantisation maps per tensor; small tensors keep two fp32 states.
    total = 0
    for shape, count in ctx.tensors:
        n = math.prod(shape)
        if n < BNB_MIN_8BIT_SIZE:
            total += count * 2 * 4 * n
        else:
            total += count * (2 * n + 2 * 4 * math.ceil(n / BNB_BLOCK) + 2 * 256 * 4)
    return total


BUILTIN = (
    OptimizerSpec(
        name="adamw_torch", aliases=("adamw",), state_bytes=_adamw_states, step_temp_bytes=_foreach_temp,
        flops_per_param=12, states_per_param=2, torch_class="torch.optim.AdamW", torch_kwargs={"foreach": True},
        doc="torch.optim.AdamW as the HF Trainer builds it; foreach on CUDA (one state-sized step temporary). "
            "States: exp_avg + exp_avg_sq in the parameter dtype; the 4-byte step scalars stay on the CPU.",
        source="torch/optim/adamw.py; transformers TrainingArguments.optim",
    ),
    OptimizerSpec(
        name="adamw_torch_fused", state_bytes=_adamw_fused_states, step_temp_bytes=lambda ctx: 0,
        flops_per_param=12, states_per_param=2, torch_class="torch.optim.AdamW", torch_kwargs={"fused": True},
        doc="torch.optim.AdamW(fused=True): exp_avg + exp_avg_sq + a 4-byte step per tensor on the device; "
            "no step temporaries.",
        source="torch/optim/adamw.py (_fused_adamw)",
    ),
    OptimizerSpec(
        name="adamw_torch_single", state_bytes=_adamw_states, step_temp_bytes=_single_tensor_temp,
        flops_per_param=12, states_per_param=2, torch_class="torch.optim.AdamW", torch_kwargs={"foreach": False},
        doc="torch.optim.AdamW(foreach=False): same states, two copies of one tensor (+ the previous denom) "
            "during step.",
        source="torch/optim/adamw.py (_single_tensor_adamw)",
    ),
    OptimizerSpec(
        name="sgd", state_bytes=_sgd_states, flops_per_param=2, states_per_param=0,
        torch_class="torch.optim.SGD", torch_kwargs={"lr": 1e-3},
        doc="torch.optim.SGD without momentum (the HF Trainer's 'sgd'): no state.",
        source="torch/optim/sgd.py",
    ),
    OptimizerSpec(
        name="sgd_momentum", state_bytes=_sgd_momentum_states, flops_per_param=3, states_per_param=1,
        torch_class="torch.optim.SGD", torch_kwargs={"lr": 1e-3, "momentum": 0.9},
        doc="torch.optim.SGD(momentum=0.9): one momentum buffer per parameter.",
        source="torch/optim/sgd.py",
    ),
    OptimizerSpec(
        name="adafactor", state_bytes=_adafactor_states, step_temp_bytes=_adafactor_temp, flops_per_param=10,
        states_per_param=0,
        torch_class="transformers.optimization.Adafactor",
        torch_kwargs={"scale_parameter": False, "relative_step": False, "warmup_init": False, "lr": 1e-3},
        doc="HF Adafactor without first moment: factored row and column second-moment statistics per matrix.",
        source="Shazeer & Stern 2018; transformers/optimization.py",
    ),
    OptimizerSpec(
        name="adamw_8bit", aliases=("adamw_bnb_8bit",), state_bytes=_adam8bit_states, flops_per_param=14,
        states_per_param=0.5, torch_class="bitsandbytes.optim.AdamW8bit",
        doc="bitsandbytes 8-bit blockwise AdamW: 2 B/param + fp32 absmax per 256-element block.",
        source="Dettmers et al. 2021; bitsandbytes/optim/optimizer.py",
    ),
    OptimizerSpec(
        name="paged_adamw_8bit", state_bytes=_adam8bit_states, flops_per_param=14, states_per_param=0.5,
        torch_class="bitsandbytes.optim.PagedAdamW8bit",
        doc="Same bytes as adamw_8bit, in CUDA unified memory that can page out to the CPU under pressure.",
        source="bitsandbytes/optim/adamw.py",
    ),
)


@hookimpl
def fitplan_register_optimizers(register):
    for spec in BUILTIN:
        register(spec)
