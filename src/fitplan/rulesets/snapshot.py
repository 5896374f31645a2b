"""On-disk snapshots of parsed, validated ruleset files, so that a command does not parse TOML every run.

Parsing and validating the bundled rulesets (TOML, then the schema, then the cross-checks of models and
published runs) is most of what ``fitplan estimate`` spends besides imports. A ruleset file that parsed
without a problem is kept, pickled, in the user's cache directory (``$FITPLAN_CACHE_DIR``, else
``$XDG_CACHE_HOME/fitplan`` or ``~/.cache/fitplan``; ``%LOCALAPPDATA%`` on Windows, ``~/Library/Caches``
on macOS), one snapshot per ruleset path, and used only when all of its key still holds:

* the file's bytes, kept in the snapshot and compared with the file's (read every run: an edited file is
  parsed again, whatever its size and mtime; a plain comparison is exact and needs no hash library);
* the file's path (error messages name it);
* fitplan's version, the Python version and the size and modification time of every module that parsing
  and validation run (``fitplan/rulesets``, with the condition compiler and the template names the schema uses,
  ``fitplan/inputs``, ``fitplan/errors.py``, the learned architecture reader ``fitplan/arch``) and of every learned architecture file (bundled and user-learned: validating a
  ``[[model]]`` reads its model type's file): changed code or data never reads an old snapshot. Plugins take no part in parsing a file, so they are not in the key (their ruleset
  directories are files like any other).

Where snapshots live, how they are written and when one is ignored: ``fitplan/diskcache.py``. Files with
problems are never kept, so their errors are always found afresh.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from fitplan import diskcache

FORMAT = 1
"""Bumped when the snapshot layout changes."""
KIND = "rulesets"


def cache_dir() -> Path | None:
    """Where snapshots live, or None when ``FITPLAN_NO_CACHE`` is set."""
    return diskcache.directory(KIND)


@functools.lru_cache(maxsize=1)
def _modules() -> tuple[Path, ...]:
    """The modules that parse and validate a file."""
    package = Path(__file__).resolve().parent.parent
    return tuple(sorted([*package.joinpath("rulesets").glob("*.py"), *package.joinpath("inputs").glob("*.py"),
                         *package.joinpath("arch").glob("*.py"), package / "errors.py"]))


def _key(path: Path, data: bytes) -> tuple[int, str, bytes, str]:
    from fitplan.arch.archfile import BUNDLED, user_dirs

    return FORMAT, str(path), data, diskcache.code_fingerprint(_modules(), (*user_dirs(), BUNDLED))


def _name(path: Path) -> str:
    """One snapshot per path (a clash only costs a re-parse: the snapshot holds its path)."""
    return diskcache.entry_name(path.stem, str(path).encode())


def load(path: Path, data: bytes) -> Any | None:
    """The parsed file stored for ``path`` with exactly these bytes, or None (no cache, missing, stale,
    corrupt)."""
    return diskcache.load(KIND, _name(path), _key(path, data))


def store(path: Path, data: bytes, parsed: Any) -> None:
    """Keep ``parsed`` (a file parsed from ``data`` without problems) for the next run; never fails."""
    diskcache.store(KIND, _name(path), _key(path, data), parsed)
