"""Terminal renderings of listings: the plugins (``fitplan plugins``), the model catalog (``fitplan models
list``) and a validation report (``fitplan validate``)."""

from __future__ import annotations

from typing import Any

from fitplan.output.console import escape, render_rich
from fitplan.output.formats import RenderOptions
from fitplan.units import format_bytes_auto, format_count


def plugins_terminal(data: dict[str, Any], options: RenderOptions) -> str:
    def draw(console: Any) -> None:
        for r in data["plugins"]:
            kind = "built-in" if r["builtin"] else "third-party"
            dist = f", {r['distribution']} {r['version']}" if r.get("distribution") and not r["builtin"] else ""
            console.print(f"[bold]{escape(r['name'])}[/] [dim]({kind}{escape(dist)})[/]")
            for key in ("quantities", "reducers", "optimizers", "optimizers_not_hf", "names", "settings", "commands",
                        "formats", "ruleset_dirs"):
                if r.get(key):
                    label = {"optimizers_not_hf": "optimizers that are not HF TrainingArguments.optim names"}.get(key, key)
                    console.print(f"    {label}: {escape(', '.join(r[key]))}")
            for opt, reason in (r.get("optimizers_refused") or {}).items():
                console.print(f"    refused optimizer {escape(opt)}: {escape(reason)}")
        if data["blocked"]:
            console.print(f"[yellow]blocked[/] (FITPLAN_BLOCK_PLUGINS): {escape(', '.join(data['blocked']))}")
        if data.get("checked") and not data["problems"]:
            console.print("[green]no problems found[/]")

    return render_rich(draw, options)


def models_terminal(rows: list[dict[str, Any]], options: RenderOptions) -> str:
    from rich.table import Table

    columns = {"id": "id", "hf_id": "HF id", "model_type": "type", "param_count": "params"}  # JSON key -> heading

    def draw(console: Any) -> None:
        t = Table(show_edge=False)
        for heading in columns.values():
            t.add_column(heading, justify="right" if heading == "params" else "left")
        for r in rows:
            t.add_row(*[format_count(r[k]) if h == "params" else escape(r[k]) for k, h in columns.items()])
        console.print(t)

    return render_rich(draw, options)


def validate_terminal(report: dict[str, Any], options: RenderOptions) -> str:
    from rich.table import Table

    def draw(console: Any) -> None:
        t = Table(title=escape(f"predicted vs measured ({report.get('mode', '')}, {report.get('device', '')})"),
                  show_edge=False)
        for c in ("component", "predicted", "measured", "error"):
            t.add_column(c, justify="left" if c == "component" else "right")
        for name, c in report.get("components", {}).items():
            err = c.get("relative_error")
            t.add_row(escape(name), format_bytes_auto(c.get("predicted")), format_bytes_auto(c.get("measured")),
                      "-" if err is None else f"{100 * err:+.2f} %")
        console.print(t)

    return render_rich(draw, options)
