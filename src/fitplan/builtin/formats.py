"""The built-in output formats: ``table`` (the terminal), ``json``, ``markdown``, ``html``, ``tree``, ``dot`` and
``mermaid``, each for the kinds of report it renders. A plugin adds a format the same way
(``fitplan_register_formats``); renderers live in :mod:`fitplan.output` and are imported when used."""

from __future__ import annotations

from typing import Any

from fitplan.output.formats import OutputFormat, RenderOptions
from fitplan.pluginmgr.hookspecs import hookimpl


def _table(kind: str, report: Any, options: RenderOptions) -> str:
    if kind == "estimate":
        from fitplan.output.estimate_report import to_terminal
    elif kind == "recommend":
        from fitplan.output.recommend_report import to_terminal
    elif kind == "capacity":
        from fitplan.output.capacity import to_terminal
    elif kind == "largest":
        from fitplan.output.capacity import largest_text

        return largest_text(report)
    elif kind == "plugins":
        from fitplan.output.listings import plugins_terminal as to_terminal
    elif kind == "models":
        from fitplan.output.listings import models_terminal as to_terminal
    else:
        from fitplan.output.listings import validate_terminal as to_terminal
    return to_terminal(report, options)


def _json(kind: str, report: Any, options: RenderOptions) -> str:
    from fitplan.output.console import dumps_json

    if kind == "estimate":
        from fitplan.output.estimate_report import to_json

        return dumps_json(to_json(report))
    if kind == "recommend":
        from fitplan.output.recommend_report import to_json

        return dumps_json(to_json(report))
    if kind == "explain":
        return dumps_json(report.to_json())
    return dumps_json(report)


def _markdown(kind: str, report: Any, options: RenderOptions) -> str:
    if kind == "estimate":
        from fitplan.output.estimate_report import to_markdown

        return to_markdown(report, options.units) + "\n"
    if kind == "recommend":
        from fitplan.output.recommend_report import to_markdown

        return to_markdown(report)
    from fitplan.output.capacity import to_markdown

    return to_markdown(report) + "\n"


def _html(kind: str, report: Any, options: RenderOptions) -> str:
    from fitplan.output.recommend_html import render

    return render(report)


def _tree(kind: str, report: Any, options: RenderOptions) -> str:
    from fitplan.output.explain import to_terminal

    return to_terminal(report, options)


def _graph(fmt: str):
    def render(kind: str, graph: Any, options: RenderOptions) -> str:
        return graph.to_dot() if fmt == "dot" else graph.to_mermaid()

    return render


FORMATS = (
    OutputFormat("table", ".txt", ("estimate", "recommend", "capacity", "largest", "plugins", "models", "validate"), _table,
                 "rich text for the terminal (colour when it is one)"),
    OutputFormat("json", ".json", ("estimate", "recommend", "explain", "capacity", "largest", "plugins", "models",
                                   "validate"), _json, "indented JSON, bytes as integers"),
    OutputFormat("markdown", ".md", ("estimate", "recommend", "capacity"), _markdown, "a Markdown document"),
    OutputFormat("html", ".html", ("recommend",), _html, "one self-contained HTML file with SVG charts"),
    OutputFormat("tree", ".txt", ("explain",), _tree, "the derivation tree for the terminal"),
    OutputFormat("dot", ".dot", ("graph",), _graph("dot"), "Graphviz DOT"),
    OutputFormat("mermaid", ".mmd", ("graph",), _graph("mermaid"), "a Mermaid flowchart"),
)


@hookimpl
def fitplan_register_formats(register):
    for f in FORMATS:
        register(f)
