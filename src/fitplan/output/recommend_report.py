"""Recommendation reports: JSON, Markdown and the terminal (rich). The HTML report is :mod:`fitplan.output.recommend_html`.

Deterministic for snapshot tests: no timestamps or timings, plans in rank order, the front in time order,
fixed float formatting in text. JSON numbers are the estimate's own (bytes as integers); each plan
carries the ``fitplan estimate`` command line that reproduces its numbers.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from fitplan import __version__
from fitplan.inputs.settings import plan_labels
from fitplan.output.console import md, printable, render_rich
from fitplan.output.formats import RenderOptions
from fitplan.output.why_text import why_lines
from fitplan.output.plan_text import command_line, describe_market, rejection_text
from fitplan.units import format_bytes, format_count

if TYPE_CHECKING:
    from fitplan.search.plans import Plan, Result, Side


def plan_json(result: Result, plan: Plan) -> dict[str, Any]:
    """One plan: its choices, market, memory, time and cost sections (those of ``fitplan estimate
    --format json``), policy penalties or rejections, and the command that reproduces it."""
    from fitplan.output.estimate_report import sections_json

    est = {**sections_json(plan.estimate), "warnings": list(plan.estimate.warnings)} if plan.estimate is not None else {}
    out: dict[str, Any] = {
        "rank": plan.rank,
        "label": plan.label,
        "plan": dict(plan.fields),
        "market": plan.market,
        "cost_usd": plan.cost_usd,
        "train_seconds": plan.train_seconds,
        "likely_cost_usd": likely(plan, "cost"),
        "likely_train_seconds": likely(plan, "seconds"),
        "score": plan.score,
        "equivalent_plans": plan.equivalents,
        "memory": est.get("memory"),
        "time": est.get("time"),
        "cost": est.get("cost"),
        "warnings": est.get("warnings", []),
        "command": command_line(result.base, plan),
    }
    if plan.notes:
        out["notes"] = list(plan.notes)
    if plan.penalties:
        out["penalties"] = [v.to_dict() for v in plan.penalties]
    if plan.rejected_by:
        out["rejected_by"] = [v.to_dict() for v in plan.rejected_by]
    return out


def _model(result: Result) -> dict[str, Any] | None:
    """The model searched, shown once a plan was found (its estimate names it)."""
    shown = result.all_plans()
    return result.model if shown and shown[0].estimate is not None else None


def side_json(result: Result, side: Side) -> dict[str, Any]:
    """One side of ``--vary``: its values, its best plan, and its own ranking, front and rejected plans."""
    return {"values": dict(side.values), "best": plan_json(result, side.plans[0]) if side.plans else None,
            "plans": [plan_json(result, p) for p in side.plans],
            "pareto_front": [plan_json(result, p) for p in side.pareto],
            "rejected": [plan_json(result, p) for p in side.rejected],
            "why": None if side.why is None else side.why.to_dict()}


def to_json(result: Result) -> dict[str, Any]:
    """The report as JSON. With ``--vary``, ``plans``, ``pareto_front`` and ``rejected`` are empty and ``sides``
    holds each value's own (no ranking mixes values)."""
    space = result.space
    out = {
        "fitplan_version": __version__,
        "model": None if _model(result) is None else {"name": result.model["name"], "param_count": result.model["params"]},
        "objective": result.objective,
        "effective_batch_size": space.effective_batch_size,
        "headroom": result.headroom,
        "policies": result.policies,
        "plans": [plan_json(result, p) for p in result.plans],
        "pareto_front": [plan_json(result, p) for p in result.pareto],
        "rejected": [plan_json(result, p) for p in result.rejected],
        "why": None if result.why is None else result.why.to_dict(),
        "search": result.stats.to_dict(),
    }
    if result.vary:
        out["vary"] = list(result.vary)
        out["sides"] = [side_json(result, s) for s in result.sides]
    return out


# --------------------------------------------------------------------------- text


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:,.2f} h"


def likely(plan: Plan, role: str) -> tuple[float, float] | None:
    """The likely range of a plan's time (``role = "seconds"``) or cost (``"cost"``: its market's), from the
    estimate's ``.low`` / ``.high`` roles; None when the time is given or measured (no model error to show)."""
    est = plan.estimate
    if est is None:
        return None
    if role == "cost":
        if plan.market is None:
            return None
        role = f"cost.{plan.market}"
    low, high = est.role(role + ".low"), est.role(role + ".high")
    return None if low is None or high is None else (low, high)


def time_text(plan: Plan) -> str:
    """``3.10 h (2.67-3.66)``: the time the plan is ranked on, and its likely range."""
    band = likely(plan, "seconds")
    text = _hours(plan.train_seconds)
    return text if band is None else f"{text} ({band[0] / 3600:,.2f}-{band[1] / 3600:,.2f})"


def cost_text(plan: Plan) -> str:
    """``$42.50 ($36.58-50.26)``: the cost the plan is ranked on, and its likely range."""
    band = likely(plan, "cost")
    text = _usd(plan.cost_usd)
    return text if band is None else f"{text} (${band[0]:,.2f}-{band[1]:,.2f})"


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}"


def _gb(v: float | None) -> str:
    return "-" if v is None else format_bytes(v).replace(" GB", "")


def _hardware(plan: Plan) -> str:
    f = plan.fields
    hw = f"{f['num_nodes']}×{f['num_gpus']}× {f['gpu']}" if f["num_nodes"] > 1 else f"{f['num_gpus']}× {f['gpu']}"
    return hw


def _instance(plan: Plan) -> str:
    est = plan.estimate
    choice = est.role("instance") if est is not None else None
    if choice is None:
        return plan.fields.get("provider") or "-"
    return f"{choice.provider.id}/{choice.instance.id} ×{choice.count}"


def zero_label(fields) -> str:
    """``--zero N`` names its stack: DeepSpeed unless the plan says PyTorch-native (``--stack torch``); a
    ``*-master`` precision on several GPUs is DeepSpeed ZeRO-0 (inputs/stacks.py)."""
    who = "torch" if fields.get("stack") == "torch" else "DeepSpeed"
    return f"{who} ZeRO-{fields['zero_stage']}"


def _sharding(plan: Plan) -> str:
    f = plan.fields
    deepspeed = f["zero_stage"] or (plan.world_size > 1 and str(f.get("precision", "")).endswith("-master"))
    parts = [zero_label(f) if deepspeed else "DDP" if plan.world_size > 1 else "-"]
    if f["offload_optimizer"]:
        parts.append("offload opt.")
    parts += plan_labels(f)
    return ", ".join(parts)


def plan_row(plan: Plan) -> list[str]:
    f = plan.fields
    return [
        str(plan.rank) if plan.rank is not None else "",
        _hardware(plan),
        _instance(plan),
        describe_market(plan),
        f["method"],
        f["precision"],
        f["optim"],
        f"{f['per_device_train_batch_size']}×{f['gradient_accumulation_steps']}",
        "yes" if f["gradient_checkpointing"] else "no",
        _sharding(plan),
        f["attn_implementation"],
        _gb(plan.device_total_bytes),
        _gb(plan.headroom_bytes),
        time_text(plan),
        cost_text(plan),
    ]


PLAN_COLUMNS = ("#", "GPUs", "instance", "market", "method", "precision", "optimizer", "batch", "ckpt", "sharding",
                "attention", "GB/GPU", "free GB", "time", "cost")


def no_plan_text(result: Result) -> str:
    """Why there is no ranked plan."""
    if result.side is not None:  # the counts are the whole search's, not this side's
        why = "policies reject those that fit (see below)" if result.rejected else \
            "none fits with the required headroom, runs on these GPUs (fp16 presets only on GPUs without bf16) or has a price"
        return f"No plan for {result.side.title}: {why}."
    s = result.stats
    if s.rejected:
        return f"No plan is allowed: {s.rejected:,} fit, and the policies reject every one of them (see below)."
    if s.unpriced:
        return f"No plan has a price: {s.unpriced:,} fit, but none has the time and cost the objective needs."
    return "No plan fits with the required headroom."


def stats_line(result: Result) -> str:
    s = result.stats
    parts = [f"{s.candidates:,} candidate plans: {s.allowed:,} allowed",
             f"{s.too_big:,} too big", f"{s.pruned_monotone:,} pruned (a smaller micro-batch did not fit)"]
    if s.rejected:
        parts.append(f"{s.rejected:,} rejected by policy")
    if s.unpriced:
        parts.append(f"{s.unpriced:,} without a price")
    if s.too_big_host_ram:
        parts[1] += f" ({s.too_big_host_ram:,} of them: the instance's host RAM is less than the CPU offload needs)"
    if s.invalid:
        parts.append(f"{s.invalid:,} invalid")
    return ", ".join(parts) + f"; {s.memory_evaluations:,} memory and {s.time_evaluations:,} time evaluations"


def _header(result: Result) -> list[str]:
    base = result.base
    model = _model(result)
    name = model["name"] if model is not None else (base.model.model or base.model.params or "?")
    lines = [f"model {name}" + (f" ({format_count(model['params'])} params)" if model is not None else ""),
             f"objective: {result.objective}; effective batch {result.space.effective_batch_size}; "
             f"required headroom {result.headroom}"]
    if result.policies:
        lines.append("policies: " + ", ".join(f"{p['id']} ({p['action']})" for p in result.policies))
    if result.vary:
        lines.append(f"varied: {', '.join(result.vary)}: each value's plans are ranked on their own, side by side "
                     "(they train different models)")
    unverified = sorted({u for p in result.all_plans() if p.estimate is not None
                         for u in [getattr(p.estimate.arch, "unverified", None)] if u})
    lines += [f"memory figures approximate, not exact: the learned architecture file {u} was written with "
              "`fitplan learn-architecture --no-verify`" for u in unverified]
    if any(likely(p, "seconds") is not None for p in result.all_plans()):
        lines.append("time and cost: plans are ranked on the central value; in parentheses the likely range (the 10th "
                     "to 90th percentile of the time model's leave-one-out error on published runs)")
    return lines


SIDE_COLUMNS = ("GPUs", "instance", "market", "precision", "sharding", "time", "cost")
"""The columns of the side-by-side table (beside the varied dimensions' values), from :func:`plan_row`."""


def side_columns(result: Result) -> list[str]:
    """The side-by-side table's columns: the varied dimensions, then :data:`SIDE_COLUMNS` not among them."""
    return [*result.vary, *(c for c in SIDE_COLUMNS if c not in result.vary)]


def side_rows(result: Result) -> list[list[str]]:
    """One row per side: the varied values, then its best plan's hardware, time and cost (or why none)."""
    idx = [PLAN_COLUMNS.index(c) for c in side_columns(result)[len(result.vary):]]
    rows = []
    for side in result.sides:
        values = [side.values[d] for d in result.vary]
        if side.plans:
            row = plan_row(side.plans[0])
            rows.append(values + [row[i] for i in idx])
        else:
            rows.append(values + [no_plan_text(result.side_view(side))] + [""] * (len(idx) - 1))
    return rows


def side_summary(result: Result) -> str:
    """``full $312.00 · lora $41.20 · qlora $35.10``: each side's best objective value, in one line."""
    def best(side) -> str:
        if not side.plans:
            return "no plan"
        p = side.plans[0]
        return {"cost": _usd(p.cost_usd), "time": _hours(p.train_seconds), "gpus": f"{p.world_size} GPUs"}[result.objective]
    return " · ".join(f"{' '.join(s.values.values())} {best(s)}" for s in result.sides)


def to_markdown(result: Result) -> str:
    lines = ["# fitplan recommend", ""]
    lines += [f"- {md(x)}" for x in _header(result)]
    if result.vary:
        cols = side_columns(result)
        lines += ["", "## Side by side", "", md(side_summary(result)), "",
                  "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(md(x) for x in row) + " |" for row in side_rows(result)]
    for title, view in result.views():
        lines += _md_group(view, f": {title}" if title else "")
    lines += ["", "## Search", "", stats_line(result)]
    for k, v in sorted(result.stats.rejected_by.items()):
        lines.append(f"- rejected by {md(k)}: {v:,}")
    for k, v in sorted(result.stats.invalid_reasons.items()):
        lines.append(f"- invalid ({v:,}): {md(k)}")
    lines += [f"- {md(n)}" for n in result.stats.notes]
    for title, view in result.views():
        if view.plans:
            command = printable(command_line(result.base, view.plans[0]))
            fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", command)), default=0))
            lines += ["", f"Reproduce plan 1{' of ' + title if title else ''}:", "", fence, command, fence]
    lines += ["", "_GB = 10^9 bytes. GB/GPU is the device total (peak + CUDA context + allocator reserve)._", ""]
    return "\n".join(lines)


def _md_group(result: Result, suffix: str) -> list[str]:
    """The ranked plans, the front and the rejected plans of one result (or one side: ``suffix`` names it)."""
    lines = ["", f"## Ranked plans{md(suffix)}", ""]
    lines += _md_table(result.plans) if result.plans else [f"_{no_plan_text(result)}_"]
    if result.why is not None:
        lines += ["", f"## Why plan 1{md(suffix)}", ""] + [f"- {md(x)}" for x in why_lines(result.why, result.plans[0])]
    lines += ["", f"## Cost versus time: the Pareto front{md(suffix)}", "",
              "Plans no other plan beats on both time and cost, fastest first.", ""]
    lines += _md_table(result.pareto) if result.pareto else ["_No plan has both a time and a cost._"]
    if result.rejected:
        lines += ["", f"## Rejected by policy{md(suffix)}", "", "| plan | time | cost | rejected by |", "|---|---:|---:|---|"]
        for p in result.rejected:
            lines.append(f"| {md(p.label)} | {time_text(p)} | {cost_text(p)} | {md(rejection_text(p))} |")
    if any(p.penalties for p in result.plans):
        lines += ["", "Penalties:"]
        for p in result.plans:
            for v in p.penalties:
                lines.append(f"- plan {p.rank}: {md(v.rule)} (× {1 + v.penalty:g}): {md(v.reason)}")
    if any(p.notes for p in result.plans):
        lines += ["", "Notes:"]
        for p in result.plans:
            lines += [f"- plan {p.rank}: {md(n)}" for n in p.notes]
    return lines


def _md_table(plans: list[Plan]) -> list[str]:
    out = ["| " + " | ".join(PLAN_COLUMNS) + " |", "|" + "---|" * len(PLAN_COLUMNS)]
    for p in plans:
        out.append("| " + " | ".join(md(x) for x in plan_row(p)) + " |")
    return out


def print_result(result: Result, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    for line in _header(result):
        console.print(escape(line))
    if result.vary:
        t = Table(title="Side by side: each value's best plan", title_justify="left", show_edge=False, pad_edge=False)
        for c in side_columns(result):
            t.add_column(c, justify="right" if c in ("time", "cost") else "left")
        for row in side_rows(result):
            t.add_row(*[escape(x) for x in row])
        console.print(t)
        console.print(escape(side_summary(result)))
    for title, view in result.views():
        _print_group(view, console, f": {title}" if title else "")
    console.print(f"[dim]{escape(stats_line(result))}[/]")
    for k, v in sorted(result.stats.rejected_by.items()):
        console.print(f"[dim]rejected by {escape(k)}: {v:,}[/]")
    for k, v in sorted(result.stats.invalid_reasons.items()):
        console.print(f"[dim]invalid ({v:,}): {escape(k)}[/]")
    for n in result.stats.notes:
        console.print(f"[yellow]note:[/] {escape(n)}")
    for title, view in result.views():
        if view.plans:
            console.print(f"[dim]reproduce plan 1{escape(' of ' + title) if title else ''}:[/] "
                          + escape(command_line(result.base, view.plans[0])))


def _print_group(result: Result, console, suffix: str) -> None:
    """The ranked plans, the front and the rejected plans of one result (or one side: ``suffix`` names it)."""
    from rich.markup import escape
    from rich.table import Table

    def table(title: str, plans: list[Plan]) -> None:
        t = Table(title=escape(title), title_justify="left", show_edge=False, pad_edge=False)
        for c in PLAN_COLUMNS:
            t.add_column(c, justify="right" if c in ("#", "GB/GPU", "free GB", "time", "cost") else "left")
        for p in plans:
            t.add_row(*[escape(x) for x in plan_row(p)])
        console.print(t)

    if result.plans:
        table(f"Ranked plans{suffix}", result.plans)
    else:
        console.print(f"[bold red]{escape(no_plan_text(result))}{escape(suffix)}[/]")
    if result.why is not None:
        console.print(escape(f"Why plan 1{suffix}:"))
        for line in why_lines(result.why, result.plans[0]):
            console.print("  " + escape(line))
    if result.pareto:
        table(f"Cost versus time: the Pareto front (fastest first){suffix}", result.pareto)
    if result.rejected:
        t = Table(title=escape(f"Rejected by policy{suffix}"), title_justify="left", show_edge=False, pad_edge=False)
        for c in ("plan", "time", "cost", "rejected by"):
            t.add_column(c, justify="right" if c in ("time", "cost") else "left")
        for p in result.rejected:
            t.add_row(escape(p.label), time_text(p), cost_text(p), escape(rejection_text(p)))
        console.print(t)
    for p in result.plans:
        for v in p.penalties:
            console.print(escape(f"plan {p.rank} penalised by {v.rule} (× {1 + v.penalty:g}): {v.reason}"))
        for n in p.notes:
            console.print(f"[yellow]plan {p.rank}:[/] {escape(n)}")


def to_terminal(result: Result, options: RenderOptions) -> str:
    return render_rich(lambda console: print_result(result, console), options)
