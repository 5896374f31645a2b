"""The built-in commands, one module per group of commands. They are added to ``fitplan`` by the built-in
plugin ``fitplan.builtin.commands`` through the same hook as a plugin's commands."""

from __future__ import annotations

import click


def add_all(cli: click.Group) -> None:
    """Add every built-in command to ``cli``."""
    from fitplan.cli.commands import calibrate, catalog, dataset, estimate, plugins, recommend, serve, validate

    for module in (estimate, recommend, dataset, catalog, plugins, validate, calibrate, serve):
        module.add(cli)
