"""Backward formulas as they run without an instrument: undoing what a dispatch mode changes in them.

A ``TorchDispatchMode`` (the referee's :class:`~fitplan_torch.measure.LiveBytes`) changes the backward it measures.
Several of autograd's C++ derivative formulas pick between an in-place and an out-of-place version of their last
op by asking whether a tensor is "subclass-like" (``areAnyTensorSubclassLike``), and that test answers yes for
every tensor whenever a Python dispatch mode is active (``isTensorSubclassLike`` starts with ``if
(c10::impl::dispatch_mode_enabled()) return true``: torch 2.13, ``torch/include/ATen/TensorSubclassLikeUtils.h``).
So under the referee's counter these formulas fill a fresh zeros tensor *out of place*, one more tensor of the
input's size alive with the gradient, where a real step (no mode) fills it in place. Measured with
``torch.profiler`` on torch 2.13 CPU, the plain backward runs, and the one under a mode instead:

* ``index.Tensor`` (derivatives.yaml: ``index_backward(grad.new_zeros_symint(self.sym_sizes(), ...), indices,
  grad)``): ``_index_put_impl_`` in place; under a mode ``index_put`` (a clone, then ``index_put_``);
* ``gather`` / ``take_along_dim`` (``gather_backward``): ``scatter_add_``; under a mode ``scatter_add``;
* ``index_select`` (``index_select_backward``): ``index_add_``; under a mode ``index_add``;
* ``masked_select`` (``masked_select_backward``): ``masked_scatter_``; under a mode ``masked_scatter``;
* ``topk``, ``sort``, ``max.dim`` (``value_selecting_reduction_backward``): ``scatter_``; under a mode
  ``scatter``.

An MoE layer's backward runs several of them (the router's ``topk``, the token gather ``hidden[perm]``, ...): the
counter saw one ``tokens × top_k × hidden`` tensor more than the step holds, at the peak of LoRA with gradient
checkpointing (qwen3_moe, 1.9 % high). :func:`in_place` gives the counter the in-place op to run instead, so it
measures the step as it runs without it (same values: the formula's zeros tensor is its own temporary).
"""

from __future__ import annotations

from typing import Any

ZEROS = ("new_zeros", "zeros", "zeros_like")
"""The aten ops the formulas make their zeros tensor with (``new_zeros`` under a mode, ``zeros`` or
``zeros_like`` in ``value_selecting_reduction_backward`` and ``masked_select_backward``)."""
OUT_OF_PLACE = ("index_put", "scatter_add", "index_add", "masked_scatter", "scatter")
"""The out-of-place ops the formulas above switch to under a mode (each has an in-place twin, name + ``_``)."""


def op_name(func) -> str:
    """``aten.index_put.default`` -> ``index_put``."""
    return func._schema.name.split("::", 1)[1]


def makes_zeros(func) -> bool:
    """Whether ``func`` makes a zeros tensor (what the formulas fill)."""
    return op_name(func) in ZEROS


def in_place(func, args: tuple, fresh) -> Any | None:
    """The in-place twin of ``func`` (``aten.index_put_.default`` for ``aten.index_put.default``) when ``func`` is
    one of :data:`OUT_OF_PLACE`, runs inside a backward formula (the autograd engine is running a graph task with
    grad mode off: a checkpoint's recomputed forward runs with grad on, torch/utils/checkpoint.py) and fills
    ``fresh``, the zeros tensor the last zeros op made; else None (run ``func`` as it is)."""
    import torch

    if fresh is None or not args or args[0] is not fresh or op_name(func) not in OUT_OF_PLACE:
        return None
    if torch.is_grad_enabled() or torch._C._current_graph_task_id() == -1:
        return None
    packet = getattr(torch.ops.aten, op_name(func) + "_", None)
    return getattr(packet, func._overloadname, None) if packet is not None else None
