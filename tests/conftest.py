from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest_plugins = ("dataset_support",)  # the tiny tokenizer in a Hugging Face cache (tests/test_dataset_*.py)


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
