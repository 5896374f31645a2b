"""One test per hook, with real plugin objects registered through the plugin manager,
and a meta-test: every hook has a test here and a heading in docs/hooks.md."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import click
import pytest

import fitplan
from fitplan import OptimizerSpec, hookimpl, quantity, reducer
from fitplan.api import Setting
from fitplan.pluginmgr import hookspecs
from fitplan.pluginmgr.registry import make_registry

ROOT = Path(__file__).resolve().parents[1]
HOOKS = sorted(n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("fitplan_"))


def registry(*plugins):
    return make_registry(entry_points=False, extra_plugins=[(type(p).__name__, p) for p in plugins])


class Quantities:
    @hookimpl
    def fitplan_register_quantities(self, register):
        @quantity("bytes", category="memory")
        def kv_cache_bytes(arch, per_device_train_batch_size, max_seq_length, activation_dtype_bytes):
            """2 (k and v) × L × b × s × kv_dim × E."""
            return 2 * arch.num_hidden_layers * per_device_train_batch_size * max_seq_length * arch.kv_dim * activation_dtype_bytes

        register(kv_cache_bytes)


def test_fitplan_register_quantities():
    e = fitplan.estimate(model="llama-2-7b", precision="bf16-true", per_device_train_batch_size=2, max_seq_length=100,
                         registry=registry(Quantities()))
    assert e["kv_cache_bytes"] == 2 * 32 * 2 * 100 * 4096 * 2
    assert e.provenance("kv_cache_bytes")["plugin"] == "Quantities"


class Reducers:
    @hookimpl
    def fitplan_register_reducers(self, register):
        register(reducer("activation_bytes", when=lambda attn_implementation: attn_implementation == "eager",
                         name="halve_for_test", after=("gradient_checkpointing",))(lambda value: value // 2))


def test_fitplan_register_reducers():
    reg = registry(Reducers())
    kw = dict(model="llama-2-7b", precision="bf16-true", max_seq_length=256)
    plain = fitplan.estimate(**kw, attn_implementation="eager")
    halved = fitplan.estimate(**kw, attn_implementation="eager", registry=reg)
    assert halved["activation_bytes"] == plain["activation_bytes"] // 2
    assert "activation_bytes.halve_for_test" in reg.compiled().chains["activation_bytes"]
    assert halved.applied["activation_bytes.halve_for_test"] is True


class Optimizers:
    @hookimpl
    def fitplan_register_optimizers(self, register):
        register(OptimizerSpec(name="one_state", state_bytes=lambda ctx: ctx.numel * ctx.state_bytes, doc="one state",
                               states_per_param=1))


def test_fitplan_register_optimizers():
    e = fitplan.estimate(model="llama-2-7b", precision="32-true", optim="one_state", registry=registry(Optimizers()))
    assert e["optimizer_state_bytes"] == 6_738_415_616 * 4


class RulesetDirs:
    def __init__(self, path):
        self.path = path

    @hookimpl
    def fitplan_ruleset_dirs(self):
        return [self.path]


def test_fitplan_ruleset_dirs(tmp_path):
    (tmp_path / "gpu.toml").write_text(
        '[[gpu]]\nid = "lab-gpu"\nname = "Lab GPU"\nmemory_bytes = 50_000_000_000\nusable_bytes = 49_000_000_000\n'
        'peak_tflops = { bf16 = 100 }\nbandwidth_gbps = 1000\nsource = "test"\n')
    from fitplan.context import get_context

    ctx = get_context(registry=registry(RulesetDirs(str(tmp_path))))
    assert ctx.rulesets.gpu("lab-gpu").usable_bytes == 49_000_000_000
    assert ctx.rulesets.origin["gpu:lab-gpu"] == str(tmp_path / "gpu.toml")


class Commands:
    @hookimpl
    def fitplan_register_commands(self, cli):
        @cli.command(name="hello-plugin")
        def hello():
            click.echo("hello from a plugin")


def test_fitplan_register_commands():
    from click.testing import CliRunner

    group = click.Group("fitplan")
    registry(Commands()).pm.hook.fitplan_register_commands(cli=group)
    assert CliRunner().invoke(group, ["hello-plugin"]).output == "hello from a plugin\n"


class SameCommand:
    @hookimpl
    def fitplan_register_commands(self, cli):
        @cli.command(name="estimate")
        def estimate():
            click.echo("not the real estimate")


def test_a_plugin_cannot_replace_a_command():
    reg = registry(SameCommand())
    group = click.Group("fitplan")
    reg.register_commands(group)
    assert group.commands["estimate"].callback.__module__ == "fitplan.cli.commands.estimate"
    assert any("command 'estimate' is added by plugin 'fitplan.builtin.commands' and again by plugin 'SameCommand'"
               in e.render() for e in reg.errors)


class Names:
    @hookimpl
    def fitplan_register_names(self, register):
        register(fitplan.Name("weights_gib", lambda view: view.values.get("weight_bytes") / 2**30,
                              "weights in GiB", ("weight_bytes",)))


def test_fitplan_register_names():
    from fitplan.rulesets.conditions import Namespace, compile_condition, vocabulary

    reg = registry(Names())
    e = fitplan.estimate(params="1B", registry=reg)
    vocab = vocabulary(reg)
    assert vocab.known("weights_gib") and vocab.type_of("weights_gib") == "number"
    assert vocab.quantities_for("weights_gib") == {"weight_bytes"}
    assert compile_condition({"gt": {"weights_gib": 3.7}}).test(Namespace(e.values, None, None, vocab))  # 4e9 B = 3.73 GiB
    assert not compile_condition({"gt": {"weights_gib": 3.8}}).test(Namespace(e.values, None, None, vocab))


class Formats:
    @hookimpl
    def fitplan_register_formats(self, register):
        from fitplan.output.formats import OutputFormat

        register(OutputFormat("csv", ".csv", ("estimate",), lambda kind, a, options: "weight_bytes\n%d\n" % a.estimate["weight_bytes"]))


def test_fitplan_register_formats():
    from fitplan.assess import assess

    reg = registry(Formats())
    fmt = reg.format("estimate", "csv")
    e = fitplan.estimate(params="1B", assumptions="seed", precision="32-true", registry=reg)
    assert fmt.render("estimate", assess(e, advice=False), None) == "weight_bytes\n4000000000\n"  # 1B × 4 B
    assert "csv" in reg.format_names("estimate") and "csv" not in reg.format_names("recommend")


class SameFormat:
    @hookimpl
    def fitplan_register_formats(self, register):
        from fitplan.output.formats import OutputFormat

        register(OutputFormat("json", ".json", ("estimate",), lambda kind, a, options: "{}"))


def test_a_plugin_cannot_replace_a_format():
    reg = registry(SameFormat())
    assert reg.format("estimate", "json").plugin == "fitplan.builtin.formats"
    assert any("format 'json' for estimate reports is declared by plugin 'fitplan.builtin.formats' and again by "
               "plugin 'SameFormat'" in e.render() for e in reg.errors)


class Sections:
    @hookimpl
    def fitplan_register_report_sections(self, register):
        from fitplan.output.formats import ReportSection

        register(ReportSection("lab", lambda est: {"lab": {"nodes": est["world_size"]}},
                               lambda est, units: [("lab", f"{est['world_size']} GPU(s)")], order=90))


def test_fitplan_register_report_sections():
    from fitplan.assess import assess
    from fitplan.output import estimate_report

    reg = registry(Sections())
    a = assess(fitplan.estimate(params="1B", num_gpus=2, registry=reg), advice=False)
    assert estimate_report.to_json(a)["lab"] == {"nodes": 2}
    assert "- **lab**: 2 GPU(s)" in estimate_report.to_markdown(a)


class Settings:
    """A fictional launcher's setting: MiB it pins on each GPU, and the reducer that counts them."""

    @hookimpl
    def fitplan_register_settings(self, register):
        register(Setting("pinned_buffer_mib", "hardware", type="int", default=0, minimum=0, maximum=4096,
                         help="MiB the launcher pins on each GPU."))

    @hookimpl
    def fitplan_register_reducers(self, register):
        register(reducer("framework_overhead_bytes", when=lambda pinned_buffer_mib: pinned_buffer_mib > 0,
                         name="pinned_buffers")(lambda value, pinned_buffer_mib: value + pinned_buffer_mib * 2**20))


def test_fitplan_register_settings(fitplan_registry):
    reg = fitplan_registry(Settings())
    assert reg.errors == []
    kw = dict(params="1B", precision="32-true", optim="adamw_torch")
    plain = fitplan.estimate(**kw, registry=reg)
    pinned = fitplan.estimate(**kw, pinned_buffer_mib=512, registry=reg)
    assert pinned["framework_overhead_bytes"] - plain["framework_overhead_bytes"] == 512 * 2**20  # 512 MiB
    assert (pinned.scenario.hardware.pinned_buffer_mib, plain.scenario.hardware.pinned_buffer_mib) == (512, 0)
    assert fitplan.scenario_from_dict({"hardware": {"pinned_buffer_mib": "64"}}).hardware.pinned_buffer_mib == 64
    with pytest.raises(fitplan.FitplanError) as e:
        fitplan.scenario_from_dict({"hardware": {"pinned_buffer_mib": 5000}}, file="run.toml")
    assert (e.value.message, e.value.file, e.value.field) == (
        "Hardware.pinned_buffer_mib must be an integer in [0, 4096], got 5000", "run.toml", "pinned_buffer_mib")


class BadSettings:
    @hookimpl
    def fitplan_register_settings(self, register):
        register(Setting("zero_stage", "parallel", type="int", default=0))
        register(Setting("launcher_mode", "paralel", type="text", default="a"))
        register(Setting("launcher-mode", "parallel", type="text", default="a"))
        register(Setting("launcher_threads", "parallel", type="int", default=0, minimum=1))


def test_a_setting_cannot_replace_a_field_or_another_plugins_setting(fitplan_registry):
    reg = fitplan_registry(Settings(), ("Again", Settings()), BadSettings())
    assert sorted(e.message for e in reg.errors) == [
        "plugin 'BadSettings': setting 'launcher-mode' is no field name (a Python identifier such as monitor_agent)",
        "plugin 'BadSettings': setting 'launcher_mode' names section 'paralel' (sections: model, training, lora, "
        "parallel, hardware, dataset, cost, trl)",
        "plugin 'BadSettings': setting 'launcher_threads' has a default it refuses: Parallel.launcher_threads must be "
        "an integer in [1, inf], got 0",
        "plugin 'BadSettings': setting 'zero_stage' is already a scenario field",
        "setting 'pinned_buffer_mib' is declared by plugin 'Settings' and again by plugin 'Again'",
    ]
    assert fitplan.Scenario().hardware.pinned_buffer_mib == 0  # the first declaration stays


def test_essential_and_unknown_plugins_cannot_be_blocked():
    reg = make_registry(entry_points=False, blocked=("fitplan.builtin.peak", "fitplan.builtin.sead"))
    text = "\n".join(e.render() for e in reg.errors)
    assert "plugin 'fitplan.builtin.peak' is essential and cannot be blocked" in text
    assert "FITPLAN_BLOCK_PLUGINS names 'fitplan.builtin.sead', which is no installed plugin" in text
    assert "did you mean 'fitplan.builtin.seed'" in text
    assert reg.pm.has_plugin("fitplan.builtin.peak")


@pytest.mark.parametrize("name", sorted(set(__import__("fitplan.pluginmgr.registry", fromlist=["x"]).BUILTIN_PLUGINS)
                                        - __import__("fitplan.pluginmgr.registry", fromlist=["x"]).ESSENTIAL))
def test_every_other_builtin_can_be_blocked(name):
    reg = make_registry(entry_points=False, blocked=(name,))
    assert reg.errors == []
    reg.compiled()  # the graph still compiles without it


class Validator:
    @hookimpl
    def fitplan_validate(self, scenario, estimate, options):
        w = estimate["weight_bytes"]
        return {"mode": options["mode"], "components": {"parameters": {"predicted": w, "measured": w, "relative_error": 0.0}}}


def test_fitplan_validate():
    reg = registry(Validator())
    e = fitplan.estimate(params="1B", registry=reg)
    out = reg.pm.hook.fitplan_validate(scenario=e.scenario, estimate=e, options={"mode": "cpu"})
    assert out["components"]["parameters"]["measured"] == 4 * 10**9


def test_validate_without_plugin_says_how_to_install(cli):
    proc = cli("validate", "--params", "1B", env={"FITPLAN_BLOCK_PLUGINS": "torch"})
    assert proc.returncode == 2
    assert "pip install" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test_and_a_docs_heading(hook):
    tests = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_hooks.py")
    tests += "".join(f"def test_{h}" for h in HOOKS if f"def test_{h}(" in Path(__file__).read_text())
    assert f"def test_{hook}" in tests, f"no test named test_{hook}"
    docs = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    assert re.search(rf"^##+ `?{hook}`?", docs, re.M), f"docs/hooks.md has no heading for {hook}"


def test_builtin_plugins_are_registered_like_third_party():
    reg = make_registry(entry_points=False)
    names = reg.plugin_names()
    assert "fitplan.builtin.model_states" in names
    assert {q.plugin for q in reg.quantities} <= set(names)


def test_blocking_a_builtin_plugin_by_env(cli):
    proc = cli("estimate", "--params", "1B", env={"FITPLAN_BLOCK_PLUGINS": "fitplan.builtin.seed"}, )
    assert proc.returncode == 0, proc.stderr
    proc = cli("plugins", "--format", "json", env={"FITPLAN_BLOCK_PLUGINS": "fitplan.builtin.seed"})
    import json

    data = json.loads(proc.stdout)
    assert "fitplan.builtin.seed" in data["blocked"]
    assert "fitplan.builtin.seed" not in [p["name"] for p in data["plugins"]]
