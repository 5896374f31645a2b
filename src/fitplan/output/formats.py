"""What plugins declare to the output layer: output formats and estimate report sections.

An :class:`OutputFormat` renders some kinds of report (``estimate``, ``recommend``, ``explain``, ...) to text;
``--format NAME`` picks one among those that render the command's kind. A :class:`ReportSection` adds a
JSON object and summary lines to the estimate report (the built-in memory, time and cost sections are
declared this way by ``fitplan.builtin.report``). Renderers are pure functions of what they render: they
never evaluate an estimate (the assess step has done that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from attrs import frozen

REPORT_KINDS: dict[str, str] = {
    "estimate": "an assessed estimate (fitplan.assess.Assessment)",
    "recommend": "a recommendation (fitplan.search.plans.Result, plans assessed)",
    "explain": "a derivation tree and the seed's differences (fitplan.output.explain.Explanation)",
    "capacity": "the seed's GPU tables recomputed (dict)",
    "largest": "the largest micro-batch or sequence that fits (dict)",
    "plugins": "the plugin listing (dict)",
    "models": "the model catalog (list of dicts)",
    "validate": "a validation report from the torch plugin (dict)",
    "dataset": "a dataset's token figures (fitplan.data.figures.figures: dict)",
    "graph": "the compiled quantity graph (fitplan.engine.graph.CompiledGraph)",
}
"""Kinds of report a format may render: name -> what the renderer receives."""


@frozen
class RenderOptions:
    """How to render: ``units`` for bytes (``GB`` = 10^9 or ``GiB`` = 2^30), ``color`` for terminal styles,
    ``width`` of the terminal."""

    units: str = "GB"
    color: bool = False
    width: int = 200


@frozen
class OutputFormat:
    """``--format name``: ``render(kind, report, options) -> str`` for each kind in ``kinds``."""

    name: str
    extension: str
    kinds: tuple[str, ...]
    render: Callable[[str, Any, RenderOptions], str]
    doc: str = ""
    plugin: str = ""


@frozen
class ReportSection:
    """A section of the estimate report: ``json(estimate)`` is the object under ``name`` (None: left out),
    ``lines(estimate, units)`` the ``(label, text)`` summary lines; sections appear by ``order``."""

    name: str
    json: Callable[[Any], dict[str, Any] | None]
    lines: Callable[[Any, str], list[tuple[str, str]]] = attrs.field(default=lambda est, units: [])
    order: int = 100
    plugin: str = ""
