"""``fitplan serve``: the local web page and its JSON API, on the same engine, rulesets and plugins as the CLI.

An optional extra (``pip install 'fitplan[web]'``: starlette and uvicorn), imported only by ``fitplan serve``:
:mod:`~fitplan.web.params` (query → the CLI's options), :mod:`~fitplan.web.uploads` (uploaded config.json
files), :mod:`~fitplan.web.api` and :mod:`~fitplan.web.view` (the endpoints, framework-free),
:mod:`~fitplan.web.server` (the Starlette app, the guard, uvicorn) and ``static/`` (the page: HTML, one
vanilla JavaScript file, CSS; no framework, no build step, no network); :mod:`~fitplan.web.page_timing` (the
page's input-to-verdict time, for the bench and the browser tests). docs/serve.md describes it.
"""

EXTRA_MODULES = ("starlette", "uvicorn")
"""What the ``web`` extra installs, checked by ``fitplan serve`` before it imports the server."""
