"""The terminal: rich consoles for stdout and stderr, rendering rich output to text, JSON dumps.

Every text that comes from the user or a ruleset is escaped before rich sees it (``escape``), so markup in a
model name or a ruleset string is printed as it is written.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from io import StringIO
from typing import Any

from fitplan.output.formats import RenderOptions


def escape(text: Any) -> str:
    """``text`` as rich prints it literally (markup brackets escaped). rich is imported only when something is
    printed through it: the JSON and Markdown reports never load it."""
    from rich.markup import escape as escape_markup

    return escape_markup(str(text))


def console(err: bool = False):
    """A rich console on stdout (or stderr). Not a terminal (a pipe, a file, a test): wide enough that trees
    and tables are never cropped, and no colour."""
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    width = None if stream.isatty() else 200
    return Console(stderr=err, highlight=False, width=width)


def options_for(stream: Any = None, units: str = "GB") -> RenderOptions:
    """Render options for writing to ``stream`` (default stdout): colour and width when it is a terminal."""
    stream = stream or sys.stdout
    tty = bool(getattr(stream, "isatty", lambda: False)())
    if tty:
        import shutil

        return RenderOptions(units=units, color=True, width=shutil.get_terminal_size().columns)
    return RenderOptions(units=units, color=False, width=200)


def render_rich(draw: Callable[[Any], None], options: RenderOptions) -> str:
    """What ``draw(console)`` prints, as text (with terminal colours when ``options.color``)."""
    from rich.console import Console

    buf = StringIO()
    c = Console(file=buf, width=options.width, highlight=False, force_terminal=options.color,
                color_system="standard" if options.color else None)
    draw(c)
    return buf.getvalue()


def dumps_json(data: Any) -> str:
    """Indented JSON, keys in their order, unknown objects as strings."""
    return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
