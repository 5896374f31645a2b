"""Lion, GaLore AdamW, Adam-mini and Muon, as fitplan sees them (the plugin's entry point).

Every byte function receives a :class:`fitplan.OptimizerContext`: the trainable tensors as
``(shape, count)`` pairs, ``state_bytes`` (bytes per element of a state created like the parameter,
``torch.zeros_like(p)``: 2 for bf16/fp16 weights, 4 for fp32 weights and for peft's fp32 adapters)
and ``param_bytes``.

**Which tensors are "hidden matrices".** GaLore and Muon treat the weight matrices inside the decoder
layers differently from the embeddings, the LM head and the 1-D gains and biases; Adam-mini treats
the embeddings and the head differently from the rest. The context gives shapes, not names, so this
plugin uses fitplan's tensor list: a tensor repeated once per decoder layer has ``count > 1`` there,
while the token/position embeddings and the LM head occur once. So *hidden matrix* = a tensor of 2 or
more dimensions with ``count > 1`` (3-D: fused MoE experts, a batch of matrices); *embedding or head*
= a 2-D tensor with ``count == 1``. (A one-layer model has
every tensor once; its matrices are then counted as embeddings.) The torch implementations in
:mod:`fitplan_optimizers_extra.torch_impl` draw the same line from parameter names when the optimizer
is given ``model.named_parameters()``.

**Step scalars.** None of the reference implementations keeps a ``step`` tensor: Lion has no step,
GaLore, Adam-mini and Muon's auxiliary AdamW keep a Python ``int`` (no tensor bytes).

**Step temporaries** are those of the torch implementations shipped here, which follow the reference
code operation by operation (differences are noted per optimizer). They are the largest per-tensor
working set, since each implementation loops over one parameter at a time.
"""

from __future__ import annotations

import math

from fitplan.api import OptimizerContext, OptimizerSpec, hookimpl

PLUGIN_SOURCE = "fitplan-optimizers-extra"

# --------------------------------------------------------------------------- tensor classes


def is_hidden_matrix(shape: tuple[int, ...], count: int) -> bool:
    """A weight of 2 or more dimensions repeated in every decoder layer (see the module docstring).
    A 3-D tensor is a batch of matrices (MoE experts stored fused, ``(E, out, in)``)."""
    return len(shape) >= 2 and count > 1


def is_embedding_or_head(shape: tuple[int, ...], count: int) -> bool:
    """A 2-D tensor that occurs once: token or position embeddings, the untied LM head."""
    return len(shape) == 2 and count == 1


# --------------------------------------------------------------------------- Lion


def lion_state_bytes(ctx: OptimizerContext) -> float:
    """Lion keeps one state, the momentum ``exp_avg = torch.zeros_like(p)``: numel × state bytes.

    No step counter (the update has no bias correction). Reference: lucidrains/lion-pytorch
    ``lion_pytorch.py`` (``state['exp_avg'] = torch.zeros_like(p)``); Chen et al. 2023, Algorithm 2.
    """
    return ctx.numel * ctx.state_bytes


def lion_step_temp_bytes(ctx: OptimizerContext) -> float:
    """One temporary as large as the largest trainable tensor: ``update = exp_avg.lerp(grad, 1 - β1)``
    (then ``sign_()`` in place). lucidrains' version allocates two (``exp_avg.clone()`` and the
    out-of-place ``add``); the shipped implementation allocates one."""
    return max((math.prod(s) for s, _ in ctx.tensors), default=0) * ctx.state_bytes


LION = OptimizerSpec(
    name="lion",
    state_bytes=lion_state_bytes,
    step_temp_bytes=lion_step_temp_bytes,
    # p *= 1 - lr·wd (1); c = lerp(m, g, 1-β1) (3); sign (1); p -= lr·c (2); m = lerp(m, g, 1-β2) (3)
    flops_per_param=10,
    states_per_param=1,
    torch_class="fitplan_optimizers_extra.torch_impl.Lion",
    torch_kwargs={"betas": (0.9, 0.99), "weight_decay": 0.0},
    doc="Lion (EvoLved Sign Momentum): one momentum state per parameter, in the parameter's dtype; "
        "no step counter. Update: sign(β1·m + (1-β1)·g).",
    source="Chen et al. 2023, 'Symbolic Discovery of Optimization Algorithms' (arXiv:2302.06675), Algorithm 2; "
           "reference implementation lucidrains/lion-pytorch lion_pytorch.py",
)

# --------------------------------------------------------------------------- GaLore AdamW

GALORE_RANKS: dict[str, int] = {
    "galore_adamw_r128": 128,
    "galore_adamw_r256": 256,
    "galore_adamw_r512": 512,
    "galore_adamw_r1024": 1024,
}
"""Named variants (rank is part of the name, so ``--optim`` and the recommender see each one).
128 is the default of the reference's training script and of transformers' ``optim="galore_adamw"`` (which
fitplan builds in as the HF Trainer builds it, with ``optim_target_modules``: this plugin's variants are the
reference algorithm on every hidden matrix, not HF names);
the GaLore paper uses 128 to 512 for 60M to 1B pre-training and 1024 for 7B."""
GALORE_UPDATE_PROJ_GAP = 200
"""Steps between two SVDs of a gradient (the paper's T; reference default)."""
GALORE_SCALE = 0.25
"""The reference's ``galore_scale`` (alpha): scales the projected-back update. No memory effect."""


def galore_shapes(m: int, n: int, rank: int) -> tuple[int, int]:
    """``(projector elements, projected-gradient elements)`` for an (m, n) weight.

    The reference (``GaLoreProjector`` with ``proj_type='std'``) projects onto the smaller side:
    m ≥ n keeps ``P = Vh[:r]`` (r × n) and a projected gradient ``G Pᵀ`` (m × r); m < n keeps
    ``P = U[:, :r]`` (m × r) and ``Pᵀ G`` (r × n). The SVD has only min(m, n) singular vectors, so the
    effective rank is ``k = min(r, m, n)``.
    """
    k = min(rank, m, n)
    if m >= n:
        return k * n, m * k
    return m * k, k * n


def galore_state_bytes_for(rank: int):
    def state_bytes(ctx: OptimizerContext) -> float:
        """Per hidden (m, n) matrix: the projector in the parameter dtype plus Adam's exp_avg and
        exp_avg_sq of the *projected* gradient (``torch.zeros_like(low_rank_grad)``, the parameter
        dtype); every other tensor (3-D expert weights included: the reference's Tucker projector for
        >2-D tensors is not modelled) gets full AdamW states. No step tensor (a Python int).

        Reference: jiaweizzhao/GaLore ``galore_torch/adamw.py`` and ``galore_projector.py``; Zhao et al.
        2024, Algorithm 2. The reference keeps ``Vh[:r]`` as a *view* of the full (min(m,n) × n) fp32
        ``Vh`` when the parameter is fp32, which retains the whole ``Vh``; the shipped implementation
        (and this count) keeps an r × n copy.
        """
        total = 0
        for shape, count in ctx.tensors:
            if len(shape) == 2 and is_hidden_matrix(shape, count):
                proj, low = galore_shapes(shape[0], shape[1], rank)
                total += count * (proj * ctx.param_bytes + 2 * low * ctx.state_bytes)
            else:
                total += count * 2 * math.prod(shape) * ctx.state_bytes
        return total

    return state_bytes


def galore_step_temp_bytes_for(rank: int):
    def step_temp_bytes(ctx: OptimizerContext) -> float:
        """The largest per-tensor working set of one step.

        Hidden (m, n) matrix, the larger of
          * the SVD step (the first step, then every 200): an fp32 copy of the gradient when it is
            not fp32, ``U`` (m × k₀), ``S`` (k₀) and ``Vh`` (k₀ × n) in fp32, k₀ = min(m, n), and the
            new projector, made while the previous one is still held;
          * the update: the projected gradient, ``denom`` and ``exp_avg / denom`` (3 × projected size,
            state dtype) plus the projected-back update (m × n, parameter dtype). The reference
            multiplies by ``scale`` out of place (one more m × n); the shipped implementation in place.
        Other tensors (AdamW): ``denom`` and ``exp_avg / denom``, 2 × numel.
        LAPACK/cuSOLVER's own SVD workspace is not counted.
        """
        best = 0.0
        for shape, count in ctx.tensors:
            n_el = math.prod(shape)
            if len(shape) == 2 and is_hidden_matrix(shape, count):
                m, n = shape
                k0 = min(m, n)
                proj, low = galore_shapes(m, n, rank)
                svd = (0 if ctx.param_bytes == 4 else 4 * m * n) + 4 * (m * k0 + k0 + k0 * n) + proj * ctx.param_bytes
                update = 3 * low * ctx.state_bytes + m * n * ctx.param_bytes
                best = max(best, svd, update)
            else:
                best = max(best, 2 * n_el * ctx.state_bytes)
        return best

    return step_temp_bytes


def _galore(name: str, rank: int) -> OptimizerSpec:
    return OptimizerSpec(
        name=name,
        state_bytes=galore_state_bytes_for(rank),
        step_temp_bytes=galore_step_temp_bytes_for(rank),
        # project (2r) and project back (2r) per element, AdamW on the r-sized projection (amortised ~0),
        # scale + update (3), decoupled weight decay (2). The SVD every 200 steps is not included.
        flops_per_param=4 * rank + 5,
        states_per_param=2 * rank / 4096,  # relative to a 4096-wide matrix, for the seed's simplified view
        torch_class="fitplan_optimizers_extra.torch_impl.GaLoreAdamW",
        torch_kwargs={"rank": rank, "update_proj_gap": GALORE_UPDATE_PROJ_GAP, "scale": GALORE_SCALE},
        doc=f"GaLore AdamW, rank {rank}: each hidden matrix's gradient is projected onto its top-{rank} singular "
            "vectors (SVD every 200 steps); Adam states live in the projection (r × the larger side), plus the "
            "projector. Embeddings, LM head and 1-D tensors keep full AdamW states.",
        source="Zhao et al. 2024, 'GaLore: Memory-Efficient LLM Training by Gradient Low-Rank Projection' "
               "(arXiv:2403.03507); reference jiaweizzhao/GaLore galore_torch/adamw.py, galore_projector.py",
    )


# --------------------------------------------------------------------------- Adam-mini


def adam_mini_state_bytes(ctx: OptimizerContext) -> float:
    """Adam-mini: the first moment ``m`` in full, fp32 whatever the parameter dtype
    (``torch.zeros_like(p, dtype=torch.float32)``), and one second-moment value per block.

    * embeddings and LM head: full fp32 ``m`` and ``v`` (Adam's own partition): 8 B per element;
    * every other tensor is one block: full fp32 ``m`` plus ``vmean``, a single element in the
      parameter dtype (``torch.zeros_like(torch.sum(p * p))``).

    The reference also splits query and key weights per attention head (``num_heads`` fp32 values
    instead of one); this count treats them as one block, which under-counts by at most
    (num_heads + num_kv_heads) × 4 bytes per layer. No step tensor (a Python int).
    Reference: zyushun/Adam-mini ``adam_mini/adam_mini.py``; Zhang et al. 2024.
    """
    total = 0
    for shape, count in ctx.tensors:
        n = math.prod(shape)
        if is_embedding_or_head(shape, count):
            total += count * 2 * n * 4
        else:
            total += count * (n * 4 + ctx.param_bytes)
    return total


def adam_mini_step_temp_bytes(ctx: OptimizerContext) -> float:
    """Per tensor: an fp32 copy of the gradient when it is not fp32 (``p.grad.to(torch.float32)``) plus
    two fp32 tensors of its size (``sqrt(v)`` and ``/ bias_correction`` for embeddings; ``m * stepsize``
    and its negation for the other blocks, next to two fp32 scalars, ``mean(g²)`` and ``h``):
    numel × 4 × (2 + [param not fp32]) (+ 8 bytes for a block)."""
    extra = 0 if ctx.param_bytes == 4 else 1
    best = 0
    for shape, count in ctx.tensors:
        scalars = 0 if is_embedding_or_head(shape, count) else 8
        best = max(best, math.prod(shape) * 4 * (2 + extra) + scalars)
    return best


ADAM_MINI = OptimizerSpec(
    name="adam_mini",
    state_bytes=adam_mini_state_bytes,
    step_temp_bytes=adam_mini_step_temp_bytes,
    # block: g² (1) + sum (1) + lerp (3) + m·stepsize (1) + ·lr (1) + negate (1) + add (1) + weight decay (1)
    flops_per_param=10,
    states_per_param=1,
    torch_class="fitplan_optimizers_extra.torch_impl.AdamMini",
    torch_kwargs={"betas": (0.9, 0.999), "weight_decay": 0.0},
    doc="Adam-mini: full fp32 first moment; one second-moment scalar per parameter block (per tensor), "
        "full Adam states for embeddings and LM head.",
    source="Zhang et al. 2024, 'Adam-mini: Use Fewer Learning Rates To Gain More' (arXiv:2406.16793); "
           "reference zyushun/Adam-mini adam_mini/adam_mini.py",
)

# --------------------------------------------------------------------------- Muon

MUON_NS_STEPS = 5
"""Newton-Schulz iterations per update (reference default)."""
MUON_FLOPS_WIDTH = 4096
"""The matrix width the declared FLOPs per parameter assume (a 7B-class model; see MUON's flops)."""


def muon_state_bytes(ctx: OptimizerContext) -> float:
    """Hidden matrices: one momentum buffer ``torch.zeros_like(p)``; embeddings, LM head and 1-D
    tensors: the auxiliary AdamW's ``exp_avg`` and ``exp_avg_sq`` (``torch.zeros_like(p)``, step a
    Python int). Reference: KellerJordan/Muon ``muon.py`` (``SingleDeviceMuonWithAuxAdam``), whose
    docstring says the embeddings, the output layer and gains/biases must use AdamW.
    """
    total = 0
    for shape, count in ctx.tensors:
        n = math.prod(shape)
        total += count * n * ctx.state_bytes * (1 if is_hidden_matrix(shape, count) else 2)
    return total


def muon_newton_schulz_temp_elements(m: int, n: int) -> int:
    """bf16 elements alive during the reference's quintic Newton-Schulz iteration on an (m, n)
    update, a = min(m, n), b = max(m, n): ``A = X Xᵀ`` and ``B = b·A + c·A·A`` (at most 5 a² while
    the previous A and B are still referenced) next to X (a b); then ``X = a·X + B X`` (4 a b next
    to A and B)."""
    a, b = min(m, n), max(m, n)
    return max(5 * a * a + a * b, 2 * a * a + 4 * a * b)


def muon_step_temp_bytes(ctx: OptimizerContext) -> float:
    """The larger of: the Newton-Schulz working set of the largest hidden matrix (bf16, 2 bytes per
    element; a 3-D tensor is orthogonalised as a batch, so its working set is batch × one matrix's;
    a bf16 copy of the gradient when it is not bf16 is freed after normalisation, so it overlaps only
    the first division); the auxiliary AdamW's ``adam_update`` for the largest other tensor
    (``buf1 / c1``, ``buf2 / c2``, ``sqrt`` and ``+ eps``: 4 × numel in the state dtype)."""
    best = 0.0
    for shape, count in ctx.tensors:
        n_el = math.prod(shape)
        if is_hidden_matrix(shape, count):
            batch = math.prod(shape[:-2])
            best = max(best, 2 * batch * muon_newton_schulz_temp_elements(shape[-2], shape[-1]), 2 * 2 * n_el)
        else:
            best = max(best, 4 * n_el * ctx.state_bytes)
    return best


MUON = OptimizerSpec(
    name="muon",
    state_bytes=muon_state_bytes,
    step_temp_bytes=muon_step_temp_bytes,
    # Newton-Schulz on an h × h matrix costs ~(4h + 2h) FLOPs per element per iteration, 5 iterations:
    # 30·h; declared for h = 4096 (MUON_FLOPS_WIDTH), plus momentum (6) and update (3).
    flops_per_param=30 * MUON_FLOPS_WIDTH + 9,
    states_per_param=1,
    torch_class="fitplan_optimizers_extra.torch_impl.Muon",
    torch_kwargs={"momentum": 0.95, "adamw_betas": (0.9, 0.95), "weight_decay": 0.0},
    doc="Muon (MomentUm Orthogonalized by Newton-Schulz) for hidden matrices: one momentum buffer, the "
        "update orthogonalised by 5 Newton-Schulz iterations in bf16; embeddings, LM head and 1-D tensors "
        "use an auxiliary AdamW (two states).",
    source="Jordan et al. 2024, 'Muon: An optimizer for hidden layers in neural networks' "
           "(kellerjordan.github.io/posts/muon); reference KellerJordan/Muon muon.py",
)

OPTIMIZERS: tuple[OptimizerSpec, ...] = (
    LION,
    *(_galore(name, rank) for name, rank in GALORE_RANKS.items()),
    ADAM_MINI,
    MUON,
)


@hookimpl
def fitplan_register_optimizers(register):
    """Lion, GaLore AdamW (ranks 128, 256, 512, 1024), Adam-mini and Muon."""
    for spec in OPTIMIZERS:
        register(spec)
