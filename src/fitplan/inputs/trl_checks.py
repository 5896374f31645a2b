"""What TRL's offline preference trainers refuse in their configuration, with TRL's own message (TRL 1.16): checked
with the scenario (``estimation.check_scenario``), before any graph is built. The online trainers' (GRPO, RLOO)
settings are :mod:`fitplan.inputs.trl_online`'s."""

from __future__ import annotations

from fitplan.errors import FitplanError

CPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo", "alphapo")
"""``CPOConfig.loss_type``'s choices (trl/experimental/cpo/cpo_config.py)."""


def check_cpo(loss_type: str | None) -> None:
    """What ``CPOTrainer`` refuses, with its message: ``kto_pair`` (``__init__``) and a loss type it does not
    know (``cpo_loss`` raises at the first step)."""
    if loss_type is None or loss_type in CPO_LOSS_TYPES:
        return
    if loss_type == "kto_pair":
        raise FitplanError("Support for kto_pair has been removed in CPOTrainer. Please use KTOTrainer.",
                           field="loss_type", value=loss_type, suggestion="--trainer kto")
    raise FitplanError(f"Unknown loss type: {loss_type}. Should be one of ['sigmoid', 'hinge', 'ipo', 'simpo']",
                       field="loss_type", value=loss_type, suggestion="one of " + ", ".join(CPO_LOSS_TYPES))
