"""Small, correct torch implementations of the plugin's optimizers, for ``fitplan validate``.

This module imports torch; nothing else in the plugin does, so fitplan loads the plugin without
torch. The fitplan-torch plugin imports it through ``OptimizerSpec.torch_class`` and builds
``cls(params, lr=..., **torch_kwargs)``.

Each class follows its reference implementation operation by operation (so the temporaries that
:mod:`fitplan_optimizers_extra.optimizers` models are the reference's), single-device, one parameter
at a time. Differences from the references are listed per class.

GaLore, Muon and Adam-mini treat embeddings and the LM head apart from the hidden matrices. They
decide from parameter names when the optimizer is given ``model.named_parameters()`` (torch >= 2.6
keeps them as ``param_group["param_names"]``), and a group may say so itself with ``hidden=True`` or
``hidden=False``. Given bare tensors, every 2-D parameter counts as hidden (with a warning), which is
not what fitplan's estimate assumes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

EMBEDDING_OR_HEAD_NAMES = ("embed", "wte", "wpe", "lm_head", "output.weight")
"""Substrings of parameter names that mark token/position embeddings and the LM head (the names
Adam-mini's reference and Muon's example use; HF's llama, gpt2, gpt-neox, falcon, phi3 match)."""


def is_embedding_or_head_name(name: str) -> bool:
    return any(k in name for k in EMBEDDING_OR_HEAD_NAMES)



def _run_closure(closure: Callable[[], float] | None) -> float | None:
    """The loss of ``closure`` computed with gradients enabled, as torch's optimizers do (None without one)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()

class _Classified(torch.optim.Optimizer):
    """Base: which parameters are hidden matrices (``self._hidden[p]``): 2 or more dimensions (3-D:
    fused MoE experts, a batch of matrices), not an embedding or the LM head."""

    def _classify(self) -> None:
        self._hidden: dict[torch.Tensor, bool] = {}
        warned = False
        for group in self.param_groups:
            names = group.get("param_names")
            for i, p in enumerate(group["params"]):
                if "hidden" in group:
                    self._hidden[p] = bool(group["hidden"]) and p.ndim >= 2
                elif names is not None:
                    self._hidden[p] = p.ndim >= 2 and not is_embedding_or_head_name(names[i])
                else:
                    if p.ndim >= 2 and not warned:
                        warnings.warn(f"{type(self).__name__} got parameters without names: every parameter of 2 or "
                                      "more dimensions is treated as a hidden matrix (pass model.named_parameters())",
                                      stacklevel=3)
                        warned = True
                    self._hidden[p] = p.ndim >= 2

    def _embedding_or_head(self, p: torch.Tensor) -> bool:
        return p.ndim == 2 and not self._hidden[p]


# --------------------------------------------------------------------------- Lion


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, Algorithm 2), as lucidrains/lion-pytorch implements it.

    State: ``exp_avg`` like the parameter; no step. Differs from lucidrains only in allocating one
    temporary per parameter instead of two (``exp_avg.lerp(grad, 1 - β1)`` instead of
    ``exp_avg.clone().mul_(β1).add(grad, alpha=1 - β1)``); the arithmetic is the same.
    """

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        if not lr > 0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not all(0.0 <= b <= 1.0 for b in betas):
            raise ValueError(f"Invalid betas: {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        loss = _run_closure(closure)
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                if wd:
                    p.mul_(1.0 - lr * wd)
                update = exp_avg.lerp(grad, 1.0 - beta1).sign_()  # sign(β1·m + (1-β1)·g)
                p.add_(update, alpha=-lr)
                del update
                exp_avg.lerp_(grad, 1.0 - beta2)  # m = β2·m + (1-β2)·g
        return loss


# --------------------------------------------------------------------------- GaLore AdamW


class GaLoreAdamW(_Classified):
    """GaLore AdamW (Zhao et al. 2024), after jiaweizzhao/GaLore ``galore_torch/adamw.py`` with the
    ``std`` projector of ``galore_projector.py``.

    2-D hidden matrices: the gradient is projected onto its top-``rank`` singular vectors (recomputed every
    ``update_proj_gap`` steps, starting at the first), Adam runs in the projection, the update is
    projected back and scaled by ``scale``. Other parameters: plain AdamW (the reference's default
    ``eps=1e-6`` and ``correct_bias=True``). ``step`` is a Python int.
    Differences: the projector is stored as a contiguous r × n (or m × r) copy (the reference keeps a
    view of the full fp32 ``Vh`` for fp32 parameters); the back-projected update is scaled in place.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, rank: int = 128, update_proj_gap: int = 200, scale: float = 0.25):
        if rank < 1 or update_proj_gap < 1:
            raise ValueError(f"Invalid rank {rank} or update_proj_gap {update_proj_gap}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, rank=rank,
                                      update_proj_gap=update_proj_gap, scale=scale))
        self._classify()

    @staticmethod
    def _projector(grad: torch.Tensor, rank: int) -> torch.Tensor:
        matrix = grad if grad.dtype == torch.float32 else grad.float()
        U, S, Vh = torch.linalg.svd(matrix, full_matrices=False)
        # one contiguous copy in the gradient's dtype (LAPACK may return column-major factors, and a
        # slice of them would keep the whole factor alive)
        if grad.shape[0] >= grad.shape[1]:
            P = Vh[:rank, :].to(dtype=grad.dtype, memory_format=torch.contiguous_format, copy=True)  # r × n ("right")
        else:
            P = U[:, :rank].to(dtype=grad.dtype, memory_format=torch.contiguous_format, copy=True)  # m × r ("left")
        del U, S, Vh, matrix
        return P

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        loss = _run_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if "step" not in state:
                    state["step"] = 0
                hidden = self._hidden[p] and p.ndim == 2  # >2-D (fused experts): plain AdamW here
                if hidden:
                    if "projector" not in state or state["step"] % group["update_proj_gap"] == 0:
                        state["projector"] = self._projector(grad, group["rank"])
                    P = state["projector"]
                    grad = grad @ P.t() if p.shape[0] >= p.shape[1] else P.t() @ grad
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(grad)
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denom = exp_avg_sq.sqrt().add_(group["eps"])
                step_size = group["lr"] * math.sqrt(1.0 - beta2 ** state["step"]) / (1.0 - beta1 ** state["step"])
                norm_grad = exp_avg / denom
                if hidden:
                    P = state["projector"]
                    full = norm_grad @ P if p.shape[0] >= p.shape[1] else P @ norm_grad
                    full.mul_(group["scale"])
                    norm_grad = full
                    del full, P
                p.add_(norm_grad, alpha=-step_size)
                del norm_grad, denom, grad
                if group["weight_decay"] > 0.0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        return loss


# --------------------------------------------------------------------------- Adam-mini


class AdamMini(_Classified):
    """Adam-mini (Zhang et al. 2024), after zyushun/Adam-mini ``adam_mini/adam_mini.py``, single device.

    Embeddings and LM head: Adam with fp32 ``m`` and ``v``. Every other parameter is one block: fp32
    ``m`` and one second-moment value ``vmean`` (the mean of g² over the block) in the parameter dtype.
    Difference: query and key weights are one block each, not one block per attention head.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self._classify()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        loss = _run_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                embedding = self._embedding_or_head(p)
                if len(state) == 0:
                    state["m"] = torch.zeros_like(p, dtype=torch.float32)
                    state["step"] = 0
                    if embedding:
                        state["v"] = torch.zeros_like(p, dtype=torch.float32)
                    else:
                        state["vmean"] = torch.zeros((), dtype=p.dtype, device=p.device)
                grad = p.grad.to(torch.float32)
                state["step"] += 1
                bc1 = 1 - beta1 ** state["step"]
                bc2_sqrt = math.sqrt(1 - beta2 ** state["step"])
                if wd > 0.0:
                    p.mul_(1 - lr * wd)
                state["m"].lerp_(grad, 1 - beta1)
                if embedding:
                    state["v"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                    h = (state["v"].sqrt() / bc2_sqrt).add_(eps)
                    p.addcdiv_(state["m"], h, value=-lr / bc1)
                    del h
                else:
                    tmp = torch.sum(grad * grad) / grad.numel()
                    state["vmean"].mul_(beta2).add_(tmp.to(state["vmean"].dtype), alpha=1 - beta2)
                    h = (state["vmean"].float().sqrt() / bc2_sqrt).add_(eps)
                    update = state["m"] * ((1 / bc1) / h)
                    update.mul_(lr)
                    p.add_(-update)
                    del update, tmp, h
                del grad
        return loss


# --------------------------------------------------------------------------- Muon


def zeropower_via_newtonschulz5(G: torch.Tensor, steps: int) -> torch.Tensor:
    """The reference's quintic Newton-Schulz orthogonalisation, in bf16 (KellerJordan/Muon)."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


class Muon(_Classified):
    """Muon with an auxiliary AdamW, after KellerJordan/Muon ``SingleDeviceMuonWithAuxAdam``.

    Hidden matrices: Nesterov momentum (``momentum_buffer``), orthogonalised by 5 Newton-Schulz
    iterations (batched over the leading dimension of 3-D expert weights), scaled by sqrt(max(1, rows/cols)). Everything else: AdamW (``exp_avg``, ``exp_avg_sq``,
    Python int ``step``) with ``adamw_betas`` and ``adamw_eps``. One ``lr`` for both (the reference lets
    each group have its own; use groups with ``hidden=`` and ``lr=`` for that).
    Difference: parameters without a gradient are skipped (the reference zero-fills their grad to keep
    distributed ranks in step).
    """

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0,
                 adamw_betas: tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-10, ns_steps: int = 5):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      adamw_betas=tuple(adamw_betas), adamw_eps=adamw_eps, ns_steps=ns_steps))
        self._classify()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        loss = _run_closure(closure)
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if self._hidden[p]:
                    if len(state) == 0:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    grad, buf, beta = p.grad, state["momentum_buffer"], group["momentum"]
                    buf.lerp_(grad, 1 - beta)
                    update = grad.lerp_(buf, beta)  # Nesterov, in place on the gradient as the reference does
                    update = zeropower_via_newtonschulz5(update, steps=group["ns_steps"])
                    update *= max(1, grad.size(-2) / grad.size(-1)) ** 0.5
                    p.mul_(1 - lr * wd)
                    p.add_(update.reshape(p.shape), alpha=-lr)
                    del update
                else:
                    if len(state) == 0:
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                        state["step"] = 0
                    state["step"] += 1
                    beta1, beta2 = group["adamw_betas"]
                    buf1, buf2, grad = state["exp_avg"], state["exp_avg_sq"], p.grad
                    buf1.lerp_(grad, 1 - beta1)
                    buf2.lerp_(grad.square(), 1 - beta2)
                    buf1c = buf1 / (1 - beta1 ** state["step"])
                    buf2c = buf2 / (1 - beta2 ** state["step"])
                    update = buf1c / (buf2c.sqrt() + group["adamw_eps"])
                    del buf1c, buf2c
                    p.mul_(1 - lr * wd)
                    p.add_(update, alpha=-lr)
                    del update
        return loss
