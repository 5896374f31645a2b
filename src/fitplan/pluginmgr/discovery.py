"""Finding third-party plugins: the ``fitplan`` entry points of the installed distributions.

``importlib.metadata`` finds them by reading every distribution's metadata on ``sys.path`` (and imports the
``email``, ``zipfile`` and ``socket`` modules to do so): on a machine with torch and transformers installed that
is a good part of a short command's start. What it finds is kept in fitplan's disk cache (``fitplan/diskcache.py``,
kind ``plugins``) under the list of ``sys.path`` entries with each one's modification time: installing,
upgrading or removing a distribution (``pip`` adds or removes a ``*.dist-info`` directory) changes its
directory's time, so the next start reads the metadata again. Editing an installed ``entry_points.txt`` by hand
is not seen until the distribution is reinstalled or the cache is off (``FITPLAN_NO_CACHE=1``).
"""

from __future__ import annotations

import importlib
import os
import sys

from attrs import frozen

from fitplan import diskcache

GROUP = "fitplan"
KIND = "plugins"


@frozen
class EntryPoint:
    """One ``fitplan`` entry point and the distribution that declares it."""

    name: str
    value: str
    """``module`` or ``module:attribute``, as the distribution declares it."""
    dist_name: str = ""
    dist_version: str = ""

    def load(self) -> object:
        """Import the module and return the object the entry point names."""
        module, _, attr = self.value.partition(":")
        obj: object = importlib.import_module(module.split("[")[0].strip())
        for part in attr.split("[")[0].strip().split(".") if attr else ():
            obj = getattr(obj, part)
        return obj


def _stamp() -> tuple[tuple[str, int], ...]:
    out = []
    for p in sys.path:
        try:
            out.append((p, os.stat(p or ".").st_mtime_ns))
        except OSError:
            out.append((p, -1))
    return tuple(out)


def entry_points() -> list[EntryPoint]:
    """The installed ``fitplan`` entry points, sorted by name."""
    key = (1, GROUP, _stamp())
    name = diskcache.entry_name("entry-points", repr(key[2]).encode())
    found = diskcache.load(KIND, name, key)
    if not isinstance(found, list):
        found = _read_metadata()
        diskcache.store(KIND, name, key, found, keep=64)
    return found


def _read_metadata() -> list[EntryPoint]:
    import importlib.metadata

    out = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        dist_name, version = ("", "") if dist is None else (dist.metadata["Name"] or dist.name, dist.version)
        out.append(EntryPoint(ep.name, ep.value, dist_name, version))
    return sorted(out, key=lambda e: e.name)
