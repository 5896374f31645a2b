"""``fitplan serve``'s warm-up (``web/server.py`` ``warm_up``): it leaves what the server holds from then on out of the
cyclic garbage collector's generations (``gc.freeze``), so that a full collection during a request walks only the
requests' own objects."""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("starlette")


def test_the_warm_up_freezes_what_the_server_holds(monkeypatch):
    from fitplan.web import server
    from fitplan.web.api import Reply, Settings

    views = []
    monkeypatch.setattr(server.view, "view", lambda settings, query: views.append(query) or Reply(200, b"{}"))

    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        server.warm_up(Settings())
        assert len(views) == 1  # the page's first view, evaluated before the freeze (not timed here)
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # modules, rulesets, plugins, the compiled graph (about 120,000 in fitplan serve)
        assert len(gc.get_objects(generation=2)) < frozen  # what is left for a full collection: far less
    finally:
        gc.unfreeze()
