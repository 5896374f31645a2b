"""A plugin registry plus the rulesets in force: what every command evaluates against."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from fitplan.rulesets import loader as rs
from fitplan.pluginmgr.registry import Registry, default_registry


@attrs.define
class Context:
    registry: Registry
    rulesets: rs.Rulesets


_CACHE: dict[tuple, Context] = {}


def get_context(ruleset_dirs: Sequence[str | Path] = (), registry: Registry | None = None) -> Context:
    """Load (once per argument set) the registry and the rulesets; raise plugin problems."""
    reg = registry or default_registry()
    key = (id(reg), tuple(map(str, ruleset_dirs)))
    if key not in _CACHE:
        plugin_dirs = reg.ruleset_dirs()
        reg.raise_errors()
        reg.compiled()
        _CACHE[key] = Context(reg, rs.load(ruleset_dirs, plugin_dirs))
    return _CACHE[key]
