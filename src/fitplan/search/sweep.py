"""Side by side: one scenario on every GPU of the hardware ruleset, or priced by every provider.

Each variant is an ordinary estimate of the scenario with one field changed (``--gpu X``, ``--provider P``), so
its numbers are those of ``fitplan estimate`` with that flag. A variant that cannot be evaluated (a provider
that rents no such GPU, a GPU without the precision's dtype) comes back as its :class:`FitplanError`, which
says why. ``fitplan serve``'s page shows these next to the scenario's own estimate.
"""

from __future__ import annotations

from typing import Any

from fitplan.errors import FitplanError
from fitplan.inputs import scenario as sc


def _variant(base: sc.Scenario, ctx, arch: Any, **changes: Any):
    from fitplan.estimation import evaluate

    try:
        return evaluate(base.replace(**changes), ctx.registry, ctx.rulesets, arch=arch)
    except FitplanError as e:
        return e


def across_gpus(base: sc.Scenario, ctx, *, arch: Any = None) -> list[tuple[str, Any]]:
    """``(gpu id, Estimate or FitplanError)`` for every GPU of the hardware ruleset, in ruleset order.

    Memory does not depend on the provider, so the variants are priced by none (``--provider``, ``--instance``
    and ``--region`` are dropped: a provider need not rent every GPU).
    """
    return [(gid, _variant(base, ctx, arch, gpu=gid, provider=None, instance=None, region=None))
            for gid in ctx.rulesets.gpus]


def across_providers(base: sc.Scenario, ctx, *, arch: Any = None) -> list[tuple[str, Any]]:
    """``(provider id, Estimate or FitplanError)`` for every provider of the pricing rulesets, renting
    ``base``'s GPUs (``--instance`` and ``--region`` are kept for ``base``'s own provider only)."""
    out = []
    for pid in ctx.rulesets.providers:
        own = pid == base.cost.provider
        out.append((pid, _variant(base, ctx, arch, provider=pid, instance=base.cost.instance if own else None,
                                  region=base.cost.region if own else None)))
    return out


def across_gpus_and_providers(base: sc.Scenario, ctx, *, arch: Any = None) -> list[tuple[str, str, Any]]:
    """``(gpu id, provider id, Estimate or FitplanError)`` for every GPU and every provider (``--instance`` and
    ``--region`` dropped), GPUs in ruleset order: what each GPU costs wherever it is rented."""
    return [(gid, pid, _variant(base, ctx, arch, gpu=gid, provider=pid, instance=None, region=None))
            for gid in ctx.rulesets.gpus for pid in ctx.rulesets.providers]
