"""Files of Hugging Face Hub repositories: from the local cache, laid out as ``huggingface_hub`` lays it out.

A repository ``ORG/NAME`` is cached under ``$HF_HUB_CACHE`` (default ``$HF_HOME/hub``, ``HF_HOME`` defaulting to
``~/.cache/huggingface``) as ``models--ORG--NAME/``: ``refs/<revision>`` holds the commit hash a branch or tag
points to, and ``snapshots/<commit>/<file>`` the files (symlinks into ``blobs/``). :func:`find_file` reads that
layout without importing ``huggingface_hub``; :func:`fetch_file` also downloads a missing file through
``huggingface_hub`` when it is installed and the Hub is reachable (``HF_HUB_OFFLINE=1`` forbids it; ``HF_TOKEN``
is what ``huggingface_hub`` uses for gated repositories).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fitplan.errors import FitplanError

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
"""``ORG/NAME`` as the Hub allows them."""
REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
"""A branch, a tag (``refs/pr/1``) or a commit hash: at most 200 characters, no ``..`` (the revision becomes
a path in the cache: ``refs/<revision>``, ``snapshots/<commit>``)."""


def check_revision(revision: str, field: str) -> None:
    """:raises FitplanError: ``revision`` is no branch, tag or commit name (too long, ``..``, odd characters)."""
    if not REVISION.match(revision) or ".." in revision or revision.endswith("/"):
        raise FitplanError(f"{revision!r:.80} is not a revision (a branch, tag or commit: at most 200 letters, digits, "
                           "'.', '_', '-', '/'; no '..')", field=field, value=revision[:80],
                           suggestion="e.g. ORG/NAME@main or ORG/NAME@<commit hash>")


def split_revision(text: str) -> tuple[str, str]:
    """``ORG/NAME@revision`` -> (``ORG/NAME``, revision); the revision defaults to ``main``."""
    repo, _, revision = text.partition("@")
    return repo, revision or "main"


def is_repo_id(text: str) -> bool:
    """Whether ``text`` (optionally ``@revision``) is written like a Hub model id."""
    return bool(REPO_ID.match(split_revision(text)[0]))


def cache_dir() -> Path:
    """The Hub cache directory ``huggingface_hub`` uses (``HF_HUB_CACHE``, else ``HF_HOME/hub``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                       "huggingface")
    return Path(home) / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def find_file(repo_id: str, filename: str, revision: str = "main") -> Path | None:
    """The cached ``filename`` of model repository ``repo_id`` at ``revision`` (a branch, a tag or a commit
    hash), or None when it is not in the cache."""
    if not REVISION.match(revision) or ".." in revision:
        return None
    folder = cache_dir() / ("models--" + repo_id.replace("/", "--"))
    commit = revision
    ref = folder / "refs" / revision
    try:
        if ref.is_file():
            commit = ref.read_bytes()[:256].decode("ascii", errors="replace").strip()
        path = folder / "snapshots" / commit / filename
        return path if REVISION.match(commit) and ".." not in commit and path.is_file() else None
    except OSError:  # an unreadable cache: as if the file were not in it
        return None


def fetch_file(repo_id: str, filename: str, revision: str = "main", *, field: str = "--model") -> Path:
    """``filename`` of ``repo_id`` at ``revision``: from the cache, else downloaded (online, with
    ``huggingface_hub`` installed).

    :raises FitplanError: not cached and offline, ``huggingface_hub`` missing, or the download failed (a
        private or gated repository without ``HF_TOKEN``, an unknown id or revision), naming the id.
    """
    check_revision(revision, field)
    found = find_file(repo_id, filename, revision)
    if found is not None:
        return found
    where = f"{repo_id}@{revision}" if revision != "main" else repo_id
    if offline():
        raise FitplanError(f"{filename} of {where} is not in the Hugging Face cache and HF_HUB_OFFLINE is set",
                           field=field, value=where,
                           suggestion=f"download it once online (huggingface-cli download {repo_id} {filename}) "
                                      f"or point {field} at a local file; cache: {cache_dir()}")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise FitplanError(f"{filename} of {where} is not in the Hugging Face cache ({cache_dir()})", field=field,
                           value=where, suggestion="pip install huggingface_hub to download it, or pass a local path") from None
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision))
    except Exception as e:  # noqa: BLE001 - huggingface_hub's errors: not found, gated, offline, ...
        raise FitplanError(f"cannot download {filename} of {where}: {type(e).__name__}: {e}", field=field, value=where,
                           suggestion="check the id and revision; gated repositories need HF_TOKEN") from None
