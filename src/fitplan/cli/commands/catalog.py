"""``fitplan models`` (the model catalog) and ``fitplan rulesets`` (check and import rulesets)."""

from __future__ import annotations

import sys

import click

from fitplan.app.catalog import model_rows
from fitplan.app.options import emit, format_option, registry


def add(cli: click.Group) -> None:
    cli.add_command(models)
    cli.add_command(rulesets)


@click.group()
def models() -> None:
    """The bundled model catalog."""


@models.command("list")
@format_option("models")
@click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False))
def models_list(fmt: str, ruleset_dirs: tuple[str, ...]) -> None:
    """List catalog models with their parameter counts."""
    from fitplan.context import get_context

    unavailable: list[str] = []
    emit("models", model_rows(get_context(ruleset_dirs).rulesets, unavailable), fmt)
    for line in unavailable:
        click.echo(f"warning: {line}", err=True)


@models.command("show")
@click.argument("name")
@click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False))
def models_show(name: str, ruleset_dirs: tuple[str, ...]) -> None:
    """Show a catalog model (or a config.json): its fields and exact parameter count."""
    from fitplan.context import get_context
    from fitplan.arch.architecture import load_config_json, spec_to_dict
    from fitplan.output.console import dumps_json

    if name.endswith(".json"):
        spec = load_config_json(name)
        origin = name
    else:
        rules = get_context(ruleset_dirs).rulesets
        e = rules.model_entry(name)
        spec = rules.preset_spec(e)
        origin = rules.origin.get(f"model:{e.id}", "")
    data = spec_to_dict(spec)
    data.update(param_count=spec.param_count, active_param_count=spec.active_param_count, ruleset=origin)
    data.pop("bare_param_count", None)
    click.echo(dumps_json(data), nl=False)


@click.group()
def rulesets() -> None:
    """Check and import rulesets."""


@rulesets.command("check")
@click.argument("paths", nargs=-1, required=True)
def rulesets_check(paths: tuple[str, ...]) -> None:
    """Validate ruleset files or directories; report every error at once as `file: message @ $.path`."""
    from fitplan.rules.policy import rule_name_problems
    from fitplan.rulesets.loader import check_paths

    errors = check_paths(paths)
    errors += rule_name_problems(paths, registry())  # the files that parsed: every error at once
    if not errors:
        from fitplan.rulesets.loader import check_references

        errors += check_references(paths)
    for e in errors:
        click.echo(e, err=True)
    if errors:
        click.echo(f"{len(errors)} error(s)", err=True)
        sys.exit(2)
    from fitplan.rulesets.loader import unavailable_presets

    for line in unavailable_presets(paths):  # they load; using one names why it cannot be estimated
        click.echo(f"warning: {line}", err=True)
    click.echo(f"ok: {', '.join(paths)}")


@rulesets.command("import-skypilot")
@click.argument("csv_file", type=click.Path(dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="The pricing ruleset TOML to write.")
@click.option("--provider", default=None, help="Provider id to write (default: the cloud, from catalogs/v8/<cloud>/vms.csv or <cloud>_vms.csv).")
@click.option("--map", "mappings", multiple=True, metavar="NAME=GPU",
              help="Map a SkyPilot accelerator name to a GPU id of the hardware ruleset (repeatable).")
@click.option("--date", default="", help="The catalog's date, written on every instance (e.g. 2025-11).")
@click.option("--billing", type=click.Choice(["second", "minute", "hour"]), default=None,
              help="Billing unit (default: known per cloud, else second).")
@click.option("--minimum-seconds", type=int, default=None, help="Minimum billed seconds (default: known per cloud, else 60).")
@click.option("--spot-overhead", type=float, default=0.1, show_default=True,
              help="Extra fraction of run time lost to spot interruptions.")
@click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Extra ruleset directory whose GPU ids and aliases accelerator names may match.")
def rulesets_import_skypilot(csv_file: str, out: str, provider: str | None, mappings: tuple[str, ...], date: str,
                             billing: str | None, minimum_seconds: int | None, spot_overhead: float,
                             ruleset_dirs: tuple[str, ...]) -> None:
    """Convert a SkyPilot catalog CSV (catalogs/v8/<cloud>/vms.csv) into a pricing ruleset.

    Columns are found by header name. GCP's separate VM and GPU rows are combined (VM + count × GPU
    price, same region). Malformed rows are all reported with their line numbers (exit 2) and nothing
    is written; accelerators that map to no GPU are reported and skipped.
    """
    from fitplan.context import get_context
    from fitplan.rulesets.skypilot import import_to_file, parse_mappings

    extra = parse_mappings(mappings)
    rules = get_context(ruleset_dirs).rulesets
    result, messages = import_to_file(csv_file, out, provider=provider, rules=rules, extra_map=extra, date=date,
                                      billing=billing, minimum_seconds=minimum_seconds, spot_overhead=spot_overhead)
    for m in messages:
        click.echo(m, err=True)
    click.echo(f"wrote {out}: provider {result.data['provider'][0]['id']!r}, {len(result.data['instance'])} instance(s)")
