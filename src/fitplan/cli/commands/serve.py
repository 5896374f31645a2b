"""``fitplan serve``: the interactive page and its JSON API on a local web server (the ``web`` extra,
:mod:`fitplan.web`; docs/serve.md)."""

from __future__ import annotations

import importlib.util

import click

from fitplan.errors import FitplanError


def add(cli: click.Group) -> None:
    cli.add_command(serve)


def require_extra() -> None:
    """:raises FitplanError: starlette or uvicorn (the ``web`` extra) is not installed."""
    from fitplan.web import EXTRA_MODULES

    missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise FitplanError(f"fitplan serve needs {' and '.join(missing)}, which are not installed", field="serve",
                           suggestion="pip install 'fitplan[web]'")


def stop_on_sigterm() -> None:
    """Make SIGTERM end the command like Ctrl+C (through the ``finally`` that removes the uploads): uvicorn
    shuts down on SIGTERM, restores the handler it found and raises the signal again
    (``uvicorn/server.py``, ``capture_signals``); with the default handler that would kill the process before
    the uploads' directory is removed."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but a loopback address exposes the page to your network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Port (0: any free port).")
@click.option("--open", "open_browser", is_flag=True, default=False, help="Open the page in the default browser.")
@click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Extra ruleset directory (repeatable), as for `fitplan estimate`: your GPUs, prices and policies.")
@click.option("--policy", "policy_files", multiple=True, type=click.Path(dir_okay=False),
              help="A policy file of [[policy]] rules checked on every estimate (repeatable; docs/policies.md).")
@click.option("--allow-host", "allow_hosts", multiple=True,
              help="Another host name clients use to reach the server (repeatable; needed with --host 0.0.0.0).")
@click.option("--allow-hub", is_flag=True, default=False,
              help="Let a query download a Hub id's config.json (with your HF_TOKEN). Default: the page reads the "
                   "local Hugging Face cache only and offers an explicit download button.")
@click.option("--search-seconds", type=click.FloatRange(1, 3600), default=30.0, show_default=True,
              help="Longest /api/recommend search the server runs.")
def serve(host: str, port: int, open_browser: bool, ruleset_dirs: tuple[str, ...], policy_files: tuple[str, ...],
          allow_hosts: tuple[str, ...], allow_hub: bool, search_seconds: float) -> None:
    """Serve the interactive calculator: every change of the scenario re-estimates at once.

    The page and its JSON API (/api/estimate, /api/recommend, /api/explain, /api/models, /api/gpus) use the
    same engine, rulesets and plugins as the command line. Query parameters are the CLI's long flag names:
    /api/estimate?model=llama-2-7b&gpu=a100-80gb&per-device-train-batch-size=4 (docs/serve.md).
    """
    require_extra()
    import threading
    import webbrowser

    from fitplan.trace.step_trace import store_in_background
    from fitplan.web.api import Settings
    from fitplan.web.server import is_loopback, make_server, warm_up
    from fitplan.web.uploads import UploadStore

    settings = Settings(tuple(ruleset_dirs), tuple(policy_files), search_seconds, UploadStore(), allow_hub=allow_hub)
    try:
        warm_up(settings)
        store_in_background()  # a reply does not wait for the disk cache's writes of the traces it built
        server, sock, url = make_server(settings, host, port, allow_hosts)
        if not is_loopback(host):
            click.echo(f"warning: listening on {host}: anyone who can reach it can use the page (no authentication)",
                       err=True)
        click.echo(f"fitplan serve: {url}  (Ctrl+C to stop)", err=True)
        if open_browser:
            threading.Timer(0.3, webbrowser.open, [url]).start()
        stop_on_sigterm()
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn shut down gracefully, then re-raised the signal: a normal stop
            click.echo("fitplan serve: stopped", err=True)
    finally:
        settings.uploads.close()
