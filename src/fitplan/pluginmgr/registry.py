"""The plugin registry: loading plugins and collecting what they declare.

Built-in plugins are the modules in :data:`BUILTIN_PLUGINS`, loaded after the entry points (group
``fitplan``) and registered exactly like third-party plugins; the built-in commands and output formats come through the
same hooks. ``FITPLAN_BLOCK_PLUGINS`` (comma-separated plugin names) keeps named plugins from loading,
except the :data:`ESSENTIAL` ones the rest of fitplan cannot work without (blocking one, or naming a
plugin that does not exist, is an error).

Hooks are called through pluggy (``pm.hook``), so its call order, ``tryfirst`` / ``trylast``, wrappers and
``firstresult`` work as pluggy documents. The plugins are registered so that pluggy (which calls the last
registered first) calls the built-in ones first, in :data:`BUILTIN_PLUGINS` order, then the entry points by
name, then the ``extra_plugins`` of tests. Each implementation is guarded (:mod:`.guard`), so a plugin that
raises (``SystemExit`` included), returns the wrong type or declares a duplicate is reported by name (a
:class:`~fitplan.errors.PluginError`) instead of breaking the rest. A ``KeyboardInterrupt`` stops fitplan, as
the user asked.
"""

from __future__ import annotations

import importlib
import numbers
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pluggy

from fitplan.engine.declarations import Name, Quantity, Reducer
from fitplan.errors import PluginError, did_you_mean
from fitplan.inputs.optimizer import OptimizerContext, OptimizerSpec
from fitplan.inputs.settings import Setting, install
from fitplan.output.formats import OutputFormat, ReportSection
from fitplan.pluginmgr import discovery, hookspecs
from fitplan.pluginmgr.guard import BLOCK_ENV, Guard, interrupt
from fitplan.pluginmgr.manager import PluginManager

BUILTIN_PLUGINS: tuple[str, ...] = (
    "fitplan.builtin.inputs",
    "fitplan.builtin.precision",
    "fitplan.builtin.model_states",
    "fitplan.builtin.optimizers",
    "fitplan.builtin.activations",
    "fitplan.builtin.lora",
    "fitplan.builtin.sharding",
    "fitplan.builtin.peak",
    "fitplan.builtin.overhead",
    "fitplan.builtin.trl.preference",
    "fitplan.builtin.trl.reward",
    "fitplan.builtin.trl.reference_free",
    "fitplan.builtin.trl.grpo",
    "fitplan.builtin.time",
    "fitplan.builtin.dataset",
    "fitplan.builtin.confidence",
    "fitplan.builtin.defaults",
    "fitplan.builtin.cost",
    "fitplan.builtin.seed",
    "fitplan.builtin.names",
    "fitplan.builtin.report",
    "fitplan.builtin.trl.report",
    "fitplan.builtin.formats",
    "fitplan.builtin.commands",
)
ESSENTIAL: frozenset[str] = frozenset({
    "fitplan.builtin.inputs", "fitplan.builtin.precision", "fitplan.builtin.model_states", "fitplan.builtin.optimizers",
    "fitplan.builtin.activations", "fitplan.builtin.lora", "fitplan.builtin.sharding", "fitplan.builtin.overhead",
    "fitplan.builtin.peak", "fitplan.builtin.time", "fitplan.builtin.dataset", "fitplan.builtin.report", "fitplan.builtin.formats",
    "fitplan.builtin.commands", "fitplan.builtin.trl.preference", "fitplan.builtin.trl.reward",
    "fitplan.builtin.trl.grpo", "fitplan.builtin.trl.reference_free",
})
"""Built-in plugins that cannot be blocked: the terms of the memory model and of time (the others depend on
them: sharding orders its reducers after LoRA's, cost prices time), the report, the formats and the commands.
The cost, the seed's assumptions and the derived condition names can be blocked; tests/test_hooks.py checks
both lists."""
ENTRY_POINT_GROUP = discovery.GROUP
_STOPS = BaseException
"""What a plugin may raise without stopping fitplan: anything (``SystemExit``, a ``BaseException`` subclass of
its own) but ``KeyboardInterrupt``, which :func:`.guard.interrupt` raises again so that Ctrl-C stops fitplan."""


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
    names: dict[str, Name] = attrs.Factory(dict)
    formats: dict[tuple[str, str], OutputFormat] = attrs.Factory(dict)
    """``(kind, format name)`` -> the format that renders it."""
    sections: list[ReportSection] = attrs.Factory(list)
    errors: list[PluginError] = attrs.Factory(list)
    blocked: frozenset[str] = frozenset()
    distributions: dict[str, tuple[str, str]] = attrs.Factory(dict)
    """Plugin name -> (distribution, version) it was installed by."""
    derived: dict[str, Any] = attrs.Factory(dict)
    """What other layers derive once from this registry (the conditions' vocabulary)."""
    guard: Guard = attrs.field(default=None)
    """The guards of the registered implementations (which plugin is running, who answered what)."""
    _compiled: Any = None
    _ruleset_dirs: dict[str, list[str]] | None = None

    # ------------------------------------------------------------------ declarations

    def add_error(self, error: PluginError) -> None:
        """Record a plugin problem once (hooks may be called again, e.g. by ``fitplan plugins``)."""
        if all(e.render() != error.render() for e in self.errors):
            self.errors.append(error)

    def register(self, name: str, plugin: object) -> None:
        """Register ``plugin`` under ``name`` through its guarded stand-in (:meth:`.guard.Guard.stand_in`)."""
        self.pm.register(self.guard.stand_in(self.pm, plugin, name), name=name)

    def collect(self) -> None:
        """Call every declaring hook through pluggy and keep what each plugin registered (the plugin whose
        implementation is running when ``register`` is called, :attr:`.guard.Guard.plugin`)."""
        sinks: dict[str, tuple[type, Callable[[Any, str], None]]] = {
            "fitplan_register_quantities": (Quantity, lambda q, p: self.quantities.append(attrs.evolve(q, plugin=p))),
            "fitplan_register_reducers": (Reducer, lambda r, p: self.reducers.append(attrs.evolve(r, plugin=p))),
            "fitplan_register_optimizers": (OptimizerSpec, self._add_optimizer),
            "fitplan_register_names": (Name, self._add_name),
            "fitplan_register_formats": (OutputFormat, self._add_format),
            "fitplan_register_report_sections": (ReportSection, lambda s, p: self.sections.append(attrs.evolve(s, plugin=p))),
            "fitplan_register_settings": (Setting, lambda s, p: install([attrs.evolve(s, plugin=p)], self.add_error)),
        }
        for hook, (kind, sink) in sinks.items():
            getattr(self.pm.hook, hook)(register=self._registrar(kind, sink, hook))
        self.sections.sort(key=lambda s: s.order)

    def _registrar(self, kind: type, sink: Callable[[Any, str], None], hook: str) -> Callable[[Any], None]:
        def register(item: Any) -> None:
            plugin = self.guard.plugin or "?"
            if not isinstance(item, kind):
                what = getattr(item, "__name__", None) or getattr(item, "name", None)
                self.add_error(PluginError(
                    f"plugin {plugin!r} registered a {type(item).__name__}" + (f" ({what!r})" if isinstance(what, str) else "")
                    + f" in {hook}, expected a fitplan.{kind.__name__}",
                    field=hook, value=repr(item)[:80], suggestion=_BUILD_HINT[kind.__name__]))
                return
            sink(item, plugin)
        return register

    def _add_optimizer(self, o: OptimizerSpec, plugin: str) -> None:
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

    def _add_name(self, n: Name, plugin: str) -> None:
        prev = self.names.get(n.name)
        if prev is not None:
            self.add_error(PluginError(f"name {n.name!r} is declared by plugin {prev.plugin!r} and again by plugin {plugin!r}",
                                       field="fitplan_register_names", value=n.name))
            return
        self.names[n.name] = attrs.evolve(n, plugin=plugin)

    def _add_format(self, f: OutputFormat, plugin: str) -> None:
        from fitplan.output.formats import REPORT_KINDS

        f = attrs.evolve(f, plugin=plugin)
        for kind in f.kinds:
            if kind not in REPORT_KINDS:
                self.add_error(PluginError(f"plugin {plugin!r}: format {f.name!r} renders unknown report kind {kind!r}",
                                           field="fitplan_register_formats", value=kind,
                                           suggestion=did_you_mean(kind, REPORT_KINDS) or "kinds: " + ", ".join(REPORT_KINDS)))
                continue
            prev = self.formats.get((kind, f.name))
            if prev is not None:
                self.add_error(PluginError(f"format {f.name!r} for {kind} reports is declared by plugin {prev.plugin!r} and "
                                           f"again by plugin {plugin!r}", field="fitplan_register_formats", value=f.name,
                                           suggestion=f"block one with {BLOCK_ENV}"))
                continue
            self.formats[(kind, f.name)] = f

    def format(self, kind: str, name: str) -> OutputFormat:
        """The format ``name`` for ``kind`` reports. :raises FitplanError: naming the valid ones."""
        try:
            return self.formats[(kind, name)]
        except KeyError:
            from fitplan.errors import unknown

            raise unknown(f"format for {kind}", name, self.format_names(kind), field="--format") from None

    def format_names(self, kind: str) -> list[str]:
        return [n for (k, n) in self.formats if k == kind]

    def register_commands(self, group: Any) -> None:
        """Add every plugin's commands to the click ``group``, in pluggy's call order: a name another plugin
        already added is a problem naming both (the first one stays). When ``group`` can defer commands
        (:class:`fitplan.app.commands.Group`), deferred commands stay deferred."""
        owner: dict[str, str] = {}
        for plugin, name, command, deferred in self._command_declarations(type(group)):
            if name in owner:
                self.add_error(PluginError(f"command {name!r} is added by plugin {owner[name]!r} and again by plugin "
                                           f"{plugin!r}", field="fitplan_register_commands", value=name,
                                           suggestion=f"block one with {BLOCK_ENV}"))
                continue
            owner[name] = plugin
            if deferred and hasattr(group, "defer"):
                group.defer(name, command)
            else:
                group.add_command(command() if deferred else command, name)

    def commands_by_plugin(self) -> dict[str, list[str]]:
        """plugin name -> the names of the commands it adds (what ``fitplan plugins`` lists)."""
        import click

        out: dict[str, list[str]] = {}
        for plugin, name, _, _ in self._command_declarations(click.Group):
            out.setdefault(plugin, []).append(name)
        return {p: sorted(names) for p, names in out.items()}

    def _command_declarations(self, base: type) -> list[tuple[str, str, Any, bool]]:
        """``(plugin, name, command or loader, deferred)`` for each command the plugins add, in call order: the
        hook is called with a group (a ``base``, so it can defer when ``base`` can) that records each addition
        with the plugin running (:attr:`.guard.Guard.plugin`)."""
        found: list[tuple[str, str, Any, bool]] = []
        guard = self.guard

        class Recorder(base):  # type: ignore[misc, valid-type]
            def add_command(self, cmd: Any, name: str | None = None) -> None:
                found.append((guard.plugin or "?", name or cmd.name, cmd, False))

            def defer(self, name: str, load: Any) -> None:
                found.append((guard.plugin or "?", name, load, True))

        self.pm.hook.fitplan_register_commands(cli=Recorder())
        return found

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
        for name, result in self.ruleset_dirs_answered():
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

    def ruleset_dirs_answered(self) -> list[tuple[str, Any]]:
        """``(plugin, what it returned)`` from ``fitplan_ruleset_dirs``, in pluggy's call order, unchecked."""
        return self.guard.answers(self.pm.hook.fitplan_ruleset_dirs())

    def raise_errors(self) -> None:
        if self.errors:
            if len(self.errors) == 1:
                raise self.errors[0]
            raise PluginError(f"{len(self.errors)} plugin problems", details=[e.render() for e in self.errors],
                              suggestion=f"block a faulty plugin with {BLOCK_ENV}=NAME")

    def compiled(self):
        """The quantity graph, compiled once per registry (names that shadow a quantity or an input are errors)."""
        if self._compiled is None:
            from fitplan.engine.graph import compile_graph
            from fitplan.errors import GraphError
            from fitplan.inputs.names import input_names

            inputs = input_names()
            compiled = compile_graph(self.quantities, self.reducers, inputs)
            clash = [f"plugin {n.plugin!r} declares name {n.name!r}, which is already a quantity"
                     for n in self.names.values() if n.name in compiled.quantities]
            if clash:
                raise GraphError(f"{len(clash)} problem(s) in the declared names", details=clash)
            self._compiled = compiled
        return self._compiled

    def plugin_names(self) -> list[str]:
        """The registered plugins in the order pluggy calls them (the reverse of registration's)."""
        return [n for n, p in reversed(self.pm.list_name_plugin()) if p is not None]

    def resolve_optimizer(self, name: str) -> OptimizerSpec:
        key = self.optimizer_aliases.get(name, name)
        if key in self.optimizers:
            spec = self.optimizers[key]
            if spec.refused:
                from fitplan.errors import FitplanError

                raise FitplanError(f"optim {name!r} is not estimated: {spec.refused}", field="--optim", value=name,
                                   suggestion="`fitplan plugins` lists the optimizers fitplan models")
            return spec
        from fitplan.errors import unknown

        raise unknown("optimizer", name, [*self.optimizers, *self.optimizer_aliases], field="--optim")


def make_registry(*, blocked: Iterable[str] | None = None, entry_points: bool | Iterable[str] = True,
                  extra_plugins: Iterable[tuple[str, object]] = ()) -> Registry:
    """Build a plugin manager, load entry points then built-ins, and collect declarations.

    Nothing here raises for a faulty plugin: every problem (a plugin that fails to import or exits, implements
    an unknown hook, raises, returns or registers the wrong type, declares a duplicate optimizer, name or
    format, ships a missing or invalid ruleset directory; a blocked name that is essential or names no
    plugin) is recorded in :attr:`Registry.errors`, naming the plugin. Graph problems (duplicate or cyclic
    quantities, unknown targets) surface in :meth:`Registry.compiled`.

    :param blocked: plugin names not to load (default: from ``FITPLAN_BLOCK_PLUGINS``).
    :param entry_points: load third-party plugins from the ``fitplan`` entry-point group: ``True`` for
        all of them, ``False`` for none, or the names of the entry points to load (tests).
    :param extra_plugins: ``(name, plugin object)`` pairs called after the built-ins and entry points (tests).
    """
    blocked_set = frozenset(blocked) if blocked is not None else blocked_from_env()
    pm = PluginManager("fitplan")
    pm.add_hookspecs(hookspecs)
    reg = Registry(pm=pm, blocked=blocked_set)
    reg.guard = Guard(pm.project_name, reg.add_error)
    known = _block_problems(reg, blocked_set, extra_plugins)
    for name in blocked_set - ESSENTIAL:
        pm.set_blocked(name)
    loaded = _load_entry_points(reg, None if entry_points is True else set(entry_points), known) if entry_points else []
    from fitplan import __version__

    builtins = []
    for modname in BUILTIN_PLUGINS:
        short = modname.rsplit(".", 1)[1]
        if modname not in ESSENTIAL and (pm.is_blocked(modname) or pm.is_blocked(short)):
            continue
        builtins.append((modname, importlib.import_module(modname), f"plugin {modname!r} failed to register"))
        reg.distributions[modname] = ("fitplan", __version__)
    extras = [(name, plugin, f"plugin {name!r} failed to register") for name, plugin in extra_plugins
              if not pm.is_blocked(name)]
    for name, plugin, failure in reversed([*builtins, *loaded, *extras]):  # pluggy calls the last registered first
        _register(reg, name, plugin, failure)
    for error in _unknown_hooks(pm):
        reg.add_error(error)
    reg.collect()
    reg.ruleset_dirs_by_plugin()
    return reg


def _block_problems(reg: Registry, blocked: frozenset[str], extra_plugins: Iterable[tuple[str, object]]) -> set[str]:
    """Errors for essential or unknown names in the block list; returns the entry-point names found."""
    eps = {ep.name for ep in discovery.entry_points()} if blocked else set()
    known = set(BUILTIN_PLUGINS) | {m.rsplit(".", 1)[1] for m in BUILTIN_PLUGINS} | eps | {n for n, _ in extra_plugins}
    for name in sorted(blocked):
        full = name if name in ESSENTIAL else f"fitplan.builtin.{name}"
        if full in ESSENTIAL:
            reg.add_error(PluginError(f"plugin {full!r} is essential and cannot be blocked", field=BLOCK_ENV, value=name,
                                      suggestion="blockable built-ins: " + ", ".join(sorted(set(BUILTIN_PLUGINS) - ESSENTIAL))))
        elif name not in known:
            reg.add_error(PluginError(f"{BLOCK_ENV} names {name!r}, which is no installed plugin", field=BLOCK_ENV, value=name,
                                      suggestion=did_you_mean(name, known) or "see `fitplan plugins` for the names"))
    return eps


def _register(reg: Registry, name: str, plugin: object, failure: str) -> None:
    """Register ``plugin``; pluggy's refusal (an implementation whose arguments its hook does not have, a name
    taken) is a problem: ``failure`` and the reason."""
    try:
        reg.register(name, plugin)
    except _STOPS as e:
        interrupt(e)
        what = f"exited (sys.exit({e.code!r}))" if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}"
        reg.add_error(PluginError(f"{failure}: {what}", value=name, suggestion=f"block it with {BLOCK_ENV}={name}"))


def _load_entry_points(reg: Registry, wanted: set[str] | None, known: set[str]) -> list[tuple[str, object, str]]:
    """Import every wanted entry point (its stdout goes to stderr while it imports, so that a plugin printing
    at import cannot corrupt ``--format json``); returns ``(name, plugin, what a failure to register says)`` for
    each, by name. An entry point named like a built-in plugin, or declared by two distributions, is not loaded:
    an error names the distributions."""
    import contextlib

    pm = reg.pm
    found: dict[str, discovery.EntryPoint] = {}
    loaded: list[tuple[str, object, str]] = []
    builtin = set(BUILTIN_PLUGINS) | {m.rsplit(".", 1)[1] for m in BUILTIN_PLUGINS}
    for ep in discovery.entry_points():
        if wanted is not None and ep.name not in wanted:
            continue
        if ep.name in builtin:
            reg.add_error(PluginError(f"the {ENTRY_POINT_GROUP!r} entry point {ep.name!r} of distribution {_dist(ep)} has "
                                      "the name of a built-in plugin; it is not loaded", value=ep.name,
                                      suggestion="rename the entry point in the distribution's metadata"))
            continue
        if ep.name in found:
            reg.add_error(PluginError(f"the {ENTRY_POINT_GROUP!r} entry point {ep.name!r} is declared by distribution "
                                      f"{_dist(found[ep.name])} and again by {_dist(ep)}; only the first is loaded",
                                      value=ep.name, suggestion="uninstall one of them (pip uninstall NAME)"))
            continue
        found[ep.name] = ep
        if pm.is_blocked(ep.name):
            continue
        try:
            with contextlib.redirect_stdout(sys.stderr):
                plugin = ep.load()
        except _STOPS as e:  # a broken third-party plugin must not take the rest down
            interrupt(e)
            what = f"exited (sys.exit({e.code!r}))" if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}"
            reg.add_error(PluginError(f"plugin {ep.name!r} ({ep.value}) failed to load: {what}",
                                      value=ep.name, suggestion=f"block it with {BLOCK_ENV}={ep.name}"))
            continue
        loaded.append((ep.name, plugin, f"plugin {ep.name!r} ({ep.value}) failed to load"))
        if ep.dist_name:
            reg.distributions[ep.name] = (ep.dist_name, ep.dist_version)
    for name in sorted((wanted or set()) - set(found)):
        reg.add_error(PluginError(f"no installed distribution declares a {ENTRY_POINT_GROUP!r} entry point named {name!r}",
                                  value=name, suggestion="pip install the plugin's distribution (pip install -e path/to/it)"))
    return loaded


def _dist(ep: "discovery.EntryPoint") -> str:
    return f"{ep.dist_name or '?'} {ep.dist_version}".strip() if ep.dist_name else f"({ep.value})"


_BUILD_HINT = {
    "Quantity": "build one with @fitplan.quantity(unit) on a function, or fitplan.Quantity(name=..., func=..., unit=...)",
    "Reducer": "build one with @fitplan.reducer(target, when=...) on a function, or fitplan.Reducer(...)",
    "OptimizerSpec": "build one with fitplan.OptimizerSpec(name=..., state_bytes=..., doc=...)",
    "Name": "build one with fitplan.Name(name=..., get=..., doc=...)",
    "OutputFormat": "build one with fitplan.output.formats.OutputFormat(name=..., extension=..., kinds=..., render=...)",
    "ReportSection": "build one with fitplan.output.formats.ReportSection(name=..., json=..., lines=...)",
    "Setting": "build one with fitplan.api.Setting(name=..., section=..., type=..., default=..., help=...)",
}

_PROBE = None


def _probe_optimizer(spec: OptimizerSpec) -> str | None:
    """Call an optimizer's byte functions on a small context (a 2-D matrix and a vector, both
    repeated): a problem described in words, or None. Catches a spec that raises or returns a
    non-number before any estimate does."""
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
