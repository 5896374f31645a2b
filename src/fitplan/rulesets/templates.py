"""Message templates of advice rules: ``str.format`` restricted to plain names, with fixed formats.

Templates are filled from a whitelisted mapping of computed values: only plain names (no attribute or
index access, no conversions, no nested fields), each rendered with a fixed format. Format specs: ``GB`` /
``GiB`` (bytes), ``pct`` (a fraction as "62 %"), ``usd`` (money), ``h`` (seconds as hours), ``x`` (a ratio
as "1.33×"), or any Python number format (``.1f``).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from fitplan.errors import FitplanError

MAX_WIDTH, MAX_PRECISION = 80, 12
"""A template field is at most this wide, with at most this many decimals: a spec that passes ``rulesets check``
never makes a huge or failing message later."""
_SPEC = re.compile(r"^(?:[^{}]?[<>=^])?[+\- ]?#?0?(?P<width>\d{1,4})?[,_]?(?:\.(?P<precision>\d{1,4}))?[eEfFgGn%d]?$")


def _valid_spec(spec: str) -> bool:
    """A Python number format spec (the values are numbers) with a bounded width and precision."""
    m = _SPEC.match(spec)
    if m is None:
        return False
    if int(m.group("width") or 0) > MAX_WIDTH or int(m.group("precision") or 0) > MAX_PRECISION:
        return False
    try:
        format(1.5, spec)
    except ValueError:
        return False
    return True


CUSTOM_SPECS = ("GB", "GiB", "pct", "usd", "h", "x")


def template_names(template: str, where: str = "message") -> list[str]:
    """The names a message template uses. :raises FitplanError: attribute or index access, conversions,
    nested fields or malformed braces."""
    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise FitplanError(f"malformed message template: {e}", field=where, value=template,
                           suggestion="write {name} or {name:spec}; a literal brace is {{ or }}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name or not name.replace("_", "").replace(".", "").isalnum():
            raise FitplanError(f"message template field {{{name}}} is not a plain name", field=where, value=name,
                               suggestion="fields are names such as {peak_bytes:GB}; positional {} is not allowed")
        if "." in name or "[" in name:
            raise FitplanError(f"message template field {{{name}}} uses attribute or index access, which is not allowed",
                               field=where, value=name, suggestion="use a plain name such as {delta_peak_bytes:GB}")
        if conversion:
            raise FitplanError(f"message template field {{{name}!{conversion}}} uses a conversion, which is not allowed",
                               field=where, value=name)
        if spec and "{" in spec:
            raise FitplanError(f"message template field {{{name}:{spec}}} has a nested field in its format spec",
                               field=where, value=spec)
        if name[0].isdigit():
            raise FitplanError(f"message template field {{{name}}} is positional", field=where, value=name)
        if spec and spec not in CUSTOM_SPECS and not _valid_spec(spec):
            raise FitplanError(f"message template field {{{name}:{spec}}} has a format spec fitplan cannot use",
                               field=where, value=spec,
                               suggestion=f"one of {', '.join(CUSTOM_SPECS)}, or a number format such as .1f or ,.0f "
                                          f"(width at most {MAX_WIDTH}, precision at most {MAX_PRECISION})")
        names.append(name)
    return names


class _Value:
    """A number (or text) with fixed, deterministic formatting for the message specs."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __format__(self, spec: str) -> str:
        v = self.v
        if v is None:
            return "n/a"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, str) or not isinstance(v, (int, float)):
            return str(v)  # a number format on a text: the text as it is
        if spec == "GB":
            return f"{v / 1e9:,.1f} GB"
        if spec == "GiB":
            return f"{v / 2**30:,.1f} GiB"
        if spec == "pct":
            return f"{100 * v:.0f} %"
        if spec == "usd":
            return f"${v:,.2f}"
        if spec == "h":
            return f"{v / 3600:,.1f} h"
        if spec == "x":
            return f"{v:.2f}×"
        if not spec:
            return f"{v:,}" if isinstance(v, int) else f"{v:,.4g}"
        return format(v, spec)


class _SafeFormatter(string.Formatter):
    """``str.format`` restricted to the names of a mapping: no attribute or index access."""

    def get_field(self, field_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, str]:
        if "." in field_name or "[" in field_name or field_name not in kwargs:
            raise KeyError(field_name)
        return kwargs[field_name], field_name

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion:
            raise ValueError("conversions are not allowed")
        return value


_FORMATTER = _SafeFormatter()


def render_message(template: str, ns: Any) -> str:
    """``template`` filled with the values of its names in the namespace ``ns``."""
    names = template_names(template)
    mapping = {n: _Value(ns.get(n)) for n in names}
    return _FORMATTER.vformat(template, (), mapping)


