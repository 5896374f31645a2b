"""The names a quantity may depend on besides other quantities: scenario fields and resolved inputs.

The resolved inputs are objects :func:`fitplan.estimation.build_inputs` looks up from the scenario: the
architecture, the GPU, the optimizer, the framework overheads, the rulesets in force and the dataset's summary.
"""

from __future__ import annotations

from fitplan.inputs.scenario import CHOICES, FIELD_SECTION, FIELD_TYPES

RESOLVED_INPUTS: dict[str, str] = {
    "arch": "the model's architecture (fitplan.arch.architecture.ModelSpec) from the catalog, a config.json or --params",
    "gpu_spec": "the GPU from the hardware ruleset (fitplan.rulesets.schema.GPU), or None without --gpu",
    "optimizer_spec": "the optimizer named by --optim (fitplan.inputs.optimizer.OptimizerSpec)",
    "framework": "framework overheads from the rulesets (fitplan.rulesets.schema.Framework)",
    "rulesets": "every ruleset entry in force (fitplan.rulesets.loader.Rulesets)",
    "dataset_summary": "the token lengths of --dataset (fitplan.data.summary.DatasetSummary), or None without one",
}


def input_names() -> dict[str, str]:
    """Every input name -> its documentation."""
    out = {name: f"scenario field {section}.{name}" for name, section in FIELD_SECTION.items()}
    out.update(RESOLVED_INPUTS)
    return out


def input_types() -> dict[str, str]:
    """Every scenario field -> its type for rule conditions (``number``, ``text``, ``bool``, ``any``); the
    resolved inputs are objects (``any``: conditions do not compare them)."""
    return dict(FIELD_TYPES)


def input_choices() -> dict[str, tuple]:
    """Scenario fields with a fixed set of values -> those values (a condition comparing one with another
    value can never match)."""
    return dict(CHOICES)
