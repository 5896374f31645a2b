"""The terminal: rich consoles for stdout and stderr, rendering rich output to text, JSON dumps.

Every text that comes from the user or a ruleset is escaped before rich sees it (``escape``), so markup in a
model name or a ruleset string is printed as it is written.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from io import StringIO
from typing import Any

from fitplan.output.formats import RenderOptions


_TAG = re.compile(r"<(?=[A-Za-z/!?])")
_ENTITY = re.compile(r"&(?=[A-Za-z#])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters but tab and newline: an escape sequence in a ruleset string must not reach the terminal."""


def printable(text: Any) -> str:
    """``text`` without control characters (terminal escape sequences, carriage returns), tab and newline kept."""
    return _CONTROL.sub("\ufffd", str(text))


def escape(text: Any) -> str:
    """``text`` as rich prints it literally: markup brackets escaped, control characters removed. rich is imported
    only when something is printed through it: the JSON and Markdown reports never load it."""
    from rich.markup import escape as escape_markup

    return escape_markup(printable(text))


def md(text: Any) -> str:
    """``text`` as Markdown shows it literally inside a paragraph or a table cell: no raw HTML (a ``<`` that could
    open a tag and an ``&`` that could open an entity become entities; ``x < 0.1`` stays), no cell break (``|``),
    no code span (a backtick), no line break or control character."""
    s = _ENTITY.sub("&amp;", printable(text))
    s = _TAG.sub("&lt;", s)
    return s.replace("|", "\\|").replace("`", "\\`").replace("\n", " ")


def console(err: bool = False):
    """A rich console on stdout (or stderr). Not a terminal (a pipe, a file, a test): wide enough that trees
    and tables are never cropped, and no colour. Never emoji codes: a name such as ``:rocket:`` prints as written
    (and rich's emoji table is not loaded)."""
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    width = None if stream.isatty() else 200
    return Console(stderr=err, highlight=False, emoji=False, width=width)


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
    c = Console(file=buf, width=options.width, highlight=False, emoji=False, force_terminal=options.color,
                color_system="standard" if options.color else None)
    draw(c)
    return buf.getvalue()


def dumps_json(data: Any) -> str:
    """Indented JSON, keys in their order, unknown objects as strings. NaN and infinity are not JSON: inputs are
    checked to be finite, and a non-finite number reaching here is a bug (``ValueError``), never output."""
    return json.dumps(data, indent=2, sort_keys=False, default=str, allow_nan=False) + "\n"
