"""pytest fixtures for fitplan plugin authors.

Installed as the ``fitplan`` pytest plugin (entry point group ``pytest11``), so a plugin's own test
suite gets these fixtures with no ``conftest.py``:

``fitplan_registry``
    a factory for an isolated plugin registry: the built-ins plus exactly the plugins you name,
    never the process-wide registry that ``fitplan`` commands cache.
``make_scenario``
    a factory: flat field names (``optim="lion"``, ``per_device_train_batch_size=4``) to a
    :class:`fitplan.Scenario`, validated like the command line validates flags.
``estimate_with``
    evaluate a scenario against an isolated registry with your plugins: returns a :class:`fitplan.Estimate`.
``fitplan_entry_points``
    make a plugin discoverable through a real ``fitplan`` entry point without ``pip install``: it
    writes a ``*.dist-info`` with ``entry_points.txt`` into a temporary ``sys.path`` entry.

and one plain function, :func:`assert_explains`, to assert on the explain tree of a quantity.

Importing this module defines fixtures and nothing else: fitplan itself is imported when a fixture
is first used, so that loading the pytest plugin costs nothing and changes no state.
See ``docs/writing-plugins.md`` for a walkthrough.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # pragma: no cover
    from fitplan.estimation import Estimate
    from fitplan.pluginmgr.registry import Registry
    from fitplan.inputs.scenario import Scenario

__all__ = ["assert_explains", "build_registry", "estimate_with", "fitplan_entry_points", "fitplan_registry",
           "make_scenario", "plugin_name", "write_dist_info"]

PluginLike = Any
"""A plugin given to the fixtures: a module or object with ``@fitplan.hookimpl`` methods, a
``(name, plugin)`` pair, or the name of an installed ``fitplan`` entry point (a ``str``)."""


def plugin_name(plugin: object) -> str:
    """The name a plugin object is registered under: a module's ``__name__``, else its class name."""
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    if isinstance(plugin, type):
        return plugin.__name__
    return type(plugin).__name__


def build_registry(plugins: Iterable[PluginLike] = (), *, entry_points: bool | Iterable[str] = False,
                   blocked: Iterable[str] = ()) -> Registry:
    """An isolated :class:`fitplan.pluginmgr.registry.Registry`: the built-in plugins plus ``plugins``.

    :param plugins: modules or objects with hook implementations, ``(name, plugin)`` pairs, or names of
        installed ``fitplan`` entry points (loaded exactly as ``fitplan`` loads them).
    :param entry_points: load every installed entry point as well (``True``), or these names.
    :param blocked: plugin names to block (``FITPLAN_BLOCK_PLUGINS`` is ignored here, for isolation).
    """
    from fitplan.pluginmgr.registry import make_registry

    extra: list[tuple[str, object]] = []
    names: set[str] = set()
    for p in plugins:
        if isinstance(p, str):
            names.add(p)
        elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
            extra.append(p)
        else:
            extra.append((plugin_name(p), p))
    if entry_points is True:
        eps: bool | set[str] = True
    else:
        eps = names | set(entry_points or ())
    return make_registry(entry_points=eps or False, extra_plugins=extra, blocked=tuple(blocked))


def _scenario(fields: Mapping[str, Any]) -> Scenario:
    import fitplan

    return fitplan.scenario_from_dict(dict(fields))


def _estimate(registry: Registry, fields: Mapping[str, Any], ruleset_dirs: Sequence[str | Path] = (),
              *, raise_errors: bool = True) -> Estimate:
    from fitplan.rulesets import loader as rulesets
    from fitplan.estimation import evaluate
    from fitplan.inputs.scenario import Scenario

    scenario = fields.get("scenario")
    if isinstance(scenario, Scenario):
        rest = {k: v for k, v in fields.items() if k != "scenario"}
        s = scenario.replace(**rest) if rest else scenario
    else:
        s = _scenario(fields)
    plugin_dirs = registry.ruleset_dirs()
    if raise_errors:
        registry.raise_errors()
    rules = rulesets.load([str(d) for d in ruleset_dirs], plugin_dirs)
    return evaluate(s, registry, rules)


def estimate_with_registry(registry: Registry, *, ruleset_dirs: Sequence[str | Path] = (), **fields: Any) -> Estimate:
    """Evaluate flat scenario ``fields`` (or ``scenario=`` a Scenario plus overrides) on ``registry``."""
    return _estimate(registry, fields, ruleset_dirs)


# --------------------------------------------------------------------------- fixtures


def _undoing_settings(value: Any) -> Iterator[Any]:
    """Yield ``value``; then remove the settings that registries built meanwhile installed (plugin settings are
    scenario fields process-wide: ``fitplan.inputs.settings``)."""
    from fitplan.inputs.settings import declared, restore_point

    declared()  # the default registry's settings are installed first, and kept
    restore = restore_point()
    try:
        yield value
    finally:
        restore()


@pytest.fixture
def fitplan_registry() -> Iterator[Callable[..., Registry]]:
    """Factory: ``fitplan_registry(MyPlugin(), "my-entry-point", blocked=["fitplan.builtin.seed"])``.

    Returns a fresh :class:`fitplan.pluginmgr.registry.Registry` (built-ins + the given plugins) each call. Its
    ``errors`` list holds every plugin problem; ``compiled()`` raises graph problems. The settings its plugins
    declare are scenario fields until the test ends.
    """

    def make(*plugins: PluginLike, entry_points: bool | Iterable[str] = False, blocked: Iterable[str] = ()) -> Registry:
        return build_registry(plugins, entry_points=entry_points, blocked=blocked)

    yield from _undoing_settings(make)


@pytest.fixture
def make_scenario() -> Callable[..., Scenario]:
    """Factory: ``make_scenario(model="llama-2-7b", optim="lion", precision="bf16-true")`` -> Scenario.

    Accepts flat field names or section tables (``training={...}``); bad values raise
    :class:`fitplan.FitplanError` with the same message the command line prints.
    """

    def make(**fields: Any) -> Scenario:
        return _scenario(fields)

    return make


@pytest.fixture
def estimate_with() -> Iterator[Callable[..., Estimate]]:
    """``estimate_with(plugins=[MyPlugin()], model="llama-2-7b", optim="lion")`` -> Estimate.

    :param plugins: as for ``fitplan_registry`` (objects, ``(name, plugin)`` pairs, entry-point names).
    :param registry: an already built registry instead of ``plugins``.
    :param ruleset_dirs: extra ruleset directories (like ``--ruleset-dir``).
    :param scenario: a :class:`fitplan.Scenario` to start from; other keyword arguments override it.
    Plugin problems raise :class:`fitplan.PluginError` naming the plugin, as the command line does.
    Each call builds its own registry; pass ``registry=`` to evaluate many scenarios on one.
    """

    def run(plugins: Iterable[PluginLike] = (), *, registry: Registry | None = None,
            ruleset_dirs: Sequence[str | Path] = (), entry_points: bool | Iterable[str] = False,
            blocked: Iterable[str] = (), **fields: Any) -> Estimate:
        reg = registry if registry is not None else build_registry(plugins, entry_points=entry_points, blocked=blocked)
        return _estimate(reg, fields, ruleset_dirs)

    yield from _undoing_settings(run)


def write_dist_info(directory: str | Path, dist: str, entry_points: Mapping[str, str], *, version: str = "0.0.0",
                    group: str = "fitplan") -> Path:
    """Write ``<dist>-<version>.dist-info`` (METADATA + entry_points.txt) into ``directory``.

    With ``directory`` on ``sys.path`` (or ``PYTHONPATH`` in a subprocess), ``importlib.metadata``
    finds the distribution and its entry points, exactly as if pip had installed it.
    """
    directory = Path(directory)
    norm = re.sub(r"[-_.]+", "_", dist)
    info = directory / f"{norm}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8")
    lines = [f"[{group}]"] + [f"{name} = {target}" for name, target in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return info


@pytest.fixture
def fitplan_entry_points(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Factory: ``fitplan_entry_points("my-dist", {"my-plugin": "my_plugin"}, src="path/to/src")``.

    Makes ``src`` importable and the entry points discoverable for this test: ``sys.path`` is restored
    and the modules imported from ``src`` are forgotten afterwards. Returns the directory holding the
    dist-info: put it and ``src`` on ``PYTHONPATH`` to make a ``fitplan`` subprocess see the plugin too.
    """
    import importlib
    import sys

    sources: list[Path] = []

    def make(dist: str, entry_points: Mapping[str, str], *, src: str | Path | None = None) -> Path:
        site = tmp_path_factory.mktemp("site")
        write_dist_info(site, dist, entry_points)
        monkeypatch.syspath_prepend(str(site))
        if src is not None:
            sources.append(Path(src).resolve())
            monkeypatch.syspath_prepend(str(src))
        importlib.invalidate_caches()
        return site

    yield make
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and any(Path(origin).resolve().is_relative_to(src) for src in sources):
            del sys.modules[name]


# --------------------------------------------------------------------------- assertions


def _walk(tree: dict[str, Any]) -> Iterable[dict[str, Any]]:
    yield tree
    for child in tree.get("children", ()):
        yield from _walk(child)


def assert_explains(estimate: Estimate, quantity: str, *, depends_on: Iterable[str] = (),
                    applied: Iterable[str] = (), not_applied: Iterable[str] = (), plugin: str | None = None,
                    depth: int = 8) -> dict[str, Any]:
    """Assert on ``fitplan explain QUANTITY``'s tree (:func:`fitplan.output.explain.explain_tree`).

    :param depends_on: names that must appear below ``quantity`` (quantities or inputs, at any depth).
    :param applied: reducer names (``"zero"`` or ``"optimizer_state_bytes.zero"``) whose condition held.
    :param not_applied: reducer names whose condition did not hold.
    :param plugin: the plugin that must have declared ``quantity`` (its contributor, for a reducer chain).
    :returns: the tree, for further assertions.
    """
    from fitplan.output.explain import explain_tree

    tree = explain_tree(estimate, quantity, depth=depth)
    nodes = list(_walk(tree))
    names = {n["name"] for n in nodes}
    missing = [d for d in depends_on if d not in names]
    assert not missing, f"{quantity} does not depend on {missing}; its tree holds {sorted(names)}"

    def reducers(state: bool) -> set[str]:
        out = set()
        for n in nodes:
            if n["kind"] == "reducer" and n.get("applied") is state:
                out.add(n["name"])
                out.add(n["name"].rsplit(".", 1)[-1])
        return out

    for want, state in ((applied, True), (not_applied, False)):
        have = reducers(state)
        wrong = [r for r in want if r not in have]
        label = "applied" if state else "not applied"
        all_reducers = sorted(f"{n['name']}={'applied' if n.get('applied') else 'not applied'}"
                              for n in nodes if n["kind"] == "reducer")
        assert not wrong, f"reducer(s) {wrong} not {label} under {quantity}; reducers: {all_reducers}"
    if plugin is not None:
        graph = estimate.registry.compiled()
        declared = graph.quantities[quantity].plugin if quantity in graph.quantities else tree["plugin"]
        assert declared == plugin, f"{quantity} is declared by plugin {declared!r}, not {plugin!r}"
    return tree
