"""tests/skip_policy.py: under FITPLAN_CI=1 a skip for a missing library fails; SkyPilot's is the named exception."""

from __future__ import annotations

import pytest


pytest_plugins = ("pytester",)

SESSION = '''
import pytest

def test_needs_a_missing_module():
    pytest.importorskip("fitplan_no_such_module")

@pytest.mark.skipif(True, reason="deepspeed is not installed")
def test_needs_deepspeed():
    pass

def test_needs_skypilot():
    pytest.skip("SkyPilot is not installed (pip install skypilot in another venv and set FITPLAN_SKYPILOT_PYTHON)")

def test_on_a_gpu_machine():
    pytest.skip("a GPU is present")
'''


def _run(pytester):
    pytester.makeconftest('pytest_plugins = ("skip_policy",)\n')
    pytester.makepyfile(test_session=SESSION)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rA")


def test_under_ci_a_missing_library_fails_and_skypilot_still_skips(pytester, monkeypatch):
    monkeypatch.setenv("FITPLAN_CI", "1")
    result = _run(pytester)
    # importorskip skips in the call phase (a failure), skipif in setup (an error); SkyPilot and the GPU skip
    result.assert_outcomes(failed=1, errors=1, skipped=2)
    result.stdout.fnmatch_lines(["*FITPLAN_CI=1: a referee test may not skip*fitplan_no_such_module*"])


def test_outside_ci_every_skip_stays_a_skip(pytester, monkeypatch):
    monkeypatch.delenv("FITPLAN_CI", raising=False)
    _run(pytester).assert_outcomes(skipped=4)


def test_under_ci_a_test_that_writes_into_the_checkout_fails_the_run(pytester, monkeypatch):
    import skip_policy

    if skip_policy.git_status() is None:
        pytest.skip("not a git checkout")
    monkeypatch.setenv("FITPLAN_CI", "1")
    probe = skip_policy.ROOT / "tests" / "data" / "skip-policy-probe.txt"  # removed again below, whatever happens
    pytester.makeconftest('pytest_plugins = ("skip_policy",)\n')
    pytester.makepyfile(test_writes=f"def test_writes():\n    open({str(probe)!r}, 'w').write('x')\n")
    try:
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    finally:
        probe.unlink(missing_ok=True)
    result.assert_outcomes(passed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*FITPLAN_CI=1: the tests changed the checkout*skip-policy-probe.txt*"])
