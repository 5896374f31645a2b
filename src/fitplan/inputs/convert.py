"""The one cattrs converter, and readable errors from it.

Structuring never uses cattrs' global converter: :func:`make_converter` builds one with
``forbid_extra_keys=True``, so a misspelled key in a TOML file is an error, not silence.
Errors are flattened into ``message @ $.path`` lines (what ``fitplan rulesets check`` prints).
"""

from __future__ import annotations

from typing import Any

import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from fitplan.errors import FitplanError, did_you_mean


def make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, prefer_attrib_converters=False)
    # TOML and JSON have no tuples: accept lists (and a comma-separated string) for tuple[str, ...].
    conv.register_structure_hook_func(
        lambda t: t == tuple[str, ...],
        lambda v, _: tuple(x.strip() for x in v.split(",") if x.strip()) if isinstance(v, str) else tuple(str(x) for x in v),
    )
    conv.register_structure_hook(
        int, lambda v, _: _strict_number(v, int)
    )
    conv.register_structure_hook(
        float, lambda v, _: _strict_number(v, float)
    )
    conv.register_structure_hook(bool, lambda v, _: _strict_bool(v))
    return conv


def _strict_number(v: Any, typ: type) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"expected {typ.__name__}, got {v!r}")
    if typ is int:
        if isinstance(v, float) and not v.is_integer():
            raise ValueError(f"expected an integer, got {v!r}")
        try:
            return int(v) if not isinstance(v, str) else int(v.replace("_", ""))
        except ValueError:
            raise ValueError(f"expected an integer, got {v!r}") from None
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None


def _strict_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.lower() in ("true", "1", "yes")
    raise ValueError(f"expected true or false, got {v!r}")


CONVERTER = make_converter()


def error_lines(exc: BaseException, path: str = "$") -> list[str]:
    """Flatten a cattrs error tree into ``message @ $.path`` lines, keeping validator messages."""
    lines: list[str] = []
    if isinstance(exc, ForbiddenExtraKeysError):
        allowed = [a.name for a in __import__("attrs").fields(exc.cl)]
        for key in sorted(exc.extra_fields):
            hint = did_you_mean(key, allowed) or "allowed: " + ", ".join(allowed)
            lines.append(f"unknown key {key!r} ({hint}) @ {path}")
        return lines
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        for sub in exc.exceptions:
            note = getattr(sub, "__notes__", None) or []
            sub_path = path
            for n in note:
                name = getattr(n, "name", None)
                idx = getattr(n, "index", None)
                if name is not None:
                    sub_path = f"{path}.{name}"
                elif idx is not None:
                    sub_path = f"{path}[{idx!r}]"
            lines.extend(error_lines(sub, sub_path))
        return lines
    if isinstance(exc, FitplanError):
        if exc.field and not path.endswith("." + exc.field):
            path = f"{path}.{exc.field}"
        lines.append(f"{exc.message} @ {path}")
        return lines
    if isinstance(exc, KeyError):
        lines.append(f"required field missing: {exc.args[0]} @ {path}")
        return lines
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, TypeError) and "missing" in msg and "required" in msg:
        msg = "required field missing: " + msg.split("missing", 1)[1].strip()
    lines.append(f"{msg} @ {path}")
    return lines


def structure(data: Any, cls: type, *, file: str | None = None, root: str = "$") -> Any:
    """Structure ``data`` into ``cls``; any problem becomes one FitplanError listing every error."""
    try:
        return CONVERTER.structure(data, cls)
    except FitplanError as e:
        raise FitplanError(e.message, file=file or e.file, field=e.field, value=e.value, suggestion=e.suggestion) from None
    except Exception as e:  # cattrs raises ExceptionGroups; flatten them
        lines = error_lines(e, root)
        if len(lines) == 1:
            msg, _, where = lines[0].rpartition(" @ ")
            raise FitplanError(msg, file=file, field=where) from None
        raise FitplanError(f"{len(lines)} errors", file=file, details=lines) from None
