"""The package layout holds: no import cycles among ``src/fitplan`` modules (lazy imports included),
and the layers only import downwards (docs/architecture.md)."""

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
    from fitplan.rules.conditions import vocabulary

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
    from fitplan.rules.conditions import Namespace

    ns = Namespace(est.values, None, None, vocab)
    assert report["time"]["hours"] == ns.get("time.hours") == ns.get("train_hours")
    assert checked >= 30


MODULE_LINES, FUNCTION_LINES = 550, 80
"""About 500 lines a module and 80 a function (CONTRIBUTING.md), unless a reason is stated below."""
LONG_MODULES = {
    "fitplan/builtin/step_trace.py": "the trace's records, its replay and its disk cache in one module; issue #26 "
                                     "moves the trace machinery into a package of its own and splits it",
}
LONG_FUNCTIONS = {
    ("fitplan/builtin/step_trace.py", "replay"): "the forward and backward timelines in one pass over shared state, "
                                                 "ten closures over it; issue #26 makes it a class with named parts",
}


def test_modules_and_functions_stay_small():
    long_modules, long_functions = [], []
    for f in sorted((SRC / "fitplan").rglob("*.py")):
        rel = f.relative_to(SRC).as_posix()
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
    long_modules += [f"{rel}: listed, but there is no such module" for rel in sorted(listed)
                     if not (SRC / rel).is_file()]
    assert (long_modules, long_functions) == ([], [])


def test_deferred_builtin_commands_table_is_what_the_modules_add():
    """fitplan.cli.commands.MODULES (which module adds which command, so that a command's module is imported only
    when it runs) names every command module and exactly the commands each one's add() adds."""
    from fitplan.cli import commands

    files = {p.stem for p in (SRC / "fitplan" / "cli" / "commands").glob("*.py") if p.stem != "__init__"}
    assert set(commands.MODULES) == files
    for module, names in commands.MODULES.items():
        assert tuple(commands.commands_of(module)) == names, module
