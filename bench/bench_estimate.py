"""How fast is fitplan? Times `fitplan estimate` end to end and one evaluation of the compiled graph.

Goals (issue "fitplan core"): the CLI under 0.3 s wall, one evaluation under 100 µs, on the 2-core CI machine.
Prints the figures and their ratio to the goal (< 1.0 meets it). The CLI is timed twice: as a user runs it again
(fitplan's disk cache warm: ruleset snapshots, step traces, entry points; docs/reliability.md "Caches") and with
``FITPLAN_NO_CACHE=1`` (what the first run after an install or an upgrade costs, at most).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import timeit

CLI_GOAL_S = 0.3
EVAL_GOAL_US = 100.0


def time_cli(runs: int = 7, cache: bool = True) -> float:
    env = {k: v for k, v in os.environ.items() if k != "FITPLAN_NO_CACHE"}
    if not cache:
        env["FITPLAN_NO_CACHE"] = "1"
    cmd = [sys.executable, "-m", "fitplan", "estimate", "--model", "llama-2-7b", "--gpu", "a100-80gb",
           "--precision", "bf16-mixed", "--per-device-train-batch-size", "4", "--max-seq-length", "2048",
           "--gradient-checkpointing", "--format", "json"]
    subprocess.run(cmd, check=True, capture_output=True, env=env)  # warm the OS file cache (and fitplan's)
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def time_evaluation() -> tuple[float, int]:
    import fitplan
    from fitplan.context import get_context
    from fitplan.estimation import build_inputs

    ctx = get_context()
    s = fitplan.scenario_from_dict({"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-mixed",
                                    "per_device_train_batch_size": 4, "gradient_checkpointing": True})
    inputs = build_inputs(s, ctx.registry, ctx.rulesets)
    graph = ctx.registry.compiled()
    n = 5000
    best = min(timeit.repeat(lambda: graph.evaluate(inputs), number=n, repeat=5)) / n
    return best * 1e6, len(graph.steps)


def main() -> None:
    for label, cache in (("cache warm", True), ("FITPLAN_NO_CACHE=1", False)):
        cli_s = time_cli(cache=cache)
        print(f"fitplan estimate (CLI, end to end, median of 7, {label}): {cli_s:.3f} s   goal {CLI_GOAL_S} s   "
              f"ratio {cli_s / CLI_GOAL_S:.2f}")
    eval_us, steps = time_evaluation()
    print(f"one evaluation of the compiled graph ({steps} steps): {eval_us:.1f} µs   goal {EVAL_GOAL_US:.0f} µs   "
          f"ratio {eval_us / EVAL_GOAL_US:.2f}")


if __name__ == "__main__":
    main()
