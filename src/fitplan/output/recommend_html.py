"""The HTML report of ``fitplan recommend --format html``: one self-contained file, inline CSS and SVG,
no JavaScript, nothing fetched from the network.

Two charts: each shown plan's memory per GPU as a stacked bar (with the device total and the GPU's usable
memory marked), and cost against time for the shown plans with the Pareto front as a step line.
Deterministic (fixed number formatting, no timestamps), so it is snapshot-tested like the other reports.
"""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING

from fitplan import __version__
from fitplan.output.why_text import why_lines
from fitplan.output.plan_text import command_line, describe_market, rejection_text
from fitplan.output.recommend_report import (PLAN_COLUMNS, _header, cost_text, no_plan_text, plan_row, side_columns,
                                             side_rows, side_summary, stats_line, time_text)

if TYPE_CHECKING:
    from fitplan.search.plans import Plan, Result

PALETTE = ("#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d", "#b6992d", "#499894", "#bab0ac", "#d37295",
           "#fabfd2", "#b07aa1")
"""Colours of the memory chart's segments, in the order of the breakdown rows."""
CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #222; max-width: 1240px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
p.meta { color: #555; margin: 2px 0; font-size: 13px; }
table { border-collapse: collapse; font-size: 12px; margin-top: 8px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 7px; text-align: left; white-space: nowrap; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 12px; background: #f4f4f4; padding: 2px 4px; word-break: break-all; }
.note { color: #555; font-size: 12px; } svg text { font-family: inherit; }
"""


def _n(x: float) -> str:
    """Fixed SVG coordinate formatting."""
    return f"{x:.1f}"


def _plans_shown(result: Result) -> list[Plan]:
    seen: set[int] = set()
    out = []
    for p in [*result.plans, *result.pareto]:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _name(result: Result, p: Plan) -> str:
    if p.rank is not None:
        return f"#{p.rank}"
    return f"F{result.pareto.index(p) + 1}" if p in result.pareto else "?"


def memory_chart(result: Result) -> str:
    """Stacked bars of each shown plan's memory per GPU (GB = 10^9 bytes)."""
    plans = [p for p in _plans_shown(result) if p.estimate is not None]
    if not plans:
        return ""
    segments = _segments(plans[0].estimate)
    rows = []
    for p in plans:
        parts = [(label, color, b) for name, label, color in segments if (b := _segment_bytes(p.estimate, name)) > 0]
        rows.append((p, parts, p.device_total_bytes, p.usable_bytes))
    scale_max = max(max(sum(b for _, _, b in parts), total, usable) for _, parts, total, usable in rows)
    left, width, bar_h, gap, top = 70, 860, 16, 8, 10
    legend = _legend_rows(segments, left, width)
    height = top + len(rows) * (bar_h + gap) + 40 + 16 * len(legend)
    px = width / scale_max
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 40}" height="{height}" '
           f'viewBox="0 0 {left + width + 40} {height}" role="img" aria-label="memory per GPU of each plan">']
    for i, (p, parts, total, usable) in enumerate(rows):
        y = top + i * (bar_h + gap)
        out.append(f'<text x="{left - 6}" y="{_n(y + bar_h - 4)}" font-size="11" text-anchor="end">{escape(_name(result, p))}</text>')
        x = float(left)
        for label, color, b in parts:
            w = b * px
            out.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{bar_h}" fill="{color}">'
                       f'<title>{escape(label)}: {b / 1e9:.2f} GB</title></rect>')
            x += w
        tx = left + total * px
        out.append(f'<path d="M{_n(tx - 4)},{_n(y - 3)} L{_n(tx + 4)},{_n(y - 3)} L{_n(tx)},{_n(y + 3)} Z" fill="#000">'
                   f'<title>device total {total / 1e9:.2f} GB</title></path>')
        ux = left + usable * px
        out.append(f'<line x1="{_n(ux)}" y1="{_n(y - 2)}" x2="{_n(ux)}" y2="{_n(y + bar_h + 2)}" stroke="#c00" '
                   f'stroke-dasharray="3,2"><title>usable {usable / 1e9:.2f} GB</title></line>')
    axis_y = top + len(rows) * (bar_h + gap) + 4
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + width}" y2="{axis_y}" stroke="#888"/>')
    for t in _ticks(0, scale_max / 1e9):
        x = left + t * 1e9 * px
        out.append(f'<line x1="{_n(x)}" y1="{axis_y}" x2="{_n(x)}" y2="{axis_y + 4}" stroke="#888"/>'
                   f'<text x="{_n(x)}" y="{axis_y + 15}" font-size="10" text-anchor="middle">{_tick_label(t)}</text>')
    for r, row in enumerate(legend):
        ly = axis_y + 34 + 16 * r
        for lx, label, color in row:
            out.append(f'<rect x="{_n(lx)}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
                       f'<text x="{_n(lx + 14)}" y="{ly}" font-size="10">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _segment_bytes(est, name: str) -> int:
    """A row's bytes at the peak instant (the ``breakdown`` role), or the quantity's own value (the framework
    overhead, which is not part of the peak): the stacked segments sum to the device total."""
    q = est.registry.compiled().quantities[name]
    parts = est.role("breakdown")
    if parts is not None and q.role != "overhead":
        return int(parts.get(q.row, 0))
    return int(est.values.get(name) or 0)


def _segments(est) -> list[tuple[str, str, str]]:
    """``(quantity, label, colour)`` of the chart's segments: the breakdown rows (the framework overhead last)."""
    rows = [q for _, q in est.registry.compiled().rows()]
    return [(q.name, q.compact_label, PALETTE[i % len(PALETTE)]) for i, q in enumerate(rows)]


def _legend_rows(segments: list[tuple[str, str, str]], left: float, width: float) -> list[list[tuple[float, str, str]]]:
    """Legend entries laid out in rows that fit ``width`` (about 6 px per character at font size 10)."""
    rows: list[list[tuple[float, str, str]]] = [[]]
    x = float(left)
    for _, label, color in segments:
        w = 14 + 6.0 * len(label) + 16
        if rows[-1] and x + w > left + width:
            rows.append([])
            x = float(left)
        rows[-1].append((x, label, color))
        x += w
    return rows


def _ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    out = []
    t = start
    while t <= hi + 1e-9 * step:
        out.append(round(t, 10))
        t += step
    return out


def _tick_label(t: float) -> str:
    return f"{t:g}" if abs(t) >= 0.01 or t == 0 else f"{t:.2g}"


def cost_time_chart(result: Result) -> str:
    """Cost against time for the shown plans; the Pareto front as a step line."""
    pts = [(p, p.train_seconds / 3600, p.cost_usd) for p in _plans_shown(result)
           if p.train_seconds is not None and p.cost_usd is not None]
    rejected = [(p, p.train_seconds / 3600, p.cost_usd) for p in result.rejected
                if p.train_seconds is not None and p.cost_usd is not None]
    if not pts:
        return ""
    allx = [x for _, x, _ in pts + rejected]
    ally = [y for _, _, y in pts + rejected]
    x0, x1 = 0.0, max(allx) * 1.08
    y0, y1 = 0.0, max(ally) * 1.1
    left, top, w, h = 70, 20, 820, 380
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + w + 60}" height="{top + h + 60}" '
           f'viewBox="0 0 {left + w + 60} {top + h + 60}" role="img" aria-label="cost against time">']

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return top + h - (y - y0) / (y1 - y0) * h

    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>')
    for t in _ticks(x0, x1):
        out.append(f'<line x1="{_n(sx(t))}" y1="{top}" x2="{_n(sx(t))}" y2="{top + h}" stroke="#eee"/>'
                   f'<text x="{_n(sx(t))}" y="{top + h + 15}" font-size="10" text-anchor="middle">{_tick_label(t)}</text>')
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{left}" y1="{_n(sy(t))}" x2="{left + w}" y2="{_n(sy(t))}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{_n(sy(t) + 3)}" font-size="10" text-anchor="end">{_tick_label(t)}</text>')
    out.append(f'<text x="{left + w / 2}" y="{top + h + 34}" font-size="12" text-anchor="middle">training time (hours)</text>')
    out.append(f'<text x="16" y="{top + h / 2}" font-size="12" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + h / 2})">cost (USD)</text>')
    front = sorted(((p.train_seconds / 3600, p.cost_usd) for p in result.pareto
                    if p.train_seconds is not None and p.cost_usd is not None))
    if front:
        d = [f"M{_n(sx(front[0][0]))},{_n(sy(y1))}", f"L{_n(sx(front[0][0]))},{_n(sy(front[0][1]))}"]
        for (xa, ya), (xb, yb) in zip(front, front[1:]):
            d.append(f"L{_n(sx(xb))},{_n(sy(ya))}")
            d.append(f"L{_n(sx(xb))},{_n(sy(yb))}")
        d.append(f"L{_n(sx(x1))},{_n(sy(front[-1][1]))}")
        out.append(f'<path d="{" ".join(d)}" fill="none" stroke="#e15759" stroke-width="1.5">'
                   '<title>Pareto front: no plan is both faster and cheaper</title></path>')
    for p, x, y in rejected:
        out.append(f'<circle cx="{_n(sx(x))}" cy="{_n(sy(y))}" r="4" fill="none" stroke="#999">'
                   f'<title>rejected: {escape(p.label)} ({escape(rejection_text(p))})</title></circle>')
    for p, x, y in pts:
        on_front = p in result.pareto
        color = "#e15759" if on_front else "#4e79a7"
        out.append(f'<circle cx="{_n(sx(x))}" cy="{_n(sy(y))}" r="5" fill="{color}">'
                   f'<title>{escape(_name(result, p))} {escape(p.label)}: {x:.2f} h, ${y:,.2f}</title></circle>'
                   f'<text x="{_n(sx(x) + 7)}" y="{_n(sy(y) - 5)}" font-size="10">{escape(_name(result, p))}</text>')
    ly = top + h + 50
    out.append(f'<circle cx="{left}" cy="{ly - 4}" r="5" fill="#4e79a7"/><text x="{left + 9}" y="{ly}" font-size="10">ranked plan</text>'
               f'<circle cx="{left + 100}" cy="{ly - 4}" r="5" fill="#e15759"/><text x="{left + 109}" y="{ly}" font-size="10">on the Pareto front</text>'
               f'<circle cx="{left + 240}" cy="{ly - 4}" r="4" fill="none" stroke="#999"/><text x="{left + 249}" y="{ly}" font-size="10">rejected by policy</text>')
    out.append("</svg>")
    return "\n".join(out)


def _table(result: Result, plans: list[Plan], names: bool = False) -> str:
    cols = ["plan", *PLAN_COLUMNS[1:]] if names else list(PLAN_COLUMNS)
    numeric = {"#", "GB/GPU", "free GB", "time", "cost"}
    rows = ["<table><thead><tr>" + "".join(f"<th>{escape(c)}</th>" for c in cols) + "</tr></thead><tbody>"]
    for p in plans:
        cells = plan_row(p)
        if names:
            cells = [_name(result, p), *cells[1:]]
        rows.append("<tr>" + "".join(f'<td class="num">{escape(v)}</td>' if c in numeric else f"<td>{escape(v)}</td>"
                                     for c, v in zip(cols, cells)) + "</tr>")
    rows.append("</tbody></table>")
    return "\n".join(rows)


def render(result: Result) -> str:
    """The whole report as one HTML document (with ``--vary``: the side-by-side table, then each side's own
    sections)."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>fitplan recommend</title>", f"<style>{CSS}</style></head><body>",
             "<h1>fitplan recommend</h1>"]
    parts += [f'<p class="meta">{escape(x)}</p>' for x in _header(result)]
    if result.vary:
        cols = side_columns(result)
        parts += ["<h2>Side by side</h2>", f"<p>{escape(side_summary(result))}</p>",
                  "<table><thead><tr>" + "".join(f"<th>{escape(c)}</th>" for c in cols) + "</tr></thead><tbody>"]
        parts += ["<tr>" + "".join(f"<td>{escape(v)}</td>" for v in row) + "</tr>" for row in side_rows(result)]
        parts.append("</tbody></table>")
    for title, view in result.views():
        parts += _group(view, f": {title}" if title else "")
    parts.append("<h2>Search</h2>")
    parts.append(f'<p class="note">{escape(stats_line(result))}</p>')
    for k, v in sorted(result.stats.rejected_by.items()):
        parts.append(f'<p class="note">rejected by {escape(k)}: {v:,}</p>')
    for n in result.stats.notes:
        parts.append(f'<p class="note">note: {escape(n)}</p>')
    for title, view in result.views():
        if view.plans:
            parts.append(f"<p>Reproduce plan 1{escape(' of ' + title) if title else ''}: "
                         f"<code>{escape(command_line(result.base, view.plans[0]))}</code></p>")
    parts.append(f'<p class="note">GB = 10^9 bytes. fitplan {escape(__version__)}.</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _group(result: Result, suffix: str) -> list[str]:
    """One result's (or one side's: ``suffix`` names it) ranked plans, charts, front and rejected plans."""
    sfx = escape(suffix)
    parts = [f"<h2>Ranked plans{sfx}</h2>"]
    parts.append(_table(result, result.plans) if result.plans else f"<p>{escape(no_plan_text(result))}</p>")
    for p in result.plans:
        for v in p.penalties:
            parts.append(f'<p class="note">plan {p.rank} penalised by {escape(v.rule)} (× {1 + v.penalty:g}): '
                         f'{escape(v.reason)}</p>')
        parts += [f'<p class="note">plan {p.rank}: {escape(n)}</p>' for n in p.notes]
    if result.why is not None:
        parts += [f"<h3>Why plan 1{sfx}</h3>", "<ul>" + "".join(f"<li>{escape(x)}</li>" for x in why_lines(result.why, result.plans[0]))
                  + "</ul>"]
    chart = memory_chart(result)
    if chart:
        parts += [f"<h2>Memory per GPU{sfx}</h2>",
                  '<p class="note">GB per GPU of each plan shown (#: ranked, F: Pareto front). Components are resident '
                  "at different phases of a step, so the bar is not the peak: ▼ marks the device total (the peak phase "
                  "+ CUDA context + allocator reserve), the dashed red line the GPU's usable memory.</p>", chart]
    parts.append(f"<h2>Cost versus time{sfx}</h2>")
    chart = cost_time_chart(result)
    parts.append(chart or "<p>No plan has both a time and a cost (add a dataset and a provider).</p>")
    if result.pareto:
        parts += [f"<h3>The Pareto front (fastest first){sfx}</h3>", _table(result, result.pareto, names=True)]
    if result.rejected:
        parts.append(f"<h2>Rejected by policy{sfx}</h2><table><thead><tr><th>plan</th><th>market</th><th>time</th>"
                     "<th>cost</th><th>rejected by</th></tr></thead><tbody>")
        for p in result.rejected:
            t, c = time_text(p), cost_text(p)
            parts.append(f"<tr><td>{escape(p.label)}</td><td>{escape(describe_market(p))}</td><td class=\"num\">{t}</td>"
                         f"<td class=\"num\">{c}</td><td>{escape(rejection_text(p))}</td></tr>")
        parts.append("</tbody></table>")
    return parts
