"""docs/writing-plugins.md is executed: its `# file:` code blocks form a package whose own tests pass.

The package is made discoverable through its real entry points the way pip would, without touching
the environment: the entry points of its pyproject.toml are written as a ``*.dist-info`` onto a
temporary directory that goes on ``PYTHONPATH`` (with the package's ``src``) of the subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fitplan.testing import write_dist_info

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "writing-plugins.md"
BLOCK = re.compile(r"^```(?P<lang>\w+)\n# file: (?P<path>\S+)\n(?P<body>.*?)^```$", re.M | re.S)


def extract(text: str) -> dict[str, str]:
    files = {}
    for m in BLOCK.finditer(text):
        assert m["path"] not in files, f"{m['path']} appears twice in {DOC.name}"
        files[m["path"]] = f"# file: {m['path']}\n{m['body']}"
    return files


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The package written out, and the environment that makes its entry points visible."""
    base = tmp_path_factory.mktemp("walkthrough")
    files = extract(DOC.read_text(encoding="utf-8"))
    for rel, body in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    pkg = base / "fitplan-tutorial"
    project = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
    site = base / "site"
    write_dist_info(site, project["name"], project["entry-points"]["fitplan"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(pkg / "src")]), "FITPLAN_BLOCK_PLUGINS": ""}
    return pkg, env


def test_the_doc_has_the_package_files():
    files = extract(DOC.read_text(encoding="utf-8"))
    assert set(files) == {
        "fitplan-tutorial/pyproject.toml",
        "fitplan-tutorial/src/fitplan_tutorial/__init__.py",
        "fitplan-tutorial/src/fitplan_tutorial/rmsprop.py",
        "fitplan-tutorial/src/fitplan_tutorial/reserve.py",
        "fitplan-tutorial/tests/test_tutorial.py",
    }


def test_the_walkthrough_tests_pass(walkthrough):
    pkg, env = walkthrough
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=pkg, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\b7 passed\b", proc.stdout), proc.stdout


def test_fitplan_sees_the_walkthrough_plugins(walkthrough):
    pkg, env = walkthrough
    proc = subprocess.run([sys.executable, "-m", "fitplan", "plugins", "--check", "--format", "json"], cwd=pkg, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
    assert rows["tutorial-rmsprop"]["optimizers"] == ["tutorial_rmsprop"]
    assert rows["tutorial-reserve"]["reducers"] == ["framework_overhead_bytes.gpu_reserve"]


def test_the_walkthrough_optimizer_on_the_command_line(walkthrough):
    pkg, env = walkthrough
    proc = subprocess.run([sys.executable, "-m", "fitplan", "estimate", "--model", "llama-2-7b", "--precision", "32-true",
                           "--optim", "tutorial_rmsprop", "--format", "json"], cwd=pkg, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # 32-true: square_avg 4 B per parameter + a 4-byte step per tensor (291 tensors)
    assert json.loads(proc.stdout)["memory"]["per_gpu_bytes"]["optimizer_states"] == 6_738_415_616 * 4 + 291 * 4


def test_importing_the_pytest_plugin_has_no_side_effects():
    """pytest imports fitplan.testing at start-up (entry point pytest11 = fitplan): it must only define
    fixtures, not load plugins, build a registry or read rulesets."""
    code = ("import os, sys; before = dict(os.environ); import fitplan.testing as t; "
            "assert dict(os.environ) == before; "
            "print(sorted(m for m in ('fitplan.pluginmgr.registry', 'fitplan.context', 'fitplan.rulesets.loader', 'fitplan.builtin') "
            "if m in sys.modules)); print(sorted(n for n in ('fitplan_registry', 'make_scenario', 'estimate_with', "
            "'fitplan_entry_points') if hasattr(t, n)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded, fixtures = proc.stdout.strip().splitlines()
    assert loaded == "[]"
    assert fixtures == "['estimate_with', 'fitplan_entry_points', 'fitplan_registry', 'make_scenario']"
