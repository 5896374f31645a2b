"""Pricing: which instances to rent for N GPUs, and how a provider bills the time.

Instances come in fixed GPU counts (an AWS p5.48xlarge is 8 × H100): for N GPUs on one node fitplan
rents ``ceil(N / gpus)`` whole instances of one shape, and picks the shape (and region) whose total
on-demand price per hour is lowest (at one price, the fewest GPUs paid, then the fewest instances: eight
GPUs in one instance talk over NVLink, on eight one-GPU VMs over the network); with ``num_nodes > 1`` each node is rented separately
(``num_nodes × ceil(num_gpus / gpus)``). ``--instance`` forces a shape, ``--region`` a region. The
recommender does not stop at the price per hour: it prices the job on every shape of a distinct topology
(:func:`instance_shapes`) and keeps the cheapest in total, network time and billing included.

Billing: usage is rounded up to the provider's unit (``billing``: second, minute or hour) and to at
least ``minimum_seconds``; spot time is first lengthened by ``spot_overhead`` (interruptions, restarts).
"""

from __future__ import annotations

import math

import attrs

from fitplan.errors import FitplanError, unknown
from fitplan.rulesets.loader import Instance, Provider, Rulesets

BILLING_SECONDS = {"second": 1, "minute": 60, "hour": 3600}


@attrs.frozen
class InstancePlan:
    """What is rented: ``count`` × ``instance`` from ``provider``."""

    provider: Provider
    instance: Instance
    count: int
    origin: str = ""
    """The ruleset file the instance's price comes from."""

    @property
    def name(self) -> str:
        region = f", {self.instance.region}" if self.instance.region else ""
        origin = f"; ruleset {self.origin}" if self.origin else ""
        return f"{self.provider.id}/{self.instance.id} × {self.count}{region}{origin}"

    @property
    def gpus_paid(self) -> int:
        return self.count * self.instance.gpus

    @property
    def on_demand_per_hour(self) -> float:
        return self.count * self.instance.on_demand_per_hour

    @property
    def spot_per_hour(self) -> float | None:
        if self.instance.spot_per_hour is None:
            return None
        return self.count * self.instance.spot_per_hour


def billed_seconds(seconds: float, provider: Provider) -> float:
    """``seconds`` rounded up to the provider's billing unit, and to at least its minimum."""
    unit = BILLING_SECONDS[provider.billing]
    units = math.ceil(seconds / unit - 1e-9)  # 14,400.000000001 s is 4 hours, not 5
    return float(max(units * unit, provider.minimum_seconds))


def instances_for(rules: Rulesets, provider_id: str, gpu_id: str) -> list[Instance]:
    """The provider's instances with this GPU (computed once per rulesets)."""

    def index() -> dict[tuple[str, str], list[Instance]]:
        out: dict[tuple[str, str], list[Instance]] = {}
        for (prov, _, _), inst in rules.instances.items():
            out.setdefault((prov, inst.gpu), []).append(inst)
        return out

    return rules.memo("instances_by_provider_gpu", index).get((provider_id, gpu_id), [])


def choose_instance(rules: Rulesets, provider_id: str, gpu_id: str, num_gpus: int, num_nodes: int,
                    instance_id: str | None = None, region: str | None = None) -> InstancePlan:
    """The cheapest way to rent ``num_gpus`` × ``num_nodes`` GPUs of ``gpu_id`` from ``provider_id``.

    :raises FitplanError: unknown provider; the provider has no instance with this GPU (listing the GPUs
        it offers); an unknown ``instance_id`` or ``region``; an instance with another GPU.
    """
    key = ("instance", provider_id, gpu_id, num_gpus, num_nodes, instance_id, region)
    return rules.memo(key, lambda: _choose(rules, provider_id, gpu_id, num_gpus, num_nodes, instance_id, region))


def _choose(rules, provider_id, gpu_id, num_gpus, num_nodes, instance_id, region) -> InstancePlan:
    provider = rules.provider(provider_id)
    if instance_id is not None:
        same_id = [i for (p, iid, _), i in rules.instances.items() if p == provider_id and iid == instance_id]
        if not same_id:
            ids = sorted({iid for (p, iid, _) in rules.instances if p == provider_id})
            raise unknown(f"instance of provider {provider_id!r}", instance_id, ids, field="--instance")
        wrong = [i for i in same_id if i.gpu != gpu_id]
        if wrong and len(wrong) == len(same_id):
            raise FitplanError(f"instance {provider_id}/{instance_id} has {wrong[0].gpus} × {wrong[0].gpu}, not {gpu_id}",
                               field="--instance", value=instance_id,
                               suggestion=f"use --gpu {wrong[0].gpu}, or drop --instance to pick a {gpu_id} instance")
        candidates = [i for i in same_id if i.gpu == gpu_id]
    else:
        candidates = instances_for(rules, provider_id, gpu_id)
        if not candidates:
            offered = sorted({i.gpu for (p, _, _), i in rules.instances.items() if p == provider_id})
            raise FitplanError(
                f"provider {provider_id!r} has no instance with GPU {gpu_id!r}", field="--gpu", value=gpu_id,
                suggestion=("it offers: " + ", ".join(offered)) if offered else "it lists no instances")
    if region is not None:
        in_region = [i for i in candidates if i.region == region]
        if not in_region:
            regions = sorted({i.region for i in candidates})
            raise unknown(f"region for {gpu_id} at {provider_id}", region, regions, field="--region")
        candidates = in_region

    def plan(inst: Instance) -> InstancePlan:
        return InstancePlan(provider, inst, num_nodes * math.ceil(num_gpus / inst.gpus),
                            rules.origin.get(f"instance:{inst.provider}/{inst.id}/{inst.region}", ""))

    plans = [plan(i) for i in candidates]
    return min(plans, key=_per_hour)


def _per_hour(p: InstancePlan) -> tuple:
    """Cheapest per hour; at one price, the shape that holds the job (fewer GPUs paid, fewer instances: they talk
    less over the network), then by name."""
    return (p.on_demand_per_hour, p.gpus_paid, p.count, p.instance.id, p.instance.region)


def topology_key(inst: Instance) -> tuple:
    """What the time model reads of an instance: GPUs per instance, the link inside, the network between."""
    return (inst.gpus, inst.interconnect, inst.interconnect_gbps, inst.network_gbps)


def instance_shapes(rules: Rulesets, provider_id: str, gpu_id: str, num_gpus: int, num_nodes: int,
                    instance_id: str | None = None, region: str | None = None) -> list[tuple[str | None, InstancePlan]]:
    """The shapes worth pricing for a job on ``num_gpus`` × ``num_nodes`` GPUs: one per distinct topology
    (:func:`topology_key`), each the cheapest per hour of its kind, as ``(instance id to force, plan)``. The id
    is None for the one :func:`choose_instance` picks by itself (the cheapest per hour), so a plan on it needs
    no ``--instance``. Shapes with the same topology take the same time, so only the cheapest can cost least;
    shapes with different ones take different times (eight one-GPU VMs send the gradients over the network), so
    the search prices each and keeps the cheapest *job* (time × price, billed: :func:`billed_seconds`)."""
    default = choose_instance(rules, provider_id, gpu_id, num_gpus, num_nodes, instance_id, region)
    if instance_id is not None:
        return [(instance_id, default)]
    if num_gpus * num_nodes == 1:
        return [(None, default)]  # one GPU talks to no one: every shape takes the same time, the cheapest wins
    best: dict[tuple, InstancePlan] = {}
    for inst in instances_for(rules, provider_id, gpu_id):
        if region is not None and inst.region != region:
            continue
        plan = choose_instance(rules, provider_id, gpu_id, num_gpus, num_nodes, inst.id, region)
        key = topology_key(plan.instance)
        if key not in best or _per_hour(plan) < _per_hour(best[key]):
            best[key] = plan
    shapes = sorted(best.values(), key=lambda p: (p.gpus_paid, p.count, *_per_hour(p)))
    return [(None if p is default or p.instance == default.instance else p.instance.id, p) for p in shapes]


def gpu_offers(rules: Rulesets, gpu_id: str) -> list[tuple[Provider, float]]:
    """Every market provider renting ``gpu_id``, with its lowest on-demand price per GPU-hour (in the provider's
    currency), cheapest first within a currency. Reference tables (``Provider.reference``) are left out, as
    ``fitplan recommend`` leaves them out: they are priced only when named."""
    best: dict[str, float] = {}
    for (prov, _, _), inst in rules.instances.items():
        if inst.gpu == gpu_id and prov in rules.providers and not rules.providers[prov].reference:
            best[prov] = min(best.get(prov, math.inf), inst.on_demand_per_hour / inst.gpus)
    offers = [(rules.providers[p], price) for p, price in best.items()]
    return sorted(offers, key=lambda o: (o[0].currency, o[1], o[0].id))
