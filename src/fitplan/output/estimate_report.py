"""Rendering an Estimate: JSON (bytes as integers), a terminal table, Markdown, and explain trees.

All output is deterministic (no timestamps, sorted keys where order is not meaningful), so that
reports can be snapshot-tested. Human units are GB (10^9 bytes) unless ``units="GiB"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from fitplan import __version__
from fitplan.estimation import MEMORY_KEYS, Estimate
from fitplan.units import format_bytes, format_count

JSON_SECTIONS: list[Callable[[Estimate], dict[str, Any]]] = []
"""Functions adding top-level sections to the JSON report (time and cost register here)."""
TEXT_SECTIONS: list[Callable[[Estimate, str], list[tuple[str, str]]]] = []
"""Functions adding ``(label, value)`` summary lines to the table and Markdown reports."""


def _scenario_dict(est: Estimate) -> dict[str, Any]:
    out = {}
    for section in attrs.fields(type(est.scenario)):
        value = attrs.asdict(getattr(est.scenario, section.name))
        out[section.name] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in value.items()}
    return out


def to_json(est: Estimate) -> dict[str, Any]:
    v = est.values
    arch = est.arch
    memory: dict[str, Any] = {
        "per_gpu_bytes": est.memory_bytes(),
        "peak_phase": v["peak_phase"],
        "phases_bytes": {k: int(x) for k, x in v["phase_bytes"].items()},
        "usable_bytes": v["usable_bytes"],
        "fits": v["fits"],
        "headroom_bytes": v["headroom_bytes"],
        "cpu_offload_bytes": v["cpu_offload_bytes"],
        "unit": "bytes",
    }
    out: dict[str, Any] = {
        "fitplan_version": __version__,
        "assumptions": est.scenario.model.assumptions,
        "model": {
            "name": arch.name,
            "family": arch.family,
            "param_count": v["param_count"],
            "trainable_param_count": v["trainable_param_count"],
            "source": arch.source,
        },
        "gpu": None if v["gpu_spec"] is None else {"id": v["gpu_spec"].id, "name": v["gpu_spec"].name,
                                                     "usable_bytes": v["gpu_spec"].usable_bytes},
        "optimizer": v["optimizer_spec"].name,
        "world_size": v["world_size"],
        "memory": memory,
        "scenario": _scenario_dict(est),
        "warnings": list(est.warnings),
    }
    for section in JSON_SECTIONS:
        out.update(section(est))
    return out


_LABELS = {
    "weights": "weights",
    "master_weights": "master weights (fp32)",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "activations": "activations",
    "logits": "logits + loss",
    "autocast_copies": "autocast weight copies",
    "comm_buffers": "communication buffers",
}


def summary_lines(est: Estimate, units: str) -> list[tuple[str, str]]:
    v = est.values
    s = est.scenario
    lines = [
        ("model", f"{est.arch.name} ({format_count(v['param_count'])} params, {format_count(v['trainable_param_count'])} trainable)"),
        ("setup", f"{s.model.method}, {s.training.precision}, {v['optimizer_spec'].name}, micro-batch {s.training.per_device_train_batch_size} "
                  f"× seq {s.training.max_seq_length}" + (", grad. checkpointing" if s.training.gradient_checkpointing else "")
                  + (f", ZeRO-{v['shard_stage']} over {v['shard_degree']} GPUs" if v["shard_stage"] and v["shard_degree"] > 1 else "")),
        ("assumptions", s.model.assumptions),
        ("peak (allocated)", f"{format_bytes(v['peak_bytes'], units)} at {v['peak_phase'].replace('_', ' ')}"),
        ("device total", format_bytes(v["device_total_bytes"], units) + " (peak + CUDA context + allocator reserve)"),
    ]
    if v["gpu_spec"] is not None:
        verdict = "fits" if v["fits"] else "does NOT fit"
        lines.append(("GPU", f"{v['gpu_spec'].name}: {format_bytes(v['usable_bytes'], units)} usable, {verdict} "
                             f"(headroom {format_bytes(v['headroom_bytes'], units)})"))
    if v["cpu_offload_bytes"]:
        lines.append(("CPU RAM (offload)", format_bytes(v["cpu_offload_bytes"], units) + " per node"))
    for section in TEXT_SECTIONS:
        lines.extend(section(est, units))
    return lines


def breakdown_rows(est: Estimate) -> list[tuple[str, int]]:
    mem = est.memory_bytes()
    return [(_LABELS[k], mem[k]) for k in _LABELS if mem.get(k)]


def to_markdown(est: Estimate, units: str = "GB") -> str:
    lines = [f"# fitplan estimate: {est.arch.name}", ""]
    for label, value in summary_lines(est, units):
        lines.append(f"- **{label}**: {value}")
    lines += ["", f"| component | {units} | share of peak |", "|---|---:|---:|"]
    peak = max(est.values["peak_bytes"], 1)
    for label, b in breakdown_rows(est):
        lines.append(f"| {label} | {format_bytes(b, units).split()[0]} | {100 * b / peak:.1f} % |")
    lines.append(f"| **peak** | **{format_bytes(est.values['peak_bytes'], units).split()[0]}** | |")
    lines.append(f"| **device total** | **{format_bytes(est.values['device_total_bytes'], units).split()[0]}** | |")
    if est.warnings:
        lines += ["", "Warnings:", *[f"- {w}" for w in est.warnings]]
    lines += ["", f"_{units} = {'10^9' if units == 'GB' else '2^30'} bytes. Components are resident at different phases; "
                  "the peak is the largest phase, not their sum._", ""]
    return "\n".join(lines)


def print_table(est: Estimate, console, units: str = "GB") -> None:
    from rich.table import Table

    from rich.markup import escape

    for label, value in summary_lines(est, units):
        console.print(f"[bold]{label:>18}[/]  {escape(value)}")
    table = Table(title=None, show_edge=False, pad_edge=False)
    table.add_column("component")
    table.add_column(units, justify="right")
    table.add_column("share of peak", justify="right")
    table.add_column("")
    peak = max(est.values["peak_bytes"], 1)
    for label, b in breakdown_rows(est):
        share = b / peak
        table.add_row(label, format_bytes(b, units).split()[0], f"{100 * share:.1f} %", "█" * max(1, round(30 * min(share, 1))))
    console.print(table)
    for w in est.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    console.print(f"[dim]{units} = {'10^9' if units == 'GB' else '2^30'} bytes; components are resident at different phases, "
                  "the peak is the largest phase.[/]")


# --------------------------------------------------------------------------- explain


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
    seen: set[str] = set()
    chains = est.registry.compiled().chains

    def walk(n: str, d: int) -> dict[str, Any]:
        p = est.provenance(n)
        node = {"name": n, "kind": p["kind"], "value": format_value(p["value"], p["unit"], units), "plugin": p["plugin"],
                "doc": p["doc"], "children": []}
        if "applied" in p:
            node["applied"] = p["applied"]
        if "ruleset" in p:
            node["ruleset"] = p["ruleset"]
        if n in seen or d <= 0:
            node["elided"] = bool(p["deps"])
            return node
        seen.add(n)
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


# --------------------------------------------------------------------------- time and cost sections


def _num(v: Any) -> Any:
    return None if v is None else (int(v) if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 2**53) else v)


def time_json(est: Estimate) -> dict[str, Any]:
    """The ``time`` section: tokens, FLOPs, seconds, throughput, MFU, communication share (null when unknown)."""
    v = est.values
    return {"time": {
        "tokens": _num(v.get("train_tokens")),
        "dataset_tokens": _num(v.get("dataset_tokens")),
        "padding_tokens": _num(v.get("padding_tokens")),
        "truncated_tokens": _num(v.get("truncated_tokens")),
        "flops_per_token": _num(v.get("flops_per_token")),
        "flops": _num(v.get("train_flops")),
        "seconds": v.get("train_seconds"),
        "hours": None if v.get("train_seconds") is None else v["train_seconds"] / 3600,
        "tokens_per_second": v.get("train_tokens_per_second"),
        "throughput_basis": v.get("throughput_basis"),
        "mfu": v.get("train_mfu"),
        "assumed_mfu": v.get("assumed_mfu"),
        "peak_flops_per_gpu": v.get("peak_flops_per_gpu"),
        "matmul_dtype": v.get("matmul_dtype"),
        "step_seconds": v.get("step_seconds"),
        "communication_share": v.get("communication_share"),
    }}


def cost_json(est: Estimate) -> dict[str, Any]:
    """The ``cost`` section: GPU-hours, on-demand and spot totals over ``runs`` (null when unknown), in ``currency``."""
    v = est.values
    plan = v.get("instance_choice")
    runs = est.scenario.cost.runs
    out: dict[str, Any] = {
        "gpu_hours": v.get("gpu_hours"),
        "runs": runs,
        "on_demand_usd": v.get("on_demand_cost_usd"),
        "spot_usd": v.get("spot_cost_usd"),
        "on_demand_usd_per_run": None if v.get("on_demand_cost_usd") is None else v["on_demand_cost_usd"] / runs,
        "spot_usd_per_run": None if v.get("spot_cost_usd") is None else v["spot_cost_usd"] / runs,
        "provider": est.scenario.cost.provider,
        "instance": None if plan is None else plan.instance.id,
        "instance_count": None if plan is None else plan.count,
        "gpus_paid": None if plan is None else plan.gpus_paid,
        "region": None if plan is None else plan.instance.region,
        "on_demand_per_hour": None if plan is None else plan.on_demand_per_hour,
        "spot_per_hour": None if plan is None else plan.spot_per_hour,
        "billing": None if plan is None else plan.provider.billing,
        "billed_seconds_on_demand": v.get("billed_seconds_on_demand"),
        "billed_seconds_spot": v.get("billed_seconds_spot"),
        "spot_overhead": None if plan is None else plan.provider.spot_overhead,
        "currency": v.get("cost_currency") or "USD",
    }
    return {"cost": out}


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:,.2f} h ({seconds:,.0f} s)"


def time_lines(est: Estimate, units: str) -> list[tuple[str, str]]:
    v = est.values
    if v.get("train_tokens") is None:
        return [("time", "give --num-examples and --tokens-per-example (or --total-tokens) to estimate time and cost")]
    s = est.scenario
    d = s.dataset
    how = (f"{d.num_examples:,} examples × {d.tokens_per_example:,.0f} tokens" if d.total_tokens is None
           else f"{d.total_tokens:,} tokens") + f" × {s.training.num_train_epochs:g} epoch(s)"
    tokens = f"{v['train_tokens']:,.0f} ({how}, {'packed' if d.padding == 'pack' else 'padded to ' + str(s.training.max_seq_length)})"
    if v.get("padding_tokens"):
        tokens += f"; {v['padding_tokens']:,.0f} of them padding ({100 * v['padding_tokens'] / v['train_tokens']:.1f} %)"
    if v.get("truncated_tokens"):
        tokens += f"; {v['truncated_tokens']:,.0f} tokens truncated"
    lines = [("tokens", tokens),
             ("FLOPs", f"{v['flops_per_token']:.3g} per token, {v['train_flops']:.3g} in all")]
    if v.get("train_seconds") is None:
        lines.append(("time", "needs --gpu (or --tokens-per-second / --throughput-source)"))
        return lines
    tps = f"{v['train_tokens_per_second']:,.0f} tokens/s, {v['throughput_basis']}"
    if v.get("train_mfu") is not None:
        tps += f"; achieved MFU {100 * v['train_mfu']:.1f} %"
        if v["train_mfu"] > 1:
            tps += f" (over 100 %: impossible at the {v.get('matmul_dtype')} peak; check --precision)"
    if v.get("communication_share") is not None:
        tps += f"; communication {100 * v['communication_share']:.1f} % of the step"
    lines.append(("time", f"{_duration(v['train_seconds'])} at {tps}"))
    return lines


def cost_lines(est: Estimate, units: str) -> list[tuple[str, str]]:
    v = est.values
    if v.get("gpu_hours") is None:
        return []
    runs = est.scenario.cost.runs
    plan = v.get("instance_choice")
    lines = [("GPU-hours", f"{v['gpu_hours']:,.2f}" + (f" ({runs} runs)" if runs > 1 else ""))]
    if plan is None:
        lines.append(("cost", "give --provider (and --gpu) to price it"))
        return lines
    cur = v.get("cost_currency") or "USD"
    per = f" for {runs} runs" if runs > 1 else ""
    spot = ("no spot price" if v.get("spot_cost_usd") is None else
            f"{v['spot_cost_usd']:,.2f} {cur} spot" + (f" (+{100 * plan.provider.spot_overhead:g} % interruption overhead)"
                                                        if plan.provider.spot_overhead else ""))
    lines.append(("cost", f"{v['on_demand_cost_usd']:,.2f} {cur} on demand, {spot}{per}"))
    lines.append(("instances", f"{plan.count} × {plan.provider.id} {plan.instance.id} ({plan.instance.gpus} × {plan.instance.gpu}"
                               + (f", {plan.instance.region}" if plan.instance.region else "") + f"), {plan.on_demand_per_hour:,.2f} {cur}/h"
                               + f", billed per {plan.provider.billing}"))
    return lines


JSON_SECTIONS.extend([time_json, cost_json])
TEXT_SECTIONS.extend([time_lines, cost_lines])

from fitplan.rules.advice import advice_json, advice_lines  # noqa: E402 - the checklist's advice (rulesets/advice)

JSON_SECTIONS.append(advice_json)
TEXT_SECTIONS.append(advice_lines)


def moe_json(est: Estimate) -> dict[str, Any]:
    """The MoE routing statement (``moe_routing``), for MoE models."""
    r = est.values.get("moe_routing")
    return {"moe_routing": r} if r else {}


def moe_lines(est: Estimate, units: str) -> list[tuple[str, str]]:
    r = est.values.get("moe_routing")
    return [("MoE routing", r["assumption"])] if r else []


JSON_SECTIONS.append(moe_json)
TEXT_SECTIONS.append(moe_lines)
