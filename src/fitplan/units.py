"""Units: parse sizes like ``7B`` and format bytes.

fitplan reports memory in GB (10^9 bytes) by default, like the seed chapter and GPU
vendors; ``--units GiB`` switches to 2^30. Every human-readable figure names its unit.
"""

from __future__ import annotations

import re

from fitplan.errors import FitplanError

GB = 10**9
GiB = 2**30

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(r"^\s*([0-9]{0,30}\.?[0-9]{1,30}(?:e[+-]?[0-9]{1,3})?)\s*([kmbgt]?)\s*$", re.IGNORECASE)
MAX_COUNT = 10**15
"""The largest parameter count fitplan accepts (a quadrillion: 500× the largest models trained)."""


def parse_count(text: str | int | float, *, field: str = "params") -> int:
    """Parse a parameter count: ``7B``, ``1.5b``, ``125M``, ``6738415616``.

    :raises FitplanError: on anything else or a non-positive count.
    """
    if isinstance(text, bool):
        raise FitplanError("expected a parameter count", field=field, value=text, suggestion="for example 7B or 125M")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _COUNT.match(str(text))
        if not m:
            raise FitplanError(
                f"cannot read {text!r:.40} as a parameter count", field=field, value=str(text)[:40],
                suggestion="for example 7B, 1.5B or 125M")
        value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if not value >= 1:
        raise FitplanError(f"a parameter count must be at least 1, got {text!r:.40}", field=field, value=text)
    if not value <= MAX_COUNT:  # also NaN and infinity
        raise FitplanError(f"a parameter count must be at most {MAX_COUNT:.0e}, got {text!r:.40}", field=field, value=text)
    return int(round(value))


def format_bytes(n: float | None, unit: str = "GB") -> str:
    """``format_bytes(28e9) == '28.00 GB'``; ``unit`` is ``GB`` or ``GiB``."""
    if n is None:
        return "-"
    div = GB if unit == "GB" else GiB
    return f"{n / div:,.2f} {unit}"


def format_bytes_auto(n: float | None) -> str:
    """Decimal units scaled to the value (``1.50 MB``, ``28.00 GB``): for tiny models in ``validate``."""
    if n is None:
        return "-"
    for div, unit in ((GB, "GB"), (10**6, "MB"), (10**3, "kB")):
        if abs(n) >= div:
            return f"{n / div:,.2f} {unit}"
    return f"{int(n)} B"


def format_count(n: float) -> str:
    for div, suf in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suf}"
    return f"{n:g}"
