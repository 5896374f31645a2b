"""Pricing: which instances to rent for N GPUs, and how a provider bills the time.

Instances come in fixed GPU counts (an AWS p5.48xlarge is 8 × H100): for N GPUs on one node fitplan
rents ``ceil(N / gpus)`` whole instances of one shape, and picks the shape (and region) whose total
on-demand price per hour is lowest (at one price, the fewest GPUs paid, then the fewest instances: eight
GPUs in one instance talk over NVLink, on eight one-GPU VMs over the network); with ``num_nodes > 1`` each node is rented separately
(``num_nodes × ceil(num_gpus / gpus)``). ``--instance`` forces a shape, ``--region`` a region.

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
    # at one price, the shape that holds the job: fewer instances talk less over the network
    return min(plans, key=lambda p: (p.on_demand_per_hour, p.gpus_paid, p.count, p.instance.id, p.instance.region))
