"""``fitplan recommend`` (the cheapest, fastest or smallest plan that fits; the largest micro-batch or
sequence with ``--max``) and ``fitplan capacity`` (the seed's GPU tables, recomputed)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from fitplan.cli.emit_files import batches, check_emit_dirs, echo_notes, emit_options
from fitplan.app.options import emit, format_option, out_option, scenario_from, scenario_options
from fitplan.app.recommend import find_plans, largest_report
from fitplan.errors import FitplanError

OBJECTIVES = ("cost", "time", "gpus")
"""== fitplan.search.space.OBJECTIVES (tests/test_graph.py checks); not imported: the search pulls in networkx."""


def add(cli: click.Group) -> None:
    cli.add_command(recommend)
    cli.add_command(capacity)


def _progress():
    """A rich progress bar on stderr when it is a terminal (a context manager yielding a callback), else None."""
    import contextlib

    if not sys.stderr.isatty():
        return contextlib.nullcontext(None)

    @contextlib.contextmanager
    def bar():
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("searching plans"), BarColumn(), TextColumn("{task.percentage:>3.0f} %"),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("search", total=1)

            def update(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            yield update

    return bar()


@click.command()
@scenario_options
@click.option("--objective", type=click.Choice(OBJECTIVES), default="cost", show_default=True,
              help="Rank by cost (USD in the plan's market), time, or GPUs used.")
@click.option("--effective-batch-size", type=int, default=16, show_default=True,
              help="Sequences per optimizer step over all GPUs: micro-batch × accumulation × data-parallel GPUs.")
@click.option("--headroom", default="0.05", show_default=True,
              help="Memory to keep free: a fraction of usable memory (0.1, 10%) or an amount (2GB, 1.5GiB).")
@click.option("--top", type=int, default=10, show_default=True, help="How many ranked plans to show.")
@click.option("--policy", "policy_files", multiple=True, type=click.Path(dir_okay=False),
              help="A policy file of [[policy]] rules (repeatable; docs/policies.md).")
@click.option("--gpus", default=None, help="Comma-separated GPU ids to consider (default: every GPU with a price).")
@click.option("--providers", default=None, help="Comma-separated providers to consider.")
@click.option("--vary", default=None,
              help="Comma-separated dimensions that change the trained model to compare side by side: method, optim, "
                   "precision (default: none; the scenario's values are kept).")
@click.option("--methods", default=None, help="Compare these methods side by side (full,lora,qlora): --vary method, restricted.")
@click.option("--precisions", default=None, help="Compare these precision presets side by side: --vary precision, restricted.")
@click.option("--optims", default=None, help="Compare these optimizers side by side: --vary optim, restricted.")
@click.option("--markets", default=None, help="on_demand, spot, or on_demand,spot (default: on_demand).")
@click.option("--max-gpus", type=int, default=16, show_default=True, help="At most this many GPUs in a plan.")
@click.option("--max-nodes", type=int, default=2, show_default=True, help="At most this many nodes (whole instances).")
@click.option("--max", "max_of", type=click.Choice(["micro-batch", "seq-length"]), default=None,
              help="Reverse question: the largest micro-batch or sequence length that fits --gpu (nothing else searched).")
@emit_options("the top plan")
@format_option("recommend")
@out_option
def recommend(objective: str, effective_batch_size: int, headroom: str, top: int, policy_files: tuple[str, ...],
              gpus: str | None, providers: str | None, vary: str | None, methods: str | None, precisions: str | None,
              optims: str | None, markets: str | None, max_gpus: int, max_nodes: int, max_of: str | None,
              emits: tuple[tuple[str, str], ...], force: bool, fmt: str, out: str | None, **options: Any) -> None:
    """Find the cheapest (or fastest, or smallest) plans that fit, under your organisation's policies.

    Searches what leaves the trained model the same: GPU types and counts (instance shapes), providers,
    checkpointing, ZeRO stage and offload, micro-batch × accumulation for --effective-batch-size, and the
    attention kernel, on demand (--markets spot for spot). Method, optimizer and precision stay the scenario's
    unless --vary opens them: then each value's best plans are shown side by side. A field you set (--gpu
    h100-sxm, --zero 3, a scenario file's value) is fixed.
    """
    from fitplan.context import get_context

    built = scenario_from(options)
    ctx = get_context(built.ruleset_dirs)
    if not 1 <= top <= 1000:
        raise FitplanError(f"--top must be between 1 and 1,000, got {top:,}", field="--top", value=top)
    check_emit_dirs(emits, force)
    if max_of is not None:
        _largest(built.scenario, ctx, max_of, headroom, fmt, out)
        return
    t0 = time.perf_counter()
    with _progress() as progress:
        result = find_plans(built, ctx, {"objective": objective, "headroom": headroom, "top": top, "vary": vary,
                                         "methods": methods,
                                         "precisions": precisions, "optims": optims, "gpus": gpus, "providers": providers,
                                         "markets": markets, "effective_batch_size": effective_batch_size,
                                         "max_gpus": max_gpus, "max_nodes": max_nodes}, policy_files, progress)
    elapsed = time.perf_counter() - t0
    exports = _exports(result, emits)
    emit("recommend", result, fmt, out, also=tuple(batches(exports)))
    if sys.stderr.isatty() or fmt == "table":
        click.echo(f"searched {result.stats.candidates:,} candidate plans in {elapsed:.2f} s "
                   f"({result.stats.candidates / max(elapsed, 1e-9):,.0f} per second)", err=True)
    echo_notes(exports)


def _exports(result, emits: tuple[tuple[str, str], ...]):
    """The files ``--emit`` writes for the top plan (:func:`fitplan.cli.emit_files.render`)."""
    if not emits:
        return []
    if result.vary:
        raise FitplanError(f"--emit writes one plan, and --vary {','.join(result.vary)} shows one per value",
                           field="--emit", suggestion="fix the value you chose (e.g. --method lora) and run again")
    if not result.plans:
        raise FitplanError("no plan to emit: none fits with the required headroom", field="--emit",
                           suggestion="lower --headroom, allow more GPUs (--max-gpus) or methods")
    from fitplan.cli.emit_files import render
    from fitplan.search.plans import plan_scenario

    first = result.plans[0]
    return render(emits, plan_scenario(result.base, first), first.estimate, first.market)


def _largest(base, ctx, what: str, headroom: str, fmt: str, out: str | None) -> None:
    report = largest_report(base, ctx, what, headroom)
    if fmt not in ("table", "json"):
        raise FitplanError(f"--max answers in table or json, not {fmt}", field="--format", value=fmt)
    emit("largest", report, fmt, out)


@click.command()
@click.option("--gpu", "gpus", multiple=True, help="GPUs for the single-GPU table (default: the seed's five).")
@format_option("capacity")
@click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False))
def capacity(gpus: tuple[str, ...], fmt: str, ruleset_dirs: tuple[str, ...]) -> None:
    """The seed chapter's GPU tables (largest model for full and efficient fine-tuning), recomputed.

    The seed's own columns are shown beside fitplan's; docs/recommend.md states the method.
    """
    from fitplan.context import get_context
    from fitplan.search.capacity import capacity_table

    emit("capacity", capacity_table(get_context(ruleset_dirs), gpus or None), fmt)
