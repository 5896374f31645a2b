"""Where a learned layer (or the epilogue) reads a tensor an earlier layer made: which layers must be built one by one,
and which layer a ``["layer", expr, "t<k>"]`` reference names (the learner's side:
fitplan_torch/learn/crosslayer.py). Used by :class:`fitplan.trace.learned_graph.Builder`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitplan.arch.archexpr import compile_expr

if TYPE_CHECKING:
    from fitplan.trace.learned_segment import Segment


def cross_layer(v: dict[str, Any]) -> dict[int, Segment] | None:
    """Where a layer reads a tensor an earlier layer made (``["layer", expr, "t<k>"]`` in ``layer_args``: a
    state carried from layer to layer, K/V shared with a later layer; fitplan_torch/learn/crosslayer.py), the
    layers' instances by index, filled as they run (each layer is then built on its own, unweighted: a
    repeated block stands for layers whose tensors are never made); else None."""
    args = [*v.get("layer_args", {}).values(), v.get("epilogue_args", [])]
    return {} if any(isinstance(r, list) and r[0] == "layer" for refs in args for r in refs) else None


def maker(env: dict[str, Any], expr: str, i: int) -> int:
    """The layer whose tensor layer ``i`` reads (``expr`` over ``i`` and the config's fields).

    :raises FitplanError: the config leaves a field of ``expr`` empty, or it names no earlier layer."""
    from fitplan.errors import FitplanError

    try:
        m = compile_expr(expr)({**env, "i": i})
    except Exception as e:  # noqa: BLE001 - a field the expression reads that this config lacks
        raise FitplanError(f"cannot tell which layer's tensor layer {i} reads from {expr!r} ({type(e).__name__}: "
                           f"{e})", field="$.layer_types", value=None,
                           suggestion="state the per-layer fields (layer_types) the learned file reads") from None
    if not (isinstance(m, int) and 0 <= m < i):
        raise FitplanError(f"layer {i} reads a tensor of layer {m} by {expr!r}, which is no earlier layer",
                           field="$.num_hidden_layers", value=env.get("num_hidden_layers"),
                           suggestion="re-learn the architecture from a config of this shape")
    return m
