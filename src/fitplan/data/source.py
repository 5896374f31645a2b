"""What ``--dataset PATH`` names, and which reader reads it.

A JSON Lines, JSON (an array of objects), CSV/TSV, Parquet or Arrow file; a directory of such files (shards,
read in name order); or a directory a ``datasets`` dataset was saved to (``save_to_disk``: ``state.json`` and
its Arrow files; a ``DatasetDict`` with ``dataset_dict.json`` and one directory per split).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from fitplan.data import columnar, readers
from fitplan.data.readers import Located
from fitplan.errors import FitplanError

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "csv",
           ".parquet": "parquet", ".arrow": "arrow"}
"""File suffix -> format."""



@attrs.frozen
class Source:
    """What ``--dataset`` names: ``files`` of one ``format`` (``split``: the split of a saved ``DatasetDict``)."""

    path: Path
    format: str
    files: tuple[Path, ...]
    split: str | None = None

    @property
    def size(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def file_records(self, file: Path, select: Any = None, first_index: int = 0,
                     columns: list[str] | None = None) -> Iterator[Located]:
        """The records of ``file`` (one of :attr:`files`), numbered from ``first_index``; ``select``: only these
        indices; ``columns``: the fields wanted (Parquet and Arrow read only those)."""
        if self.format == "jsonl":
            return readers.jsonl_records(file, select=select, first_index=first_index)
        if self.format == "json":
            return _offset(readers.json_records(file, select=_shift(select, first_index)), first_index)
        if self.format == "csv":
            return _offset(readers.csv_records(file, _shift(select, first_index)), first_index)
        return columnar.table_records(file, self.format, select=select, first_index=first_index, columns=columns)

    def file_count(self, file: Path) -> int:
        if self.format == "jsonl":
            return readers.jsonl_count(file)
        if self.format == "json":
            return readers.json_count(file)
        if self.format == "csv":
            return readers.csv_count(file)
        return columnar.table_count(file, self.format)


def _shift(select: Any, by: int) -> Any:
    return select if select is None or not by else {i - by for i in select}


def _offset(records: Iterator[Located], by: int) -> Iterator[Located]:
    for index, where, record in records:
        yield index + by, where, record


def file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    fmt = FORMATS.get(suffix)
    if fmt is None:
        raise FitplanError(f"cannot read a {suffix or 'suffix-less'} file as a dataset", file=str(path),
                           field="--dataset", suggestion="JSON Lines (.jsonl), JSON (.json), CSV (.csv/.tsv), Parquet "
                           "(.parquet), Arrow (.arrow), a saved `datasets` directory, or a summary (.toml)")
    if fmt == "json" and not readers.is_json_array(path):
        return "jsonl"
    return fmt


def open_source(path: str | Path, split: str | None = None) -> Source:
    """The :class:`Source` at ``path``. :raises FitplanError: missing, unreadable kind, unknown split."""
    p = Path(path)
    if p.is_dir():
        saved = columnar.saved_dataset(p, split)
        if saved is not None:
            fmt, files, chosen = saved
            return Source(p, fmt, files, chosen)
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in FORMATS)
        if not files:
            raise FitplanError("no dataset files in the directory", file=str(p), field="--dataset",
                               suggestion="suffixes: " + ", ".join(FORMATS))
        formats = {file_format(f) for f in files}
        if len(formats) > 1:
            raise FitplanError(f"the directory mixes formats ({', '.join(sorted(formats))})", file=str(p),
                               field="--dataset", suggestion="point --dataset at one file")
        return Source(p, formats.pop(), tuple(files), split)
    if not p.exists():
        raise FitplanError("dataset not found", file=str(p), field="--dataset")
    if not p.is_file():
        raise FitplanError("not a regular file (a FIFO or a device cannot be read twice)", file=str(p), field="--dataset")
    return Source(p, file_format(p), (p,), split)
