"""``fitplan serve``'s traces are written to the disk cache by a writer thread (``step_trace.store_in_background``):
a build returns before its store has happened, the store happens, and the kept entry is the trace."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fitplan import diskcache
from fitplan.trace import step_trace

CONFIGS = Path(__file__).parent / "data" / "configs"


@pytest.fixture
def cache(trace_cache) -> Path:
    return trace_cache


def _spec(batch: int):
    from fitplan.arch.architecture import load_config_json

    arch = load_config_json(CONFIGS / "tiny-llama" / "config.json")
    return step_trace.TraceSpec(arch, batch, 64, "bf16-mixed", "sdpa", False)


def _held_stores(monkeypatch) -> tuple[threading.Event, list[str]]:
    """``diskcache.store`` made to wait (5 s at most) until the returned event is set; the list gets the name of
    each thread that stored."""
    release, threads = threading.Event(), []
    real = diskcache.store

    def store(*args, **kwargs):
        threads.append(threading.current_thread().name)
        release.wait(5)
        return real(*args, **kwargs)

    monkeypatch.setattr(diskcache, "store", store)
    return release, threads


def test_a_build_returns_before_its_store_and_the_writer_keeps_the_trace(cache, monkeypatch):
    release, threads = _held_stores(monkeypatch)
    step_trace.store_in_background()
    spec = _spec(3)
    trace = step_trace.build(spec)  # returns while the writer waits in store
    assert not release.is_set() and not list((cache / "traces").glob("*.pickle"))
    release.set()
    step_trace.flush_stores()
    assert threads == ["fitplan-trace-store"]
    assert len(list((cache / "traces").glob("*.pickle"))) == 1
    step_trace.build.cache_clear()
    monkeypatch.setattr(step_trace, "build_sharing", lambda *a: pytest.fail("rebuilt a kept trace"))
    assert step_trace.build(spec) == trace


def test_without_the_writer_a_build_stores_before_it_returns(cache, monkeypatch):
    """Control (the command line): the store runs in the building thread, before ``build`` returns."""
    release, threads = _held_stores(monkeypatch)
    release.set()
    step_trace.build(_spec(4))
    assert threads == [threading.current_thread().name]
    assert len(list((cache / "traces").glob("*.pickle"))) == 1


def test_stopping_the_writer_writes_what_is_queued(cache, monkeypatch):
    release, threads = _held_stores(monkeypatch)
    step_trace.store_in_background()
    step_trace.store_in_background()  # a second call starts no second writer
    step_trace.build(_spec(5))
    step_trace.build(_spec(6))
    release.set()
    step_trace.stop_storing_in_background()
    assert threads == ["fitplan-trace-store"] * 2
    assert len(list((cache / "traces").glob("*.pickle"))) == 2
    assert [t.name for t in threading.enumerate()].count("fitplan-trace-store") == 0
