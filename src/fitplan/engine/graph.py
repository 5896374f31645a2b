"""The quantity graph: build once with networkx, check it, order it, evaluate it many times.

Nodes are quantities and inputs (scenario fields and the resolved objects in
:data:`INPUTS`); edges run from a dependency to its dependent. A quantity with reducers
becomes a chain: the contributor's node is renamed ``<name>.raw``, each reducer adds a node
``<name>.<reducer>``, and ``<name>`` is the end of the chain. The order of a chain follows the
reducers' ``after``/``before`` constraints (ties broken by name, so it is deterministic).

Evaluation is a plain loop over pre-ordered steps: no hook calls, no graph walks.

Compile once, across processes too: networkx costs ~0.1 s to import, more than everything else a
``fitplan estimate`` does. So the order that networkx computes (the reducer chains and the topological
order of every node) is cached on disk, keyed by a fingerprint of the declarations
(:func:`_fingerprint`), and a later compile of the same declarations reuses it after checking that it
is still a valid topological order of the current edges. Duplicate names and unbound dependencies are
checked on every compile; cycles cannot hide behind a cache entry, because only acyclic compiles are
written and a cached order that contradicts an edge is discarded. ``FITPLAN_NO_CACHE=1`` disables the
cache; ``FITPLAN_CACHE_DIR`` moves it (default: ``$XDG_CACHE_HOME/fitplan`` or ``~/.cache/fitplan``).
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

from fitplan.engine.declarations import Quantity, Reducer
from fitplan.errors import FitplanError, GraphError, PluginError, did_you_mean
from fitplan.inputs.scenario import FIELD_SECTION

RESOLVED_INPUTS: dict[str, str] = {
    "arch": "the model's architecture (fitplan.inputs.architecture.ModelSpec) from the catalog, a config.json or --params",
    "gpu_spec": "the GPU from the hardware ruleset (fitplan.rulesets.GPU), or None without --gpu",
    "optimizer_spec": "the optimizer named by --optim (fitplan.engine.declarations.OptimizerSpec)",
    "framework": "framework overheads from the rulesets (fitplan.rulesets.Framework)",
    "rulesets": "every ruleset entry in force (fitplan.rulesets.Rulesets)",
}
INPUTS: frozenset[str] = frozenset(FIELD_SECTION) | frozenset(RESOLVED_INPUTS)
"""Names a quantity may depend on besides other quantities."""

# step kinds
Q, R, ALIAS = 0, 1, 2


@attrs.frozen
class Node:
    name: str
    kind: str  # "input" | "quantity" | "reducer"
    deps: tuple[str, ...]
    unit: str = ""
    doc: str = ""
    plugin: str = ""
    target: str = ""
    category: str = ""


@attrs.define
class CompiledGraph:
    """An ordered, checked graph. :meth:`evaluate` runs it on one set of inputs."""

    edges: list[tuple[str, str]]
    nodes: dict[str, Node]
    steps: list[tuple]
    chains: dict[str, list[str]]
    quantities: dict[str, Quantity]
    reducers: dict[str, Reducer]
    memory: tuple[str, ...] = ()
    """Quantities of category ``memory``: checked to be numbers after every evaluation."""
    _graph: Any = None

    @property
    def graph(self) -> nx.DiGraph:
        """The dependency graph as a networkx DiGraph (built on first use)."""
        if self._graph is None:
            import networkx as nx

            g = nx.DiGraph()
            g.add_nodes_from(self.nodes)
            g.add_edges_from(self.edges)
            self._graph = g
        return self._graph

    def evaluate(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bool]]:
        """Evaluate every quantity. Returns ``(values, applied)``: ``applied[reducer_node]`` says
        whether each reducer's condition held.

        :raises PluginError: a quantity or reducer raised (other than a :class:`FitplanError`, which is
            the user's), or a memory quantity is not a number: the message names the plugin and the quantity.
        """
        v = dict(inputs)
        applied: dict[str, bool] = {}
        step: tuple = ()
        try:
            for step in self.steps:
                kind = step[0]
                if kind == Q:
                    _, name, fn, deps = step
                    v[name] = fn(*[v[d] for d in deps])
                elif kind == R:
                    _, name, prev, cond, cdeps, fn, tdeps = step
                    if cond(*[v[d] for d in cdeps]):
                        applied[name] = True
                        v[name] = fn(v[prev], *[v[d] for d in tdeps])
                    else:
                        applied[name] = False
                        v[name] = v[prev]
                else:
                    _, name, prev = step
                    v[name] = v[prev]
        except FitplanError:
            raise
        except Exception as e:  # noqa: BLE001 - name the plugin and the quantity, not a bare traceback
            raise self._step_error(step, v, e) from e
        for name in self.memory:
            x = v[name]
            if type(x) is not int and type(x) is not float and (isinstance(x, bool) or not isinstance(x, numbers.Real)):
                raise self._type_error(name, v)
        return v, applied

    def _step_error(self, step: tuple, values: dict[str, Any], e: Exception) -> PluginError:
        for m in self.memory:  # a wrong type upstream is the real fault, not the quantity that tripped on it
            if m in values and (isinstance(values[m], bool) or not isinstance(values[m], numbers.Real)):
                return self._type_error(m, values)
        name = step[1]
        node = self.nodes[name]
        if node.kind == "reducer":
            what = f"reducer {self.reducers[name].name!r} on quantity {node.target!r}"
        else:
            what = f"quantity {name.removesuffix('.raw')!r}"
        culprit = _declared_by_input(e, [values.get(d) for d in node.deps])
        if culprit is not None:
            obj, attr = culprit
            return PluginError(
                f"plugin {obj.plugin!r}: {type(obj).__name__} {obj.name!r} raised {type(e).__name__}: {e} in {attr}, "
                f"while computing {what} (plugin {node.plugin!r})",
                field=name.removesuffix(".raw"), value=obj.name, suggestion=f"block it with FITPLAN_BLOCK_PLUGINS={obj.plugin}")
        if isinstance(e, KeyError) and e.args and e.args[0] not in values and e.args[0] in node.deps:
            return PluginError(f"plugin {node.plugin!r}: {what} needs input {e.args[0]!r}, which was not given",
                               field=name.removesuffix(".raw"), value=e.args[0])
        others = [x for x in (values.get(d) for d in node.deps)
                  if attrs.has(type(x)) and isinstance(getattr(x, "plugin", None), str) and x.plugin not in ("", node.plugin)]
        blame = [node.plugin, *dict.fromkeys(x.plugin for x in others)]
        return PluginError(f"plugin {node.plugin!r}: {what} raised {type(e).__name__}: {e}"
                           + "".join(f" (input {type(x).__name__} {x.name!r} from plugin {x.plugin!r})" for x in others),
                           field=name.removesuffix(".raw"), value=node.plugin,
                           suggestion="block the faulty plugin with FITPLAN_BLOCK_PLUGINS=" + " or ".join(blame))

    def _type_error(self, name: str, values: dict[str, Any]) -> PluginError:
        """The first step of ``name``'s chain that produced a non-number, named by plugin."""
        chain = self.chains.get(name, [name])
        for n in chain:
            x = values.get(n)
            if isinstance(x, bool) or not isinstance(x, numbers.Real):
                node = self.nodes[n]
                what = (f"reducer {self.reducers[n].name!r} on quantity {name!r}" if node.kind == "reducer"
                        else f"quantity {name!r}")
                return PluginError(f"plugin {node.plugin!r}: {what} returned {type(x).__name__} {x!r:.60}, "
                                   "expected a number of bytes", field=name, value=node.plugin)
        return PluginError(f"quantity {name!r} is not a number: {values.get(name)!r:.60}", field=name)

    def to_dot(self) -> str:
        lines = ["digraph fitplan {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=10];']
        for n in sorted(self.graph.nodes):
            node = self.nodes[n]
            shape = {"input": "ellipse", "quantity": "box", "reducer": "hexagon"}[node.kind]
            label = n if not node.unit else f"{n}\\n[{node.unit}]"
            lines.append(f'  "{n}" [shape={shape}, label="{label}"];')
        for a, b in sorted(self.graph.edges):
            lines.append(f'  "{a}" -> "{b}";')
        lines.append("}")
        return "\n".join(lines) + "\n"

    def to_mermaid(self) -> str:
        ids = {n: f"n{i}" for i, n in enumerate(sorted(self.graph.nodes))}
        lines = ["flowchart LR"]
        for n, i in ids.items():
            kind = self.nodes[n].kind
            lines.append(f'  {i}{"([" if kind == "input" else "{{" if kind == "reducer" else "["}"{n}"{"])" if kind == "input" else "}}" if kind == "reducer" else "]"}')
        for a, b in sorted(self.graph.edges):
            lines.append(f"  {ids[a]} --> {ids[b]}")
        return "\n".join(lines) + "\n"


def _declared_by_input(e: Exception, deps: Sequence[Any]) -> tuple[Any, str] | None:
    """If ``e`` was raised inside a function held by an input a plugin declared (an OptimizerSpec's
    ``state_bytes``, ...), that input and the function's attribute name: the plugin to blame."""
    codes: dict[Any, tuple[Any, str]] = {}
    for obj in deps:
        if not (attrs.has(type(obj)) and isinstance(getattr(obj, "plugin", None), str) and getattr(obj, "plugin")):
            continue
        for f in attrs.fields(type(obj)):
            code = getattr(getattr(obj, f.name), "__code__", None)
            if code is not None:
                codes[code] = (obj, f.name)
    if not codes:
        return None
    tb = e.__traceback__
    found = None
    while tb is not None:
        found = codes.get(tb.tb_frame.f_code, found)
        tb = tb.tb_next
    return found


def _order_chain(target: str, reducers: Sequence[Reducer]) -> list[Reducer]:
    import networkx as nx

    by_name = {r.name: r for r in reducers}
    g = nx.DiGraph()
    g.add_nodes_from(by_name)
    for r in reducers:
        for a in r.after:
            if a in by_name:
                g.add_edge(a, r.name)
        for b in r.before:
            if b in by_name:
                g.add_edge(r.name, b)
    try:
        order = list(nx.lexicographical_topological_sort(g))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(g)
        raise GraphError(
            f"reducers on {target!r} have contradictory ordering: " + " -> ".join(a for a, _ in cycle) + f" -> {cycle[0][0]}",
            field=target,
        ) from None
    return [by_name[n] for n in order]


def compile_graph(quantities: Iterable[Quantity], reducers: Iterable[Reducer]) -> CompiledGraph:
    """Check and order the declarations.

    :raises GraphError: duplicate quantity names (naming both plugins), duplicate reducer names on
        one target, reducers on unknown targets, unbound dependencies (with a suggestion), cycles.
    """
    qs: dict[str, Quantity] = {}
    problems: list[str] = []
    for q in quantities:
        if q.name in qs:
            problems.append(f"quantity {q.name!r} is declared by plugin {qs[q.name].plugin!r} and again by plugin {q.plugin!r}")
            continue
        if q.name in INPUTS:
            problems.append(f"plugin {q.plugin!r} declares quantity {q.name!r}, which is an input name")
            continue
        qs[q.name] = q
    chains_in: dict[str, list[Reducer]] = {}
    for r in reducers:
        if r.target not in qs:
            hint = did_you_mean(r.target, qs)
            problems.append(f"plugin {r.plugin!r}: reducer {r.name!r} targets unknown quantity {r.target!r}" + (f" ({hint})" if hint else ""))
            continue
        chain = chains_in.setdefault(r.target, [])
        if any(x.name == r.name for x in chain):
            other = next(x for x in chain if x.name == r.name)
            problems.append(f"reducer {r.name!r} on {r.target!r} is declared by plugin {other.plugin!r} and again by plugin {r.plugin!r}")
            continue
        chain.append(r)

    edges: list[tuple[str, str]] = []
    nodes: dict[str, Node] = {}
    known = set(qs) | INPUTS
    key = _fingerprint(qs, chains_in) if not problems else None
    cached = _cache_load(key)

    def need(dep: str, who: str, plugin: str) -> None:
        if dep not in known:
            hint = did_you_mean(dep, known)
            problems.append(f"plugin {plugin!r}: {who} depends on unknown name {dep!r}" + (f" ({hint})" if hint else ""))

    for q in qs.values():
        raw = f"{q.name}.raw" if q.name in chains_in else q.name
        nodes[raw] = Node(raw, "quantity", q.deps, q.unit, q.doc, q.plugin, category=q.category)
        for d in q.deps:
            need(d, f"quantity {q.name!r}", q.plugin)
            edges.append((d, raw))
    ordered_chains: dict[str, list[str]] = {}
    reducer_by_node: dict[str, Reducer] = {}
    for target, chain in chains_in.items():
        try:
            if cached is not None and sorted(cached["chains"].get(target, ())) == sorted(r.name for r in chain):
                by_name = {r.name: r for r in chain}
                ordered = [by_name[n] for n in cached["chains"][target]]
            else:
                cached = None
                ordered = _order_chain(target, chain)
        except GraphError as e:
            problems.append(e.message)
            continue
        prev = f"{target}.raw"
        names = [prev]
        for r in ordered:
            node = f"{target}.{r.name}"
            deps = tuple(dict.fromkeys((*r.condition_deps, *r.transform_deps)))
            nodes[node] = Node(node, "reducer", (prev, *deps), qs[target].unit, r.doc, r.plugin, target=target)
            for d in deps:
                need(d, f"reducer {r.name!r}", r.plugin)
                edges.append((d, node))
            edges.append((prev, node))
            reducer_by_node[node] = r
            prev = node
            names.append(node)
        q = qs[target]
        nodes[target] = Node(target, "quantity", (prev,), q.unit, q.doc, q.plugin, category=q.category)
        edges.append((prev, target))
        ordered_chains[target] = names
    for a, b in edges:
        for n in (a, b):
            if n not in nodes:
                nodes[n] = Node(n, "input", (), doc=RESOLVED_INPUTS.get(n, f"scenario field {FIELD_SECTION.get(n, '')}.{n}"))
    order = _valid_order(cached["order"], nodes, edges) if cached is not None and not problems else None
    if order is None:
        order = _order(nodes, edges, problems)
        if not problems:
            _cache_save(key, {"chains": {t: [n.split(".", 1)[1] for n in names[1:]] for t, names in ordered_chains.items()},
                              "order": order})
    if problems:
        raise GraphError(f"{len(problems)} problem(s) in the quantity graph", details=problems)
    steps: list[tuple] = []
    for n in order:
        node = nodes[n]
        if node.kind == "input":
            continue
        if node.kind == "reducer":
            r = reducer_by_node[n]
            steps.append((R, n, node.deps[0], r.condition, r.condition_deps, r.transform, r.transform_deps))
        elif n in ordered_chains:
            steps.append((ALIAS, n, node.deps[0]))
        else:
            base = n.removesuffix(".raw") if n.endswith(".raw") else n
            q = qs[base]
            steps.append((Q, n, q.func, q.deps))
    memory = tuple(sorted(n for n, q in qs.items() if q.category == "memory"))
    return CompiledGraph(edges, nodes, steps, ordered_chains, qs, {k: v for k, v in reducer_by_node.items()}, memory)


def _order(nodes: dict[str, Node], edges: list[tuple[str, str]], problems: list[str]) -> list[str]:
    """networkx: report cycles (into ``problems``), else the lexicographic topological order."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    cycles = _cycles(g, nodes)
    if cycles and not problems and len(cycles) == 1:
        path, plugins = cycles[0]
        raise GraphError(f"dependency cycle: {path}", details=[f"declared by plugin(s): {', '.join(plugins)}"])
    problems += [f"dependency cycle: {path} (declared by plugin(s): {', '.join(plugins)})" for path, plugins in cycles]
    if problems:
        return []
    return list(nx.lexicographical_topological_sort(g))


# --------------------------------------------------------------------------- the order cache


def _fingerprint(qs: dict[str, Quantity], chains_in: dict[str, list[Reducer]]) -> str:
    """A key for everything the order depends on: names, dependencies, reducer ordering constraints."""
    from fitplan import __version__

    parts = [__version__, sorted(INPUTS)]
    parts.append(sorted((q.name, list(q.deps)) for q in qs.values()))
    parts.append(sorted((r.target, r.name, list(r.after), list(r.before), list(r.condition_deps), list(r.transform_deps))
                        for chain in chains_in.values() for r in chain))
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _cache_dir() -> Path | None:
    if os.environ.get("FITPLAN_NO_CACHE"):
        return None
    base = os.environ.get("FITPLAN_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fitplan"


def _cache_load(key: str | None) -> dict[str, Any] | None:
    d = _cache_dir()
    if key is None or d is None:
        return None
    try:
        data = json.loads((d / f"graph-{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("order"), list) or not isinstance(data.get("chains"), dict):
        return None
    return data


def _cache_save(key: str | None, data: dict[str, Any]) -> None:
    d = _cache_dir()
    if key is None or d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"graph-{key}.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(d / f"graph-{key}.json")
    except OSError:
        pass  # a read-only home is fine: the next compile computes the order again


def _valid_order(order: list[Any], nodes: dict[str, Node], edges: list[tuple[str, str]]) -> list[str] | None:
    """``order`` if it lists exactly the current nodes and every edge points forward, else None."""
    if len(order) != len(nodes) or set(order) != nodes.keys():
        return None
    pos = {n: i for i, n in enumerate(order)}
    if any(pos[a] >= pos[b] for a, b in edges):
        return None
    return order


def _cycles(g: nx.DiGraph, nodes: dict[str, Node]) -> list[tuple[str, list[str]]]:
    """One cycle per strongly connected component (or self-loop): ``(a -> b -> a, plugins)``."""
    import networkx as nx

    out = []
    for comp in sorted(nx.strongly_connected_components(g), key=lambda c: sorted(c)):
        if len(comp) == 1:
            (n,) = comp
            if not g.has_edge(n, n):
                continue
        cycle = nx.find_cycle(g.subgraph(comp), source=min(comp))
        path = " -> ".join(a for a, _ in cycle) + f" -> {cycle[0][0]}"
        out.append((path, sorted({nodes[a].plugin for a, _ in cycle if a in nodes})))
    return out
