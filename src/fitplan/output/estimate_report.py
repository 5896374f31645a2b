"""The estimate report: JSON (bytes as integers), Markdown and the terminal, from an assessment.

The report is assembled from the registered report sections (the built-in memory, time and cost ones live
in ``fitplan.builtin.report``), the advice and policy verdicts of the assessment, and the breakdown table,
whose rows are the quantities with ``row`` metadata. Renderers only format: the assess step
(:mod:`fitplan.assess`) evaluated everything. Output is deterministic (no timestamps), so that reports can
be snapshot-tested. Human units are GB (10^9 bytes) unless ``units="GiB"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitplan import __version__
from fitplan.output.console import escape, md, render_rich
from fitplan.output.formats import RenderOptions
from fitplan.units import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from fitplan.assess import Assessment
    from fitplan.estimation import Estimate


def scenario_json(est: Estimate) -> dict[str, Any]:
    from fitplan.inputs.scenario import SECTIONS, section_values

    out = {}
    for section in SECTIONS:
        value = section_values(est.scenario, section)
        out[section] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in value.items()}
    return out


def sections_json(est: Estimate) -> dict[str, Any]:
    """The report sections' JSON (memory, time, cost, a plugin's own), in section order."""
    out: dict[str, Any] = {}
    for section in est.registry.sections:
        data = section.json(est)
        if data is not None:
            out.update(data)
    return out


def to_json(a: Assessment) -> dict[str, Any]:
    """The whole estimate report as JSON."""
    est = a.estimate
    out: dict[str, Any] = {"fitplan_version": __version__}
    out.update(sections_json(est))
    out["scenario"] = scenario_json(est)
    out["warnings"] = list(est.warnings)
    out["advice"] = [x.to_dict() for x in a.advice]
    if a.verdicts is not None:
        out["policy"] = list(a.verdicts)
    if a.cheapest is not None:
        out["cheapest"] = dict(a.cheapest)
    return out


def cheapest_text(a: Assessment, units: str) -> str | None:
    """The ``cheapest GPU`` line: where the run costs least on demand, and on how many GPUs it fits."""
    c = a.cheapest
    if c is None:
        return None
    est = a.estimate
    if not c["fits_on"]:
        return f"fits on none of the {len(est.rulesets.gpus)} GPU types at {est.scenario.hardware.num_gpus} GPU(s)"
    fits = f"fits on {len(c['fits_on'])} of {len(est.rulesets.gpus)} GPU types"
    if "gpu" not in c:
        why = "give the dataset size to price it" if est.role("seconds") is None else "no provider prices them"
        return f"{fits} ({', '.join(c['fits_on'])}); {why}"
    gpu = est.rulesets.gpus[c["gpu"]]
    hours = c["seconds"] / 3600
    currency = est.rulesets.providers[c["provider"]].currency
    return (f"{gpu.name} on {c['provider']} ({c['instance']}): {c['on_demand_usd']:,.2f} {currency} on demand, {hours:,.2f} h, "
            f"{format_bytes(c['device_total'], units)} of {format_bytes(c['usable'], units)}; {fits} "
            f"(fitplan estimate --gpu {c['gpu']} --provider {c['provider']})")


def summary_lines(a: Assessment, units: str) -> list[tuple[str, str]]:
    """``(label, text)`` lines: every section's, then the advice."""
    est = a.estimate
    lines: list[tuple[str, str]] = []
    for section in est.registry.sections:
        lines.extend(section.lines(est, units))
    cheap = cheapest_text(a, units)
    if cheap:
        lines.append(("cheapest GPU", cheap))
    lines.extend(("advice", x.message) for x in a.advice)
    return lines


def breakdown_rows(est: Estimate) -> list[tuple[str, int, str]]:
    """``(label, bytes, confidence)`` of the non-zero rows of the peak phase: the ``breakdown`` role's
    ``{row: bytes}`` (which sums to the peak), labelled by the memory quantities declaring each ``row``, in
    declaration order, with the ``confidence`` role's compact entry for the row ("" when none). Without a
    breakdown quantity: each row quantity's own value."""
    compiled = est.registry.compiled()
    parts = est.role("breakdown")
    known = est.role("confidence") or {}
    out = []
    for name, q in compiled.quantities.items():
        if not q.row or q.category != "memory" or q.role == "overhead":
            continue
        b = int(parts.get(q.row, 0)) if parts is not None else int(est.values.get(name) or 0)
        if b:
            out.append((q.label, b, (known.get(q.row) or {}).get("short", "")))
    return out


def _verdict_text(v: dict[str, Any]) -> str:
    return f"{v['rule']} ({v['action']}{', ' + v['market'] if v['market'] else ''}): {v['reason']}"


def _totals(est: Estimate) -> tuple[int, int]:
    return int(est.role("peak") or 0), int(est.role("device_total") or 0)


def to_markdown(a: Assessment, units: str = "GB") -> str:
    est = a.estimate
    lines = [f"# fitplan estimate: {md(est.arch.name)}", ""]
    for label, value in summary_lines(a, units):
        lines.append(f"- **{md(label)}**: {md(value)}")
    peak, total = _totals(est)
    lines += ["", f"| at the peak | {units} | share of peak | known |", "|---|---:|---:|---|"]
    for label, b, known in breakdown_rows(est):
        lines.append(f"| {md(label)} | {format_bytes(b, units).split()[0]} | {100 * b / max(peak, 1):.1f} % | {md(known)} |")
    lines.append(f"| **peak** | **{format_bytes(peak, units).split()[0]}** | 100.0 % | |")
    lines.append(f"| **device total** | **{format_bytes(total, units).split()[0]}** | | |")
    if est.warnings:
        lines += ["", "Warnings:", *[f"- {md(w)}" for w in est.warnings]]
    lines += ["", f"_{units} = {'10^9' if units == 'GB' else '2^30'} bytes. The rows are what is alive at the peak "
                  "instant and sum to the peak; known: exact (the referee reproduces it on the CPU), source (modelled "
                  "from the allocating code), ±N % (approximate), see docs/memory-model.md._", ""]
    for v in a.verdicts or ():
        lines.insert(-1, f"- **policy {md(v['rule'])}** ({v['action']}{', ' + v['market'] if v['market'] else ''}): "
                         f"{md(v['reason'])}")
    return "\n".join(lines)


def to_terminal(a: Assessment, options: RenderOptions) -> str:
    return render_rich(lambda console: print_table(a, console, options.units), options)


def print_table(a: Assessment, console: Any, units: str = "GB") -> None:
    from rich.table import Table

    est = a.estimate
    for label, value in summary_lines(a, units):
        console.print(f"[bold]{label:>18}[/]  {escape(value)}")
    table = Table(title=None, show_edge=False, pad_edge=False)
    table.add_column("at the peak")
    table.add_column(units, justify="right")
    table.add_column("share", justify="right")
    table.add_column("known")
    table.add_column("")
    peak = max(_totals(est)[0], 1)
    for label, b, known in breakdown_rows(est):
        share = b / peak
        table.add_row(label, format_bytes(b, units).split()[0], f"{100 * share:.1f} %", known,
                      "█" * max(1, round(30 * min(share, 1))))
    console.print(table)
    for w in est.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    console.print(f"[dim]{units} = {'10^9' if units == 'GB' else '2^30'} bytes; the rows are alive at the peak instant and "
                  "sum to the peak; known: exact (referee, CPU), source (modelled from the allocating code), ±N % "
                  "(approximate).[/]")
    for v in a.verdicts or ():
        console.print(f"[red]policy {escape(v['rule'])}[/] ({escape(v['action'])}"
                      f"{', ' + escape(v['market']) if v['market'] else ''}): {escape(v['reason'])}")
