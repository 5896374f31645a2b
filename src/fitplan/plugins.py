"""The plugin registry: loading plugins and collecting what they declare.

Built-in plugins are the modules in :data:`BUILTIN_PLUGINS`, registered after entry points
(group ``fitplan``) exactly like third-party plugins. ``FITPLAN_BLOCK_PLUGINS`` (comma-separated
plugin names) keeps named plugins from loading, built-in or not.

Each hook implementation is called on its own, so a plugin that raises or returns the wrong
type is reported by name (a :class:`~fitplan.errors.PluginError`) instead of breaking the rest.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pluggy

from . import hookspecs
from .declarations import OptimizerSpec, Quantity, Reducer
from .errors import PluginError

BUILTIN_PLUGINS: tuple[str, ...] = (
    "fitplan.builtin.inputs",
    "fitplan.builtin.precision",
    "fitplan.builtin.model_states",
    "fitplan.builtin.optimizers",
    "fitplan.builtin.activations",
    "fitplan.builtin.lora",
    "fitplan.builtin.sharding",
    "fitplan.builtin.overhead",
    "fitplan.builtin.peak",
    "fitplan.builtin.time",
    "fitplan.builtin.cost",
    "fitplan.builtin.seed",
)
ENTRY_POINT_GROUP = "fitplan"
BLOCK_ENV = "FITPLAN_BLOCK_PLUGINS"


def blocked_from_env() -> frozenset[str]:
    return frozenset(x.strip() for x in os.environ.get(BLOCK_ENV, "").split(",") if x.strip())


@attrs.define
class Registry:
    """A plugin manager and everything its plugins declared."""

    pm: pluggy.PluginManager
    quantities: list[Quantity] = attrs.Factory(list)
    reducers: list[Reducer] = attrs.Factory(list)
    optimizers: dict[str, OptimizerSpec] = attrs.Factory(dict)
    optimizer_aliases: dict[str, str] = attrs.Factory(dict)
    errors: list[PluginError] = attrs.Factory(list)
    blocked: frozenset[str] = frozenset()
    _compiled: Any = None

    # ------------------------------------------------------------------ declarations

    def _call_each(self, hook_name: str, kwargs: dict[str, Any]) -> Iterable[tuple[str, Any]]:
        hook = getattr(self.pm.hook, hook_name)
        for impl in reversed(hook.get_hookimpls()):  # registration order
            name = self.pm.get_name(impl.plugin) or repr(impl.plugin)
            try:
                result = impl.function(*[kwargs[a] for a in impl.argnames])
            except PluginError as e:
                self.errors.append(e)
                continue
            except Exception as e:  # noqa: BLE001 - isolate third-party failures
                self.errors.append(PluginError(f"plugin {name!r} raised {type(e).__name__}: {e} in {hook_name}",
                                               field=hook_name, value=name))
                continue
            yield name, result

    def collect(self) -> None:
        def registrar(kind: type, sink: Callable[[Any, str], None], plugin: list[str]) -> Callable[[Any], None]:
            def register(item: Any) -> None:
                if not isinstance(item, kind):
                    self.errors.append(PluginError(
                        f"plugin {plugin[0]!r} registered a {type(item).__name__}, expected {kind.__name__}",
                        value=repr(item)[:80]))
                    return
                sink(item, plugin[0])
            return register

        current = [""]

        def add_quantity(q: Quantity, plugin: str) -> None:
            self.quantities.append(attrs.evolve(q, plugin=plugin))

        def add_reducer(r: Reducer, plugin: str) -> None:
            self.reducers.append(attrs.evolve(r, plugin=plugin))

        def add_optimizer(o: OptimizerSpec, plugin: str) -> None:
            o = attrs.evolve(o, plugin=plugin)
            for key in (o.name, *o.aliases):
                prev = self.optimizers.get(self.optimizer_aliases.get(key, key))
                if prev is not None:
                    self.errors.append(PluginError(
                        f"optimizer {key!r} is declared twice: by plugin {prev.plugin!r} and by plugin {plugin!r}",
                        field="optim", value=key, suggestion=f"block one with {BLOCK_ENV}"))
                    return
            self.optimizers[o.name] = o
            for a in o.aliases:
                self.optimizer_aliases[a] = o.name

        for hook, kind, sink in (
            ("fitplan_register_quantities", Quantity, add_quantity),
            ("fitplan_register_reducers", Reducer, add_reducer),
            ("fitplan_register_optimizers", OptimizerSpec, add_optimizer),
        ):
            hookc = getattr(self.pm.hook, hook)
            for impl in reversed(hookc.get_hookimpls()):
                current[0] = self.pm.get_name(impl.plugin) or repr(impl.plugin)
                reg = registrar(kind, sink, current)
                try:
                    out = impl.function(*[{"register": reg}[a] for a in impl.argnames])
                except Exception as e:  # noqa: BLE001
                    self.errors.append(PluginError(
                        f"plugin {current[0]!r} raised {type(e).__name__}: {e} in {hook}", field=hook, value=current[0],
                        suggestion=f"block it with {BLOCK_ENV}={current[0]}"))
                    continue
                if out is not None:
                    self.errors.append(PluginError(
                        f"plugin {current[0]!r} returned {type(out).__name__} from {hook}; declarations go through register()",
                        field=hook, value=current[0]))

    def ruleset_dirs(self) -> list[str]:
        dirs: list[str] = []
        for name, result in self._call_each("fitplan_ruleset_dirs", {}):
            if result is None:
                continue
            if isinstance(result, (str, os.PathLike)) or not isinstance(result, (list, tuple)):
                self.errors.append(PluginError(f"plugin {name!r} returned {type(result).__name__} from fitplan_ruleset_dirs, expected a list of paths",
                                               field="fitplan_ruleset_dirs", value=name))
                continue
            dirs.extend(str(d) for d in result)
        return dirs

    def raise_errors(self) -> None:
        if self.errors:
            if len(self.errors) == 1:
                raise self.errors[0]
            raise PluginError(f"{len(self.errors)} plugin problems", details=[e.render() for e in self.errors],
                              suggestion=f"block a faulty plugin with {BLOCK_ENV}=NAME")

    def compiled(self):
        """The quantity graph, compiled once per registry."""
        if self._compiled is None:
            from .graph import compile_graph

            self._compiled = compile_graph(self.quantities, self.reducers)
        return self._compiled

    def plugin_names(self) -> list[str]:
        return [n for n, _ in self.pm.list_name_plugin()]

    def resolve_optimizer(self, name: str) -> OptimizerSpec:
        key = self.optimizer_aliases.get(name, name)
        if key in self.optimizers:
            return self.optimizers[key]
        from .errors import unknown

        raise unknown("optimizer", name, [*self.optimizers, *self.optimizer_aliases], field="--optim")


def make_registry(*, blocked: Iterable[str] | None = None, entry_points: bool = True,
                  extra_plugins: Iterable[tuple[str, object]] = ()) -> Registry:
    """Build a plugin manager, load entry points then built-ins, and collect declarations.

    :param blocked: plugin names not to load (default: from ``FITPLAN_BLOCK_PLUGINS``).
    :param entry_points: load third-party plugins from the ``fitplan`` entry-point group.
    :param extra_plugins: ``(name, plugin object)`` pairs registered after the built-ins (tests).
    """
    blocked_set = frozenset(blocked) if blocked is not None else blocked_from_env()
    pm = pluggy.PluginManager("fitplan")
    pm.add_hookspecs(hookspecs)
    reg = Registry(pm=pm, blocked=blocked_set)
    for name in blocked_set:
        pm.set_blocked(name)
    if entry_points:
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
                pm.register(plugin, name=ep.name)
            except Exception as e:  # noqa: BLE001 - a broken third-party plugin must not take the rest down
                reg.errors.append(PluginError(
                    f"plugin {ep.name!r} ({ep.value}) failed to load: {type(e).__name__}: {e}",
                    value=ep.name, suggestion=f"block it with {BLOCK_ENV}={ep.name}"))
    for modname in BUILTIN_PLUGINS:
        short = modname.rsplit(".", 1)[1]
        if pm.is_blocked(modname) or pm.is_blocked(short):
            continue
        pm.register(importlib.import_module(modname), name=modname)
    for name, plugin in extra_plugins:
        if not pm.is_blocked(name):
            try:
                pm.register(plugin, name=name)
            except Exception as e:  # noqa: BLE001
                reg.errors.append(PluginError(f"plugin {name!r} failed to register: {e}", value=name))
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        reg.errors.append(PluginError(f"plugin {e.plugin_name!r}: {e}", value=e.plugin_name))
    reg.collect()
    return reg


_DEFAULT: dict[frozenset[str], Registry] = {}


def default_registry() -> Registry:
    """The process-wide registry for the current ``FITPLAN_BLOCK_PLUGINS`` (built once)."""
    key = blocked_from_env()
    if key not in _DEFAULT:
        _DEFAULT[key] = make_registry(blocked=key)
    return _DEFAULT[key]
