"""The example plugin ``plugins/fitplan-settings-example``: one ``Setting`` declaration (a cluster's GPU monitoring
agent, ``monitor_agent``) shows up in the scenario, the CLI, the page's form, the exports and the search.

The plugin is not installed anywhere (``make demo`` and ``.test-plugins`` never see it): its source goes on the path
and it is registered for each test by ``fitplan.testing``'s ``fitplan_registry``, which removes its setting again.
Expected bytes come from the plugin's stated modes: full 512 MiB, light 128 MiB, off 0 (its ``AGENT_MIB``).
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import click
import pytest

import fitplan

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
JOB = dict(params="1B", precision="32-true", optim="adamw_torch", gpu="a100-80gb")


@pytest.fixture
def reg(fitplan_registry, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "plugins" / "fitplan-settings-example" / "src"))
    registry = fitplan_registry(importlib.import_module("fitplan_settings_example"))
    assert registry.errors == []
    return registry


def test_it_is_a_field_of_the_scenario(reg):
    s = fitplan.scenario_from_dict({"hardware": {"monitor_agent": "light"}})
    assert (s.hardware.monitor_agent, fitplan.Scenario().hardware.monitor_agent) == ("light", "full")
    with pytest.raises(fitplan.FitplanError) as e:
        fitplan.scenario_from_dict({"hardware": {"monitor_agent": "verbose"}}, file="job.toml")
    assert (e.value.message, e.value.file) == ("Hardware.monitor_agent must be one of full, light, off, got 'verbose'",
                                               "job.toml")


def test_it_costs_what_the_plugin_says(reg):
    full, light, off = (fitplan.estimate(**JOB, monitor_agent=m, registry=reg) for m in ("full", "light", "off"))
    assert full["framework_overhead_bytes"] - off["framework_overhead_bytes"] == 512 * MiB
    assert light["framework_overhead_bytes"] - off["framework_overhead_bytes"] == 128 * MiB
    assert light.role("device_total") - off.role("device_total") == 128 * MiB


def test_it_is_a_cli_option_and_a_field_of_the_form(reg):
    from fitplan.app.options import scenario_from, scenario_options
    from fitplan.web.params import SCENARIO_PARAMS

    command = scenario_options(click.command()(lambda **kw: None))  # the options as a command built now has them
    option = next(p for p in command.params if p.name == "monitor_agent")
    assert option.opts == ["--monitor-agent"] and option.help.startswith("The cluster's GPU monitoring agent: full")
    options = command.make_context("estimate", ["--params", "1B", "--monitor-agent", "light"]).params
    assert scenario_from(options).scenario.hardware.monitor_agent == "light"
    assert SCENARIO_PARAMS["monitor-agent"] == "monitor_agent"  # what fitplan serve's form and API accept
    from fitplan.cli.commands.plugins import listing

    rows = {r["name"]: r for r in listing(reg)["plugins"]}
    assert rows["fitplan_settings_example"]["settings"] == ["monitor_agent"]  # `fitplan plugins` says who declares it
    assert rows["fitplan.builtin.sharding"]["settings"] == ["offload_params"]


def test_it_is_exported_and_imported(reg, tmp_path):
    from fitplan.inputs.importers import training_args_fields
    from fitplan.output.exports import scenario_toml

    s = fitplan.Scenario().replace(params="1B", monitor_agent="off", device="cpu")
    text = scenario_toml(s)
    assert '[hardware]\ndevice = "cpu"\nmonitor_agent = "off"\n' in text  # no `after`: at the section's end
    assert fitplan.scenario_from_dict(tomllib.loads(text)) == s
    assert "monitor_agent" not in scenario_toml(s.replace(monitor_agent="full"))  # the default is not written
    args = tmp_path / "training_args.json"
    args.write_text('{"per_device_train_batch_size": 2, "monitor_agent": "light"}', encoding="utf-8")
    assert training_args_fields(args)[0] == {"per_device_train_batch_size": 2, "monitor_agent": "light"}


def _search(reg, **kw):
    from fitplan.context import get_context
    from fitplan.search.recommend import search
    from fitplan.search.space import SearchSpace

    space = SearchSpace(gpus=("a100-80gb",), gpu_counts=(1,), num_nodes=(1,), attn_implementations=("sdpa",),
                        checkpointing=(False,), effective_batch_size=1, zero_stages=(0,), offload_optimizer=(False,))
    base = fitplan.Scenario().replace(params="1B", precision="32-true", optim="adamw_torch")
    return search(base, get_context((), reg), space=space, objective="gpus", **kw)


def test_the_recommender_searches_it(reg):
    plain = _search(reg)
    assert plain.stats.candidates % 2 == 0 and plain.plans
    assert plain.plans[0].fields["monitor_agent"] == "full"  # both fit: the first value is the simpler plan
    fixed = _search(reg, fixed=("monitor_agent",))  # the base scenario's value (full) stated: not searched
    assert fixed.stats.candidates * 2 == plain.stats.candidates
    assert {p.fields["monitor_agent"] for p in fixed.all_plans()} == {"full"}
    # a headroom that leaves room for the light agent only (the full one holds 384 MiB more)
    light = fitplan.estimate(**JOB, monitor_agent="light", registry=reg)
    spare = light.role("usable") - light.role("device_total") - 192 * MiB
    tight = _search(reg, headroom=f"{spare / 2**30}GiB")
    assert tight.plans[0].fields["monitor_agent"] == "light"
    assert "light monitoring agent" in tight.plans[0].label
