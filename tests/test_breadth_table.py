"""The breadth table of docs/architectures.md ("Breadth") built by bench/learn_breadth.py from several result files
(issue #32): later files win per type and stage, ``--before`` files fill the earlier columns, a row without a
stage takes it from its file's name, and a reason keeps its detail without fitplan's suggestion.

Rows are hand-built in ``tmp_path``; the expected cells are the columns' definitions applied by hand. No torch,
no transformers (the table is given the types and strata).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from conftest import bench_module

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return bench_module("learn_breadth")


def _row(t: str, result: str, reason: str = "", cpu: float | None = 10.0, **extra) -> dict:
    return {"model_type": t, "result": result, "reason": reason, "cpu_s": cpu, "seconds": 99.0, "rss_mb": 500,
            **extra}


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text(json.dumps(rows))
    return str(path)


def _cells(md: str) -> dict[str, list[str]]:
    rows = [x for x in md.splitlines() if x.startswith("| ") and not x.startswith("| model_type")]
    return {c[0]: c for c in ([y.strip() for y in x.strip().strip("|").split(" | ")] for x in rows)}


def test_later_files_win_and_before_files_fill_the_earlier_columns(tmp_path):
    lb = _bench()
    before = lb.merged([
        _write(tmp_path / "rec0.json", [_row("a", "recorded", stage="record"), _row("b", "failed (exit 1)",
                                                                                     stage="record")]),
        _write(tmp_path / "learn0.json", [_row("a", "not verified", "old reason", cpu=7.5)]),
    ])
    now = lb.merged([
        # no "stage" key: a file named record... holds record rows, others learn rows
        _write(tmp_path / "record-after.json", [_row("a", "recorded")]),
        _write(tmp_path / "sweep.json", [_row("a", "refused", "first"), _row("c", "refused", "c's reason")]),
        _write(tmp_path / "fixer.json", [_row("a", "verified", cpu=42.0, stage="learn")]),
    ])
    md = lb.table(["a", "b", "c", "d"], before, now, {"c"}, {"a": "dense"})
    cells = _cells(md)
    # model_type, bundled, stratum, record (earlier), record (now), learn (before), learn (now), CPU s, MB, reason
    assert cells["a"] == ["a", "", "dense", "recorded", "recorded", "not verified", "verified", "42.0", "500", ""]
    # b: not recorded earlier and not rerun; never learned: its reason would be the record stage's (empty here)
    assert cells["b"][3:7] == ["failed (exit 1)", "failed (exit 1) (not rerun)", "not run", "not run"]
    assert cells["b"][7:9] == ["", ""]
    assert cells["c"][1] == "yes" and cells["c"][3:7] == ["not run", "not run", "not run", "refused"]
    assert cells["c"][9] == "c's reason"
    assert cells["d"][3:] == ["not run"] * 4 + ["", "", ""]
    # the count is over learn (now): a verified, c refused, b and d not run
    assert md.splitlines()[0] == "4 model types, learn (now): not run: 2, refused: 1, verified: 1"


def test_a_type_learned_only_before_is_not_rerun_with_its_figures(tmp_path):
    lb = _bench()
    before = lb.merged([_write(tmp_path / "learn0.json", [_row("a", "not verified", "why", cpu=7.5)])])
    hand = lb.merged([_write(tmp_path / "hand.json", [_row("b", "verified", "by hand", cpu=None)])])
    cells = _cells(lb.table(["a", "b"], before, hand, set(), {}))
    assert cells["a"][5:10] == ["not verified", "not rerun", "7.5", "500", "why"]
    # a row measured outside the bench has wall seconds only
    assert cells["b"][6:8] == ["verified", "~99 wall"]


def test_a_reason_keeps_its_detail_and_drops_the_suggestion():
    lb = _bench()
    why = ("the learned file for 'x' does not reproduce a fresh run, so it was not written (report it with the "
           "config; --no-verify writes it anyway, marked unverified (its figures are then approximate, not exact))"
           " / 16/eager [b>1] prologue: op 5 differs")
    assert lb.short_reason(why) == ("the learned file for 'x' does not reproduce a fresh run, so it was not "
                                    "written / 16/eager [b>1] prologue: op 5 differs")
    assert lb.short_reason("k is None @ k (state k in the config)") == "k is None @ k"
    assert lb.short_reason("x" * 300) == "x" * 240


def test_an_internal_error_spanning_lines_is_kept_whole():
    """fitplan's exit-70 message can wrap; the row took its last line only ("FITPLAN_DEBUG=1 shows the traceback)"
    for gemma3n in a fixer's rerun). A refusal keeps its ``error:`` line and the detail line after it."""
    lb = _bench()
    err = ("[transformers] a warning\ninternal error: ValueError: the set of layer types\nproducing a cache differs "
           "(a bug in fitplan or a plugin;\nFITPLAN_DEBUG=1 shows the traceback)\n")
    assert lb.reason(err) == ("internal error: ValueError: the set of layer types producing a cache differs (a bug "
                              "in fitplan or a plugin; FITPLAN_DEBUG=1 shows the traceback)")
    assert lb.reason("error: k is None (report it here)\n16/eager: op 5 differs\n") == "k is None / 16/eager: op 5 differs"


def test_cpu_seconds_reads_the_kernels_count_and_a_cpu_limit_stops_a_busy_child():
    """The bench's CPU limit (``--cpu-timeout``): a wall-clock limit on a loaded machine stopped kolibri1 at 130
    CPU s, which then verified at 214. ``cpu_seconds`` (``/proc/<pid>/stat``) must agree with the kernel's own
    count for this process (``os.times``, from getrusage), and ``wait`` must stop a child that spins past the
    limit, long before the wall-clock limit, saying it was the CPU."""
    import os
    import subprocess
    import time

    lb = _bench()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    t = os.times()
    assert abs(lb.cpu_seconds(os.getpid()) - (t.user + t.system)) < 0.1
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rc, usage, _, killed = lb.wait(proc, t0, 60.0, 2**40, 0.2)
    assert killed == "cpu" and rc != 0
    assert usage.ru_utime + usage.ru_stime >= 0.2
    assert time.monotonic() - t0 < 30


def test_a_row_run_from_a_fixture_says_so_in_its_reason(tmp_path):
    """A type whose class defaults are not a runnable config runs from ``bench/breadth/configs/<type>.json`` (the
    row's ``config``: its ``_config`` label); the table says so in the reason cell, before any reason, never
    silently. A row without ``config`` keeps its reason as it is."""
    lb = _bench()
    now = lb.merged([_write(tmp_path / "fix.json", [
        _row("a", "verified", config="transformers tests"),
        _row("b", "refused", "k is None @ k", config="published config"),
        _row("c", "refused", "k is None @ k")])])
    cells = _cells(lb.table(["a", "b", "c"], {}, now, set(), {}))
    assert cells["a"][9] == "config: transformers tests"
    assert cells["b"][9] == "config: published config; k is None @ k"
    assert cells["c"][9] == "k is None @ k"
def _triage():
    return bench_module("breadth_triage")


def test_the_triage_counts_strata_and_the_cost_goal_and_names_each_class():
    """bench/breadth_triage.py: outcomes per stratum, the verified types within issue #32's cost goal (60 CPU s,
    3 GB resident: both bounds inclusive, a row without CPU seconds or MB left out), and a cross-layer read
    (hrm_text's refusal) in its own class rather than ``other``. Hand-built rows; the expected lines are counted
    by hand."""
    bt = _triage()
    rows = [_row("a", "verified", cpu=60.0, rss_mb=3072), _row("b", "verified", cpu=60.1),
            _row("c", "verified", cpu=10.0, rss_mb=3073), _row("d", "verified", cpu=None),
            _row("g", "verified", rss_mb=None),
            _row("e", "refused", "cannot learn 'e': segment 9 (epilogue) reads a tensor made by segment ? that is "
                                 "not its argument (shape [2, 16, 64], op 5)")]
    assert bt.by_stratum(rows, {"a": "dense", "b": "dense", "e": "MoE"}) == [
        "* ?: 3 run; verified: 3", "* MoE: 1 run; refused: 1", "* dense: 2 run; verified: 2"]
    assert bt.within_goal(rows) == [
        "Cost: 1 of 3 verified types (CPU s and MB measured) within 60 CPU s and 3072 MB: a"]
    assert bt.failure_class(rows[-1]).startswith("layers: a layer or the epilogue reads what an earlier layer made")
    carried = ("cannot learn 'h': layer 1 argument 5 (prev_topk_indices) comes neither from the prologue nor the "
               "previous layer's hidden state: made by segment 1 (layer 0)")
    assert bt.failure_class(_row("h", "refused", carried)) == bt.failure_class(rows[-1])
    assert bt.failure_class(_row("r", "refused", "cannot learn 'r': decoder layer 0 runs 6 times in one training "
                                                 "step")).startswith("layers: a layer runs more than once per step")
    assert bt.failure_class(_row("q", "refused", "cannot learn 'q': segment prologue None tensor t28 f32 dim 2 (op "
                                                 "slice.Tensor): values [1, 1, 2] change across probes but with no "
                                                 "single variable")).startswith("sizes: a recorded size changes only")
    assert bt.failure_class(_row("f", "refused", "something new")) == "other (no pattern yet)"


def test_the_triage_takes_a_types_newest_row_whatever_the_files_order(tmp_path):
    """Workers write result files at the same time: a fixer's rerun (stamped 16:40) in a file listed before the
    sweep's (its row of the same type stamped 16:16) is the type's state; without a stamp, the later file wins."""
    bt = _triage()
    fixer = _write(tmp_path / "fixer.json", [_row("a", "verified", at="2026-12-07T16:40Z"),
                                             _row("b", "verified", at="2026-12-07T16:00Z"), _row("c", "verified")])
    sweep = _write(tmp_path / "sweep.json", [_row("a", "not verified", at="2026-12-07T16:16Z"),
                                             _row("b", "refused", at="2026-12-07T16:16Z"),
                                             _row("c", "refused", at="2026-12-07T16:16Z")])
    got = {r["model_type"]: (r["result"], r["from"]) for r in bt.newest([fixer, sweep])}
    assert got == {"a": ("verified", "fixer.json"), "b": ("refused", "sweep.json"), "c": ("refused", "sweep.json")}
