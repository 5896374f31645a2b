"""``fitplan estimate``, ``fitplan explain`` and ``fitplan graph``."""

from __future__ import annotations

from typing import Any

import click

from fitplan.cli.emit_files import batches, check_emit_dirs, echo_notes, emit_options, render
from fitplan.app.explain import explanation_for
from fitplan.app.options import emit, estimate_from, format_option, out_option, scenario_options


def add(cli: click.Group) -> None:
    cli.add_command(estimate)
    cli.add_command(explain)
    cli.add_command(graph)


@click.command()
@scenario_options
@format_option("estimate")
@out_option
@click.option("--units", type=click.Choice(["GB", "GiB"]), default="GB", help="GB = 10^9 bytes (default), GiB = 2^30.")
@click.option("--policy", "policy_files", multiple=True, type=click.Path(dir_okay=False),
              help="Check the scenario against a policy file of [[policy]] rules (repeatable; docs/policies.md).")
@emit_options("the scenario (on demand)")
def estimate(fmt: str, out: str | None, units: str, policy_files: tuple[str, ...], emits: tuple[tuple[str, str], ...],
             force: bool, **options: Any) -> None:
    """Estimate memory per GPU (and time and cost, given a dataset and a GPU).

    SCENARIO_FILE is an optional TOML file with [model], [training], [lora], [parallel], [hardware],
    [dataset] and [cost] sections, or a torchtune, axolotl or LLaMA-Factory recipe (.yaml / .yml:
    docs/recipes.md); flags override it.

    Exit status: 0; 2 for bad input; 3 (``POLICY_VIOLATION_EXIT``) when the policies in force forbid the
    scenario in every market it is priced in (docs/policies.md).
    """
    import sys

    from fitplan.assess import assess
    from fitplan.rules.policy import POLICY_VIOLATION_EXIT, forbidding_rules

    check_emit_dirs(emits, force)
    a = assess(estimate_from(options), policy_files=policy_files, cheapest=True)  # cheapest: without --gpu only
    exports = render(emits, a.estimate.scenario, a.estimate, "on_demand") if emits else []
    emit("estimate", a, fmt, out, units, also=tuple(batches(exports)))
    echo_notes(exports)
    rules = forbidding_rules(a.estimate, a.verdicts)
    if rules:
        click.echo(f"policy: forbidden by {', '.join(rules)} (exit status {POLICY_VIOLATION_EXIT})", err=True)
        sys.exit(POLICY_VIOLATION_EXIT)


@click.command()
@click.argument("quantity")
@scenario_options
@click.option("--depth", type=int, default=3, show_default=True, help="How many levels of dependencies to show.")
@format_option("explain", "tree")
@out_option
def explain(quantity: str, depth: int, fmt: str, out: str | None, **options: Any) -> None:
    """Show how QUANTITY was derived: its rule, inputs, values and sources.

    QUANTITY is a quantity's name or its short name (peak, weights, gradients, activations, time, cost, ...).
    Without a model, explains the documented example (llama-2-7b, bf16-mixed, batch 4, seq 2048).
    """
    emit("explain", explanation_for(quantity, depth, options), fmt, out)


@click.command()
@format_option("graph", "dot")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write both fitplan-graph.dot and fitplan-graph.mmd into this directory.")
def graph(fmt: str, out_dir: str | None) -> None:
    """Print the quantity graph as Graphviz DOT or Mermaid."""
    from fitplan.context import get_context
    from fitplan.files import Batch

    if out_dir == "":
        from fitplan.errors import FitplanError

        raise FitplanError("is empty: name the folder to write", field="--out", value=out_dir)
    compiled = get_context().registry.compiled()
    if out_dir is not None:
        batch = Batch()
        d = batch.folder(out_dir, "--out")
        batch.add(d / "fitplan-graph.dot", compiled.to_dot().encode("utf-8"))
        batch.add(d / "fitplan-graph.mmd", compiled.to_mermaid().encode("utf-8"))
        batch.commit()
        click.echo(f"wrote {d / 'fitplan-graph.dot'} and {d / 'fitplan-graph.mmd'}")
        return
    emit("graph", compiled, fmt)
