"""Side by side: one scenario on every GPU of the hardware ruleset, or priced by every provider.

Each variant is an ordinary estimate of the scenario with one field changed (``--gpu X``, ``--provider P``), so
its numbers are those of ``fitplan estimate`` with that flag. A variant that cannot be evaluated (a provider
that rents no such GPU, a GPU without the precision's dtype) comes back as its :class:`FitplanError`, which
says why. ``fitplan serve``'s page shows these next to the scenario's own estimate.
"""

from __future__ import annotations

from collections.abc import Callable
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


def across_gpus_and_providers(base: sc.Scenario, ctx, *, arch: Any = None,
                              check: Callable[[], None] | None = None) -> list[tuple[str, str, Any]]:
    """``(gpu id, provider id, Estimate or FitplanError)`` for every GPU and every provider (``--instance`` and
    ``--region`` dropped), GPUs in ruleset order: what each GPU costs wherever it is rented. ``check`` is called
    before each GPU's variants (it may raise to stop: ``fitplan serve`` stops work a newer page view made useless)."""
    out = []
    for gid in ctx.rulesets.gpus:
        if check is not None:
            check()
        out += [(gid, pid, _variant(base, ctx, arch, gpu=gid, provider=pid, instance=None, region=None))
                for pid in ctx.rulesets.providers]
    return out


def cheapest(base: sc.Scenario, ctx, *, arch: Any = None) -> dict[str, Any]:
    """Where ``base`` runs for least, when it names no GPU: every GPU of the hardware ruleset on which it fits
    (``fitplan estimate --gpu X``'s verdict), each priced on demand by every provider renting it, the same GPU
    count. Returns ``{"gpu", "provider", "instance", "on_demand_usd", "seconds", "device_total", "usable"
    (bytes per GPU), "fits_on"}`` (``fits_on``: the GPU ids it fits on, in ruleset order), ``{"fits_on": [...]}``
    when none can be priced (no dataset size, or no provider rents a GPU it fits on; ``fits_on`` empty when it fits
    on none)."""
    fitting = [(gid, e) for gid, e in across_gpus(base, ctx, arch=arch) if not isinstance(e, FitplanError) and e.role("fit")]
    best: tuple[float, str, str, Any] | None = None
    for gid, est in fitting:
        if est.role("seconds") is None:
            continue
        for pid, priced in across_providers(est.scenario, ctx, arch=arch):
            cost = None if isinstance(priced, FitplanError) else priced.role("cost.on_demand")
            if cost is not None and (best is None or cost < best[0]):
                best = (cost, gid, pid, priced)
    out: dict[str, Any] = {"fits_on": [gid for gid, _ in fitting]}
    if best is not None:
        cost, gid, pid, est = best
        inst = est.role("instance")
        out.update(gpu=gid, provider=pid, instance=None if inst is None else inst.instance.id,
                   on_demand_usd=cost, seconds=est.role("seconds"),
                   device_total=int(est.role("device_total")), usable=int(est.role("usable")))
    return out
