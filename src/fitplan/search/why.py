"""Why plan 1: what binds it, the runner-up per dimension, and the price of twice the speed.

Everything here is drawn from what the search already evaluated (no second search): the collector keeps the best
allowed plan per GPU type, per GPU count and per provider (:attr:`fitplan.search.plans.Collector.best_by`) and, per
(GPU type, GPU count), the smallest excess of a candidate that did not fit (``misses``); the rejected plans carry the
rule that rejected them; the Pareto front holds, for every time limit, the cheapest plan within it.

The binding constraint of plan 1 (docs/recommend.md, "Why this plan"):

* ``policy``: an allowed-by-memory plan better on the objective was rejected by a forbid rule, or ranked below plan 1
  by a penalise rule (the rule is named);
* ``memory``: objective cost: a GPU type cheaper per GPU-hour than plan 1's fits nothing (the next cheaper such
  type, by how many bytes its nearest candidate missed); objective gpus: fewer GPUs fit nothing;
* ``price``: objective cost, neither of the above: plan 1 is the cheapest plan that fits;
* ``time``: objective time: plan 1 is the fastest plan that fits;
* ``gpus``: objective gpus, fewest GPUs that fit.
"""

from __future__ import annotations

from typing import Any

import attrs

from fitplan.output.why_text import DIMENSIONS
from fitplan.search.plans import Plan


@attrs.frozen
class Alternative:
    """Another plan beside plan 1: its label, cost and time, and the differences (this one minus plan 1)."""

    dimension: str
    value: Any
    plan: Plan
    delta_cost_usd: float | None
    delta_seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"dimension": self.dimension, "value": self.value, "label": self.plan.label,
                "cost_usd": self.plan.cost_usd, "train_seconds": self.plan.train_seconds,
                "delta_cost_usd": self.delta_cost_usd, "delta_seconds": self.delta_seconds}


@attrs.frozen
class Why:
    """Why plan 1: the binding constraint (``binding``, ``reason``, ``detail``), the runner-ups, twice the speed."""

    binding: str
    reason: str
    detail: dict[str, Any]
    runner_ups: list[Alternative]
    twice_speed: Alternative | None
    """The cheapest evaluated plan at most half as long as plan 1 (``value``: its cost / plan 1's), None if none."""

    def to_dict(self) -> dict[str, Any]:
        ts = None
        if self.twice_speed is not None:
            ts = self.twice_speed.to_dict() | {"cost_ratio": self.twice_speed.value}
        return {"binding": self.binding, "reason": self.reason, "detail": dict(self.detail),
                "runner_ups": [a.to_dict() for a in self.runner_ups], "twice_speed": ts}


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _alt(dimension: str, value: Any, plan: Plan, first: Plan) -> Alternative:
    return Alternative(dimension, value, plan, _sub(plan.cost_usd, first.cost_usd),
                       _sub(plan.train_seconds, first.train_seconds))


def _value(plan: Plan, dimension: str) -> Any:
    return {"gpu": plan.fields["gpu"], "gpus": plan.world_size, "provider": plan.fields.get("provider")}[dimension]


def runner_ups(best_by: dict[tuple[str, Any], tuple[tuple, Plan]], first: Plan) -> list[Alternative]:
    """Per dimension, the best allowed plan (by ranking key) whose value in it differs from plan 1's."""
    out = []
    for dim, _ in DIMENSIONS:
        mine = _value(first, dim)
        others = [(key, value, p) for (d, value), (key, p) in best_by.items() if d == dim and value != mine]
        if others:
            _, value, p = min(others, key=lambda x: x[0])
            out.append(_alt(dim, value, p, first))
    return out


def twice_speed(front: list[Plan], first: Plan) -> Alternative | None:
    """The cheapest plan of the front whose time is at most half of plan 1's: the cheapest such plan among all
    evaluated allowed plans is on the front (any plan within the time limit that beats it would be cheaper)."""
    if first.train_seconds is None or first.cost_usd is None:
        return None
    within = [p for p in front if p.train_seconds is not None and p.cost_usd is not None
              and p.train_seconds <= first.train_seconds / 2]
    if not within:
        return None
    p = min(within, key=lambda q: (q.cost_usd, q.train_seconds))
    ratio = p.cost_usd / first.cost_usd if first.cost_usd else None
    return Alternative("twice_speed", ratio, p, _sub(p.cost_usd, first.cost_usd),
                       _sub(p.train_seconds, first.train_seconds))


def _objective_value(objective: str, plan: Plan) -> float | None:
    return {"cost": plan.cost_usd, "time": plan.train_seconds, "gpus": plan.world_size}[objective]


def _policy(objective: str, plans: list[Plan], rejected: list[Plan], first: Plan) -> tuple[str, dict] | None:
    """A plan better on the objective that a forbid rule rejected, or a penalise rule ranked below plan 1."""
    mine = _objective_value(objective, first)
    if mine is None:
        return None
    for p in rejected:
        v = _objective_value(objective, p)
        if v is not None and v < mine and p.rejected_by:
            rule = p.rejected_by[0].rule
            return (f"policy: rule {rule} rejected a better plan ({p.label}, {objective} {_show(objective, v)})",
                    {"rule": rule, "action": "forbid", "plan": p.label, "value": v})
    for p in plans[1:]:
        v = _objective_value(objective, p)
        if v is not None and v < mine and p.penalties:
            rule = p.penalties[0].rule
            return (f"policy: rule {rule} penalised a better plan ({p.label}, {objective} {_show(objective, v)})",
                    {"rule": rule, "action": "penalise", "plan": p.label, "value": v})
    return None


def _show(objective: str, v: float) -> str:
    return f"${v:,.2f}" if objective == "cost" else f"{v / 3600:.2f} h" if objective == "time" else f"{v:g} GPUs"


def _memory_cost(misses: dict[tuple[str, int], int], best_by: dict, prices: dict[str, float],
                 first: Plan) -> tuple[str, dict] | None:
    """The next GPU type cheaper per GPU-hour than plan 1's on which nothing fit, with its nearest miss."""
    mine = prices.get(first.fields["gpu"])
    if mine is None:
        return None
    fitless = {g for g, _ in misses if ("gpu", g) not in best_by and prices.get(g) is not None and prices[g] < mine}
    if not fitless:
        return None
    g = max(fitless, key=lambda x: (prices[x], x))
    excess = min(v for (gid, _), v in misses.items() if gid == g)
    return (f"memory: {g} (${prices[g]:,.2f} per GPU-hour, {first.fields['gpu']} ${mine:,.2f}) fits nothing: its "
            f"nearest candidate needs {excess / 1e9:.2f} GB more than its limit",
            {"gpu": g, "per_gpu_hour_usd": prices[g], "short_bytes": excess})


def _memory_gpus(misses: dict[tuple[str, int], int], first: Plan) -> tuple[str, dict] | None:
    """Fewer GPUs than plan 1's fit nothing: the next smaller GPU count and its nearest miss."""
    smaller = {w for _, w in misses if w < first.world_size}
    if not smaller:
        return None
    w = max(smaller)
    excess = min(v for (_, ww), v in misses.items() if ww == w)
    return (f"memory: {w} GPU{'s' if w > 1 else ''} fit{'' if w > 1 else 's'} nothing: the nearest candidate needs {excess / 1e9:.2f} GB more than its limit",
            {"gpus": w, "short_bytes": excess})


def explain(objective: str, plans: list[Plan], pareto: list[Plan], rejected: list[Plan], collector,
            prices: dict[str, float]) -> Why | None:
    """Why plan 1 of one ranking (``prices``: the cheapest on-demand price per GPU-hour of each GPU type searched)."""
    if not plans:
        return None
    first = plans[0]
    found = _policy(objective, plans, rejected, first)
    binding = "policy"
    if found is None and objective == "cost":
        found, binding = _memory_cost(collector.misses, collector.best_by, prices, first), "memory"
    if found is None and objective == "gpus":
        found, binding = _memory_gpus(collector.misses, first), "memory"
    if found is None:
        binding = {"cost": "price", "time": "time", "gpus": "gpus"}[objective]
        found = ({"price": "price: the cheapest plan that fits", "time": "time: the fastest plan that fits",
                  "gpus": "gpus: the fewest GPUs that fit"}[binding], {})
    reason, detail = found
    return Why(binding, reason, detail, runner_ups(collector.best_by, first), twice_speed(pareto, first))


def gpu_hour_prices(rules, providers: tuple[str, ...] | None) -> dict[str, float]:
    """The cheapest on-demand price per GPU-hour of each GPU type over the providers searched (``providers``, or
    every market provider: reference tables only when named, as :func:`fitplan.search.space.hardware_options`)."""
    out: dict[str, float] = {}
    for (p, _, _), i in rules.instances.items():
        if providers is not None and p not in providers or providers is None and rules.provider(p).reference:
            continue
        if i.on_demand_per_hour is None or not i.gpus:
            continue
        v = i.on_demand_per_hour / i.gpus
        if v < out.get(i.gpu, float("inf")):
            out[i.gpu] = v
    return out
