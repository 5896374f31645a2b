"""fitplan-optimizers-extra: Lion, GaLore AdamW, Adam-mini and Muon for fitplan.

The plugin is :mod:`fitplan_optimizers_extra.optimizers` (entry point ``fitplan-optimizers-extra`` in
the ``fitplan`` group). :mod:`fitplan_optimizers_extra.torch_impl` holds torch implementations for
``fitplan validate``; it is the only module that imports torch.
"""

__version__ = "0.1.0"
