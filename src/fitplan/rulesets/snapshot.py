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
  and validation run (``fitplan/rulesets``, ``fitplan/inputs``, ``fitplan/errors.py``, the learned
  architecture reader) and of every learned architecture file (bundled and user-learned: validating a
  ``[[model]]`` reads its model type's file): changed code or data never reads an old snapshot. Plugins take no part in parsing a file, so they are not in the key (their ruleset
  directories are files like any other).

A snapshot that cannot be read, does not unpickle, or holds another key is ignored and written again; one
that cannot be written (a read-only or full disk) is skipped: the cache only ever saves time. Writes go to
a temporary file renamed into place (atomic). ``FITPLAN_NO_CACHE=1`` turns snapshots off. Files with
problems are never kept, so their errors are always found afresh. Only parsed input files are cached, never
an estimate.
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

FORMAT = 1
"""Bumped when the snapshot layout changes."""


def cache_dir() -> Path | None:
    """Where snapshots live, or None when ``FITPLAN_NO_CACHE`` is set."""
    if os.environ.get("FITPLAN_NO_CACHE", "") not in ("", "0"):
        return None
    if os.environ.get("FITPLAN_CACHE_DIR"):
        return Path(os.environ["FITPLAN_CACHE_DIR"]) / "rulesets"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        base = Path(os.environ["LOCALAPPDATA"])
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fitplan" / "rulesets"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """fitplan's version, Python's and the (size, mtime) of the modules that parse and validate a file."""
    from fitplan import __version__

    from fitplan.builtin.archfile import BUNDLED, user_dirs

    package = Path(__file__).resolve().parent.parent
    parts = [__version__, sys.version]
    # validating a [[model]] or a published run reads the model type's learned architecture file
    archs = [p for d in (*user_dirs(), BUNDLED) if d.is_dir() for p in d.glob("*.json")]
    for p in sorted([*package.joinpath("rulesets").glob("*.py"), *package.joinpath("inputs").glob("*.py"),
                     package / "errors.py", package / "builtin" / "archfile.py", package / "builtin" / "archexpr.py"]
                    ) + sorted(archs):
        st = p.stat()
        parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def _key(path: Path, data: bytes) -> tuple[int, str, bytes, str]:
    return FORMAT, str(path), data, code_fingerprint()


def _location(path: Path) -> Path | None:
    """One snapshot per path: ``<name>-<crc32 of the path>.pickle`` (a clash only costs a re-parse: the
    snapshot holds its path)."""
    import zlib

    d = cache_dir()
    return None if d is None else d / f"{path.stem[:40]}-{zlib.crc32(str(path).encode()):08x}.pickle"


def load(path: Path, data: bytes) -> Any | None:
    """The parsed file stored for ``path`` with exactly these bytes, or None (no cache, missing, stale,
    corrupt)."""
    where = _location(path)
    if where is None:
        return None
    try:
        stored = pickle.loads(where.read_bytes())
    except Exception:  # noqa: BLE001 - missing, unreadable or corrupt: parse the file instead
        return None
    if not (isinstance(stored, tuple) and len(stored) == 2 and stored[0] == _key(path, data)):
        return None
    return stored[1]


def store(path: Path, data: bytes, parsed: Any) -> None:
    """Keep ``parsed`` (a file parsed from ``data`` without problems) for the next run; never fails."""
    where = _location(path)
    if where is None:
        return
    tmp = None
    try:
        blob = pickle.dumps((_key(path, data), parsed), protocol=pickle.HIGHEST_PROTOCOL)
        where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=where.parent, prefix=".tmp-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, where)
        tmp = None
    except Exception:  # noqa: BLE001 - a read-only or full cache directory, an unpicklable entry: no snapshot
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
