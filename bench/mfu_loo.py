"""Leave-one-out error of fitplan's default MFU models against the published [[mfu]] rows.

For each candidate fit (``fitplan.builtin.time.fit_mfu``: global median, per-GPU median, log-linear in model
size) and each published row, fit on every other row, predict the left-out row's MFU, and compare:

* MFU error = predicted / published − 1;
* time error = predicted time / measured time − 1 = published / predicted − 1 (what a user would see).

Prints the table and rewrites the block between the ``mfu-loo`` markers of docs/time-and-cost.md.
Usage: ``python bench/mfu_loo.py [--check]`` (``--check``: exit 1 if the doc is out of date, write nothing).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from fitplan.rulesets import loader as rulesets
from fitplan.builtin.time import MFU_DEFAULT_MODEL, fit_mfu

MODELS = ("global_median", "gpu_median", "log_linear")
DOC = Path(__file__).resolve().parent.parent / "docs" / "time-and-cost.md"
START, END = "<!-- mfu-loo:start -->", "<!-- mfu-loo:end -->"


def loo(rows, model: str) -> list[tuple[object, float]]:
    """(row, predicted MFU) for every row, each predicted from the other rows only."""
    out = []
    for i, row in enumerate(rows):
        others = rows[:i] + rows[i + 1:]
        pred, _ = fit_mfu(others, row.gpu, model, row.param_count)
        out.append((row, pred))
    return out


def summary(preds) -> dict[str, float]:
    time_err = [row.mfu / p - 1 for row, p in preds]
    abs_err = [abs(e) for e in time_err]
    return {"median": statistics.median(abs_err), "mean": statistics.fmean(abs_err), "max": max(abs_err),
            "worst": max(time_err, key=abs)}


def report() -> str:
    rules = rulesets.load()
    rows = sorted(rules.mfu_rows.values(), key=lambda r: r.id)
    results = {m: loo(rows, m) for m in MODELS}
    lines = [f"Leave-one-out over the {len(rows)} published `[[mfu]]` rows (`rulesets/mfu/`); "
             f"the default is **{MFU_DEFAULT_MODEL}**. Time error = predicted / measured training time − 1.", "",
             "| fit | median abs. time error | mean abs. | max abs. | worst (signed) |", "|---|---:|---:|---:|---:|"]
    for m in MODELS:
        s = summary(results[m])
        mark = " (default)" if m == MFU_DEFAULT_MODEL else ""
        lines.append(f"| {m}{mark} | {100 * s['median']:.1f} % | {100 * s['mean']:.1f} % | {100 * s['max']:.1f} % | "
                     f"{100 * s['worst']:+.1f} % |")
    lines += ["", "| row | GPU | params | published MFU | " + " | ".join(f"{m} MFU (time err.)" for m in MODELS) + " |",
              "|---|---|---:|---:|" + "---:|" * len(MODELS)]
    for i, row in enumerate(rows):
        cells = []
        for m in MODELS:
            _, p = results[m][i]
            cells.append(f"{100 * p:.1f} % ({100 * (row.mfu / p - 1):+.0f} %)")
        lines.append(f"| {row.id} | {row.gpu} | {row.param_count / 1e9:g}B | {100 * row.mfu:.0f} % | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def updated_doc(table: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    head, sep, rest = text.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{DOC}: markers {START} / {END} not found")
    return f"{head}{START}\n{table}{END}{tail}"


def main(argv: list[str]) -> int:
    table = report()
    print(table)
    new = updated_doc(table)
    if "--check" in argv:
        if new != DOC.read_text(encoding="utf-8"):
            print(f"{DOC} is out of date: run python bench/mfu_loo.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
