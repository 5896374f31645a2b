"""The ``fitplan`` commands as the plugins add them: the deferring click group the command line uses, and
:func:`command`, the command of a name, whose parser ``fitplan serve`` uses for its queries (so that the server
parses a query exactly as the command line parses the same flags, without importing :mod:`fitplan.cli`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click


class Group(click.Group):
    """A click group whose commands may be added as a name and a loader (:meth:`defer`): the loader runs (and
    imports the command's module) only when the command is run, or listed by ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deferred: dict[str, Callable[[], click.Command]] = {}

    def defer(self, name: str, load: Callable[[], click.Command]) -> None:
        self.deferred[name] = load

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.deferred})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.deferred:
            self.add_command(self.deferred.pop(cmd_name)(), cmd_name)
        return super().get_command(ctx, cmd_name)


@functools.lru_cache(maxsize=None)
def command(name: str) -> click.Command:
    """The ``fitplan`` command ``name`` (``estimate``, ``explain``, ``recommend``, ...), as the plugins add it
    through ``fitplan_register_commands`` (the built-in ones through ``fitplan.builtin.commands``)."""
    from fitplan.pluginmgr.registry import default_registry

    group = Group()
    default_registry().register_commands(group)
    found = group.get_command(click.Context(group), name)
    if found is None:
        raise KeyError(name)
    return found
