"""Records of Parquet and Arrow files, a record batch at a time (pyarrow), and the layout ``datasets`` writes
with ``save_to_disk``: ``state.json`` listing Arrow stream files (``_data_files``), and for a ``DatasetDict``
a ``dataset_dict.json`` naming one such directory per split. ``datasets`` itself is never imported."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fitplan.data.extra import need
from fitplan.data.readers import Located, bad_field, not_utf8
from fitplan.errors import FitplanError

BATCH_ROWS = 1024


def _arrow_reader(file: Path):
    pa = need("pyarrow")
    source = pa.memory_map(str(file))
    try:
        return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        try:
            return pa.ipc.open_file(source)
        except pa.ArrowInvalid as e:
            raise FitplanError(f"not an Arrow IPC file: {e}", file=str(file), field="--dataset") from None


def _batches(file: Path, fmt: str, columns: list[str] | None) -> Iterator[Any]:
    pa = need("pyarrow")
    try:
        if fmt == "parquet":
            pq = need("pyarrow.parquet")
            pf = pq.ParquetFile(str(file))
            names = pf.schema_arrow.names
            cols = [c for c in columns if c in names] if columns else None
            yield from pf.iter_batches(batch_size=BATCH_ROWS, columns=cols or None)
            return
        reader = _arrow_reader(file)
        names = reader.schema.names
        keep = [c for c in columns if c in names] if columns else None
        batches = reader if hasattr(reader, "__iter__") else (reader.get_batch(i) for i in range(reader.num_record_batches))
        for batch in batches:
            yield batch.select(keep) if keep else batch
    except (pa.ArrowInvalid, OSError) as e:
        raise FitplanError(f"cannot read the {fmt} file: {e}", file=str(file), field="--dataset") from None


def _rows(batch: Any, file: Path, first_row: int) -> list[dict]:
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        for name in batch.schema.names:
            column = batch.column(name)
            for i in range(len(column)):
                try:
                    column[i].as_py()
                except UnicodeDecodeError:
                    raise not_utf8(file, f"row {first_row + i + 1}", name) from None
        raise


def table_records(file: Path, fmt: str, select: Any = None, first_index: int = 0,
                  columns: list[str] | None = None) -> Iterator[Located]:
    """The rows of a Parquet or Arrow file as dicts (only ``columns`` when given and present)."""
    row = 0
    for batch in _batches(file, fmt, columns):
        n = batch.num_rows
        if select is not None:
            wanted = [i for i in range(n) if first_index + row + i in select]
            if not wanted:
                row += n
                continue
            rows = _rows(batch.take(wanted), file, row)
            picked = zip(wanted, rows)
        else:
            picked = enumerate(_rows(batch, file, row))
        for i, record in picked:
            found = bad_field(record)
            if found:
                raise not_utf8(file, f"row {row + i + 1}", found)
            yield first_index + row + i, f"row {row + i + 1}", record
        row += n


def table_count(file: Path, fmt: str) -> int:
    if fmt == "parquet":
        return need("pyarrow.parquet").ParquetFile(str(file)).metadata.num_rows
    return sum(b.num_rows for b in _batches(file, fmt, None))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise FitplanError(f"cannot read the saved dataset's description: {e}", file=str(path), field="--dataset") from None


def saved_dataset(directory: Path, split: str | None) -> tuple[str, tuple[Path, ...], str | None] | None:
    """``(format, files, split)`` of a directory written by ``datasets``' ``save_to_disk``, or None when it is
    not one."""
    dict_file = directory / "dataset_dict.json"
    if dict_file.is_file():
        splits = [str(s) for s in _read_json(dict_file).get("splits", [])]
        chosen = split or ("train" if "train" in splits else splits[0] if len(splits) == 1 else None)
        if chosen not in splits:
            raise FitplanError(f"the saved DatasetDict has no split {chosen!r}" if chosen else
                               "the saved DatasetDict has several splits", file=str(directory), field="--split",
                               value=chosen, suggestion="splits: " + ", ".join(splits))
        inner = saved_dataset(directory / chosen, None)
        if inner is None:
            raise FitplanError(f"split {chosen!r} has no state.json", file=str(directory / chosen), field="--split")
        return inner[0], inner[1], chosen
    state_file = directory / "state.json"
    if not state_file.is_file():
        return None
    files = [directory / f["filename"] for f in _read_json(state_file).get("_data_files", [])]
    missing = [f.name for f in files if not f.is_file()]
    if not files or missing:
        raise FitplanError("the saved dataset's state.json lists no data files" if not files else
                           f"data files listed in state.json are missing: {', '.join(missing)}",
                           file=str(state_file), field="--dataset")
    return "arrow", tuple(files), split
