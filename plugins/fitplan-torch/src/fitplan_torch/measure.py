"""Measuring instruments: exact bytes of tensors, a live-storage counter, a saved-tensor meter.

* :func:`storage_bytes` sums ``nbytes`` over the *unique* untyped storages of some tensors (tied
  weights, views and shared buffers count once). For DTensors (FSDP2) it counts the local shard.
* :class:`LiveBytes` is a ``TorchDispatchMode`` that sees every tensor an operator returns, keeps a
  weak reference to its untyped storage and subtracts the storage's bytes when it is freed: the live
  tensor bytes at every operator, their peak and the phase of the step the peak fell in. Tensors that
  exist before it starts (parameters, buffers, optimizer states, inputs) are registered with
  :meth:`LiveBytes.track`. On CUDA this is what ``torch.cuda.max_memory_allocated`` sees minus the
  caching allocator's 512-byte rounding; on the CPU and under FakeTensorMode it is the only measure. Being a
  dispatch mode, it would itself change some backward formulas (an out-of-place fill of a zeros tensor where a
  step without it fills in place); it runs the in-place op there instead (:mod:`.plain_backward`).
* :class:`SavedTensors` is a ``saved_tensors_hooks`` pair that records every tensor autograd saves for
  backward, deduplicated by storage, parameter storages excluded. It keeps what it packs detached, as torch asks
  of a pack hook (torch/autograd/graph.py ``saved_tensors_hooks``, torch 2.13: "the return value of pack_hook
  cannot hold a reference to the input tensor"): an op that saves its own output (``tanh``) would otherwise hold
  that output, and through its ``grad_fn`` itself, in a cycle the garbage collector cannot see, so a branch the
  loss never reads (BigBird's pooler: ``tanh(pooler(sequence_output[:, 0]))``, which ``BigBirdForCausalLM``
  drops) stayed alive for good where a step without the meter frees it as the forward returns.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

from . import _deps, plain_backward


def local_tensor(t):
    """The local tensor of a DTensor (FSDP2 shards), else ``t``."""
    inner = getattr(t, "_local_tensor", None)
    return inner if inner is not None else t


def storages(tensors: Iterable[Any]) -> dict[int, Any]:
    """Unique untyped storages of ``tensors`` (None entries and non-tensors skipped), keyed by identity."""
    torch = _deps.torch()
    out: dict[int, Any] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        t = local_tensor(t)
        st = t.untyped_storage()
        out.setdefault(id(st), st)
    return out


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the unique storages behind ``tensors``."""
    return sum(st.nbytes() for st in storages(tensors).values())


def optimizer_state_tensors(optimizer) -> list[Any]:
    """Every tensor in ``optimizer.state`` (exp_avg, exp_avg_sq, step, momentum buffers, factored stats)."""
    torch = _deps.torch()
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer wraps the local optimizer
    opt = inner if inner is not None and hasattr(inner, "state") else optimizer
    out = []
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out


def _mode_base():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class _LiveBytesImpl:
    """Mixin body of :class:`LiveBytes` (the base class is torch's, created lazily)."""

    def _init(self, snapshot: bool = False) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self.snapshot = snapshot
        self.peak_snapshot: list[tuple[int, str, str]] = []
        """With ``snapshot=True``: (bytes, creating operator, phase it was created in) of every storage live at the peak."""
        self._origin = WeakIdKeyDictionary() if snapshot else None

        self._live = WeakIdKeyDictionary()  # storage -> [bytes, weakref with a free callback]
        self.current = 0
        self.peak = 0
        self.phase = "setup"
        self.peak_phase = "setup"
        self.phase_peaks: dict[str, int] = {}
        self.category: dict[str, int] = {}
        self._orig_resize = None
        self.skip_meta = False
        """Ignore ``meta`` storages (a size, no memory); off under FakeTensorMode, whose tensors are all meta."""
        self._fresh = None
        """A weak reference to the last zeros tensor an op made (:mod:`.plain_backward`)."""

    def _freed(self, entry, _ref) -> None:
        self.current -= entry[0]

    def _add_storage(self, st) -> None:
        if self.skip_meta and st.device.type == "meta":
            return
        entry = self._live.get(st)
        if entry is not None:
            n = st.nbytes()
            if n != entry[0]:  # resized in place
                self.current += n - entry[0]
                entry[0] = n
            return
        entry = [st.nbytes(), None]
        entry[1] = weakref.ref(st, lambda ref, e=entry: self._freed(e, ref))
        self._live[st] = entry
        self.current += entry[0]
        if self._origin is not None:
            self._origin[st] = (self._op, self.phase)

    _op = "pre-existing"

    def track(self, tensors: Iterable[Any]) -> None:
        """Register tensors that already exist (parameters, buffers, states, inputs)."""
        self._op = "pre-existing"
        for st in storages(tensors).values():
            self._add_storage(st)
        self._note()

    def live_ids(self) -> set[int]:
        """Identities of the storages counted now (for :meth:`forget_new`)."""
        return {id(st) for st in self._live.keys()}

    def forget_new(self, before: set[int], keep: Iterable[Any]) -> int:
        """Stop counting the storages that appeared since ``before`` (a :meth:`live_ids`), except those of
        ``keep``; returns the bytes no longer counted (host-side work a GPU run keeps off the device)."""
        kept = set(storages(keep))
        gone = 0
        for st in [st for st in self._live.keys() if id(st) not in before and id(st) not in kept]:
            entry = self._live.pop(st)
            entry[1] = None  # its weakref (and the callback that would subtract it again) goes with it
            self.current -= entry[0]
            gone += entry[0]
        return gone

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.phase_peaks.setdefault(phase, self.current)

    def _note(self) -> None:
        if self.current > self.phase_peaks.get(self.phase, -1):
            self.phase_peaks[self.phase] = self.current
        if self.current > self.peak:
            self.peak = self.current
            self.peak_phase = self.phase
            if self._origin is not None:
                self.peak_snapshot = [(e[0], *self._origin.get(st, ("?", "?"))) for st, e in self._live.items()]

    def reset_peak(self) -> None:
        self.peak = self.current
        self.peak_phase = self.phase
        self.phase_peaks = {self.phase: self.current}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import torch
        from torch.utils._pytree import tree_flatten

        twin = plain_backward.in_place(func, args, self._fresh() if self._fresh is not None else None)
        out = (twin or func)(*args, **(kwargs or {}))
        if twin is not None or plain_backward.makes_zeros(func):  # a formula's zeros, filled in place as without us
            self._fresh = weakref.ref(out) if twin is None and isinstance(out, torch.Tensor) else None
        self._op = str(twin or func)
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor):
                self._add_storage(local_tensor(t).untyped_storage())
        self._note()
        return out

    def __enter__(self):
        import torch

        self._orig_resize = torch.UntypedStorage.resize_
        orig = self._orig_resize
        counter = self

        def resize_(st, size):  # FSDP2 frees/refills its all-gather buffers with storage.resize_
            orig(st, size)
            if st in counter._live:
                counter._add_storage(st)
                counter._note()

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        import torch

        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize
        return super().__exit__(*exc)


_CLASS_CACHE: dict[str, type] = {}


def LiveBytes(snapshot: bool = False):  # noqa: N802 - a class factory that keeps torch out of module import
    """A new live-storage counter (a ``TorchDispatchMode``); see the module doc. ``snapshot=True`` also keeps
    what was live at the peak (``peak_snapshot``), at some cost per new peak."""
    cls = _CLASS_CACHE.get("LiveBytes")
    if cls is None:
        base = _mode_base()

        class LiveBytesMode(_LiveBytesImpl, base):  # type: ignore[misc, valid-type]
            def __init__(self, snapshot: bool = False) -> None:
                base.__init__(self)
                self._init(snapshot)

        cls = _CLASS_CACHE["LiveBytes"] = LiveBytesMode
    return cls(snapshot)


class SavedTensors:
    """Records what autograd saves for backward: unique storages, parameter storages excluded.

    Use as a context manager around the forward pass; :attr:`bytes` is the total of the saved storages
    still alive (everything saved stays alive until backward). Tensors saved inside non-reentrant
    checkpointed regions are handled by checkpoint's own hooks and are not seen here.
    """

    def __init__(self, exclude: Iterable[Any] = ()) -> None:
        self._exclude = {id(st) for st in storages(exclude).values()}
        self._exclude_refs = list(storages(exclude).values())  # keep ids valid
        self._seen = None
        self._ctx = None
        self.count = 0
        self.bytes_at_exit = 0
        """Saved bytes alive when the context exited (the end of the forward pass)."""

    def _pack(self, t):
        st = local_tensor(t).untyped_storage()
        if id(st) not in self._exclude and st not in self._seen:
            self._seen[st] = st.nbytes()
        self.count += 1
        return t if t.grad_fn is None else t.detach()  # (a leaf holds no node: nothing to cycle through)

    @staticmethod
    def _unpack(t):
        return t

    def __enter__(self):
        torch = _deps.torch()
        from torch.utils.weak import WeakIdKeyDictionary

        self._seen = WeakIdKeyDictionary()
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        self.bytes_at_exit = self.bytes
        return False

    @property
    def bytes(self) -> int:
        """Saved bytes still alive now (after backward, nothing)."""
        return sum(self._seen.values()) if self._seen is not None else 0

    def storages(self) -> list[Any]:
        return list(self._seen.keys()) if self._seen is not None else []
