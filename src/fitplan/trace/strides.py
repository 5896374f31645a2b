"""Strides of a learned segment's views, for the one place the replay needs them: a cast that the recording made
and the replay drops.

A graph recorded in 16-bit is replayed for fp32 runs too; there ``x.to(torch.float32, ...)`` of an fp32 tensor
returns ``x`` itself (torch 2.13, aten/src/ATen/native/TensorConversions.cpp ``to_will_alias``: same dtype, layout
and device, no ``copy``, and a memory format that is ``preserve`` or the one ``suggest_memory_format()`` already
reports, which is ``contiguous`` for any tensor whose strides are not channels-last-like), so the replay drops
the cast (:meth:`.learned_segment.Segment.op`). In the recording the cast was a new, contiguous tensor, and a
``reshape`` of it was recorded as a ``view``. In the fp32 run the same ``reshape`` reads the cast's *input*,
which may be a transposed or sliced view: where no strides give the new shape, ``reshape`` copies
(aten/src/ATen/native/TensorShape.cpp ``reshape_symint``: ``_unsafe_view(self.clone(contiguous), shape)``).
Qwen3-Next's and OLMo-Hybrid's gated delta rule return ``core_attn_out[:, :, :s].transpose(1, 2).to(dtype,
memory_format=torch.contiguous_format)``, which their layer then reshapes to ``(-1, head_dim)``: a copy at
fp32, a view of the bf16 cast at 16 bits.

The recorded ops carry their tensors' symbolic shapes but not their scalar arguments, so a view op's effect on
the strides is read from its input and output shapes (:func:`derived`); where that is ambiguous (a transpose of
two dimensions of the same expression) or the op is not one of these, the strides are unknown and the replay
keeps the recorded view.
"""

from __future__ import annotations

import math
from typing import Sequence

Strides = tuple[int, ...]


def contiguous(shape: Sequence[int]) -> Strides:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def view_strides(old_shape: Sequence[int], old_strides: Sequence[int], new_shape: Sequence[int]) -> Strides | None:
    """The strides ``view(new_shape)`` gives a tensor of ``old_shape`` and ``old_strides``, or None where no strides
    do (torch 2.13 aten/src/ATen/TensorUtils.cpp ``computeStride``, transcribed)."""
    if not old_shape:
        return tuple(1 for _ in new_shape)
    if math.prod(old_shape) == 0:
        return tuple(old_strides) if tuple(old_shape) == tuple(new_shape) else contiguous(new_shape)
    new = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[d]
        if d == 0 or (old_shape[d - 1] != 1 and old_strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base, tensor_numel, view_numel = old_strides[d - 1], 1, 1
    return tuple(new) if view_d == -1 else None


def _swaps(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))
            if a[i] == b[j] and a[j] == b[i] and all(a[k] == b[k] for k in range(len(a)) if k not in (i, j))]


def _removed(a: Sequence[str], b: Sequence[str]) -> list[int]:
    return [k for k in range(len(a)) if list(a[:k]) + list(a[k + 1:]) == list(b)]


def derived(name: str, in_dims: Sequence[str], in_shape: Sequence[int], in_strides: Strides,
            out_dims: Sequence[str], out_shape: Sequence[int]) -> Strides | None:
    """The strides of view op ``name``'s output (symbolic dims ``out_dims``, sizes ``out_shape``) from its input's,
    or None: unknown (an op not handled here, or one whose dimensions the shapes do not identify)."""
    s = tuple(in_strides)
    if name in ("view", "_unsafe_view", "reshape", "alias", "detach", "view_as", "_reshape_alias"):
        return view_strides(in_shape, s, out_shape)
    if name in ("slice.Tensor", "split.Tensor", "split_with_sizes", "chunk", "narrow"):
        return s if len(in_dims) == len(out_dims) else None  # a step of 1 (Python's x[a:b]) keeps the strides
    if name in ("transpose.int", "t", "swapaxes", "movedim.int") and len(in_dims) == len(out_dims):
        if list(in_dims) == list(out_dims):
            return s
        sw = _swaps(in_dims, out_dims)
        if len(sw) != 1:
            return None
        i, j = sw[0]
        out = list(s)
        out[i], out[j] = s[j], s[i]
        return tuple(out)
    if name == "permute" and len(set(in_dims)) == len(in_dims) and sorted(in_dims) == sorted(out_dims):
        return tuple(s[list(in_dims).index(d)] for d in out_dims)
    if name in ("select.int", "unbind.int", "squeeze.dim", "squeeze.dims", "squeeze"):
        if len(out_dims) == len(in_dims):
            return s
        outs = {s[:k] + s[k + 1:] for k in _removed(in_dims, out_dims)}
        return next(iter(outs)) if len(outs) == 1 else None
    if name == "unsqueeze" and len(out_dims) == len(in_dims) + 1:
        outs = {s[:k] + ((s[k] * in_shape[k]) if k < len(s) else 1,) + s[k:] for k in _removed(out_dims, in_dims)}
        return next(iter(outs)) if len(outs) == 1 else None
    if name == "expand" and len(out_shape) >= len(in_shape):
        lead = len(out_shape) - len(in_shape)
        return tuple(0 if d < lead or (in_shape[d - lead] == 1 and out_shape[d] != 1) else s[d - lead]
                     for d in range(len(out_shape)))
    return None
