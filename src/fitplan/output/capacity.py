"""The capacity tables (``fitplan capacity``) and the largest micro-batch or sequence (``recommend --max``),
as Markdown and terminal text."""

from __future__ import annotations

from typing import Any

from fitplan.output.console import escape, md, render_rich
from fitplan.output.formats import RenderOptions
from fitplan.arch.typical import CATALOG_LADDER
from fitplan.units import format_bytes, format_count


def size_text(row: dict[str, Any]) -> str:
    """A largest-model row's size (``9.47B``; ``>`` at the deepest model probed; ``none``)."""
    if not row["layers"]:
        return "none"
    text = format_count(row["params"]).replace(".00", "")
    return (">" if row["at_limit"] else "") + text


def _rows(table: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    single_cols = ["GPU", "usable", "seed: full", "fitplan: full", "seed: efficient", "fitplan: QLoRA",
                   "fitplan: LoRA", "fitplan, seed assumptions: full", "catalog (full / QLoRA)"]
    single = []
    for r in table["single_gpu"]:
        seed = r.get("seed", {})
        single.append([r["gpu"], f"{r['usable'] / 1e9:.1f} GB", seed.get("full", "-"), size_text(r["full"]),
                       seed.get("efficient", "-"), size_text(r["qlora"]), size_text(r["lora"]),
                       size_text(r["seed_full"]),
                       f"{r['catalog']['full'] or '-'} / {r['catalog']['qlora'] or '-'}"])
    multi_cols = ["configuration", "combined usable", "seed: VRAM", "seed: efficient", "fitplan: QLoRA + ZeRO-3",
                  "fitplan: LoRA + ZeRO-3", "fitplan: full + ZeRO-3", "catalog (full / QLoRA)"]
    multi = []
    for r in table["multi_gpu"]:
        seed = r["seed"]
        multi.append([f"{r['num_gpus']}× {r['gpu']}", f"{r['usable'] / 1e9:.0f} GB", seed["vram"], seed["efficient"],
                      size_text(r["qlora"]), size_text(r["lora"]), size_text(r["full"]),
                      f"{r['catalog']['full'] or '-'} / {r['catalog']['qlora'] or '-'}"])
    return single_cols, single, multi_cols, multi


def _method_lines(table: dict[str, Any]) -> list[str]:
    return [f"{k}: {v}" for k, v in table["method"].items()] + [
        "models: Llama-shaped (hidden 128·L, intermediate 8/3·hidden rounded to 256, MHA, vocabulary 32,000; "
        "L = 32 is Llama-2-7B), largest depth L that fits (device total ≤ usable memory); catalog: the largest of "
        + ", ".join(CATALOG_LADDER) + " that fits"]


def to_markdown(table: dict[str, Any]) -> str:
    sc_, s_rows, mc, m_rows = _rows(table)
    lines = ["# Largest model per GPU: the seed's tables, recomputed", "", "## One GPU", "",
             "| " + " | ".join(sc_) + " |", "|" + "---|" * len(sc_)]
    lines += ["| " + " | ".join(md(x) for x in r) + " |" for r in s_rows]
    lines += ["", "## Several GPUs (ZeRO-3)", "", "| " + " | ".join(mc) + " |", "|" + "---|" * len(mc)]
    lines += ["| " + " | ".join(md(x) for x in r) + " |" for r in m_rows]
    lines += ["", "## Method", ""] + [f"- {md(x)}" for x in _method_lines(table)]
    lines += ["", "## Why the numbers differ", ""] + [f"- {md(n)}" for n in table["notes"]] + [""]
    return "\n".join(lines)


def print_table(table: dict[str, Any], console) -> None:
    from rich.table import Table

    sc_, s_rows, mc, m_rows = _rows(table)
    for title, cols, rows in (("One GPU", sc_, s_rows), ("Several GPUs (ZeRO-3)", mc, m_rows)):
        t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for c in cols:
            t.add_column(escape(c), justify="left" if c in ("GPU", "configuration") or c.startswith("catalog") else "right")
        for r in rows:
            t.add_row(*[escape(x) for x in r])
        console.print(t)
    console.print("[bold]Method[/]")
    for x in _method_lines(table):
        console.print(f"  - {escape(x)}")
    console.print("[bold]Why the numbers differ[/]")
    for n in table["notes"]:
        console.print(f"  - {escape(n)}")


def to_terminal(table: dict[str, Any], options: RenderOptions) -> str:
    return render_rich(lambda console: print_table(table, console), options)


def largest_text(r: dict[str, Any]) -> str:
    """``recommend --max``'s answer in words."""
    what = r["what"]
    flag = "--per-device-train-batch-size" if r["field"] == "per_device_train_batch_size" else "--max-seq-length"
    if r["largest"]:
        text = (f"largest {what} that fits {r['gpu']} with headroom {r['headroom']}: {r['largest']:,} "
                f"(device total {format_bytes(r['device_total'])} of {format_bytes(r['limit_bytes'])} allowed, "
                f"{format_bytes(r['usable'])} usable)")
        if r["next_device_total_bytes"] is not None:
            text += f"; {flag} {r['next_value']:,} needs {format_bytes(r['next_device_total_bytes'])}"
        return text + "\n"
    return (f"no {what} fits {r['gpu']} with headroom {r['headroom']}: 1 needs "
            f"{format_bytes(r['next_device_total_bytes'])} of {format_bytes(r['limit_bytes'])} allowed\n")
