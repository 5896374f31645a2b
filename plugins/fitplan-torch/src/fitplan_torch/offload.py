"""Activation offloading in the measured step, without streams (what runs on the CPU): ``trl_sync``.

The pack/unpack pair of TRL 1.16's ``OffloadActivations(use_streams=False)`` (``trl/models/activation_offloading.py``;
axolotl's ``activation_offloading: legacy``, which enters it around the HF Trainer's ``training_step``; torchtune's
``OffloadActivations`` @ 30b8519 packs the same way), as fitplan models it (``fitplan/trace/offload.py``):

* the hooks are active around the causal LM's forward, the model's own loss included (a forward pre-hook on the
  model enters them, a forward hook leaves them), and the LM head runs under ``NoOpManager`` (TRL's
  ``get_act_offloading_ctx_manager``: hooks that push a pair of identity hooks around ``lm_head``);
* pack: a saved tensor of at least 1,024 bytes (``element_size · nelement``) that is not a parameter's storage
  is copied to the host (``empty_like`` + ``copy_``) and autograd keeps the copy only; smaller ones and
  parameters stay as they are;
* unpack: the host copy comes back (a new device tensor).

On the CPU both copies live in the same memory: the host copy is made with the referee's dispatch mode switched off
(``torch.utils._python_dispatch._disable_current_modes``), so the live-storage counter (:mod:`.measure`) sees what
a GPU would hold, and the copy back is counted as the new allocation it is. Streams (the default) need a CUDA
device: fitplan's stream model is derived from the source (tests/test_offload.py).
"""

from __future__ import annotations

from typing import Any

from . import _deps
from .loss_heads import causal_parts

MIN_OFFLOAD_BYTES = 1024


class SyncOffload:
    """The hooks of the module doc, installed on ``model``'s decoder; ``host_bytes``: what the last forward packed."""

    def __init__(self, model: Any) -> None:
        torch = _deps.torch()
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.host_bytes = 0
        self.packs = 0
        self._hooks: Any = None
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        _, head = causal_parts(model)
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks
        self._noop: list[Any] = []
        self.handles = [base.register_forward_pre_hook(self._enter), base.register_forward_hook(self._exit, always_call=True),
                        head.register_forward_pre_hook(self._noop_enter),
                        head.register_forward_hook(self._noop_exit, always_call=True)]

    def _noop_enter(self, *args) -> None:
        hooks = self._saved_hooks(lambda t: (False, t), self._unpack)
        hooks.__enter__()
        self._noop.append(hooks)

    def _noop_exit(self, *args) -> None:
        if self._noop:
            self._noop.pop().__exit__(None, None, None)

    def _enter(self, *args) -> None:
        self.host_bytes = 0
        self.packs = 0
        self._hooks = self._saved_hooks(self._pack, self._unpack)
        self._hooks.__enter__()

    def _exit(self, *args) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None

    def _pack(self, t):
        from torch.utils._python_dispatch import _disable_current_modes

        n = t.element_size() * t.nelement()
        if n < MIN_OFFLOAD_BYTES or t.untyped_storage().data_ptr() in self.params:
            return (False, t)
        with _disable_current_modes():
            host = t.detach().clone()
        self.host_bytes += n
        self.packs += 1
        return (True, host)

    @staticmethod
    def _unpack(packed):
        moved, t = packed
        return t.clone() if moved else t
