"""The environment ``make demo`` uses (.venv, without the test session's PYTHONPATH) after ``make test``: no
example plugin in it, so ``recommend`` ranks no fictional provider (ACME) and no reference table (the seed
chapter's prices) beside the real ones. Subprocesses: what a user's shell sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT, TEST_PLUGINS

FICTIONAL_OR_REFERENCE = {"acme-aws", "acme-cluster", "seed"}


def _demo_env() -> dict[str, str]:
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != str(TEST_PLUGINS)]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _recommend(env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "fitplan", "recommend", "--model", "llama-2-7b", "--num-examples", "20000",
                           "--tokens-per-example", "512", "--gpus", "h100-sxm,a100-80gb", "--top", "50", "--format", "json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_demo_environment_holds_no_example_plugin():
    proc = subprocess.run([sys.executable, "-m", "fitplan", "plugins", "--format", "json"], capture_output=True, text=True,
                          env=_demo_env(), cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "acme" not in proc.stdout and "fitplan-optimizers-extra" not in proc.stdout


def test_demo_environment_recommends_no_fictional_provider():
    data = _recommend(_demo_env())
    providers = {p["plan"]["provider"] for p in data["plans"]}
    assert providers and not providers & FICTIONAL_OR_REFERENCE, providers


def test_test_environment_does_see_the_example_plugin():
    """The check above is not vacuous: with the test session's path the ACME prices are there."""
    assert (TEST_PLUGINS / "acme_fitplan_rules").is_dir(), "make install-test installs the example plugins here"
    data = _recommend(dict(os.environ))
    assert {p["plan"]["provider"] for p in data["plans"]} & {"acme-aws", "acme-cluster"}
