"""What fitplan keeps on disk to start faster (fitplan.diskcache): step traces and the entry-point list. A kept
value is only ever the value a fresh computation gives; a stale, corrupt or unwritable cache costs time, not
correctness; FITPLAN_NO_CACHE=1 writes nothing."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import pytest

from fitplan import diskcache
from fitplan.trace import step_trace
from fitplan.pluginmgr import discovery
from fitplan.testing import write_dist_info

from test_layout import import_graph


@pytest.fixture
def cache(trace_cache) -> Path:
    return trace_cache


def test_an_entry_comes_back_only_under_its_exact_key(cache):
    diskcache.store("k", "a.pickle", ("key", 1), {"v": 1})
    assert diskcache.load("k", "a.pickle", ("key", 1)) == {"v": 1}
    assert diskcache.load("k", "a.pickle", ("key", 2)) is None
    (cache / "k" / "a.pickle").write_bytes(b"not a pickle")
    assert diskcache.load("k", "a.pickle", ("key", 1)) is None


def test_no_cache_and_an_unwritable_directory_keep_nothing(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    diskcache.store("k", "a.pickle", 1, 2)
    assert not cache.exists() and diskcache.load("k", "a.pickle", 1) is None
    monkeypatch.delenv("FITPLAN_NO_CACHE")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(blocker / "cache"))
    diskcache.store("k", "a.pickle", 1, 2)  # no directory can be made under a file: nothing kept, no error
    assert diskcache.load("k", "a.pickle", 1) is None


def test_a_capped_kind_removes_its_oldest_entries(cache):
    for i in range(9):
        diskcache.store("k", f"e{i}.pickle", i, i, keep=8)
        os.utime(cache / "k" / f"e{i}.pickle", ns=(i * 10**9, i * 10**9))
    left = sorted(p.name for p in (cache / "k").glob("*.pickle"))
    assert len(left) == 4 and "e8.pickle" in left and "e0.pickle" not in left


def test_a_capped_kind_lists_its_directory_only_to_count_and_prune(cache, monkeypatch):
    """A store does not list the directory each time (thousands of entries: milliseconds): once to count, then
    again only when the count passes the cap; entries another process left are counted at the first listing."""
    (cache / "k").mkdir(parents=True)
    for i in range(5):
        (cache / "k" / f"other{i}.pickle").write_bytes(b"x")
    listed = []
    real = os.scandir
    monkeypatch.setattr(diskcache.os, "scandir", lambda d: listed.append(d) or real(d))
    for i in range(3):
        diskcache.store("k", f"e{i}.pickle", i, i, keep=8)
    assert len(listed) == 1
    assert len(list((cache / "k").glob("*.pickle"))) == 8  # 5 + 3 entries: not over 8 (glob lists too)
    del listed[:]
    diskcache.store("k", "e3.pickle", 3, 3, keep=8)
    assert len(listed) == 1 and len(list((cache / "k").glob("*.pickle"))) == 4  # 9 > 8: pruned to half of 8


def _closure(module: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def test_trace_modules_cover_every_module_a_trace_build_imports():
    graph = import_graph()
    listed = {"fitplan." + m.removesuffix(".py").replace("/", ".") for m in step_trace.TRACE_MODULES}
    assert _closure("fitplan.trace.step_trace", graph) - {"fitplan.diskcache"} <= listed | {"fitplan"}


def _spec(batch: int = 2):
    from fitplan.arch.architecture import load_config_json

    arch = load_config_json(Path(__file__).parent / "data" / "configs" / "tiny-llama" / "config.json")
    return step_trace.TraceSpec(arch, batch, 64, "bf16-true", "sdpa", False)


def test_a_kept_trace_equals_a_fresh_build_and_is_used(cache, monkeypatch):
    spec = _spec()
    fresh = step_trace.build_afresh(spec)
    assert step_trace.build(spec) == fresh  # built, then kept
    assert len(list((cache / "traces").glob("*.pickle"))) == 1
    step_trace.build.cache_clear()
    for name in ("build_afresh", "finished"):  # every build, from a kept recording too, ends in finished()
        monkeypatch.setattr(step_trace, name, lambda *a: pytest.fail("rebuilt a kept trace"))
    kept = step_trace.build(spec)
    assert kept == fresh and kept is not fresh


def test_a_changed_learned_file_is_never_read_from_an_old_trace(cache, tmp_path, monkeypatch):
    from fitplan.arch import archfile

    spec = _spec(3)
    step_trace.build(spec)
    arch_dir = tmp_path / "archs"
    arch_dir.mkdir()
    for name in ("llama.json", "llama.graphs.json"):
        (arch_dir / name).write_bytes((archfile.BUNDLED / name).read_bytes())
    monkeypatch.setenv("FITPLAN_ARCH_DIR", str(arch_dir))  # another file for llama: another key
    step_trace.build.cache_clear()
    archfile.load.cache_clear()
    calls = []
    real = step_trace.record  # the recording reads the learned file (the twin's kept recording is another key's)
    monkeypatch.setattr(step_trace, "record", lambda spec: calls.append(1) or real(spec))
    step_trace.build(spec)
    assert calls == [1]
    archfile.load.cache_clear()


def test_entry_points_are_read_again_when_a_distribution_is_installed(cache, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    write_dist_info(site, "first-dist", {"first": "first_mod"}, version="1.2")
    monkeypatch.syspath_prepend(str(site))
    found = {e.name: e for e in discovery.entry_points()}
    assert (found["first"].dist_name, found["first"].dist_version) == ("first-dist", "1.2")
    assert "second" not in found
    before = os.stat(site).st_mtime_ns
    write_dist_info(site, "second-dist", {"second": "second_mod:plugin"})
    os.utime(site, ns=(before + 10**9, before + 10**9))  # pip's new *.dist-info directory changes this time
    found = {e.name: e for e in discovery.entry_points()}
    assert {"first", "second"} <= set(found) and found["second"].value == "second_mod:plugin"


def test_an_entry_point_loads_the_object_it_names(tmp_path, monkeypatch):
    (tmp_path / "ep_target_mod.py").write_text("class Holder:\n    plugin = 42\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert discovery.EntryPoint("x", "ep_target_mod:Holder.plugin").load() == 42
    assert discovery.EntryPoint("x", "ep_target_mod").load() is sys.modules["ep_target_mod"]
    assert pickle.loads(pickle.dumps(discovery.EntryPoint("x", "m", "d", "1"))) == discovery.EntryPoint("x", "m", "d", "1")
