"""The assess step: an Estimate's advice, policy verdicts and the seed chapter's differences.

This is the only place that evaluates variant scenarios (the advice rules' "what if" and the same scenario
under ``--assumptions seed``), so that rendering never re-computes: every renderer receives an
:class:`Assessment` (or, for recommendations, plans whose estimates were assessed) and only formats it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from fitplan.errors import FitplanError
from fitplan.estimation import Estimate, evaluate


@attrs.frozen
class Assessment:
    """An estimate and what the rules say about it.

    :ivar advice: the advice rules that fire (``rulesets/advice``), in rule order (empty when not asked for).
    :ivar verdicts: the policy rules that fire, per market with a price; None when no policy is in force.
    :ivar seed: the same scenario under the seed chapter's assumptions (None unless asked for, or when it
        cannot be evaluated).
    """

    estimate: Estimate
    advice: tuple[Any, ...] = ()
    verdicts: tuple[dict[str, Any], ...] | None = None
    seed: Estimate | None = None
    cheapest: dict[str, Any] | None = None
    """Without ``--gpu``: where the scenario runs for least (:func:`fitplan.search.sweep.cheapest`), or None."""


def assess(est: Estimate, *, policy_files: Sequence[str | Path] = (), advice: bool = True,
           seed: bool = False, cheapest: bool = False) -> Assessment:
    """Evaluate the advice rules (with their variant scenarios), the policies in force (the rulesets' and
    ``policy_files``), with ``seed`` the scenario under the seed's assumptions, and with ``cheapest`` (when the
    scenario names no GPU) the GPU it runs on for least."""
    from fitplan.rules.advice import advise
    from fitplan.rules.policy import estimate_verdicts

    tips = tuple(advise(est)) if advice else ()
    verdicts = estimate_verdicts(est, policy_files)
    return Assessment(est, tips, None if verdicts is None else tuple(verdicts), _seed(est) if seed else None,
                      _cheapest(est) if cheapest and est.scenario.hardware.gpu is None else None)


def _cheapest(est: Estimate) -> dict[str, Any] | None:
    from fitplan.context import Context
    from fitplan.search.sweep import cheapest

    return cheapest(est.scenario, Context(est.registry, est.rulesets), arch=est.arch)


def _seed(est: Estimate) -> Estimate | None:
    s = est.scenario
    if s.model.assumptions == "seed" or s.model.method != "full":
        return None
    try:
        return evaluate(s.replace(assumptions="seed"), est.registry, est.rulesets)
    except FitplanError:
        return None
