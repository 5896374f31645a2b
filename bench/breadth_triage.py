"""Triage of bench/learn_breadth.py's learn-stage results: each type that did not verify, grouped by failure class
(the construct or harness fault, in general words), classes counted at the top, largest first, with outcomes per
stratum and the verified types within the cost goal.

The class is read from the result and the reason's text by the patterns of ``CLASSES`` (first match wins); a reason
no pattern matches is ``other`` (a new class: add its pattern). Later ``--json`` files win per type, as in the
table, unless an earlier file's row is stamped later (``newest``)::

    python bench/breadth_triage.py --json bench/breadth/*.json /work/notes/breadth/*.json --out TRIAGE.md
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learn_breadth import merged, short_reason, stratum  # noqa: E402

CLASSES: tuple[tuple[str, str], ...] = (
    (r"invalid ruleset directory", "memory check: the bundled model presets of a bundled type are validated "
                                   "against the file being learned, whose switches are only the class defaults'"),
    (r"^memory$", "cost: past the resident-memory cap"),
    (r"^timeout$", "cost: past the time limit (wall-clock: on a loaded machine, a starved type; or CPU seconds, "
                   "where the reason says CPU s)"),
    (r"length \(\d+\) must equal num_hidden_layers", "shrinking: a per-layer list keeps its length when layers "
                                                    "are cut, which the config class rejects (a crash, exit 70)"),
    (r"^failed", "internal error (a crash of fitplan: exit other than 0 / 2)"),
    (r"(is|are) None, which the model cannot run|is not set and \w+ has no default|has no entry .*, which the model "
     r"reads", "class defaults leave a "
     "field None or unset that the model needs (refusal naming the field; a published config states it)"),
    (r"config class rejects every shrunk", "shrinking: the config class rejects every shrunk config (a relation "
                                           "between fields that shrinking breaks)"),
    (r"config class rejects", "the config class rejects its own defaults"),
    (r"Unrecognized configuration class", "multimodal: the text part's config class is not in "
                                          "AutoModelForCausalLM's mapping (which names the outer type)"),
    (r"shrunk config does not run", "the model's code does not run from its shrunk class defaults (no repair)"),
    (r"cannot build .* with sdpa", "no SDPA in the model class and the learner asked for it"),
    (r"serves only", "verification: a size the learning held as a constant differs in the held-out config"),
    (r"(parameters|gradients|optimizer_states) predicted", "verification (memory check): parameter, gradient or "
                                                          "optimizer-state bytes differ from the referee's"),
    (r"(activations|peak) predicted", "verification (memory check): activations or peak differ from the referee's"),
    (r"does not reproduce a fresh run", "verification (graph check): the file's ops differ from a held-out "
                                        "recording"),
    (r"change with the sequence length", "recording: a Python loop over the sequence (the ops change with s)"),
    (r"no learned graph for precision class", "memory check: a precision / attention kernel the learned file has "
                                              "no graph for"),
    (r"the training step runs \d+ of the model's \d+ layers", "recording: a kind of layer the training step skips "
                                                             "(no inputs for it) records no ops"),
    (r"is of kind .* has no graph for", "memory check: a layer kind of the checked config that the learned file "
                                        "has no graph for (the learning saw fewer kinds of layer)"),
    (r"takes \d+ forms", "layer pattern: a layer part with more than two forms"),
    (r"layer pattern differs between", "layer pattern: differs between precisions / attention kernels"),
    (r"no rule of the layer-pattern family", "layer pattern: a condition over several fields"),
    (r"no expression over", "sizes: no expression fits a recorded size (data-dependent or uncommon formula)"),
    (r"reads a tensor made by segment .* that is not its argument|comes neither from the prologue nor",
     "layers: a layer or the epilogue reads what an earlier layer made besides the previous layer's hidden state "
     "(residuals across blocks, a state carried from layer to layer)"),
    (r"runs \d+ times in one training step", "layers: a layer runs more than once per step (recurrent depth: the "
                                              "layers called once per cycle)"),
    (r"change across probes but with no single variable", "sizes: a recorded size changes only in a probe that "
                                                         "moves several fields at once (no one field explains it)"),
    (r"distinct layers", "layers: more distinct layer kinds than the learner records"),
    (r"must be (an integer|a positive integer), got", "memory check: a field the learned file cannot derive"),
    (r"runs in none of the regimes", "probing: the model runs in none of the learner's size regimes (every "
                                     "head / group layout it tries fails to build or run)"),
    (r"peft cannot apply LoRA", "memory check: peft refuses LoRA on a module the learner targets (Mamba-style "
                                "`out_proj` / `conv1d`: the LoRA targets are not the model's)"),
    (r"differs|records other ops|records different ops", "recording: probes record different ops"),
)


def failure_class(row: dict) -> str:
    """The failure class of a result row (``CLASSES``, matched against its result, then its reason)."""
    for pattern, name in CLASSES:
        if re.search(pattern, row["result"]) or re.search(pattern, row.get("reason", "")):
            return name
    return "other (no pattern yet)"


GOAL_CPU_S, GOAL_MB = 60.0, 3 * 1024
"""Issue #32's cost goal: a type learns in <= 60 s and <= 3 GB resident (CPU seconds: the learner's cost whatever
the machine's load)."""


def by_stratum(rows: list[dict], strata: dict[str, str]) -> list[str]:
    """One line per stratum (``strata``: each type's, ``learn_breadth.stratum``): its types run and their outcomes."""
    groups: dict[str, dict[str, int]] = {}
    for r in rows:
        kind = groups.setdefault(strata.get(r["model_type"], "?"), {})
        kind[r["result"]] = kind.get(r["result"], 0) + 1
    return [f"* {k}: {sum(v.values())} run; " + ", ".join(f"{o}: {n}" for o, n in sorted(v.items()))
            for k, v in sorted(groups.items())]


def within_goal(rows: list[dict]) -> list[str]:
    """The verified rows measured (CPU seconds and resident MB), and those within the cost goal (``GOAL_CPU_S``,
    ``GOAL_MB``)."""
    done = [r for r in rows if r["result"] == "verified" and None not in (r.get("cpu_s"), r.get("rss_mb"))]
    ok = sorted(r["model_type"] for r in done if r["cpu_s"] <= GOAL_CPU_S and r["rss_mb"] <= GOAL_MB)
    return [f"Cost: {len(ok)} of {len(done)} verified types (CPU s and MB measured) within {GOAL_CPU_S:.0f} CPU s and "
            f"{GOAL_MB} MB: {', '.join(ok)}"]


def triage(rows: list[dict], notes: str = "", strata: dict[str, str] | None = None) -> str:
    """TRIAGE.md: counts of outcomes (per stratum where ``strata`` is given), the cost goal, ``notes`` (the
    measurer's, in markdown), then one line per non-verified type under its class."""
    learned = [r for r in rows if r["result"] != "verified"]
    groups: dict[str, list[dict]] = {}
    for r in sorted(learned, key=lambda r: r["model_type"]):
        groups.setdefault(failure_class(r), []).append(r)
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r["result"]] = outcomes.get(r["result"], 0) + 1
    order = sorted(groups, key=lambda c: (-len(groups[c]), c))
    out = [f"# Breadth triage (learn stage, the README command): {time.strftime('%H:%M UTC', time.gmtime())}", "",
           f"{len(rows)} types run; " + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())), "",
           *([*by_stratum(rows, strata), ""] if strata else []), *within_goal(rows), "",
           *([notes.strip(), ""] if notes.strip() else []), "## Classes (non-verified types), largest first", ""]
    out += [f"* {len(groups[c])}: {c} ({', '.join(r['model_type'] for r in groups[c])})" for c in order]
    for c in order:
        out += ["", f"## {c} ({len(groups[c])})", ""]
        out += [f"* {r['model_type']}: {r['result']} ({r.get('cpu_s')} CPU s, {r.get('rss_mb')} MB; {r['from']}): "
                f"{short_reason(r.get('reason', ''), 300)}" for r in groups[c]]
    return "\n".join(out) + "\n"


def newest(paths: list[str]) -> list[dict]:
    """The learn rows of ``paths`` (``learn_breadth.merged``: a later file wins per type), except that a row stamped
    later (``at``) than the winner wins: workers write their result files at the same time, so a fixer's rerun
    after the sweep's row is the type's state now, whatever the files' order."""
    best: dict[str, dict] = {}
    for p in paths:
        for (stage, t), r in merged([p]).items():
            old = best.get(t)
            if stage == "learn" and (old is None or not (old.get("at") and r.get("at")) or r["at"] >= old["at"]):
                best[t] = r
    return list(best.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", nargs="+", action="extend", required=True, help="result files, later wins")
    ap.add_argument("--out", required=True)
    ap.add_argument("--notes", default="", help="a markdown file put after the counts")
    ap.add_argument("--no-strata", action="store_true", help="no counts per stratum (they import transformers)")
    a = ap.parse_args(argv)
    rows = newest([p for p in a.json if Path(p).is_file()])
    notes = Path(a.notes).read_text() if a.notes and Path(a.notes).is_file() else ""
    strata = {} if a.no_strata else {r["model_type"]: stratum(r["model_type"]) for r in rows}
    Path(a.out).write_text(triage(rows, notes, strata))
    return 0


if __name__ == "__main__":
    sys.exit(main())
