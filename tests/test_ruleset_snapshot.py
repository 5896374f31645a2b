"""On-disk snapshots of parsed ruleset files (fitplan.rulesets.snapshot): an edited file is read again, a
corrupt snapshot is ignored, an unwritable cache directory costs nothing but time, FITPLAN_NO_CACHE=1 writes
nothing, and a snapshot gives back exactly what parsing gives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fitplan.rulesets import loader, snapshot

GPU = """
[[gpu]]
id = "snapshot-test-gpu"
name = "Snapshot Test GPU"
memory_bytes = {memory}
usable_bytes = {memory}
bandwidth_gbps = 1000
generation = "ampere"
peak_tflops = {{ fp32 = 10.0, bf16 = 100.0 }}
source = "a test fixture"
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(d))
    monkeypatch.delenv("FITPLAN_NO_CACHE", raising=False)
    return d / "rulesets"


def _write(d: Path, memory: int) -> Path:
    d.mkdir(exist_ok=True)
    f = d / "gpu.toml"
    f.write_text(GPU.format(memory=memory), encoding="utf-8")
    return f


def _memory(d: Path) -> int:
    loader._PARSED.clear()  # the in-process memo: this test is about the on-disk one
    return loader.load([d]).gpus["snapshot-test-gpu"].memory_bytes


def test_an_edited_file_is_read_again_even_with_the_same_size_and_mtime(tmp_path, cache):
    f = _write(tmp_path / "rules", 1000)
    assert _memory(f.parent) == 1000
    assert len(list(cache.glob("*.pickle"))) > 0  # the bundled files and this one were kept
    st = f.stat()
    _write(f.parent, 2000)  # same length, same mtime: only the bytes tell
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size
    assert _memory(f.parent) == 2000


def test_a_snapshot_is_used_and_equals_a_fresh_parse(tmp_path, cache, monkeypatch):
    f = _write(tmp_path / "rules", 1000)
    fresh = loader._parse(f)
    calls = []
    import fitplan.inputs.files as files

    real = files.loads_toml
    monkeypatch.setattr(files, "loads_toml", lambda *a, **k: calls.append(1) or real(*a, **k))
    kept = loader._parse(f)
    assert kept == fresh and kept[0] is not fresh[0] and calls == []  # from the snapshot: no TOML parsed


def test_a_corrupt_snapshot_is_ignored_and_rewritten(tmp_path, cache):
    f = _write(tmp_path / "rules", 1000)
    assert _memory(f.parent) == 1000
    for p in cache.glob("*.pickle"):
        p.write_bytes(b"not a pickle")
    assert _memory(f.parent) == 1000
    assert all(p.read_bytes() != b"not a pickle" for p in cache.glob("*.pickle"))


def test_an_unwritable_cache_directory_still_works(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(blocker / "cache"))  # under a file: no directory can be made
    monkeypatch.delenv("FITPLAN_NO_CACHE", raising=False)
    f = _write(tmp_path / "rules", 1000)
    assert _memory(f.parent) == 1000


def test_no_cache_writes_nothing(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    f = _write(tmp_path / "rules", 1000)
    assert _memory(f.parent) == 1000
    assert snapshot.cache_dir() is None and not cache.exists()


def test_a_file_with_problems_is_never_kept(tmp_path, cache):
    f = _write(tmp_path / "rules", 1000)
    f.write_text(GPU.format(memory=1000).replace("memory_bytes = 1000", 'memory_bytes = "lots"'), encoding="utf-8")
    parsed, problems = loader._parse(f)
    assert parsed is None and problems
    assert snapshot.load(f, f.read_bytes()) is None


def test_the_key_covers_the_rules_modules_the_schema_imports():
    # a snapshot holds what the schema's validators made of a file: a changed condition compiler or template
    # table (fitplan/rulesets/conditions.py, templates.py) must make it stale, as a changed schema does
    import ast

    schema = Path(snapshot.__file__).with_name("schema.py")
    package = schema.parent.parent
    imported = {node.module for node in ast.parse(schema.read_text(encoding="utf-8")).body
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fitplan.")}
    files = {package.joinpath(*m.split(".")[1:]).with_suffix(".py") for m in imported}
    assert {package / "rulesets" / "conditions.py", package / "rulesets" / "templates.py"} <= files
    assert files - set(snapshot._modules()) == set()


def test_the_key_names_modules_that_exist():
    # the key once named fitplan/builtin/archfile.py and fitplan/rules/conditions.py after both had moved: a
    # missing module counts as "?", so an edit of the learned-architecture reader kept stale snapshots
    modules = snapshot._modules()
    assert [p for p in modules if not p.is_file()] == []
    assert {"archfile.py", "archexpr.py", "archformat.py", "conditions.py", "templates.py"} <= {p.name for p in modules}
