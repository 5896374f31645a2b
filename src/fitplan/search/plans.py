"""What a search produces: plans, their ranking, the Pareto front of cost and time, and the statistics.

A *plan* is the user's scenario with the fields the search chose, its market and its key numbers. The
collector keeps the top-N allowed plans by ranking key, the front of plans no other beats on both time and
cost, and the best plans a policy rejected.
"""

from __future__ import annotations

import bisect
from typing import Any

import attrs

from fitplan.inputs import scenario as sc
from fitplan.inputs import settings
from fitplan.search.space import SearchSpace

_INF = float("inf")
METHOD_RANK = {"full": 0, "lora": 1, "qlora": 2}


@attrs.define
class Stats:
    """What the search did. Every candidate plan is counted once, in exactly one of the leaf counts."""

    candidates: int = 0
    too_big: int = 0
    """Evaluated, and does not fit with the required headroom (GPU memory), or its instance has less host RAM
    than its CPU offload needs (``too_big_host_ram`` of them)."""
    pruned_monotone: int = 0
    """Not evaluated: a smaller micro-batch (same accumulation flag) already did not fit."""
    unpriced: int = 0
    """Fits, but has no price (no dataset, no provider, no spot price) while the objective needs one."""
    rejected: int = 0
    """Fits, and a forbid policy rejects it."""
    allowed: int = 0
    invalid: int = 0
    """Candidates whose evaluation raised a user error (a throughput table without this GPU, ...)."""
    too_big_host_ram: int = 0
    """Of ``too_big``: fits the GPU, but its instance's stated host RAM is less than its CPU offload needs."""
    host_ram_unstated: int = 0
    """Candidates not proposed because their CPU offload cannot be checked: the instance states no host RAM."""
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
            "candidates": self.candidates, "too_big": self.too_big, "too_big_host_ram": self.too_big_host_ram,
            "host_ram_unstated": self.host_ram_unstated, "pruned_monotone": self.pruned_monotone,
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
    penalties: list[Any] = attrs.Factory(list)
    """Policy verdicts (:class:`fitplan.rules.policy.Verdict`) of the penalise rules that fired."""
    rejected_by: list[Any] = attrs.Factory(list)
    notes: list[str] = attrs.Factory(list)
    """What the search could not check about the plan (an instance that states no host RAM)."""
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
        if f["zero_stage"] or (f["num_gpus"] * f["num_nodes"] > 1 and str(f["precision"]).endswith("-master")):
            parts.append(("torch " if f.get("stack") == "torch" else "DeepSpeed ") + f"ZeRO-{f['zero_stage']}")
        offloads = (["offload optimizer"] if f["offload_optimizer"] else []) + settings.plan_labels(f)
        parts += _joined(offloads)
        if f["attn_implementation"] != "sdpa":
            parts.append(f["attn_implementation"])
        if f.get("provider"):
            where = f"{f['provider']}/{f['instance']}" if f.get("instance") else f"{f['provider']}"
            parts.append(where + (" spot" if self.market == "spot" else ""))
        return " · ".join(parts)


def _joined(labels: list[str]) -> list[str]:
    """Labels that begin with the same word joined: ``offload optimizer``, ``offload params`` ->
    ``offload optimizer+params``."""
    out: list[str] = []
    for label in labels:
        head, _, rest = label.partition(" ")
        if out and rest and out[-1].partition(" ")[0] == head:
            out[-1] += "+" + rest
        else:
            out.append(label)
    return out


@attrs.define
class Side:
    """The plans of one value of the opened dimensions (``values``: ``{"method": "lora"}``), ranked among
    themselves only: a side's plans train another model than the next side's."""

    values: dict[str, str]
    plans: list[Plan]
    pareto: list[Plan]
    rejected: list[Plan]
    why: Any = None
    """Why plan 1 (:class:`fitplan.search.why.Why`), None without plans."""

    @property
    def title(self) -> str:
        return " · ".join(f"{k} {v}" for k, v in self.values.items())


@attrs.define
class Result:
    """The ranked allowed plans, the cost-versus-time Pareto front, the best rejected plans, and the stats.

    With opened dimensions (``vary``: ``fitplan recommend --vary``) the plans are in ``sides`` (one per value,
    each ranked on its own) and ``plans``, ``pareto`` and ``rejected`` are empty: no ranking mixes them.
    """

    objective: str
    plans: list[Plan]
    pareto: list[Plan]
    rejected: list[Plan]
    stats: Stats
    space: SearchSpace
    base: sc.Scenario
    headroom: str
    policies: list[dict[str, Any]] = attrs.Factory(list)
    model: dict[str, Any] | None = None
    """The model searched: its name and parameter count (None for a bare count with no name)."""
    vary: tuple[str, ...] = ()
    sides: list[Side] = attrs.Factory(list)
    side: Side | None = None
    """Set on a view of one side (:meth:`side_view`): the search's counts are the whole search's."""
    why: Any = None
    """Why plan 1 (:class:`fitplan.search.why.Why`): None without plans, or with ``vary`` (each side has its own)."""

    def all_plans(self) -> list[Plan]:
        """Every plan a report shows (each once): the ranked, the front, the rejected, of every side."""
        out: dict[int, Plan] = {}
        for group in [self, *self.sides]:
            for p in [*group.plans, *group.pareto, *group.rejected]:
                out.setdefault(id(p), p)
        return list(out.values())

    def side_view(self, side: Side) -> Result:
        """One side as a result of its own (its plans, front and rejected; the same search), for the renderers."""
        return attrs.evolve(self, plans=side.plans, pareto=side.pareto, rejected=side.rejected, vary=(), sides=[],
                            side=side, why=side.why)

    def views(self) -> list[tuple[str, Result]]:
        """What a report shows section by section: ``[("", self)]``, or one ``(side title, view)`` per side."""
        return [(s.title, self.side_view(s)) for s in self.sides] if self.vary else [("", self)]


class Collector:
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
        self.best_by: dict[tuple[str, Any], tuple[tuple, Plan]] = {}
        """The best allowed plan (by ranking key) per ``("gpu", id)``, ``("gpus", world size)`` and
        ``("provider", id)``: the runner-ups of :mod:`fitplan.search.why`, kept while searching."""
        self.misses: dict[tuple[str, int], int] = {}
        """Per (GPU id, world size): the smallest excess (bytes) of an evaluated candidate's device total over the
        GPU's limit with the headroom, among those that did not fit."""

    def miss(self, gpu: str, world: int, excess: int) -> None:
        """Note a candidate that missed ``gpu``'s limit by ``excess`` bytes on ``world`` GPUs."""
        k = (gpu, world)
        if excess < self.misses.get(k, excess + 1):
            self.misses[k] = excess

    def beats_a_dimension(self, score: float, dims: tuple) -> bool:
        """Whether a candidate of ``score`` may be the best of one of its ``dims`` (cheap: no key built)."""
        by = self.best_by
        for d in dims:
            b = by.get(d)
            if b is None or score <= b[0][0]:
                return True
        return False

    def add_dimensions(self, key: tuple, plan: Plan, dims: tuple) -> None:
        """Keep ``plan`` as the best of each of ``dims`` it beats."""
        by = self.best_by
        for d in dims:
            b = by.get(d)
            if b is None or key < b[0]:
                by[d] = (key, plan)

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


def ranking_key(objective: str, factor: float, cost: float | None, seconds: float | None, world: int, simplicity: tuple,
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
               "attn_implementation", "zero_stage", "offload_optimizer", "per_device_train_batch_size",
               "gradient_accumulation_steps")
"""The fields a plan sets, besides the plugin settings the search loops over (:func:`plan_fields`)."""


def plan_fields() -> tuple[str, ...]:
    """:data:`PLAN_FIELDS` with the searched plugin settings (parameter offload, declared by
    ``builtin/sharding/offload.py``) after the shard level's own fields (``offload_optimizer``), in declaration
    order."""
    mine = tuple(s.name for s in settings.searched("shard"))
    at = PLAN_FIELDS.index("offload_optimizer") + 1
    return PLAN_FIELDS[:at] + mine + PLAN_FIELDS[at:]



def make_plan(cur, market, dt, usable, seconds, cost, od, spot, world, score, order) -> Plan:
    """The candidate as a plan. ``instance`` is a field only when the search chose a shape other than the one the
    estimate picks by itself (or the user forced one): :func:`fitplan.rulesets.pricing.instance_shapes`."""
    fields = {f: cur[f] for f in plan_fields()}
    if cur.get("instance") is not None:
        fields["instance"] = cur["instance"]
    return Plan(fields, market, dt, usable, seconds, cost, od, spot, world, score, order)


def plan_scenario(base: sc.Scenario, plan: Plan) -> sc.Scenario:
    """The scenario ``fitplan estimate`` evaluates for ``plan``."""
    return base.replace(**plan.fields)


