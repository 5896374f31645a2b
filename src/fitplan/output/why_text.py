"""Why plan 1, as lines of text: the binding constraint, the runner-up per dimension, the price of twice the speed.

One wording for every format: the terminal table and Markdown print these lines, the HTML report lists them, and
the JSON report carries the same facts under ``why`` (:meth:`fitplan.search.why.Why.to_dict`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fitplan.search.plans import Plan
    from fitplan.search.why import Alternative, Why

DIMENSIONS = (("gpu", "GPU type"), ("gpus", "GPU count"), ("provider", "provider"))
"""The dimensions whose runner-up "why plan 1" names (:func:`fitplan.search.why.runner_ups`), with their names."""
_DIM_NAMES = dict(DIMENSIONS)


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f} h"


def _signed_usd(v: float | None) -> str:
    return "-" if v is None else f"{'+' if v >= 0 else '-'}${abs(v):,.2f}"


def _signed_hours(v: float | None) -> str:
    return "-" if v is None else f"{'+' if v >= 0 else '-'}{abs(v) / 3600:.2f} h"


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}"


def alternative_text(a: Alternative) -> str:
    """``LABEL: $cost, time (Δ +$x, -y h)``."""
    p = a.plan
    if p.cost_usd is None and p.train_seconds is None:
        return p.label  # no dataset or no price: nothing to compare but the plan
    return (f"{p.label}: {_usd(p.cost_usd)}, {_hours(p.train_seconds)} "
            f"({_signed_usd(a.delta_cost_usd)}, {_signed_hours(a.delta_seconds)} against plan 1)")


def spot_line(plan: Plan | None) -> list[str]:
    """For plan 1 on spot: the expected billed hours and the checkpoint interval of the interruption model
    (:mod:`fitplan.builtin.spot_risk`, read from the estimate's ``cost`` section), or that spot is unpriced for
    risk (the provider states no rate, or the instance no checkpoint bandwidth)."""
    if plan is None or plan.market != "spot" or plan.estimate is None:
        return []
    from fitplan.output.estimate_report import sections_json

    cost = sections_json(plan.estimate).get("cost") or {}
    risk = cost.get("spot_risk") or {}
    tau = risk.get("checkpoint_interval_seconds")
    if tau is None:
        return ["spot: unpriced for risk (no interruption rate or checkpoint bandwidth stated): billed time is the "
                f"training time × {risk.get('time_factor') or 0:.2f}, an assumed overhead"]
    hours = cost["spot_usd_per_run"] / cost["spot_per_hour"]  # billed hours: cost per run / price per hour
    return [f"spot: {hours:,.2f} h billed expected; checkpoint every {tau / 60:,.1f} min "
            f"({risk['lost_seconds_per_interruption'] / 60:,.1f} min lost per interruption, one every "
            f"{risk['mean_seconds_between_interruptions'] / 3600:,.2f} h)"]


def why_lines(why: Why | None, first: Plan | None = None) -> list[str]:
    """The lines that say why plan 1 (``first``; none without plans)."""
    if why is None:
        return []
    lines = [f"binding: {why.reason}", *spot_line(first)]
    for a in why.runner_ups:
        lines.append(f"runner-up with another {_DIM_NAMES[a.dimension]} ({a.value}): {alternative_text(a)}")
    ts = why.twice_speed
    if ts is None:
        lines.append("twice the speed: none found within the searched space")
    else:
        ratio = "" if ts.value is None else f", {ts.value:.2f}× plan 1's cost"
        lines.append(f"twice the speed: {alternative_text(ts)}{ratio}")
    return lines
