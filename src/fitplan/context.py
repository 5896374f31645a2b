"""A plugin registry plus the rulesets in force: what every command evaluates against."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from fitplan.rulesets import loader as rs
from fitplan.inputs import scenario as sc
from fitplan.inputs.convert import structure_scenario
from fitplan.errors import FitplanError
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


def scenario_from_dict(data: dict[str, Any], *, file: str | None = None) -> sc.Scenario:
    """Nested (``{"training": {...}}``) or flat (``{"optim": ...}``) mappings, or a mix of both."""
    nested: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key in sc.SECTIONS and isinstance(value, dict):
            nested.setdefault(key, {}).update(value)
        elif key in sc.FIELD_SECTION:
            nested.setdefault(sc.FIELD_SECTION[key], {})[key] = value
        else:
            from fitplan.errors import did_you_mean

            hint = did_you_mean(key, [*sc.SECTIONS, *sc.FIELD_SECTION]) or "sections: " + ", ".join(sc.SECTIONS)
            raise FitplanError(f"unknown key {key!r}", file=file, field=f"$.{key}", value=key, suggestion=hint)
    return structure_scenario(nested, file=file)


def load_scenario_file(path: str | Path) -> dict[str, Any]:
    """Read a scenario TOML file into a nested dict (validated later, together with flags)."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FitplanError("scenario file not found", file=str(p)) from None
    except tomllib.TOMLDecodeError as e:
        raise FitplanError(f"malformed TOML: {e}", file=str(p)) from None


def merge(base: dict[str, Any], flat_overrides: dict[str, Any]) -> dict[str, Any]:
    """Overlay flat field overrides on a (nested or flat) scenario mapping."""
    out: dict[str, Any] = {}
    for key, value in base.items():
        if key in sc.SECTIONS and isinstance(value, dict):
            out.setdefault(key, {}).update(value)
        else:
            out.setdefault(sc.FIELD_SECTION.get(key, key), {})
            if key in sc.FIELD_SECTION:
                out[sc.FIELD_SECTION[key]][key] = value
            else:
                out[key] = value
    for key, value in flat_overrides.items():
        section = sc.FIELD_SECTION.get(key)
        if section is None:
            from fitplan.errors import unknown

            raise unknown("scenario field", key, sc.FIELD_SECTION)
        out.setdefault(section, {})
        if not isinstance(out[section], dict):
            out[section] = {}
        if key != section and not isinstance(out.get(key, {}), dict):
            out.pop(key, None)
        out[section][key] = value
    return out
