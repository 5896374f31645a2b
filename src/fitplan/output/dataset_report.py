"""The ``fitplan dataset`` report for the terminal: the dataset, its token lengths and truncation, what each
padding mode computes per epoch, and a length histogram (a pure function of :func:`fitplan.data.figures.figures`)."""

from __future__ import annotations

from typing import Any

from fitplan.output.console import escape, render_rich
from fitplan.output.formats import RenderOptions

BAR = 30


def _ci(pair: Any) -> str:
    """A sample's 95 % interval (nothing when every example was read, or when the figure is exact)."""
    return "" if not pair or round(pair[0]) == round(pair[1]) else f" (95 %: {pair[0]:,.0f} to {pair[1]:,.0f})"


def _header(r: dict[str, Any]) -> list[tuple[str, str]]:
    src, tok, t = r["source"], r["tokenizer"], r["tokens"]
    sample = r["sample"]
    read = "" if sample is None else f", {sample['read']:,} read (random sample, seed {sample['seed']})"
    fmt = f"{src.get('format', 'summary')}" + (f", split {src['split']}" if src.get("split") else "")
    n = r["examples"]
    lines = [
        ("dataset", f"{src.get('path', '?')} ({fmt}): {n:,} examples of {r['kind'].replace('_', ' ')}{read}"),
        ("tokenizer", str(tok.get("name", "?"))),
        ("tokens", f"{t['total']:,.0f}{_ci(t['total_ci'])}; per example mean {t['mean']:,.1f}, p50 {t['p50']:,}, "
                   f"p90 {t['p90']:,}, p99 {t['p99']:,}, max {t['max']:,}" + (" (in the sample)" if sample else "")),
        ("truncated", f"{r['truncated_examples']:,.0f} examples ({100 * r['truncated_examples_share']:.2f} %) longer than "
                      f"--max-seq-length {r['max_seq_length']:,}; {r['tokens_cut']:,.0f} tokens cut "
                      f"({100 * r['tokens_cut_share']:.2f} %){_ci(r['tokens_cut_ci'])}"),
    ]
    if r["dropped_examples"]:
        lines.append(("dropped", f"{r['dropped_examples']:,.0f} examples whose prompt fills --max-seq-length "
                                 "(TRL drops them: no completion token left to train on)"))
    return lines


def _draw(r: dict[str, Any], c) -> None:
    from rich.table import Table

    for label, text in _header(r):
        c.print(f"[bold]{label:>10}[/]  {escape(text)}")
    c.print()
    t = Table(title=f"per epoch, micro-batch {r['per_device_train_batch_size']}"
                    + (f" × {r['gradient_accumulation_steps']} accumulation steps" if r["gradient_accumulation_steps"] > 1 else "")
                    + f", --max-seq-length {r['max_seq_length']:,}", title_justify="left", show_edge=False, pad_edge=False)
    for col, just in (("--padding", "left"), ("tokens computed", "right"), ("real", "right"),
                      ("efficiency", "right"), ("memory seq. length", "right"), ("how it is known", "left")):
        t.add_column(col, justify=just)
    for mode, m in r["padding"].items():
        t.add_row(f"{mode}: {m['description']}", f"{m['computed_tokens_per_epoch']:,.0f}{_ci(m['computed_tokens_ci'])}",
                  f"{m['real_tokens_per_epoch']:,.0f}", f"{100 * m['efficiency']:.1f} %", f"{m['seq_length']:,}",
                  escape(m["basis"]))
    c.print(t)
    c.print()
    hist = Table(title="token lengths" + (" (in the sample)" if r["sample"] else ""), title_justify="left",
                 show_edge=False, pad_edge=False)
    for col in ("tokens", "examples", "share", ""):
        hist.add_column(col, justify="left" if not col else "right")
    most = max((b["examples"] for b in r["histogram"]), default=0) or 1
    total = sum(b["examples"] for b in r["histogram"]) or 1
    for b in r["histogram"]:
        hist.add_row(f"{b['from']:,}-{b['to']:,}", f"{b['examples']:,}", f"{100 * b['examples'] / total:.1f} %",
                     "█" * round(BAR * b["examples"] / most))
    c.print(hist)


def to_terminal(report: dict[str, Any], options: RenderOptions) -> str:
    return render_rich(lambda c: _draw(report, c), options)
