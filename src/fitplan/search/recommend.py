"""The recommender: enumerate plans, keep those that fit, apply policies, rank, and find the Pareto front.

A *plan* is the user's scenario with these fields chosen by the search (docs/recommend.md): GPU type,
provider and instance shape (several instances only where the instance states its network), GPUs per node and
nodes, gradient checkpointing, ZeRO stage and CPU offload (within the instance's stated host RAM),
micro-batch × accumulation for a fixed effective batch, and the attention kernel, plus the market (on demand
unless spot is asked for): what leaves the trained model the same. Method, optimizer and precision are the
scenario's unless the space opens them (``--vary``); each value (a *side*) then has its own collector and
ranking, never one mixing them. A field the user set (``--gpu h100-sxm``, a scenario file's value) is fixed.

Three parts: the options are enumerated from the search space (:mod:`fitplan.search.space`); each
configuration is evaluated loop-invariantly (:class:`Staged`: each quantity is recomputed only in the loops
its inputs vary in, :mod:`fitplan.engine.staging`); the candidates that fit go to the collector
(:mod:`fitplan.search.plans`). Memory does not depend on the GPU model, so one memory evaluation serves every
GPU and provider; time does not depend on the attention kernel, so one time evaluation serves every kernel.
The quantities the search needs are found by their roles (``device_total``, ``usable``, ``seconds``,
``cost.on_demand``, ``cost.spot``), never by name. Sound pruning (proofs in docs/recommend.md):

* micro-batch monotonicity: with the accumulation flag (k > 1) fixed, memory does not decrease with the
  micro-batch, so once micro-batch b does not fit a GPU, no larger b with k > 1 does (the k = 1 plan,
  which holds no accumulated gradients, is always evaluated on its own);
* a plan must fit with the required headroom before its time, cost or policies are looked at.

The numbers of a plan are those of ``fitplan estimate`` with the plan's flags: the reported plans are
re-evaluated through the ordinary estimate path (:func:`attach_estimates`) and checked against the search's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from fitplan.errors import FitplanError, PluginError
from fitplan.inputs import scenario as sc
from fitplan.rulesets.conditions import Namespace
from fitplan.rules.policy import PolicySet
from fitplan.search.plans import (METHOD_RANK, Collector, Plan, Result, Side, Stats, make_plan, plan_scenario,
                                  ranking_key)
from fitplan.search.staged import (L_ATTN, L_BATCH, L_CKPT, L_METHOD, L_OPTIM, L_PRECISION, L_SHARD, L_WORLD,
                                   PlanValues, Staged, searched_fields, staged, usable_memory)
from fitplan.search.why import explain, gpu_hour_prices
from fitplan.search.space import (OBJECTIVES, SearchSpace, batch_options, gpu_allows, hardware_options, narrowed,
                                  parse_headroom, precision_twins, semantics, shard_options, simplicity_of)

_INF = float("inf")
_NO_MARKET = (None,)

@attrs.define
class _Search:
    """One search's fixed settings: the choices per loop, the hardware and its memory limits, the policies."""

    objective: str
    needs_price: bool
    choices: dict[str, tuple[Any, ...]]
    space: SearchSpace
    hardware: dict[tuple[int, int], list[Any]]
    limit: dict[str, int]
    usable: dict[str, int]
    tp: int
    fsdp: str | None
    policies: PolicySet
    collector: Collector
    """The collector of the side being searched (one of ``collectors``)."""
    collectors: dict[tuple[str, ...], Collector]
    """One per side: the values of the opened dimensions (``vary``); one, keyed ``()``, when none is opened."""
    vary: tuple[str, ...]
    unnetworked: set[str]
    stats: Stats
    optim_specs: dict[str, Any]
    optim_rank: dict[str, int]
    values: PlanValues
    ns: Namespace
    order: int = 0


def search(base: sc.Scenario, ctx, *, space: SearchSpace = SearchSpace(), objective: str = "cost",
           headroom: str | float = "0.05", policies: PolicySet | None = None, top: int = 10,
           fixed: Iterable[str] = (), progress: Callable[[int, int], None] | None = None) -> Result:
    """Enumerate, evaluate, filter and rank plans for ``base`` (the fields in ``fixed`` are not searched).

    :raises FitplanError: an unknown objective, a search space with nothing in it, an objective that
        needs a dataset or prices the scenario does not give.
    """
    from fitplan.estimation import hf_preset, peft_default_targets, resolve_arch, with_default_targets

    t0 = time.perf_counter()
    stats = Stats()
    given, arch = base, resolve_arch(base, ctx.rulesets)
    if base.lora.lora_target_modules is not None or peft_default_targets(arch) is not None or "method" in set(fixed):
        base = with_default_targets(base, arch)  # else LoRA is not searched (_choices): peft needs targets named
    if base.training.precision is None:  # the HF words' preset without DeepSpeed; its DeepSpeed twin is searched too
        base = base.replace(precision=hf_preset(base, arch))
    flat = sc.flatten(base)
    policies = policies or PolicySet([], ctx.registry)
    setup, st = _prepare(base, arch, flat, ctx, space, objective, headroom, policies, set(fixed), top, stats)
    ch = setup.choices
    twins = {p: precision_twins(p) for p in ch["precision"]}
    outer_total, outer_done = len(ch["method"]) * sum(map(len, twins.values())) * len(ch["optim"]), 0
    for method in ch["method"]:
        try:
            st.set({"method": method}, L_METHOD)
        except FitplanError as e:
            _note_invalid(stats, e, 0)
            outer_done += sum(map(len, twins.values())) * len(ch["optim"])
            continue
        for precision_rank, semantic in enumerate(ch["precision"]):
            for precision in twins[semantic]:
                st.set({"precision": precision}, L_PRECISION)
                for optim in ch["optim"]:
                    outer_done += 1
                    if progress is not None:
                        progress(outer_done, outer_total)
                    setup.collector = setup.collectors[side_key(setup.vary, method, semantic, optim)]
                    st.set({"optim": optim, "optimizer_spec": setup.optim_specs[optim]}, L_OPTIM)
                    for ckpt in ch["gradient_checkpointing"]:
                        st.set({"gradient_checkpointing": ckpt}, L_CKPT)
                        for n, m in sorted(setup.hardware):
                            _search_world(setup, st, n, m, (METHOD_RANK.get(method, 9), setup.optim_rank[optim],
                                                            precision_rank), flat)
    stats.seconds = time.perf_counter() - t0
    return _result(setup, st, flat, given, headroom, arch, ctx.rulesets)  # the scenario as given: its command line


def side_key(vary: tuple[str, ...], method: str, precision: str, optim: str) -> tuple[str, ...]:
    """The side a plan belongs to: its values of the opened dimensions ``vary`` (``precision``: the semantics,
    :func:`fitplan.search.space.semantics`)."""
    values = {"method": method, "optim": optim, "precision": precision}
    return tuple(values[d] for d in vary)


def searchable_optimizers(registry) -> tuple[str, ...]:
    """The optimizers ``--vary optim`` tries without ``--optims``: every registered one marked ``search``
    (plugins' included), none refused."""
    return tuple(n for n, o in registry.optimizers.items() if o.search and not o.refused)


def _prepare(base: sc.Scenario, arch, flat: dict[str, Any], ctx, space: SearchSpace, objective: str,
             headroom: str | float, policies: PolicySet, fixed: set[str], top: int,
             stats: Stats) -> tuple[_Search, Staged]:
    """Check the request (``arch``: the base's resolved architecture), resolve the fixed inputs, build the staged evaluations and the choices per loop."""
    from fitplan.estimation import build_inputs

    if objective not in OBJECTIVES:
        from fitplan.errors import unknown

        raise unknown("objective", objective, OBJECTIVES, field="--objective")
    registry, rules = ctx.registry, ctx.rulesets
    compiled = registry.compiled()
    roles = {r: compiled.role(r) for r in ("device_total", "usable", "headroom", "fit", "seconds", "cost.on_demand",
                                           "cost.spot", "peak", "cpu_offload")}
    needs_time = objective in ("cost", "time")
    _check_request(objective, needs_time, roles, flat)
    frac, hbytes = parse_headroom(headroom)
    tp = flat["tensor_parallel"]
    probe = base if (flat["num_gpus"] * flat["num_nodes"]) % tp == 0 else base.replace(num_gpus=tp, num_nodes=1)
    inputs = build_inputs(probe, registry, rules, arch)
    for name in searched_fields() | {"gpu_spec", "optimizer_spec"}:
        inputs.pop(name, None)
    st = staged(compiled, inputs, policies, roles, stats)
    space = narrowed(space, flat, fixed, rules)
    unnetworked: set[str] = set()
    hardware = hardware_options(rules, space, flat, objective == "cost", unnetworked)
    if not hardware:
        raise FitplanError("no GPU and provider to search over", field="--gpu/--provider",
                           suggestion="check --gpu, --provider and --max-gpus against `fitplan rulesets` data")
    usable = usable_memory(compiled, inputs, hardware, roles["usable"])
    choices = _choices(flat, fixed, space, registry, arch)
    _check_size(choices, hardware, space, flat["tensor_parallel"])
    optim_specs = {o: registry.resolve_optimizer(o) for o in choices["optim"]}
    base_optim = registry.resolve_optimizer(flat["optim"]).name
    optim_rank = {o: 0 if optim_specs[o].name == base_optim else 1 if optim_specs[o].name.startswith("adamw") else 2
                  for o in choices["optim"]}
    values = PlanValues(st.cur)
    vary = tuple(d for d in space.opened if d not in fixed and len(choices[d]) > 1)  # one value: nothing to compare
    collectors = {side_key(vary, m, p, o): Collector(top) for m in choices["method"] for p in choices["precision"]
                  for o in choices["optim"]}
    setup = _Search(objective, objective == "cost", choices, space, hardware,
                    {gid: u - max(int(u * frac), hbytes) for gid, u in usable.items()}, usable, tp, flat["fsdp"],
                    policies, next(iter(collectors.values())), collectors, vary, unnetworked, stats, optim_specs,
                    optim_rank, values, Namespace(values, None, None, policies.vocabulary))
    return setup, st


def has_dataset_size(flat: dict[str, Any]) -> bool:
    """Whether the flat scenario says how much it trains on (examples, total tokens or a dataset file): the time
    and cost objectives need it."""
    return flat["num_examples"] is not None or flat["total_tokens"] is not None or bool(flat["dataset_path"])


def _check_request(objective: str, needs_time: bool, roles: dict[str, str | None], flat: dict[str, Any]) -> None:
    missing = [r for r in ("seconds", "cost.on_demand", "cost.spot") if roles[r] is None]
    if needs_time and missing:
        raise FitplanError(f"--objective {objective} needs time and cost quantities (roles {', '.join(missing)}), which no "
                           "plugin declares", field="--objective", suggestion="use --objective gpus")
    if needs_time and not has_dataset_size(flat):
        raise FitplanError(f"--objective {objective} needs the dataset size to compute time and cost",
                           field="--objective", suggestion="add --dataset PATH, or --num-examples N --tokens-per-example T (or --total-tokens), "
                           "or rank by --objective gpus")


def _choices(flat: dict[str, Any], fixed: set[str], space: SearchSpace, registry, arch) -> dict[str, tuple[Any, ...]]:
    """The values of each loop: the scenario's own for a fixed field or a dimension the space does not open
    (None), else the space's; precisions by their semantics (:func:`fitplan.search.space.semantics`)."""
    def choices(name: str, options: Iterable[Any] | None) -> tuple[Any, ...]:
        return (flat[name],) if name in fixed or options is None else tuple(options)

    methods = choices("method", space.methods)
    if arch.is_bare or not flat["lora_target_modules"]:  # peft has no default targets for this model type: LoRA needs them named
        methods = tuple(m for m in methods if m == "full")
    return {
        "method": methods,
        "precision": tuple(dict.fromkeys(semantics(p) for p in choices("precision", space.precisions))),
        "optim": choices("optim", space.optimizers),
        "gradient_checkpointing": choices("gradient_checkpointing", space.checkpointing),
        "attn_implementation": choices("attn_implementation", space.attn_implementations),
    }


MAX_CANDIDATES = 20_000_000
"""The largest search fitplan starts (an upper bound; the default space of an 8B model holds under 10,000
candidates, with method, precision and optimizer all opened about 0.6 million): a larger one is narrowed first."""


def _check_size(choices: dict[str, tuple[Any, ...]], hardware: dict, space: SearchSpace, tp: int) -> None:
    """:raises FitplanError: the search space holds more than :data:`MAX_CANDIDATES` candidates (an upper bound:
    every sharding option for every configuration)."""
    per_config = 1
    for options in choices.values():
        per_config *= len(options)
    per_world = sum(len(batch_options(space, n * m // tp)) * sum(max(1, len(o[2])) for _, plist in hw for o in plist)
                    for (n, m), hw in hardware.items() if (n * m) % tp == 0)
    total = per_config * per_world * 9 * 2  # at most 9 ZeRO/offload combinations, 2 precisions per semantics
    if total > MAX_CANDIDATES:
        raise FitplanError(f"the search space holds up to {total:,} candidate plans, more than {MAX_CANDIDATES:,}",
                           field="--gpus/--providers/--vary",
                           suggestion="narrow it: --gpus, --providers, fewer --vary dimensions (or --methods, --precisions, "
                                      "--optims), --max-gpus")


def _note_invalid(stats: Stats, e: FitplanError, n: int) -> None:
    stats.invalid += n
    stats.invalid_reasons[e.message] = stats.invalid_reasons.get(e.message, 0) + n


def _search_world(setup: _Search, st: Staged, n: int, m: int, rank: tuple[int, int, int], flat: dict[str, Any]) -> None:
    """Every sharding and batch option on ``m`` nodes of ``n`` GPUs, for the configuration set so far."""
    if (n * m) % setup.tp:
        return  # tensor parallelism must divide the GPUs
    dp = n * m // setup.tp
    hw = setup.hardware[(n, m)]
    batches = batch_options(setup.space, dp)
    if not batches:
        return
    st.set({"num_gpus": n, "num_nodes": m}, L_WORLD)
    precision = st.cur["precision"]
    # per-(kernel, GPU) candidate counts: providers × markets
    per_ag = {(a, g.id): sum(max(1, len(o[2])) for o in plist)
              for a in setup.choices["attn_implementation"] for g, plist in hw
              if gpu_allows(g, precision, a, precision_opened="precision" in setup.vary)}
    if not per_ag:
        return
    method_rank, optim_rank, precision_rank = rank
    for option in shard_options(setup.space, dp, precision, setup.fsdp):
        st.set(option, L_SHARD)
        simplicity = (method_rank, optim_rank, simplicity_of(option), option["zero_stage"], precision_rank)
        dead: set[tuple[str, str]] = set()
        for b, k in batches:
            if k > 1 and dead and len(dead) == len(per_ag):
                # every (kernel, GPU) already failed at a smaller micro-batch: prune the rest of k > 1
                setup.stats.pruned_monotone += sum(per_ag.values())
                setup.stats.candidates += sum(per_ag.values())
                continue
            st.set({"per_device_train_batch_size": b, "gradient_accumulation_steps": k}, L_BATCH)
            _search_batch(setup, st, hw, per_ag, dead, k, n * m, simplicity, flat)


def _search_batch(setup: _Search, st: Staged, hw: list[Any], per_ag: dict[tuple[str, str], int],
                  dead: set[tuple[str, str]], k: int, world: int, simplicity: tuple, flat: dict[str, Any]) -> None:
    """Every attention kernel, GPU, provider and market for the micro-batch set so far."""
    stats, cur, vm = setup.stats, st.cur, st.vm
    for a in setup.choices["attn_implementation"]:
        ag_keys = [(g, plist) for g, plist in hw if (a, g.id) in per_ag]
        if not ag_keys:
            continue
        live = [(g, plist) for g, plist in ag_keys if k == 1 or (a, g.id) not in dead]
        pruned = sum(per_ag[(a, g.id)] for g, _ in ag_keys if k > 1 and (a, g.id) in dead)
        stats.pruned_monotone += pruned
        stats.candidates += pruned
        if not live:
            continue
        try:
            st.set({"attn_implementation": a}, L_ATTN)
        except FitplanError as e:
            cnt = sum(per_ag[(a, g.id)] for g, _ in live)
            stats.candidates += cnt
            _note_invalid(stats, e, cnt)
            continue
        stats.memory_evaluations += 1
        dt = vm[st.roles["device_total"]]
        snap = None
        for g, plist in live:
            cnt = per_ag[(a, g.id)]
            stats.candidates += cnt
            if dt > setup.limit[g.id]:
                stats.too_big += cnt
                setup.collector.miss(g.id, world, dt - setup.limit[g.id])
                if k > 1:
                    dead.add((a, g.id))
                continue
            if snap is None:
                snap = {nm: vm[nm] for nm in st.mem_names}
            setup.values.mem = snap
            u = setup.usable[g.id]
            cur["gpu"], cur["gpu_spec"] = g.id, g
            for role, value in (("usable", u), ("headroom", u - dt), ("fit", dt <= u)):
                if st.roles[role] is not None:
                    cur[st.roles[role]] = value
            host = vm[st.roles["cpu_offload"]] // cur["num_gpus"] if st.roles["cpu_offload"] is not None else 0
            setup.order = _candidates(setup, cur, plist, st.time_cost(g, plist), dt, u, world, simplicity, host)
            cur["provider"], cur["instance"] = flat["provider"], flat["instance"]


def _candidates(setup: _Search, cur: dict[str, Any], plist, tc, dt: int, usable: int, world: int,
                simplicity: tuple, host_per_rank: int) -> int:
    """Consider every (provider, instance, market) candidate of one fitting (configuration, GPU); returns the new
    order. ``host_per_rank``: each rank's host RAM for CPU offload (bytes): an instance holding fewer than its
    ranks' need does not fit (``too_big``, ``too_big_host_ram``); one stating no RAM is not proposed for an offload
    plan (``host_ram_unstated``): nobody could check it before launching."""
    stats, policies, collector, ns, objective = setup.stats, setup.policies, setup.collector, setup.ns, setup.objective
    order = setup.order
    has_policies = bool(policies.compiled)
    need_seconds = objective == "time"
    headroom = usable - dt
    for (p, inst, markets, ram, per_instance), entry in zip(plist, tc):
        n = max(1, len(markets))
        if isinstance(entry, FitplanError):
            stats.invalid += n
            stats.invalid_reasons[entry.message] = stats.invalid_reasons.get(entry.message, 0) + n
            continue
        need = host_per_rank * min(cur["num_gpus"], per_instance)
        if need and ram is not None and need > ram:
            stats.too_big += n
            stats.too_big_host_ram += n
            continue
        if need and ram is None:  # an offload plan an expert could not check: not proposed (docs/recommend.md)
            stats.host_ram_unstated += n
            continue
        notes = ()
        snapshot, seconds, od, spot = entry
        cur["provider"], cur["instance"] = p, inst
        setup.values.tc = snapshot
        for market in markets or _NO_MARKET:
            order += 1
            cost = spot if market == "spot" else od
            if setup.needs_price and cost is None or need_seconds and seconds is None:
                stats.unpriced += 1
                continue
            factor = 1.0
            if has_policies:
                ns.market = market
                rule = policies.first_forbidding(ns)
                if rule is not None:
                    stats.rejected += 1
                    stats.rejected_by[rule.id] = stats.rejected_by.get(rule.id, 0) + 1
                    key = ranking_key(objective, 1.0, cost, seconds, world, simplicity, headroom, order)
                    if key[0] <= collector.worst_rejected:
                        plan = make_plan(cur, market, dt, usable, seconds, cost, od, spot, world, key[0], order)
                        plan.rejected_by = [v for v in policies.check(ns)[0] if v.action == "forbid"]
                        plan.notes = list(notes)
                        collector.add_rejected(key, plan)
                    continue
                factor = policies.penalty_factor(ns)
            stats.allowed += 1
            _collect(setup, cur, market, dt, usable, seconds, cost, od, spot, world, simplicity, headroom, order, factor,
                     notes)
    setup.values.tc = {}
    return order


def _collect(setup: _Search, cur, market, dt, usable, seconds, cost, od, spot, world, simplicity, headroom, order,
             factor, notes=()) -> None:
    """Rank an allowed candidate: into the top plans and onto the Pareto front when it belongs there."""
    collector, objective = setup.collector, setup.objective
    c = _INF if cost is None else cost
    t = _INF if seconds is None else seconds
    score = (c if objective == "cost" else t if objective == "time" else world) * factor
    on_front = seconds is not None and cost is not None and not collector.dominated(seconds, cost)
    dims = (("gpu", cur["gpu"]), ("gpus", world), ("provider", cur["provider"]))
    runner = collector.beats_a_dimension(score, dims)
    if score > collector.worst_score and not on_front and not runner:
        return
    key = ranking_key(objective, factor, cost, seconds, world, simplicity, headroom, order)
    plan = make_plan(cur, market, dt, usable, seconds, cost, od, spot, world, key[0], order)
    if runner:
        collector.add_dimensions(key, plan, dims)
    plan.notes = list(notes)
    if factor != 1.0:
        setup.ns.market = market
        plan.penalties = [v for v in setup.policies.check(setup.ns)[0] if v.action == "penalise"]
    if score <= collector.worst_score:
        collector.add(key, plan)
    if on_front:
        collector.add_front(seconds, cost, key, plan)


def _result(setup: _Search, st: Staged, flat: dict[str, Any], base: sc.Scenario, headroom: str | float, arch,
            rules) -> Result:
    stats = setup.stats
    prices = gpu_hour_prices(rules, setup.space.providers)
    sides = [_side(setup, key, c, prices) for key, c in setup.collectors.items()]
    if (setup.objective == "gpus" and st.roles["seconds"] is not None and flat["num_examples"] is None
            and flat["total_tokens"] is None and not flat["dataset_path"]):
        stats.notes.append("no dataset given: plans have no time or cost (add --dataset, or --num-examples and "
                           "--tokens-per-example)")
    worlds = sorted(setup.hardware)
    skipped = sorted({n * m for (n, m) in worlds if (n * m) % setup.tp == 0
                      and not batch_options(setup.space, n * m // setup.tp)})
    if skipped:
        stats.notes.append(f"effective batch {setup.space.effective_batch_size} cannot be split over "
                           f"{', '.join(map(str, skipped))} GPUs: those GPU counts were not searched")
    if setup.unnetworked:
        stats.notes.append("never combined across instances (they state no network between instances): "
                           + ", ".join(sorted(setup.unnetworked)))
    if stats.host_ram_unstated:
        stats.notes.append(f"{stats.host_ram_unstated:,} candidates offload to the CPU on an instance that states no host "
                           "RAM: not proposed, since their host memory cannot be checked (state host_memory_gib for the "
                           "instance in a pricing ruleset to search them)")
    model = {"name": arch.name, "params": arch.param_count}
    one = sides[0] if not setup.vary else Side({}, [], [], [])
    return Result(setup.objective, one.plans, one.pareto, one.rejected, stats, setup.space, base, str(headroom),
                  setup.policies.describe(), model, setup.vary, sides if setup.vary else [], why=one.why)


def _side(setup: _Search, key: tuple[str, ...], collector: Collector, prices: dict[str, float]) -> Side:
    plans = [p for _, p in collector.best]
    for i, p in enumerate(plans, 1):
        p.rank = i
    pareto, rejected = [p for _, _, _, p in collector.front], [p for _, p in collector.rejected]
    why = explain(setup.objective, plans, pareto, rejected, collector, prices)
    return Side(dict(zip(setup.vary, key)), plans, pareto, rejected, why)


# --------------------------------------------------------------------------- after the search


def attach_estimates(result: Result, ctx, *, check: bool = True) -> None:
    """Evaluate every plan a report shows through the ordinary estimate path (the numbers of ``fitplan
    estimate`` with the plan's flags) and check them against the search's values. Reports render these
    estimates without evaluating anything more.

    :raises PluginError: the search and the estimate disagree (a bug, or an impure plugin quantity).
    """
    from fitplan.estimation import evaluate

    seen: dict[int, Any] = {}
    for plan in result.all_plans():
        if id(plan) in seen:
            continue
        est = evaluate(plan_scenario(result.base, plan), ctx.registry, ctx.rulesets)
        plan.estimate = est
        seen[id(plan)] = est
        if check:
            _check_plan(plan, est)


def _check_plan(plan: Plan, est) -> None:
    pairs = [("device_total", plan.device_total_bytes), ("usable", plan.usable_bytes)]
    if est.role("seconds") is not None or plan.train_seconds is not None:
        pairs += [("seconds", plan.train_seconds), ("cost.on_demand", plan.on_demand_cost_usd),
                  ("cost.spot", plan.spot_cost_usd)]
    for role, a in pairs:
        b = est.role(role)
        if a != b and not (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-12)):
            name = est.registry.compiled().role(role)
            raise PluginError(f"the search's {name} ({a!r}) differs from fitplan estimate's ({b!r}) for plan "
                              f"{plan.label}", field=name,
                              suggestion="a quantity is impure (depends on state outside its inputs)")
