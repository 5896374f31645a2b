"""Errors a user can cause.

Every error that bad input can trigger is a :class:`FitplanError`: it names where the
bad value came from (file, field), the value itself, and what would be valid. The CLI
prints it without a traceback and exits with status 2.
"""

from __future__ import annotations

from collections.abc import Iterable


class FitplanError(Exception):
    """An error caused by the user's input, a ruleset or a plugin.

    :param message: what is wrong, in one sentence.
    :param file: the file the value came from, if any.
    :param field: the dotted field name or JSON-path-like location (``$.training.optim``).
    :param value: the offending value.
    :param suggestion: what would be valid ("did you mean ...?", an allowed range).
    """

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        value: object = None,
        suggestion: str | None = None,
        details: Iterable[str] = (),
    ) -> None:
        self.message = message
        self.file = file
        self.field = field
        self.value = value
        self.suggestion = suggestion
        self.details = list(details)
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.file}: " if self.file else ""
        text = f"{head}{self.message}"
        if self.field:
            text += f" @ {self.field}"
        if self.suggestion:
            text += f" ({self.suggestion})"
        if self.details:
            text += "\n" + "\n".join(f"  {d}" for d in self.details)
        return text


class PluginError(FitplanError):
    """A plugin misbehaved: raised, returned the wrong type, or declared something invalid."""


class GraphError(FitplanError):
    """The quantity graph cannot be built (duplicate, unbound dependency, cycle)."""


def did_you_mean(name: str, candidates: Iterable[str], *, n: int = 3) -> str | None:
    """A "did you mean" suggestion for ``name`` among ``candidates``, or None (none for a name longer than 100
    characters: difflib's matching is quadratic in the length)."""
    if len(name) > 100:
        return None
    pool = sorted(c for c in set(candidates) if len(c) <= 200)
    import difflib  # only when a name is unknown: not on every command's start

    close = difflib.get_close_matches(name, pool, n=n, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in pool}
        close = [lowered[c] for c in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)]
    if not close:
        return None
    return "did you mean " + " or ".join(repr(c) for c in close) + "?"


def unknown(kind: str, name: str, candidates: Iterable[str], *, file: str | None = None, field: str | None = None) -> FitplanError:
    """A :class:`FitplanError` for an unknown name, with a suggestion or the list of valid names."""
    pool = sorted(set(candidates))
    hint = did_you_mean(name, pool)
    if hint is None:
        shown = ", ".join(pool[:12]) + (", ..." if len(pool) > 12 else "")
        hint = f"known: {shown}" if pool else None
    return FitplanError(f"unknown {kind} {name!r}", file=file, field=field, value=name, suggestion=hint)
