from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test reaches the Hugging Face Hub (a Hub id never downloads)
TEST_PLUGINS = ROOT / ".test-plugins"
"""The example plugins (acme-fitplan-rules, fitplan-optimizers-extra), installed there by ``make install-test``:
on sys.path and PYTHONPATH for the test session only, never in the .venv that ``make demo`` uses."""
if TEST_PLUGINS.is_dir() and str(TEST_PLUGINS) not in sys.path:
    sys.path.append(str(TEST_PLUGINS))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(TEST_PLUGINS)) if p)


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real `fitplan` command line in a subprocess (exit codes, stderr, no traceback)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "fitplan", *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd or ROOT, timeout=120)


def run_json(*args: str, **kw) -> dict:
    proc = run_cli(*args, "--format", "json", **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def cli():
    return run_cli
