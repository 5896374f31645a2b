"""A plan as text, in every recommend format: its command line, its market, why a policy rejected it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fitplan.inputs import scenario as sc
from fitplan.inputs.sources import scenario_args

if TYPE_CHECKING:
    from fitplan.search.plans import Plan


def command_line(base: sc.Scenario, plan: Plan) -> str:
    """The ``fitplan estimate`` command line of ``plan``'s scenario (:func:`fitplan.search.plans.plan_scenario`:
    ``base`` with the fields the search chose)."""
    import shlex

    return "fitplan estimate " + " ".join(shlex.quote(a) for a in scenario_args(base.replace(**plan.fields)))

def describe_market(plan: Plan) -> str:
    """The plan's market in words (``spot``, ``on demand``, ``-``)."""
    return {"spot": "spot", "on_demand": "on demand", None: "-"}[plan.market]

def rejection_text(plan: Plan) -> str:
    """The policy rules that rejected ``plan``, each with its reason."""
    return "; ".join(f"{v.rule}: {v.reason}" for v in plan.rejected_by)
