"""The model catalog's rows (``fitplan models list``, ``GET /api/models``)."""

from __future__ import annotations


def model_rows(rules) -> list[dict]:
    """One row per catalog model (``fitplan models list --format json``; ``fitplan serve``'s ``/api/models``)."""
    from fitplan.arch.architecture import spec_from_config

    rows = []
    for mid in sorted(rules.models):
        e = rules.models[mid]
        spec = spec_from_config(e.config, name=mid)
        rows.append({"id": mid, "hf_id": e.hf_id, "model_type": spec.model_type, "param_count": spec.param_count,
                     "active_param_count": spec.active_param_count, "source": e.source})
    return rows
