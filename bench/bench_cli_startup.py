"""How much slower is ``fitplan estimate`` than starting Python? (issue: at most 4×, median of 10 runs).

Times a bare ``python -c pass`` and ``fitplan estimate --model llama-2-7b`` (same interpreter, warm OS file
cache), ten runs each, interleaved so that machine load affects both alike, and prints the medians and their
ratio, with fitplan's disk cache warm (a user's second run: docs/reliability.md "Caches") and off
(``FITPLAN_NO_CACHE=1``). Run it on an idle machine: ``python bench/bench_cli_startup.py``.

Also prints the floor no ``fitplan`` command can go under: importing the packages the CLI is built on (pluggy,
click, rich, attrs, cattrs), as the same ratio, and each ``fitplan estimate`` as a multiple of that floor (issue #26:
at most 2×).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

GOAL_RATIO = 4.0
GOAL_FLOOR_RATIO = 2.0
"""``fitplan estimate`` at most this many times the floor (issue #26)."""
RUNS = 10


def wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def main() -> None:
    bare = [sys.executable, "-c", "pass"]
    cases = {
        "fitplan estimate --model llama-2-7b (cache warm)": ([sys.executable, "-m", "fitplan", "estimate", "--model",
                                                              "llama-2-7b"], None),
        "fitplan estimate --model llama-2-7b (FITPLAN_NO_CACHE=1)": (
            [sys.executable, "-m", "fitplan", "estimate", "--model", "llama-2-7b"], {**os.environ, "FITPLAN_NO_CACHE": "1"}),
        "floor: import pluggy, click, rich.console, rich.table, attrs, cattrs": (
            [sys.executable, "-c", "import pluggy, click, rich.console, rich.table, attrs, cattrs"], None),
    }
    wall(bare)
    for cmd, env in cases.values():
        wall(cmd, env)  # warm the OS file cache (and fitplan's)
    b: list[float] = []
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(RUNS):
        b.append(wall(bare))
        for k, (cmd, env) in cases.items():
            times[k].append(wall(cmd, env))
    mb = statistics.median(b)
    floor = statistics.median(next(t for k, t in times.items() if k.startswith("floor")))
    print(f"python -c pass: {mb * 1000:.0f} ms (median of {RUNS})")
    for k, t in times.items():
        me = statistics.median(t)
        line = f"{k}: {me * 1000:.0f} ms   ratio {me / mb:.2f} (goal <= {GOAL_RATIO:g})"
        if not k.startswith("floor"):
            line += f"   {me / floor:.2f}x the floor (goal <= {GOAL_FLOOR_RATIO:g})"
        print(line)


if __name__ == "__main__":
    main()
