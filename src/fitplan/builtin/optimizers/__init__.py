"""Built-in optimizers: every ``TrainingArguments.optim`` name of transformers 5.24 (``OptimizerNames``, 41
values), as the HF Trainer builds it, modelled from the implementing library's source and measured by the
referee on this CPU wherever it runs here, or refused with the reason (``OptimizerSpec.refused``, or a
run-dependent ``check``); plus fitplan's own ``adamw_torch_single`` and ``sgd_momentum``.

* ``torch_family``: torch.optim AdamW (foreach, fused), SGD, Adagrad, RMSprop; transformers' Adafactor; the
  XLA / NPU / torchdistx AdamW names (refused);
* ``bnb``: bitsandbytes 0.50.2 AdamW, AdEMAMix, Lion, RMSprop, 8-bit and 32-bit, paged;
* ``torchao_family``: torchao AdamW 8-bit / 4-bit;
* ``lowrank``: GaLore and APOLLO, layer-wise variants;
* ``others``: LOMO, AdaLomo, GrokAdamW, schedule-free, StableAdamW.

Element counts come from the trainable tensors, so per-tensor effects (AdamW's ``step`` scalar, Adafactor's
factored statistics, bitsandbytes' small-tensor and embedding fallbacks) are exact. The measurements and the
refusals are listed in docs/memory-model.md (Optimizers).
"""

from __future__ import annotations

from fitplan.builtin.optimizers import bnb, lowrank, others, torch_family, torchao_family
from fitplan.builtin.optimizers._common import BNB_BLOCK, BNB_MIN_8BIT_SIZE
from fitplan.builtin.optimizers.torch_family import (_adafactor_states, _adafactor_temp, _adamw_fused_states,
                                                     _adamw_states, _foreach_temp, _single_tensor_temp)
from fitplan.pluginmgr.hookspecs import hookimpl

BUILTIN = (*torch_family.SPECS, *bnb.SPECS, *torchao_family.SPECS, *lowrank.SPECS, *others.SPECS)

__all__ = ["BNB_BLOCK", "BNB_MIN_8BIT_SIZE", "BUILTIN", "_adafactor_states", "_adafactor_temp", "_adamw_fused_states",
           "_adamw_states", "_foreach_temp", "_single_tensor_temp"]


@hookimpl
def fitplan_register_optimizers(register):
    for spec in BUILTIN:
        register(spec)
