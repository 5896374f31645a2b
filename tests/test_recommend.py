"""The recommender: the pruned, loop-invariant search against an exhaustive evaluation of every candidate
through the ordinary estimate path; plans whose numbers equal `fitplan estimate` with their flags; the
reverse questions; the done-criterion command."""

from __future__ import annotations

import json
import math
import shlex
from itertools import product

import attrs
import pytest

import fitplan
from fitplan.search import plans
from fitplan.search import recommend as rec
from fitplan.search.space import SearchSpace, parse_headroom
from fitplan.rulesets.conditions import Namespace
from fitplan.errors import FitplanError
from fitplan.estimation import evaluate
from fitplan.rules.policy import PolicySet
from fitplan.rulesets.schema import PolicyRule

from conftest import run_cli

GPUS = ("a10g", "a100-40gb", "a100-80gb")
PROVIDERS = ("aws", "gcp", "lambda", "seed")
SPACE = SearchSpace(methods=("full", "lora", "qlora"), precisions=("bf16-mixed", "bf16-master", "32-true"),
                        optimizers=("adamw_torch", "adamw_8bit"), attn_implementations=("sdpa", "eager"),
                        gpus=GPUS, providers=PROVIDERS, max_gpus=8, num_nodes=(1, 2), effective_batch_size=8,
                        markets=("on_demand", "spot"))
"""Opens method, optimizer and precision (bf16-mixed and bf16-master are one semantics, the HF bf16 flag: the
first without DeepSpeed, the second under it), so plans are ranked per side (method, optim, precision)."""
SEMANTICS = {"bf16-mixed": "bf16-mixed", "bf16-master": "bf16-mixed", "32-true": "32-true"}
BASE = dict(model="llama-2-7b", num_examples=20000, tokens_per_example=512, max_seq_length=1024)
POLICIES = [
    PolicyRule(id="budget", description="at most $30", condition={"gt": {"cost_usd": 30}}),
    PolicyRule(id="long-spot", description="spot under 3 h", condition={"all": [{"eq": {"market": "spot"}},
                                                                               {"ge": {"train_hours": 3}}]}),
    PolicyRule(id="headroom", description="10 % free", condition={"lt": {"headroom_fraction": 0.10}}),
    PolicyRule(id="multi-node", description="penalise 2 nodes", action="penalise", penalty=0.5,
               condition={"gt": {"num_nodes": 1}}),
]


@pytest.fixture(scope="module")
def ctx():
    from fitplan.context import get_context
    from fitplan.pluginmgr.registry import make_registry

    return get_context((), make_registry(entry_points=False, blocked=()))


# --------------------------------------------------------------------------- the exhaustive reference


def brute_force(ctx, objective: str, policies: PolicySet, headroom: float = 0.05):
    """Every candidate of SPACE, each evaluated with the ordinary estimate path: (candidates, allowed,
    rejected_by_rule, not_fitting). Enumeration follows docs/recommend.md's rules, written out here."""
    rules = ctx.rulesets
    base = fitplan.scenario_from_dict(BASE)
    candidates = 0
    not_fitting = 0
    allowed = []
    rejected: dict[str, int] = {}
    hardware = []
    for gid in GPUS:
        g = rules.gpu(gid)
        for p in PROVIDERS:
            insts = [i for i in rules.instances.values() if i.provider == p and i.gpu == g.id]
            if not insts:
                continue
            largest = max(i.gpus for i in insts)
            for n, m in product((1, 2, 4, 8), SPACE.num_nodes):
                if n <= min(largest, g.gpus_per_node) and (m == 1 or n == largest) and n * m <= SPACE.max_gpus:
                    hardware += [(g, p, n, m, inst) for inst in shapes(insts, n, m)]
    prec_rank = {"bf16-mixed": 0, "bf16-master": 0, "32-true": 1}  # the order of the semantics in SPACE
    scenario_optim = base.training.optim
    for (g, p, n, m, inst), method, precision, optim, ckpt, attn in product(
            hardware, SPACE.methods, SPACE.precisions, SPACE.optimizers, (False, True), SPACE.attn_implementations):
        bf16 = "bf16" in g.peak_tflops
        if precision.startswith("bf16") and not bf16 or precision.startswith("16-") and bf16:
            continue
        if attn == "flash_attention_2" and (not bf16 or precision == "32-true"):
            continue
        dp = n * m
        shards = [(0, False, False), (2, True, False), (3, True, True)] if dp == 1 else [
            (0, False, False), (1, False, False), (2, False, False), (3, False, False), (1, True, False),
            (2, True, False), (3, True, False), (3, True, True), (3, False, True)]
        for z, oo, op in shards:
            if (z or oo or op) and precision not in ("32-true", "bf16-master", "16-master"):
                continue
            if precision == "bf16-master" and not (z or oo or op):
                continue  # the HF bf16 flag without DeepSpeed is autocast: bf16-mixed
            if SPACE.effective_batch_size % dp:
                continue
            per = SPACE.effective_batch_size // dp
            for b in (b for b in range(1, per + 1) if per % b == 0):
                k = per // b
                s = base.replace(gpu=g.id, provider=p, instance=inst, num_gpus=n, num_nodes=m, method=method, precision=precision,
                                 optim=optim, gradient_checkpointing=ckpt, attn_implementation=attn, zero_stage=z,
                                 offload_optimizer=oo, offload_params=op, per_device_train_batch_size=b,
                                 gradient_accumulation_steps=k)
                est = evaluate(s, ctx.registry, rules)
                v = est.values
                markets = ["on_demand"] + (["spot"] if v["spot_cost_usd"] is not None else [])
                candidates += len(markets)
                u = v["usable_bytes"]
                if v["device_total_bytes"] > u - int(u * headroom):
                    not_fitting += len(markets)
                    continue
                rented = est.role("instance").instance  # host RAM: each rank's offload × the ranks on one instance
                need = v["cpu_offload_bytes"] // n * min(n, rented.gpus)
                if rented.host_memory_gib is not None and need > rented.host_memory_gib * 2**30:
                    not_fitting += len(markets)
                    continue
                if need and rented.host_memory_gib is None:  # an offload nobody could check: not proposed
                    continue
                for market in markets:
                    ns = Namespace(v, market, None, policies.vocabulary)
                    fired, factor = policies.check(ns)
                    forbid = [f for f in fired if f.action == "forbid"]
                    if forbid:
                        rejected[forbid[0].rule] = rejected.get(forbid[0].rule, 0) + 1
                        continue
                    cost = v["spot_cost_usd"] if market == "spot" else v["on_demand_cost_usd"]
                    t = v["train_seconds"]
                    world = n * m
                    simplicity = ({"full": 0, "lora": 1, "qlora": 2}[method], 0 if optim == scenario_optim else 1,
                                  oo + 2 * op, z, prec_rank[precision])
                    head = u - v["device_total_bytes"]
                    score = {"cost": cost, "time": t, "gpus": world}[objective] * factor
                    second = {"cost": (t, world), "time": (cost, world), "gpus": (cost, t)}[objective]
                    allowed.append({"key": (score, *second, simplicity, -head), "cost": cost, "seconds": t,
                                    "side": (method, optim, SEMANTICS[precision])})
    return candidates, allowed, rejected, not_fitting


def shapes(insts, n: int, m: int) -> list[str | None]:
    """The instances a job on n × m GPUs is priced on: per topology (GPUs per instance, link inside, network),
    the cheapest per hour for the job (m·ceil(n/gpus) instances; ties: fewer GPUs paid, fewer instances, name);
    None (no --instance) for the cheapest of all, the estimate's own choice. One GPU talks to no one: only that.
    Several instances of a type stating no network are left out."""
    by_topology: dict[tuple, tuple] = {}
    for i in insts:
        count = m * math.ceil(n / i.gpus)
        key = (count * i.on_demand_per_hour, count * i.gpus, count, i.id, i.region, i.network_gbps)
        t = (i.gpus, i.interconnect, i.interconnect_gbps, i.network_gbps)
        by_topology[t] = min(by_topology.get(t, key), key)
    cheapest = min(by_topology.values())
    if n * m == 1:
        return [None]
    # several instances talk over the network: an instance stating none is not combined (docs/recommend.md)
    return [None if k == cheapest else k[3] for k in by_topology.values() if k[2] == 1 or k[5] is not None]


def pareto(points):
    pts = set(points)
    return {p for p in pts if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in pts)}


@pytest.mark.parametrize("objective,with_policies", [("cost", False), ("time", True), ("gpus", True)])
def test_pruned_search_equals_exhaustive_evaluation(ctx, objective, with_policies):
    policies = PolicySet(POLICIES if with_policies else [], ctx.registry)
    candidates, allowed, rejected, not_fitting = brute_force(ctx, objective, policies)
    base = fitplan.scenario_from_dict(BASE)
    res = rec.search(base, ctx, space=SPACE, objective=objective, headroom="0.05", policies=policies, top=10**6,
                     fixed=set(BASE))
    st = res.stats
    assert st.candidates == candidates
    assert st.allowed == len(allowed)
    assert st.rejected == sum(rejected.values()) and st.rejected_by == rejected
    assert st.too_big + st.pruned_monotone == not_fitting
    assert st.pruned_monotone > 0, "the space is meant to exercise the monotone pruning"
    assert st.unpriced == st.invalid == 0
    # per side (method, optim, precision semantics: each ranked on its own), groups of equal (score, cost, time):
    # one representative each, the best by key, the rest counted
    assert res.vary == ("method", "optim", "precision") and not res.plans
    sides = {tuple(s.values[d] for d in res.vary): s for s in res.sides}
    assert set(sides) == {(m, o, p) for m in SPACE.methods for o in SPACE.optimizers for p in ("bf16-mixed", "32-true")}
    for key, side in sides.items():
        mine = [a for a in allowed if a["side"] == key]
        groups: dict[tuple, list[dict]] = {}
        for a in mine:
            groups.setdefault((a["key"][0], a["cost"], a["seconds"]), []).append(a)
        assert len(side.plans) == len(groups), key
        assert [p.key[0] for p in side.plans] == sorted(p.key[0] for p in side.plans)
        for plan in side.plans:
            members = groups[(plan.key[0], plan.cost_usd, plan.train_seconds)]
            assert plan.equivalents == len(members) - 1
            assert plan.key[:-1] == min(m["key"] for m in members)
            assert (plan.fields["method"], plan.fields["optim"], SEMANTICS[plan.fields["precision"]]) == key
        # the side's cost-versus-time front
        assert {(p.train_seconds, p.cost_usd) for p in side.pareto} == pareto((a["seconds"], a["cost"]) for a in mine)
        assert [p.train_seconds for p in side.pareto] == sorted(p.train_seconds for p in side.pareto)


def test_reported_plans_are_the_estimates_of_their_scenarios(ctx):
    base = fitplan.scenario_from_dict(BASE)
    res = rec.search(base, ctx, space=SPACE, objective="cost", top=5, fixed=set(BASE))
    rec.attach_estimates(res, ctx)  # raises if the search and the estimate disagree
    for plan in res.all_plans():
        if plan.rejected_by:
            continue
        est = evaluate(plans.plan_scenario(base, plan), ctx.registry, ctx.rulesets)
        assert plan.device_total_bytes == est.values["device_total_bytes"]
        assert plan.train_seconds == est.values["train_seconds"]
        expected = est.values["spot_cost_usd"] if plan.market == "spot" else est.values["on_demand_cost_usd"]
        assert plan.cost_usd == expected
        u = est.values["usable_bytes"]
        assert est.values["device_total_bytes"] <= u - int(u * 0.05)


def test_staged_evaluation_equals_full_evaluation(ctx):
    """Loop-invariant evaluation with loops in an arbitrary order gives the values of a full evaluation."""
    from fitplan.estimation import build_inputs
    from fitplan.engine.staging import StagedGraph

    compiled = ctx.registry.compiled()
    targets = ["device_total_bytes", "train_seconds", "on_demand_cost_usd"]
    levels = [("zero_stage",), ("per_device_train_batch_size",), ("gpu", "gpu_spec"), ("method",)]
    g = StagedGraph(compiled, targets, levels)
    base = fitplan.scenario_from_dict({**BASE, "provider": "aws", "num_gpus": 4, "precision": "bf16-master"})
    v = build_inputs(base, ctx.registry, ctx.rulesets)
    g.run(v, -1)
    for z in (0, 3):
        v["zero_stage"] = z
        g.run(v, 0)
        for b in (1, 2):
            v["per_device_train_batch_size"] = b
            g.run(v, 1)
            for gid in ("a100-40gb", "a100-80gb"):
                v["gpu"], v["gpu_spec"] = gid, ctx.rulesets.gpu(gid)
                g.run(v, 2)
                for method in ("full", "lora"):
                    v["method"] = method
                    g.run(v, 3)
                    s = base.replace(zero_stage=z, per_device_train_batch_size=b, gpu=gid, method=method)
                    full = evaluate(s, ctx.registry, ctx.rulesets).values
                    for t in targets:
                        assert v[t] == full[t], (t, z, b, gid, method)


def test_plugin_optimizers_are_searched(ctx):
    from fitplan import OptimizerSpec, hookimpl
    from fitplan.context import get_context
    from fitplan.pluginmgr.registry import make_registry

    class Plugin:
        @hookimpl
        def fitplan_register_optimizers(register):
            register(OptimizerSpec(name="lion_test", state_bytes=lambda c: c.numel * c.state_bytes, doc="one state"))

    reg = make_registry(entry_points=False, blocked=(), extra_plugins=[("lion-test", Plugin)])
    with_plugin = get_context((), reg)
    space = SearchSpace(gpus=("a100-80gb",), providers=("aws",), methods=("lora",),
                            precisions=("bf16-true",), attn_implementations=("sdpa",), checkpointing=(False,))
    base = fitplan.scenario_from_dict(BASE)
    n_builtin = len([o for o in ctx.registry.optimizers.values() if o.search and not o.refused])  # --vary optim's
    a = rec.search(base, ctx, space=attrs.evolve(space, optimizers=rec.searchable_optimizers(ctx.registry)),
                   objective="cost", fixed=set(BASE)).stats.candidates
    b = rec.search(base, with_plugin, space=attrs.evolve(space, optimizers=rec.searchable_optimizers(reg)),
                   objective="cost", fixed=set(BASE)).stats.candidates
    assert "lion_test" in rec.searchable_optimizers(reg)
    assert b * n_builtin == a * (n_builtin + 1)


def test_fixed_fields_are_not_searched(ctx):
    base = fitplan.scenario_from_dict({**BASE, "method": "qlora", "gpu": "a100-80gb", "zero_stage": 0})
    res = rec.search(base, ctx, space=SPACE, objective="cost", fixed={*BASE, "method", "gpu", "zero_stage"})
    assert res.vary == ("optim", "precision")  # the fixed method is not varied
    assert any(s.plans for s in res.sides)
    for p in res.all_plans():
        assert p.fields["method"] == "qlora" and p.fields["gpu"] == "a100-80gb" and p.fields["zero_stage"] == 0


def test_objective_needs_a_dataset(ctx):
    base = fitplan.scenario_from_dict({"model": "llama-2-7b"})
    with pytest.raises(FitplanError, match="--objective cost needs the dataset size"):
        rec.search(base, ctx, space=SPACE, objective="cost")
    res = rec.search(base, ctx, space=SPACE, objective="gpus")
    best = [s.plans[0] for s in res.sides if s.plans]
    assert best and all(p.world_size == 1 and p.train_seconds is None for p in best)


@pytest.mark.parametrize(("text", "expected"), [("0.05", (0.05, 0)), ("10%", (0.1, 0)), ("2GB", (0.0, 2 * 10**9)),
                                                ("1.5GiB", (0.0, 3 * 2**29))])
def test_headroom(text, expected):
    assert parse_headroom(text) == expected


@pytest.mark.parametrize("text", ["lots", "1.5", "-0.1"])
def test_bad_headroom(text):
    with pytest.raises(FitplanError, match="headroom"):
        parse_headroom(text)


# --------------------------------------------------------------------------- reverse questions


@pytest.mark.parametrize(("field", "flag"), [("per_device_train_batch_size", "micro-batch"),
                                             ("max_seq_length", "seq-length")])
def test_largest_value_that_fits(ctx, field, flag):
    from fitplan.search.capacity import largest_fitting

    base = fitplan.scenario_from_dict({"model": "llama-2-7b", "gpu": "a100-80gb", "method": "lora",
                                                             "precision": "bf16-true", "gradient_checkpointing": True})
    r = largest_fitting(base, field, ctx, headroom="0.05")
    assert r["largest"] > 1

    def fits(x):
        v = evaluate(base.replace(**{field: x}), ctx.registry, ctx.rulesets).values
        return v["device_total_bytes"] <= v["usable_bytes"] - int(v["usable_bytes"] * 0.05)

    assert fits(r["largest"]) and not fits(r["largest"] + 1)
    proc = run_cli("recommend", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--method", "lora", "--precision",
                   "bf16-true", "--gradient-checkpointing", "--max", flag, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["largest"] == r["largest"]


def test_largest_value_needs_a_gpu():
    proc = run_cli("recommend", "--model", "llama-2-7b", "--max", "micro-batch")
    assert proc.returncode == 2
    assert "--max micro-batch needs a GPU to fit" in proc.stderr


def test_nothing_fits_is_reported(ctx):
    from fitplan.search.capacity import largest_fitting

    base = fitplan.scenario_from_dict({"model": "llama-2-70b", "gpu": "t4"})
    r = largest_fitting(base, "per_device_train_batch_size", ctx)
    assert r["largest"] == 0 and r["next_device_total_bytes"] > r["limit_bytes"]


# --------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def done_json():
    proc = run_cli("recommend", "--model", "llama-2-13b", "--num-examples", "50000", "--tokens-per-example", "1024",
                   "--num-train-epochs", "2", "--objective", "cost", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_done_criterion_ranked_plans_fit_with_memory_time_cost_and_front(done_json):
    plans = done_json["plans"]
    assert len(plans) == 10
    costs = [p["cost_usd"] for p in plans]
    assert costs == sorted(costs)
    for p in plans:
        mem = p["memory"]
        assert mem["fits"] is True
        assert mem["per_gpu_bytes"]["device_total"] <= mem["usable_bytes"] * 0.95
        assert p["time"]["seconds"] > 0 and p["cost"]["on_demand_usd"] > 0
        assert p["cost_usd"] == (p["cost"]["spot_usd"] if p["market"] == "spot" else p["cost"]["on_demand_usd"])
        # 50,000 × 1,024 tokens × 2 epochs (packed)
        assert p["time"]["tokens"] == 50000 * 1024 * 2
    front = done_json["pareto_front"]
    assert front
    times = [p["train_seconds"] for p in front]
    fcosts = [p["cost_usd"] for p in front]
    assert times == sorted(times) and fcosts == sorted(fcosts, reverse=True)
    assert min(fcosts) == costs[0]  # the cheapest plan is on the front
    s = done_json["search"]
    assert s["candidates"] == (s["too_big"] + s["pruned_monotone"] + s["unpriced"] + s["rejected"] + s["allowed"]
                               + s["invalid"] + s["host_ram_unstated"])


def test_a_plans_numbers_equal_fitplan_estimate_with_its_flags(done_json):
    for plan in (done_json["plans"][0], done_json["pareto_front"][0]):
        args = shlex.split(plan["command"])[2:]
        proc = run_cli("estimate", *args, "--format", "json")
        assert proc.returncode == 0, proc.stderr
        est = json.loads(proc.stdout)
        assert est["memory"] == plan["memory"]
        assert est["time"] == plan["time"]
        assert est["cost"] == plan["cost"]


def test_recommend_table_and_user_errors():
    proc = run_cli("recommend", "--model", "llama-2-7b", "--gpus", "a100-80gb", "--providers", "lambda",
                   "--num-examples", "1000", "--tokens-per-example", "512")
    assert proc.returncode == 0, proc.stderr
    assert "Ranked plans" in proc.stdout and "Pareto front" in proc.stdout
    assert "candidate plans in" in proc.stderr
    proc = run_cli("recommend", "--model", "llama-2-7b", "--methods", "full,lroa", "--objective", "gpus")
    assert proc.returncode == 2 and "unknown method in --methods 'lroa' @ --methods (did you mean 'lora' or 'qlora'?)" in proc.stderr
    proc = run_cli("recommend", "--model", "llama-2-7b", "--gpus", "h100", "--objective", "gpus", "--providers", "nope")
    assert proc.returncode == 2 and "unknown provider 'nope'" in proc.stderr


def test_search_evaluates_a_fraction_of_its_candidates(ctx):
    """A guard against an accidental slow path that cannot flake on a loaded machine: the search's cost is its
    evaluations, and pruning, staging and caching keep them well under the number of candidates (the rate in
    candidates per second is measured by bench/bench_recommend.py, not asserted here)."""
    from fitplan.search.space import SEARCH_PRECISIONS

    base = fitplan.scenario_from_dict(BASE)
    space = SearchSpace(methods=("full", "lora", "qlora"), precisions=SEARCH_PRECISIONS,
                        optimizers=rec.searchable_optimizers(ctx.registry))  # every dimension opened: a large space
    res = rec.search(base, ctx, space=space, objective="cost", fixed=set(BASE))
    assert res.stats.candidates > 100_000
    assert res.stats.memory_evaluations < res.stats.candidates / 10
    assert res.stats.memory_evaluations + res.stats.time_evaluations < res.stats.candidates / 2
    assert any(s.plans and math.isfinite(s.plans[0].cost_usd) for s in res.sides)
