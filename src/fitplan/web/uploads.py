"""Uploaded ``config.json`` files, for ``fitplan serve``: checked, kept in a private temporary directory while
the server runs, and named in queries as ``model=upload:<id>``.

Each upload is written as ``<tmp>/<id>/<name>/config.json`` (``<id>``: the first 16 hex digits of the content's
SHA-256, so the same file gets the same link; ``<name>``: from its ``_name_or_path`` or file name), so that
every command path reads it as it reads ``--model path/to/config.json``. The directory is created with mode
0700 and removed when the server stops; at most :data:`MAX_UPLOADS` are kept (the oldest go first) and each
is at most :data:`MAX_UPLOAD_BYTES`.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from fitplan.errors import FitplanError
from fitplan.web.params import UPLOAD_PREFIX

MAX_UPLOAD_BYTES = 1 << 20
MAX_UPLOADS = 32
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def display_name(config: dict[str, Any], filename: str | None) -> str:
    """A name for the model (one path component): ``_name_or_path``'s last part, else the file's stem unless
    it is ``config``, else the ``model_type``."""
    candidates = [str(config.get("_name_or_path") or "").rstrip("/").rpartition("/")[2],
                  Path(filename or "").stem if Path(filename or "").stem != "config" else "",
                  str(config.get("model_type") or "")]
    for c in candidates:
        name = _UNSAFE.sub("-", c).strip(".-")[:64]
        if name:
            return name
    return "uploaded-model"


class UploadStore:
    """The uploads of one server (thread-safe)."""

    def __init__(self, limit: int = MAX_UPLOADS) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fitplan-serve-"))  # mode 0700
        self.limit = limit
        self._entries: OrderedDict[str, tuple[Path, str]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, data: bytes, filename: str | None = None) -> dict[str, Any]:
        """Check and keep one ``config.json``: ``{"model": "upload:<id>", "name", "model_type", "param_count"}``.

        :raises FitplanError: too large, not UTF-8 JSON, or not a config fitplan reads (naming the field).
        """
        from fitplan.arch.architecture import spec_from_config
        from fitplan.inputs.files import decode, loads_json

        shown = Path(filename or "config.json").name or "config.json"
        if len(data) > MAX_UPLOAD_BYTES:
            raise FitplanError(f"upload larger than {MAX_UPLOAD_BYTES:,} bytes", file=shown,
                               suggestion="a config.json is a few kB; upload the model's config.json only")
        config = loads_json(decode(data, file=shown), file=shown, special_floats=True)  # as the CLI reads it
        if not isinstance(config, dict):
            raise FitplanError("a model config must be a JSON object", file=shown, value=type(config).__name__)
        name = display_name(config, shown)
        spec = spec_from_config(config, name=name, file=shown)
        uid = hashlib.sha256(data).hexdigest()[:16]
        with self._lock:
            if uid not in self._entries:
                path = self.root / uid / name / "config.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                self._entries[uid] = (path, shown)
                while len(self._entries) > self.limit:
                    old, _ = self._entries.popitem(last=False)
                    shutil.rmtree(self.root / old, ignore_errors=True)
            self._entries.move_to_end(uid)
        return {"model": UPLOAD_PREFIX + uid, "name": name, "model_type": spec.model_type,
                "param_count": spec.param_count, "file": shown}

    def lookup(self, model: str) -> tuple[Path, str]:
        """The stored file of ``upload:<id>`` and the name it was uploaded under.

        :raises FitplanError: no such upload (the server restarted, or it was evicted).
        """
        uid = model[len(UPLOAD_PREFIX):]
        with self._lock:
            entry = self._entries.get(uid)
        if entry is None:
            raise FitplanError("no uploaded config.json with this id on this server", field="model", value=model,
                               suggestion="uploads last as long as the server: drop the config.json on the page again")
        return entry

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
