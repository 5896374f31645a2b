"""The seed chapter's assumptions (``--assumptions seed``), as reducers that replace the realistic rules.

The chapter (docs/sources.md, "The seed chapter") simplifies: AdamW states are "paramètres × 4 × 2"
whatever the precision; activations are its ``estimate_memory`` line ``batch_size × seq_len × 4096 × 4``
(hidden size fixed at 4096); the total is a plain sum; gradient checkpointing "reduces by ~30 %" the whole
total (its table's last column); there is no framework overhead, no logits term and no master copy.
"""

from __future__ import annotations

from fitplan.engine.declarations import reducer
from fitplan.pluginmgr.hookspecs import hookimpl

SEED_HIDDEN = 4096
SEED_ACTIVATION_BYTES = 4
SEED_CHECKPOINT_FACTOR = 0.7

_seed = lambda assumptions: assumptions == "seed"  # noqa: E731


@reducer("optimizer_state_bytes", when=_seed, name="seed", before=("tensor_parallel", "zero", "offload"))
def seed_optimizer_states(value, optimizer_spec, trainable_param_count):
    """Seed: ``parameters × 4 × states`` (AdamW: × 2), fp32 whatever the precision."""
    return int(trainable_param_count * 4 * optimizer_spec.states_per_param)


@reducer("activation_bytes", when=_seed, name="seed", after=("gradient_checkpointing", "tensor_parallel_activations"))
def seed_activations(value, per_device_train_batch_size, max_seq_length):
    """Seed's ``estimate_memory``: ``batch_size × seq_len × 4096 × 4`` bytes."""
    return per_device_train_batch_size * max_seq_length * SEED_HIDDEN * SEED_ACTIVATION_BYTES


@reducer("peak_bytes", when=_seed, name="seed")
def seed_peak(value, weight_bytes, gradient_bytes, optimizer_state_bytes, activation_bytes, gradient_checkpointing):
    """Seed: the plain sum weights + gradients + optimizer + activations; × 0.7 with checkpointing ("~30 %")."""
    total = weight_bytes + gradient_bytes + optimizer_state_bytes + activation_bytes
    return int(total * SEED_CHECKPOINT_FACTOR) if gradient_checkpointing else total


@reducer("framework_overhead_bytes", when=_seed, name="seed")
def seed_overhead(value):
    """Seed: no framework overhead."""
    return 0


@reducer("logits_bytes", when=_seed, name="seed")
def seed_logits(value):
    """Seed: logits are not counted."""
    return 0


@reducer("autocast_weight_copy_bytes", when=_seed, name="seed")
def seed_autocast(value):
    """Seed: autocast's weight copies are not counted."""
    return 0


@hookimpl
def fitplan_register_reducers(register):
    for r in (seed_optimizer_states, seed_activations, seed_peak, seed_overhead, seed_logits, seed_autocast):
        register(r)
