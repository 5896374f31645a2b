"""The model catalog's rows (``fitplan models list``, ``GET /api/models``)."""

from __future__ import annotations


def model_rows(rules, unavailable: list[str] | None = None) -> list[dict]:
    """One row per catalog model (``fitplan models list --format json``; ``fitplan serve``'s ``/api/models``);
    a preset that the architecture files in force do not describe (``Rulesets.preset_spec``) has no row, and
    its reason is appended to ``unavailable``."""
    from fitplan.arch.archfile import NotLearned

    rows = []
    for mid in sorted(rules.models):
        e = rules.models[mid]
        try:
            spec = rules.preset_spec(e)
        except NotLearned as err:
            if unavailable is not None:
                unavailable.append(err.render())
            continue
        rows.append({"id": mid, "hf_id": e.hf_id, "model_type": spec.model_type, "param_count": spec.param_count,
                     "active_param_count": spec.active_param_count, "source": e.source})
    return rows
