"""A dataset's summary (its examples' token lengths, no text) as a TOML file, and the cache of summaries.

``fitplan dataset --out summary.toml`` writes one, ``--dataset summary.toml`` reads it back, so a team can share
what it needs to plan without sharing the data. The same file, named by a key that hashes the data files'
content, the tokenizer files' content and the reading options, is the cache that spares a second run the
tokenization: ``$FITPLAN_CACHE_DIR`` (default ``$XDG_CACHE_HOME/fitplan`` or ``~/.cache/fitplan``), under
``datasets/``. The cache is only an optimisation: an entry is read only if it is a regular file, parses, passes
:func:`check` and carries its own key; anything else is ignored and written again, atomically (a temporary
file renamed over it).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

import attrs
import tomli_w

from fitplan.data.lengths import Lengths
from fitplan.errors import FitplanError

FORMAT = "fitplan-dataset-summary"
VERSION = 1
"""Bump when what a summary means changes (the tokenization rules): old cache entries then miss."""
MAX_BYTES = 256 << 20


@attrs.frozen(eq=False)
class DatasetSummary:
    """What was read: ``examples`` records in the dataset, of which ``lengths.examples`` were tokenized (all of
    them, or a random sample drawn with ``seed``); ``prompts``: prompt lengths of prompt-completion data."""

    kind: str
    text_field: str
    examples: int
    lengths: Lengths
    prompts: Lengths | None
    seed: int
    source: dict[str, Any]
    tokenizer: dict[str, Any]
    key: str = ""
    memo: dict = attrs.field(factory=dict, repr=False)
    """Figures computed from this summary (:mod:`fitplan.data.figures`), by their arguments."""

    @property
    def read(self) -> int:
        return self.lengths.examples

    @property
    def sampled(self) -> bool:
        return self.read < self.examples

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "version": VERSION, "key": self.key, "kind": self.kind,
                               "text_field": self.text_field, "examples": self.examples, "read": self.read,
                               "seed": self.seed, "source": _no_none(self.source),
                               "tokenizer": _no_none(self.tokenizer), "lengths": self.lengths.to_dict()}
        if self.prompts is not None:
            out["prompt_lengths"] = self.prompts.to_dict()
        return out

    def to_toml(self) -> str:
        """The summary as TOML, each histogram's arrays on one line."""
        data = self.to_dict()
        tables = {k: data.pop(k) for k in ("lengths", "prompt_lengths") if k in data}
        out = ["# fitplan dataset summary: token lengths of a dataset's examples (no text). docs/dataset.md\n",
               tomli_w.dumps(data)]
        for name, table in tables.items():
            out.append(f"\n[{name}]\n" + "".join(f"{k} = [{', '.join(map(str, v))}]\n" for k, v in table.items()))
        return "".join(out)


def _no_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_no_none(v) if isinstance(v, dict) else v) for k, v in d.items() if v is not None}


def _lengths(data: Any, name: str) -> Lengths:
    if not isinstance(data, dict):
        raise ValueError(f"[{name}] must be a table with values and counts")
    values, counts = data.get("values"), data.get("counts")
    if not (isinstance(values, list) and isinstance(counts, list) and len(values) == len(counts)):
        raise ValueError(f"{name}.values and {name}.counts must be lists of the same length")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in values + counts):
        raise ValueError(f"{name}.values and {name}.counts must hold integers")
    if any(b <= a for a, b in zip(values, values[1:])) or (values and values[0] < 0) or any(c < 1 for c in counts):
        raise ValueError(f"{name}.values must increase from 0 or more, and every count be at least 1")
    _bounded(values, counts, name)
    return Lengths.from_counts(dict(zip(values, counts)))


def _bounded(values: list[int], counts: list[int], name: str) -> None:
    """The scenario's bounds (``inputs/scenario.py`` ``LIMITS``), so that a summary file cannot carry what a flag
    cannot: an example of at most ``tokens_per_example`` tokens, at most ``num_examples`` examples and
    ``total_tokens`` tokens in all."""
    from fitplan.inputs.field_checks import LIMITS

    if values and values[-1] > LIMITS["tokens_per_example"]:
        raise ValueError(f"{name}.values: an example of {values[-1]:,} tokens, at most {LIMITS['tokens_per_example']:,g}")
    if sum(counts) > LIMITS["num_examples"]:
        raise ValueError(f"{name}.counts: {sum(counts):,} examples, at most {LIMITS['num_examples']:,g}")
    total = sum(v * c for v, c in zip(values, counts))
    if total > LIMITS["total_tokens"]:
        raise ValueError(f"{name}: {total:,} tokens in all, at most {LIMITS['total_tokens']:,g}")


def check(data: dict[str, Any]) -> DatasetSummary:
    """The summary in ``data`` (a parsed TOML file). :raises ValueError: naming what is wrong."""
    from fitplan.data.examples import KINDS

    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"not a fitplan dataset summary of version {VERSION} (format = {FORMAT!r})")
    kind, examples, read, seed = data.get("kind"), data.get("examples"), data.get("read"), data.get("seed", 0)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    lengths = _lengths(data.get("lengths"), "lengths")
    prompts = _lengths(data["prompt_lengths"], "prompt_lengths") if "prompt_lengths" in data else None
    if not isinstance(examples, int) or not isinstance(read, int) or read != lengths.examples or examples < read or read < 1:
        raise ValueError(f"read ({read!r}) must equal the lengths' counts ({lengths.examples}), and examples "
                         f"({examples!r}) be at least that")
    if prompts is not None and prompts.examples != read:
        raise ValueError(f"prompt_lengths counts {prompts.examples} examples, not {read}")
    from fitplan.inputs.field_checks import LIMITS

    if examples > LIMITS["num_examples"]:
        raise ValueError(f"examples ({examples:,}) must be at most {LIMITS['num_examples']:,g}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer from 0 to 2^63 - 1, got {seed!r}")
    for table in ("source", "tokenizer"):
        if not isinstance(data.get(table, {}), dict):
            raise ValueError(f"[{table}] must be a table")
    return DatasetSummary(kind, str(data.get("text_field", "text")), examples, lengths, prompts, seed,
                          dict(data.get("source") or {}), dict(data.get("tokenizer") or {}), str(data.get("key", "")))


def read_summary(path: str | Path) -> DatasetSummary:
    """A summary file the user names (``--dataset summary.toml``). :raises FitplanError: naming the file."""
    from fitplan.inputs.files import read_toml

    data = read_toml(path, field="--dataset")
    try:
        return check(data)
    except (ValueError, TypeError) as e:
        raise FitplanError(f"not a valid dataset summary: {e}", file=str(path), field="--dataset",
                           suggestion="write one with `fitplan dataset DATA --out summary.toml`") from None


# --------------------------------------------------------------------------- content hashes and the cache


def file_sha256(paths: list[Path]) -> str:
    """sha256 of one file's content, or of each file's name and hash for several."""
    digests = []
    for p in paths:
        with open(p, "rb") as f:
            digests.append(hashlib.file_digest(f, "sha256").hexdigest())
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256("".join(f"{p.name}\0{d}\n" for p, d in zip(paths, digests)).encode()).hexdigest()


def cache_key(*parts: Any) -> str:
    return hashlib.sha256(repr((FORMAT, VERSION, *parts)).encode("utf-8")).hexdigest()


def cache_dir() -> Path:
    """``datasets/`` in fitplan's cache directory (``fitplan/diskcache.py``: ``$FITPLAN_CACHE_DIR``, else the
    platform's user cache)."""
    from fitplan.diskcache import root

    return root() / "datasets"


def _read_regular(path: Path) -> str | None:
    """The text of ``path`` if it is a regular file (not a link, FIFO or device) of reasonable size."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return None
        try:
            return f.read().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None


def cached(key: str) -> DatasetSummary | None:
    """The cache entry for ``key`` if it is sound (in a folder of this user no one else can write:
    :func:`fitplan.diskcache.trusted`), else None."""
    from fitplan.diskcache import trusted

    if not trusted(cache_dir()):
        return None
    text = _read_regular(cache_dir() / f"{key}.toml")
    if text is None:
        return None
    try:
        summary = check(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, ValueError, TypeError, RecursionError):
        return None
    return summary if summary.key == key else None


def store(summary: DatasetSummary) -> Path | None:
    """Write ``summary`` to the cache (atomically); None when the cache cannot be written (it is optional)."""
    from fitplan.files import write_text

    directory = cache_dir()
    entry = directory / f"{summary.key}.toml"
    from fitplan.diskcache import make_private, trusted

    if not trusted(directory):
        return None
    try:
        make_private(directory)
        if entry.is_symlink() or entry.exists() and not entry.is_file():
            entry.unlink()  # a link, FIFO or device where the entry belongs: replaced
        return write_text(entry, summary.to_toml())
    except (OSError, FitplanError):
        return None
