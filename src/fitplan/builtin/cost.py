"""Cost: GPU-hours × price, on demand and spot, from the pricing rulesets.

``on_demand_cost_usd = runs × instances × price per hour × billed hours``, where billed hours are the
training time rounded up to the provider's billing unit (and minimum); spot time is first lengthened by
``spot_time_factor`` (the interruption model of :mod:`fitplan.builtin.spot_risk`, or the provider's flat ``spot_overhead``). The instance shape is chosen by :func:`fitplan.rulesets.pricing.choose_instance`
(cheapest whole instances covering the GPUs). Amounts are in the provider's ``currency`` (``cost_currency``):
the ``_usd`` names are historical, the currency is always stated.

Everything is None (not an error) without a training time, a GPU or ``--provider``. With the time model, the
cost's likely range is the cost of the likely training time's ends (``train_seconds_low`` / ``_high``).
"""

from __future__ import annotations

from fitplan.builtin import spot_risk
from fitplan.engine.declarations import quantity
from fitplan.pluginmgr.hookspecs import hookimpl
from fitplan.rulesets.pricing import billed_seconds, choose_instance


@quantity("GPU-h", json_key="cost.gpu_hours", label="GPU-hours")
def gpu_hours(train_seconds, world_size, runs):
    """GPU-hours used: GPUs × training hours × ``runs``. None without a training time."""
    if train_seconds is None:
        return None
    return world_size * train_seconds / 3600 * runs


@quantity("instances", role="instance", type="object")
def instance_choice(provider, instance, region, gpu_spec, num_gpus, num_nodes, rulesets):
    """What is rented: the provider's instance shape with this GPU whose ``ceil(GPUs / GPUs per instance)``
    whole instances cost least per hour (per node when ``num_nodes > 1``); ``--instance`` and ``--region``
    force a shape or region. None without ``--provider`` or ``--gpu``. A provider with no instance of the
    GPU is an error listing the GPUs it offers."""
    if provider is None or gpu_spec is None:
        return None
    return choose_instance(rulesets, provider, gpu_spec.id, num_gpus, num_nodes, instance, region)


@quantity("s", json_key="cost.billed_seconds_on_demand")
def billed_seconds_on_demand(train_seconds, instance_choice):
    """One run's training time rounded up to the provider's billing unit (second, minute, hour) and minimum."""
    if train_seconds is None or instance_choice is None:
        return None
    return billed_seconds(train_seconds, instance_choice.provider)


@quantity("s", json_key="cost.billed_seconds_spot")
def billed_seconds_spot(train_seconds, instance_choice, spot_time_factor):
    """One run's spot time, ``train_seconds × spot_time_factor`` (the interruption model where the provider states
    a rate, else ``1 + spot_overhead``: :mod:`fitplan.builtin.spot_risk`), rounded like on-demand time. None
    without a spot price."""
    if train_seconds is None or spot_time_factor is None:
        return None
    return billed_seconds(train_seconds * spot_time_factor, instance_choice.provider)


@quantity("USD", json_key="cost.on_demand_usd", short="cost", role="cost.on_demand", label="on-demand cost")
def on_demand_cost_usd(billed_seconds_on_demand, instance_choice, runs):
    """On-demand cost of ``runs`` runs: ``runs × instances × hourly price × billed hours`` (the seed:
    4 h × $4.00 = $16; 5 runs: $80). In ``cost_currency``."""
    if billed_seconds_on_demand is None:
        return None
    return runs * instance_choice.on_demand_per_hour * billed_seconds_on_demand / 3600


@quantity("USD", json_key="cost.spot_usd", short="spot_cost", role="cost.spot", label="spot cost")
def spot_cost_usd(billed_seconds_spot, instance_choice, runs):
    """Spot cost of ``runs`` runs: ``runs × instances × spot hourly price × billed spot hours`` (the seed:
    4 h × $1.20 = $4.80; 5 runs: $24). None where the instance has no spot price."""
    if billed_seconds_spot is None:
        return None
    return runs * instance_choice.spot_per_hour * billed_seconds_spot / 3600


def _priced(seconds, plan, runs, spot_factor: float | None = None):
    """``runs × price per hour × billed hours`` of one run lasting ``seconds`` (spot: lengthened by
    ``spot_factor``, the ``spot_time_factor``); None without a time, an instance or (spot) a spot price."""
    if seconds is None or plan is None:
        return None
    if spot_factor is not None:
        return runs * plan.spot_per_hour * billed_seconds(seconds * spot_factor, plan.provider) / 3600
    return runs * plan.on_demand_per_hour * billed_seconds(seconds, plan.provider) / 3600


@quantity("USD", json_key="cost.on_demand_usd_low", role="cost.on_demand.low", label="on-demand cost, likely low")
def on_demand_cost_usd_low(train_seconds_low, instance_choice, runs):
    """On-demand cost at the low end of the likely training time (``train_seconds_low``), billed the same way."""
    return _priced(train_seconds_low, instance_choice, runs)


@quantity("USD", json_key="cost.on_demand_usd_high", role="cost.on_demand.high", label="on-demand cost, likely high")
def on_demand_cost_usd_high(train_seconds_high, instance_choice, runs):
    """On-demand cost at the high end of the likely training time (``train_seconds_high``)."""
    return _priced(train_seconds_high, instance_choice, runs)


@quantity("USD", json_key="cost.spot_usd_low", role="cost.spot.low", label="spot cost, likely low")
def spot_cost_usd_low(train_seconds_low, instance_choice, runs, spot_time_factor):
    """Spot cost at the low end of the likely training time (× ``spot_time_factor``)."""
    return None if spot_time_factor is None else _priced(train_seconds_low, instance_choice, runs, spot_time_factor)


@quantity("USD", json_key="cost.spot_usd_high", role="cost.spot.high", label="spot cost, likely high")
def spot_cost_usd_high(train_seconds_high, instance_choice, runs, spot_time_factor):
    """Spot cost at the high end of the likely training time (× ``spot_time_factor``)."""
    return None if spot_time_factor is None else _priced(train_seconds_high, instance_choice, runs, spot_time_factor)


@quantity("currency", json_key="cost.currency", role="currency", type="text")
def cost_currency(instance_choice):
    """The currency of every amount: the provider's ``currency`` (USD for every bundled provider)."""
    return None if instance_choice is None else instance_choice.provider.currency


@hookimpl
def fitplan_register_quantities(register):
    for q in (gpu_hours, instance_choice, billed_seconds_on_demand, billed_seconds_spot, on_demand_cost_usd,
              spot_cost_usd, on_demand_cost_usd_low, on_demand_cost_usd_high, spot_cost_usd_low, spot_cost_usd_high,
              cost_currency, *spot_risk.QUANTITIES):
        register(q)
