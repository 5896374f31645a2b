"""The JSON API of ``fitplan serve`` (docs/serve.md), free of any web framework: each endpoint takes the
query's ``(name, value)`` pairs and returns a :class:`Reply`; :mod:`fitplan.web.server` maps routes to them.

Every endpoint goes through the command line's own steps: the query is parsed by the CLI command's parser
(:mod:`fitplan.web.params`), the scenario built and evaluated by ``fitplan.app.options.estimate_from``, the
report assessed by :func:`fitplan.assess.assess` and rendered by the registered ``json`` format. So
``/api/estimate``'s body is, byte for byte, what ``fitplan estimate --format json`` prints for the same flags,
and its errors are the CLI's messages (HTTP 400).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from fitplan.errors import FitplanError, GraphError, PluginError
from fitplan.web.params import SCENARIO_PARAMS, UPLOAD_PREFIX, parse
from fitplan.web.uploads import UploadStore

Query = Sequence[tuple[str, str]]
RECOMMEND_PARAMS = ("objective", "effective-batch-size", "headroom", "top", "gpus", "providers", "vary", "methods",
                    "precisions", "optims", "markets", "max-gpus", "max-nodes", "max")
"""``fitplan recommend``'s own options that ``/api/recommend`` takes (not ``--policy``, ``--emit``, ``--out``)."""
SEARCH_LIMITS = {"top": 100, "max_gpus": 64, "max_nodes": 8, "effective_batch_size": 1 << 16}
"""Bounds on the search work one request may ask for (the CLI has none)."""


class SearchTimeout(Exception):
    """Raised by the search's progress callback past the server's time limit."""


class Superseded(Exception):
    """Raised by the check of a request tagged ``page=ID&view=N`` once that page has asked for a newer
    ``/api/view``: it has moved on (:func:`view_check`); answered 409."""


class HubNotCached(FitplanError):
    """A Hub id whose ``config.json`` is not in the local Hugging Face cache, on a server without
    ``--allow-hub``: the reply names the id (``"download"``), so that the page can offer an explicit download
    (``POST /api/hub-download``)."""

    def __init__(self, repo_id: str) -> None:
        from fitplan.inputs.hub import cache_dir

        super().__init__(f"{repo_id} is not in the local Hugging Face cache, and this page reads the cache only",
                         field="model", value=repo_id,
                         suggestion=f"download its config.json (the page's download button, or `huggingface-cli "
                                    f"download {repo_id} config.json`), or start `fitplan serve --allow-hub`; "
                                    f"cache: {cache_dir()}")
        self.repo_id = repo_id


@attrs.frozen
class Reply:
    status: int
    body: bytes
    media_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


@attrs.define
class Settings:
    """What ``fitplan serve`` was started with: ruleset directories and policy files (the CLI's
    ``--ruleset-dir`` and ``--policy``, applied to every request), the search time limit, the uploads, and
    whether a query may make the server download a Hub id's config.json (``--allow-hub``; by default a query
    reads the local Hugging Face cache only and a download is an explicit ``POST /api/hub-download``)."""

    ruleset_dirs: tuple[str, ...] = ()
    policy_files: tuple[str, ...] = ()
    search_seconds: float = 30.0
    uploads: UploadStore = attrs.Factory(UploadStore)
    search_lock: threading.Lock = attrs.Factory(threading.Lock)
    waiter: int = 0
    """The newest request waiting for the search slot (:func:`acquire_search`)."""
    waiter_lock: threading.Lock = attrs.Factory(threading.Lock)
    allow_hub: bool = False
    views: int = 0
    """How many ``/api/view`` requests of a page (``page=ID``) this server has had."""
    newest: dict[str, int] = attrs.Factory(dict)
    """Each page's newest view number (the last :data:`PAGES_KEPT` pages): :func:`view_check`."""
    views_lock: threading.Lock = attrs.Factory(threading.Lock)

    def new_view(self, page: str | None) -> int | None:
        """A page's new ``/api/view``: its number, which that page's later requests carry as ``view=N``
        (None without ``page``: a view of no page, such as the page's pinned scenario, supersedes nothing)."""
        if page is None:
            return None
        with self.views_lock:
            self.views += 1
            self.newest.pop(page, None)
            self.newest[page] = self.views
            while len(self.newest) > PAGES_KEPT:
                del self.newest[next(iter(self.newest))]
            return self.views

    def context(self):
        from fitplan.context import get_context

        return get_context(self.ruleset_dirs)

    def resolve(self, options: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """``options`` with the server's ruleset directories, and an uploaded model's stored path: the options
        and the name the model was uploaded under (None for a catalog name or Hub id)."""
        options = {**options, "ruleset_dirs": self.ruleset_dirs}
        model = options.get("model")
        if model and model.startswith(UPLOAD_PREFIX):
            path, name = self.uploads.lookup(model)
            options["model"] = str(path)
            return options, name
        if model and not self.allow_hub:
            self.check_cached(model)
        return options, None

    def check_cached(self, model: str) -> None:
        """:raises HubNotCached: ``model`` is a Hub id (not a catalog name or alias) whose config.json is not in
        the local cache (the order of :func:`fitplan.estimation.model_source`)."""
        from fitplan.inputs import hub

        if not hub.is_repo_id(model):
            return
        try:
            self.context().rulesets.model_entry(model)
            return
        except FitplanError:
            pass
        repo, revision = hub.split_revision(model)
        if hub.find_file(repo, "config.json", revision) is None:
            raise HubNotCached(model)


def json_reply(data: Any, status: int = 200, *, text: str | None = None, compact: bool = False) -> Reply:
    """``data`` as the CLI's indented JSON (``text``: already rendered); ``compact``: without indentation, for the
    page's own large replies (``/api/view``), which json's C encoder writes several times faster (an indented dump
    runs in Python: a third of a view's time) and the browser parses sooner."""
    import json

    from fitplan.output.console import dumps_json

    if compact and text is None:
        text = json.dumps(data, separators=(",", ":"), default=str, allow_nan=False)
    return Reply(status, (text if text is not None else dumps_json(data)).encode("utf-8"))


def error_reply(e: BaseException) -> Reply:
    """400 with the CLI's message for what the user can fix; 500 for a plugin or graph problem."""
    status = 500 if isinstance(e, (PluginError, GraphError)) else 400
    body = {"error": e.render() if isinstance(e, FitplanError) else str(e)}
    if isinstance(e, HubNotCached):
        body["download"] = e.repo_id
    return json_reply(body, status)


def answer(endpoint: Callable[..., Reply], *args: Any) -> Reply:
    """Call ``endpoint``; a :class:`FitplanError` becomes its error reply, :class:`Superseded` a 409."""
    try:
        return endpoint(*args)
    except FitplanError as e:
        return error_reply(e)
    except Superseded:
        return json_reply({"error": "a newer view was asked for: this request's work was stopped"}, 409)


PAGES_KEPT = 256
"""Pages whose newest view number the server keeps (the oldest is forgotten first)."""


def page_id(text: str | None) -> str | None:
    """``page=ID``: the page instance's random id (letters, digits, ``-`` and ``_``, at most 64), or None.

    :raises FitplanError: anything else.
    """
    if text is None or text == "":
        return None
    if len(text) > 64 or not text.replace("-", "").replace("_", "").isalnum() or not text.isascii():
        raise FitplanError(f"page must be a page's id (letters, digits, - and _, at most 64), got {text!r:.40}",
                           field="page", value=text[:40])
    return text


def view_check(settings: Settings, own: dict[str, str]) -> Callable[[], None] | None:
    """``page=ID&view=N`` of ``/api/prices``, ``/api/largest`` and ``/api/recommend`` (a page's requests after
    its view numbered N): a check that raises :class:`Superseded` once that page has asked for a newer view, so
    that the server stops work the page has abandoned (it aborts those requests, which the server cannot see) and
    its next view gets the CPU. Another page's views, or a request without both, never stop it.

    :raises FitplanError: a malformed ``page`` or ``view``.
    """
    page, text = page_id(own.get("page")), own.get("view") or ""
    if not text:
        return None
    if not text.isdigit() or len(text) > 18:
        raise FitplanError(f"view must be a view's number (a whole number), got {text!r:.40}", field="view",
                           value=text[:40])
    mine = int(text)

    def check() -> None:
        if page is not None and settings.newest.get(page, 0) > mine:
            raise Superseded

    return check


def render(kind: str, report: Any) -> str:
    """``report`` in the registered ``json`` format, exactly as ``--format json`` prints it."""
    from fitplan.output.formats import RenderOptions
    from fitplan.pluginmgr.registry import default_registry

    return default_registry().format(kind, "json").render(kind, report, RenderOptions())


def take(query: Query, names: Iterable[str]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """Split the pairs named ``names`` (an endpoint's own, not the CLI's) off ``query``."""
    names = set(names)
    return [(k, v) for k, v in query if k not in names], {k: v for k, v in query if k in names}


def estimate_of(settings: Settings, query: Query):
    """The :class:`~fitplan.estimation.Estimate` of the query's scenario (``fitplan estimate``'s flags) and the
    name an uploaded model was uploaded under (None for a catalog name or Hub id)."""
    from fitplan.app.commands import command
    from fitplan.app.options import estimate_from

    options, upload = settings.resolve(parse(command("estimate"), query))
    return estimate_from(options), upload


def assessment(settings: Settings, query: Query, *, advice: bool = True):
    """The query's estimate assessed as ``fitplan estimate`` assesses it (advice, the server's policies), and
    the name an uploaded model was uploaded under. ``advice=False``: without the advice (``/api/view``'s
    ``advice=later``: the page asks ``/api/advice`` for it once the verdict is shown)."""
    from fitplan.assess import assess

    est, upload = estimate_of(settings, query)
    return assess(est, policy_files=settings.policy_files, advice=advice, cheapest=True), upload  # cheapest: no GPU only


def estimate(settings: Settings, query: Query) -> Reply:
    """``GET /api/estimate``: ``fitplan estimate --format json``."""
    a, _ = assessment(settings, query)
    return json_reply(None, text=render("estimate", a))


def explain(settings: Settings, query: Query) -> Reply:
    """``GET /api/explain?quantity=peak&...``: ``fitplan explain QUANTITY --format json``."""
    from fitplan.app.commands import command
    from fitplan.app.explain import explanation_for

    p = parse(command("explain"), query, extras=("depth",), positional=("quantity",))
    if not 0 <= p["depth"] <= 12:
        raise FitplanError(f"depth must be between 0 and 12, got {p['depth']}", field="depth", value=p["depth"])
    options, _ = settings.resolve(p)
    return json_reply(None, text=render("explain", explanation_for(p["quantity"], p["depth"], options)))


def _deadline(seconds: float, superseded: Callable[[], None] | None = None) -> Callable[[int, int], None]:
    end = time.monotonic() + seconds

    def check(done: int, total: int) -> None:
        if time.monotonic() > end:
            raise SearchTimeout
        if superseded is not None:
            superseded()

    return check


def wait_seconds(text: str | None, most: float) -> float:
    """``wait=SECONDS`` of ``/api/recommend``: how long a search may wait for the one running to end (0, the
    default: answer 429 at once), at most the server's search time limit ``most``.

    :raises FitplanError: not a number, or outside ``[0, most]``.
    """
    if text is None or text == "":
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= most:  # NaN too
        raise FitplanError(f"wait must be a number of seconds between 0 and {most:g} (this server's search limit), "
                           f"got {text!r:.40}", field="wait", value=text[:40])
    return value


def acquire_search(settings: Settings, wait: float) -> bool:
    """Take the server's one search slot: at once (``wait`` 0), or within ``wait`` seconds, unless a newer
    request starts waiting meanwhile (the page abandons its previous search when the scenario changes, and the
    server cannot tell: only the newest waiter goes on). True when taken; the caller releases it."""
    if not wait:
        return settings.search_lock.acquire(blocking=False)
    with settings.waiter_lock:
        settings.waiter += 1
        mine = settings.waiter
    end = time.monotonic() + wait
    while settings.waiter == mine and time.monotonic() < end:
        if settings.search_lock.acquire(timeout=0.05):
            if settings.waiter == mine:
                return True
            settings.search_lock.release()
    return False


def recommend(settings: Settings, query: Query) -> Reply:
    """``GET /api/recommend``: ``fitplan recommend --format json`` (``max=micro-batch`` or ``seq-length``: the
    ``--max`` report), one search at a time, bounded by :data:`SEARCH_LIMITS` and the server's time limit;
    ``wait=SECONDS`` (:func:`wait_seconds`) waits that long for a running search to end instead of a 429."""
    from fitplan.app.commands import command
    from fitplan.app.recommend import find_plans, largest_report
    from fitplan.app.options import scenario_from

    query, own = take(query, ("wait", "page", "view"))
    wait = wait_seconds(own.get("wait"), settings.search_seconds)
    superseded = view_check(settings, own)
    p = parse(command("recommend"), query, extras=RECOMMEND_PARAMS)
    for name, most in SEARCH_LIMITS.items():
        if p[name] > most:
            flag = name.replace("_", "-")
            raise FitplanError(f"{flag} is at most {most} on this server, got {p[name]}", field=flag, value=p[name])
    if p["top"] < 1:
        raise FitplanError(f"--top must be >= 1, got {p['top']}", field="--top", value=p["top"])
    options, _ = settings.resolve(p)
    built = scenario_from(options)
    ctx = settings.context()
    if p["max_of"] is not None:
        return json_reply(None, text=render("largest", largest_report(built.scenario, ctx, p["max_of"], p["headroom"],
                                                                      check=superseded)))
    if not acquire_search(settings, wait):
        if superseded is not None:
            superseded()  # it waited for a search, and its page has moved on meanwhile: 409, not 429
        return json_reply({"error": "a search is already running on this server: try again when it ends"}, 429)
    try:
        result = find_plans(built, ctx, p, settings.policy_files, _deadline(settings.search_seconds, superseded))
    except SearchTimeout:
        raise FitplanError(f"the search ran past this server's limit of {settings.search_seconds:g} s", field="query",
                           suggestion="narrow it (gpus=, providers=, fewer vary= dimensions, max-gpus=) "
                                      "or fix more of the scenario; `fitplan recommend` has no limit") from None
    finally:
        settings.search_lock.release()
    return json_reply(None, text=render("recommend", result))


def models(settings: Settings, query: Query) -> Reply:
    """``GET /api/models``: ``fitplan models list --format json``."""
    from fitplan.app.catalog import model_rows

    parse_nothing(query)
    return json_reply(None, text=render("models", model_rows(settings.context().rulesets)))


def parse_nothing(query: Query) -> None:
    for key, _ in query:
        raise FitplanError(f"unknown query parameter {key!r}: this endpoint takes none", field=key)


def gpu_rows(ctx, sweep: list[tuple[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The hardware ruleset's GPUs; with ``sweep`` (:func:`fitplan.search.sweep.across_gpus`), each GPU's
    ``memory`` section of the estimate report, or the ``error`` that kept it from being evaluated."""
    from fitplan.output.estimate_report import sections_json

    rows = []
    outcomes = dict(sweep or ())
    for gid, g in ctx.rulesets.gpus.items():
        row = {"id": gid, "name": g.name, "memory_bytes": g.memory_bytes, "usable_bytes": g.usable_bytes,
               "peak_tflops": g.peak_tflops, "aliases": list(g.aliases), "ruleset": ctx.rulesets.origin.get(f"gpu:{gid}")}
        if gid in outcomes:
            got = outcomes[gid]
            if isinstance(got, FitplanError):
                row["error"] = got.render()
            else:
                row["memory"] = sections_json(got).get("memory")
        rows.append(row)
    return rows


def gpus(settings: Settings, query: Query) -> Reply:
    """``GET /api/gpus``: the GPUs of the hardware rulesets; given a scenario (a model or a parameter count),
    each GPU's memory section of ``fitplan estimate --gpu ID --format json`` (no provider); ``page=ID&view=N``:
    409 without any work once that page has asked for a newer view (:func:`view_check`)."""
    from fitplan.search.sweep import across_gpus

    query, own = take(query, ("page", "view"))
    check = view_check(settings, own)
    if check is not None:
        check()
    ctx = settings.context()
    if not query:
        return json_reply(gpu_rows(ctx))
    est, _ = estimate_of(settings, query)
    return json_reply(gpu_rows(ctx, across_gpus(est.scenario, ctx, arch=est.arch)))


CHOICES = {"method": "METHODS", "assumptions": "ASSUMPTIONS", "attn_implementation": "ATTN_IMPLEMENTATIONS",
           "loss_implementation": "LOSS_IMPLEMENTATIONS", "fsdp": "FSDP_MODES", "padding": "PADDING", "device": "DEVICES"}
"""Scenario fields whose values are one of a tuple of :mod:`fitplan.inputs.scenario`."""


def field_rows(ctx) -> list[dict[str, Any]]:
    """Every scenario flag: query name, field, section, type, default, choices (when closed) and help."""
    from fitplan.app.commands import command
    from fitplan.app.options import HELP
    from fitplan.inputs import scenario as sc
    from fitplan.inputs.precision import LOAD_DTYPES, PRECISIONS
    from fitplan.inputs.settings import declared

    opts = {o[2:]: p for p in command("estimate").params for o in getattr(p, "opts", ()) if o.startswith("--")}
    default = sc.flatten(sc.Scenario())
    closed: dict[str, Any] = {f: getattr(sc, t) for f, t in CHOICES.items()}
    closed.update(precision=PRECISIONS, dtype=LOAD_DTYPES, zero_stage=(0, 1, 2, 3), gpu=tuple(ctx.rulesets.gpus),
                  provider=tuple(ctx.rulesets.providers), optim=tuple(ctx.registry.optimizers))
    closed.update({s.name: s.choices for s in declared().values() if s.choices})  # plugin settings
    rows = []
    for name, field in SCENARIO_PARAMS.items():
        opt, value = opts[name], default[field]
        rows.append({"name": name, "field": field, "section": sc.FIELD_SECTION[field],
                     "type": "boolean" if opt.is_flag else opt.type.name,
                     "default": ",".join(value) if isinstance(value, tuple) else value,
                     "choices": list(closed[field]) if field in closed else None, "help": HELP.get(field, opt.help)})
    return rows


def options(settings: Settings, query: Query) -> Reply:
    """``GET /api/options``: what the page's form is built from (every scenario flag, the GPUs, providers and
    optimizers of this server's rulesets and plugins)."""
    parse_nothing(query)
    ctx = settings.context()
    return json_reply({"fields": field_rows(ctx), "gpus": gpu_rows(ctx), "providers": list(ctx.rulesets.providers),
                       "optimizers": list(ctx.registry.optimizers), "upload_prefix": UPLOAD_PREFIX})


def export_scenario(est, upload: str | None):
    """The scenario the exports are written for: an uploaded model is named by its file name (the server's
    copy disappears with it)."""
    return est.scenario if upload is None else est.scenario.replace(model=upload)


def export(settings: Settings, query: Query) -> Reply:
    """``GET /api/export?kind=deepspeed|accelerate|training-args|skypilot|scenario&...``: the file ``fitplan
    estimate --emit KIND`` writes for the scenario (on demand), as a download."""
    from fitplan.output.exports import FILENAMES, render_exports

    rest, own = take(query, ("kind",))
    kind = own.get("kind")
    if kind not in FILENAMES:
        from fitplan.errors import unknown

        raise unknown("export kind", str(kind), FILENAMES, field="kind")
    est, upload = estimate_of(settings, rest)
    files, _ = render_exports(kind, export_scenario(est, upload), est, "on_demand")
    name = FILENAMES[kind]
    text = dict(files)[name]
    media = {"json": "application/json", "yaml": "application/yaml", "toml": "application/toml"}[name.rpartition(".")[2]]
    return Reply(200, text.encode("utf-8"), media, (("content-disposition", f'attachment; filename="{name}"'),))


def hub_download(settings: Settings, body: bytes) -> Reply:
    """``POST /api/hub-download`` (body ``{"model": "ORG/NAME[@revision]"}``): download that id's config.json
    into the Hugging Face cache (``huggingface_hub``, the user's ``HF_TOKEN``), then ``{"model", "path"}``."""
    from fitplan.inputs import hub
    from fitplan.inputs.files import decode, loads_json

    data = loads_json(decode(body, file="request body"), file="request body")
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str) or not hub.is_repo_id(model):
        raise FitplanError("give a Hub id ORG/NAME[@revision] to download", field="model", value=model)
    repo, revision = hub.split_revision(model)
    return json_reply({"model": model, "path": str(hub.fetch_file(repo, "config.json", revision, field="model"))})


def upload(settings: Settings, body: bytes, filename: str | None) -> Reply:
    """``POST /api/upload`` (the body: a config.json): ``{"model": "upload:<id>", "name", ...}``."""
    return json_reply(settings.uploads.add(body, filename))
