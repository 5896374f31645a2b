"""Writing output files: all of one command's files, whole, or none of them.

Every file a command writes (``--out``, each ``--emit`` file, ``graph --out``, ``import-skypilot --out``,
``calibrate --out``) goes through :func:`write_all`: each is written to a temporary file in its target's
folder, and only once all of them are complete are they renamed over their targets, so that a failure (a full
disk, a size limit, an error while rendering, a folder that cannot be written) leaves everything the user had
as it was. A target that is a symbolic link is written through to the file it names (the link stays a link),
and a target that exists keeps its permission bits (a private report stays private); a new file gets
``0666 & ~umask``. If a rename fails halfway, the files already replaced are put back.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from fitplan.errors import FitplanError


def write_text(path: str | Path, text: str, field: str = "--out") -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically. :raises FitplanError: naming the path and the reason."""
    return write_all([(path, text.encode("utf-8"))], field)[0]


def write_bytes(path: str | Path, data: bytes, field: str = "--out") -> Path:
    """Write ``data`` to ``path`` atomically. :raises FitplanError: naming the path and the reason."""
    return write_all([(path, data)], field)[0]


def check_target(path: str | Path, field: str = "--out") -> Path:
    """``path`` can be written: a non-empty file name (not ending in a path separator), not a directory, in a
    directory that exists. Commands check their output paths before they compute anything.
    :raises FitplanError: naming the path."""
    raw = os.fspath(path)
    if not raw:
        raise FitplanError("is empty: name the file to write", field=field, value=raw)
    if raw.endswith(("/", os.sep)) or (os.altsep and raw.endswith(os.altsep)):
        raise FitplanError("ends in a path separator: name a file, not a folder", file=raw, field=field,
                           suggestion=f"e.g. {raw}report")
    target = Path(raw)
    real = Path(os.path.realpath(target))
    directory = real.parent
    if target.is_dir():
        raise FitplanError("is a directory, not a file", file=str(target), field=field)
    if not directory.is_dir():
        raise FitplanError("the directory to write into does not exist", file=str(target), field=field,
                           suggestion=f"create {target.parent} first")
    if real.exists() and not real.is_file():
        raise FitplanError("is not a regular file (a FIFO, a socket or a device)", file=str(target), field=field)
    return target


def write_all(files: Iterable[tuple[str | Path, bytes]], field: str = "--out") -> list[Path]:
    """Write every ``(path, bytes)`` of ``files`` or none: all to temporaries first, then all renamed.
    Returns the paths as given. :raises FitplanError: naming the path that failed and why; nothing changed."""
    batch = Batch()
    for path, data in files:
        batch.add(path, data, field)
    return batch.commit()


class Batch:
    """The files one command writes, committed together (:meth:`commit`): all of them, or none. Folders
    added with :meth:`folder` are created at the commit, and removed again if it fails."""

    def __init__(self) -> None:
        self.files: list[tuple[str | Path, bytes, str]] = []
        self.folders: list[tuple[Path, str]] = []

    def add(self, path: str | Path, data: bytes, field: str = "--out") -> None:
        self.files.append((path, data, field))

    def folder(self, path: str | Path, field: str) -> Path:
        self.folders.append((Path(path), field))
        return Path(path)

    def extend(self, other: "Batch") -> None:
        self.files += other.files
        self.folders += other.folders

    def commit(self) -> list[Path]:
        """Create the folders, write every file to a temporary, then rename them all. Returns the paths as
        given. :raises FitplanError: naming the path that failed and why; nothing the user had changed."""
        made: list[Path] = []
        try:
            for d, field in self.folders:
                _make_folder(d, field, made)
            _commit([(check_target(p, field), data, field) for p, data, field in self.files])
        except BaseException:
            for d in reversed(made):
                try:
                    d.rmdir()
                except OSError:
                    pass
            raise
        return [Path(p) for p, _, _ in self.files]


def _make_folder(d: Path, field: str, made: list[Path]) -> None:
    """Create ``d`` and its missing parents, recording each one created in ``made``."""
    missing = [p for p in (d, *d.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir()
        except FileExistsError:
            continue
        except OSError as e:
            raise FitplanError(f"cannot create the directory: {e.strerror or e}", file=str(p), field=field) from None
        made.append(p)


def _commit(plan: list[tuple[Path, bytes, str]]) -> None:
    temps: list[tuple[Path, str, Path, str]] = []  # (as given, temporary, real target, field)
    try:
        for target, data, field in plan:
            real = Path(os.path.realpath(target))
            temps.append((target, _temporary(real, data, target, field), real, field))
        _rename_all(temps)
    finally:
        for _, tmp, _, _ in temps:
            _unlink(tmp)


def _temporary(real: Path, data: bytes, shown: Path, field: str) -> str:
    """A complete temporary copy of ``data`` beside ``real``, with the mode ``real`` has (or a new file's)."""
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    except OSError as e:
        raise _cannot(shown, e, field) from None
    import tempfile  # only when writing (it imports random and hashlib: not on every command's start)

    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
    except OSError as e:
        if tmp is not None:
            _unlink(tmp)
        raise _cannot(shown, e, field) from None
    return tmp


def _rename_all(temps: list[tuple[Path, str, Path, str]]) -> None:
    """Rename every temporary over its target; on a failure, put back the targets already replaced."""
    backups: list[tuple[Path, str | None]] = []  # (real target, hard link to its old content or None if new)
    try:
        for shown, tmp, real, field in temps:
            old = None
            if real.exists():
                old = _backup(real)
            backups.append((real, old))
            os.replace(tmp, real)
    except OSError as e:
        for real, old in reversed(backups):
            try:
                if old is not None:
                    os.replace(old, real)
                elif real.exists():
                    os.unlink(real)
            except OSError:
                pass
        raise _cannot(shown, e, field) from None
    finally:
        for _, old in backups:
            if old is not None:
                _unlink(old)


def _backup(real: Path) -> str:
    """A second name for ``real``'s current content (a hard link, or a copy where links are not supported)."""
    import tempfile

    old = tempfile.mktemp(dir=real.parent, prefix=f".{real.name}.", suffix=".old")
    try:
        os.link(real, old)
    except OSError:
        import shutil

        shutil.copyfile(real, old)
    return old


def _cannot(path: Path, e: OSError, field: str) -> FitplanError:
    return FitplanError(f"cannot write: {e.strerror or e}", file=str(path), field=field)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
