"""Records of text dataset files (JSON Lines, JSON arrays, CSV/TSV), streamed one at a time with where each
comes from (``line 12``, ``row 5 (line 7)``).

Files are read line by line (or, for a JSON array, a block at a time) from a binary stream, so memory stays
bounded whatever the file's size: a line or an element over :data:`MAX_LINE` is an error. A UTF-8 byte-order
mark at the start of a file is dropped (spreadsheets write one before a CSV's header). Bytes that are not UTF-8 are reported with the file, the line and the field
that holds them. Parquet and Arrow are in :mod:`fitplan.data.columnar`; :mod:`fitplan.data.source` says which
reader a path needs.
"""

from __future__ import annotations

import codecs
import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fitplan.errors import FitplanError

CHUNK = 1 << 20
MAX_LINE = 64 << 20
"""The longest line (JSON Lines, CSV) or JSON array element read (64 MiB): memory stays bounded by it whatever
the file holds (a file of one endless line is an error naming the line, not a read to its end)."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
Located = tuple[int, str, dict]
"""A record with its index in the source (0-based) and where it is (``line 12``, ``row 5``)."""


def bad_field(value: Any, path: str = "") -> str | None:
    """The path (``messages[1].content``) of the first string in ``value`` that holds undecodable bytes."""
    if isinstance(value, str):
        return (path or "$") if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            found = bad_field(v, f"{path}.{k}" if path else str(k))
            if found:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = bad_field(v, f"{path}[{i}]")
            if found:
                return found
    return None


def not_utf8(file: str | Path, where: str, field: str | None, raw: bytes | None = None) -> FitplanError:
    detail = ""
    if raw is not None:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            detail = f": byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line"
    return FitplanError(f"{where}: not UTF-8{detail}", file=str(file), field=field,
                        suggestion="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def _why(e: BaseException) -> str:
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)


# --------------------------------------------------------------------------- lines


def lines(f, file: Path, first: int = 1) -> Iterator[bytes]:
    """The lines of the binary stream ``f`` (``first``: the number of its first line), each at most
    :data:`MAX_LINE` bytes, without the UTF-8 byte-order mark of a file's start.
    :raises FitplanError: a longer line, naming it."""
    at_start = f.tell() == 0
    lineno = first
    while True:
        raw = f.readline(MAX_LINE + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE:
            raise FitplanError(f"line {lineno} is longer than {MAX_LINE:,} bytes", file=str(file),
                               suggestion="one record per line; split the file's records onto lines")
        if at_start:
            raw, at_start = raw.removeprefix(codecs.BOM_UTF8), False
        yield raw
        lineno += 1


# --------------------------------------------------------------------------- JSON Lines


def _json_object(text: str, file: Path, where: str, raw: bytes) -> dict:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise FitplanError(f"{where}: malformed JSON: {e.msg} (column {e.colno})", file=str(file),
                           suggestion="each line must be one JSON object") from None
    except (ValueError, RecursionError) as e:  # an integer of more than 4,300 digits, nesting beyond the stack
        raise FitplanError(f"{where}: malformed JSON: {_why(e)}", file=str(file),
                           suggestion="each line must be one JSON object") from None
    if not isinstance(record, dict):
        raise FitplanError(f"{where}: expected a JSON object, got {type(record).__name__}", file=str(file),
                           suggestion="each line must be one JSON object: {\"text\": ...}")
    return record


def lone_surrogate(file: Path, where: str, record: Any) -> FitplanError:
    return FitplanError(f"{where}: a lone surrogate escape (\\ud800-\\udfff without its pair): not Unicode text",
                        file=str(file), field=bad_field(record), suggestion="write the character itself")


def _decode_line(raw: bytes, file: Path, where: str) -> dict:
    try:
        record = _json_object(raw.decode("utf-8"), file, where, raw)
        if _ESCAPED_SURROGATE.search(raw) and bad_field(record):
            raise lone_surrogate(file, where, record)
        return record
    except UnicodeDecodeError:
        record = _json_object(raw.decode("utf-8", "surrogateescape"), file, where, raw)
        raise not_utf8(file, where, bad_field(record), raw) from None


def line_number(file: Path, offset: int) -> int:
    """The 1-based number of the line starting at byte ``offset``."""
    n = 1
    with open(file, "rb") as f:
        left = offset
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                break
            n += block.count(b"\n")
            left -= len(block)
    return n


def jsonl_records(file: Path, start: int = 0, end: int | None = None, select: Any = None,
                  first_index: int = 0) -> Iterator[Located]:
    """The JSON objects of lines starting in bytes ``[start, end)`` (blank lines skipped); ``select``: the
    record indices to parse (the others are skipped unparsed)."""
    base = line_number(file, start) if start else 1
    index = first_index
    with open(file, "rb") as f:
        f.seek(start)
        pos = start
        for lineno, raw in enumerate(lines(f, file, base), base):
            if end is not None and pos >= end:
                break
            pos += len(raw)
            if not raw.strip():
                continue
            if select is None or index in select:
                yield index, f"line {lineno}", _decode_line(raw, file, f"line {lineno}")
            index += 1


def jsonl_count(file: Path) -> int:
    with open(file, "rb") as f:
        return sum(1 for raw in lines(f, file) if raw.strip())


def line_ranges(file: Path, size: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` byte ranges of ``file`` cut at line starts."""
    cuts = [0]
    with open(file, "rb") as f:
        for i in range(1, parts):
            f.seek(max(cuts[-1], size * i // parts))
            while (part := f.readline(CHUNK)) and not part.endswith(b"\n"):
                pass  # to the next line start, a block at a time
            pos = f.tell()
            if pos >= size:
                break
            if pos > cuts[-1]:
                cuts.append(pos)
    cuts.append(size)
    return list(zip(cuts[:-1], cuts[1:]))


# --------------------------------------------------------------------------- JSON (one array)


class _JsonArray:
    """The elements of a top-level JSON array, decoded incrementally: the buffer holds one element and a
    block at a time (an element over :data:`MAX_LINE` characters, or a malformed one, is an error)."""

    _SPACE = re.compile(r"\s*")

    def __init__(self, file: Path) -> None:
        self.file, self.buf, self.pos, self.line, self.eof = file, "", 0, 1, False
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")("surrogateescape")
        self.raw = json.JSONDecoder()

    def _fill(self, f) -> bool:
        """Read one more block; False at the end of the file."""
        if self.eof:
            return False
        block = f.read(CHUNK)
        self.eof = not block
        self.line += self.buf.count("\n", 0, self.pos)
        self.buf = self.buf[self.pos:] + self.decoder.decode(block, final=self.eof)
        self.pos = 0
        return True

    def _peek(self, f) -> str:
        """The next character that is not white space ("" at the end of the file)."""
        while True:
            self.pos = self._SPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill(f):
                return ""

    def _where(self) -> str:
        return f"line {self.line + self.buf.count(chr(10), 0, self.pos)}"

    def _error(self, text: str) -> FitplanError:
        return FitplanError(f"{self._where()}: malformed JSON: {text}", file=str(self.file),
                            suggestion="a .json dataset is one array of objects (or JSON Lines)")

    def _element(self, f) -> tuple[Any, str]:
        while True:
            try:
                value, end = self.raw.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if len(self.buf) - self.pos < MAX_LINE and self._fill(f):
                    continue
                raise self._error(e.msg) from None
            except (ValueError, RecursionError) as e:
                raise self._error(_why(e)) from None
            text = self.buf[self.pos:end]
            self.pos = end
            return value, text

    def __call__(self, select: Any = None) -> Iterator[Located]:
        with open(self.file, "rb") as f:
            if self._peek(f) != "[":
                raise self._error("expected '[' (an array of objects) at the start")
            self.pos += 1
            if self._peek(f) == "]":
                return
            index = 0
            while True:
                where = f"{self._where()} (element {index + 1})"
                value, text = self._element(f)
                if not isinstance(value, dict):
                    raise FitplanError(f"{where}: expected a JSON object, got {type(value).__name__}",
                                       file=str(self.file))
                if _SURROGATE.search(text):
                    raise not_utf8(self.file, where, bad_field(value))
                if _ESCAPED_SURROGATE.search(text.encode("utf-8")) and bad_field(value):
                    raise lone_surrogate(self.file, where, value)
                if select is None or index in select:
                    yield index, where, value
                index += 1
                sep = self._peek(f)
                self.pos += 1
                if sep == "]":
                    return
                if sep != ",":
                    raise self._error(f"expected ',' or ']' after element {index}, got {sep or 'the end of the file'!r}")
                self._peek(f)


def json_records(file: Path, select: Any = None) -> Iterator[Located]:
    return _JsonArray(file)(select)


def json_count(file: Path) -> int:
    return sum(1 for _ in json_records(file))


def is_json_array(file: Path) -> bool:
    with open(file, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


# --------------------------------------------------------------------------- CSV


def _csv_lines(f, file: Path, state: list[int]) -> Iterator[str]:
    for raw in lines(f, file):
        state[0] += 1
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            state[1] = state[0] if not state[1] else state[1]
            yield raw.decode("utf-8", "surrogateescape")


def csv_records(file: Path, select: Any = None) -> Iterator[Located]:
    """Rows of a CSV (``.tsv``: tab-separated) file with a header row, as ``{column: text}``."""
    state = [0, 0]  # physical lines read, first undecodable line
    with open(file, "rb") as f:
        reader = csv.reader(_csv_lines(f, file, state), delimiter="\t" if file.suffix == ".tsv" else ",")
        try:
            header = next(reader, None)
            if header is None:
                return
            for index, row in enumerate(reader):
                where = f"row {index + 1} (line {reader.line_num})"
                if len(row) != len(header):
                    raise FitplanError(f"{where}: {len(row)} values for {len(header)} columns", file=str(file),
                                       suggestion="quote values that hold the delimiter or a newline")
                record = dict(zip(header, row))
                if state[1]:
                    raise not_utf8(file, where, bad_field(record))
                if select is None or index in select:
                    yield index, where, record
        except csv.Error as e:
            raise FitplanError(f"line {reader.line_num}: malformed CSV: {e}", file=str(file)) from None


def csv_count(file: Path) -> int:
    return sum(1 for _ in csv_records(file))
