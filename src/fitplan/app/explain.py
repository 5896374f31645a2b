"""``fitplan explain`` and ``GET /api/explain``: the explanation of one quantity for a scenario's options."""

from __future__ import annotations

from typing import Any

from fitplan.app.options import estimate_from


EXAMPLE = {"model": "llama-2-7b", "precision": "bf16-mixed", "per_device_train_batch_size": 4}
"""What ``fitplan explain`` explains without a model (the documented example)."""

def explanation_for(quantity: str, depth: int, options: dict[str, Any]):
    """The :class:`~fitplan.output.explain.Explanation` of ``quantity`` for the scenario of ``options`` (the
    documented example when they name no model)."""
    from fitplan.assess import assess
    from fitplan.output.explain import explain as explanation

    if not any(options.get(k) for k in ("model", "params", "scenario_file", "recipe")):
        options = {**options, **{k: options.get(k) or v for k, v in EXAMPLE.items()}}
    est = estimate_from(options)
    return explanation(assess(est, advice=False, seed=True), quantity_name(quantity, est), depth=depth)

def quantity_name(name: str, est) -> str:
    """A node of the graph, by its name or its ``short`` metadata."""
    graph = est.registry.compiled()
    shorts = {q.short: q.name for q in graph.quantities.values() if q.short}
    name = shorts.get(name, name)
    if name in graph.nodes:
        return name
    from fitplan.errors import unknown

    raise unknown("quantity", name, [n for n in graph.nodes if graph.nodes[n].kind != "input"] + list(shorts))
