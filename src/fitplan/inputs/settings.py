"""Settings declared by plugins: a scenario field stated once, with everything that derives from it.

A plugin declares a :class:`Setting` (through the ``fitplan_register_settings`` hook, docs/hooks.md): its
scenario section and name, type, default and bounds, the CLI flag's help, whether and how the recommender
searches it (:class:`Search`), the text a plan shows when it is on, and the keys of the files fitplan imports
that set it. The scenario (``inputs/scenario.py``: the field in its section, read as ``s.parallel.NAME``),
the CLI options and the page's form (``app/options.py``), the search space and the plan's fields
(``search/``), and the exports (``output/exports.py``: the scenario TOML) derive from the declarations.

The declarations are process-wide: every registry that collects them installs them here
(:func:`install`), and the first scenario that needs them asks the loader that ``fitplan/__init__.py`` sets
(the default registry), so that a scenario built without a registry in hand knows every installed plugin's
fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
from attrs import field, frozen

from fitplan.errors import FitplanError, PluginError
from fitplan.inputs.convert import CONVERTER, _strict_bool, _strict_number

TYPES = ("bool", "int", "float", "text")
RULE_TYPES = {"bool": "bool", "int": "number", "float": "number", "str": "text", "text": "text"}
"""A field's type as rule conditions name types (``inputs/names.py``)."""


def rule_type(annotation: Any) -> str:
    """A built-in field's annotation (resolved or not: ``"int | None"``, ``int``) as rule conditions name types
    (``number``, ``text``, ``bool``; ``any`` otherwise)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return RULE_TYPES.get(text.replace(" | None", ""), "any")


SEARCH_LEVELS = ("shard",)
"""The loop levels of the search (``search/staged.py`` ``LEVELS``) a setting can join: ``shard`` (the ZeRO stage
and offload, whose combinations ``search/space.py`` ``shard_options`` enumerates)."""


def _one_of(choices: tuple[Any, ...]) -> Callable[[Any, attrs.Attribute, Any], None]:
    def check(inst: Any, att: attrs.Attribute, value: Any) -> None:
        if value not in choices:
            raise PluginError(f"{type(inst).__name__}.{att.name} must be one of {', '.join(map(str, choices))}, got "
                              f"{value!r}", field=att.name, value=value)
    return check


def _always(option: Mapping[str, Any]) -> bool:
    return True


@frozen
class Search:
    """How the recommender searches a setting: the ``values`` it tries (the first is the simplest plan), at the
    loop ``level`` it joins (:data:`SEARCH_LEVELS`), the ``weight`` a step away from the first value adds to a
    plan's simplicity (plans of equal cost and time rank the simpler one first), which options of the level it
    ``allowed`` (a predicate of the level's choices and ``data_parallel``, the data-parallel degree:
    ``{"zero_stage": 3, "offload_optimizer": True, "offload_params": True, "data_parallel": 1}``), and the
    ``stack`` a value other than the first runs on (``deepspeed``: the precision must be one DeepSpeed runs;
    None: any)."""

    values: tuple[Any, ...] = field(converter=tuple)
    level: str = field(default="shard", validator=_one_of(SEARCH_LEVELS))
    weight: int = 1
    allowed: Callable[[Mapping[str, Any]], bool] = _always
    stack: str | None = field(default=None, validator=_one_of((None, "deepspeed")))  # type: ignore[arg-type]


@frozen
class Setting:
    """A scenario field declared by a plugin.

    :param name: the flat field name (unique across the scenario; the quantities' input of that name).
    :param section: the scenario section (TOML table) it belongs to: ``parallel``, ``training``, ...
    :param type: ``bool``, ``int``, ``float`` or ``text``.
    :param default: its value when nobody states one.
    :param help: the CLI flag's help (and the page's).
    :param choices: the values it may take (text), or ``()``: any value of its type.
    :param minimum: / :param maximum: the range of a number (inclusive).
    :param after: the section's field it follows in the TOML file, the ``--help`` list and the flat scenario
        (``None``: at the section's end).
    :param search: how the recommender searches it (``None``: it keeps the scenario's value).
    :param plan_label: what a plan's label and sharding column show when it is not the default.
    :param keys: ``{format: key}``: the keys of imported files that set it (``training_args``: a key of an HF
        TrainingArguments JSON).
    """

    name: str
    section: str
    type: str = field(default="bool", validator=_one_of(TYPES))
    default: Any = False
    help: str = ""
    choices: tuple[Any, ...] = field(default=(), converter=tuple)
    minimum: float | None = None
    maximum: float | None = None
    after: str | None = None
    search: Search | None = None
    plan_label: str = ""
    keys: Mapping[str, str] = field(factory=dict, converter=dict, hash=False)
    plugin: str = field(default="", eq=False)

    def where(self) -> str:
        """``Parallel.offload_params``: how errors name the field (as for the built-in fields)."""
        return f"{self.section.capitalize()}.{self.name}"

    def check(self, value: Any) -> Any:
        """``value`` as this setting takes it (a strict type, in range, one of the choices).

        :raises FitplanError: naming the field, the value and what is valid.
        """
        value, ok = _typed(self.type, value)
        if ok and self.choices and value not in self.choices:
            raise FitplanError(f"{self.where()} must be one of {', '.join(map(str, self.choices))}, got {value!r}",
                               field=self.name, value=value, suggestion="valid: " + ", ".join(map(str, self.choices)))
        if ok and self.type in ("int", "float"):
            low = -math.inf if self.minimum is None else self.minimum
            high = math.inf if self.maximum is None else self.maximum
            ok = low <= value <= high
        if not ok:
            raise FitplanError(f"{self.where()} must be {self.what()}, got {value!r:.60}", field=self.name, value=value)
        return value

    def what(self) -> str:
        """What a valid value is, in words."""
        words = {"bool": "true or false", "int": "an integer", "float": "a finite number", "text": "a text"}[self.type]
        if self.minimum is not None or self.maximum is not None:
            words += f" in [{'-inf' if self.minimum is None else f'{self.minimum:g}'}, " \
                     f"{'inf' if self.maximum is None else f'{self.maximum:g}'}]"
        return words


def _typed(kind: str, value: Any) -> tuple[Any, bool]:
    """``(value as the type takes it, whether it is one)``: a boolean, number or text read as the scenario's
    converter reads the built-in fields (``inputs/convert.py``: ``"true"`` is a boolean, ``"4"`` an integer)."""
    if kind == "text":
        return value, isinstance(value, str) and len(value) <= 256 and value.isprintable()
    try:
        value = _strict_bool(value) if kind == "bool" else _strict_number(value, int if kind == "int" else float)
    except ValueError:
        return value, False
    return value, kind != "float" or math.isfinite(value)


OWN_FIELDS: dict[str, frozenset[str]] = {}
"""Section -> the names of its own fields (filled by ``inputs/scenario.py``): what a setting may not be named."""
_INSTALLED: dict[str, Setting] = {}
_LOADER: list[Callable[[], None]] = []
_LOADING: list[bool] = []
VERSION = [0]
"""Grows on every :func:`install` that adds a setting (derived tables rebuild on a change)."""


def set_loader(load: Callable[[], None]) -> None:
    """What :func:`declared` calls once, before the first answer: loads the default registry (which installs
    its settings). Set by ``fitplan/__init__.py``."""
    _LOADER[:] = [load]


def declared() -> dict[str, Setting]:
    """Every installed setting by name (after the loader ran once)."""
    if _LOADER and not _LOADING:
        load = _LOADER.pop()
        _LOADING.append(True)
        try:
            load()
        finally:
            _LOADING.clear()
    return _INSTALLED


def install(settings: Iterable[Setting], report: Callable[[PluginError], None]) -> None:
    """Add ``settings`` to the process-wide table (what a registry does as a plugin registers one); ``report``
    receives each problem, naming the plugin: a section the scenario does not have, a name the scenario already
    has, or one another plugin declared (differently)."""
    taken = set().union(*OWN_FIELDS.values()) | {"extra"}
    for s in settings:
        prev = _INSTALLED.get(s.name)
        if installed(s):
            continue
        if prev is not None:
            why = f"setting {s.name!r} is declared by plugin {prev.plugin!r} and again by plugin {s.plugin!r}"
        elif s.section not in OWN_FIELDS:
            why = f"plugin {s.plugin!r}: setting {s.name!r} names section {s.section!r} (sections: {', '.join(OWN_FIELDS)})"
        elif s.name in taken:
            why = f"plugin {s.plugin!r}: setting {s.name!r} is already a scenario field"
        elif not s.name.isidentifier() or s.name.startswith("_"):
            why = f"plugin {s.plugin!r}: setting {s.name!r} is no field name (a Python identifier such as monitor_agent)"
        elif (bad := _bad_default(s)) is not None:
            why = f"plugin {s.plugin!r}: setting {s.name!r} has a default it refuses: {bad}"
        else:
            _INSTALLED[s.name] = s
            VERSION[0] += 1
            continue
        report(PluginError(why, field="fitplan_register_settings", value=s.name))


def _bad_default(s: Setting) -> str | None:
    try:
        s.check(s.default)
    except FitplanError as e:
        return e.message
    return None


def restore_point() -> Callable[[], None]:
    """A function that puts the table of installed settings back as it is now (tests: a registry built with a
    plugin installs its settings for the whole process; ``fitplan.testing``'s fixtures undo that)."""
    saved = dict(_INSTALLED)

    def restore() -> None:
        _INSTALLED.clear()
        _INSTALLED.update(saved)
        VERSION[0] += 1
    return restore


def installed(s: Setting) -> bool:
    """Whether ``s`` (by the same plugin) is the installed setting of its name."""
    prev = _INSTALLED.get(s.name)
    return prev is not None and prev == s and prev.plugin == s.plugin


def in_section(section: str) -> list[Setting]:
    """The settings of one section, in declaration order."""
    return [s for s in declared().values() if s.section == section]


def searched(level: str) -> list[Setting]:
    """The settings the recommender searches at loop ``level``."""
    return [s for s in declared().values() if s.search is not None and s.search.level == level]


def plan_labels(fields: Mapping[str, Any]) -> list[str]:
    """The ``plan_label`` of each searched setting that a plan's ``fields`` set to another value than its default
    (``offload params``), for the plan's label and the report's sharding column."""
    return [s.plan_label for s in declared().values()
            if s.search is not None and s.plan_label and fields.get(s.name, s.default) != s.default]


class Values(Mapping[str, Any]):
    """A section's plugin settings that differ from their defaults, each checked by its declaration (hashable,
    equal whatever was stated explicitly at its default)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        table = declared() if items else {}
        checked = {k: table[k].check(v) for k, v in (items or {}).items()}  # KeyError: no such setting
        self._items = tuple(sorted((k, v) for k, v in checked.items() if v != table[k].default))

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Values) and self._items == other._items

    def __repr__(self) -> str:
        return f"Values({dict(self._items)!r})"


NONE = Values()
"""No setting stated (shared: a :class:`Values` never changes)."""
CONVERTER.register_structure_hook(Values, lambda v, _: v)


class LiveTable(Mapping[str, Any]):
    """A table derived from the scenario's fields, plugin settings included: rebuilt when a setting is installed
    (``FIELD_SECTION``, ``CHOICES``, ``FIELD_TYPES`` of ``inputs/scenario.py``)."""

    __slots__ = ("_build", "_table", "_version")

    def __init__(self, build: Callable[[], dict[str, Any]]) -> None:
        self._build = build
        self._table: dict[str, Any] = {}
        self._version = -1

    def current(self) -> dict[str, Any]:
        """The table now (a plain dict: for loops over many keys)."""
        if _LOADER or self._version != VERSION[0]:
            declared()
            self._table, self._version = self._build(), VERSION[0]
        return self._table

    def __getitem__(self, key: str) -> Any:
        return self.current()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.current().get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.current())

    def __len__(self) -> int:
        return len(self.current())

    def __contains__(self, key: object) -> bool:
        return key in self.current()


class Section:
    """The base of a scenario section: its plugin settings (kept in its ``extra`` field) read as attributes, the
    stated value or the setting's default (``s.parallel.offload_params``). A section's name is its class's,
    lowercased."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "extra":
            raise AttributeError(name)
        setting = declared().get(name)
        if setting is None or setting.section != type(self).__name__.lower():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.extra.get(name, setting.default)  # type: ignore[attr-defined]


def extra_field() -> Any:
    """The ``extra`` field of every section: its plugin settings that differ from their defaults."""
    return field(default=NONE, converter=lambda v: v if isinstance(v, Values) else Values(v), repr=False,
                 kw_only=True)


def ordered(own: list[Any], section: str) -> list[Any]:
    """A section's own fields and its settings, each after the field it names (``after``), the others at the
    end: the order of the TOML file, ``--help`` and the flat scenario."""
    out: list[Any] = list(own)
    for s in in_section(section):
        names = [f.name for f in out]
        out.insert(names.index(s.after) + 1 if s.after in names else len(out), s)
    return out


def split(nested: dict[str, Any], file: str | None) -> dict[str, Any]:
    """``{"section": {field: value}}`` with each section's plugin settings checked and moved into its ``extra``
    (which the scenario's converter takes as it is: :data:`fitplan.inputs.convert.CONVERTER`).

    :raises FitplanError: a setting's value is not what it declares, naming the file and the field.
    """
    table = declared()
    own: dict[str, Any] = {}
    for section, values in nested.items():
        if isinstance(values, dict) and "extra" in values:  # where the settings are kept, not a key of the file
            raise FitplanError(f"unknown key 'extra' in section {section!r}", file=file, field=f"$.{section}.extra",
                               suggestion=f"the fields of [{section}]: `fitplan estimate --help`")
        mine = {k for k in values if k in table and table[k].section == section} if isinstance(values, dict) else ()
        if not mine:
            own[section] = values
            continue
        try:
            extra = Values({k: values[k] for k in mine})
        except FitplanError as e:
            raise FitplanError(e.message, file=file, field=e.field, value=e.value, suggestion=e.suggestion) from None
        own[section] = {**{k: v for k, v in values.items() if k not in mine}, "extra": extra}
    return own
