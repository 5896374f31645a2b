"""One pass over a dataset: records read, rendered and tokenized in batches, lengths counted.

Memory stays bounded: records are read one at a time (:mod:`fitplan.data.readers`), tokenized
``BATCH_EXAMPLES`` at a time through the fast tokenizer's batch API (whose Rust thread pool uses every core), and
only the length histogram is kept. A large JSON Lines file is also split at line starts into ranges that worker
processes read, render and tokenize in parallel (each with a one-thread tokenizer), which matters when Python's
JSON parsing or a chat template's rendering is the slow part. A rich progress bar shows on a terminal.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from fitplan.data.examples import COLUMNS, Renderer, detect_kind
from fitplan.data.readers import Located, line_ranges
from fitplan.data.source import Source
from fitplan.data.tokenizer import ModelTokenizer, load
from fitplan.errors import FitplanError

BATCH_EXAMPLES = 1000
RANGE_BYTES = 16 << 20
"""Bytes of a JSON Lines file per worker task."""
PARALLEL_BYTES = 32 << 20
"""JSON Lines files from this size on are read by worker processes (when ``jobs`` > 1)."""


@attrs.define
class Tally:
    """What a pass counted: examples by token length, and for prompt-completion data by prompt length."""

    lengths: Counter = attrs.Factory(Counter)
    prompts: Counter = attrs.Factory(Counter)

    def merge(self, other: Tally) -> None:
        self.lengths.update(other.lengths)
        self.prompts.update(other.prompts)


def common_prefix(a: list[int], b: list[int]) -> int:
    """TRL's ``common_prefix_length``: leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tokenize(renderer: Renderer, batch: list[Located], tally: Tally) -> None:
    """Render and tokenize one batch of records into ``tally``."""
    fulls, prompts = [], []
    for _, where, record in batch:
        full, prompt = renderer.strings(record, where)
        fulls.append(full)
        prompts.append(prompt)
    tok, special = renderer.tokenizer, renderer.special_tokens
    if prompts and prompts[0] is None:
        tally.lengths.update(tok.counts(fulls, special))
        return
    for full, prompt in zip(tok.ids(fulls, special), tok.ids(prompts, special)):
        tally.lengths[len(full)] += 1
        tally.prompts[common_prefix(full, prompt)] += 1


def tokenize_all(renderer: Renderer, records: Iterable[Located], tally: Tally, advance=None) -> None:
    batch: list[Located] = []
    for located in records:
        batch.append(located)
        if len(batch) >= BATCH_EXAMPLES:
            tokenize(renderer, batch, tally)
            if advance:
                advance(len(batch))
            batch = []
    if batch:
        tokenize(renderer, batch, tally)
        if advance:
            advance(len(batch))


def columns(text_field: str) -> list[str]:
    return [text_field, *COLUMNS]


def first_record(source: Source, text_field: str) -> Located:
    for file in source.files:
        for located in source.file_records(file, columns=columns(text_field)):
            return located
    raise FitplanError("the dataset has no records", file=str(source.path), field="--dataset")


# --------------------------------------------------------------------------- progress


@contextmanager
def progress(total: int | None, unit: str, label: str):
    """A rich progress bar on stderr when it is a terminal (``total`` None: a count of ``unit``); yields
    ``advance(n)``."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from fitplan.output.console import console

    shown = ([BarColumn(), TextColumn("{task.percentage:>3.0f}% of the " + unit), TimeRemainingColumn()] if total
             else [MofNCompleteColumn(), TextColumn(unit)])
    with Progress(TextColumn("{task.description}"), *shown, console=console(err=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


# --------------------------------------------------------------------------- worker processes

_WORKER: dict[str, Any] = {}


def _init(name: str, files: dict[str, str | None], template_path: str | None, kind: str, text_field: str) -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok = load(name, {k: (Path(v) if v else None) for k, v in files.items()}, template_path)
    _WORKER["renderer"] = Renderer(kind, text_field, tok, "")


def _scan_range(task: tuple[str, int, int]) -> tuple[Tally | None, dict | None]:
    file, start, end = task
    from fitplan.data.readers import jsonl_records

    tally = Tally()
    renderer = attrs.evolve(_WORKER["renderer"], file=file)
    try:
        tokenize_all(renderer, jsonl_records(Path(file), start, end), tally)
    except FitplanError as e:
        return None, {"message": e.message, "file": e.file, "field": e.field, "value": e.value, "suggestion": e.suggestion}
    return tally, None


def _parallel(source: Source, renderer: Renderer, jobs: int, tally: Tally) -> None:
    import multiprocessing

    tasks = []
    for file in source.files:
        size = file.stat().st_size
        tasks += [(str(file), a, b) for a, b in line_ranges(file, size, max(1, -(-size // RANGE_BYTES)))]
    tok = renderer.tokenizer
    init = (tok.name, {k: (str(v) if v else None) for k, v in tok.files.items()}, tok.chat_template_path,
            renderer.kind, renderer.text_field)
    ctx = multiprocessing.get_context("spawn")
    with progress(source.size, "bytes", "tokenizing") as advance, ctx.Pool(jobs, _init, init) as pool:
        for (_, a, b), (part, error) in zip(tasks, pool.imap(_scan_range, tasks)):
            if error is not None:
                pool.terminate()
                raise FitplanError(**error)
            tally.merge(part)
            advance(b - a)


def scan(source: Source, tokenizer: ModelTokenizer, text_field: str, *, select: Any = None,
         offsets: list[int] | None = None, jobs: int = 1) -> tuple[str, Tally]:
    """Read ``source`` (or the ``select``-ed records, ``offsets``: each file's first record index) and count
    the token lengths: ``(kind, tally)``. ``jobs`` > 1: worker processes for a large JSON Lines file."""
    first = first_record(source, text_field)[2]
    renderer = Renderer(detect_kind(first), text_field, tokenizer, str(source.files[0]))
    tally = Tally()
    if jobs > 1 and select is None and tokenizer.files and source.format == "jsonl" and source.size >= PARALLEL_BYTES:
        _parallel(source, renderer, jobs, tally)
        return renderer.kind, tally
    total = len(select) if select is not None else None
    with progress(total, "examples", "tokenizing") as advance:
        for i, file in enumerate(source.files):
            per_file = attrs.evolve(renderer, file=str(file))
            found = source.file_records(file, select, offsets[i] if offsets else 0, columns(text_field))
            tokenize_all(per_file, found, tally, advance)
    return renderer.kind, tally
