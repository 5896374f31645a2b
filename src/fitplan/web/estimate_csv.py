"""``GET /api/estimate.csv``: the page's estimate as CSV, the one writer of it (the page links here; docs/serve.md).

One row per figure, five columns: ``section, name, label, value, unit``. The sections, in order:

* ``peak``: the components resident at the peak instant (``memory.peak_breakdown_bytes``, in the breakdown's
  order): they sum to the ``memory`` section's ``peak`` row;
* ``memory``: the peak, the framework overhead, the device total, the GPU's usable memory, the headroom, fits
  (each found through its quantity's role and JSON key, docs/architecture.md);
* ``largest``: each component's largest size over the step (``memory.per_gpu_bytes``: they peak at different
  phases, so these do not add up to the peak);
* ``time``: the run's seconds, their likely range and tokens per second (the seconds empty without a dataset
  size);
* ``cost``: the scenario's own provider's on-demand and spot cost (when ``provider`` is set);
* ``provider``: each provider's on-demand and spot cost and time (``/api/view``'s ``providers``).

Every value is one of ``/api/estimate``'s or ``/api/view``'s, written as JSON writes it (bytes as integers, a
boolean as ``true``/``false``, a missing value empty): nothing is computed here.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from fitplan.web.api import Query, Reply, Settings, assessment
from fitplan.web.view import breakdown_rows, provider_rows

HEADER = ("section", "name", "label", "value", "unit")
FILENAME = "fitplan-estimate.csv"


def cell(value: Any) -> str:
    """A value as JSON writes it: ``true``/``false``, integers and floats in Python's shortest repr, None empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def path_of(compiled, role: str) -> tuple[str, ...] | None:
    """Where the estimate's JSON puts the quantity holding ``role`` (its ``json_key`` metadata, split at dots):
    the core names no quantity (tests/test_layout.py)."""
    name = compiled.role(role)
    key = compiled.quantities[name].json_key if name is not None else None
    return tuple(key.split(".")) if key else None


def at(report: dict[str, Any], path: tuple[str, ...] | None) -> Any:
    """The value at ``path`` in ``report``, None where a part is missing."""
    value: Any = report if path else None
    for part in path or ():
        value = value.get(part) if isinstance(value, dict) else None
    return value


def label_of(compiled, role: str, fallback: str) -> str:
    name = compiled.role(role)
    q = compiled.quantities[name] if name is not None else None
    return (q.short_label or q.label or fallback) if q is not None else fallback


def memory_rows(report: dict[str, Any], rows: list[dict[str, Any]], compiled) -> list[tuple]:
    """The ``peak``, ``memory`` and ``largest`` sections of ``report`` (the estimate's JSON), found through the
    roles' JSON keys (``compiled``: the estimate's compiled graph)."""
    per = at(report, path_of(compiled, "peak")[:-1]) or {}  # memory.per_gpu_bytes
    at_peak = at(report, path_of(compiled, "breakdown")) or {}
    components = [r for r in rows if not r["overhead"]]
    out = [("peak", r["key"], r["label"], at_peak[r["key"]], "bytes") for r in components if r["key"] in at_peak]
    named = {r["key"] for r in components}
    out += [("peak", k, k.replace("_", " "), v, "bytes") for k, v in at_peak.items() if k not in named]  # all of it
    gpu = (report.get("gpu") or {}).get("name")
    for role, name, fallback in (("peak", "peak", "peak"), ("overhead", None, "framework overhead"),
                                 ("device_total", "device_total", "device total"), ("usable", "usable", "usable"),
                                 ("headroom", "headroom", "headroom"), ("fit", None, "the verdict: fits")):
        path = path_of(compiled, role)
        if path is None or at(report, path) is None and role in ("usable", "headroom", "fit"):
            continue  # no GPU: nothing to fit on
        label = label_of(compiled, role, fallback) + (f" on {gpu}" if role in ("usable", "fit") and gpu else "")
        out.append(("memory", name or path[-1], label, at(report, path), "" if role == "fit" else "bytes"))
    out += [("largest", r["key"], r["label"], per[r["key"]], "bytes") for r in components if r["key"] in per]
    return out


def time_cost_rows(report: dict[str, Any], providers: list[dict[str, Any]], compiled) -> list[tuple]:
    """The ``time``, ``cost`` and ``provider`` sections (the providers price nothing without a dataset size)."""
    t = report.get("time")
    if not t:
        return []
    seconds, low, high = (path_of(compiled, r) for r in ("seconds", "seconds.low", "seconds.high"))
    out = [("time", p[-1], label, at(report, p), "s") for p, label in (
        (seconds, "time"), (low, "time, likely low"), (high, "time, likely high")) if p is not None]
    out.append(("time", "tokens_per_second", "tokens per second", t.get("tokens_per_second"), "tokens/s"))
    on_demand, spot = path_of(compiled, "cost.on_demand"), path_of(compiled, "cost.spot")
    currency = at(report, path_of(compiled, "currency")) or "USD"
    provider = (report.get("cost") or {}).get("provider")
    if provider and on_demand and spot:
        out += [("cost", on_demand[-1], f"on demand on {provider}", at(report, on_demand), currency),
                ("cost", spot[-1], f"spot on {provider}", at(report, spot), currency)]
    for p in providers:
        if p.get("cost") is None or not (on_demand and spot and seconds):
            continue
        out += [("provider", f"{p['id']}.{on_demand[-1]}", f"{p['id']} on demand", p["cost"].get(on_demand[-1]), currency),
                ("provider", f"{p['id']}.{spot[-1]}", f"{p['id']} spot", p["cost"].get(spot[-1]), currency),
                ("provider", f"{p['id']}.{seconds[-1]}", f"{p['id']} time", (p.get("time") or {}).get(seconds[-1]), "s")]
    return out


def estimate_csv(report: dict[str, Any], rows: list[dict[str, Any]], providers: list[dict[str, Any]], compiled) -> str:
    """The CSV text (module doc) of ``report`` (the estimate's JSON), its breakdown ``rows``
    (:func:`~fitplan.web.view.breakdown_rows`), ``providers`` (:func:`~fitplan.web.view.provider_rows`) and the
    estimate's ``compiled`` graph (where the roles' values are in the JSON)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    for section, name, label, value, unit in memory_rows(report, rows, compiled) + time_cost_rows(report, providers,
                                                                                                    compiled):
        w.writerow((section, name, label, cell(value), unit))
    return buf.getvalue()


def csv_view(settings: Settings, query: Query) -> Reply:
    """``GET /api/estimate.csv?FLAGS``: :func:`estimate_csv` of the query's scenario, as a download."""
    from fitplan.output.estimate_report import to_json

    a, _ = assessment(settings, query)
    est = a.estimate
    text = estimate_csv(to_json(a), breakdown_rows(est), provider_rows(est, settings.context()), est.registry.compiled())
    return Reply(200, text.encode("utf-8"), "text/csv; charset=utf-8",
                 (("content-disposition", f'attachment; filename="{FILENAME}"'),))
