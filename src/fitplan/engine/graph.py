"""The quantity graph: declarations checked, ordered into steps once, evaluated many times.

Nodes are quantities and inputs (the names :func:`compile_graph` is told about); edges run from a
dependency to its dependent. A quantity with reducers becomes a chain: the contributor's node is renamed
``<name>.raw``, each reducer adds a node ``<name>.<reducer>``, and ``<name>`` is the end of the chain. The
order of a chain follows the reducers' ``after``/``before`` constraints (an unknown name there is an error
naming the plugin; ties are broken by name, so the order is deterministic).

Compiling checks every declaration (duplicate names, unbound dependencies, unknown reducer targets and
ordering names, roles held twice, cycles) and orders the nodes lexicographically-topologically with
Kahn's algorithm. The networkx DiGraph of the same nodes and edges (:attr:`CompiledGraph.graph`) is built
on first use, for what needs graph algorithms: naming a cycle, ancestors for the staged evaluation, the
DOT and Mermaid exports. Importing networkx costs about 0.1 s, so ``fitplan estimate`` never does.
Evaluation runs the ordered steps as one generated straight-line function
(:func:`fitplan.engine.interpreter.straight_line`; :func:`~fitplan.engine.interpreter.run` names a failing
step): no hook calls, no graph walks.
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

from fitplan.engine.declarations import Quantity, Reducer
from fitplan.engine.interpreter import ALIAS, Q, R, run, straight_line
from fitplan.errors import FitplanError, GraphError, PluginError, did_you_mean


AMOUNT_UNITS = frozenset({"bytes", "s", "USD", "tokens", "params", "FLOP", "GPUs", "instances", "bytes/param",
                          "bytes/elem", "FLOP/token", "FLOP/s", "tokens/s"})
"""Units of amounts: a third-party quantity (or reducer) in one of them returns a number from 0 to
:data:`MAX_AMOUNT`, or it is named as the plugin at fault (docs/reliability.md, "Plugins")."""
MAX_AMOUNT = 1e30
"""Beyond any amount the built-in rules give within the input bounds (the largest: 10^16 tokens × 10^4 epochs at
10^-3 tokens/s, about 10^23 s): a plugin's 1e300 bytes or dollars is a fault, never a result."""


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
    roles: dict[str, str] = attrs.Factory(dict)
    """Role (:data:`fitplan.engine.declarations.ROLES`) -> the quantity that holds it."""
    foreign: tuple[str, ...] = ()
    """Quantities and reducer steps of third-party plugins: a float among them must be finite (NaN or infinity
    would otherwise reach a report and the JSON writer, which refuses them), an amount within [0, MAX_AMOUNT]."""
    _graph: Any = None
    _straight: Any = None
    """The steps as one generated function (:func:`fitplan.engine.interpreter.straight_line`), made once the
    graph has been evaluated :attr:`STRAIGHT_AFTER` times."""
    _evaluations: int = 0
    STRAIGHT_AFTER: ClassVar[int] = 50
    """Generating the function costs about as much as a hundred step-by-step evaluations: a command that
    evaluates a few scenarios (``fitplan estimate``: one and its advice variants) runs the steps one by one;
    a search, a server or a benchmark generates it."""

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

    def role(self, role: str) -> str | None:
        """The quantity holding ``role``, or None when no plugin declares it."""
        return self.roles.get(role)

    def rows(self) -> list[tuple[str, Quantity]]:
        """``(row, quantity)`` of the breakdown rows, in declaration order."""
        return [(q.row, q) for q in self.quantities.values() if q.row]

    def evaluate(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bool]]:
        """Evaluate every quantity. Returns ``(values, applied)``: ``applied[reducer_node]`` says
        whether each reducer's condition held.

        :raises PluginError: a quantity or reducer raised (other than a :class:`FitplanError`, which is
            the user's), or a memory quantity is not a number: the message names the plugin and the quantity.
        """
        straight = self._straight
        if straight is None:
            self._evaluations += 1
            if self._evaluations > self.STRAIGHT_AFTER:
                straight = self._straight = straight_line(self.steps)
        if straight is not None:
            try:
                v, applied = straight(inputs)
            except FitplanError:
                raise
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException:  # noqa: BLE001 - run again step by step, which names the plugin
                straight = None
        if straight is None:
            v = dict(inputs)
            applied = {}
            run(self.steps, v, applied, self._step_error)
        if self.foreign:
            self.check_foreign(v, self.foreign)
        for name in self.memory:
            x = v[name]
            if type(x) is int:
                continue
            if type(x) is not float and (isinstance(x, bool) or not isinstance(x, numbers.Real)) or not math.isfinite(x):
                raise self._type_error(name, v)
        return v, applied

    def _step_error(self, step: tuple, values: dict[str, Any], e: Exception) -> FitplanError:
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
        blame = [p for p in (node.plugin, *dict.fromkeys(x.plugin for x in others)) if not p.startswith("fitplan.builtin.")]
        if not blame:  # fitplan's own quantity on inputs it accepted: not a plugin to block
            return FitplanError(f"fitplan cannot compute {what} for these inputs: {type(e).__name__}: {e}",
                                field=name.removesuffix(".raw"), value=None,
                                suggestion="an input outside what fitplan checks; please report it with the command "
                                           "(FITPLAN_DEBUG=1 shows where)")
        return PluginError(f"plugin {node.plugin!r}: {what} raised {type(e).__name__}: {e}"
                           + "".join(f" (input {type(x).__name__} {x.name!r} from plugin {x.plugin!r})" for x in others),
                           field=name.removesuffix(".raw"), value=node.plugin,
                           suggestion="block the faulty plugin with FITPLAN_BLOCK_PLUGINS=" + " or ".join(blame))

    def check_foreign(self, v: dict[str, Any], names: Iterable[str]) -> None:
        """Third-party values (``names``, a subset of :attr:`foreign`): a float is finite, an amount (a unit of
        :data:`AMOUNT_UNITS`) is from 0 to :data:`MAX_AMOUNT`; else the plugin is named (:class:`PluginError`)."""
        for name in names:
            x = v.get(name)
            if type(x) is float and not math.isfinite(x):
                raise self._range_error(name, x, "a finite number")
            if self.nodes[name].unit in AMOUNT_UNITS and isinstance(x, numbers.Real) and not isinstance(x, bool) \
                    and not 0 <= x <= MAX_AMOUNT:
                raise self._range_error(name, x, f"a number from 0 to {MAX_AMOUNT:g} {self.nodes[name].unit}")

    def _range_error(self, name: str, x: Any, want: str) -> PluginError:
        """A third-party quantity's or reducer's value out of :data:`MAX_AMOUNT` (or not finite), named by plugin."""
        node = self.nodes[name]
        what = (f"reducer {self.reducers[name].name!r} on quantity {node.target!r}" if node.kind == "reducer"
                else f"quantity {name!r}")
        return PluginError(f"plugin {node.plugin!r}: {what} returned {type(x).__name__} {x!r:.60}, expected {want}",
                           field=node.target or name, value=node.plugin,
                           suggestion=f"block it with FITPLAN_BLOCK_PLUGINS={node.plugin}")

    def _type_error(self, name: str, values: dict[str, Any]) -> PluginError:
        """The first step of ``name``'s chain that produced a non-number, named by plugin."""
        chain = self.chains.get(name, [name])
        for n in chain:
            x = values.get(n)
            if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
                node = self.nodes[n]
                what = (f"reducer {self.reducers[n].name!r} on quantity {name!r}" if node.kind == "reducer"
                        else f"quantity {name!r}")
                return PluginError(f"plugin {node.plugin!r}: {what} returned {type(x).__name__} {x!r:.60}, "
                                   "expected a finite number of bytes", field=name, value=node.plugin,
                                   suggestion=f"block it with FITPLAN_BLOCK_PLUGINS={node.plugin}")
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


def _topological_chain(target: str, reducers: Sequence[Reducer], problems: list[str]) -> list[Reducer]:
    """The reducers of one chain in their ``after``/``before`` order (ties by name); unknown ordering names
    and contradictions go to ``problems``."""
    by_name = {r.name: r for r in reducers}
    edges: list[tuple[str, str]] = []
    for r in reducers:
        for other, edge in [(a, (a, r.name)) for a in r.after] + [(b, (r.name, b)) for b in r.before]:
            if other not in by_name:
                hint = did_you_mean(other, by_name)
                problems.append(f"plugin {r.plugin!r}: reducer {r.name!r} on {target!r} is ordered relative to {other!r}, "
                                f"which is not a reducer on {target!r}" + (f" ({hint})" if hint else
                                f" (reducers on it: {', '.join(sorted(by_name))})"))
                continue
            edges.append(edge)
    order = _kahn(by_name, edges)
    if order is None:
        import networkx as nx

        g = nx.DiGraph(edges)
        cycle = nx.find_cycle(g)
        problems.append(f"reducers on {target!r} have contradictory ordering: " + " -> ".join(a for a, _ in cycle)
                        + f" -> {cycle[0][0]}")
        return []
    return [by_name[n] for n in order]


def _kahn(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> list[str] | None:
    """The lexicographically smallest topological order (networkx's ``lexicographical_topological_sort``),
    or None when the edges hold a cycle."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    indeg = dict.fromkeys(succ, 0)
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    ready = [n for n, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        n = heapq.heappop(ready)
        order.append(n)
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                heapq.heappush(ready, m)
    return order if len(order) == len(succ) else None


def _collect(quantities: Iterable[Quantity], reducers: Iterable[Reducer], inputs: Mapping[str, str],
             problems: list[str]) -> tuple[dict[str, Quantity], dict[str, list[Reducer]], dict[str, str]]:
    """Quantities by name, reducers by target and roles, with duplicates and unknown targets in ``problems``."""
    qs: dict[str, Quantity] = {}
    roles: dict[str, str] = {}
    for q in quantities:
        if q.name in qs:
            problems.append(f"quantity {q.name!r} is declared by plugin {qs[q.name].plugin!r} and again by plugin {q.plugin!r}")
            continue
        if q.name in inputs:
            problems.append(f"plugin {q.plugin!r} declares quantity {q.name!r}, which is an input name")
            continue
        if q.role:
            if q.role in roles:
                other = qs[roles[q.role]]
                problems.append(f"role {q.role!r} is held by quantity {other.name!r} (plugin {other.plugin!r}) and again by "
                                f"{q.name!r} (plugin {q.plugin!r})")
                continue
            roles[q.role] = q.name
        qs[q.name] = q
    chains_in: dict[str, list[Reducer]] = {}
    for r in reducers:
        if r.target not in qs:
            hint = did_you_mean(r.target, qs)
            problems.append(f"plugin {r.plugin!r}: reducer {r.name!r} targets unknown quantity {r.target!r}" + (f" ({hint})" if hint else ""))
            continue
        chain = chains_in.setdefault(r.target, [])
        other = next((x for x in chain if x.name == r.name), None)
        if other is not None:
            problems.append(f"reducer {r.name!r} on {r.target!r} is declared by plugin {other.plugin!r} and again by plugin {r.plugin!r}")
            continue
        chain.append(r)
    return qs, chains_in, roles


def compile_graph(quantities: Iterable[Quantity], reducers: Iterable[Reducer], inputs: Mapping[str, str]) -> CompiledGraph:
    """Check and order the declarations. ``inputs`` maps the names a quantity may depend on besides other
    quantities (scenario fields, resolved objects) to their documentation.

    :raises GraphError: duplicate quantity names or roles (naming both plugins), duplicate reducer names on
        one target, reducers on unknown targets or ordered relative to unknown reducers, unbound
        dependencies (with a suggestion), cycles.
    """
    problems: list[str] = []
    qs, chains_in, roles = _collect(quantities, reducers, inputs, problems)
    edges: list[tuple[str, str]] = []
    nodes: dict[str, Node] = {}
    known = set(qs) | set(inputs)

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
        prev = f"{target}.raw"
        names = [prev]
        for r in _topological_chain(target, chain, problems):
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
                nodes[n] = Node(n, "input", (), doc=inputs.get(n, ""))
    order = _kahn(nodes, edges)
    if order is None:
        _cycle_problems(nodes, edges, problems)
    if problems:
        raise GraphError(f"{len(problems)} problem(s) in the quantity graph", details=problems)
    steps = _steps(order, nodes, qs, reducer_by_node, ordered_chains)
    memory = tuple(sorted(n for n, q in qs.items() if q.category == "memory"))
    foreign = tuple(sorted(n for n, node in nodes.items() if node.kind != "input"
                           and not (node.plugin or "fitplan.builtin.").startswith("fitplan.builtin.")))
    return CompiledGraph(edges, nodes, steps, ordered_chains, qs, reducer_by_node, memory, roles, foreign)


def _steps(order: list[str], nodes: dict[str, Node], qs: dict[str, Quantity], reducer_by_node: dict[str, Reducer],
           chains: dict[str, list[str]]) -> list[tuple]:
    steps: list[tuple] = []
    for n in order:
        node = nodes[n]
        if node.kind == "input":
            continue
        if node.kind == "reducer":
            r = reducer_by_node[n]
            steps.append((R, n, node.deps[0], r.condition, r.condition_deps, r.transform, r.transform_deps))
        elif n in chains:
            steps.append((ALIAS, n, node.deps[0]))
        else:
            q = qs[n.removesuffix(".raw")]
            steps.append((Q, n, q.func, q.deps))
    return steps


def _cycle_problems(nodes: dict[str, Node], edges: list[tuple[str, str]], problems: list[str]) -> None:
    """networkx names the cycles (into ``problems``); a single cycle is raised on its own."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    cycles = _cycles(g, nodes)
    if len(cycles) == 1 and not problems:
        path, plugins = cycles[0]
        raise GraphError(f"dependency cycle: {path}", details=[f"declared by plugin(s): {', '.join(plugins)}"])
    problems += [f"dependency cycle: {path} (declared by plugin(s): {', '.join(plugins)})" for path, plugins in cycles]


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
