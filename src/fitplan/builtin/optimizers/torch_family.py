"""torch.optim (AdamW, SGD, Adagrad, RMSprop) and transformers' Adafactor, as the HF Trainer builds them
(transformers 5.24 ``trainer_optimizer.py``; torch 2.13 ``torch/optim/*.py``), and the AdamW names fitplan
refuses (XLA, NPU, torchdistx).

State bytes are measured exactly by the referee on this CPU (``tests/test_optimizer_names.py``: the real
``Trainer.train()`` for one step, fp32 and bf16 weights). Step temporaries: the CPU code paths are measured
(torch profiler); on CUDA torch picks the ``foreach`` implementation (one state-sized list per call), read from
``torch/optim/_functional`` sources and not measured here.
"""

from __future__ import annotations

import math

from fitplan.builtin.optimizers import step_work as sw
from fitplan.builtin.optimizers._common import TF, cpu_step_scalars, largest, max_sequential
from fitplan.inputs.optimizer import OptimizerSpec


def _adamw_states(ctx):
    """torch.optim.AdamW (``_init_group``): ``exp_avg`` and ``exp_avg_sq`` are ``torch.zeros_like(param)``
    (the parameter's dtype), and ``step`` is a 0-d fp32 tensor per parameter tensor, created on the CPU
    (``torch.tensor(0.0)``) unless fused or capturable: 4 bytes per tensor in CPU runs, none in GPU memory."""
    return 2 * ctx.numel * ctx.state_bytes + cpu_step_scalars(ctx)


def _adamw_fused_states(ctx):
    """Fused AdamW keeps ``step`` on the parameter's device (fp32, 4 bytes per tensor)."""
    return 2 * ctx.numel * ctx.state_bytes + 4 * ctx.num_tensors


def _foreach_temp(ctx):
    """``_multi_tensor_adam``: decoupled weight decay, ``lerp_``, ``mul_`` and ``addcmul_`` work in place;
    ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`` allocates one tensor per parameter (the
    whole device/dtype group at once), then ``div_``, ``add_`` and ``addcdiv_`` in place: one state-sized list."""
    return ctx.numel * ctx.state_bytes


def _single_tensor_temp(ctx):
    """``_single_tensor_adam``: ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)``: the sqrt
    and the quotient exist together (2 × the tensor), while ``denom`` of the previous parameter is still
    bound: max over parameters of ``(2·n_i + n_(i-1))`` × state bytes."""
    return max_sequential(ctx, lambda n, prev: 2 * n + prev) * ctx.state_bytes


def _per_tensor_sqrt_temp(ctx):
    """Adagrad / RMSprop: on CUDA torch's default ``foreach`` path allocates ``torch._foreach_sqrt(state)`` for
    the whole group (one state-sized list: ``adagrad.py`` ``_multi_tensor_adagrad``, ``rmsprop.py``
    ``_multi_tensor_rmsprop``); on the CPU the single-tensor path holds ``sqrt`` and the quotient of one
    tensor: 2·n_max × state bytes (measured)."""
    if ctx.device == "cuda":
        return ctx.numel * ctx.state_bytes
    return 2 * largest(ctx) * ctx.state_bytes


def _sgd_states(ctx):
    """SGD keeps a ``momentum_buffer`` (a clone of the gradient, the parameter's dtype) only when momentum > 0;
    the HF Trainer passes momentum only from ``optim_args`` (default 0: no state)."""
    return ctx.numel * ctx.state_bytes if ctx.arg("momentum", 0.0) > 0 else 0


def _sgd_momentum_states(ctx):
    return ctx.numel * ctx.state_bytes


def _adagrad_states(ctx):
    """``sum = torch.full_like(p, initial_accumulator_value)`` and a 0-d fp32 ``step``, both created in
    ``Adagrad.__init__`` (the state exists before the first step); ``step`` on the CPU unless fused."""
    return ctx.numel * ctx.state_bytes + cpu_step_scalars(ctx)


def _rmsprop_states(ctx):
    """``square_avg`` like p and a 0-d fp32 ``step`` (CPU unless capturable); ``momentum_buffer`` when
    momentum > 0 and ``grad_avg`` when centered (``optim_args``)."""
    extra = (ctx.arg("momentum", 0.0) > 0) + (ctx.arg("centered", "false", str).lower() in ("true", "1"))
    return (1 + extra) * ctx.numel * ctx.state_bytes + cpu_step_scalars(ctx)


def _rows_cols(shape):
    return math.prod(shape[:-1]), math.prod(shape[:-2]) * shape[-1]


def _adafactor_states(ctx):
    """transformers.optimization.Adafactor (beta1=None): factored second moment for >= 2-D tensors
    (rows: shape[:-1], columns: shape[:-2] + shape[-1:]), a full one for 1-D, in fp32 (the gradient is upcast
    first), plus one fp32 RMS scalar per tensor."""
    total = 0
    for shape, count in ctx.tensors:
        if len(shape) >= 2:
            rows, cols = _rows_cols(shape)
            total += count * 4 * (rows + cols + 1)
        else:
            total += count * 4 * (math.prod(shape) + 1)
    return total


def _adafactor_temp(ctx):
    """transformers 5.24 ``Adafactor.step``, per parameter (beta1=None), measured on the CPU (no foreach path:
    the same on CUDA): ``update = grad**2 + eps`` builds two fp32 tensors (8·n) while the previous
    parameter's ``update`` (4·n_prev) is still bound; later ``r_factor``/``c_factor`` (rows + columns) and
    their product exist beside ``update`` once the old one is released. 16-bit gradients and parameters are
    upcast (``grad.float()``, ``p.float()``: + 8·n). Max over parameters of
    ``8·n (+ 8·n when 16-bit) + 4·max(n_prev, rows + cols)``, + the new 4-byte RMS scalar. Measured on a tiny
    Llama (three consecutive 49,152-element matrices): 12·n + 72 bytes in fp32, 20·n + 72 in bf16."""
    dims = {math.prod(shape): (_rows_cols(shape) if len(shape) >= 2 else (0, 0)) for shape, _ in ctx.tensors}
    upcast = 8 if ctx.param_bytes < 4 else 0

    def live(n, prev):
        r, c = dims.get(n, (0, 0))
        return (8 + upcast) * n + 4 * max(prev, r + c)

    best = max_sequential(ctx, live)
    return best + 4 if best else 0


def _refused(name, reason, source):
    return OptimizerSpec(name=name, state_bytes=lambda ctx: 0, hf=True, search=False, refused=reason, doc=reason, source=source)


SPECS = (
    OptimizerSpec(
        name="adamw_torch", aliases=("adamw",), state_bytes=_adamw_states, step_temp_bytes=_foreach_temp,
        step_bytes=sw.adamw_foreach_bytes, step_kernels=sw.adamw_foreach_kernels,
        flops_per_param=12, states_per_param=2, torch_class="torch.optim.AdamW", torch_kwargs={"foreach": True},
        hf=True, measured_on_cpu=True,
        doc="torch.optim.AdamW as the HF Trainer builds it; foreach on CUDA (one state-sized step temporary). "
            "States: exp_avg + exp_avg_sq in the parameter dtype; the 4-byte step scalars stay on the CPU.",
        source=f"torch 2.13 torch/optim/adamw.py; {TF} _get_adamw_torch",
    ),
    OptimizerSpec(
        name="adamw_torch_fused", state_bytes=_adamw_fused_states, step_temp_bytes=lambda ctx: 0,
        step_bytes=sw.adamw_fused_bytes, step_kernels=lambda ctx: sw.foreach_launches(ctx, 1, 4),
        flops_per_param=12, states_per_param=2, torch_class="torch.optim.AdamW", torch_kwargs={"fused": True},
        hf=True, measured_on_cpu=True,
        doc="torch.optim.AdamW(fused=True), the HF default optim with torch >= 2.8: exp_avg + exp_avg_sq + a "
            "4-byte step per tensor on the device; no step temporaries.",
        source="torch 2.13 torch/optim/adamw.py (_fused_adamw); transformers 5.24 training_args.py default optim",
    ),
    OptimizerSpec(
        name="adamw_torch_single", state_bytes=_adamw_states, step_temp_bytes=_single_tensor_temp,
        step_bytes=sw.adamw_foreach_bytes, step_kernels=sw.adamw_single_kernels,
        flops_per_param=12, states_per_param=2, torch_class="torch.optim.AdamW", torch_kwargs={"foreach": False},
        doc="fitplan's name for torch.optim.AdamW(foreach=False) (what torch runs on the CPU): same states, two "
            "copies of one tensor (+ the previous denom) during step.",
        source="torch 2.13 torch/optim/adamw.py (_single_tensor_adamw)",
    ),
    OptimizerSpec(
        name="sgd", state_bytes=_sgd_states, flops_per_param=2, states_per_param=0, hf=True, measured_on_cpu=True,
        step_bytes=sw.sgd_bytes, step_kernels=lambda ctx: sw.foreach_launches(ctx, 1, 2),
        torch_class="torch.optim.SGD", torch_kwargs={"lr": 1e-3},
        doc="torch.optim.SGD as the HF Trainer builds it: no momentum unless optim_args says momentum=...: no state.",
        source=f"torch 2.13 torch/optim/sgd.py; {TF} _get_sgd",
    ),
    OptimizerSpec(
        name="sgd_momentum", state_bytes=_sgd_momentum_states, flops_per_param=3, states_per_param=1,
        step_bytes=sw.sgd_momentum_bytes, step_kernels=lambda ctx: sw.foreach_launches(ctx, 3, 2),
        torch_class="torch.optim.SGD", torch_kwargs={"lr": 1e-3, "momentum": 0.9},
        doc="fitplan's name for torch.optim.SGD(momentum=0.9) (HF: optim sgd, optim_args momentum=0.9): one "
            "momentum buffer per parameter.",
        source="torch 2.13 torch/optim/sgd.py",
    ),
    OptimizerSpec(
        name="adagrad", search=False, state_bytes=_adagrad_states, step_temp_bytes=_per_tensor_sqrt_temp, flops_per_param=7,
        states_per_param=1, hf=True, measured_on_cpu=True, torch_class="torch.optim.Adagrad",
        doc="torch.optim.Adagrad: sum like p + a CPU step scalar per tensor, created at construction.",
        source=f"torch 2.13 torch/optim/adagrad.py; {TF} _get_adagrad",
    ),
    OptimizerSpec(
        name="rmsprop", search=False, state_bytes=_rmsprop_states, step_temp_bytes=_per_tensor_sqrt_temp, flops_per_param=8,
        states_per_param=1, hf=True, measured_on_cpu=True, torch_class="torch.optim.RMSprop",
        doc="torch.optim.RMSprop: square_avg like p + a CPU step scalar (momentum_buffer / grad_avg with "
            "optim_args momentum / centered).",
        source=f"torch 2.13 torch/optim/rmsprop.py; {TF} _get_rmsprop",
    ),
    OptimizerSpec(
        name="adafactor", state_bytes=_adafactor_states, step_temp_bytes=_adafactor_temp, flops_per_param=15,
        step_bytes=sw.adafactor_bytes, step_kernels=lambda ctx: 15 * ctx.num_tensors,
        states_per_param=0, hf=True, measured_on_cpu=True,
        torch_class="transformers.optimization.Adafactor",
        torch_kwargs={"scale_parameter": False, "relative_step": False, "warmup_init": False, "lr": 1e-3},
        doc="HF Adafactor without first moment: factored fp32 row and column second-moment statistics per matrix.",
        source=f"Shazeer & Stern 2018; transformers 5.24 optimization.py (Adafactor); {TF} _get_adafactor",
    ),
    _refused("adamw_torch_xla", "torch_xla's syncfree AdamW runs on TPUs (XLA devices): fitplan models CUDA GPUs "
             "and the CPU, not XLA's memory", f"{TF} _get_adamw_torch_xla"),
    _refused("adamw_torch_npu_fused", "torch_npu's NpuFusedAdamW runs on Ascend NPUs: fitplan has no NPU in its "
             "hardware catalog and no source for the fused kernel's buffers", f"{TF} _get_adamw_torch_npu_fused"),
    _refused("adamw_anyprecision", "torchdistx's AnyPrecisionAdamW: torchdistx has no build for torch 2.13, so its "
             "states (momentum/variance/compensation dtypes) could not be read or measured",
             f"{TF} _get_adamw_anyprecision"),
)
