"""Basic counts derived from the scenario: parameters, GPUs, tokens per micro-batch."""

from __future__ import annotations

from fitplan.engine.declarations import quantity
from fitplan.pluginmgr.hookspecs import hookimpl


@quantity("params", role="params")
def param_count(arch):
    """Total parameters of the model (exact, from the parameter tensors of its HF config)."""
    return arch.param_count


@quantity("GPUs")
def world_size(num_gpus, num_nodes):
    """GPUs taking part: ``num_gpus`` per node × ``num_nodes``."""
    return num_gpus * num_nodes


@quantity("tokens")
def micro_batch_tokens(per_device_train_batch_size, max_seq_length):
    """Tokens in one micro-batch on one GPU: b × s."""
    return per_device_train_batch_size * max_seq_length


@hookimpl
def fitplan_register_quantities(register):
    for q in (param_count, world_size, micro_batch_tokens):
        register(q)
