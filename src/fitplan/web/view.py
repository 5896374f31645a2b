"""``GET /api/view``: everything the page shows for one scenario, in one reply.

``estimate`` is the object ``/api/estimate`` returns (``fitplan estimate --format json``); the rest are
ordinary estimates of the same scenario with one thing changed, rendered by the same report sections:
``gpus`` (the scenario on every GPU: :func:`fitplan.search.sweep.across_gpus`), ``providers`` (priced by every
provider: :func:`~fitplan.search.sweep.across_providers`), and what the page needs to label and explain them
(``rows``, ``explain``) and to offer the downloads (``exports``). Nothing here computes a number of its own.

``GET /api/prices`` answers separately, after the view: each GPU's cheapest provider (tens of estimates).
``cheapest`` is the query of the page's "cheapest plan that fits" card (:mod:`fitplan.web.cheapest`), which
the page sends to ``/api/recommend`` last, once the inputs are still.
With ``advice=later`` the estimate comes without its advice (``estimate.advice`` null), which ``GET /api/advice``
answers right after the view, and with ``gpus=later`` without ``gpus``, which ``GET /api/gpus`` answers: the page
shows the verdict without waiting for the advice's variant scenarios and the scenario on every GPU.
``GET /api/largest`` answers separately (the page asks for it once the view is shown): the largest
micro-batch and sequence that fit the GPU, as ``fitplan recommend --max ... --headroom 0`` (the ``fits``
verdict's test). Those searches evaluate tens of new shapes, each with its own step trace (a few hundred
milliseconds on a loaded machine), which would otherwise delay every re-estimate.
"""

from __future__ import annotations

from typing import Any

from fitplan.errors import FitplanError
from fitplan.web.api import (Query, Reply, Settings, assessment, estimate_of, export_scenario, gpu_rows, json_reply, page_id,
                             take, view_check)

PAGE_HEADROOM = "0"
"""The page's largest micro-batch and sequence fit with no headroom: the ``fits`` verdict's test."""
MEMORY_PREFIX = "memory.per_gpu_bytes."
TIME_KEYS = ("seconds", "hours", "seconds_low", "seconds_high")
"""What ``/api/prices`` keeps of each GPU's ``time`` section (the page shows the time and its band)."""


def breakdown_rows(est) -> list[dict[str, Any]]:
    """The memory components in breakdown order (quantities with ``row`` metadata): the key under
    ``memory.per_gpu_bytes``, the label, what ``/api/explain`` takes for it, and whether it is the framework
    overhead (outside the peak)."""
    compiled = est.registry.compiled()
    return [{"key": q.json_key[len(MEMORY_PREFIX):], "label": q.short_label or q.label, "quantity": q.short or name,
             "overhead": q.role == "overhead"}
            for name, q in compiled.quantities.items()
            if q.row and q.category == "memory" and q.json_key.startswith(MEMORY_PREFIX)]


def explain_names(est) -> dict[str, str]:
    """What ``/api/explain`` takes for the quantities holding the roles the page shows."""
    compiled = est.registry.compiled()
    out = {}
    for role in ("peak", "device_total", "usable", "seconds", "cost.on_demand", "cost.spot"):
        name = compiled.role(role)
        if name is not None:
            out[role] = compiled.quantities[name].short or name
    return out


def provider_rows(est, ctx) -> list[dict[str, Any]]:
    """The scenario priced by every provider: its ``time`` and ``cost`` sections, or the ``error`` (a provider
    that rents no such GPU). Empty without a GPU or a dataset size (nothing to price)."""
    from fitplan.output.estimate_report import sections_json
    from fitplan.search.sweep import across_providers

    if est.scenario.hardware.gpu is None or est.role("seconds") is None:
        return []
    rows = []
    for pid, got in across_providers(est.scenario, ctx, arch=est.arch):
        if isinstance(got, FitplanError):
            rows.append({"id": pid, "error": got.render()})
        else:
            data = sections_json(got)
            rows.append({"id": pid, "time": data.get("time"), "cost": data.get("cost")})
    return rows


def largest(est, ctx, check=None) -> dict[str, Any] | None:
    """``fitplan recommend --max micro-batch`` and ``--max seq-length`` reports (headroom 0), or None without
    a GPU; a report that cannot be computed is ``{"error": ...}``. ``check``: :func:`~fitplan.web.api.view_check`'s."""
    from fitplan.app.recommend import LARGEST, largest_report

    if est.scenario.hardware.gpu is None:
        return None
    out: dict[str, Any] = {}
    for what in LARGEST:
        try:
            out[what] = largest_report(est.scenario, ctx, what, PAGE_HEADROOM, arch=est.arch, check=check)
        except FitplanError as e:
            out[what] = {"error": e.render()}
    return out


def exports(est, upload: str | None) -> dict[str, Any]:
    """Which exports the scenario has (``file``, or the ``error`` saying why not) and their notes."""
    from fitplan.output.exports import FILENAMES, render_exports

    s = export_scenario(est, upload)
    kinds, notes = [], []
    for kind, name in FILENAMES.items():
        try:
            _, more = render_exports(kind, s, est, "on_demand")
            kinds.append({"kind": kind, "file": name})
            notes += [n for n in more if n not in notes]
        except FitplanError as e:
            kinds.append({"kind": kind, "file": name, "error": e.render()})
    if upload is not None:
        notes.append(f"the scenario names the uploaded model as {upload!r}: keep that config.json next to it")
    return {"kinds": kinds, "notes": notes}


def view(settings: Settings, query: Query) -> Reply:
    """``GET /api/view``: the page's data for the query's scenario (module doc)."""
    from fitplan.output.estimate_report import to_json
    from fitplan.search.sweep import across_gpus

    from fitplan.inputs.scenario import flatten
    from fitplan.web import cheapest

    query, own = take(query, ("page", "advice", "gpus"))
    advice_later, gpus_later = (later(name, own.get(name)) for name in ("advice", "gpus"))
    number = settings.new_view(page_id(own.get("page")))  # the page's later requests carry it (view=N)
    a, upload = assessment(settings, query, advice=not advice_later)
    est, ctx = a.estimate, settings.context()
    estimate = to_json(a)
    if advice_later:
        estimate["advice"] = None  # not computed yet: /api/advice
    return json_reply({
        "view": number,
        "estimate": estimate,
        "rows": breakdown_rows(est),
        "explain": explain_names(est),
        "gpus": None if gpus_later else gpu_rows(ctx, across_gpus(est.scenario, ctx, arch=est.arch)),
        "providers": provider_rows(est, ctx),
        "exports": exports(est, upload),
        "upload": upload,
        "cheapest": cheapest.request(flatten(est.scenario), query, settings.search_seconds),
    }, compact=True)


LATER = {"advice": "/api/advice", "gpus": "/api/gpus"}
"""What the page's view may leave for later (``NAME=later``), and the endpoint that then answers it."""


def later(name: str, text: str | None) -> bool:
    """``advice=later`` / ``gpus=later`` of ``/api/view``: the view without that part, which the page asks for once
    the verdict is shown (:data:`LATER`): the advice's variant scenarios (each with its own step traces: the
    slowest part of a never-seen shape's estimate; ``estimate.advice`` is then null), the scenario on every GPU
    (``gpus`` null: one evaluation per GPU, most of a seen scenario's view).

    :raises FitplanError: any other value.
    """
    if text is None or text == "":
        return False
    if text != "later":
        raise FitplanError(f"{name} must be 'later' (then {LATER[name]} answers it), got {text!r:.40}", field=name,
                           value=text[:40])
    return True


def advice_view(settings: Settings, query: Query) -> Reply:
    """``GET /api/advice[?page=ID&view=N]``: ``{"advice": [...]}``, the ``advice`` of ``/api/estimate`` (``fitplan
    estimate --format json``) for the query's scenario; 409 without any work when page ID has asked for a view
    newer than N (:func:`~fitplan.web.api.view_check`)."""
    from fitplan.rules.advice import advise

    query, own = take(query, ("page", "view"))
    check = view_check(settings, own)
    if check is not None:
        check()
    est, _ = estimate_of(settings, query)
    return json_reply({"advice": [x.to_dict() for x in advise(est)]})


def gpu_prices(est, ctx, check=None) -> dict[str, Any]:
    """Each GPU's cheapest rental for the scenario: ``{gpu id: {"provider", "time", "cost"}}`` (the ``time`` and
    ``cost`` sections of ``fitplan estimate --gpu ID --provider P``, P the provider whose on-demand cost is
    lowest), ``{"error": ...}`` when no provider rents it; empty without a dataset size (nothing to price).
    ``check``: :func:`~fitplan.web.api.view_check`'s."""
    from fitplan.output.estimate_report import sections_json
    from fitplan.search.sweep import across_gpus_and_providers

    if est.role("seconds") is None:
        return {}
    best: dict[str, Any] = {}
    for gid, pid, got in across_gpus_and_providers(est.scenario, ctx, arch=est.arch, check=check):
        if isinstance(got, FitplanError):
            best.setdefault(gid, {"error": got.render()})
            continue
        data = sections_json(got)
        cost = data.get("cost") or {}
        if cost.get("on_demand_usd") is None:
            continue
        held = best.get(gid, {}).get("cost")
        if held is None or cost["on_demand_usd"] < held["on_demand_usd"]:
            time = {k: v for k, v in (data.get("time") or {}).items() if k in TIME_KEYS}
            best[gid] = {"provider": pid, "time": time, "cost": cost}
    return best


def prices_view(settings: Settings, query: Query) -> Reply:
    """``GET /api/prices[?page=ID&view=N]``: :func:`gpu_prices` of the query's scenario (stopped, 409, once page ID
    has asked for a view newer than N: :func:`~fitplan.web.api.view_check`)."""
    query, own = take(query, ("page", "view"))
    check = view_check(settings, own)
    est, _ = estimate_of(settings, query)
    return json_reply(gpu_prices(est, settings.context(), check))


def largest_view(settings: Settings, query: Query) -> Reply:
    """``GET /api/largest``: ``{"micro-batch": report, "seq-length": report}`` for the query's scenario (each the
    ``fitplan recommend --max WHAT --headroom 0 --format json`` report), or null without a GPU; ``page=ID&view=N``
    as for :func:`prices_view`."""
    query, own = take(query, ("page", "view"))
    check = view_check(settings, own)
    est, _ = estimate_of(settings, query)
    return json_reply(largest(est, settings.context(), check))
