"""The package layout holds: no import cycles among ``src/fitplan`` modules (lazy imports included), the
packages import downwards only through the layers of docs/architecture.md, plugins/ import only the public
plugin API (``fitplan.api``), and modules and functions stay small."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import string_constants

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for f in (SRC / "fitplan").rglob("*.py"):
        name = ".".join(f.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            skip.update(id(s) for s in ast.walk(n))
    return skip


def import_graph() -> dict[str, set[str]]:
    """Module -> the fitplan modules it imports anywhere in its body (functions included), except under
    ``if TYPE_CHECKING``; a package's own submodules and parents are not edges."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        is_pkg = f.name == "__init__.py"
        for n in ast.walk(tree):
            if id(n) in skip or not isinstance(n, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(n, ast.Import):
                cands = [a.name for a in n.names]
            else:
                if n.level:
                    base = m.split(".")
                    base = base[: len(base) - n.level + (1 if is_pkg else 0)]
                    pre = ".".join(base + ([n.module] if n.module else []))
                else:
                    pre = n.module or ""
                cands = [pre] + [f"{pre}.{a.name}" for a in n.names]
            graph[m].update(c for c in cands if c in mods and c != m and not c.startswith(m + ".")
                            and not m.startswith(c + "."))
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for w in graph[stack.pop()]:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return seen


def test_no_import_cycles():
    graph = import_graph()
    reach = {m: _reach(graph, m) for m in graph}
    cycles = sorted({" <-> ".join(sorted(x for x in graph if x == m or (x in reach[m] and m in reach[x])))
                     for m in graph if m in reach[m]})
    assert cycles == []


LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("units", "diskcache", "files"),
    ("engine", "codecache"),
    ("inputs",),
    ("arch",),
    ("trace",),
    ("rulesets",),
    ("output",),
    ("pluginmgr",),
    ("context",),
    ("data",),
    ("estimation",),
    ("rules",),
    ("search",),
    ("assess",),
    ("app", "testing"),
    ("web",),
    ("cli",),
    ("builtin", "api", "__main__"),
)
"""The packages (and top-level modules) of ``src/fitplan``, lowest first (docs/architecture.md draws the same
table): each imports only what is in a lower layer. ``builtin`` is on top: the registry loads the built-in
plugins by name, as it loads a third-party one, and no other package imports them. The package
``fitplan`` itself (``fitplan/__init__.py``: ``fitplan.estimate`` and the version) is the facade, not a layer."""


def package_of(module: str) -> str:
    """``fitplan.trace.step_trace`` -> ``trace``; ``fitplan.errors`` -> ``errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]] | None = None) -> dict[str, dict[str, list[str]]]:
    """Package -> the packages it imports -> the module edges behind each (``a.b -> c.d``)."""
    out: dict[str, dict[str, list[str]]] = {}
    for m, targets in (import_graph() if graph is None else graph).items():
        for t in sorted(targets):
            a, b = package_of(m), package_of(t)
            if a != b and a != "fitplan":
                out.setdefault(a, {}).setdefault(b, []).append(f"{m} -> {t}")
    return out


def strongly_connected(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The components of more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while comp[-1:] != [v]:
                comp.append(stack.pop())
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted({*graph, *(w for ws in graph.values() for w in ws)}):
        if v not in index:
            visit(v)
    return sorted(comps)


def test_every_package_has_a_layer():
    layered = [p for layer in LAYERS for p in layer]
    assert len(layered) == len(set(layered))
    assert {package_of(m) for m in _modules()} - {"fitplan"} == set(layered)


def test_layers_import_downwards_only():
    """No package imports its own layer or a higher one, lazy (function-level) imports included: the
    packages form no cycle, and each upward edge is listed with the modules behind it."""
    level = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    upward = [f"{a} (layer {level[a]}) imports {b} (layer {level[b]}): {', '.join(edges)}"
              for a, targets in sorted(package_graph().items()) for b, edges in sorted(targets.items())
              if level[b] >= level[a]]
    assert upward == []
    assert strongly_connected(package_graph()) == []


def test_architecture_doc_draws_the_same_layers():
    """docs/architecture.md's "Layers" table lists the packages of :data:`LAYERS`, layer by layer."""
    import re

    doc = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", section, re.M)
    assert [int(n) for n, _ in rows] == list(range(len(LAYERS)))
    assert [tuple(re.findall(r"`([\w_]+)`", cell)) for _, cell in rows] == list(LAYERS)


def test_package_graph_sees_lazy_imports():
    """The walk counts an import inside a function body, and not one under ``if TYPE_CHECKING``."""
    import textwrap

    src = textwrap.dedent("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from fitplan.cli import main
        def f():
            from fitplan.search.plans import Plan
    """)
    tree = ast.parse(src)
    skip = _type_checking_nodes(tree)
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and id(n) not in skip]
    assert found == ["typing", "fitplan.search.plans"]
    graph = package_graph({"fitplan.output.x": {"fitplan.search.plans"}, "fitplan.search.plans": {"fitplan.output.x"}})
    assert strongly_connected(graph) == [["output", "search"]]


PLUGINS = SRC.parent / "plugins"


def plugin_imports() -> list[tuple[str, int, str, tuple[str, ...]]]:
    """Every import of fitplan in ``plugins/`` (functions and docstring-free code included): (file, line,
    module, names)."""
    found = []
    for f in sorted(PLUGINS.rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            rel = f.relative_to(PLUGINS).as_posix()
            if isinstance(n, ast.Import):
                found += [(rel, n.lineno, a.name, ()) for a in n.names if a.name.split(".")[0] == "fitplan"]
            elif isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == "fitplan":
                found.append((rel, n.lineno, n.module, tuple(a.name for a in n.names)))
    return found


def test_plugins_import_only_the_public_api():
    """plugins/ (fitplan-torch and the example plugins) import fitplan only as ``from fitplan.api import ...``,
    and only names the API declares."""
    import fitplan.api

    found = plugin_imports()
    assert len(found) > 20  # the walk sees fitplan-torch's imports, lazy ones included
    assert [f"{f}:{line}: {mod}" for f, line, mod, _ in found if mod != "fitplan.api"] == []
    assert [f"{f}:{line}: {name}" for f, line, _, names in found for name in names
            if name not in fitplan.api.__all__] == []


def _loaded(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after ``statement``."""
    import os
    import subprocess
    import sys

    code = f"import sys; {statement}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)}).stdout
    return set(out.split())


def test_the_api_resolves_every_name_and_loads_light():
    """Every name of ``fitplan.api.__all__`` resolves; importing the API imports none of the modules behind
    its lazy names that ``import fitplan`` does not import already (a plugin's load stays cheap)."""
    import fitplan.api as api

    lazy = {target.split(":")[0] for target in api.LAZY.values()}
    assert (_loaded("import fitplan.api") - _loaded("import fitplan")) & lazy == set()
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    assert isinstance(api.PLUGIN_API, tuple) and len(api.PLUGIN_API) == 2


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """Not the keys of dict displays: a report's own field names, such as the recommend JSON's
    ``train_seconds``, name no quantity."""
    return string_constants(path, dict_keys=False)


def test_no_builtin_quantity_name_outside_builtin():
    """The core finds the quantities it needs through their metadata (roles, rows, JSON keys, short names):
    no built-in quantity's name is written in a module outside ``fitplan/builtin``."""
    from fitplan.context import get_context

    names = set(get_context().registry.compiled().quantities)
    found = []
    for f in sorted((SRC / "fitplan").rglob("*.py")):
        if "builtin" in f.relative_to(SRC / "fitplan").parts:
            continue
        for line, text in _string_constants(f):
            if text in names:
                found.append(f"{f.relative_to(SRC)}:{line}: {text!r}")
    assert found == []


def test_json_keys_metadata_matches_the_report():
    """Each quantity's ``json_key`` is where the estimate JSON puts its value (Names' keys are their
    values too), so that conditions may use the report's dotted keys."""
    import fitplan
    from fitplan.assess import assess
    from fitplan.output.estimate_report import to_json
    from fitplan.rulesets.conditions import vocabulary

    est = fitplan.estimate(model="llama-2-7b", gpu="h100-sxm", num_gpus=8, provider="aws", num_examples=1000,
                           tokens_per_example=512, precision="bf16-master", zero_stage=3, offload_optimizer=True)
    report = to_json(assess(est, advice=False))
    compiled = est.registry.compiled()
    checked = 0
    for name, q in compiled.quantities.items():
        if not q.json_key:
            continue
        node: object = report
        for part in q.json_key.split("."):
            node = node[part]
        value = est[name]
        numbers = isinstance(value, dict) and all(isinstance(x, (int, float)) for x in value.values())
        assert node == (int(value) if q.json_key.startswith("memory.per_gpu_bytes.") else
                        {k: int(x) for k, x in value.items()} if numbers else value), q.json_key
        checked += 1
    vocab = vocabulary(est.registry)
    from fitplan.rulesets.conditions import Namespace

    ns = Namespace(est.values, None, None, vocab)
    assert report["time"]["hours"] == ns.get("time.hours") == ns.get("train_hours")
    assert checked >= 30


MODULE_LINES, FUNCTION_LINES = 550, 80
"""About 500 lines a module and 80 a function (CONTRIBUTING.md), unless a reason is stated below. The core's modules
are named from ``src/`` (``fitplan/...``), the plugins' from the repository's root (``plugins/...``)."""
LEARNER = "plugins/fitplan-torch/src/fitplan_torch/learn"
LONG_MODULES = {
    "fitplan/trace/step_trace.py": "the trace's records, its replay and its disk cache in one module; issue #26 "
                                     "moves the trace machinery into a package of its own and splits it",
    f"{LEARNER}/derive.py": "the learner's derivation (variables, probes, regimes, switches, variants, the file's "
                            "tables) in one module; its phases share module state (NESTED, FOLLOWERS)",
    f"{LEARNER}/record.py": "the recorder: one dispatch mode, one function mode, the saved-tensor hooks and the "
                            "module hooks over one recording's shared state",
}
LONG_FUNCTIONS = {
    (f"{LEARNER}/derive.py", "make_probes"): "the probes of one variant: one loop per variable, holding fixed "
                                             "those that change the ops, then the joint probes over what is left",
    (f"{LEARNER}/derive.py", "learn_variant"): "one variant's probes, fit and regime reuse in one pass; "
                                               "the reuse reads the fit's intermediate tables",
    (f"{LEARNER}/patterns.py", "learn_pattern"): "the layer-kind search: record, compare layers, fit one rule per "
                                                 "feature, each step reading the last's tables",
    (f"{LEARNER}/record.py", "_module_hooks"): "the recorder's module hooks are closures over the recording "
                                               "(pre and post hooks per kind of module) that torch calls",
    ("plugins/fitplan-torch/src/fitplan_torch/step.py", "measure_step"): "the referee's measured step: warm-up, "
                                               "steps, phases and the peak's breakdown over one live-bytes counter",
}


def _sources() -> list[tuple[str, Path]]:
    """Every module the size budgets cover: the core's (named from ``src/``) and every plugin's under
    ``plugins/*/src`` (named from the repository's root)."""
    out = [(f.relative_to(SRC).as_posix(), f) for f in sorted((SRC / "fitplan").rglob("*.py"))]
    root = SRC.parent
    out += [(f.relative_to(root).as_posix(), f) for f in sorted((root / "plugins").glob("*/src/**/*.py"))]
    return out


def test_modules_and_functions_stay_small():
    long_modules, long_functions = [], []
    sources = _sources()
    for rel, f in sources:
        text = f.read_text(encoding="utf-8")
        if text.count("\n") > MODULE_LINES and rel not in LONG_MODULES:
            long_modules.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES and (rel, node.name) not in LONG_FUNCTIONS:
                    long_functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
                if n <= FUNCTION_LINES and (rel, node.name) in LONG_FUNCTIONS:
                    long_functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines, listed as long: a stale reason")
        if text.count("\n") <= MODULE_LINES and rel in LONG_MODULES:
            long_modules.append(f"{rel}: {text.count(chr(10))} lines, listed as long: a stale reason")
    listed = {rel for rel in LONG_MODULES} | {rel for rel, _ in LONG_FUNCTIONS}
    known = {rel for rel, _ in sources}
    long_modules += [f"{rel}: listed, but there is no such module" for rel in sorted(listed - known)]
    assert (long_modules, long_functions) == ([], [])


def test_the_size_budgets_cover_the_plugins():
    """The budgets read the plugins too: fitplan-torch's modules and both example plugins' are among the sources."""
    names = {rel for rel, _ in _sources()}
    assert f"{LEARNER}/learner.py" in names and "fitplan/trace/step_trace.py" in names
    assert {rel.split("/")[1] for rel in names if rel.startswith("plugins/")} >= {
        "fitplan-torch", "acme-fitplan-rules", "fitplan-optimizers-extra"}


def test_deferred_builtin_commands_table_is_what_the_modules_add():
    """fitplan.cli.commands.MODULES (which module adds which command, so that a command's module is imported only
    when it runs) names every command module and exactly the commands each one's add() adds."""
    from fitplan.cli import commands

    files = {p.stem for p in (SRC / "fitplan" / "cli" / "commands").glob("*.py") if p.stem != "__init__"}
    assert set(commands.MODULES) == files
    for module, names in commands.MODULES.items():
        assert tuple(commands.commands_of(module)) == names, module
    from fitplan.builtin.commands import CALIBRATE

    assert tuple(commands.commands_of(CALIBRATE)) == ("calibrate",)
