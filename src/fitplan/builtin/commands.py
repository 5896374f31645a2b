"""The built-in commands (estimate, explain, graph, recommend, capacity, dataset, models, rulesets, plugins,
validate, serve: :mod:`fitplan.cli.commands`; calibrate: :mod:`fitplan.builtin.time.calibrate`, beside the
calibration it writes), added through ``fitplan_register_commands`` like a plugin's."""

from __future__ import annotations

from fitplan.pluginmgr.hookspecs import hookimpl

CALIBRATE = "fitplan.builtin.time.calibrate"
"""The module of ``fitplan calibrate`` (tests/test_layout.py checks that its ``add`` adds exactly that)."""


@hookimpl
def fitplan_register_commands(cli):
    from fitplan.cli.commands import add_all, add_module

    add_all(cli)
    add_module(cli, CALIBRATE, ("calibrate",))
