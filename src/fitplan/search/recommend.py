"""The recommender: enumerate plans, keep those that fit, apply policies, rank, and find the Pareto front.

A *plan* is the user's scenario with these fields chosen by the search (docs/recommend.md):
GPU type, provider, GPUs per node and nodes (instance shapes respected: a node is at most the largest
instance the provider rents with that GPU, and several nodes are whole such instances), method (full,
LoRA, QLoRA), precision preset, optimizer (every registered one, plugins' included), gradient
checkpointing, ZeRO stage and CPU offload, micro-batch × accumulation for a fixed effective batch, and
the attention kernel, plus the market (on demand or spot). A field the user set (``--method lora``,
``--gpu h100-sxm``, a scenario file's value) is fixed, not searched.

Speed: the search evaluates the quantity graph loop-invariantly (:mod:`fitplan.engine.staging`): each quantity
is recomputed only in the loops its inputs vary in. Memory does not depend on the GPU model, so one
memory evaluation serves every GPU and provider; time does not depend on the attention kernel, so one
time evaluation serves every kernel. Sound pruning (proofs in docs/recommend.md):

* micro-batch monotonicity: with the accumulation flag (k > 1) fixed, memory does not decrease with the
  micro-batch, so once micro-batch b does not fit a GPU, no larger b with k > 1 does (the k = 1 plan,
  which holds no accumulated gradients, is always evaluated on its own);
* a plan must fit with the required headroom before its time, cost or policies are looked at.

The numbers of a plan are those of ``fitplan estimate`` with the plan's flags: the reported plans are
re-evaluated through the ordinary estimate path and checked against the search's values.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from fitplan.inputs import scenario as sc
from fitplan.rules.conditions import Namespace, format_literal
from fitplan.errors import FitplanError, PluginError
from fitplan.rules.policy import PolicySet, Verdict
from fitplan.engine.staging import StagedGraph

OBJECTIVES = ("cost", "time", "gpus")
MARKETS = ("on_demand", "spot")
ATTN_PREFERENCE = ("sdpa", "flash_attention_2", "eager")
DEEPSPEED_PRECISIONS = ("32-true", "bf16-master", "16-master")
"""Precisions a DeepSpeed engine runs (fp32, or its bf16/fp16 optimizer with fp32 master weights)."""
GPU_COUNTS = (1, 2, 4, 8)
_INF = float("inf")
METHOD_RANK = {"full": 0, "lora": 1, "qlora": 2}

MEMORY_TARGETS = ("device_total_bytes", "peak_bytes", "peak_phase", "cpu_offload_bytes", "model_state_bytes")
TIME_COST_TARGETS = ("train_seconds", "train_tokens", "train_tokens_per_second", "gpu_hours", "instance_choice",
                     "on_demand_cost_usd", "spot_cost_usd", "cost_currency")

# loop levels, outermost first: what varies at each
LEVELS: tuple[tuple[str, ...], ...] = (
    ("method",),
    ("precision",),
    ("optim", "optimizer_spec"),
    ("gradient_checkpointing",),
    ("num_gpus", "num_nodes"),
    ("zero_stage", "offload_optimizer", "offload_params"),
    ("per_device_train_batch_size", "gradient_accumulation_steps"),
    ("attn_implementation",),
    ("gpu", "gpu_spec"),
    ("provider",),
)
L_METHOD, L_PRECISION, L_OPTIM, L_CKPT, L_WORLD, L_SHARD, L_BATCH, L_ATTN, L_GPU, L_PROVIDER = range(len(LEVELS))
SEARCHED = frozenset(n for names in LEVELS for n in names if n not in ("optimizer_spec", "gpu_spec"))


@attrs.frozen
class SearchSpace:
    """What the recommender may choose. ``None`` for gpus / providers / optimizers: every one known."""

    methods: tuple[str, ...] = sc.METHODS
    precisions: tuple[str, ...] = ("bf16-mixed", "bf16-true", "bf16-master", "16-mixed", "16-true", "16-master", "32-true")
    optimizers: tuple[str, ...] | None = None
    checkpointing: tuple[bool, ...] = (False, True)
    attn_implementations: tuple[str, ...] = ATTN_PREFERENCE
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    offload_optimizer: tuple[bool, ...] = (False, True)
    offload_params: tuple[bool, ...] = (False, True)
    gpus: tuple[str, ...] | None = None
    providers: tuple[str, ...] | None = None
    gpu_counts: tuple[int, ...] = GPU_COUNTS
    num_nodes: tuple[int, ...] = (1, 2)
    max_gpus: int = 16
    effective_batch_size: int = 16
    micro_batch_size: int | None = None
    accumulation_steps: int | None = None
    markets: tuple[str, ...] = MARKETS


@attrs.define
class Stats:
    """What the search did. Every candidate plan is counted once, in exactly one of the leaf counts."""

    candidates: int = 0
    too_big: int = 0
    """Evaluated, and does not fit with the required headroom."""
    pruned_monotone: int = 0
    """Not evaluated: a smaller micro-batch (same accumulation flag) already did not fit."""
    unpriced: int = 0
    """Fits, but has no price (no dataset, no provider, no spot price) while the objective needs one."""
    rejected: int = 0
    """Fits, and a forbid policy rejects it."""
    allowed: int = 0
    invalid: int = 0
    """Candidates whose evaluation raised a user error (a throughput table without this GPU, ...)."""
    memory_evaluations: int = 0
    time_evaluations: int = 0
    seconds: float = 0.0
    rejected_by: dict[str, int] = attrs.Factory(dict)
    invalid_reasons: dict[str, int] = attrs.Factory(dict)
    notes: list[str] = attrs.Factory(list)

    @property
    def rate(self) -> float:
        return self.candidates / self.seconds if self.seconds else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates, "too_big": self.too_big, "pruned_monotone": self.pruned_monotone,
            "unpriced": self.unpriced, "rejected": self.rejected, "allowed": self.allowed, "invalid": self.invalid,
            "memory_evaluations": self.memory_evaluations, "time_evaluations": self.time_evaluations,
            "rejected_by": dict(sorted(self.rejected_by.items())),
            "invalid_reasons": dict(sorted(self.invalid_reasons.items())),
            "notes": list(self.notes),
        }


@attrs.define
class Plan:
    """One candidate: the scenario fields the search chose, its market and key numbers.

    ``estimate`` is filled (by the ordinary estimate path) for the plans a report shows.
    """

    fields: dict[str, Any]
    market: str | None
    device_total_bytes: int
    usable_bytes: int
    train_seconds: float | None
    cost_usd: float | None
    on_demand_cost_usd: float | None
    spot_cost_usd: float | None
    world_size: int
    score: float
    order: int
    penalties: list[Verdict] = attrs.Factory(list)
    rejected_by: list[Verdict] = attrs.Factory(list)
    estimate: Any = None
    rank: int | None = None
    equivalents: int = 0
    """Other plans with the same score, time and cost (they differ only in choices that change neither)."""
    key: tuple = ()

    @property
    def headroom_bytes(self) -> int:
        return self.usable_bytes - self.device_total_bytes

    @property
    def label(self) -> str:
        f = self.fields
        hw = f"{f['num_nodes']}×{f['num_gpus']}" if f["num_nodes"] > 1 else f"{f['num_gpus']}×"
        parts = [f"{hw} {f['gpu']}", f["method"], f["precision"], f["optim"],
                 f"b{f['per_device_train_batch_size']}×{f['gradient_accumulation_steps']}"]
        if f["gradient_checkpointing"]:
            parts.append("ckpt")
        if f["zero_stage"]:
            parts.append(f"ZeRO-{f['zero_stage']}")
        if f["offload_optimizer"] or f["offload_params"]:
            parts.append("offload " + "+".join(x for x, on in (("optimizer", f["offload_optimizer"]),
                                                             ("params", f["offload_params"])) if on))
        if f["attn_implementation"] != "sdpa":
            parts.append(f["attn_implementation"])
        if f.get("provider"):
            parts.append(f"{f['provider']}" + (" spot" if self.market == "spot" else ""))
        return " · ".join(parts)


@attrs.define
class Result:
    """The ranked allowed plans, the cost-versus-time Pareto front, the best rejected plans, and the stats."""

    objective: str
    plans: list[Plan]
    pareto: list[Plan]
    rejected: list[Plan]
    stats: Stats
    space: SearchSpace
    base: sc.Scenario
    headroom: str
    policies: list[dict[str, Any]] = attrs.Factory(list)


# --------------------------------------------------------------------------- headroom


def parse_headroom(text: str | float) -> tuple[float, int]:
    """``--headroom``: a fraction of usable memory (``0.1``, ``10%``) or bytes (``2GB``, ``1.5GiB``).
    Returns ``(fraction, bytes)``; one of them is 0."""
    s = str(text).strip()
    try:
        if s.endswith("%"):
            f = float(s[:-1]) / 100
        elif s[-3:].lower() == "gib":
            return 0.0, int(float(s[:-3]) * 2**30)
        elif s[-2:].lower() == "gb":
            return 0.0, int(float(s[:-2]) * 1e9)
        else:
            f = float(s)
    except ValueError:
        raise FitplanError(f"cannot read headroom {text!r}", field="--headroom", value=text,
                           suggestion="a fraction of usable memory (0.1 or 10%) or an amount (2GB, 1.5GiB)") from None
    if not 0 <= f < 1:
        raise FitplanError(f"headroom fraction must be in [0, 1), got {f:g}", field="--headroom", value=text,
                           suggestion="0.05 keeps 5 % of the GPU free")
    return f, 0


# --------------------------------------------------------------------------- collecting results


class _Collector:
    """Top-N allowed plans by key, the Pareto front of (time, cost), and the best rejected plans.

    Plans with the same score, time and cost are one group: the best of them (by key) represents it and
    counts the others as ``equivalents`` (they differ only in choices that change neither time nor cost).
    """

    def __init__(self, top: int) -> None:
        self.top = top
        self.best: list[tuple[tuple, Plan]] = []
        self.groups: dict[tuple, Plan] = {}
        self.worst_score = _INF
        self.front_t: list[float] = []  # ascending time
        self.front: list[tuple[float, float, tuple, Plan]] = []  # (time, cost, key, plan), cost descending
        self.rejected: list[tuple[tuple, Plan]] = []
        self.rejected_groups: dict[tuple, Plan] = {}
        self.worst_rejected = _INF

    def add(self, key: tuple, plan: Plan) -> None:
        self.worst_score = _insert(self.best, self.groups, self.top, key, plan)

    def dominated(self, t: float, c: float) -> bool:
        """Whether a point of the front is at least as fast and as cheap as (``t``, ``c``) and better in one
        (the same point is not dominated: its plans compete to represent it)."""
        i = bisect.bisect_right(self.front_t, t)
        if i == 0:
            return False
        pt, pc = self.front[i - 1][0], self.front[i - 1][1]
        return pc < c or pc == c and pt < t

    def add_front(self, t: float, c: float, key: tuple, plan: Plan) -> None:
        i = bisect.bisect_right(self.front_t, t)
        if i > 0 and self.front[i - 1][1] <= c:
            prev = self.front[i - 1]
            if prev[0] == t and prev[1] == c and key < prev[2]:
                self.front[i - 1] = (t, c, key, plan)  # the same point: keep the preferred plan
            return
        lo = bisect.bisect_left(self.front_t, t)
        hi = lo
        while hi < len(self.front) and self.front[hi][1] >= c:
            hi += 1  # points at least as slow and at least as expensive: now dominated
        self.front[lo:hi] = [(t, c, key, plan)]
        self.front_t[lo:hi] = [t]

    def add_rejected(self, key: tuple, plan: Plan) -> None:
        self.worst_rejected = _insert(self.rejected, self.rejected_groups, self.top, key, plan)


def _insert(ranked: list[tuple[tuple, Plan]], groups: dict[tuple, Plan], top: int, key: tuple, plan: Plan) -> float:
    """Insert into a top-``top`` list grouped by ``key[:2]`` + cost; returns the worst score kept (inf if not full)."""
    gkey = (key[0], plan.cost_usd, plan.train_seconds)
    existing = groups.get(gkey)
    if existing is not None:
        existing.equivalents += 1
        if key < existing.key:
            i = next(i for i, (_, p) in enumerate(ranked) if p is existing)
            ranked.pop(i)
            plan.equivalents = existing.equivalents
            plan.key = key
            groups[gkey] = plan
            bisect.insort(ranked, (key, plan), key=lambda x: x[0])
    else:
        plan.key = key
        groups[gkey] = plan
        bisect.insort(ranked, (key, plan), key=lambda x: x[0])
        if len(ranked) > top:
            _, dropped = ranked.pop()
            groups.pop(next(k for k, p in groups.items() if p is dropped), None)
    return ranked[-1][0][0] if len(ranked) >= top else _INF


class _PlanValues:
    """The values a policy condition reads for the current candidate: the loop's scenario fields and
    fit numbers (``cur``), the memory snapshot and the time/cost snapshot. No allocation per candidate."""

    __slots__ = ("cur", "mem", "tc")

    def __init__(self, cur: dict[str, Any]) -> None:
        self.cur = cur
        self.mem: dict[str, Any] = {}
        self.tc: dict[str, Any] = {}

    def get(self, name: str, default: Any = None) -> Any:
        if name in self.tc:
            return self.tc[name]
        if name in self.mem:
            return self.mem[name]
        return self.cur.get(name, default)


# --------------------------------------------------------------------------- the search


def _hardware(rules, space: SearchSpace, fixed: dict[str, Any], needs_price: bool) -> dict[tuple[int, int], list[tuple[Any, list[tuple[str | None, tuple[str, ...]]]]]]:
    """(GPUs per node, nodes) -> [(GPU, [(provider, markets with a price)])], respecting instance shapes."""
    from fitplan.rulesets.pricing import choose_instance, instances_for

    gpu_ids = space.gpus if space.gpus is not None else tuple(sorted({i.gpu for i in rules.instances.values()}))
    out: dict[tuple[int, int], list] = {}
    for gid in gpu_ids:
        g = rules.gpu(gid)
        providers = sorted({p for (p, _, _), i in rules.instances.items() if i.gpu == g.id})
        if space.providers is not None:
            providers = [p for p in providers if p in space.providers]
        shapes: list[tuple[str | None, int]] = [(p, max(i.gpus for i in instances_for(rules, p, g.id))) for p in providers]
        if not shapes and space.gpus is not None and not needs_price:
            shapes = [(None, g.gpus_per_node)]  # a GPU named by the user without a price: time and memory only
        for p, largest in shapes:
            for n in space.gpu_counts:
                if n > min(largest, g.gpus_per_node):
                    continue
                for m in space.num_nodes:
                    if m > 1 and n != largest or n * m > space.max_gpus:
                        continue
                    markets: tuple[str, ...] = ()
                    if p is not None:
                        try:
                            inst = choose_instance(rules, p, g.id, n, m, fixed.get("instance"), fixed.get("region"))
                        except FitplanError:
                            continue  # --instance / --region name another GPU's shape
                        markets = tuple(mk for mk in space.markets if mk == "on_demand" or inst.spot_per_hour is not None)
                        if not markets:
                            continue
                    entry = out.setdefault((n, m), [])
                    for eg, plist in entry:
                        if eg is g:
                            plist.append((p, markets))
                            break
                    else:
                        entry.append((g, [(p, markets)]))
    return out


def _batch_options(space: SearchSpace, dp: int) -> list[tuple[int, int]]:
    """(micro-batch, accumulation) pairs with ``b·k·dp = effective batch``: k > 1 ones by ascending b, then k = 1."""
    b_fixed, k_fixed = space.micro_batch_size, space.accumulation_steps
    if b_fixed is not None and k_fixed is not None:
        return [(b_fixed, k_fixed)]
    E = space.effective_batch_size
    if E % dp:
        return []
    per = E // dp
    if b_fixed is not None:
        return [(b_fixed, per // b_fixed)] if per % b_fixed == 0 else []
    if k_fixed is not None:
        return [(per // k_fixed, k_fixed)] if per % k_fixed == 0 else []
    divisors = [b for b in range(1, per + 1) if per % b == 0]
    return [(b, per // b) for b in divisors if per // b > 1] + [(per, 1)]


def _shard_options(space: SearchSpace, dp: int, precision: str, fsdp: str | None) -> list[tuple[int, bool, bool]]:
    if fsdp:
        return [(0, False, False)] if 0 in space.zero_stages and False in space.offload_optimizer else []
    if dp == 1:
        combos = [(0, False, False), (2, True, False), (3, True, True)]
    else:
        combos = [(0, False, False), (1, False, False), (2, False, False), (3, False, False),
                  (1, True, False), (2, True, False), (3, True, False), (3, True, True), (3, False, True)]
    out = []
    for z, oo, op in combos:
        if z not in space.zero_stages or oo not in space.offload_optimizer or op not in space.offload_params:
            continue
        deepspeed = z >= 1 or oo or op
        if deepspeed and precision not in DEEPSPEED_PRECISIONS:
            continue
        out.append((z, oo, op))
    return out


def _gpu_allows(g, precision: str, attn: str) -> bool:
    bf16 = "bf16" in g.peak_tflops
    if precision.startswith("bf16") and not bf16:
        return False
    if precision.startswith("16-") and bf16:
        return False  # on a bf16 GPU an fp16 preset equals its bf16 twin in memory, time and cost
    if attn == "flash_attention_2" and (not bf16 or precision == "32-true"):
        return False
    return True


def search(base: sc.Scenario, ctx, *, space: SearchSpace = SearchSpace(), objective: str = "cost",
           headroom: str | float = "0.05", policies: PolicySet | None = None, top: int = 10,
           fixed: Iterable[str] = (), progress: Callable[[int, int], None] | None = None) -> Result:
    """Enumerate, evaluate, filter and rank plans for ``base`` (the fields in ``fixed`` are not searched).

    :raises FitplanError: an unknown objective, a search space with nothing in it, an objective that
        needs a dataset or prices the scenario does not give.
    """
    from fitplan.estimation import build_inputs, resolve_arch

    if objective not in OBJECTIVES:
        from fitplan.errors import unknown

        raise unknown("objective", objective, OBJECTIVES, field="--objective")
    t0 = time.perf_counter()
    registry, rules = ctx.registry, ctx.rulesets
    compiled = registry.compiled()
    policies = policies or PolicySet([], registry)
    frac, hbytes = parse_headroom(headroom)
    fixed = set(fixed)
    flat = sc.flatten(base)
    arch = resolve_arch(base, rules)
    stats = Stats()
    needs_time = objective in ("cost", "time")
    missing_tc = [t for t in TIME_COST_TARGETS if t not in compiled.nodes]
    if needs_time and missing_tc:
        raise FitplanError(f"--objective {objective} needs time and cost quantities ({', '.join(missing_tc)}), which no "
                           "plugin declares", field="--objective", suggestion="use --objective gpus")
    if needs_time and flat["num_examples"] is None and flat["total_tokens"] is None:
        raise FitplanError(f"--objective {objective} needs the dataset size to compute time and cost",
                           field="--objective", suggestion="add --num-examples N --tokens-per-example T (or --total-tokens), "
                           "or rank by --objective gpus")
    needs_price = objective == "cost"

    # fixed inputs: everything but the searched fields
    # the fixed inputs (searched ones are set by the loops); the probe's GPU count only has to be valid
    tp = flat["tensor_parallel"]
    probe = base if (flat["num_gpus"] * flat["num_nodes"]) % tp == 0 else base.replace(num_gpus=tp, num_nodes=1)
    inputs = build_inputs(probe, registry, rules, arch)
    for name in SEARCHED | {"gpu_spec", "optimizer_spec"}:
        inputs.pop(name, None)
    cur: dict[str, Any] = dict(inputs)
    mem_targets = [t for t in MEMORY_TARGETS if t in compiled.nodes]
    mem_targets += [q for q in compiled.memory if q not in mem_targets]
    policy_quantities = {n for n in policies.names if n in compiled.nodes and compiled.nodes[n].kind != "input"}
    M = StagedGraph(compiled, mem_targets, LEVELS)
    if M.depends_on("provider") or M.depends_on("gpu_spec") or M.depends_on("gpu"):
        raise PluginError("a memory quantity depends on the GPU model or the provider; the recommender assumes it does "
                          "not (one memory evaluation serves every GPU)", field="device_total_bytes",
                          suggestion="report this plugin interaction")
    mem_names = set(mem_targets) | {n for n in policy_quantities if n in M.level_of}
    tc_targets = [t for t in TIME_COST_TARGETS if t in compiled.nodes]
    tc_targets += sorted(n for n in policy_quantities if n not in mem_names)
    T = StagedGraph(compiled, tc_targets, LEVELS) if tc_targets else None
    # time and cost are memoised on the loop inputs they depend on (not the optimizer, not the kernel, ...)
    t_key_names = [n for names in LEVELS[:L_GPU] for n in names
                   if T is not None and T.depends_on(n) and n not in ("optimizer_spec",)]
    if T is not None and T.depends_on("optimizer_spec") and "optim" not in t_key_names:
        t_key_names.append("optim")
    tmemo: dict[tuple, list[Any]] = {}
    usable_graph = StagedGraph(compiled, ["usable_bytes"], LEVELS)
    vm: dict[str, Any] = dict(inputs)
    vt: dict[str, Any] = dict(inputs)
    vu: dict[str, Any] = dict(inputs)
    M.run(vm, -1)
    if T is not None:
        T.run(vt, -1)

    def choices(name: str, options: Sequence[Any]) -> Sequence[Any]:
        return (flat[name],) if name in fixed else tuple(options)

    methods = choices("method", space.methods)
    if arch.family == "bare":
        methods = tuple(m for m in methods if m == "full")
    precisions = choices("precision", space.precisions)
    optimizers = choices("optim", space.optimizers if space.optimizers is not None else tuple(registry.optimizers))
    ckpts = choices("gradient_checkpointing", space.checkpointing)
    attns = choices("attn_implementation", space.attn_implementations)
    if "zero_stage" in fixed or "offload_optimizer" in fixed or "offload_params" in fixed:
        space = attrs.evolve(space, zero_stages=(flat["zero_stage"],) if "zero_stage" in fixed else space.zero_stages,
                             offload_optimizer=(flat["offload_optimizer"],) if "offload_optimizer" in fixed else space.offload_optimizer,
                             offload_params=(flat["offload_params"],) if "offload_params" in fixed else space.offload_params)
    if "gpu" in fixed:
        space = attrs.evolve(space, gpus=(rules.gpu(flat["gpu"]).id,))
    if "provider" in fixed:
        space = attrs.evolve(space, providers=(flat["provider"],))
    if "num_gpus" in fixed:
        space = attrs.evolve(space, gpu_counts=(flat["num_gpus"],))
    if "num_nodes" in fixed:
        space = attrs.evolve(space, num_nodes=(flat["num_nodes"],))
    if "per_device_train_batch_size" in fixed:
        space = attrs.evolve(space, micro_batch_size=flat["per_device_train_batch_size"])
    if "gradient_accumulation_steps" in fixed:
        space = attrs.evolve(space, accumulation_steps=flat["gradient_accumulation_steps"])
    hardware = _hardware(rules, space, flat, needs_price)
    if not hardware:
        raise FitplanError("no GPU and provider to search over", field="--gpu/--provider",
                           suggestion="check --gpu, --provider and --max-gpus against `fitplan rulesets` data")
    usable: dict[str, int] = {}
    for opts in hardware.values():
        for g, _ in opts:
            if g.id not in usable:
                vu["gpu"], vu["gpu_spec"] = g.id, g
                for lvl in range(-1, len(LEVELS)):
                    usable_graph.run(vu, lvl)
                usable[g.id] = vu["usable_bytes"]
    limit = {gid: u - max(int(u * frac), hbytes) for gid, u in usable.items()}
    worlds = sorted(hardware)
    fsdp = flat["fsdp"]
    collector = _Collector(top)
    values = _PlanValues(cur)
    ns = Namespace(values)
    optim_specs = {o: registry.resolve_optimizer(o) for o in optimizers}
    base_optim = registry.resolve_optimizer(flat["optim"]).name
    optim_rank = {o: 0 if optim_specs[o].name == base_optim else 1 if optim_specs[o].name.startswith("adamw") else 2
                  for o in optimizers}
    order = 0
    outer_total = len(methods) * len(precisions) * len(optimizers)
    outer_done = 0

    def note_invalid(e: FitplanError, n: int) -> None:
        stats.invalid += n
        key = e.message
        stats.invalid_reasons[key] = stats.invalid_reasons.get(key, 0) + n

    def set_level(names_values: dict[str, Any], level: int) -> None:
        for k, v in names_values.items():
            vm[k] = vt[k] = cur[k] = v
        M.run(vm, level)
        if T is not None:
            T.run(vt, level)

    for method in methods:
        try:
            set_level({"method": method}, L_METHOD)
        except FitplanError as e:
            note_invalid(e, 0)
            outer_done += len(precisions) * len(optimizers)
            continue
        for precision_rank, precision in enumerate(precisions):
            set_level({"precision": precision}, L_PRECISION)
            for optim in optimizers:
                outer_done += 1
                if progress is not None:
                    progress(outer_done, outer_total)
                set_level({"optim": optim, "optimizer_spec": optim_specs[optim]}, L_OPTIM)
                for ckpt in ckpts:
                    set_level({"gradient_checkpointing": ckpt}, L_CKPT)
                    for (n, m) in worlds:
                        if (n * m) % tp:
                            continue  # tensor parallelism must divide the GPUs
                        dp = n * m // tp
                        hw = hardware[(n, m)]
                        batches = _batch_options(space, dp)
                        if not batches:
                            continue
                        set_level({"num_gpus": n, "num_nodes": m}, L_WORLD)
                        # per-(kernel, GPU) candidate counts: providers × markets
                        per_ag = {(a, g.id): sum(max(1, len(mk)) for _, mk in plist)
                                  for a in attns for g, plist in hw if _gpu_allows(g, precision, a)}
                        if not per_ag:
                            continue
                        for (z, oo, op) in _shard_options(space, dp, precision, fsdp):
                            set_level({"zero_stage": z, "offload_optimizer": oo, "offload_params": op}, L_SHARD)
                            simplicity = (METHOD_RANK.get(method, 9), optim_rank[optim], oo + 2 * op, z, precision_rank)
                            dead: set[tuple[str, str]] = set()
                            for b, k in batches:
                                if k > 1 and dead and len(dead) == len(per_ag):
                                    # every (kernel, GPU) already failed at a smaller micro-batch: prune the rest of k > 1
                                    stats.pruned_monotone += sum(per_ag.values())
                                    stats.candidates += sum(per_ag.values())
                                    continue
                                set_level({"per_device_train_batch_size": b, "gradient_accumulation_steps": k}, L_BATCH)
                                for a in attns:
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
                                        set_level({"attn_implementation": a}, L_ATTN)
                                    except FitplanError as e:
                                        cnt = sum(per_ag[(a, g.id)] for g, _ in live)
                                        stats.candidates += cnt
                                        note_invalid(e, cnt)
                                        continue
                                    stats.memory_evaluations += 1
                                    dt = vm["device_total_bytes"]
                                    snap = None
                                    for g, plist in live:
                                        cnt = per_ag[(a, g.id)]
                                        stats.candidates += cnt
                                        if dt > limit[g.id]:
                                            stats.too_big += cnt
                                            if k > 1:
                                                dead.add((a, g.id))
                                            continue
                                        if snap is None:
                                            snap = {nm: vm[nm] for nm in mem_names}
                                        values.mem = snap
                                        u = usable[g.id]
                                        cur["gpu"], cur["gpu_spec"] = g.id, g
                                        cur["usable_bytes"], cur["headroom_bytes"], cur["fits"] = u, u - dt, dt <= u
                                        tkey = (*[cur[nm] for nm in t_key_names], g.id)
                                        tc = tmemo.get(tkey)
                                        if tc is None:
                                            tc = tmemo[tkey] = _time_cost(T, vt, g, plist, stats)
                                        order = _candidates(collector, stats, policies, ns, values, objective, needs_price,
                                                            cur, plist, tc, dt, u, n * m, simplicity, order)
                                        cur["provider"] = flat["provider"]
    stats.seconds = time.perf_counter() - t0
    plans = [p for _, p in collector.best]
    for i, p in enumerate(plans, 1):
        p.rank = i
    pareto = [p for _, _, _, p in collector.front]
    rejected = [p for _, p in collector.rejected]
    if not needs_time and not missing_tc and flat["num_examples"] is None and flat["total_tokens"] is None:
        stats.notes.append("no dataset given: plans have no time or cost (add --num-examples and --tokens-per-example)")
    worlds_skipped = sorted({n * m for (n, m) in worlds if (n * m) % tp == 0 and not _batch_options(space, n * m // tp)})
    if worlds_skipped:
        stats.notes.append(f"effective batch {space.effective_batch_size} cannot be split over "
                           f"{', '.join(map(str, worlds_skipped))} GPUs: those GPU counts were not searched")
    return Result(objective, plans, pareto, rejected, stats, space, base, str(headroom), policies.describe())


def _time_cost(T: StagedGraph | None, vt: dict[str, Any], g, plist, stats: Stats) -> list[Any]:
    """Time and cost for GPU ``g`` and each provider of ``plist``: per provider ``(snapshot, seconds,
    on-demand cost, spot cost)``, or the user error its evaluation raised."""
    if T is None:
        return [({}, None, None, None) for _ in plist]
    vt["gpu"], vt["gpu_spec"] = g.id, g
    try:
        T.run(vt, L_GPU)
    except FitplanError as e:
        return [e for _ in plist]
    stats.time_evaluations += 1
    out: list[Any] = []
    for p, _ in plist:
        vt["provider"] = p
        try:
            T.run(vt, L_PROVIDER)
        except FitplanError as e:
            out.append(e)
            continue
        snap = {name: vt[name] for name in T.targets}
        out.append((snap, snap.get("train_seconds"), snap.get("on_demand_cost_usd"), snap.get("spot_cost_usd")))
    return out


_NO_MARKET = (None,)


def _candidates(collector: _Collector, stats: Stats, policies: PolicySet, ns: Namespace, values: _PlanValues,
                objective: str, needs_price: bool, cur: dict[str, Any], plist, tc, dt: int, usable: int, world: int,
                simplicity: tuple, order: int) -> int:
    """Consider every (provider, market) candidate of one fitting (configuration, GPU); returns the new order."""
    has_policies = bool(policies.compiled)
    need_seconds = objective == "time"
    headroom = usable - dt
    for (p, markets), entry in zip(plist, tc):
        if isinstance(entry, FitplanError):
            n = max(1, len(markets))
            stats.candidates += 0
            stats.invalid += n
            stats.invalid_reasons[entry.message] = stats.invalid_reasons.get(entry.message, 0) + n
            continue
        snapshot, seconds, od, spot = entry
        cur["provider"] = p
        values.tc = snapshot
        for market in markets or _NO_MARKET:
            order += 1
            cost = spot if market == "spot" else od
            if needs_price and cost is None or need_seconds and seconds is None:
                stats.unpriced += 1
                continue
            factor = 1.0
            if has_policies:
                ns.market = market
                rule = policies.first_forbidding(ns)
                if rule is not None:
                    stats.rejected += 1
                    stats.rejected_by[rule.id] = stats.rejected_by.get(rule.id, 0) + 1
                    key = _key(objective, 1.0, cost, seconds, world, simplicity, headroom, order)
                    if key[0] <= collector.worst_rejected:
                        plan = _plan(cur, market, dt, usable, seconds, cost, od, spot, world, key[0], order)
                        plan.rejected_by = [v for v in policies.check(ns)[0] if v.action == "forbid"]
                        collector.add_rejected(key, plan)
                    continue
                factor = policies.penalty_factor(ns)
            stats.allowed += 1
            c = _INF if cost is None else cost
            t = _INF if seconds is None else seconds
            score = (c if objective == "cost" else t if objective == "time" else world) * factor
            on_front = seconds is not None and cost is not None and not collector.dominated(seconds, cost)
            if score > collector.worst_score and not on_front:
                continue
            key = _key(objective, factor, cost, seconds, world, simplicity, headroom, order)
            plan = _plan(cur, market, dt, usable, seconds, cost, od, spot, world, key[0], order)
            if factor != 1.0:
                ns.market = market
                plan.penalties = [v for v in policies.check(ns)[0] if v.action == "penalise"]
            if score <= collector.worst_score:
                collector.add(key, plan)
            if on_front:
                collector.add_front(seconds, cost, key, plan)
    values.tc = {}
    return order


def _key(objective: str, factor: float, cost: float | None, seconds: float | None, world: int, simplicity: tuple,
         headroom: int, order: int) -> tuple:
    """The ranking key: the objective (× policy penalties), the other two objectives, then the simpler
    setup (``simplicity``: method full < LoRA < QLoRA, the scenario's optimizer < other AdamW < others, no offload,
    lower ZeRO stage, precision in the search order), then more headroom."""
    c = _INF if cost is None else cost
    s = _INF if seconds is None else seconds
    if objective == "cost":
        return (c * factor, s, world, simplicity, -headroom, order)
    if objective == "time":
        return (s * factor, c, world, simplicity, -headroom, order)
    return (world * factor, c, s, simplicity, -headroom, order)


PLAN_FIELDS = ("gpu", "provider", "num_gpus", "num_nodes", "method", "precision", "optim", "gradient_checkpointing",
               "attn_implementation", "zero_stage", "offload_optimizer", "offload_params", "per_device_train_batch_size",
               "gradient_accumulation_steps")


def _plan(cur, market, dt, usable, seconds, cost, od, spot, world, score, order) -> Plan:
    return Plan({f: cur[f] for f in PLAN_FIELDS}, market, dt, usable, seconds, cost, od, spot, world, score, order)


# --------------------------------------------------------------------------- after the search


def plan_scenario(base: sc.Scenario, plan: Plan) -> sc.Scenario:
    """The scenario ``fitplan estimate`` evaluates for ``plan``."""
    return base.replace(**plan.fields)


def attach_estimates(result: Result, ctx, *, check: bool = True) -> None:
    """Evaluate every plan a report shows through the ordinary estimate path (the numbers of ``fitplan
    estimate`` with the plan's flags) and check them against the search's values.

    :raises PluginError: the search and the estimate disagree (a bug, or an impure plugin quantity).
    """
    from fitplan.estimation import evaluate

    seen: dict[int, Any] = {}
    for plan in [*result.plans, *result.pareto, *result.rejected]:
        if id(plan) in seen:
            continue
        est = evaluate(plan_scenario(result.base, plan), ctx.registry, ctx.rulesets)
        plan.estimate = est
        seen[id(plan)] = est
        if check:
            v = est.values
            pairs = [("device_total_bytes", plan.device_total_bytes, v.get("device_total_bytes")),
                     ("usable_bytes", plan.usable_bytes, v.get("usable_bytes"))]
            if "train_seconds" in v:
                pairs += [("train_seconds", plan.train_seconds, v.get("train_seconds")),
                          ("on_demand_cost_usd", plan.on_demand_cost_usd, v.get("on_demand_cost_usd")),
                          ("spot_cost_usd", plan.spot_cost_usd, v.get("spot_cost_usd"))]
            for name, a, b in pairs:
                if a != b and not (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-12)):
                    raise PluginError(f"the search's {name} ({a!r}) differs from fitplan estimate's ({b!r}) for plan "
                                      f"{plan.label}", field=name,
                                      suggestion="a quantity is impure (depends on state outside its inputs)")


def scenario_args(s: sc.Scenario) -> list[str]:
    """Command-line flags that rebuild ``s`` (every field that differs from its default)."""
    default = sc.flatten(sc.Scenario())
    args: list[str] = []
    for name, value in sc.flatten(s).items():
        if value == default[name]:
            continue
        flag = "--zero" if name == "zero_stage" else "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, tuple):
            args += [flag, ",".join(value)]
        elif isinstance(value, float) and value.is_integer():
            args += [flag, str(int(value)) if name != "num_train_epochs" else repr(value)]
        else:
            args += [flag, str(value)]
    return args


def command_line(base: sc.Scenario, plan: Plan) -> str:
    import shlex

    return "fitplan estimate " + " ".join(shlex.quote(a) for a in scenario_args(plan_scenario(base, plan)))


def describe_market(plan: Plan) -> str:
    return {"spot": "spot", "on_demand": "on demand", None: "-"}[plan.market]


def rejection_text(plan: Plan) -> str:
    return "; ".join(f"{v.rule}: {v.reason}" for v in plan.rejected_by)


__all__ = ["OBJECTIVES", "Plan", "Result", "SearchSpace", "Stats", "attach_estimates", "command_line", "format_literal",
           "parse_headroom", "search"]
