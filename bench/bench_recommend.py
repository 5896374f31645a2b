"""How fast is `fitplan recommend`? The wall time of the default search and of a `--vary method` search for
issue 27's job, and candidate plans evaluated or soundly pruned per second.

Goals (issue 27): the default search of the job below (`--model llama-3.1-8b --num-examples 100000
--tokens-per-example 1024 --num-train-epochs 3 --objective cost`) in at most 5 s, with `--vary method` in at most
15 s (search and the reported plans' estimates, as the command runs them). Goal (issue 6): at least 100,000
candidate plans evaluated or soundly pruned in under 2 s on the 2-core CI machine, measured on the space with
method, precision and optimizer opened (the default space is now far smaller). A candidate is one (GPU type, provider, GPUs per node, nodes, method, precision, optimizer,
checkpointing, ZeRO stage + offload, micro-batch × accumulation, attention kernel, market) of the search
space; each is either evaluated (its memory, and when it fits its time, cost and policies) or pruned by the
micro-batch monotonicity (docs/recommend.md). Prints the rate for the default search space of two models.

    python bench/bench_recommend.py
"""

from __future__ import annotations

import time

GOAL_CANDIDATES = 100_000
GOAL_SECONDS = 2.0
SCENARIOS = (
    {"model": "llama-2-13b", "num_examples": 50000, "tokens_per_example": 1024, "num_train_epochs": 2},
    {"model": "llama-2-7b", "num_examples": 10000, "tokens_per_example": 512, "num_train_epochs": 3},
)


JOB = {"model": "llama-3.1-8b", "num_examples": 100000, "tokens_per_example": 1024, "num_train_epochs": 3}
JOB_GOALS = {"default": 5.0, "--vary method": 15.0}


def job(repeat: int = 3) -> None:
    """Issue 27's goals: the default search and ``--vary method``, search plus the reported plans' estimates."""
    import fitplan
    from fitplan.context import get_context
    from fitplan.inputs import scenario as sc
    from fitplan.search import recommend as rec
    from fitplan.search.space import SearchSpace

    ctx = get_context()
    base = fitplan.scenario_from_dict(JOB)
    for name, space in (("default", SearchSpace()), ("--vary method", SearchSpace(methods=sc.METHODS))):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = rec.search(base, ctx, space=space, objective="cost", fixed=set(JOB))
            rec.attach_estimates(result, ctx)
            times.append(time.perf_counter() - t0)
        goal = JOB_GOALS[name]
        verdict = "met" if min(times) <= goal else "NOT met"
        print(f"llama-3.1-8b job, {name}: {result.stats.candidates:,} candidates, best of {repeat} {min(times):.2f} s "
              f"(all: {', '.join(f'{t:.2f}' for t in times)}); goal <= {goal:g} s ({verdict})")


def run(data: dict, repeat: int = 3) -> None:
    import fitplan
    from fitplan.inputs import scenario as sc
    from fitplan.search import recommend as rec
    from fitplan.search.space import SEARCH_PRECISIONS, SearchSpace
    from fitplan.context import get_context

    ctx = get_context()
    base = fitplan.scenario_from_dict(data)
    space = SearchSpace(methods=sc.METHODS, precisions=SEARCH_PRECISIONS, optimizers=rec.searchable_optimizers(ctx.registry))
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = rec.search(base, ctx, space=space, objective="cost", fixed=set(data))
        elapsed = time.perf_counter() - t0
        if best is None or elapsed < best[0]:
            best = (elapsed, result)
    elapsed, result = best
    s = result.stats
    rate = s.candidates / elapsed
    per_goal = GOAL_CANDIDATES / rate
    print(f"{data['model']}: {s.candidates:,} candidate plans in {elapsed:.2f} s = {rate:,.0f} per second "
          f"(best of {repeat})")
    print(f"  evaluated: {s.too_big + s.allowed + s.rejected + s.unpriced:,} "
          f"(fit: {s.allowed + s.rejected + s.unpriced:,}, too big: {s.too_big:,}); "
          f"pruned by micro-batch monotonicity: {s.pruned_monotone:,}")
    print(f"  graph work: {s.memory_evaluations:,} memory and {s.time_evaluations:,} time evaluations")
    verdict = "met" if per_goal < GOAL_SECONDS else "NOT met"
    print(f"  goal {GOAL_CANDIDATES:,} candidates in under {GOAL_SECONDS:g} s: {per_goal:.2f} s at this rate, "
          f"ratio {per_goal / GOAL_SECONDS:.2f} ({verdict})")
    best_plans = [side.plans[0] for side in result.sides if side.plans]
    top = min(best_plans, key=lambda p: p.cost_usd)
    print(f"  cheapest of {len(result.sides)} sides: {top.label}: ${top.cost_usd:,.2f}, {top.train_seconds / 3600:.2f} h")


def main() -> None:
    job()
    for data in SCENARIOS:
        run(data)


if __name__ == "__main__":
    main()
