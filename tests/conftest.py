from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test reaches the Hugging Face Hub (a Hub id never downloads)
if "FITPLAN_CACHE_DIR" not in os.environ:  # ruleset snapshots of tests' temporary rulesets: not in the user's cache
    import atexit
    import shutil
    import tempfile

    os.environ["FITPLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="fitplan-test-cache-")
    atexit.register(shutil.rmtree, os.environ["FITPLAN_CACHE_DIR"], True)
TEST_PLUGINS = ROOT / ".test-plugins"
"""The example plugins (acme-fitplan-rules, fitplan-optimizers-extra), installed there by ``make install-test``:
on sys.path and PYTHONPATH for the test session only, never in the .venv that ``make demo`` uses."""
if TEST_PLUGINS.is_dir() and str(TEST_PLUGINS) not in sys.path:
    sys.path.append(str(TEST_PLUGINS))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(TEST_PLUGINS)) if p)

if os.environ.get("FITPLAN_CI") == "1":
    # CI (.ci/run) replays a fixed set of hypothesis examples, so that a landing cannot fail on a new random draw;
    # a developer's run draws new examples every time and is where counterexamples are found (CONTRIBUTING.md).
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    settings.load_profile("ci")

pytest_plugins = ("dataset_support", "skip_policy")  # the tiny tokenizer (tests/test_dataset_*.py); CI fails a referee skip


# --------------------------------------------------------------------------- the fast suite (make check)

REFEREE_LIBS = frozenset({"torch", "transformers", "peft", "trl", "deepspeed", "bitsandbytes", "accelerate",
                          "datasets"})
"""A test that ``pytest.importorskip``s one of these (in its body, a helper of its module it calls, or at its
module's top) runs the referee or its libraries: marked ``referee`` and ``slow``."""
SLOW = {
    # CPU seconds measured on this project's 2-core machine (the whole of `make check` was 262 s of test CPU before
    # these were left out of it)
    "tests/test_recommend.py": "searches whole plan spaces: 164 s on 2 cores (issue #26)",
    "tests/test_demo_env.py": "builds the demo's virtual environment: 41 s",
    "tests/test_serve_browser.py": "drives Chromium through playwright",
    "tests/test_serve_warm_up.py": "loads every ruleset for the server's warm-up: 5-7 s",
    "tests/test_serve.py": "starts real HTTP servers and waits out their read timeouts: 14 s wall, mostly waiting",
    "tests/test_optimizer_names.py": "runs every TrainingArguments.optim name's optimizer: about 3.5 min",
    "tests/test_fault_isolation.py": "a fitplan subprocess per broken plugin entry point",
    "tests/test_stack_invariants.py": "hypothesis over the stacks' plans: 45 s CPU",
    "tests/test_recommend_defaults.py": "a recommend search per test: 27 s CPU",
    "tests/test_properties.py": "hypothesis over scenarios: 15 s CPU",
    "tests/test_capacity.py": "searches the largest model per GPU: 14 s CPU",
    "tests/test_fuzz.py": "fuzzed configs: 3 s CPU",
    "tests/test_emit_loaders.py": "loads the emitted files with accelerate, DeepSpeed and transformers: imports torch",
    "tests/test_recommend_why.py": "a recommend search per format: 3 s CPU",
    "tests/test_trace_reuse.py::test_a_reevaluated_trace_is_the_fresh_recording":
        "21 model x setup templates, each compared with fresh traces at 3 shapes: 12 s CPU",
    "tests/test_trace_reuse.py::test_setups_reevaluate_or_refuse_but_never_differ":
        "11 setups' templates, each compared with fresh traces at 6 shapes: 6 s CPU",
    "tests/test_trace_reuse.py::test_estimates_at_never_seen_shapes_are_those_of_fresh_recordings":
        "14 estimates of a 7B model: 4.5 s CPU",
    "tests/test_architectures.py::test_bundled_files_have_not_drifted": "reads every bundled file's graphs: 7 s CPU",
    "tests/test_archformat.py::test_every_bundled_file_is_format_2_as_the_writer_lays_it_out":
        "reads and lays out again every bundled pair (19 MB of JSON): 8 s CPU",
    "tests/test_breakdown.py::test_every_catalog_model_default_setup": "every catalog model: 8 s CPU",
    "tests/test_breakdown.py::test_peak_rows_sum_exactly_to_the_peak": "3 s CPU",
    "tests/test_policy.py::test_policy_from_a_ruleset_dir": "a recommend search: 4 s CPU",
    "tests/test_policy.py::test_recommend_names_the_rule_behind_each_rejection": "a recommend search: 2 s CPU",
    "tests/test_spot_risk.py::test_recommend_on_spot_says_the_billed_hours_and_the_interval": "a recommend search: 3 s CPU",
    "tests/test_dataset_estimate.py::test_recommend_with_a_dataset": "a recommend search: 2 s CPU",
    "tests/test_exports.py::test_scenario_toml_round_trip": "3 s CPU",
    "tests/test_exports.py::test_emit_deepspeed_for_a_plan_without_deepspeed": "a recommend search: 2 s CPU",
    "tests/test_learn_new_types.py::test_an_unverified_file_is_not_exact_in_any_format": "every report format: 3 s CPU",
    "tests/test_learn_new_types.py::test_an_unverified_file_says_so_in_markdown_and_html": "a recommendation in two formats: 4 s CPU",
    "tests/test_third_party.py::test_org_policies_restrict_recommend": "a recommend search: 2 s CPU",
    "tests/test_serve.py::test_fitplan_serve_serves_the_page_and_stops_on_ctrl_c": "a real fitplan serve process: 2 s CPU",
    "tests/test_serve.py::test_recommend_matches_the_cli_but_its_timings": "a recommend search twice: 2 s CPU",
    "tests/test_trl_grpo.py::test_recommend_searches_grpo_plans": "a recommend search: 1 s CPU",
    "tests/test_reports.py::test_policy_report_names_the_rule_behind_each_rejection": "a recommend search: 6 s CPU",
    "tests/test_reports.py::test_live_reports_render_deterministically_in_every_format":
        "four recommend searches: 16 s CPU",
    "tests/test_exports.py::test_training_args_and_deepspeed_round_trip": "2 s CPU",
    "tests/test_recipes.py::test_recommend_reads_a_torchtune_recipe": "a recommend search: 2 s CPU",
    "tests/test_recipes.py::test_recommend_reads_an_axolotl_recipe": "a recommend search: 1 s CPU",
    "tests/test_policy.py::test_report_says_when_policies_reject_every_fitting_plan": "a recommend search: 2 s CPU",
    "tests/test_third_party.py::test_installed_org_package_prices_through_its_entry_point": "a pip install: 2 s CPU",
}
"""Tests ``make check`` leaves out besides the referee's (``make test`` and CI run them all), by node-id prefix,
each with its reason; every prefix must match a collected test (a stale entry fails the run)."""


REFEREE_HELPERS = frozenset({"fitplan_torch_referee"})
"""Shared helpers (``tests/referee_support.py``) that ``importorskip`` referee libraries: calling one counts as
calling ``importorskip`` on them."""


def _calls_importorskip(node, libs) -> bool:
    import ast

    for n in ast.walk(node):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "importorskip"
                and n.args and isinstance(n.args[0], ast.Constant)
                and str(n.args[0].value).split(".")[0] in libs):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in REFEREE_HELPERS \
                and libs is REFEREE_LIBS:
            return True
    return False


_REFEREE_CACHE: dict[str, tuple[bool, frozenset[str]]] = {}


def referee_functions(path: Path) -> tuple[bool, frozenset[str]]:
    """(the whole module needs a referee library, the module's functions that do, directly or through a
    module-level helper they call)."""
    import ast

    key = str(path)
    if key not in _REFEREE_CACHE:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = any(_calls_importorskip(n, REFEREE_LIBS) for n in tree.body
                  if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
        funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        needs = {name for name, f in funcs.items() if _calls_importorskip(f, REFEREE_LIBS)}
        changed = True
        while changed:  # a test that calls a helper that needs one needs it too
            called = {name: {c.func.id for c in ast.walk(f) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                      for name, f in funcs.items()}
            grown = {name for name, calls in called.items() if calls & needs} | needs
            changed, needs = grown != needs, grown
        _REFEREE_CACHE[key] = (top, frozenset(needs))
    return _REFEREE_CACHE[key]


def pytest_ignore_collect(collection_path, config):
    """Under ``-m "not slow"`` (``make check``), a test file that is slow as a whole (in :data:`SLOW`, or a referee
    module: ``importorskip`` at its top) is not even imported: collecting it would import torch or hypothesis's
    strategies for nothing."""
    if config.getoption("markexpr", "") != "not slow" or collection_path.suffix != ".py":
        return None
    if collection_path.parent.name != "tests" or not collection_path.name.startswith("test_"):
        return None
    if f"tests/{collection_path.name}" in SLOW or referee_functions(collection_path)[0]:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    """Mark the referee's tests (``referee``, ``slow``) and :data:`SLOW`'s (``slow``): ``make check`` runs
    ``-m "not slow"``."""
    used = set()
    for item in items:
        path = Path(str(item.fspath))
        top, funcs = referee_functions(path) if path.suffix == ".py" else (False, frozenset())
        name = getattr(item, "originalname", None) or item.name
        if top or name in funcs:
            item.add_marker(pytest.mark.referee)
            item.add_marker(pytest.mark.slow)
        nodeid = item.nodeid if item.nodeid.startswith("tests/") else "tests/" + item.nodeid
        for prefix in SLOW:
            if nodeid == prefix or nodeid.startswith(prefix + "::") or nodeid.startswith(prefix + "["):
                item.add_marker(pytest.mark.slow)
                used.add(prefix)
    files = {Path(str(i.fspath)).name for i in items}
    stale = [p for p in SLOW if p not in used and p.split("::")[0].rsplit("/", 1)[-1] in files]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that do not exist: {', '.join(stale)}")


def string_constants(path: Path, *, dict_keys: bool = True) -> list[tuple[int, str]]:
    """A module's string literals with their line numbers, docstrings left out (module, class, function and
    attribute docstrings: string expressions standing alone); ``dict_keys=False`` leaves out the keys of dict
    displays too."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip.add(id(node.value))
        if isinstance(node, ast.Dict) and not dict_keys:
            skip.update(id(k) for k in node.keys if k is not None)
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]


def bench_module(name: str):
    """``bench/<name>.py`` imported as a module (the bench scripts are not a package: ``bench/`` is put on the
    path only while it imports, so that its own imports of sibling scripts resolve)."""
    import importlib

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real `fitplan` command line in a subprocess (exit codes, stderr, no traceback)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "fitplan", *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd or ROOT, timeout=timeout)


def run_json(*args: str, **kw) -> dict:
    proc = run_cli(*args, "--format", "json", **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def no_trace_templates():
    """No re-evaluation template (:mod:`fitplan.trace.reuse`) before or after the test: for tests of what a plain
    recording keeps, which a recording re-evaluated from a template made by an earlier test does not."""
    from fitplan.trace import reuse

    reuse.clear()
    yield
    reuse.clear()


@pytest.fixture
def tiny_llama_with(tmp_path, monkeypatch):
    """``estimate(header, **kw)``: fitplan's estimate of tests/data/configs/tiny-llama (bf16-true, ``adamw_torch``,
    micro-batch 2 x 16 tokens on the CPU unless ``kw`` says otherwise) with the bundled llama.json's header
    updated by ``header`` (e.g. ``{"frozen": [...]}`` or ``{"no_grad": [...]}``), read from a directory of its own
    through ``FITPLAN_ARCH_DIR``."""
    import shutil

    import fitplan
    from fitplan.arch import archfile
    from fitplan.arch.architecture import clear_caches

    arch = ROOT / "rulesets" / "architectures"
    made = []

    def estimate(header: dict, **kw):
        d = tmp_path / f"arch-{len(made)}"
        made.append(d)
        d.mkdir()
        data = {**json.loads((arch / "llama.json").read_text()), **header}
        (d / "llama.json").write_text(json.dumps(data))
        shutil.copy(arch / "llama.graphs.json", d / "llama.graphs.json")
        monkeypatch.setenv("FITPLAN_ARCH_DIR", str(d))
        monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
        archfile.load.cache_clear()
        clear_caches()
        try:
            return fitplan.estimate(**{"model": str(ROOT / "tests" / "data" / "configs" / "tiny-llama" / "config.json"),
                                       "precision": "bf16-true", "optim": "adamw_torch",
                                       "per_device_train_batch_size": 2, "max_seq_length": 16, "device": "cpu", **kw})
        finally:
            archfile.load.cache_clear()
            clear_caches()

    return estimate


@pytest.fixture
def trace_cache(tmp_path, monkeypatch) -> Path:
    """An empty disk cache (``FITPLAN_CACHE_DIR``) with step-trace caching on and the in-process trace cache
    cleared, before and after; a background writer (:func:`fitplan.trace.step_trace.store_in_background`) is
    stopped after its queue is written."""
    from fitplan.trace import step_trace

    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FITPLAN_NO_CACHE", raising=False)
    step_trace.build.cache_clear()
    yield tmp_path / "cache"
    step_trace.stop_storing_in_background()
    step_trace.build.cache_clear()


@pytest.fixture
def cli():
    return run_cli


def run_in_process(*args: str) -> subprocess.CompletedProcess:
    """``fitplan`` run in this process through :func:`fitplan.cli.main` (what ``python -m fitplan`` runs: the exit
    status, standard output and error, no traceback), without a new interpreter's start and imports: for tests of
    what a command says and returns. A test of the process itself (the entry point, the environment it starts
    with, signals) keeps :func:`run_cli`. Output goes to strings, which are no terminal: the console is 200
    columns wide and colourless, as in a pipe."""
    import contextlib
    import io

    from fitplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(["fitplan", *args], code, out.getvalue(), err.getvalue())


def run_json_in_process(*args: str) -> dict:
    proc = run_in_process(*args, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def cli_in_process():
    return run_in_process


@pytest.fixture(scope="module")
def rdir(request, tmp_path_factory) -> str:
    """A ruleset directory holding the test module's ``FIXTURE`` TOML text (hardware, providers, tables)."""
    d = tmp_path_factory.mktemp(f"{request.module.__name__.rpartition('.')[2]}-rulesets")
    (d / "fixture.toml").write_text(request.module.FIXTURE, encoding="utf-8")
    return str(d)


# --------------------------------------------------------------------------- fitplan serve and the browser

REQUIRE_BROWSER = os.environ.get("FITPLAN_REQUIRE_BROWSER") == "1"
"""Set by .ci/run: a missing browser or web extra fails the browser tests instead of skipping them."""


def _missing(what: str) -> None:
    if REQUIRE_BROWSER:
        pytest.fail(f"{what} (FITPLAN_REQUIRE_BROWSER=1: CI must run the browser tests)")
    pytest.skip(what)


def chromium_path() -> str:
    """Debian's ``chromium`` (or ``FITPLAN_CHROMIUM``), which the browser tests drive; skipped when missing
    (failed under ``FITPLAN_REQUIRE_BROWSER=1``)."""
    import shutil

    path = os.environ.get("FITPLAN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _missing("headless Chromium not installed (apt-get install -y chromium)")
    return path


def require_modules(*names: str) -> None:
    """The ``web`` extra and playwright, installed by ``make install-test``."""
    import importlib.util

    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        _missing(f"{', '.join(missing)} not installed (make install-test installs the web extra and playwright)")


class Served:
    """A running ``fitplan serve`` (in a thread, on a free localhost port)."""

    def __init__(self, settings, server, sock, url: str) -> None:
        self.settings, self.server, self.sock, self.url = settings, server, sock, url
        self.port = sock.getsockname()[1]


@pytest.fixture(scope="session")
def served():
    """``fitplan serve`` on 127.0.0.1 and a free port, for the whole session; stopped and its uploads removed
    at the end."""
    import threading
    import time

    require_modules("starlette", "uvicorn")
    from fitplan.web.api import Settings
    from fitplan.web.server import make_server, warm_up

    settings = Settings(search_seconds=60.0)
    warm_up(settings)
    server, sock, url = make_server(settings, "127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "fitplan serve did not start"
        time.sleep(0.02)
    yield Served(settings, server, sock, url)
    server.should_exit = True
    thread.join(timeout=10)
    settings.uploads.close()
