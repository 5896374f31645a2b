"""A tiny deterministic YAML writer: nested mappings of scalars and literal blocks, what accelerate configs and
SkyPilot tasks hold (no PyYAML at run time, and a fixed key order)."""

from __future__ import annotations

import json
from typing import Any


def to_yaml(data: dict[str, Any], indent: int = 0) -> str:
    """A tiny deterministic YAML writer for nested mappings of scalars (what accelerate configs hold); a string
    of several lines is a literal block (``key: |``), as SkyPilot's ``run:`` is usually written."""
    lines = []
    pad = "  " * indent
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines.append(to_yaml(value, indent + 1).rstrip("\n"))
        elif isinstance(value, str) and "\n" in value.rstrip("\n") and value.endswith("\n"):
            lines.append(f"{pad}{key}: |")
            lines += [f"{pad}  {line}" if line else "" for line in value.rstrip("\n").split("\n")]
        else:
            lines.append(f"{pad}{key}: {_yaml_scalar(value)}")
    return "\n".join(lines) + "\n"


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    text = str(v)
    plain = text and text[0].isalpha() and all(c.isalnum() or c in "_-./" for c in text) \
        and text.lower() not in ("true", "false", "yes", "no", "null", "on", "off")
    return text if plain else json.dumps(text)
