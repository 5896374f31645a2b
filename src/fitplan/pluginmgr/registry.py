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

from fitplan.pluginmgr import hookspecs
from fitplan.engine.declarations import OptimizerSpec, Quantity, Reducer
from fitplan.errors import PluginError

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
    _ruleset_dirs: dict[str, list[str]] | None = None

    # ------------------------------------------------------------------ declarations

    def _call_each(self, hook_name: str, kwargs: dict[str, Any]) -> Iterable[tuple[str, Any]]:
        hook = getattr(self.pm.hook, hook_name)
        for impl in hook.get_hookimpls():  # registration order (pluggy calls them last-registered first)
            name = self.pm.get_name(impl.plugin) or repr(impl.plugin)
            try:
                result = impl.function(*[kwargs[a] for a in impl.argnames])
            except PluginError as e:
                self.add_error(e)
                continue
            except Exception as e:  # noqa: BLE001 - isolate third-party failures
                self.add_error(PluginError(f"plugin {name!r} raised {type(e).__name__}: {e} in {hook_name}",
                                           field=hook_name, value=name, suggestion=f"block it with {BLOCK_ENV}={name}"))
                continue
            yield name, result

    def add_error(self, error: PluginError) -> None:
        """Record a plugin problem once (hooks may be called again, e.g. by ``fitplan plugins``)."""
        if all(e.render() != error.render() for e in self.errors):
            self.errors.append(error)

    def collect(self) -> None:
        def registrar(kind: type, sink: Callable[[Any, str], None], plugin: list[str], hook: str) -> Callable[[Any], None]:
            def register(item: Any) -> None:
                if not isinstance(item, kind):
                    what = getattr(item, "__name__", None) or getattr(item, "name", None)
                    self.add_error(PluginError(
                        f"plugin {plugin[0]!r} registered a {type(item).__name__}"
                        + (f" ({what!r})" if isinstance(what, str) else "")
                        + f" in {hook}, expected a fitplan.{kind.__name__}",
                        field=hook, value=repr(item)[:80], suggestion=_BUILD_HINT[kind.__name__]))
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
            problem = _probe_optimizer(o)
            if problem:
                self.add_error(PluginError(f"plugin {plugin!r}: optimizer {o.name!r} {problem}", field="optim", value=o.name,
                                           suggestion=f"block it with {BLOCK_ENV}={plugin}"))
                return
            for key in (o.name, *o.aliases):
                prev = self.optimizers.get(self.optimizer_aliases.get(key, key))
                if prev is not None:
                    self.add_error(PluginError(
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
            for impl in hookc.get_hookimpls():  # registration order
                current[0] = self.pm.get_name(impl.plugin) or repr(impl.plugin)
                reg = registrar(kind, sink, current, hook)
                try:
                    out = impl.function(*[{"register": reg}[a] for a in impl.argnames])
                except Exception as e:  # noqa: BLE001
                    self.add_error(PluginError(
                        f"plugin {current[0]!r} raised {type(e).__name__}: {e} in {hook}", field=hook, value=current[0],
                        suggestion=f"block it with {BLOCK_ENV}={current[0]}"))
                    continue
                if out is not None:
                    self.add_error(PluginError(
                        f"plugin {current[0]!r} returned {type(out).__name__} from {hook}; declarations go through register()",
                        field=hook, value=current[0]))

    def ruleset_dirs(self) -> list[str]:
        """Every plugin's ruleset directories, in registration order (see :meth:`ruleset_dirs_by_plugin`)."""
        return [d for dirs in self.ruleset_dirs_by_plugin().values() for d in dirs]

    def ruleset_dirs_by_plugin(self) -> dict[str, list[str]]:
        """plugin name -> the ruleset directories it ships (checked once: a missing directory or an invalid
        ruleset file is a problem naming the plugin)."""
        if self._ruleset_dirs is not None:
            return self._ruleset_dirs
        from fitplan.rulesets.loader import check_paths

        out: dict[str, list[str]] = {}
        for name, result in self._call_each("fitplan_ruleset_dirs", {}):
            if result is None:
                continue
            if isinstance(result, (str, os.PathLike)) or not isinstance(result, (list, tuple)):
                self.add_error(PluginError(f"plugin {name!r} returned {type(result).__name__} from fitplan_ruleset_dirs, expected a list of paths",
                                           field="fitplan_ruleset_dirs", value=name))
                continue
            good: list[str] = []
            for d in result:
                if not isinstance(d, (str, os.PathLike)):
                    self.add_error(PluginError(f"plugin {name!r} returned {type(d).__name__} {d!r} in its fitplan_ruleset_dirs list, expected a path",
                                               field="fitplan_ruleset_dirs", value=name))
                    continue
                if not os.path.isdir(d):
                    self.add_error(PluginError(f"plugin {name!r} ships ruleset directory {str(d)!r}, which does not exist",
                                               field="fitplan_ruleset_dirs", value=str(d), suggestion=f"block it with {BLOCK_ENV}={name}"))
                    continue
                problems = check_paths([d])
                if problems:
                    self.add_error(PluginError(f"plugin {name!r} ships an invalid ruleset directory {str(d)!r}",
                                               field="fitplan_ruleset_dirs", value=str(d), details=problems,
                                               suggestion=f"block it with {BLOCK_ENV}={name}"))
                    continue
                good.append(str(d))
            out[name] = good
        self._ruleset_dirs = out
        return out

    def raise_errors(self) -> None:
        if self.errors:
            if len(self.errors) == 1:
                raise self.errors[0]
            raise PluginError(f"{len(self.errors)} plugin problems", details=[e.render() for e in self.errors],
                              suggestion=f"block a faulty plugin with {BLOCK_ENV}=NAME")

    def compiled(self):
        """The quantity graph, compiled once per registry."""
        if self._compiled is None:
            from fitplan.engine.graph import compile_graph

            self._compiled = compile_graph(self.quantities, self.reducers)
        return self._compiled

    def plugin_names(self) -> list[str]:
        return [n for n, p in self.pm.list_name_plugin() if p is not None]

    def resolve_optimizer(self, name: str) -> OptimizerSpec:
        key = self.optimizer_aliases.get(name, name)
        if key in self.optimizers:
            return self.optimizers[key]
        from fitplan.errors import unknown

        raise unknown("optimizer", name, [*self.optimizers, *self.optimizer_aliases], field="--optim")


def make_registry(*, blocked: Iterable[str] | None = None, entry_points: bool | Iterable[str] = True,
                  extra_plugins: Iterable[tuple[str, object]] = ()) -> Registry:
    """Build a plugin manager, load entry points then built-ins, and collect declarations.

    Nothing here raises for a faulty plugin: every problem (a plugin that fails to import, implements
    an unknown hook, raises, returns or registers the wrong type, declares a duplicate optimizer, ships
    a missing or invalid ruleset directory) is recorded in :attr:`Registry.errors`, naming the plugin.
    Graph problems (duplicate or cyclic quantities, unknown targets) surface in :meth:`Registry.compiled`.

    :param blocked: plugin names not to load (default: from ``FITPLAN_BLOCK_PLUGINS``).
    :param entry_points: load third-party plugins from the ``fitplan`` entry-point group: ``True`` for
        all of them, ``False`` for none, or the names of the entry points to load (tests).
    :param extra_plugins: ``(name, plugin object)`` pairs registered after the built-ins (tests).
    """
    blocked_set = frozenset(blocked) if blocked is not None else blocked_from_env()
    pm = pluggy.PluginManager("fitplan")
    pm.add_hookspecs(hookspecs)
    reg = Registry(pm=pm, blocked=blocked_set)
    for name in blocked_set:
        pm.set_blocked(name)
    if entry_points:
        wanted = None if entry_points is True else set(entry_points)
        found: set[str] = set()
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if wanted is not None and ep.name not in wanted:
                continue
            found.add(ep.name)
            if pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
                pm.register(plugin, name=ep.name)
            except Exception as e:  # noqa: BLE001 - a broken third-party plugin must not take the rest down
                reg.add_error(PluginError(
                    f"plugin {ep.name!r} ({ep.value}) failed to load: {type(e).__name__}: {e}",
                    value=ep.name, suggestion=f"block it with {BLOCK_ENV}={ep.name}"))
        for name in sorted((wanted or set()) - found):
            reg.add_error(PluginError(f"no installed distribution declares a {ENTRY_POINT_GROUP!r} entry point named {name!r}",
                                      value=name, suggestion="pip install the plugin's distribution (pip install -e path/to/it)"))
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
                reg.add_error(PluginError(f"plugin {name!r} failed to register: {e}", value=name,
                                          suggestion=f"block it with {BLOCK_ENV}={name}"))
    for error in _unknown_hooks(pm):
        reg.add_error(error)
    reg.collect()
    reg.ruleset_dirs_by_plugin()
    return reg


_BUILD_HINT = {
    "Quantity": "build one with @fitplan.quantity(unit) on a function, or fitplan.Quantity(name=..., func=..., unit=...)",
    "Reducer": "build one with @fitplan.reducer(target, when=...) on a function, or fitplan.Reducer(...)",
    "OptimizerSpec": "build one with fitplan.OptimizerSpec(name=..., state_bytes=..., doc=...)",
}

_PROBE = None


def _probe_optimizer(spec: OptimizerSpec) -> str | None:
    """Call an optimizer's byte functions on a small context (a 2-D matrix and a vector, both
    repeated): a problem described in words, or None. Catches a spec that raises or returns a
    non-number before any estimate does."""
    import numbers

    from fitplan.engine.declarations import OptimizerContext

    global _PROBE
    if _PROBE is None:
        _PROBE = OptimizerContext(tensors=(((64, 32), 2), ((32,), 2), ((1000, 32), 1)), state_bytes=4, param_bytes=4)
    for attr in ("state_bytes", "step_temp_bytes"):
        fn = getattr(spec, attr)
        if not callable(fn):
            return f"has a non-callable {attr} ({type(fn).__name__}); it must be a function of an OptimizerContext"
        try:
            value = fn(_PROBE)
        except Exception as e:  # noqa: BLE001 - report, do not crash
            return f"raised {type(e).__name__}: {e} in {attr}(OptimizerContext)"
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
            return f"returned {value!r} ({type(value).__name__}) from {attr}, expected a number of bytes >= 0"
    if isinstance(spec.flops_per_param, bool) or not isinstance(spec.flops_per_param, numbers.Real):
        return f"has flops_per_param {spec.flops_per_param!r}, expected a number"
    if not isinstance(spec.name, str) or not spec.name:
        return "has no name"
    return None


def _unknown_hooks(pm: pluggy.PluginManager) -> list[PluginError]:
    """Like ``pm.check_pending()``, but every hook implementation without a spec, each naming its plugin."""
    out = []
    for hook_name in sorted(vars(pm.hook)):
        if hook_name.startswith("_"):
            continue
        caller = getattr(pm.hook, hook_name)
        if caller.has_spec():
            continue
        from fitplan.errors import did_you_mean

        known = [n for n in vars(pm.hook) if not n.startswith("_") and getattr(pm.hook, n).has_spec()]
        for impl in caller.get_hookimpls():
            if impl.optionalhook:
                continue
            out.append(PluginError(f"plugin {impl.plugin_name!r} implements unknown hook {hook_name!r}",
                                   field=hook_name, value=impl.plugin_name,
                                   suggestion=did_you_mean(hook_name, known) or "see fitplan.pluginmgr.hookspecs"))
    return out


_DEFAULT: dict[frozenset[str], Registry] = {}


def default_registry() -> Registry:
    """The process-wide registry for the current ``FITPLAN_BLOCK_PLUGINS`` (built once)."""
    key = blocked_from_env()
    if key not in _DEFAULT:
        _DEFAULT[key] = make_registry(blocked=key)
    return _DEFAULT[key]
