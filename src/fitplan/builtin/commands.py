"""The built-in commands (estimate, explain, graph, recommend, capacity, dataset, models, rulesets, plugins,
validate, serve), added through ``fitplan_register_commands`` like a plugin's (:mod:`fitplan.cli.commands`)."""

from __future__ import annotations

from fitplan.pluginmgr.hookspecs import hookimpl


@hookimpl
def fitplan_register_commands(cli):
    from fitplan.cli.commands import add_all

    add_all(cli)
