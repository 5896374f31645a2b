"""How much slower is ``fitplan estimate`` than starting Python? (issue: at most 4×, median of 10 runs).

Times a bare ``python -c pass`` and ``fitplan estimate --model llama-2-7b`` (same interpreter, warm OS file
cache), ten runs each, interleaved so that machine load affects both alike, and prints the medians and their
ratio. Run it on an idle machine: ``python bench/bench_cli_startup.py``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

GOAL_RATIO = 4.0
RUNS = 10


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    bare = [sys.executable, "-c", "pass"]
    estimate = [sys.executable, "-m", "fitplan", "estimate", "--model", "llama-2-7b"]
    wall(bare), wall(estimate)  # warm the OS file cache
    b, e = [], []
    for _ in range(RUNS):
        b.append(wall(bare))
        e.append(wall(estimate))
    mb, me = statistics.median(b), statistics.median(e)
    print(f"python -c pass: {mb * 1000:.0f} ms   fitplan estimate --model llama-2-7b: {me * 1000:.0f} ms   "
          f"ratio {me / mb:.2f} (goal <= {GOAL_RATIO:g})")


if __name__ == "__main__":
    main()
