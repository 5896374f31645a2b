"""CI runs every referee test: under ``FITPLAN_CI=1`` (set by ``.ci/run``) a test that skips because a library is
missing (torch, transformers, peft, deepspeed, bitsandbytes, accelerate, trl, the data extras, the example
plugins, fitplan-torch itself) fails instead, so a broken ``make install-test`` cannot pass as a green run.

A pytest plugin (``tests/conftest.py`` loads it). A skip is "a missing library" when its reason says so in the
words pytest and the tests use: ``pytest.importorskip``'s "could not import 'X'", or "X is not installed" /
"is not pip-installed". The one named exception is :data:`ALLOWED`: SkyPilot's own loaders need SkyPilot in a
separate virtual environment (``FITPLAN_SKYPILOT_PYTHON``, tests/test_emit_loaders.py), which CI does not build.
Other skips (a GPU is present, a check that needs a git checkout) are about the machine, not the install,
and stay skips.

Also under ``FITPLAN_CI=1``: the run fails if the checkout's ``git status`` changed (a test wrote into the
repository, e.g. into ``tests/data``, instead of ``tmp_path``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

MISSING = re.compile(r"could not import '[^']+'|\bis not (?:pip-)?installed\b|\bnot installed\b")
"""The words of a skip for a missing library."""
ALLOWED = ("FITPLAN_SKYPILOT_PYTHON",)
"""A skip whose reason names one of these stays a skip under ``FITPLAN_CI=1``."""


def ci() -> bool:
    return os.environ.get("FITPLAN_CI") == "1"


def skip_reason(report: pytest.TestReport) -> str:
    """A skipped report's reason (pytest keeps ``(file, line, "Skipped: reason")`` in ``longrepr``)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def forbidden(reason: str) -> bool:
    """Whether a skip with this reason fails under ``FITPLAN_CI=1``."""
    return MISSING.search(reason) is not None and not any(name in reason for name in ALLOWED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (ci() and report.skipped and not hasattr(report, "wasxfail")):
        return
    reason = skip_reason(report)
    if forbidden(reason):
        report.outcome = "failed"
        report.longrepr = (f"FITPLAN_CI=1: a referee test may not skip for a missing library ({reason}); "
                           "make install-test installs every one (CONTRIBUTING.md)")


ROOT = Path(__file__).resolve().parents[1]
_STATUS: list[str | None] = []


def git_status() -> str | None:
    """The checkout's ``git status --porcelain`` (untracked files listed one by one), or None outside git."""
    try:
        return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                              capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def pytest_sessionstart(session):
    if ci():
        _STATUS.append(git_status())


def pytest_sessionfinish(session, exitstatus):
    if not (ci() and _STATUS and _STATUS[0] is not None):
        return
    after = git_status()
    if after is not None and after != _STATUS[0]:
        new = sorted(set(after.splitlines()) - set(_STATUS[0].splitlines()))
        session.config.get_terminal_writer().line(
            "FITPLAN_CI=1: the tests changed the checkout (they may write only under tmp_path): " + "; ".join(new[:10]),
            red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
