"""``fitplan plugins``: every plugin, its distribution and what it registers; ``--check`` reports every problem."""

from __future__ import annotations

import sys
from typing import Any

import click

from fitplan.app.options import emit, format_option
from fitplan.errors import FitplanError


def add(cli: click.Group) -> None:
    cli.add_command(plugins)


@click.command()
@click.option("--check", is_flag=True, help="Load every plugin and report every problem at once (exit 2 if any).")
@format_option("plugins")
def plugins(check: bool, fmt: str) -> None:
    """List plugins and what each registers (quantities, reducers, optimizers, names, settings, commands, formats, ruleset
    dirs)."""
    from fitplan.output.console import console, escape
    from fitplan.pluginmgr.registry import make_registry

    reg = make_registry()
    data = listing(reg)
    data["checked"] = check
    emit("plugins", data, fmt)
    if fmt != "json":
        for p in data["problems"]:
            console(err=True).print(f"[red]problem:[/] {escape(p)}", markup=True)
    if check and data["problems"]:
        sys.exit(2)


def listing(reg) -> dict[str, Any]:
    """What ``fitplan plugins`` shows of a registry (its problems included, a graph error among them)."""
    from fitplan.errors import PluginError
    from fitplan.inputs.settings import declared

    dirs_by_plugin: dict[str, list[str]] = {}
    for name, result in reg.ruleset_dirs_answered():
        if isinstance(result, (list, tuple)):
            dirs_by_plugin[name] = [str(d) for d in result]
    try:
        reg.compiled()
    except FitplanError as e:
        reg.errors.append(PluginError(e.message, details=e.details))
    commands = reg.commands_by_plugin()
    rows = []
    for name in reg.plugin_names():
        dist, version = reg.distributions.get(name, ("", ""))
        rows.append({
            "name": name,
            "builtin": name.startswith("fitplan.builtin."),
            "distribution": dist,
            "version": version,
            "hooks": sorted({h.name for h in reg.pm.get_hookcallers(reg.pm.get_plugin(name)) or []}),
            "quantities": sorted(q.name for q in reg.quantities if q.plugin == name),
            "reducers": sorted(f"{r.target}.{r.name}" for r in reg.reducers if r.plugin == name),
            "optimizers": sorted(o.name for o in reg.optimizers.values() if o.plugin == name and not o.refused),
            "optimizers_not_hf": sorted(o.name for o in reg.optimizers.values() if o.plugin == name and not o.hf),
            "optimizers_refused": {o.name: o.refused for o in sorted(reg.optimizers.values(), key=lambda o: o.name)
                                   if o.plugin == name and o.refused},
            "names": sorted(n.name for n in reg.names.values() if n.plugin == name),
            "settings": sorted(s.name for s in declared().values() if s.plugin == name),
            "commands": commands.get(name, []),
            "formats": sorted({f"{f.name} ({k})" for (k, _), f in reg.formats.items() if f.plugin == name}),
            "ruleset_dirs": dirs_by_plugin.get(name, []),
        })
    return {"plugins": rows, "blocked": sorted(reg.blocked), "problems": [e.render() for e in reg.errors]}
