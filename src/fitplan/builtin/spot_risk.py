"""Spot risk: the interruption model that prices a spot run, where the provider states an interruption rate.

Where the provider's pricing ruleset states ``spot_interruptions_per_hour`` (λ, with a public dated source) and
the instance states ``checkpoint_gbps`` (the GB/s at which it writes a checkpoint to its disk or network storage),
a spot run checkpoints at the interval that minimises its expected time and cost, and loses work at each
interruption; otherwise spot time is lengthened by the provider's flat ``spot_overhead`` (an assumption) and the
report says spot is unpriced for risk. With C the checkpoint time, M = 3600/λ the mean time between interruptions:

* checkpoint interval τ = √(2 C M): Young's first-order optimum (J. W. Young, "A first order approximation to the
  optimum checkpoint interval", CACM 17(9), 1974; J. T. Daly, FGCS 22(3), 2006, eq. 3, first order);
* lost time per interruption L = (τ + C)/2 + C: on average half an interval of work and its checkpoint (Daly's
  first-order loss), plus reading the checkpoint back at the same bandwidth on restart;
* expected wall time T_spot = T (1 + C/τ) / (1 − L/M): the work and its checkpoints, stretched by the interruptions
  expected over the whole run (T_spot / M of them, each losing L). None when L ≥ M (the run would not finish).

All are None (not an error) without a spot price, a rate or a checkpoint bandwidth. They are registered by the
cost plugin (:mod:`fitplan.builtin.cost`), whose spot price needs them: blocking it removes both.
"""

from __future__ import annotations

import math

from fitplan.engine.declarations import quantity


def _modelled(instance_choice) -> bool:
    """Whether the interruption model applies: a spot price, the provider's rate and the instance's bandwidth."""
    return (instance_choice is not None and instance_choice.spot_per_hour is not None
            and bool(instance_choice.provider.spot_interruptions_per_hour)
            and instance_choice.instance.checkpoint_gbps is not None)


@quantity("bytes", json_key="cost.spot_risk.checkpoint_bytes")
def checkpoint_bytes(instance_choice, trainable_param_count, trainable_dtype_bytes, master_weight_dtype_bytes,
                     optimizer_spec, optimizer_context):
    """What a resumable checkpoint holds, over all GPUs (unsharded): the trainable weights in their dtype, their
    fp32 master copy when the stack keeps one, and the optimizer states (the HF Trainer saves the model and the
    optimizer: transformers/trainer.py ``_save_checkpoint``; frozen base weights are reloaded, not saved).
    None where the interruption model does not apply (it is computed only where it is used)."""
    if not _modelled(instance_choice):
        return None
    return resumable_checkpoint_bytes(trainable_param_count, trainable_dtype_bytes, master_weight_dtype_bytes,
                                      optimizer_spec, optimizer_context)


def resumable_checkpoint_bytes(trainable_param_count, trainable_dtype_bytes, master_weight_dtype_bytes,
                               optimizer_spec, optimizer_context) -> int:
    """Bytes of a resumable checkpoint (what :func:`checkpoint_bytes` counts), computed whatever the market: the
    ``checkpoint_bytes_resumable`` name, which sizes the disk of an emitted SkyPilot task."""
    states = sum(int(optimizer_spec.state_bytes(part)) for part in optimizer_context.dtype_parts())
    return int(trainable_param_count * (trainable_dtype_bytes + master_weight_dtype_bytes)) + states


@quantity("s", json_key="cost.spot_risk.checkpoint_seconds")
def checkpoint_seconds(checkpoint_bytes, instance_choice):
    """C = checkpoint bytes / the instance's ``checkpoint_gbps`` (GB/s, 10^9 bytes). None where not modelled."""
    if checkpoint_bytes is None:
        return None
    return checkpoint_bytes / (instance_choice.instance.checkpoint_gbps * 1e9)


@quantity("s", json_key="cost.spot_risk.mean_seconds_between_interruptions")
def spot_mtbi_seconds(instance_choice):
    """M = 3600 / λ, λ the provider's ``spot_interruptions_per_hour``. None without a spot price or a rate."""
    if instance_choice is None or instance_choice.spot_per_hour is None:
        return None
    rate = instance_choice.provider.spot_interruptions_per_hour
    return None if not rate else 3600 / rate


@quantity("s", json_key="cost.spot_risk.checkpoint_interval_seconds")
def spot_checkpoint_interval_seconds(checkpoint_seconds, spot_mtbi_seconds):
    """τ = √(2 C M) (Young 1974): the checkpoint interval that minimises expected time, hence cost."""
    if checkpoint_seconds is None or spot_mtbi_seconds is None:
        return None
    return math.sqrt(2 * checkpoint_seconds * spot_mtbi_seconds)


@quantity("s", json_key="cost.spot_risk.lost_seconds_per_interruption")
def spot_lost_seconds_per_interruption(checkpoint_seconds, spot_checkpoint_interval_seconds):
    """L = (τ + C)/2 + C: half an interval of work and its checkpoint, plus the reload on restart."""
    if spot_checkpoint_interval_seconds is None:
        return None
    return (spot_checkpoint_interval_seconds + checkpoint_seconds) / 2 + checkpoint_seconds


@quantity("ratio", json_key="cost.spot_risk.time_factor")
def spot_time_factor(instance_choice, checkpoint_seconds, spot_checkpoint_interval_seconds, spot_mtbi_seconds,
                     spot_lost_seconds_per_interruption):
    """Spot wall time / on-demand training time: (1 + C/τ) / (1 − L/M) with the interruption model, else
    1 + the provider's flat ``spot_overhead``. None without a spot price, or when L ≥ M."""
    if instance_choice is None or instance_choice.spot_per_hour is None:
        return None
    if spot_lost_seconds_per_interruption is None:
        return 1 + instance_choice.provider.spot_overhead
    if spot_lost_seconds_per_interruption >= spot_mtbi_seconds:
        return None
    return (1 + checkpoint_seconds / spot_checkpoint_interval_seconds) / (
        1 - spot_lost_seconds_per_interruption / spot_mtbi_seconds)


QUANTITIES = (checkpoint_bytes, checkpoint_seconds, spot_mtbi_seconds, spot_checkpoint_interval_seconds,
              spot_lost_seconds_per_interruption, spot_time_factor)
