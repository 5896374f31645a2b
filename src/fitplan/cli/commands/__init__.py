"""The built-in commands, one module per group of commands. They are added to ``fitplan`` by the built-in
plugin ``fitplan.builtin.commands`` through the same hook as a plugin's commands.

A group that can defer commands (:class:`fitplan.app.commands.Group`, the ``fitplan`` group) gets each built-in
command as its name and a loader: a command's module is imported only when it runs or ``--help`` lists it, so
``fitplan estimate`` imports no other command's module. :data:`MODULES` says which module adds which commands
(``tests/test_layout.py`` checks it against what each module's ``add`` adds).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import click

MODULES: dict[str, tuple[str, ...]] = {
    "estimate": ("estimate", "explain", "graph"),
    "recommend": ("recommend", "capacity"),
    "dataset": ("dataset",),
    "catalog": ("models", "rulesets"),
    "plugins": ("plugins",),
    "validate": ("validate",),
    "serve": ("serve",),
}
"""Module of ``fitplan.cli.commands`` -> the commands its ``add(cli)`` adds."""


def commands_of(module: str) -> dict[str, click.Command]:
    """The commands that module ``module`` (of this package, or a dotted name) adds (importing it)."""
    group = click.Group()
    importlib.import_module(module if "." in module else f"{__name__}.{module}").add(group)
    return dict(group.commands)


def _loader(module: str, name: str) -> Callable[[], click.Command]:
    return lambda: commands_of(module)[name]


def add_module(cli: click.Group, module: str, names: tuple[str, ...]) -> None:
    """Add the commands ``names`` of ``module`` (whose ``add`` adds exactly those) to ``cli``: deferred when
    ``cli`` can defer (see the module doc)."""
    defer = getattr(cli, "defer", None)
    if defer is None:
        for name, command in commands_of(module).items():
            cli.add_command(command, name)
    else:
        for name in names:
            defer(name, _loader(module, name))


def add_all(cli: click.Group) -> None:
    """Add every command of :data:`MODULES` to ``cli``."""
    for module, names in MODULES.items():
        add_module(cli, module, names)
