"""GaLore (galore-torch 1.0) and APOLLO (apollo-torch 1.0.3) as the HF Trainer builds them
(``_setup_low_rank_optimizer``): the ``optim_target_modules`` Linear weights get low-rank states
(``rank`` 128 unless ``optim_args`` says ``rank=...``, ``update_proj_gap`` 200, ``proj_type`` std); every
other parameter a plain AdamW / Adafactor state. The ``*_layerwise`` variants build one optimizer per parameter,
stepped in a post-accumulate-grad hook that frees the gradient at once (no full set of gradients).

Projector memory (galore-torch ``galore_projector.py``): for fp32 parameters ``get_orthogonal_matrix`` returns
a *view* of the SVD factor (``Vh[:rank]`` or ``U[:, :rank]``), which keeps the whole factor alive:
min(m, n)² fp32 per target instead of rank·max(m, n); 16-bit parameters get a compact copy; GaLoreAdafactor
projects the fp32-upcast gradient, so it always keeps the fp32 view. APOLLO's random projector is compact,
in the parameter's dtype. Measured exactly by the referee on this CPU (rank 16 on a tiny Llama).
"""

from __future__ import annotations

import math

from fitplan.builtin.optimizers._common import BNB_BLOCK, BNB_MIN_8BIT_SIZE, BNB_QMAP_BYTES, TF
from fitplan.inputs.optimizer import OptimizerSpec

RANK = 128
"""The Trainer's default rank (``trainer_optimizer.py``: ``optim_args.get("rank", 128)``)."""


def _lowrank(shape, rank):
    m, n = shape
    k = min(rank, m, n)
    return (m, k) if m >= n else (k, n), k


def _target_states(base: str, shape, pb: float, rank: int) -> float:
    (r, c), k = _lowrank(shape, rank)
    m, n = shape
    ln = r * c
    if base == "apollo_adamw":
        return 2 * ln * pb + (k * n if m >= n else m * k) * pb + pb  # low-rank moments, projector, scaled-grad norm
    fp32_view = pb == 4 or base == "galore_adafactor"
    proj = min(m, n) ** 2 * 4 if fp32_view else (k * n if m >= n else m * k) * pb
    if base == "galore_adafactor":
        return 4 * (r + c) + 4 + proj
    if base == "galore_adamw_8bit":
        return (8 * ln if ln < BNB_MIN_8BIT_SIZE else 2 * ln + 8 * math.ceil(ln / BNB_BLOCK)) + proj
    return 2 * ln * pb + proj


def _other_states(base: str, shape, pb: float) -> float:
    n = math.prod(shape)
    if base == "galore_adafactor":
        if len(shape) >= 2:
            rows, cols = math.prod(shape[:-1]), math.prod(shape[:-2]) * shape[-1]
            return 4 * (rows + cols + 1)
        return 4 * (n + 1)
    if base == "galore_adamw_8bit":
        return 8 * n if n < BNB_MIN_8BIT_SIZE else 2 * n + 8 * math.ceil(n / BNB_BLOCK)
    return 2 * n * pb


def _states(base: str):
    def f(ctx):
        rank = ctx.arg("rank", RANK, int)
        pb = ctx.param_bytes
        total = 0.0
        for shape, count, name, kind in ctx.entries():
            if len(shape) == 2 and ctx.is_target(name, kind):
                total += count * _target_states(base, shape, pb, rank)
            else:
                total += count * _other_states(base, shape, pb)
        return total + (2 * BNB_QMAP_BYTES if base == "galore_adamw_8bit" else 0)

    f.__doc__ = f"{base}: low-rank states and projectors for the targets, full states for the other tensors"
    return f


def _temp(base: str):
    def f(ctx):
        """Steady step: the projected-back update and ``full_rank_grad * scale`` (2·m·n) + low-rank temporaries
        (3·lowrank) for the largest target, in the parameter's dtype (CPU measured ±3 %); GaLore also runs an SVD
        of every target every ``update_proj_gap`` steps (from the first): the fp32 matrix, U and Vh,
        (m·n + m·min + min·n)·4 bytes (source; LAPACK/cuSOLVER workspace not counted)."""
        rank = ctx.arg("rank", RANK, int)
        best = 0.0
        for shape, _count, name, kind in ctx.entries():
            if len(shape) != 2 or not ctx.is_target(name, kind):
                continue
            m, n = shape
            (r, c), _ = _lowrank(shape, rank)
            steady = (2 * m * n + 3 * r * c) * ctx.param_bytes
            svd = (m * n + m * min(m, n) + min(m, n) * n) * 4 if base.startswith("galore") else 0
            best = max(best, steady, svd)
        return best

    return f


def _needs_targets(run, *, layerwise: bool, cuda_only: bool):
    if not run.target_modules:
        return ("the HF Trainer raises \"You need to define `optim_target_modules`\" for GaLore / APOLLO: give "
                "--optim-target-modules (e.g. q_proj,k_proj,v_proj,o_proj or all-linear)")
    if run.method != "full":
        return ("GaLore / APOLLO over LoRA adapters (the Trainer would target the adapters' Linear layers and also "
                "give frozen weights an optimizer state) is not modelled: use --method full")
    if cuda_only and run.device == "cpu":
        return "galore-torch's GaLoreAdamW8bit calls torch.cuda.synchronize() in step (adamw8bit.py): CUDA only"
    if layerwise and run.world_size > 1:
        return "the HF Trainer raises NotImplementedError: layer-wise GaLore / APOLLO does not support DDP (one process only)"
    if layerwise and run.gradient_accumulation_steps != 1:
        return "the HF Trainer raises ValueError: layer-wise GaLore / APOLLO does not support gradient accumulation"
    return None


def _spec(name: str, flops: float, torch_class: str, doc: str, *, measured: bool = True):
    base = name.removesuffix("_layerwise")
    layerwise = name.endswith("_layerwise")
    cuda_only = base == "galore_adamw_8bit"
    return OptimizerSpec(
        name=name, state_bytes=_states(base), step_temp_bytes=_temp(base), flops_per_param=flops, states_per_param=0,
        hf=True, search=False, measured_on_cpu=measured and not cuda_only, frees_gradients=layerwise, torch_class=torch_class,
        check=lambda run: _needs_targets(run, layerwise=layerwise, cuda_only=cuda_only),
        doc=doc + (" Layer-wise: one optimizer per parameter, each gradient freed as soon as it is applied." if layerwise else ""),
        source=f"{'apollo-torch 1.0.3 apollo_torch/apollo.py' if 'apollo' in name else 'galore-torch 1.0 galore_torch/'}; "
               f"{TF} _setup_low_rank_optimizer",
    )


GALORE = ("GaLore AdamW: low-rank moments (rank 128) per target Linear + the SVD projector (a view keeping "
          "min(m,n)² fp32 for fp32 weights); AdamW states like p elsewhere.")

SPECS = (
    _spec("galore_adamw", 514, "galore_torch.GaLoreAdamW", GALORE),
    _spec("galore_adamw_layerwise", 514, "galore_torch.GaLoreAdamW", GALORE),
    _spec("galore_adamw_8bit", 530, "galore_torch.GaLoreAdamW8bit",
          "GaLore over bitsandbytes' 8-bit AdamW (CUDA only; not measured: source reading)."),
    _spec("galore_adamw_8bit_layerwise", 530, "galore_torch.GaLoreAdamW8bit",
          "GaLore over bitsandbytes' 8-bit AdamW (CUDA only; not measured: source reading)."),
    _spec("galore_adafactor", 517, "galore_torch.GaLoreAdafactor",
          "GaLore Adafactor: factored low-rank statistics + the fp32 SVD projector view per target."),
    _spec("apollo_adamw", 262, "apollo_torch.APOLLOAdamW",
          "APOLLO AdamW: low-rank moments + a compact random projector per target; AdamW states elsewhere."),
    _spec("apollo_adamw_layerwise", 262, "apollo_torch.APOLLOAdamW",
          "APOLLO AdamW: low-rank moments + a compact random projector per target; AdamW states elsewhere."),
    OptimizerSpec(
        name="galore_adafactor_layerwise", state_bytes=lambda ctx: 0, hf=True, search=False,
        refused="broken in transformers 5.24 on every device: the layer-wise branch builds GaLoreAdafactor with only "
                "lr, so relative_step=True plus a manual lr raises ValueError ('Cannot combine manual lr and "
                "relative_step=True'; trainer_optimizer.py _setup_low_rank_optimizer vs _get_galore_optimizer)",
        doc="refused: the HF Trainer cannot build it", source=f"{TF}; galore-torch 1.0 adafactor.py",
    ),
)
