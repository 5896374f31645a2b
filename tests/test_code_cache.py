"""The kept compiled methods of attrs and cattrs (``fitplan/codecache.py``): a second start compiles nothing of
fitplan's, and what it gets is exactly what attrs and cattrs compile without the cache."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fitplan import codecache

ROOT = Path(__file__).resolve().parents[1]

# Loads every command's registry (all built-in plugins and their classes), structures a scenario (cattrs builds
# its structure functions), then prints the stats and, for every attrs class of a fitplan module and every
# cattrs structure function of the scenario's sections, the marshalled code of its generated methods.
_PROBE = r"""
import json, marshal, sys
import attrs
import fitplan.cli
from fitplan import codecache
from fitplan.inputs import scenario as sc
from fitplan.inputs.convert import CONVERTER
fitplan.cli.load_commands()
sc.from_nested({"model": {"model": "llama-2-7b"}})
code = {}
for modname, mod in sorted(sys.modules.items()):
    if not modname.startswith("fitplan") or mod is None:
        continue
    for cls in list(vars(mod).values()):
        if isinstance(cls, type) and attrs.has(cls) and cls.__module__ == modname:
            for meth in ("__init__", "__eq__", "__ne__", "__repr__", "__hash__", "__setattr__", "__lt__"):
                fn = vars(cls).get(meth)
                c = getattr(fn, "__code__", None)
                if c is not None and c.co_filename.startswith("<attrs generated"):
                    code[f"{modname}.{cls.__qualname__}.{meth}"] = marshal.dumps(c).hex()
for cls in sc.SECTIONS.values():
    c = CONVERTER.get_structure_hook(cls).__code__
    code[f"structure {cls.__qualname__}"] = marshal.dumps(c).hex()
print(json.dumps({"stats": codecache.stats(), "code": code}))
"""


def _probe(cache: Path, seed: str, *, no_cache: bool = False) -> dict:
    env = {**os.environ, "FITPLAN_CACHE_DIR": str(cache), "PYTHONHASHSEED": seed,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("FITPLAN_NO_CACHE", None)
    if no_cache:
        env["FITPLAN_NO_CACHE"] = "1"
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _code(probe: dict) -> dict:
    """The probe's code objects (compared with ``==``, not as bytes: marshal's output depends on interning)."""
    return {k: marshal.loads(bytes.fromhex(v)) for k, v in probe["code"].items()}


def test_second_start_compiles_nothing_and_gets_what_attrs_and_cattrs_compile(tmp_path):
    first = _probe(tmp_path, "1")
    assert first["stats"]["misses"] > 40  # ~60 classes, a structure function per section (a source built twice hits)
    assert list((tmp_path / "code").glob("generated-code-*.pickle"))
    second = _probe(tmp_path, "1")
    assert second["stats"]["misses"] == 0 and second["stats"]["hits"] > 40
    fresh = _probe(tmp_path / "unused", "1", no_cache=True)
    assert fresh["stats"] == {"hits": 0, "misses": 0} and len(fresh["code"]) > 40
    assert _code(second) == _code(fresh)  # code objects equal: bytecode, constants, flags, names, positions


def test_another_hash_seed_gets_its_own_hash_constants(tmp_path):
    """attrs's ``__hash__`` constant changes with the string-hash seed: kept code gets this process's constant,
    and one of another length (its column positions differ) is compiled afresh."""
    _probe(tmp_path, "1")
    other = _probe(tmp_path, "2")
    fresh = _probe(tmp_path / "unused", "2", no_cache=True)
    assert other["stats"]["hits"] > 40  # every class without __hash__, the structure functions, same-length constants
    assert _code(other) == _code(fresh)
    assert _code(_probe(tmp_path / "unused", "1", no_cache=True)) != _code(fresh)  # the comparison can see it


def test_the_key_is_the_whole_source(monkeypatch):
    monkeypatch.setattr(codecache, "_table", {})
    monkeypatch.setattr(codecache, "_saving", True)  # nothing written at exit
    monkeypatch.setattr(codecache, "_counts", {"hits": 0, "misses": 0})
    name = "<attrs generated methods fitplan.probe.Probe>"
    a = codecache._cached("attr._make", "def f():\n    return 1\n", name)
    assert codecache._cached("attr._make", "def f():\n    return 1\n", name) == a
    b = codecache._cached("attr._make", "def f():\n    return 2\n", name)
    assert b is not a and b.co_consts != a.co_consts
    assert codecache.stats() == {"hits": 1, "misses": 2}


def test_attrs_hash_constant_is_this_process_own(monkeypatch):
    monkeypatch.setattr(codecache, "_table", {})
    monkeypatch.setattr(codecache, "_saving", True)
    monkeypatch.setattr(codecache, "_counts", {"hits": 0, "misses": 0})
    src = "def __hash__(self):\n        return hash((\n                {},\n                self.x,\n        ))\n"
    name = "<attrs generated methods fitplan.probe.Probe>"
    codecache._cached("attr._make", src.format(-123456789), name)
    kept = codecache._cached("attr._make", src.format(-987654321), name)  # as long: the same key
    (fn,) = [c for c in kept.co_consts if hasattr(c, "co_consts")]
    assert -987654321 in fn.co_consts and 123456789 not in fn.co_consts
    assert kept == compile(src.format(-987654321), name, "exec")
    assert codecache.stats()["hits"] == 1
    codecache._cached("attr._make", src.format(98765432), name)  # shorter: other column positions, another key
    assert codecache.stats()["misses"] == 2


def test_off_leaves_the_libraries_alone(tmp_path):
    env = {**os.environ, "FITPLAN_NO_CACHE": "1", "FITPLAN_CACHE_DIR": str(tmp_path)}
    code = "import fitplan, attr._make, cattrs.gen; print('compile' in vars(attr._make), 'compile' in vars(cattrs.gen))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    assert not (tmp_path / "code").exists()


@pytest.mark.parametrize("args", [("x", "<attrs generated methods fitplan.a.B>", "eval"),
                                  ("x = 1", "<attrs generated methods other.A>", "exec")])
def test_other_compiles_pass_through(monkeypatch, args):
    monkeypatch.setattr(codecache, "_table", {})
    monkeypatch.setattr(codecache, "_counts", {"hits": 0, "misses": 0})
    compile_ = codecache._compiler("attr._make")
    assert compile_(*args) == compile(*args)
    assert codecache.stats() == {"hits": 0, "misses": 0} and codecache._table == {}
