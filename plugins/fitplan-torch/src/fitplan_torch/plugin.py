"""The ``fitplan_validate`` hook implementation (entry point ``torch`` in the ``fitplan`` group).

This module is imported whenever fitplan builds its plugin registry, so it must stay cheap: no torch here.
"""

from __future__ import annotations

from typing import Any

from fitplan.api import hookimpl


@hookimpl
def fitplan_validate(scenario, estimate, options: dict[str, Any]) -> dict[str, Any]:
    """Run the scenario in PyTorch and compare each memory component with fitplan's prediction.

    ``options``: ``mode`` (``auto``: cuda if a GPU is visible, else cpu when the run fits in RAM, else
    fake; ``cpu``; ``fake``; ``cuda``), ``steps`` (measured steps after a warm-up step),
    ``calibrate_out`` (CUDA only: write a ``[framework]`` ruleset), ``world_size`` (ranks for sharded
    scenarios; default the scenario's GPU count), ``seed``.
    """
    from .runner import run_validation

    return run_validation(scenario, estimate, options)


@hookimpl
def fitplan_register_commands(cli) -> None:
    """``fitplan learn-architecture CONFIG``: learn a model type from its transformers code (docs/architectures.md)."""
    from .learn.command import register

    register(cli)
