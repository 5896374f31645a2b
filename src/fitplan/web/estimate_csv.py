"""``GET /api/estimate.csv``: the page's estimate as CSV, the one writer of it (the page links here; docs/serve.md).

One row per figure, five columns: ``section, name, label, value, unit``. The sections, in order:

* ``peak``: the components resident at the peak instant (``memory.peak_breakdown_bytes``, in the breakdown's
  order): they sum to the ``memory`` section's ``peak`` row;
* ``memory``: the peak, the framework overhead, the device total, the GPU's usable memory, the headroom, fits;
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


def memory_rows(report: dict[str, Any], rows: list[dict[str, Any]]) -> list[tuple]:
    """The ``peak``, ``memory`` and ``largest`` sections of ``report`` (the estimate's JSON)."""
    mem = report["memory"]
    per, at_peak = mem["per_gpu_bytes"], mem.get("peak_breakdown_bytes") or {}
    components = [r for r in rows if not r["overhead"]]
    out = [("peak", r["key"], r["label"], at_peak[r["key"]], "bytes") for r in components if r["key"] in at_peak]
    named = {r["key"] for r in components}
    out += [("peak", k, k.replace("_", " "), v, "bytes") for k, v in at_peak.items() if k not in named]  # all of it
    out.append(("memory", "peak", f"peak (at {mem.get('peak_phase', '?').replace('_', ' ')})", per["peak"], "bytes"))
    out += [("memory", r["key"], r["label"], per.get(r["key"]), "bytes") for r in rows if r["overhead"]]
    out.append(("memory", "device_total", "device total", per["device_total"], "bytes"))
    gpu = (report.get("gpu") or {}).get("name")
    if mem.get("usable_bytes") is not None:
        out.append(("memory", "usable", f"usable on {gpu}", mem["usable_bytes"], "bytes"))
        out.append(("memory", "headroom", "headroom", mem.get("headroom_bytes"), "bytes"))
        out.append(("memory", "fits", f"fits {gpu}", mem.get("fits"), ""))
    out += [("largest", r["key"], r["label"], per[r["key"]], "bytes") for r in components if r["key"] in per]
    return out


def time_cost_rows(report: dict[str, Any], providers: list[dict[str, Any]]) -> list[tuple]:
    """The ``time``, ``cost`` and ``provider`` sections (the providers price nothing without a dataset size)."""
    t = report.get("time")
    if not t:
        return []
    out = [("time", k, label, t.get(k), unit) for k, label, unit in (
        ("seconds", "time", "s"), ("seconds_low", "time, likely low", "s"), ("seconds_high", "time, likely high", "s"),
        ("tokens_per_second", "tokens per second", "tokens/s"))]
    c = report.get("cost") or {}
    currency = c.get("currency") or "USD"
    if c.get("provider"):
        out += [("cost", "on_demand_usd", f"on demand on {c['provider']}", c.get("on_demand_usd"), currency),
                ("cost", "spot_usd", f"spot on {c['provider']}", c.get("spot_usd"), currency)]
    for p in providers:
        pc, pt = p.get("cost"), p.get("time") or {}
        if pc is None:
            continue
        out += [("provider", f"{p['id']}.on_demand_usd", f"{p['id']} on demand", pc.get("on_demand_usd"), currency),
                ("provider", f"{p['id']}.spot_usd", f"{p['id']} spot", pc.get("spot_usd"), currency),
                ("provider", f"{p['id']}.seconds", f"{p['id']} time", pt.get("seconds"), "s")]
    return out


def estimate_csv(report: dict[str, Any], rows: list[dict[str, Any]], providers: list[dict[str, Any]]) -> str:
    """The CSV text (module doc) of ``report`` (the estimate's JSON), its breakdown ``rows``
    (:func:`~fitplan.web.view.breakdown_rows`) and ``providers`` (:func:`~fitplan.web.view.provider_rows`)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    for section, name, label, value, unit in memory_rows(report, rows) + time_cost_rows(report, providers):
        w.writerow((section, name, label, cell(value), unit))
    return buf.getvalue()


def csv_view(settings: Settings, query: Query) -> Reply:
    """``GET /api/estimate.csv?FLAGS``: :func:`estimate_csv` of the query's scenario, as a download."""
    from fitplan.output.estimate_report import to_json

    a, _ = assessment(settings, query)
    est = a.estimate
    text = estimate_csv(to_json(a), breakdown_rows(est), provider_rows(est, settings.context()))
    return Reply(200, text.encode("utf-8"), "text/csv; charset=utf-8",
                 (("content-disposition", f'attachment; filename="{FILENAME}"'),))
