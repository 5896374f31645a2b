"""Fault isolation: a broken plugin gets an error naming the plugin and the quantity (or optimizer,
hook, directory); ``fitplan plugins --check`` reports every problem at once (exit 2); blocking the
faulty plugin (``FITPLAN_BLOCK_PLUGINS``) leaves the rest working.

The faulty plugins are real plugin objects: those of the broken distribution under
``tests/data/plugins/broken-plugin`` are loaded through real ``fitplan`` entry points (a dist-info on a
temporary ``sys.path`` entry, or on ``PYTHONPATH`` for the command line), the others are registered
through ``make_registry(extra_plugins=...)``.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

import fitplan
from fitplan import OptimizerSpec, PluginError, hookimpl, quantity, reducer
from fitplan.errors import GraphError
from fitplan.pluginmgr.registry import BLOCK_ENV, make_registry
from fitplan.testing import write_dist_info

ROOT = Path(__file__).resolve().parents[1]
BROKEN = ROOT / "tests" / "data" / "plugins" / "broken-plugin"
BROKEN_EPS: dict[str, str] = tomllib.loads((BROKEN / "pyproject.toml").read_text())["project"]["entry-points"]["fitplan"]

# Each broken entry point and what its error must say: the plugin's name and the thing at fault.
EXPECTED: dict[str, tuple[str, ...]] = {
    "broken-raises": ("plugin 'broken-raises' raised RuntimeError: broken_raises could not build its quantities "
                      "in fitplan_register_quantities",),
    "broken-returns": ("plugin 'broken-returns' returned list from fitplan_register_quantities; "
                       "declarations go through register()",),
    "broken-registers": ("plugin 'broken-registers' registered a function ('broken_bare_function_bytes') in "
                         "fitplan_register_quantities, expected a fitplan.Quantity", "@fitplan.quantity(unit)"),
    # pluggy calls the built-in plugins first (registry.py): the built-in declaration is the first one
    "broken-duplicate": ("quantity 'gradient_bytes' is declared by plugin 'fitplan.builtin.model_states' and again "
                         "by plugin 'broken-duplicate'",),
    "broken-cycle": ("dependency cycle: broken_cycle_a_bytes -> broken_cycle_b_bytes -> broken_cycle_a_bytes",
                     "broken-cycle"),
    "broken-target": ("plugin 'broken-target': reducer 'broken_halve' targets unknown quantity 'optimizer_state_byte'",
                      "did you mean 'optimizer_state_bytes'"),
    "broken-hook": ("plugin 'broken-hook' implements unknown hook 'fitplan_register_quantity'",
                    "did you mean 'fitplan_register_quantities'"),
    "broken-optimizer": ("plugin 'broken-optimizer': optimizer 'broken_optimizer' raised ValueError: broken_optimizer "
                         "has no rule for these tensors in state_bytes(OptimizerContext)",),
    "broken-rulesets": ("plugin 'broken-rulesets' ships ruleset directory '/nonexistent/broken_rulesets', "
                        "which does not exist",),
    "broken-import": ("plugin 'broken-import' (fitplan_broken_plugin.does_not_import) failed to load: "
                      "ModuleNotFoundError", "fitplan_dependency_that_is_not_installed"),
    "broken-exit-import": ("plugin 'broken-exit-import' (fitplan_broken_plugin.exits) failed to load: exited "
                           "(sys.exit(0))",),
    "broken-exit-hook": ("plugin 'broken-exit-hook' exited (sys.exit(0)) in fitplan_register_quantities",),
}
DECLARATION_FAULTS = sorted(EXPECTED)
EVALUATION_FAULT = "broken-evaluation"
EXIT_AT_EVALUATION = "broken-exit-evaluation"


def problems(reg) -> list[str]:
    """Every problem the registry knows: plugin errors, then quantity-graph problems (as `plugins --check`)."""
    out = [e.render() for e in reg.errors]
    try:
        reg.compiled()
    except GraphError as e:
        out.append(e.render())
    return out


@pytest.fixture
def broken_site(fitplan_entry_points) -> Path:
    """The broken distribution, discoverable through its entry points for this test."""
    return fitplan_entry_points("fitplan-broken-plugin", BROKEN_EPS, src=BROKEN / "src")


def test_the_broken_distribution_declares_every_case():
    assert set(BROKEN_EPS) == set(EXPECTED) | {EVALUATION_FAULT, EXIT_AT_EVALUATION}


# --------------------------------------------------------------------------- one fault at a time, entry points


@pytest.mark.parametrize("name", DECLARATION_FAULTS)
def test_each_fault_names_the_plugin_and_what_is_wrong(broken_site, fitplan_registry, name):
    reg = fitplan_registry(name)
    found = problems(reg)
    assert len(found) == 1, found
    for needle in EXPECTED[name]:
        assert needle in found[0], (needle, found[0])


@pytest.mark.parametrize("name", DECLARATION_FAULTS)
def test_each_fault_stops_estimates_with_a_plugin_error(broken_site, estimate_with, name):
    with pytest.raises((PluginError, GraphError)) as e:
        estimate_with(plugins=[name], params="1B")
    assert name in e.value.render() or name in str(e.value.details)


def test_a_faulty_plugin_does_not_hide_the_others_declarations(broken_site, fitplan_registry):
    reg = fitplan_registry("broken-raises", "broken-optimizer", Lion1())
    assert "one_state_test" in reg.optimizers  # a good plugin loaded after two bad ones
    assert "broken_optimizer" not in reg.optimizers  # a spec that fails its probe is not registered
    assert len(reg.errors) == 2


def test_evaluation_fault_names_plugin_and_quantity(broken_site, estimate_with):
    with pytest.raises(PluginError) as e:
        estimate_with(plugins=[EVALUATION_FAULT], params="1B")
    assert ("plugin 'broken-evaluation': quantity 'broken_ratio_bytes' raised ZeroDivisionError"
            in e.value.render())
    assert f"{BLOCK_ENV}=broken-evaluation" in e.value.render()


def test_exit_at_evaluation_names_plugin_and_quantity(broken_site, estimate_with):
    with pytest.raises(PluginError) as e:
        estimate_with(plugins=[EXIT_AT_EVALUATION], params="1B")
    assert "plugin 'broken-exit-evaluation': quantity 'broken_exit_bytes' raised SystemExit" in e.value.render()


def test_a_plugin_exiting_at_import_does_not_make_fitplan_exit_0(cli, tmp_path):
    write_dist_info(tmp_path, "fitplan-broken-plugin", {"broken-exit-import": BROKEN_EPS["broken-exit-import"]})
    proc = cli("estimate", "--params", "1B", "--format", "json", env=_env(tmp_path))
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
    assert "plugin 'broken-exit-import'" in proc.stderr and "sys.exit(0)" in proc.stderr
    blocked = cli("estimate", "--params", "1B", "--precision", "32-true", "--optim", "adamw_torch", "--format", "json",
                  env=_env(tmp_path, ["broken-exit-import"]))
    # fp32 weights: 4 bytes a parameter
    assert blocked.returncode == 0 and json.loads(blocked.stdout)["memory"]["per_gpu_bytes"]["weights"] == 4 * 10**9


# --------------------------------------------------------------------------- every fault at once, the CLI


def _env(site: Path, blocked: list[str] | None = None) -> dict[str, str]:
    path = os.pathsep.join([str(site), str(BROKEN / "src"), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path.rstrip(os.pathsep), BLOCK_ENV: ",".join(blocked or [])}


@pytest.fixture
def broken_cli_site(tmp_path) -> Path:
    write_dist_info(tmp_path, "fitplan-broken-plugin", BROKEN_EPS)
    return tmp_path


def test_plugins_check_reports_every_problem_at_once(cli, broken_cli_site):
    proc = cli("plugins", "--check", "--format", "json", env=_env(broken_cli_site))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    text = "\n".join(report["problems"])
    for name, needles in EXPECTED.items():
        for needle in needles:
            assert needle in text, (name, needle, text)
    listed = {p["name"] for p in report["plugins"]}
    assert {"broken-raises", "broken-optimizer", "fitplan.builtin.model_states"} <= listed


def test_plugins_check_table_format_exits_2_and_prints_each_problem(cli, broken_cli_site):
    proc = cli("plugins", "--check", env=_env(broken_cli_site))
    assert proc.returncode == 2
    for name in DECLARATION_FAULTS:
        assert name in proc.stderr, name


def test_blocking_every_faulty_plugin_leaves_the_rest_working(cli, broken_cli_site):
    blocked = sorted(BROKEN_EPS)
    proc = cli("plugins", "--check", "--format", "json", env=_env(broken_cli_site, blocked))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["problems"] == []
    assert set(blocked) <= set(report["blocked"])
    assert not set(blocked) & {p["name"] for p in report["plugins"]}
    proc = cli("estimate", "--params", "1B", "--optim", "sgd_momentum", "--precision", "32-true", "--format", "json",
               env=_env(broken_cli_site, blocked))  # one fp32 momentum buffer: 4 bytes a parameter
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["memory"]["per_gpu_bytes"]["optimizer_states"] == 10**9 * 4


def test_an_evaluation_fault_is_a_clean_cli_error_until_blocked(cli, broken_cli_site):
    others = sorted(set(BROKEN_EPS) - {EVALUATION_FAULT})
    proc = cli("estimate", "--params", "1B", env=_env(broken_cli_site, others))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "plugin 'broken-evaluation': quantity 'broken_ratio_bytes' raised ZeroDivisionError" in proc.stderr
    proc = cli("estimate", "--params", "1B", env=_env(broken_cli_site, [*others, EVALUATION_FAULT]))
    assert proc.returncode == 0, proc.stderr


def test_blocking_reads_the_environment(broken_site, monkeypatch):
    monkeypatch.setenv(BLOCK_ENV, "broken-raises, broken-optimizer")
    reg = make_registry(entry_points=["broken-raises", "broken-optimizer"])
    assert reg.errors == [] and reg.blocked == {"broken-raises", "broken-optimizer"}


def test_asking_for_an_entry_point_that_is_not_installed():
    reg = make_registry(entry_points=["no-such-fitplan-plugin"], blocked=())
    assert [e.message for e in reg.errors] == [
        "no installed distribution declares a 'fitplan' entry point named 'no-such-fitplan-plugin'"]


# --------------------------------------------------------------------------- faults at evaluation, extra_plugins


class Lion1:
    """A good plugin: one-state optimizer."""

    @hookimpl
    def fitplan_register_optimizers(self, register):
        register(OptimizerSpec(name="one_state_test", state_bytes=lambda ctx: ctx.numel * ctx.state_bytes, doc="1 state"))


class MemoryNotANumber:
    @hookimpl
    def fitplan_register_quantities(self, register):
        @quantity("bytes", category="memory")
        def lookup_table_bytes(param_count):
            """Returns a string by mistake."""
            return f"{param_count} bytes"

        register(lookup_table_bytes)


class ReducerReturnsNone:
    @hookimpl
    def fitplan_register_reducers(self, register):
        @reducer("optimizer_state_bytes", when=lambda: True, name="forgot_return")
        def forgot_return(value):
            value // 2  # noqa: B018 - the bug under test

        register(forgot_return)


def _big_model_only(ctx):
    if ctx.numel > 10**8:
        raise OverflowError("too many parameters for this rule")
    return ctx.numel * 4


def _returns_text(ctx):
    return "lots" if ctx.numel > 10**8 else ctx.numel


class OptimizerFailsOnRealModels:
    """Passes the registration probe (a small context), fails on a 1B model."""

    @hookimpl
    def fitplan_register_optimizers(self, register):
        register(OptimizerSpec(name="small_only", state_bytes=_big_model_only, doc="raises for big models"))
        register(OptimizerSpec(name="text_bytes", state_bytes=_returns_text, doc="returns text for big models"))


def registry(*plugins, blocked=()):
    return make_registry(entry_points=False, extra_plugins=[(type(p).__name__, p) for p in plugins], blocked=blocked)


def test_memory_quantity_of_the_wrong_type_names_plugin_and_quantity():
    with pytest.raises(PluginError) as e:
        fitplan.estimate(params="1B", registry=registry(MemoryNotANumber()))
    assert ("plugin 'MemoryNotANumber': quantity 'lookup_table_bytes' returned str '1000000000 bytes', "
            "expected a finite number of bytes") in e.value.render()


def test_reducer_returning_none_names_the_reducer_not_the_contributor():
    with pytest.raises(PluginError) as e:
        fitplan.estimate(params="1B", registry=registry(ReducerReturnsNone()))
    assert ("plugin 'ReducerReturnsNone': reducer 'forgot_return' on quantity 'optimizer_state_bytes' returned "
            "NoneType None") in e.value.render()


def test_optimizer_raising_at_evaluation_blames_the_optimizer_plugin():
    reg = registry(OptimizerFailsOnRealModels())
    assert reg.errors == []  # 8 × 4 + 2 × 32 + 1000 × 32 elements are fine
    with pytest.raises(PluginError) as e:
        fitplan.estimate(params="1B", optim="small_only", registry=reg)
    text = e.value.render()
    assert ("plugin 'OptimizerFailsOnRealModels': OptimizerSpec 'small_only' raised OverflowError: too many parameters "
            "for this rule in state_bytes, while computing quantity 'optimizer_state_bytes'") in text
    assert f"{BLOCK_ENV}=OptimizerFailsOnRealModels" in text


def test_optimizer_returning_text_names_both_plugins():
    with pytest.raises(PluginError) as e:
        fitplan.estimate(params="1B", optim="text_bytes", registry=registry(OptimizerFailsOnRealModels()))
    text = e.value.render()
    assert "quantity 'optimizer_state_bytes' raised ValueError" in text
    assert "plugin 'fitplan.builtin.model_states'" in text
    assert "input OptimizerSpec 'text_bytes' from plugin 'OptimizerFailsOnRealModels'" in text


def test_user_errors_raised_inside_quantities_pass_through_unchanged():
    with pytest.raises(fitplan.FitplanError) as e:
        fitplan.estimate(model="llama-2-7b", method="lora", lora_target_modules=["c_attn"], registry=registry())
    assert not isinstance(e.value, PluginError)
    assert "c_attn" in e.value.message


def test_blocking_the_faulty_plugin_leaves_the_others_working():
    faulty = MemoryNotANumber()
    reg = registry(faulty, Lion1(), blocked=["MemoryNotANumber"])
    est = fitplan.estimate(params="1B", optim="one_state_test", precision="32-true", registry=reg)
    assert est["optimizer_state_bytes"] == 10**9 * 4  # one fp32 state: 4 bytes a parameter
    assert "lookup_table_bytes" not in est.values


def test_duplicate_optimizer_names_both_plugins():
    class Again(Lion1):
        pass

    reg = make_registry(entry_points=False, extra_plugins=[("first", Lion1()), ("second", Again())], blocked=())
    assert [e.message for e in reg.errors] == [
        "optimizer 'one_state_test' is declared twice: by plugin 'first' and by plugin 'second'"]


def test_every_graph_problem_is_reported_together():
    class Many:
        @hookimpl
        def fitplan_register_quantities(self, register):
            register(fitplan.Quantity(name="weight_bytes", func=lambda param_count: 0, unit="bytes"))

            @quantity("bytes")
            def loop_a_bytes(loop_b_bytes):
                return loop_b_bytes

            @quantity("bytes")
            def loop_b_bytes(loop_a_bytes):
                return loop_a_bytes

            register(loop_a_bytes)
            register(loop_b_bytes)

        @hookimpl
        def fitplan_register_reducers(self, register):
            register(reducer("peak_byte", when=lambda: True, name="shave")(lambda value: value))

    with pytest.raises(GraphError) as e:
        registry(Many()).compiled()
    details = "\n".join(e.value.details)
    assert e.value.message == "3 problem(s) in the quantity graph"
    assert "quantity 'weight_bytes' is declared by plugin 'fitplan.builtin.model_states' and again by plugin 'Many'" in details
    assert "plugin 'Many': reducer 'shave' targets unknown quantity 'peak_byte'" in details
    assert "dependency cycle: loop_a_bytes -> loop_b_bytes -> loop_a_bytes (declared by plugin(s): Many)" in details


def test_self_dependency_is_a_cycle():
    class Selfish:
        @hookimpl
        def fitplan_register_quantities(self, register):
            @quantity("bytes")
            def selfish_bytes(selfish_bytes):
                return selfish_bytes

            register(selfish_bytes)

    with pytest.raises(GraphError) as e:
        registry(Selfish()).compiled()
    assert e.value.message == "dependency cycle: selfish_bytes -> selfish_bytes"
    assert e.value.details == ["declared by plugin(s): Selfish"]


def test_ruleset_dir_hook_returning_a_string_or_an_invalid_directory(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "prices.toml").write_text('[[provider]]\nid = "x"\n')  # name and source missing

    class ReturnsString:
        @hookimpl
        def fitplan_ruleset_dirs(self):
            return str(tmp_path)

    class ShipsInvalid:
        @hookimpl
        def fitplan_ruleset_dirs(self):
            return [bad]

    reg = registry(ReturnsString(), ShipsInvalid())
    messages = [e.message for e in reg.errors]
    assert messages == [
        "plugin 'ReturnsString' returned str from fitplan_ruleset_dirs, expected a list of paths",
        f"plugin 'ShipsInvalid' ships an invalid ruleset directory '{bad}'",
    ]
    assert any(str(bad / "prices.toml") in d for d in reg.errors[1].details)
    assert reg.ruleset_dirs() == []
