"""Writing output files: whole or not at all.

A report or an export is written to a temporary file in the target's directory and renamed over the
target only once it is complete, so that a failure (a full disk, a file size limit, an error while
rendering) never leaves a truncated file or replaces a good one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fitplan.errors import FitplanError


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically. :raises FitplanError: naming the path and the reason."""
    return write_bytes(path, text.encode("utf-8"))


def check_target(path: str | Path, field: str = "--out") -> Path:
    """``path`` can be written: not a directory, in a directory that exists. Commands check their output paths
    before they compute anything. :raises FitplanError: naming the path."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise FitplanError("is a directory, not a file", file=str(target), field=field)
    if not directory.is_dir():
        raise FitplanError("the directory to write into does not exist", file=str(target), field=field,
                           suggestion=f"create {directory} first")
    if target.exists() and not target.is_file():
        raise FitplanError("is not a regular file (a FIFO, a socket or a device)", file=str(target), field=field)
    return target


def write_bytes(path: str | Path, data: bytes) -> Path:
    target = check_target(path)
    directory = target.parent if str(target.parent) else Path(".")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
        tmp = None
    except OSError as e:
        raise FitplanError(f"cannot write: {e.strerror or e}", file=str(target), field="--out") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
