"""The user's cache directory, and pickled entries kept there under an exact key.

Two things are kept on disk to save time, never to change an answer (docs/reliability.md "Caches"): snapshots of
parsed ruleset files (``rulesets/snapshot.py``) and step traces replayed from learned architecture files
(``builtin/step_trace.py``). Both go through this module:

* **where:** ``$FITPLAN_CACHE_DIR/<kind>/``, else ``$XDG_CACHE_HOME/fitplan/<kind>/`` (``~/.cache/fitplan``;
  ``%LOCALAPPDATA%`` on Windows, ``~/Library/Caches`` on macOS); ``FITPLAN_NO_CACHE=1`` turns it off;
* **an entry** is ``pickle((key, value))``; :func:`load` gives the value back only when the stored key equals
  the caller's key (so a file-name clash, a stale or a corrupt entry only costs a recomputation);
* **writes** go to a temporary file renamed into place (a crash or a concurrent run never leaves half an
  entry), and never fail: a read-only or full disk just keeps nothing; a kind may cap its number of entries
  (the oldest are removed);
* :func:`code_fingerprint` is the part of a key that changes whenever the code that computed an entry or the
  learned architecture data change (fitplan's and Python's versions, the size and modification time of the
  modules and data files the caller names).
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import zlib
from pathlib import Path
from typing import Any

NO_CACHE_ENV = "FITPLAN_NO_CACHE"


def root() -> Path:
    """The cache directory (whether or not caching is on)."""
    if os.environ.get("FITPLAN_CACHE_DIR"):
        return Path(os.environ["FITPLAN_CACHE_DIR"])
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        base = Path(os.environ["LOCALAPPDATA"])
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fitplan"


def directory(kind: str) -> Path | None:
    """Where entries of ``kind`` live, or None when ``FITPLAN_NO_CACHE`` is set."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    return root() / kind


def entry_name(stem: str, key: bytes) -> str:
    """A file name for ``key``: ``<stem>-<crc32><adler32>.pickle`` (a clash costs a recomputation only)."""
    return f"{stem[:40]}-{zlib.crc32(key):08x}{zlib.adler32(key):08x}.pickle"


def load(kind: str, name: str, key: Any) -> Any | None:
    """The value stored as ``name`` under exactly ``key``, or None (no cache, missing, stale, corrupt)."""
    d = directory(kind)
    if d is None:
        return None
    try:
        stored = pickle.loads((d / name).read_bytes())
    except Exception:  # noqa: BLE001 - missing, unreadable or corrupt: recompute instead
        return None
    if not (isinstance(stored, tuple) and len(stored) == 2 and stored[0] == key):
        return None
    return stored[1]


def store(kind: str, name: str, key: Any, value: Any, *, keep: int | None = None) -> None:
    """Keep ``value`` under ``key`` as ``name``; never fails. With ``keep``, the oldest entries beyond that
    many are removed."""
    d = directory(kind)
    if d is None:
        return
    import tempfile  # only when writing

    tmp = None
    try:
        blob = pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, d / name)
        tmp = None
        if keep is not None:
            _prune(d, keep)
    except Exception:  # noqa: BLE001 - a read-only or full cache directory, an unpicklable value: nothing kept
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _prune(d: Path, keep: int) -> None:
    entries = [e for e in os.scandir(d) if e.name.endswith(".pickle") and not e.name.startswith(".tmp-")]
    if len(entries) <= keep:
        return
    entries.sort(key=lambda e: e.stat().st_mtime_ns)
    for e in entries[: len(entries) - keep // 2]:  # down to half: pruning stays rare
        try:
            os.unlink(e.path)
        except OSError:
            pass


@functools.lru_cache(maxsize=8)
def code_fingerprint(modules: tuple[Path, ...], data_dirs: tuple[Path, ...]) -> str:
    """fitplan's and Python's versions, and the (size, mtime) of ``modules`` (the code that computes what is kept)
    and of every ``*.json`` file in ``data_dirs`` (the learned architecture files, bundled and user-learned):
    changed code or data never reads an old entry. Computed once per process for each argument."""
    from fitplan import __version__

    data = sorted(p for d in data_dirs if d.is_dir() for p in d.glob("*.json"))
    parts = [__version__, sys.version]
    for p in (*modules, *data):
        st = p.stat()
        parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)
