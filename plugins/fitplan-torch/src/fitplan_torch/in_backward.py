"""torchtune's ``optimizer_in_bwd`` in the measured step: one optimizer per trainable parameter, stepped in the
parameter's post-accumulate-grad hook, which then frees the gradient.

As torchtune @ 30b8519 runs it (recipes/full_finetune_single_device.py ``_setup_optimizer``: ``optim_dict = {p:
config.instantiate(cfg_optimizer, [p]) for p in self._model.parameters()}``; torchtune/training/memory.py
``register_optim_in_bwd_hooks``: ``optim_dict[param].step(); optim_dict[param].zero_grad()`` in a
``register_post_accumulate_grad_hook``). The recipe's own ``optimizer.step()`` and ``zero_grad()`` do nothing
(``OptimizerInBackwardWrapper`` only checkpoints the states); :class:`InBackwardOptimizer` keeps that shape so
:func:`.step.train_step` runs it unchanged. Hooks run on the CPU (torch's autograd engine calls them), so the
referee measures it there.
"""

from __future__ import annotations

from typing import Any, Callable


class InBackwardOptimizer:
    """One optimizer per parameter, stepped in its gradient's hook (module doc); ``state`` merges theirs."""

    def __init__(self, named_params: list[tuple[str, Any]], build: Callable[[list[tuple[str, Any]]], Any]) -> None:
        self.optims = {id(p): build([(n, p)]) for n, p in named_params}
        self.handles = [p.register_post_accumulate_grad_hook(self._step) for _, p in named_params]

    def _step(self, param) -> None:
        optim = self.optims[id(param)]
        optim.step()
        optim.zero_grad(set_to_none=True)

    @property
    def state(self) -> dict[Any, Any]:
        merged: dict[Any, Any] = {}
        for optim in self.optims.values():
            merged.update(optim.state)
        return merged

    def step(self) -> None:
        """Every parameter stepped in the backward already."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every gradient was freed in its hook."""
