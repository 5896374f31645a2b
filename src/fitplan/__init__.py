"""fitplan: will a fine-tuning run fit, how long will it take, what will it cost?

Python API::

    import fitplan
    est = fitplan.estimate(model="llama-2-7b", gpu="a100-80gb", precision="bf16-mixed",
                           per_device_train_batch_size=4, max_seq_length=2048, gradient_checkpointing=True)
    est["peak_bytes"], est.memory_bytes()

The core never imports torch or transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fitplan import codecache

codecache.install()  # before the first attrs class: its generated methods come compiled from the disk cache

from fitplan.engine.declarations import Name, Quantity, Reducer, quantity, reducer
from fitplan.errors import FitplanError, PluginError
from fitplan.inputs.optimizer import OptimizerContext, OptimizerSpec
from fitplan.pluginmgr.hookspecs import hookimpl
from fitplan.inputs import settings as _settings
from fitplan.inputs.scenario import Scenario

__version__ = "0.1.0"


def _install_plugin_settings() -> None:
    """The default registry's settings become scenario fields (``inputs/settings.py``): loaded the first time a
    scenario needs them, so that ``Scenario`` built without a registry knows every installed plugin's fields."""
    from fitplan.pluginmgr.registry import default_registry

    default_registry()


_settings.set_loader(_install_plugin_settings)

__all__ = [
    "Estimate", "FitplanError", "Name", "OptimizerContext", "OptimizerSpec", "PluginError", "Quantity", "Reducer", "Scenario",
    "estimate", "hookimpl", "quantity", "reducer", "scenario_from_dict",
]


def scenario_from_dict(data: dict[str, Any], *, file: str | None = None) -> Scenario:
    from fitplan.inputs.sources import scenario_from_dict as _s

    return _s(data, file=file)


def estimate(scenario: Scenario | dict[str, Any] | None = None, /, *, ruleset_dirs: Sequence[str | Path] = (),
             registry=None, **fields: Any):
    """Estimate memory (and, with a dataset and GPU, time and cost) for one scenario.

    :param scenario: a :class:`Scenario`, or a nested/flat mapping; ``fields`` (flat names such as
        ``per_device_train_batch_size``) override it.
    :param ruleset_dirs: extra ruleset directories (like ``--ruleset-dir``).
    :raises FitplanError: on bad input.
    """
    from fitplan.context import get_context
    from fitplan.inputs.sources import merge
    from fitplan.estimation import evaluate
    from fitplan.inputs.scenario import flatten

    if isinstance(scenario, Scenario):
        base: dict[str, Any] = flatten(scenario)
    else:
        base = dict(scenario or {})
    s = scenario_from_dict(merge(base, fields) if fields else base)
    ctx = get_context(ruleset_dirs, registry)
    return evaluate(s, ctx.registry, ctx.rulesets)


def __getattr__(name: str):
    if name == "Estimate":
        from fitplan.estimation import Estimate

        return Estimate
    raise AttributeError(name)
