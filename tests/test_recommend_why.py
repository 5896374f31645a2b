"""Why plan 1 (`fitplan recommend`, docs/recommend.md "Why this plan"): the binding constraint, the runner-up per
GPU type, GPU count and provider, and the price of twice the speed, on a small hand-written pricing ruleset.

The world: three GPU types with the same compute and bandwidth (so a plan takes the same time on each) but
different memory, rented by two providers with known prices:

* ``smallgpu`` at cheapco, $1/h: its usable memory is set 3.00 GB below the job's device total (measured through
  the ordinary estimate path), so nothing fits it (headroom ``0GB``: the limit is the usable memory);
* ``biggpu`` at cheapco, $3/h, and at dearco, $4/h; a two-GPU ``biggpu`` instance at cheapco, $8/h;
* ``midgpu`` at cheapco, $5/h.

Billing by the second with no minimum: cost = ⌈seconds⌉ / 3600 × price per hour (``billed_seconds``: the time rounded
up to the billing unit). With the billed time T of the one-GPU plan, by hand:
plan 1 is 1× biggpu at cheapco ($3T), memory binds (smallgpu, $1/GPU-hour, fits nothing, 3.00 GB short), the
runner-up provider is dearco (+$1T, same time), the runner-up GPU type midgpu (+$2T, same time).
Every test states ``optim`` and ``precision``.
"""

from __future__ import annotations

import json
import math

import attrs
import pytest

import fitplan
from fitplan.search import recommend as rec
from fitplan.search.plans import Plan
from fitplan.search.space import SearchSpace
from fitplan.search.why import twice_speed

from conftest import run_cli

GPU = """
[[gpu]]
id = "{id}"
name = "{id}"
memory_bytes = {mem}
usable_bytes = {mem}
bandwidth_gbps = 1000
interconnect_gbps = 100
gpus_per_node = 8
peak_tflops = {{ fp32 = 50, bf16 = 500 }}
source = "test fixture"
"""
PROVIDER = """
[[provider]]
id = "{id}"
name = "{id}"
billing = "second"
minimum_seconds = 0
source = "test fixture"
"""
INSTANCE = """
[[instance]]
provider = "{p}"
id = "{id}"
gpu = "{gpu}"
gpus = {n}
on_demand_per_hour = {price}
source = "test fixture"
"""
BIG = 200_000_000_000
JOB = dict(params="1B", method="full", optim="adamw_torch", precision="32-true", total_tokens=1_000_000)
ONE = SearchSpace(gpus=("smallgpu", "biggpu", "midgpu"), gpu_counts=(1,), num_nodes=(1,), attn_implementations=("sdpa",),
                  checkpointing=(False,), effective_batch_size=1, zero_stages=(0,), offload_optimizer=(False,),
                  settings=(("offload_params", (False,)),))


def _device_total() -> int:
    """The job's device total on one GPU, through the ordinary estimate path (not the search)."""
    from fitplan.context import get_context
    from fitplan.estimation import evaluate

    d = _rules_dir(None, small=BIG)
    ctx = get_context((str(d),))
    est = evaluate(fitplan.scenario_from_dict(JOB | {"gpu": "biggpu", "provider": "cheapco",
                                                     "per_device_train_batch_size": 1,
                                                     "gradient_accumulation_steps": 1}), ctx.registry, ctx.rulesets)
    return est.role("device_total")


_DIRS: list = []


def _rules_dir(tmp_path, small: int):
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp(prefix="why-rules-", dir=tmp_path))
    _DIRS.append(d)
    text = "".join(GPU.format(id=g, mem=m) for g, m in (("smallgpu", small), ("biggpu", BIG), ("midgpu", BIG)))
    text += PROVIDER.format(id="cheapco") + PROVIDER.format(id="dearco")
    for p, i, g, n, price in (("cheapco", "s1", "smallgpu", 1, 1.0), ("cheapco", "b1", "biggpu", 1, 3.0),
                              ("dearco", "b1", "biggpu", 1, 4.0), ("cheapco", "b2", "biggpu", 2, 8.0),
                              ("cheapco", "m1", "midgpu", 1, 5.0)):
        text += INSTANCE.format(p=p, id=i, gpu=g, n=n, price=price)
    (d / "why.toml").write_text(text)
    return d


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(rules folder, the job's device total): smallgpu's usable memory is 3.00 GB below the device total."""
    dt = _device_total()
    return _rules_dir(tmp_path_factory.mktemp("why"), small=dt - 3_000_000_000), dt


def _search(d, space: SearchSpace, policies=None, objective="cost"):
    from fitplan.context import get_context

    ctx = get_context((str(d),))
    res = rec.search(fitplan.scenario_from_dict(JOB), ctx, space=space, objective=objective, headroom="0GB",
                     fixed=set(JOB), policies=policies)
    rec.attach_estimates(res, ctx)
    return res


def test_memory_binds_and_the_runner_ups_are_the_other_gpu_type_and_provider(world):
    d, dt = world
    res = _search(d, ONE)
    first = res.plans[0]
    assert (first.fields["gpu"], first.fields["provider"]) == ("biggpu", "cheapco")
    t = math.ceil(first.train_seconds)  # billed by the second
    assert first.cost_usd == pytest.approx(t / 3600 * 3.0)
    why = res.why
    assert why.binding == "memory"
    assert why.detail["gpu"] == "smallgpu" and why.detail["per_gpu_hour_usd"] == 1.0
    assert why.detail["short_bytes"] == 3_000_000_000  # set by hand: usable = device total - 3 GB, headroom 0
    assert "smallgpu" in why.reason and "3.00 GB" in why.reason
    ups = {a.dimension: a for a in why.runner_ups}
    assert set(ups) == {"gpu", "provider"}  # one GPU count searched: no runner-up with another count
    assert ups["provider"].value == "dearco" and ups["provider"].plan.fields["gpu"] == "biggpu"
    assert ups["provider"].delta_cost_usd == pytest.approx(t / 3600 * (4.0 - 3.0))
    assert ups["provider"].delta_seconds == pytest.approx(0.0, abs=1e-9)
    assert ups["gpu"].value == "midgpu"
    assert ups["gpu"].plan.train_seconds == pytest.approx(first.train_seconds)  # same compute and bandwidth: same time
    assert ups["gpu"].delta_cost_usd == pytest.approx(t / 3600 * (5.0 - 3.0))
    assert why.twice_speed is None  # every plan takes T: none is twice as fast


def test_with_two_gpus_the_runner_up_count_and_the_price_of_twice_the_speed(world):
    d, _ = world
    res = _search(d, attrs.evolve(ONE, gpu_counts=(1, 2), effective_batch_size=2))
    first, why = res.plans[0], res.why
    assert first.world_size == 1
    ups = {a.dimension: a for a in why.runner_ups}
    two = ups["gpus"]
    assert two.value == 2 and two.plan.fields["gpu"] == "biggpu" and two.plan.fields["provider"] == "cheapco"
    assert two.plan.cost_usd == pytest.approx(math.ceil(two.plan.train_seconds) / 3600 * 8.0)  # the b2 instance, $8/h
    assert two.delta_cost_usd == pytest.approx(two.plan.cost_usd - first.cost_usd)
    assert two.delta_seconds == pytest.approx(two.plan.train_seconds - first.train_seconds)
    # twice the speed: the cheapest plan of all evaluated within T/2 (the front holds it), or none
    within = [p for p in res.pareto if p.train_seconds <= first.train_seconds / 2]
    if within:
        best = min(within, key=lambda p: p.cost_usd)
        assert why.twice_speed.plan is best
        assert why.twice_speed.value == pytest.approx(best.cost_usd / first.cost_usd)
    else:
        assert why.twice_speed is None


def test_a_forbid_rule_that_rejects_a_cheaper_plan_binds(world):
    from fitplan.context import get_context
    from fitplan.rules.policy import PolicySet
    from fitplan.rulesets.schema import PolicyRule

    d, _ = world
    ctx = get_context((str(d),))
    rule = PolicyRule(id="no-cheapco", description="not cheapco", condition={"eq": {"provider": "cheapco"}})
    res = _search(d, ONE, policies=PolicySet([rule], ctx.registry))
    first = res.plans[0]
    assert (first.fields["gpu"], first.fields["provider"]) == ("biggpu", "dearco")
    assert res.why.binding == "policy" and res.why.detail["rule"] == "no-cheapco"
    assert "no-cheapco" in res.why.reason
    # the rejected plan named is the cheapco biggpu plan: cost 3T against plan 1's 4T
    assert res.why.detail["value"] == pytest.approx(first.cost_usd * 3.0 / 4.0)


def test_objective_time_binds_on_time(world):
    d, _ = world
    res = _search(d, ONE, objective="time")
    assert res.why.binding == "time"


def _plan(seconds: float, cost: float) -> Plan:
    return Plan({"gpu": "g", "provider": "p"}, "on_demand", 0, 0, seconds, cost, cost, None, 1, cost, 0)


def test_twice_the_speed_is_the_cheapest_within_half_the_time():
    first = _plan(10.0, 100.0)
    front = [_plan(4.0, 300.0), _plan(5.0, 180.0), _plan(6.0, 150.0), first]
    ts = twice_speed(front, first)
    assert ts.plan is front[1]  # 5 s <= 10 / 2, and cheaper than the 4 s plan; the 6 s plan is too slow
    assert ts.value == pytest.approx(1.8) and ts.delta_cost_usd == pytest.approx(80.0)
    assert twice_speed([_plan(6.0, 150.0), first], first) is None


def test_every_format_says_why(world):
    d, _ = world
    args = ("recommend", "--ruleset-dir", str(d), "--params", "1B", "--method", "full", "--optim", "adamw_torch",
            "--precision", "32-true", "--total-tokens", "1000000", "--gpus", "smallgpu,biggpu,midgpu", "--num-gpus", "1",
            "--headroom", "0GB", "--objective", "cost", "--no-gradient-checkpointing", "--zero", "0", "--no-offload-optimizer",
            "--no-offload-params", "--effective-batch-size", "1", "--attn-implementation", "sdpa")  # the space ONE
    data = json.loads(run_cli(*args, "--format", "json").stdout)
    assert data["why"]["binding"] == "memory" and data["why"]["detail"]["short_bytes"] == 3_000_000_000
    assert {a["dimension"] for a in data["why"]["runner_ups"]} >= {"gpu", "provider"}
    assert data["why"]["twice_speed"] is None
    for fmt, marker in (("markdown", "## Why plan 1"), ("table", "Why plan 1"), ("html", "<h3>Why plan 1")):
        out = run_cli(*args, "--format", fmt).stdout
        assert marker in out and "binding: memory: smallgpu" in out.replace("&#x27;", "'")
        assert "twice the speed: none found" in out
