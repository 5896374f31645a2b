"""``fitplan serve``'s web server: a Starlette app over :mod:`fitplan.web.api` and :mod:`fitplan.web.view`, the
page's static files (bundled in the wheel), and :class:`Guard`, which makes it safe as a local server.

The guard (docs/serve.md, "Security"): a request whose ``Host`` header is not an address this server serves
is refused (a page elsewhere cannot reach it through DNS rebinding); a ``POST`` whose ``Origin`` (or
``Sec-Fetch-Site``) shows another site is refused; the query string and the upload are bounded; every reply
carries a strict Content-Security-Policy; :mod:`fitplan.web.limits` times out a request that does not arrive
and caps the open connections. Only this module and :mod:`~fitplan.web.limits` import starlette and uvicorn
(the ``web`` extra).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fitplan.web import api, estimate_csv, view
from fitplan.web.limits import MAX_CONNECTIONS, READ_TIMEOUT_S, limited_protocol
from fitplan.web.uploads import MAX_UPLOAD_BYTES

STATIC = Path(__file__).parent / "static"
PAGES = {"/": ("index.html", "text/html; charset=utf-8"), "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
         "/static/view.js": ("view.js", "text/javascript; charset=utf-8"),
         "/static/cheapest.js": ("cheapest.js", "text/javascript; charset=utf-8"),
         "/static/compare.js": ("compare.js", "text/javascript; charset=utf-8"),
         "/static/app.css": ("app.css", "text/css; charset=utf-8")}
MAX_QUERY_BYTES = 8192
MAX_HEADER_BYTES = 32 * 1024

SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
log = logging.getLogger("fitplan.serve")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def served_names(host: str, extra: Iterable[str] = ()) -> list[str]:
    """The host names a request may address this server by: the bound address, the loopback names when it is
    a loopback address, and ``extra`` (``--allow-host``)."""
    names = [host]
    if is_loopback(host):
        names += ["localhost", "127.0.0.1", "::1"]
    names += list(extra)
    return list(dict.fromkeys(n.lower() for n in names))


def host_headers(names: Iterable[str], port: int) -> set[str]:
    """The ``Host`` header values of ``names`` at ``port`` (IPv6 addresses in brackets; the bare name on port 80)."""
    out = set()
    for n in names:
        n = f"[{n}]" if ":" in n else n
        out.add(f"{n}:{port}")
        if port == 80:
            out.add(n)
    return out


class Guard:
    """ASGI middleware: the Host allow-list, the Origin check on POST, size bounds, security headers."""

    def __init__(self, app: Callable, hosts: set[str]) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = {f"http://{h}" for h in hosts}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self.refusal(scope, headers)
        if refusal is not None:
            status, text = refusal
            await api_response(api.json_reply({"error": text}, status))(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def refusal(self, scope: dict, headers: dict[str, str]) -> tuple[int, str] | None:
        """``(status, reason)`` when the request is refused, else None."""
        host = headers.get("host", "").lower()
        if host not in self.hosts:
            return 403, f"this server answers only requests addressed to {', '.join(sorted(self.hosts))}, not {host!r}"
        if len(scope.get("query_string", b"")) > MAX_QUERY_BYTES:
            return 414, f"query string longer than {MAX_QUERY_BYTES} bytes"
        if scope["method"] not in ("GET", "HEAD", "POST"):
            return 405, f"method {scope['method']} not allowed"
        if scope["method"] == "POST":
            origin = headers.get("origin")
            if (origin is not None and origin.lower() not in self.origins) or headers.get("sec-fetch-site") == "cross-site":
                return 403, f"cross-origin request refused (Origin {origin!r})"
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > MAX_UPLOAD_BYTES):
                return 413, f"request body larger than {MAX_UPLOAD_BYTES:,} bytes"
        return None


def api_response(reply: api.Reply) -> Response:
    return Response(reply.body, reply.status, dict(reply.headers), reply.media_type)


def _get(endpoint: Callable[..., api.Reply], settings: api.Settings):
    async def route(request: Request) -> Response:
        query = request.query_params.multi_items()
        return api_response(await run_in_threadpool(guarded, endpoint, settings, query))

    return route


def guarded(endpoint: Callable[..., api.Reply], *args: Any) -> api.Reply:
    """:func:`fitplan.web.api.answer`, and a bug (any other exception) as a logged 500 naming it."""
    try:
        return api.answer(endpoint, *args)
    except Exception as e:  # noqa: BLE001 - a bug must not kill the server; it is logged with its traceback
        log.exception("internal error")
        return api.json_reply({"error": f"internal error ({type(e).__name__}: {e}); please report it"}, 500)


async def _read_body(request: Request) -> bytes | None:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_UPLOAD_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _upload(settings: api.Settings):
    async def route(request: Request) -> Response:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            return api_response(api.json_reply({"error": "POST the config.json with Content-Type: application/json"}, 415))
        body = await _read_body(request)
        if body is None:
            return api_response(api.json_reply({"error": f"request body larger than {MAX_UPLOAD_BYTES:,} bytes"}, 413))
        name = request.query_params.get("filename")
        return api_response(await run_in_threadpool(guarded, api.upload, settings, body, name))

    return route


def _hub_download(settings: api.Settings):
    async def route(request: Request) -> Response:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            return api_response(api.json_reply({"error": 'POST {"model": "ORG/NAME"} with Content-Type: '
                                                         'application/json'}, 415))
        body = await _read_body(request)
        if body is None:
            return api_response(api.json_reply({"error": f"request body larger than {MAX_UPLOAD_BYTES:,} bytes"}, 413))
        return api_response(await run_in_threadpool(guarded, api.hub_download, settings, body))

    return route


def _static(name: str, media: str):
    data = (STATIC / name).read_bytes()

    async def route(request: Request) -> Response:
        return Response(data, 200, media_type=media)

    return route


async def _no_content(request: Request) -> Response:
    return Response(status_code=204)


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    return api_response(api.json_reply({"error": f"{request.method} {request.url.path}: not found"}, status))


ENDPOINTS = {"estimate": api.estimate, "explain": api.explain, "recommend": api.recommend, "models": api.models,
             "gpus": api.gpus, "options": api.options, "export": api.export, "view": view.view,
             "largest": view.largest_view, "prices": view.prices_view, "advice": view.advice_view,
             "estimate.csv": estimate_csv.csv_view}


def make_app(settings: api.Settings, hosts: set[str]) -> Any:
    """The ASGI app: the page, ``/api/*`` and the guard answering only to ``hosts`` (``Host`` header values)."""
    routes = [Route(path, _static(name, media), methods=["GET", "HEAD"]) for path, (name, media) in PAGES.items()]
    routes += [Route(f"/api/{name}", _get(func, settings), methods=["GET", "HEAD"]) for name, func in ENDPOINTS.items()]
    routes.append(Route("/api/upload", _upload(settings), methods=["POST"]))
    routes.append(Route("/api/hub-download", _hub_download(settings), methods=["POST"]))
    routes.append(Route("/favicon.ico", _no_content, methods=["GET", "HEAD"]))
    app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_found})
    return Guard(app, hosts)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (port 0: a free one)."""
    from fitplan.errors import FitplanError

    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by connections: no Nagle delay
        sock.bind(info[4])
    except OSError as e:
        raise FitplanError(f"cannot listen on {host}:{port}: {e.strerror or e}", field="--host/--port",
                           value=f"{host}:{port}", suggestion="choose another --port (0: any free port)") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def make_server(settings: api.Settings, host: str = "127.0.0.1", port: int = 0, allow_hosts: Iterable[str] = (), *,
                read_timeout: float = READ_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS):
    """``(uvicorn.Server, socket, url)``: ``server.run(sockets=[socket])`` serves until ``server.should_exit``.
    A request must arrive within ``read_timeout`` seconds; at most ``max_connections`` are open
    (:mod:`fitplan.web.limits`); request headers are at most :data:`MAX_HEADER_BYTES` (uvicorn's
    ``h11_max_incomplete_event_size``: 400 beyond)."""
    import uvicorn

    sock = bind(host, port)
    actual = sock.getsockname()[1]
    app = make_app(settings, host_headers(served_names(host, allow_hosts), actual))
    config = uvicorn.Config(app, log_level="warning", access_log=False, proxy_headers=False, server_header=False,
                            lifespan="off", timeout_graceful_shutdown=2, timeout_keep_alive=5,
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            http=limited_protocol(read_timeout, max_connections))
    shown = f"[{host}]" if ":" in host else host
    return uvicorn.Server(config), sock, f"http://{shown}:{actual}/"


def warm_up(settings: api.Settings) -> None:
    """Load the rulesets and plugins (their errors stop the server before it listens) and evaluate the page's
    first view once, so that the first request is as fast as the next. Then what the server holds from here on
    (modules, rulesets, plugins, the compiled graph: about 120,000 objects) leaves the cyclic garbage collector's
    generations (``gc.freeze``): a full collection, which a never-seen shape's request triggers about once in
    sixty, walked all of them (~44 ms of that request's time, measured); the requests' own objects are collected
    as before."""
    import gc

    ctx = settings.context()
    if ctx.rulesets.models and ctx.rulesets.gpus:
        api.answer(view.view, settings, [("model", min(ctx.rulesets.models)), ("gpu", next(iter(ctx.rulesets.gpus)))])
    gc.collect()
    gc.freeze()
