"""The one input boundary: every file fitplan reads comes through here.

A file must be a regular file (not a directory, a FIFO or a device: reading those would hang or never end)
under a size limit, and decode as UTF-8 (a UTF-8 byte-order mark is dropped; UTF-16 and UTF-32, recognised by
their byte-order marks, are decoded too; anything else is an error naming the byte offset, line and column).
JSON, TOML and YAML are parsed with their nesting and number sizes bounded, and non-finite numbers (NaN, infinity:
JSON's ``NaN``/``Infinity`` extensions, TOML's ``nan``/``inf``) are refused: every error is a
:class:`~fitplan.errors.FitplanError` naming the file and, where the parser says, the line.

One exception: a model's ``config.json`` is read as transformers reads it (``special_floats=True``):
``PreTrainedConfig._dict_from_json_file`` parses it with a plain ``json.loads``, which accepts ``NaN``,
``Infinity`` and ``-Infinity``, then decodes the ``{"__float__": "Infinity"}`` objects its own writer uses for them
(``_decode_special_floats``, transformers/configuration_utils.py, 5.24). The config classes of Mamba-2, Bamba,
Falcon-H1, NemotronH and GraniteMoeHybrid default ``time_step_limit`` to ``(0.0, inf)``.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

from fitplan.errors import FitplanError

MAX_BYTES = 64 * 2**20
"""The largest file read whole (64 MiB): configs, rulesets, scenario and policy files are kilobytes."""
MAX_DEPTH = 64
"""Nesting deeper than this in a JSON or TOML document is refused (real configs nest a few levels)."""
MAX_INT_DIGITS = 100
"""Integer literals longer than this are refused (Python refuses to parse beyond 4,300 digits anyway)."""

_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def read_bytes(path: str | Path, *, field: str | None = None, limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    :raises FitplanError: missing, not a regular file, unreadable or too large, naming the file.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FitplanError("file not found", file=str(p), field=field) from None
    except OSError as e:
        raise FitplanError(f"cannot read: {e.strerror or e}", file=str(p), field=field) from None
    if stat.S_ISDIR(st.st_mode):
        raise FitplanError("is a directory, not a file", file=str(p), field=field)
    if not stat.S_ISREG(st.st_mode):
        raise FitplanError("is not a regular file (a FIFO, a socket or a device)", file=str(p), field=field,
                           suggestion="pass a file on disk")
    if st.st_size > limit:
        raise FitplanError(f"is {st.st_size:,} bytes, more than the {limit:,} fitplan reads", file=str(p), field=field)
    try:
        with open(p, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise FitplanError(f"cannot read: {e.strerror or e}", file=str(p), field=field) from None
    if len(data) > limit:
        raise FitplanError(f"is more than the {limit:,} bytes fitplan reads", file=str(p), field=field)
    return data


def decode(data: bytes, *, file: str | None = None, field: str | None = None) -> str:
    """UTF-8 text (UTF-16/32 with a byte-order mark accepted). :raises FitplanError: where decoding fails."""
    encoding = "utf-8"
    for bom, name in _BOMS:
        if data.startswith(bom):
            encoding = name
            break
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise FitplanError(f"not valid {encoding.upper()} text: byte {data[e.start:e.start + 1]!r} at offset {e.start} "
                           f"(line {line}, column {column})", file=file, field=field,
                           suggestion="save the file as UTF-8") from None


def read_text(path: str | Path, *, field: str | None = None, limit: int = MAX_BYTES) -> str:
    """A text file, decoded (see the module doc)."""
    return decode(read_bytes(path, field=field, limit=limit), file=str(path), field=field)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
FLOAT_TAG = "__float__"
"""transformers' tag for a non-finite float in a config it wrote (``_FLOAT_TAG_KEY``, configuration_utils.py)."""


def loads_json(text: str, *, file: str | None = None, field: str | None = None, special_floats: bool = False) -> Any:
    """Parse JSON: no NaN or infinity, nesting and integer length bounded. ``special_floats``: a model's
    config.json, read as transformers reads it (module doc): non-finite numbers are floats."""
    constant = _SPECIAL_FLOATS.__getitem__ if special_floats else _reject_constant
    number = _parse_any_float if special_floats else _parse_float
    try:
        data = json.loads(text, parse_constant=constant, parse_int=_parse_int, parse_float=number)
    except json.JSONDecodeError as e:
        raise FitplanError(f"malformed JSON: {e.msg} (line {e.lineno}, column {e.colno})", file=file, field=field) from None
    except (ValueError, RecursionError) as e:
        raise FitplanError(f"malformed JSON: {_why(e)}", file=file, field=field) from None
    check_depth(data, file=file, field=field)
    if _ESCAPED_SURROGATE.search(text):
        check_surrogates(data, file=file)
    return decode_special_floats(data) if special_floats else data


def decode_special_floats(obj: Any) -> Any:
    """``{"__float__": "Infinity"}`` (and ``"NaN"``, ``"-Infinity"``) as the float, everywhere in ``obj``, as
    transformers' ``_decode_special_floats`` does; any other object is kept."""
    if isinstance(obj, dict):
        if set(obj) == {FLOAT_TAG} and obj[FLOAT_TAG] in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[obj[FLOAT_TAG]]
        return {k: decode_special_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_special_floats(v) for v in obj]
    return obj


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def check_surrogates(data: Any, *, file: str | None = None, path: str = "$") -> None:
    """:raises FitplanError: a string or key of ``data`` holds a lone surrogate (JSON's ``"\\ud800"`` escape
    without its pair: no Unicode character, which no output can encode), naming its ``$.path``."""
    if isinstance(data, str):
        if _LONE_SURROGATE.search(data):
            raise FitplanError("a string holds a lone surrogate escape (\\ud800-\\udfff without its pair): not "
                               "Unicode text", file=file, field=path, suggestion="write the character itself")
    elif isinstance(data, dict):
        for k, v in data.items():
            check_surrogates(k, file=file, path=path)
            check_surrogates(v, file=file, path=f"{path}.{k}")
    elif isinstance(data, list):
        for i, v in enumerate(data):
            check_surrogates(v, file=file, path=f"{path}[{i}]")


def read_json(path: str | Path, *, field: str | None = None, special_floats: bool = False) -> Any:
    """A JSON file (see the module doc; ``special_floats``: a model's config.json, as transformers reads it)."""
    return loads_json(read_text(path, field=field), file=str(path), field=field, special_floats=special_floats)


def loads_toml(text: str, *, file: str | None = None, field: str | None = None) -> dict[str, Any]:
    """Parse TOML: no nan or inf, nesting and integer length bounded."""
    _check_int_literals(text, file=file, field=field)
    try:
        data = tomllib.loads(text, parse_float=_parse_float)
    except tomllib.TOMLDecodeError as e:
        raise FitplanError(f"malformed TOML: {e}", file=file, field=field) from None
    except (ValueError, RecursionError) as e:
        raise FitplanError(f"malformed TOML: {_why(e)}", file=file, field=field) from None
    check_depth(data, file=file, field=field)
    _check_ints(data, file=file, field=field)
    return data


def read_toml(path: str | Path, *, field: str | None = None) -> dict[str, Any]:
    """A TOML file (see the module doc)."""
    return loads_toml(read_text(path, field=field), file=str(path), field=field)


def loads_yaml(text: str, *, file: str | None = None, field: str | None = None, value: Any = None,
               aliases: bool = True) -> Any:
    """Parse YAML with ``yaml.safe_load`` (what accelerate, torchtune, axolotl and LLaMA-Factory use); a syntax
    error names its line and column; nesting beyond :data:`MAX_DEPTH` is refused (shared alias nodes are walked
    once). ``aliases=False`` refuses any alias (``*name``), for formats that never use them."""
    import yaml

    try:
        data = yaml.load(text, Loader=yaml.SafeLoader if aliases else _no_alias_loader())  # noqa: S506 - SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise FitplanError(f"not valid YAML{where}: {getattr(e, 'problem', None) or e}", file=file, field=field,
                           value=value) from None
    except (RecursionError, ValueError) as e:
        raise FitplanError(f"not valid YAML: {_why(e)}", file=file, field=field, value=value) from None
    check_depth(data, file=file, field=field)
    return data


def _no_alias_loader() -> type:
    """``yaml.SafeLoader`` without aliases (``*name``): nested aliases expand exponentially (a "billion laughs")."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.events.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(None, None, "an alias (*name): this format has none",
                                                  event.start_mark)
            return super().compose_node(parent, index)

    return NoAliasLoader


def check_depth(data: Any, *, file: str | None = None, field: str | None = None, limit: int = MAX_DEPTH) -> None:
    """:raises FitplanError: ``data`` nests lists and tables deeper than ``limit``."""
    stack = [(data, 1)]
    seen: set[int] = set()  # YAML aliases share a node: walk it once (a "billion laughs" file stays linear)
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        if depth > limit:
            raise FitplanError(f"nested more than {limit} levels deep", file=file, field=field)
        stack.extend((c, depth + 1) for c in children)


def _parse_int(text: str) -> int:
    digits = text.lstrip("+-")
    if len(digits) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits):,} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_INT_DIGITS + 30:
        raise ValueError(f"a number of {len(text):,} characters")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {text}")
    return value


def _parse_any_float(text: str) -> float:
    if len(text) > MAX_INT_DIGITS + 30:
        raise ValueError(f"a number of {len(text):,} characters")
    return float(text)  # 1e999 is inf, as json.loads reads it


def _check_int_literals(text: str, *, file: str | None, field: str | None) -> None:
    """TOML parses integers itself (tomllib has no hook): refuse a run of digits longer than Python allows
    before parsing it, with the line it is on."""
    limit = min(MAX_INT_DIGITS * 40, sys.get_int_max_str_digits() or 4300)
    m = re.search(r"[0-9_]{%d,}" % (limit + 1), text)
    if m is not None:
        line = text.count("\n", 0, m.start()) + 1
        raise FitplanError(f"a number of more than {limit:,} digits on line {line}", file=file, field=field)


def _check_ints(data: Any, *, file: str | None, field: str | None) -> None:
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) >= 10**MAX_INT_DIGITS:
            raise FitplanError(f"an integer of more than {MAX_INT_DIGITS} digits", file=file, field=field)


def _why(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return f"nested too deeply (more than {MAX_DEPTH} levels)"
    return str(e)
