"""``--emit KIND DIR`` for ``fitplan recommend`` (the top plan) and ``fitplan estimate`` (the scenario): the option,
the check of its folders before anything is computed, and the files rendered into one batch with the report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from fitplan.errors import FitplanError

EMIT_KINDS = ("deepspeed", "accelerate", "training-args", "skypilot", "scenario", "all")
"""== fitplan.output.exports.KINDS + all (tests/test_exports.py checks); not imported: the command starts lighter."""

Rendered = list[tuple[str, list[tuple[str, str]], list[str]]]
"""``(directory, [(file name, text)], notes)`` per ``--emit``."""


def emit_options(what: str) -> Callable[[Callable], Callable]:
    """``--emit KIND DIR`` (repeatable) and ``--force``; ``what`` says what is written (help text)."""

    def wrap(func: Callable) -> Callable:
        func = click.option("--force", is_flag=True, help="Let --emit write into a folder that already holds files.")(func)
        return click.option("--emit", "emits", multiple=True, nargs=2,
                            type=(click.Choice(EMIT_KINDS), click.Path(file_okay=False)), metavar="KIND DIR",
                            help=f"Write {what} as KIND (deepspeed, accelerate, training-args, skypilot, scenario, all) "
                                 "into DIR.")(func)

    return wrap


def check_emit_dirs(emits: tuple[tuple[str, str], ...], force: bool) -> None:
    """``--emit`` never replaces files silently: a folder that already holds files needs ``--force`` (checked
    before the search or the estimate, so that nothing is computed for nothing)."""
    for _, directory in emits:
        d = Path(directory)
        if d.exists() and not d.is_dir():
            raise FitplanError("is not a folder", file=str(d), field="--emit")
        if d.is_dir() and any(d.iterdir()) and not force:
            raise FitplanError("the folder already holds files; --emit would replace them", file=str(d), field="--emit",
                               suggestion="choose an empty folder, or pass --force")


def render(emits: tuple[tuple[str, str], ...], s, est, market: str | None) -> Rendered:
    """The files of every ``--emit`` for scenario ``s`` (its estimate ``est``, its ``market``), rendered before
    anything is written, so that a failing export leaves every file as it was."""
    from fitplan.output.exports import render_exports

    return [(directory, *render_exports(kind, s, est, market)) for kind, directory in emits]


def batches(rendered: Rendered) -> list:
    """The ``--emit`` files as one :class:`~fitplan.files.Batch` (empty list: none), committed with
    the report's ``--out``."""
    if not rendered:
        return []
    from fitplan.output.exports import exports_batch

    batch = None
    for directory, files, _ in rendered:
        batch = exports_batch(directory, files, batch)
    return [batch]


def echo_notes(rendered: Rendered) -> None:
    """What the emitted files cannot carry, on stderr."""
    for _, _, notes in rendered:
        for n in notes:
            click.echo(f"note: {n}", err=True)
