"""The user's cache directory, and pickled entries kept there under an exact key.

Two things are kept on disk to save time, never to change an answer (docs/reliability.md "Caches"): snapshots of
parsed ruleset files (``rulesets/snapshot.py``) and step traces replayed from learned architecture files
(``trace/step_trace.py``). Both go through this module:

* **where:** ``$FITPLAN_CACHE_DIR/<kind>/``, else ``$XDG_CACHE_HOME/fitplan/<kind>/`` (``~/.cache/fitplan``;
  ``%LOCALAPPDATA%`` on Windows, ``~/Library/Caches`` on macOS); ``FITPLAN_NO_CACHE=1`` turns it off;
* **an entry** is ``pickle((key, value))``; :func:`load` gives the value back only when the stored key equals
  the caller's key (so a file-name clash, a stale or a corrupt entry only costs a recomputation);
* **writes** go to a temporary file renamed into place (a crash or a concurrent run never leaves half an
  entry), and never fail: a read-only or full disk just keeps nothing; a kind may cap its number of entries
  (the oldest are removed);
* **trust:** an entry is read only from a folder (the kind's and the cache root) owned by the user running
  fitplan and writable by no one else, and only when it is a regular file of this user of at most
  :data:`MAX_ENTRY` bytes (opened without following a link and without blocking, so a FIFO or a device never
  hangs a command); a folder that fails the check is not used (one warning, then no cache). Entries are
  unpickled by :class:`_Unpickler`, which builds only classes (no functions) of fitplan's own modules and a
  few harmless built-in types, so that a planted pickle cannot run code;
* folders are created ``0700``;
* :func:`code_fingerprint` is the part of a key that changes whenever the code that computed an entry or the
  learned architecture data change (fitplan's and Python's versions, the size and modification time of the
  modules and data files the caller names).
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import stat
import sys
import zlib
from pathlib import Path
from typing import Any

NO_CACHE_ENV = "FITPLAN_NO_CACHE"
MAX_ENTRY = 64 * 2**20
"""The largest entry read (64 MiB; a ruleset snapshot is about 0.5 MB, a trace 15 KB)."""
_WARNED: set[str] = set()
_TRUSTED: set[Path] = set()


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
    """The value stored as ``name`` under exactly ``key``, or None (no cache, missing, stale, corrupt,
    untrusted)."""
    d = directory(kind)
    if d is None or not trusted(d):
        return None
    blob = _read_entry(d / name)
    if blob is None:
        return None
    try:
        stored = _Unpickler(io.BytesIO(blob)).load()
    except Exception:  # noqa: BLE001 - corrupt or refused: recompute instead
        return None
    if not (isinstance(stored, tuple) and len(stored) == 2 and stored[0] == key):
        return None
    return stored[1]


def trusted(d: Path) -> bool:
    """``d`` and the cache root, where they exist, are directories of this user that no one else can write
    (a warning, once per folder, when one is not). Missing folders are trusted: :func:`store` creates them.
    A folder found trusted is not checked again in this process."""
    if d in _TRUSTED:
        return True
    for folder in {d, root()}:
        try:
            st = os.stat(folder)  # a linked cache folder (~/.cache on another disk) is judged by its target
        except FileNotFoundError:
            continue
        except OSError:
            return False
        why = _untrusted(st)
        if why:
            _warn(folder, why)
            return False
    if d.exists():
        _TRUSTED.add(d)
    return True


def _untrusted(st: os.stat_result) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not hasattr(os, "getuid"):  # Windows: no POSIX owner or mode bits (its ACLs are not read)
        return None
    if st.st_uid != os.getuid():
        return f"belongs to user id {st.st_uid}, not to you"
    if st.st_mode & 0o022:
        return f"can be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _warn(folder: Path, why: str) -> None:
    if str(folder) in _WARNED:
        return
    _WARNED.add(str(folder))
    print(f"warning: fitplan's cache folder {folder} {why}; the cache is not used "
          f"(chmod 700 it, delete it, or set {NO_CACHE_ENV}=1)", file=sys.stderr)


def _read_entry(path: Path) -> bytes | None:
    """The bytes of a regular file of this user of at most :data:`MAX_ENTRY` bytes, else None (a FIFO or a
    device is opened without blocking and never read; a link is not followed)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_ENTRY + 1)
        return data if len(data) <= MAX_ENTRY else None
    except OSError:
        return None
    finally:
        os.close(fd)


_SAFE_BUILTINS = frozenset({"object", "set", "frozenset", "complex", "bytearray", "slice", "range"})
_SAFE_MODULES = ("pathlib", "collections", "datetime", "decimal", "fractions", "enum")


class _Unpickler(pickle.Unpickler):
    """Builds classes defined in fitplan's own modules (attrs value classes, enums) and in
    :data:`_SAFE_MODULES`, and a few built-in types; refuses everything else: functions (``os.system``,
    ``eval``) and classes a fitplan module merely imported (``subprocess.Popen``), so that loading an entry
    cannot run code other than the constructors of those classes."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if module == "copyreg" and name == "_reconstructor":
            return super().find_class(module, name)
        roots = ("fitplan", *_SAFE_MODULES)
        if module.split(".")[0] in roots and "." not in name:
            found = super().find_class(module, name)
            # a class defined there, not one a module imported (``from subprocess import Popen`` would run code)
            if isinstance(found, type) and str(getattr(found, "__module__", "")).split(".")[0] in roots:
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not a type fitplan keeps in its cache")


def store(kind: str, name: str, key: Any, value: Any, *, keep: int | None = None) -> None:
    """Keep ``value`` under ``key`` as ``name``; never fails. With ``keep``, the oldest entries beyond that
    many are removed."""
    d = directory(kind)
    if d is None or not trusted(d):
        return
    import tempfile  # only when writing

    tmp = None
    try:
        blob = pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL)
        make_private(d)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, d / name)
        tmp = None
        if keep is not None and _count(d) > keep:
            _prune(d, keep)
    except Exception:  # noqa: BLE001 - a read-only or full cache directory, an unpicklable value: nothing kept
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def make_private(d: Path) -> None:
    """Create ``d`` and its missing parents ``0700`` (``mkdir -p``'s parents would get ``0777 & ~umask``)."""
    missing = [p for p in (d, *d.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass


_COUNTS: dict[Path, int] = {}
"""Entries per capped directory, as this process counts them: listed once, then one more per store (a
replaced entry counts too, so the count only errs high), listed again when it passes the cap. Listing a
directory of thousands of entries on every store cost ~3 ms (a new shape on ``fitplan serve`` stores eight
traces); another process's entries are seen at the next listing."""


def _count(d: Path) -> int:
    n = _COUNTS.get(d)
    n = len(_entries(d)) if n is None else n + 1
    _COUNTS[d] = n
    return n


def _entries(d: Path) -> list[os.DirEntry]:
    return [e for e in os.scandir(d) if e.name.endswith(".pickle") and not e.name.startswith(".tmp-")]


def _prune(d: Path, keep: int) -> None:
    entries = _entries(d)
    _COUNTS[d] = len(entries)
    if len(entries) <= keep:
        return
    entries.sort(key=lambda e: e.stat().st_mtime_ns)
    for e in entries[: len(entries) - keep // 2]:  # down to half: pruning stays rare
        try:
            os.unlink(e.path)
            _COUNTS[d] -= 1
        except OSError:
            pass


@functools.lru_cache(maxsize=8)
def code_fingerprint(modules: tuple[Path, ...], data_dirs: tuple[Path, ...]) -> str:
    """fitplan's and Python's versions, and the (size, mtime) of ``modules`` (the code that computes what is kept)
    and of every ``*.json`` file in ``data_dirs`` (the learned architecture files, bundled and user-learned):
    changed code or data never reads an old entry. Computed once per process for each argument."""
    from fitplan import __version__

    data: list[Path] = []
    for d in data_dirs:
        try:
            data += d.glob("*.json")
        except OSError:  # an unreadable folder: its files are not read either
            continue
    parts = [__version__, sys.version]
    for p in (*modules, *sorted(data)):
        try:
            st = p.stat()
            parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:  # a dangling link, an unreadable file
            parts.append(f"{p}:?")
    return "\n".join(parts)
