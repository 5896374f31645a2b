"""LOMO and AdaLomo (lomo-optim 0.1.1), GrokAdamW (grokadamw 0.1.2), schedule-free AdamW / RAdam / SGD
(schedulefree 1.4.1) and StableAdamW (torch-optimi 0.3.3), as the HF Trainer builds them
(``_get_lomo_optimizer``, ``_get_grokadamw``, ``_get_schedule_free_optimizer``, ``_get_stable_adamw``).

States measured exactly by the referee on this CPU, except AdaLomo (hard-coded ``.cuda()``: source reading).
"""

from __future__ import annotations

from fitplan.builtin.optimizers._common import TF, largest
from fitplan.inputs.optimizer import OptimizerSpec


def _lomo_temp(ctx):
    """``Lomo.fuse_update`` (``lomo_optim/lomo.py``) inside backward: ``grad.to(float32)`` and
    ``p.data.to(float32)`` of one tensor (8·n for 16-bit parameters, no copy for fp32)."""
    return 8 * largest(ctx) if ctx.param_bytes < 4 else 0


def _lomo_check(run):
    if run.compute_dtype == "fp16" and run.grad_dtype == "fp16":
        return ("with fp16 weights LOMO turns on dynamic loss scaling with clip_grad_norm=1.0, which needs the extra "
                "grad_norm() backward the HF Trainer never calls (lomo_optim/lomo.py): it fails")
    return None


def _adalomo_states(ctx):
    """``AdaLomo.__init__`` (``lomo_optim/adalomo.py``): fp32 factored statistics for every named parameter,
    ``exp_avg_sq_row[shape[0]]`` + ``exp_avg_sq_col[shape[1]]`` (``exp_avg_sq[shape[0]]`` for 1-D)."""
    return sum(count * 4 * (shape[0] + (shape[1] if len(shape) >= 2 else 0)) for shape, count in ctx.tensors)


def _adalomo_check(run):
    if run.device == "cpu":
        return "lomo-optim's AdaLomo allocates its statistics with a hard-coded .cuda() (adalomo.py): CUDA only"
    if run.method != "full":
        return ("AdaLomo allocates statistics for every parameter, frozen ones included: not modelled with LoRA "
                "adapters (use --method full)")
    return _lomo_check(run)


def _grok_host(ctx):
    """GrokAdamW keeps ``exp_avg``, ``exp_avg_sq`` and ``grok_ema`` as ``zeros_like(p, device='cpu')`` in
    ``param_groups[i]["state"]`` (``grokadamw.py``): host RAM, in the parameter's dtype."""
    return 3 * ctx.numel * ctx.param_bytes


def _grok_temp(ctx):
    """Per parameter, the three states are copied to the device for the update (3·n), plus ``grok_grad`` and the
    ``sqrt`` denominator (2·n) (source; CPU measured 3·n_max·pb, where the copies are no-ops)."""
    n = largest(ctx) * ctx.param_bytes
    return 5 * n if ctx.device == "cuda" else 3 * n


def _like_p(k: int):
    def f(ctx):
        return k * ctx.numel * ctx.state_bytes

    f.__doc__ = f"{k} state(s) like the parameter"
    return f


def _sf_temp(ctx):
    """schedulefree ``AdamWScheduleFree.step`` (foreach by default on any device): ``denom =
    torch._foreach_div(exp_avg_sq, bc2)`` is a list over the group, the previous group's still bound: Σ n
    over all trainable tensors × state bytes (measured: 1,968,652 B for 492,160 fp32 parameters)."""
    return ctx.numel * ctx.state_bytes


def _stable_states(ctx):
    """torch-optimi StableAdamW (``optimi/stableadamw.py``): ``exp_avg``, ``exp_avg_sq`` like p, a 0-d ``eps_sq``
    in p's dtype per tensor, and ``kahan_comp`` like p for 16-bit parameters (the Trainer passes
    ``kahan_sum=None``, which turns Kahan summation on for bf16/fp16)."""
    pb = ctx.state_bytes
    kahan = ctx.numel * pb if pb < 4 else 0
    return 2 * ctx.numel * pb + ctx.num_tensors * pb + kahan


def _stable_temp(ctx):
    """CPU (for-loop path, measured): 2·n_max·pb (+ n_max·pb with Kahan). CUDA runs per-tensor Triton kernels:
    0 (guess from source)."""
    if ctx.device == "cuda":
        return 0
    return (3 if ctx.state_bytes < 4 else 2) * largest(ctx) * ctx.state_bytes


SPECS = (
    OptimizerSpec(
        name="lomo", state_bytes=lambda ctx: 0, step_temp_bytes=_lomo_temp, flops_per_param=3, hf=True, search=False,
        measured_on_cpu=True, frees_gradients=True, check=_lomo_check, torch_class="lomo_optim.Lomo",
        doc="LOMO: SGD fused into backward (a gradient hook updates and frees each gradient): no state, no full "
            "set of gradients. With gradient accumulation it still updates on every micro-batch.",
        source=f"lomo-optim 0.1.1 lomo_optim/lomo.py; {TF} _get_lomo_optimizer",
    ),
    OptimizerSpec(
        name="adalomo", state_bytes=_adalomo_states, step_temp_bytes=_lomo_temp, flops_per_param=15, hf=True, search=False,
        frees_gradients=True, check=_adalomo_check, torch_class="lomo_optim.AdaLomo",
        doc="AdaLomo: LOMO with Adafactor-style fp32 factored statistics for every parameter (CUDA only; source).",
        source=f"lomo-optim 0.1.1 lomo_optim/adalomo.py; {TF} _get_lomo_optimizer",
    ),
    OptimizerSpec(
        name="grokadamw", state_bytes=lambda ctx: 0, host_state_bytes=_grok_host, step_temp_bytes=_grok_temp,
        flops_per_param=20, hf=True, search=False, measured_on_cpu=True, torch_class="grokadamw.GrokAdamW",
        doc="GrokAdamW: three states like p kept in host RAM, copied to the GPU and back for every parameter's "
            "update (6·n·pb bytes over PCIe per step).",
        source=f"grokadamw 0.1.2 grokadamw/grokadamw.py; {TF} _get_grokadamw",
    ),
    OptimizerSpec(
        name="schedule_free_adamw", state_bytes=_like_p(2), step_temp_bytes=_sf_temp, flops_per_param=15,
        states_per_param=2, hf=True, search=False, measured_on_cpu=True, torch_class="schedulefree.AdamWScheduleFree",
        doc="Schedule-free AdamW: z (a clone of p) + exp_avg_sq, like p; a foreach denominator list during step.",
        source=f"schedulefree 1.4.1 adamw_schedulefree.py; {TF} _get_schedule_free_optimizer",
    ),
    OptimizerSpec(
        name="schedule_free_radam", state_bytes=_like_p(2), step_temp_bytes=_sf_temp, flops_per_param=15,
        states_per_param=2, hf=True, search=False, measured_on_cpu=True, torch_class="schedulefree.RAdamScheduleFree",
        doc="Schedule-free RAdam: z + exp_avg_sq like p; the foreach denominator list once rho_t > 4 (step 5 on).",
        source=f"schedulefree 1.4.1 radam_schedulefree.py; {TF} _get_schedule_free_optimizer",
    ),
    OptimizerSpec(
        name="schedule_free_sgd", state_bytes=_like_p(1), flops_per_param=7, states_per_param=1, hf=True, search=False,
        measured_on_cpu=True, torch_class="schedulefree.SGDScheduleFree",
        doc="Schedule-free SGD: z (a clone of p).",
        source=f"schedulefree 1.4.1 sgd_schedulefree.py; {TF} _get_schedule_free_optimizer",
    ),
    OptimizerSpec(
        name="stable_adamw", state_bytes=_stable_states, step_temp_bytes=_stable_temp, flops_per_param=16,
        states_per_param=2, hf=True, search=False, measured_on_cpu=True, torch_class="optimi.StableAdamW",
        doc="torch-optimi StableAdamW: exp_avg + exp_avg_sq like p, a 0-d eps_sq per tensor, Kahan compensation "
            "like p for 16-bit weights.",
        source=f"torch-optimi 0.3.3 optimi/stableadamw.py; {TF} _get_stable_adamw",
    ),
)

