"""``fitplan explain``: the derivation tree of a quantity (rule, plugin, inputs, values, rulesets) and
where the seed chapter's assumptions give another value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from fitplan.output.console import render_rich
from fitplan.output.formats import RenderOptions
from fitplan.units import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from fitplan.assess import Assessment
    from fitplan.estimation import Estimate


@attrs.frozen
class Explanation:
    """What ``fitplan explain`` shows: the tree of one quantity and the seed's differences."""

    tree: dict[str, Any]
    seed_differences: tuple[str, ...] = ()
    confidence: dict[str, Any] | None = None
    """How the quantity is known when it is the peak or a breakdown row (builtin/confidence.py), else None."""

    def to_json(self) -> dict[str, Any]:
        out = {"tree": self.tree, "seed_differences": list(self.seed_differences)}
        if self.confidence:
            out["confidence"] = self.confidence
        return out


def explain(a: Assessment, name: str, *, depth: int = 3, units: str = "GB") -> Explanation:
    """The explanation of quantity ``name`` in an assessment (assessed with ``seed=True`` for the seed's
    differences; for the peak, those of every breakdown row and of the framework overhead too)."""
    est = a.estimate
    names = [name]
    compiled = est.registry.compiled()
    if name == compiled.role("peak"):
        names += [q for q, meta in compiled.quantities.items() if meta.row or meta.role == "overhead"]
    return Explanation(explain_tree(est, name, depth=depth, units=units), tuple(seed_differences(est, a.seed, names)),
                       row_confidence(est, name))


def row_confidence(est: Estimate, name: str) -> dict[str, Any] | None:
    """The confidence entry of the peak or of the breakdown row ``name`` computes (the quantity of role
    ``confidence``)."""
    compiled = est.registry.compiled()
    meta = compiled.quantities.get(name)
    row = "peak" if name == compiled.role("peak") else getattr(meta, "row", None)
    conf = est.values.get(compiled.role("confidence")) if row else None
    return conf.get(row) if isinstance(conf, dict) else None


def format_value(value: Any, unit: str, units: str = "GB") -> str:
    if value is None:
        return "None"
    if type(value).__name__ == "Rulesets":
        return f"Rulesets({len(value.gpus)} GPUs, {len(value.providers)} providers, {len(value.instances)} instances, " \
               f"{len(value.models)} models; {', '.join(value.dirs)})"
    if unit == "s" and isinstance(value, (int, float)) and value >= 600:
        return f"{value:,.6g} s ({value / 3600:,.3g} h)"
    if unit == "bytes" and isinstance(value, (int, float)):
        return f"{format_bytes(value, units)} ({int(value):,} B)"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(x, unit if unit == 'bytes' else '', units)}" for k, x in value.items()) + "}"
    if isinstance(value, float):
        return f"{value:,.6g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if hasattr(value, "name") and hasattr(value, "__attrs_attrs__"):
        return f"{type(value).__name__}({value.name})" if hasattr(value, "name") else type(value).__name__
    if isinstance(value, tuple) and len(value) > 6:
        return f"({len(value)} entries)"
    text = repr(value)
    return text if len(text) <= 300 else text[:297] + "..."


def explain_tree(est: Estimate, name: str, *, depth: int = 4, units: str = "GB") -> dict[str, Any]:
    """A nested dict: the quantity, its value, rule, plugin, and its dependencies' trees."""
    seen: dict[str, int] = {}  # quantity -> the depth left when it was expanded
    chains = est.registry.compiled().chains

    def walk(n: str, d: int) -> dict[str, Any]:
        p = est.provenance(n)
        node = {"name": n, "kind": p["kind"], "value": format_value(p["value"], p["unit"], units), "plugin": p["plugin"],
                "doc": p["doc"], "children": []}
        if "applied" in p:
            node["applied"] = p["applied"]
        if "ruleset" in p:
            node["ruleset"] = p["ruleset"]
        if seen.get(n, 0) >= d or d <= 0:  # shown above at least this deep, or the depth is spent
            node["elided"] = bool(p["deps"])
            return node
        seen[n] = d
        chain = chains.get(n)
        if chain:
            # a reduced quantity: its raw contributor, then each reducer (applied or not) with its own inputs
            node["children"] = [walk(chain[0], d - 1)]
            for step in chain[1:]:
                rp = est.provenance(step)
                node["children"].append({
                    "name": step, "kind": "reducer", "value": format_value(rp["value"], rp["unit"], units),
                    "plugin": rp["plugin"], "doc": rp["doc"], "applied": rp["applied"],
                    "children": [walk(dep, d - 2) for dep in rp["deps"][1:]] if rp["applied"] else [],
                })
            return node
        node["children"] = [walk(dep, d - 1) for dep in p["deps"]]
        return node

    return walk(name, depth)


def seed_differences(est: Estimate, seed_est: Estimate | None, names: list[str]) -> list[str]:
    """One line per quantity of ``names`` whose value differs under the seed chapter's assumptions."""
    if seed_est is None:
        return []
    out = []
    graph = est.registry.compiled()
    for n in names:
        a, b = est.values.get(n), seed_est.values.get(n)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a != b:
            node = graph.nodes.get(n)
            if node is not None and node.unit != "bytes":
                out.append(f"{n}: {format_value(a, node.unit)} {node.unit} here, {format_value(b, node.unit)} {node.unit} "
                           "under the seed chapter's assumptions")
                continue
            here, there = format_bytes(a), format_bytes(b)
            if here == there:
                here, there = f"{int(a):,} B", f"{int(b):,} B"
            out.append(f"{n}: {here} here, {there} under the seed chapter's assumptions")
    return out


def print_tree(tree: dict[str, Any], console) -> None:
    from rich.markup import escape
    from rich.tree import Tree

    def label(node: dict[str, Any]) -> str:
        kind = node["kind"]
        mark = ""
        if kind == "reducer":
            mark = " [green]✓ applied[/]" if node.get("applied") else " [dim]✗ not applied[/]"
        src = f" [dim]\\[{escape(node['plugin'])}][/]" if node["plugin"] else ""
        rs = f" [dim](ruleset: {escape(str(node['ruleset']))})[/]" if node.get("ruleset") else ""
        more = " [dim]…[/]" if node.get("elided") else ""
        doc = f"\n[italic dim]{escape(node['doc'])}[/]" if node["doc"] and kind != "input" else ""
        return f"[bold]{escape(node['name'])}[/] = {escape(node['value'])}{mark}{src}{rs}{more}{doc}"

    def add(parent, node):
        branch = parent.add(label(node))
        for child in node["children"]:
            add(branch, child)

    root = Tree(label(tree))
    for child in tree["children"]:
        add(root, child)
    console.print(root)


def to_terminal(x: Explanation, options: RenderOptions) -> str:
    from rich.markup import escape

    def draw(console: Any) -> None:
        print_tree(x.tree, console)
        if x.confidence:
            console.print(f"known: {x.confidence['short']} ({escape(x.confidence['basis'])})")
        if x.seed_differences:
            console.print("\n[bold]Where the seed chapter's assumptions differ[/] (fitplan estimate --assumptions seed):")
            for d in x.seed_differences:
                console.print(f"  - {d}")

    return render_rich(draw, options)
