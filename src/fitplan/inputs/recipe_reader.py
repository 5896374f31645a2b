"""One recipe being read (:mod:`.recipes` says which framework's reader reads it): the rule every reader follows.

* a key fitplan models becomes a field (its value checked: a wrong type is a ``FitplanError`` naming the file,
  the key and the value);
* a key that changes memory or time and that fitplan cannot model is refused by name (:meth:`Recipe.refuse`);
* a key known to change neither (paths, logging, learning rates, schedules) is listed in one warning as
  ignored;
* a key the reader does not know is named in a warning (fitplan cannot tell what it changes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fitplan.errors import FitplanError


class Recipe:
    """One recipe being read: its keys, the fields made of them, and the warnings (module doc)."""

    def __init__(self, data: dict[str, Any], path: str, name: str, known_optimizers: Any = None,
                 checks: list[Any] | None = None) -> None:
        self.data, self.path, self.name = data, path, name
        self.known_optimizers = known_optimizers
        self.checks = checks
        self.fields: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.seen: set[str] = set()
        self.ignored: list[str] = []

    # ------------------------------------------------------------------ values, checked
    def has(self, key: str) -> bool:
        """The key is present with a value (YAML's empty ``key:`` is None: absent, as the frameworks read it)."""
        return self.value(key) is not None

    def value(self, key: str) -> Any:
        """The raw value at the dotted ``key`` (None: absent); marks the top-level key as read."""
        self.seen.add(key.split(".", 1)[0])
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict):
                return None
            node = node.get(part)
        return node

    def bad(self, key: str, message: str, suggestion: str | None = None) -> FitplanError:
        return FitplanError(message, file=self.path, field=f"$.{key}", value=self.value(key), suggestion=suggestion)

    def integer(self, key: str) -> int | None:
        """A positive integer (None: absent)."""
        v = self.value(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise self.bad(key, f"{key} must be a positive integer, got {v!r}")
        return v

    def number(self, key: str) -> float | None:
        """A number > 0 (YAML reads ``3.0`` and ``1e-4``; None: absent)."""
        v = self.value(key)
        if v is None:
            return None
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise self.bad(key, f"{key} must be a number, got {v!r}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise self.bad(key, f"{key} must be a number > 0, got {v!r}")
        return float(v)

    def probability(self, key: str) -> float | None:
        """A dropout probability in [0, 1) (None: absent)."""
        v = self.value(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise self.bad(key, f"{key} must be a probability in [0, 1), got {v!r}")
        return float(v)

    def flag(self, key: str, default: bool | None = None) -> bool | None:
        """true / false (YAML's ``True``, ``true``); None: absent."""
        v = self.value(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.bad(key, f"{key} must be true or false, got {v!r}")
        return v

    def text(self, key: str) -> str | None:
        v = self.value(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self.bad(key, f"{key} must be a string, got {v!r}")
        return v

    def names(self, key: str) -> tuple[str, ...] | None:
        """A list of module names, or one comma-separated string (None: absent or empty)."""
        v = self.value(key)
        if v is None:
            return None
        if isinstance(v, str):
            v = [x.strip() for x in v.split(",") if x.strip()]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.bad(key, f"{key} must be a list of module names, got {v!r}")
        return tuple(v) or None

    # ------------------------------------------------------------------ the rule (module doc)
    def set(self, field: str, value: Any) -> None:
        if value is not None:
            self.fields[field] = value

    def optim(self, key: str, name: str) -> None:
        """An HF ``optim`` name, checked against the optimizers fitplan knows."""
        if self.known_optimizers is not None and name not in self.known_optimizers:
            from fitplan.errors import did_you_mean

            raise self.bad(key, f"optimizer {name!r} is not one fitplan models",
                           did_you_mean(name, self.known_optimizers) or "see `fitplan plugins` for the optimizers")
        self.fields["optim"] = name

    def refuse(self, key: str, why: str, suggestion: str | None = None) -> FitplanError:
        """The error for a key that changes memory or time and that fitplan does not model."""
        v = self.value(key)
        return FitplanError(f"{self.name} {key} = {v!r}: {why}; fitplan does not model it", file=self.path,
                            field=f"$.{key}", value=v, suggestion=suggestion or f"remove {key} to estimate without it")

    def refuse_if(self, key: str, bad: Any, why: str) -> None:
        """Refuse ``key`` when ``bad(value)`` holds for its (present) value."""
        v = self.value(key)
        if v is not None and bad(v):
            raise self.refuse(key, why)

    def ignore(self, *keys: str) -> None:
        """Keys that change neither memory nor time (listed in one warning when present)."""
        for key in keys:
            if key in self.data:
                self.seen.add(key)
                self.ignored.append(key)

    def warn(self, text: str) -> None:
        self.warnings.append(f"{self.path}: {text}")

    def finish(self) -> None:
        """The warnings for the ignored keys and for the keys no reader knows."""
        if self.ignored:
            self.warn("ignored (they change neither memory nor time): " + ", ".join(sorted(self.ignored)))
        unknown = sorted(k for k in self.data if k not in self.seen)
        if unknown:
            self.warn(f"not recognised as {self.name} keys (fitplan cannot tell whether they change memory or time): "
                      + ", ".join(unknown))

    def resolve_path(self, key: str) -> Path:
        """A file the recipe names (a DeepSpeed config): relative to the recipe's folder, else to the current one."""
        v = self.text(key)
        p = Path(v)
        if not p.is_absolute():
            beside = Path(self.path).parent / p
            p = beside if beside.exists() or not p.exists() else p
        if not p.exists():
            raise self.bad(key, f"{key} names {v!r}, which is neither beside the recipe nor in the current folder")
        return p

    def deepspeed(self, key: str, *, bf16: bool, fp16: bool) -> None:
        """A DeepSpeed config path: read as ``--deepspeed`` reads it, with the recipe's bf16 / fp16."""
        from fitplan.inputs.importers import deepspeed_fields

        fields = deepspeed_fields(self.resolve_path(key), bf16=bf16, fp16=fp16, warnings=self.warnings,
                                  checks=self.checks)
        self.fields.update(fields)
