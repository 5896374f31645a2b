"""Activation offloading: which saved tensors a ``saved_tensors_hooks`` pair moves to pinned host memory.

What the step trace's replay (:class:`fitplan.trace.step_trace.Replay`: its ``plan`` and ``stash``) needs to model
torchtune's ``OffloadActivations`` (pytorch/torchtune @ 30b8519, ``torchtune/training/_activation_offloading.py``) and
TRL's copy of it, which axolotl runs (trl 1.16.0 ``trl/models/activation_offloading.py``; axolotl @ 067b021
``core/trainers/mixins/activation_checkpointing.py``). Both are a pack/unpack hook pair around the model's forward:

* **pack** (forward): a saved tensor of at least ``min_offload_size`` = 1,024 bytes (``element_size · nelement``)
  gets a pinned CPU tensor (``torch.empty_like(..., pin_memory=True)``) and a ``copy_(non_blocking=True)``; the GPU
  tensor is no longer referenced by autograd. Parameters are not offloaded (TRL checks ``nn.Parameter`` and the
  parameters' storages; torchtune's later versions ``nn.Parameter``): fitplan offloads no saved parameter.
* **streams** (``use_streams``, the default of both on torch >= 2.5): the copy runs on a second stream and the
  GPU tensor stays in a *forward stash* until a later offloaded pack finds its id at most its own minus
  ``max_fwd_stash_size`` = 5 (every pack takes an id; see below); whatever is still stashed when the forward ends stays until the first backward node that unpacks an
  offloaded tensor has run (its node hook empties the stash). Without streams (axolotl ``activation_offloading:
  legacy``) nothing is stashed.
* **unpack** (backward): the CPU tensor is copied back (a new GPU allocation) when its node runs (or, under
  checkpointing, when the layer's recomputation starts); a tensor still in the forward stash is used as it is.
* **what the hooks see**: the LM head runs under ``NoOpManager`` (torchtune's recipes register it around
  ``model.output``; TRL's ``get_act_offloading_ctx_manager`` around ``lm_head``): its saved tensors stay on the GPU.
  torchtune computes the loss outside the hooks (its saves stay too); the HF Trainer's model computes it inside its
  forward, within TRL's hooks (axolotl enters them around ``training_step``): there the loss's saved tensors (the
  fp32 log-probabilities of the ``hf`` loss) are packed like any other. Under non-reentrant gradient checkpointing
  a layer's inner saves go to the checkpoint's own hooks (innermost hooks win), and the outer hooks see the layer's positional inputs, which the
  checkpoint saves (``torch/utils/checkpoint.py`` ``_CheckpointFrame.save_inputs``): offloading then moves the
  layer inputs. Hugging Face's layers take the hidden states positionally and the rest (mask, cos/sin, position
  ids) as keywords, which the checkpoint keeps in a ``functools.partial`` (``transformers/modeling_layers.py``
  ``GradientCheckpointingLayer.__call__``; ``checkpoint.py`` ``recompute_fn`` closes over them): those stay.

Host memory: pinned allocations go through the caching host allocator, which rounds each request up to a power of
two and keeps freed blocks for reuse (torch 2.13 ``ATen/core/CachingHostAllocator.h``, ``PowerOf2Ceil`` with the
default ``pinned_max_round_threshold`` unlimited): every pack of one step is alive at the end of the forward, so
the host bytes are the sum over packs of the rounded sizes. torchtune copies each pack (a storage saved twice is
copied twice); TRL (with streams) does not copy a storage that is still in its forward stash and keeps that pack's
GPU tensor in its tracker until the unpack, which fitplan follows. Every pack takes a tensor id, offloaded or not
(a parameter, a tensor under 1 KiB), and the stash is a window of ids: only an offloaded pack drops what fell out of
it.

Not modelled: torchtune frees a brought-back tensor one node later than its last use (``bwd_tensor_stash``),
which keeps one layer input more during the next layer's recomputation. (torchtune's own decoder layers take the
hidden states positionally, as Hugging Face's do: both pack one tensor per checkpointed layer.)
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

OFFLOAD_MODES = ("none", "torchtune", "trl", "trl_sync", "unsloth")
"""``none``; ``torchtune``: its recipes' ``OffloadActivations()`` (``enable_activation_offloading``: streams, the loss
outside the hooks); ``trl``: TRL's, as the HF Trainer runs it (axolotl's ``activation_offloading: true``: streams, the
loss inside the hooks, since the model computes it in its forward); ``trl_sync``: the same with ``use_streams=False``
(axolotl's ``legacy``); ``unsloth``: Unsloth's offloaded gradient checkpointing as LLaMA-Factory copies it
(``use_unsloth_gc``, hiyouga/LLaMA-Factory @ ff6d4d1 ``model/model_utils/checkpointing.py``
``UnslothGradientCheckpointing``): an autograd Function per decoder layer that copies the layer's input to the host
(``hidden_states.to("cpu", non_blocking=True)``, on the compute stream), runs the layer under ``no_grad`` and in its
backward copies the input back and runs the layer again with grad; nothing else moves."""
MIN_OFFLOAD_BYTES = 1024
"""``min_offload_size``: smaller saved tensors stay on the GPU."""
FWD_STASH = 5
"""``max_fwd_stash_size``: packs the streamed copy keeps on the GPU."""


@frozen
class OffloadPlan:
    """Which storages a step's hooks offload, and when the forward packs them.

    :ivar packs: op index -> the packs made there, in order: an offloaded storage, or -1 for a pack that is not
        offloaded (it takes a tensor id all the same); a checkpointed layer's input at its first op.
    :ivar saved: ``{sid: n}``: how many of the storage's non-checkpointed saves are offloaded.
    :ivar kept: ``{sid: n}``: how many checkpointed layers offload it as an input.
    :ivar stash: packs the forward stash holds (0 without streams).
    :ivar host_bytes: pinned host bytes at the end of the forward (per pack, rounded to a power of two).
    :ivar copy_bytes: bytes copied to the host per micro-step (the same come back in the backward).
    """

    packs: dict[int, tuple[int, ...]]
    saved: dict[int, int]
    kept: dict[int, int]
    stash: int
    host_bytes: int
    copy_bytes: int


def pow2ceil(n: int) -> int:
    """The caching host allocator's rounding of a pinned request (``c10::llvm::PowerOf2Ceil``)."""
    return 1 << (int(n) - 1).bit_length() if n > 0 else 0


def loss_start(tr: Any) -> int:
    """The index of the loss's first op: after the LM head's call site (``Trace.head_from``), the first op that
    allocates a ``logits`` storage without differentiating or saving a parameter (the LM head's own ``mm``, and
    autocast's casts before it, are the head's)."""
    start = tr.head_from if tr.head_from is not None else len(tr.ops)
    for i in range(start, len(tr.ops)):
        op = tr.ops[i]
        if not (op.params or op.saves_param) and any(tr.kind[sid] == "logits" for sid in op.allocs):
            return i
    return len(tr.ops)


def outside(tr: Any, i: int, op: Any, loss_from: int | None) -> bool:
    """An op outside the offloading hooks: the LM head's (under ``NoOpManager``: from its call site,
    ``Trace.head_from``, to the loss, and later the ops that differentiate or save a parameter, a chunked head's) and,
    unless the loss is inside the hooks (``loss_from`` given), the loss's (every op from the head on, and any op
    that allocates a ``logits`` storage)."""
    head = tr.head_from is not None and i >= tr.head_from
    if loss_from is None:
        return head or any(tr.kind[sid] == "logits" for sid in op.allocs)
    return head and (i < loss_from or bool(op.params or op.saves_param))


def plan(tr: Any) -> OffloadPlan | None:
    """The offload plan of a recorded step (None when ``tr.spec.offload`` is ``none``)."""
    mode = getattr(tr.spec, "offload", "none")
    if mode == "none":
        return None
    raw, weight, ckpt = tr.raw, tr.seg_weight, tr.seg_ckpt

    loss_from = loss_start(tr) if mode.startswith("trl") else None
    stash = 0 if mode in ("trl_sync", "unsloth") else FWD_STASH

    def offloadable(sid: int) -> bool:
        return sid >= 0 and raw[sid] >= MIN_OFFLOAD_BYTES and (loss_from is not None or tr.kind[sid] != "logits")

    sim = Stash(OffloadPlan({}, {}, {}, stash, 0, 0))  # the forward stash, for TRL's check of a stashed storage
    packs: dict[int, tuple[int, ...]] = {}
    saved: dict[int, int] = {}
    kept: dict[int, int] = {}
    host = copied = 0
    seen_units: set[int] = set()
    for i, op in enumerate(tr.ops):
        if ckpt[op.seg]:
            if op.unit in seen_units or op.unit not in tr.ckpt_keep:
                continue
            seen_units.add(op.unit)
            here = [sid for sid, positional in tr.ckpt_keep[op.unit].items() if positional]
        elif mode != "unsloth" and not outside(tr, i, op, loss_from):  # every saved tensor is a pack (not a ctx input)
            here = [sid for sid in op.saved if sid not in tr.ctx_kept] + [-1] * op.saves_param
        else:
            continue
        slots = []
        for sid in here:
            if not offloadable(sid) or (mode == "trl" and sim.holds(sid)):
                slots.append(-1)  # an id, no copy: TRL keeps a storage still in its stash on the GPU (its tracker)
                continue
            slots.append(sid)
            if ckpt[op.seg]:
                kept[sid] = kept.get(sid, 0) + 1
            elif sid not in tr.external:  # (the batch, saved by a trained embedding, is copied; it stays as the batch)
                saved[sid] = saved.get(sid, 0) + 1
            host += weight[op.seg] * pow2ceil(raw[sid])
            copied += weight[op.seg] * raw[sid]
        if slots:
            sim.push(tuple(slots))
            packs[i] = tuple(slots)
    return OffloadPlan(packs, saved, kept, stash, int(host), int(copied))


class Stash:
    """The replay's view of a plan: the forward stash of the streamed copies (storages in pack order), and whether
    a storage is held on the GPU while the forward runs (its offloaded saves and checkpoint inputs hold nothing)."""

    def __init__(self, p: OffloadPlan) -> None:
        self.plan = p
        self.order: list[int] = []
        self.ids: list[int] = []
        self.count: dict[int, int] = {}
        self.next_id = 0
        self.forward = True
        """The forward (and the loss) runs: offloaded tensors are on the host."""
        self.cleared = False
        """The first backward node that unpacked an offloaded tensor has run: the stash is empty from then on."""

    def push(self, slots: tuple[int, ...]) -> list[int]:
        """Pack ``slots`` in order (-1: a pack that is not offloaded, which takes a tensor id all the same); returns
        the storages that leave the stash. As the pack hooks do: every pack takes the next id, and an offloaded one
        first drops the stashed tensors whose ids are at most its own minus ``max_fwd_stash_size``."""
        out = []
        for sid in slots:
            self.next_id += 1
            if sid < 0:
                continue
            while self.ids and self.ids[0] <= self.next_id - self.plan.stash:
                self.ids.pop(0)
                old = self.order.pop(0)
                self.count[old] -= 1
                out.append(old)
            if self.plan.stash == 0:
                out.append(sid)  # without streams nothing is stashed
                continue
            self.ids.append(self.next_id)
            self.order.append(sid)
            self.count[sid] = self.count.get(sid, 0) + 1
        return out

    def clear(self) -> list[int]:
        """The first unpacking backward node's hook: every stashed storage leaves."""
        out, self.order, self.ids, self.count, self.cleared = self.order, [], [], {}, True
        return out

    def holds(self, sid: int) -> bool:
        return self.count.get(sid, 0) > 0

    def gpu_held(self, sid: int, savers: dict[int, int], keepers: dict[int, int], stash: bool = True) -> bool:
        """In the forward: a save or checkpoint that stays on the GPU holds ``sid`` (or the stash does)."""
        p = self.plan
        return (savers.get(sid, 0) - p.saved.get(sid, 0) > 0 or keepers.get(sid, 0) - p.kept.get(sid, 0) > 0
                or (stash and self.holds(sid)))
