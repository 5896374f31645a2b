"""A symbolic trace of one training step, replayed from the model's learned architecture file.

This module holds no plugin: ``builtin.activations`` and ``builtin.peak`` declare their quantities
from the :class:`StepTrace` it builds. Nothing here imports torch.

Why a trace and not a formula per term: what autograd keeps depends on which tensors share a storage
(a view of a fused projection keeps the whole projection alive), which ops see an input that requires
grad (LoRA's frozen base saves nothing before the first adapter), the dtype each op computes in
(RMSNorm upcasts to fp32, autocast casts per consuming Linear) and the device (CPU dropout keeps its
mask in the input dtype, CUDA in one byte). The forward of every architecture is data: the aten ops
``fitplan learn-architecture`` recorded from the model's own transformers code, with symbolic sizes
(:mod:`.archfile`, docs/architectures.md). :mod:`.learned_graph` turns that record into this module's
:class:`Op` list for the scenario, and :func:`replay` walks it forward and backward:

* an op saves a tensor when PyTorch's derivative rule for it says so and the guarding input requires
  grad (``derivatives.yaml`` through torchgen's ``guard_for``: ``mul`` saves ``other`` only when
  ``self`` requires grad; ``rsqrt`` saves its result);
* saved tensors are counted once per storage (views share their base's storage); parameters and
  buffers are not counted;
* a tensor is freed when the model's Python code lets it go (the recorded lifetime) unless an op saved
  it; what the forward still holds when it returns (logits, the final hidden state) goes then;
* the backward runs the ops in reverse order (the autograd engine executes ready nodes by decreasing
  sequence number); each op allocates the gradients of its inputs that require grad, or passes the
  incoming gradient through (views, additions), frees its outputs' gradients and releases what it alone
  still saved. Two gradients of one tensor are added out of place (``input_buffer.cpp``); a parameter
  used twice (a tied embedding) gets its gradient once both contributions are summed (AccumulateGrad
  waits in its input buffer), otherwise AccumulateGrad steals the incoming gradient;
* gradient checkpointing (non-reentrant, HF ``GradientCheckpointingLayer``) keeps each layer's
  arguments and re-runs the layer's forward when the backward first unpacks one of its saved tensors
  (a saved frozen weight counts: the checkpoint's pack hook wraps every saved tensor), up to its last op
  that saves something ("early stop": before that op's outputs when it saves only inputs); the re-run
  frees what the forward freed inside the layer (what it returns for a later layer stays to the stop), the stop
  releases what the layer's frames held;
* an in-place op on a view whose result requires grad (``key[..., :d].copy_(k)``) rebases the view's base
  on a ``CopySlices`` node: the base's readers send their gradient there, and its backward allocates a
  copy of that gradient at the base's size and a clone of the slice (:mod:`.learned_graph`).

Identical consecutive layers are built once and weighted: layer 0 alone (under LoRA its input does not
require grad), then one block of the layer pattern's period standing for its repetitions, then any
remainder; :func:`replay` accounts for the repetition exactly (saved bytes are additive, live bytes are
affine in the number of repetitions).

A built trace is kept on disk (``fitplan/diskcache.py``, kind ``traces``) under its exact :class:`TraceSpec`
and the fingerprint of the code and learned files that build it (:data:`TRACE_MODULES`): loading one takes
about 0.3 ms where replaying takes 10-30 ms. A full fine-tuning step is recorded once for both gradient
checkpointing settings (:func:`build_sharing`): the recording is about half of a trace's time. A scenario with
checkpointing reads only the forward's figures of its trace without it (:class:`ForwardTrace`,
``TraceSpec.forward_only``): that one is replayed forward only, a fifth of a whole replay. A scenario recorded
before at another micro-batch and sequence length is not recorded again where the decisions of its recording hold
at the new sizes: its sizes are re-evaluated (:mod:`.reuse`, :mod:`.symbolic`), about a seventh of a recording.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
from typing import Any

import attrs
from attrs import frozen

from fitplan.arch.archfile import BYTES  # the dtype codes of learned files
from fitplan.trace import offload, op_work

PARTS = ("activations", "logits", "autocast_copies", "temporaries")
"""What live bytes above the model states are, at any instant of the replay: tensors saved for backward (or
kept by a checkpoint), the loss head's tensors (logits, their fp32 copy, log-softmax, targets), autocast's
16-bit weight copies, and everything else (transients of the op running, gradients flowing between ops, the
model's pinned tensors such as rotary cos/sin, the mask and the final hidden state)."""
ALLOCATOR_BLOCK = 512
"""PyTorch's CUDA caching allocator rounds each allocation up to a multiple of 512 bytes."""
DEBUG: list | None = None
"""Set to a list to collect the replay's timeline (tests and probes)."""


@frozen
class TraceSpec:
    """Everything the trace depends on (hashable: traces are cached)."""

    arch: Any
    batch: int
    seq: int
    precision: str
    attn: str
    checkpointing: bool
    method: str = "full"
    lora_r: int = 8
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.0
    device: str = "cuda"
    block: int = ALLOCATOR_BLOCK
    """CUDA's caching allocator rounds every block up to this many bytes (``[framework]`` ruleset)."""
    adapter_dtype: str = "fp32"
    """LoRA adapters' dtype: fp32 (peft's ``autocast_adapter_dtype``), bf16 (TRL casts them for 4-bit models);
    ``"bf16<fp32"``: adapters computed in bf16 whose input peft first casts to fp32 and autocast casts back
    (accelerate FSDP1 under ``*-mixed``: builtin/activations.py ``trace_setup``)."""
    quant_compute: str | None = None
    """QLoRA: ``bnb_4bit_compute_dtype`` (None: the precision's compute dtype)."""
    linear_saves_input: bool = False
    """Every ``nn.Linear`` call site in the graph saves its input, frozen weight or not: DeepSpeed ZeRO-3 replaces
    ``F.linear`` (the rule and its source: ``builtin/sharding/deepspeed.py``, ``zero3_linear_saves_input``)."""
    loss: str = "hf"
    """How the loss head runs: ``hf``, ``chunked``, ``liger``, ``cce``, TRL's fused heads ``trl``, ``trl_kto``,
    ``trl_logp``, ORPO's and CPO's loss over the full logits ``trl_orpo``, ``trl_cpo``, ``trl_cpo_no_nll`` (and
    their ``_f32`` twins under autocast) (:mod:`.loss_heads`)."""
    lora_saved: tuple[str, ...] = ()
    """peft's ``modules_to_save``: these modules' parameters train under LoRA (:mod:`.lora`)."""
    frozen: bool = False
    """No parameter trains: a forward under ``torch.no_grad`` (TRL's reference model, builtin/trl/preference.py)."""
    offload: str = "none"
    """Activation offloading: ``none``, ``torchtune``, ``trl`` or ``trl_sync`` (:mod:`.offload`)."""
    quant_bits: int = 4
    """QLoRA's base Linears: 4 (NF4, ``Linear4bit``) or 8 (LLM.int8, ``Linear8bitLt``: :mod:`.kernels`)."""
    liger: bool = False
    """``use_liger_kernel``: Liger-Kernel's RMSNorm, SwiGLU and RoPE kernels where its patch for the model type puts
    them (:mod:`.liger`; the loss head is ``loss``)."""
    forward_only: bool = False
    """Only the forward's figures (a :class:`ForwardTrace`, no backward replayed): what a scenario with gradient
    checkpointing reads of its trace without it (``builtin/activations.py``)."""


@functools.lru_cache(maxsize=None)
def trace_precision(precision: str) -> str:
    """The first preset of :data:`fitplan.inputs.precision.PRESETS` whose step trace is ``precision``'s. A trace
    reads its preset only through the weight dtype, the compute dtype and whether autocast casts between them
    (``learned_graph.dtype_map`` and ``Builder.__init__``, the only readers of ``TraceSpec.precision``), so
    presets that differ in nothing else share one trace instead of building it twice: ``bf16-master`` and
    ``bf16-true`` (master weights live outside the step's ops), ``bf16-autocast`` (autocast over bf16 weights
    casts nothing). tests/test_step_trace_key.py builds each merged preset's trace afresh and compares."""
    from fitplan.inputs.precision import PRESETS

    def key(name: str) -> tuple:
        q = PRESETS[name]
        return q.autocast and q.weight_dtype != q.compute_dtype, q.weight_dtype, q.compute_dtype

    return next(name for name in PRESETS if key(name) == key(precision))


@frozen
class StepTrace:
    """What :func:`build` returns. Byte counts are per GPU, before any sharding of model states.

    :ivar saved: ``(label, bytes)`` per saved storage class, for ``explain`` and the docs.
    :ivar retained_bytes: what the forward leaves alive for the backward, beyond what was alive before
        it (the batch and the model states), the loss scalar excluded: the referee's ``retained``.
    :ivar activation_bytes: the part of ``retained_bytes`` that is neither logits/loss nor autocast copies.
    :ivar logits_bytes: the loss head's saved tensors (log-softmax output, targets).
    :ivar autocast_copy_bytes: autocast's 16-bit weight copies kept for backward.
    :ivar forward_peak_bytes: the most the forward adds at any op over what was alive before it.
    :ivar backward_points: ``(other_bytes, param_grad_bytes, op_param_grad_bytes)`` at candidate instants
        of the backward: live bytes there are the step's resident bytes + other + param_grad (scaled by
        sharding); ``op_param_grad_bytes`` is the gradient the op is producing, the only extra when the
        gradients already exist (accumulation steps after the first).
    :ivar param_grad_bytes: gradients of all trainable parameters at the end of backward.
    :ivar buffer_bytes: the model's buffers (rotary ``inv_freq``, Gemma's ``embed_scale``, ...).
    """

    saved: tuple[tuple[str, int], ...]
    retained_bytes: int
    activation_bytes: int
    logits_bytes: int
    autocast_copy_bytes: int
    forward_peak_bytes: int
    backward_points: tuple[tuple[int, int, int], ...]
    backward_frontier: tuple[tuple[int, int], ...]
    """The (other, param_grad) backward points no other point dominates (what the peak needs)."""
    backward_frontier_accumulating: tuple[tuple[int, int], ...]
    """Likewise for (other, op_param_grad): the points that matter when gradients already exist."""
    backward_frontier_layers: tuple[tuple[int, int], ...]
    """The (other, param_grad) frontier of the points inside decoder layers' backward only."""
    param_grad_bytes: int
    buffer_bytes: int
    layer_bytes: int = 0
    """What one decoder layer (a representative one: layer 1, or layer 0 of a one-layer model) keeps."""
    backward_after_head: tuple[int, int] = (0, 0)
    """(other, param_grad) bytes when the LM head and final norm are differentiated, before the last layer."""
    forward_before_last_layer_bytes: int = 0
    """Live bytes (over what was alive before the step) when the last decoder layer's forward starts."""
    loss_bytes: int = 4
    """The loss scalar: kept through the optimizer step by ``loss.detach()`` (the logged value)."""
    max_param_grad_bytes: int = 0
    """The largest parameter gradient one op produces (the transient of accumulating into existing grads)."""
    backward_before_grads: int = 0
    """The most the backward holds before the first parameter gradient exists (other bytes only)."""
    backward_frontier_bucketed: tuple[tuple[int, int], ...] = ()
    """The (other, op_param_grad) frontier of the points after the first parameter gradient: what matters when
    each gradient leaves for a bucket or partition as soon as it is produced (DeepSpeed ZeRO-2/3)."""
    work: tuple[op_work.OpWork, ...] = ()
    """The micro-step's kernels, phase by phase, for the time model (:func:`fitplan.trace.op_work.step_work`)."""
    forward_peak_parts: tuple[int, int, int, int] = (0, 0, 0, 0)
    """``forward_peak_bytes`` split into :data:`PARTS` (sums to it)."""
    forward_before_last_layer_parts: tuple[int, int, int, int] = (0, 0, 0, 0)
    """``forward_before_last_layer_bytes`` split into :data:`PARTS`."""
    backward_parts: tuple[tuple[int, tuple[int, int, int, int]], ...] = ()
    """For each backward frontier point's ``other_bytes``: that value split into :data:`PARTS` (sums to it)."""
    offload_host_bytes: int = 0
    """Activation offloading: the pinned host bytes the step's packs hold (:mod:`.offload`)."""
    offload_copy_bytes: int = 0
    """Activation offloading: bytes copied to the host per micro-step (and back in the backward)."""
    param_ops: tuple[tuple[str, bool], ...] = ()
    """``(parameter name, whether an output of an op reading it requires grad)``. A parameter none of whose ops
    has such an output (under LoRA the embedding and the frozen Linears before the first adapter) belongs to a
    module whose backward never runs, which DeepSpeed ZeRO-3 reads (``builtin/sharding/deepspeed.py``)."""

    def parts_of(self, other_bytes: int) -> tuple[int, int, int, int]:
        """The :data:`PARTS` of a backward point's ``other_bytes`` (all temporaries when unknown)."""
        for a, p in self.backward_parts:
            if a == other_bytes:
                return p
        return (0, 0, 0, int(other_bytes))


@frozen
class ForwardTrace:
    """What :func:`build` returns for a :attr:`TraceSpec.forward_only` spec: these fields (:data:`FORWARD_FIELDS`) of
    the :class:`StepTrace` the same spec would give, each computed by the same code, without the backward's replay
    (about four fifths of a replay) or the time model's work. A scenario with gradient checkpointing reads only
    these of its trace without checkpointing (the activations it would keep, one layer's share); a reader of a
    backward figure gets an AttributeError, never a wrong number. tests/test_forward_trace.py compares the fields
    with full traces."""

    saved: tuple[tuple[str, int], ...]
    retained_bytes: int
    activation_bytes: int
    logits_bytes: int
    autocast_copy_bytes: int
    forward_peak_bytes: int
    param_grad_bytes: int
    buffer_bytes: int
    layer_bytes: int
    max_param_grad_bytes: int
    loss_bytes: int
    forward_before_last_layer_bytes: int
    forward_peak_parts: tuple[int, int, int, int]
    forward_before_last_layer_parts: tuple[int, int, int, int]
    offload_host_bytes: int
    offload_copy_bytes: int


FORWARD_FIELDS = tuple(f.name for f in attrs.fields(ForwardTrace))
"""The :class:`StepTrace` fields the forward's replay decides alone (:meth:`Replay.forward_fields`)."""


def forward_of(trace: StepTrace) -> ForwardTrace:
    """The :class:`ForwardTrace` of a whole trace (its forward's figures, copied)."""
    return ForwardTrace(**{f: getattr(trace, f) for f in FORWARD_FIELDS})


# --------------------------------------------------------------------------- symbolic tensors and ops


@attrs.define(slots=True, eq=False)
class T:
    """A symbolic tensor: ``numel`` elements of ``dtype`` in storage ``sid`` (views share it; -1: a
    parameter's or buffer's storage, never counted)."""

    sid: int
    numel: int
    dtype: str
    rg: bool
    layout: str = "c"
    param: bool = False
    base: Any = None
    name: str = ""
    shape: tuple[int, ...] | None = None
    tie: Any = None
    """A tied parameter: the parameter it is (they share one gradient, :attr:`key`)."""

    @property
    def nbytes(self) -> int:
        return self.numel * BYTES[self.dtype]

    @property
    def key(self) -> int:
        return id(self.tie) if self.tie is not None else id(self)


@attrs.define(slots=True)
class Op:
    name: str
    seg: int
    reads: tuple[int, ...]
    allocs: tuple[int, ...]
    saved: tuple[int, ...]
    outs: tuple[T, ...]
    grad_ins: tuple[T, ...]
    grad_kinds: tuple[int, ...] = ()
    """Per ``grad_ins``: -1 a new gradient tensor, k the incoming gradient of output k passed through."""
    params: tuple[tuple[Any, int, int, bool], ...] = ()
    """``(parameter key, gradient bytes, kind, last use)`` of the parameters this op differentiates."""
    param_grad: int = 0
    bwd_temp: int = 0
    clone_grad: bool = False
    work: Any = None
    """The kernels the op launches (:class:`fitplan.trace.op_work.Work`; None: none)."""
    unit: int = -1
    """The decoder layer the op belongs to (-1: outside the layers): the unit gradient checkpointing re-runs."""
    saves_param: bool = False
    """The op's node saves a parameter (a frozen weight for its input's gradient): not counted as an activation,
    but packed and unpacked like any saved tensor (a checkpoint's hooks see it)."""
    releases: tuple[int, ...] = ()
    """Storages held to the end of the forward (``pinned``) that stop being held here: the model's forward returned
    before its caller's loss runs (:meth:`Trace.release`)."""
    cast_temp: int = 0
    """Bytes beyond its inputs' gradients held when autograd casts one of them to its input's dtype after the node
    returns (:meth:`.learned_graph.Builder.broadcast_gradients`; 0: no such cast)."""
    dead: bool = False
    """In a checkpointed layer: the op's node leads nowhere differentiable (:meth:`Trace.drop_dead_saves`), so it
    died with its outputs in the forward and the recomputation keeps nothing it saved (:meth:`Replay.recompute`)."""


_OP_FIELDS = tuple(f.name for f in attrs.fields(Op))


def _new_sids(ts: list[T]) -> tuple[int, ...]:
    """The storages of ``ts`` that are counted (not a parameter's, -1), each once, in order of first appearance."""
    out: list[int] = []
    for t in ts:
        sid = t.sid
        if sid >= 0 and sid not in out:
            out.append(sid)
    return tuple(out)


def _copy_op(op: Op) -> Op:
    """A shallow copy of ``op`` (``copy.copy`` goes through attrs' pickling state: ten times slower)."""
    new = object.__new__(Op)
    for name in _OP_FIELDS:
        setattr(new, name, getattr(op, name))
    return new


class Trace:
    """Records the forward of one step (see the module doc)."""

    def __init__(self, spec: TraceSpec) -> None:
        self.spec = spec
        self.size: list[int] = []
        self.raw: list[int] = []
        """Each storage's bytes before the allocator's rounding (activation offloading's size threshold)."""
        self.label: list[str] = []
        self.kind: list[str] = []
        self.ops: list[Op] = []
        self.seg = 0
        self.seg_names: list[str] = ["prologue"]
        self.seg_weight: list[int] = [1]
        self.seg_ckpt: list[bool] = [False]
        self.pinned: set[int] = set()
        self.uncached: set[int] = set()
        self.ckpt_keep: dict[int, dict[int, bool]] = {}
        """Decoder layer -> the storages its checkpoint keeps (its arguments, in order) -> whether it is the layer's
        positional argument, the one the checkpoint saves through the saved-tensor hooks."""
        self.unit = -1
        """The decoder layer being recorded (-1: outside the layers)."""
        self.head_from: int | None = None
        """The index of the LM head's first op (None: not recorded)."""
        self.ctx_kept: set[int] = set()
        """Storages an autograd Function keeps as a ``ctx`` attribute (bitsandbytes' 8-bit matmul keeps its input):
        no saved-tensor hook sees them, so neither checkpointing nor offloading moves them."""
        self.param_grad_total = 0
        self.loss: T | None = None
        self.external: set[int] = set()
        self.kind_default = "activation"
        self.rounding = spec.device == "cuda"
        self.leaves: set[int] = set()
        """Non-parameter tensors that require grad as leaves: alive until the backward ends."""
        self.buffer_bytes = 0
        self.param_last_use: dict[int, int] = {}
        self.clone_params: set[str] = set()
        self.params: list[T] = []
        """Every parameter tensor made (alive as long as the recording, so that their ids stay distinct)."""
        self.param_outs: dict[str, list[T]] = {}
        """Parameter name -> the outputs of the ops that read it (their ``rg`` is final once the forward is built)."""
        self.shared_ops = False
        """The :class:`Op` objects are shared with a checkpointing twin (:meth:`checkpointed`)."""
        self.reevaluated = False
        """Made by re-evaluating a kept recording at new sizes (:mod:`.reuse`): making it again costs little."""

    # ---- storages
    def _storage(self, nbytes: int, label: str) -> int:
        self.raw.append(nbytes)
        if self.rounding and nbytes:
            nbytes = -(-nbytes // self.spec.block) * self.spec.block
        self.size.append(nbytes)
        self.label.append(label)
        self.kind.append(self.kind_default)
        return len(self.size) - 1

    def new(self, numel: int, dtype: str, rg: bool, label: str, layout: str = "c") -> T:
        return T(self._storage(numel * BYTES[dtype], label), numel, dtype, rg, layout)

    def external_tensor(self, numel: int, dtype: str, label: str) -> T:
        """A tensor alive before the step (the batch): never counted, never freed."""
        sid = self._storage(0, label)
        self.raw[sid] = numel * BYTES[dtype]  # (what activation offloading copies when an op saves it)
        self.external.add(sid)
        return T(sid, numel, dtype, False)

    def param(self, numel: int, dtype: str, rg: bool) -> T:
        """A parameter's tensor. The trace keeps it: an op records a parameter by its :attr:`T.key` (its ``id``), and
        a tensor let go (a LoRA adapter made inside a call site's function) would hand its id to the next one."""
        t = T(-1, numel, dtype, rg, param=True)
        self.params.append(t)
        return t

    @staticmethod
    def view(t: T, numel: int | None = None, layout: str | None = None) -> T:
        return T(t.sid, t.numel if numel is None else numel, t.dtype, t.rg, layout or t.layout, t.param, None, t.name,
                 t.shape if numel is None else None)

    # ---- segments
    def segment(self, name: str, weight: int = 1, ckpt: bool = False) -> None:
        self.seg_names.append(name)
        self.seg_weight.append(weight)
        self.seg_ckpt.append(ckpt)
        self.seg = len(self.seg_names) - 1

    # ---- recording
    def emit(self, name: str, ins: list[T], outs: list[T], saved: list[T], grad_ins: list[tuple[T, int]],
             params: list[tuple[T, int]], node: bool, *, bwd_temp: int = 0, work: Any = None,
             cast_temp: int = 0) -> None:
        """Record one op (see :meth:`.learned_graph.Builder.emit`, which works out the arguments and the
        op's kernels, ``work``)."""
        reads = tuple([t.sid for t in ins if t is not None and t.sid >= 0])
        allocs = _new_sids([t for t in outs if t.sid not in reads])
        sv = _new_sids([t for t in saved if t is not None])
        param_outs = self.param_outs
        for t in ins:
            if t is not None and t.param and t.name:
                got = param_outs.get(t.name)
                if got is None:
                    param_outs[t.name] = list(outs)
                else:
                    got.extend(outs)
        pentries = ()
        pg = 0
        if params:
            pentries = []
            n = len(self.ops)
            for p, kind in params:
                nb = p.numel * BYTES[p.dtype]
                key = p.key
                pentries.append((key, nb, kind, False))
                self.param_last_use[key] = n
                pg += nb
            pentries = tuple(pentries)
        self.ops.append(Op(name, self.seg, reads, allocs, sv, tuple([t for t in outs if t.rg]),
                           tuple([t for t, _ in grad_ins]), tuple([k for _, k in grad_ins]), pentries, pg,
                           bwd_temp if node else 0, work=work, unit=self.unit,
                           saves_param=any(t is not None and t.sid < 0 for t in saved) if saved else False,
                           cast_temp=cast_temp if node else 0))

    def finish(self) -> None:
        """Drop what dead nodes saved (:meth:`drop_dead_saves`), mark each parameter's last use in the backward
        (its first in the forward): where its gradient is complete, and count the parameter gradient bytes
        (weighted by layer repetition). A dead node never runs, so a parameter only dead nodes read gets no
        gradient: autocast's cached copy of a weight made inside a ``no_grad`` block (the cache casts with grad
        mode on, torch/csrc/autocast_mode.cpp ``cached_cast``: a node whose output only ``ng`` ops read)."""
        dead = self.drop_dead_saves()
        first: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            if i not in dead:
                for key, *_ in op.params:
                    first.setdefault(key, i)
        total = 0
        for i, op in enumerate(self.ops):
            if not op.params:
                continue
            new = []
            for key, nb, kind, _ in op.params:
                last = first.get(key) == i
                new.append((key, nb, kind, last))
                if last:
                    total += nb * self.seg_weight[op.seg]
            op = self._own_op(i)
            op.params = tuple(new)
            op.param_grad = sum(nb for _, nb, _, last in new if last)
        self.param_grad_total = total

    def _own_op(self, i: int) -> Op:
        """Op ``i``, to be changed: copied first while the op list is shared with a checkpointing twin
        (:meth:`checkpointed`), so that the twin's op stays as recorded."""
        op = self.ops[i]
        if self.shared_ops:
            op = self.ops[i] = _copy_op(op)
        return op

    def drop_dead_saves(self) -> set[int]:
        """An autograd node lives as long as a tensor it produced or a node downstream of it: once the forward
        returns, only the loss's ancestors and the nodes of the tensors the caller still holds are alive, and a
        node that dies frees what it saved. A branch whose outputs lead nowhere differentiable (DeepSeek's group
        routing: ``topk`` values summed, then only a ``topk``'s indices used) saved its tensors for nothing, and
        they are freed when the model's code drops the branch's outputs. Walking the ops backward from the loss
        (an op is live when one of its outputs shares a storage with a gradient input of a live op, an
        over-approximation that keeps every in-place version's node), a dead op's saves are dropped. In a
        checkpointed segment the op is marked ``dead`` instead (its saves still count toward the recomputation's
        early stop, :meth:`Replay.recompute`). Returns the ops with outputs that are no ancestor of the loss (their
        nodes, alive or not, never receive a gradient)."""
        dead: set[int] = set()
        if self.loss is None:
            return dead
        live = {self.loss.sid} | (self.pinned - self.uncached)
        reach = {self.loss.sid}
        ops, ckpt = self.ops, self.seg_ckpt
        for i in range(len(ops) - 1, -1, -1):
            op = ops[i]
            if op.outs and not any(t.sid in reach or t.sid < 0 for t in op.outs):  # (a parameter's view: no storage)
                dead.add(i)
            elif op.outs:
                reach.update([g.sid for g in op.grad_ins if g.sid >= 0])
            for t in op.outs:  # (a loop, not ``any`` over a generator: a third of the time, four times a request)
                if t.sid in live:
                    live.update([g.sid for g in op.grad_ins if g.sid >= 0])
                    break
            else:
                if op.outs and op.saved:
                    if ckpt[op.seg]:
                        self._own_op(i).dead = True
                    else:
                        self._own_op(i).saved = ()
        return dead

    def checkpointed(self, spec: TraceSpec, *, copy: bool) -> Trace:
        """This recording (made with checkpointing on) for ``spec``, with checkpointing as ``spec`` says: without
        it, no segment is checkpointed and no layer keeps its arguments. ``copy``: a copy, whose op list is its own
        and whose other parts are shared, read only from here on (:func:`shares_recording`); the ops themselves are
        shared too, and each side copies an op before :meth:`finish` changes it (:meth:`_own_op`: a few dozen of a
        few hundred); else this recording itself, changed."""
        tr = self
        if copy:
            self.shared_ops = True
            tr = object.__new__(Trace)
            tr.__dict__.update(self.__dict__)
            tr.ops = list(self.ops)
        tr.spec = spec
        if not spec.checkpointing:
            tr.seg_ckpt = [False] * len(self.seg_ckpt)
            tr.ckpt_keep = {}
        return tr

    def release(self, sids: list[int]) -> None:
        """From here on ``sids`` are no longer held to the end of the forward: what nothing saved goes now (a
        ``release`` op; their allocating segments' repetitions are accounted as for any free)."""
        if sids:  # (they stay in ``pinned``: the replay holds them until this op)
            self.ops.append(Op("release", self.seg, (), (), (), (), (), unit=self.unit, releases=tuple(sids)))

    def touch(self, *ts: T) -> None:
        """The model's Python code still holds ``ts`` here (a recorded lifetime): extends their lifetime,
        records nothing for backward."""
        reads = tuple(t.sid for t in ts if t is not None and t.sid >= 0)
        if reads:
            self.ops.append(Op("hold", self.seg, reads, (), (), (), (), unit=self.unit))


TRACE_FORMAT = 1
"""Bumped when a kept trace's layout changes without a module's size or mtime changing."""
TRACE_MODULES = ("trace/step_trace.py", "trace/learned_graph.py", "trace/learned_segment.py", "trace/strides.py", "trace/layer_refs.py",
                 "trace/kernels.py", "trace/int8.py", "trace/op_work.py", "arch/archexpr.py", "arch/archfile.py", "arch/archformat.py",
                 "arch/learned_repeat.py", "trace/lora_targets.py", "trace/loss_heads.py", "trace/fused_head.py", "trace/score_head.py",
                 "trace/logits_head.py", "trace/liger.py", "trace/offload.py", "trace/symbolic.py", "trace/reuse.py", "inputs/precision.py",
                 "inputs/files.py", "inputs/convert.py", "errors.py")
"""Every fitplan module that building a trace runs (tests/test_disk_cache.py checks the list against the
imports): their size and mtime are part of a kept trace's key."""
KEEP_TRACES = 4000
"""Kept traces on disk (about 15 KB each); beyond this the oldest half is removed."""


@functools.lru_cache(maxsize=512)
def build(spec: TraceSpec) -> StepTrace | ForwardTrace:
    """The step trace of ``spec``: kept on disk from an earlier run, else built (see the module doc), from the
    recording its checkpointing twin left when there is one (:func:`build_sharing`)."""
    import pickle

    from fitplan import diskcache
    from fitplan.arch.archfile import BUNDLED, user_dirs

    key = (TRACE_FORMAT, pickle.dumps(spec, protocol=4), diskcache.code_fingerprint(_module_paths(), (*user_dirs(), BUNDLED)))
    name = diskcache.entry_name(spec.arch.model_type, key[1])
    trace = diskcache.load("traces", name, key)
    if not isinstance(trace, ForwardTrace if spec.forward_only else StepTrace):
        whole = _WHOLE.get(attrs.evolve(spec, forward_only=False)) if spec.forward_only else None
        if whole is not None:
            trace = forward_of(whole)  # the forward's figures of the whole trace this process built
        else:
            with gc_paused():
                trace = build_sharing(spec, key[2])
        store(name, key, trace)
    if not spec.forward_only:
        with _RECORDINGS_LOCK:
            _WHOLE[spec] = trace
            while len(_WHOLE) > WHOLE_KEPT:
                del _WHOLE[next(iter(_WHOLE))]
    return trace


def store(name: str, key: Any, trace: StepTrace | ForwardTrace) -> None:
    """Keep a built trace on disk: before :func:`build` returns, or by the writer thread once
    :func:`store_in_background` has started it."""
    from fitplan import diskcache

    later = _STORE["queue"]
    if later is None:
        diskcache.store("traces", name, key, trace, keep=KEEP_TRACES)
    else:
        later.put((name, key, trace))


_STORE: dict[str, Any] = {"queue": None, "writer": None}
"""The traces waiting for the writer thread (a ``queue.Queue``; None: no writer, :func:`store` writes at once), and
that thread."""


def store_in_background() -> None:
    """From here on the traces :func:`build` builds are written to the disk cache by one writer thread
    (``fitplan serve``: a never-seen shape's reply does not wait for its four stores, about 0.7 ms each); what is
    still queued at exit is written then (:func:`flush_stores`). A second call changes nothing."""
    import atexit
    import queue

    with _RECORDINGS_LOCK:
        if _STORE["queue"] is not None:
            return
        later = _STORE["queue"] = queue.Queue()
        writer = _STORE["writer"] = threading.Thread(target=_write_stores, args=(later,), name="fitplan-trace-store",
                                                     daemon=True)
    writer.start()
    atexit.register(flush_stores)


def _write_stores(later: Any) -> None:
    from fitplan import diskcache

    while True:
        item = later.get()
        try:
            if item is None:  # (stop_storing_in_background)
                return
            diskcache.store("traces", *item, keep=KEEP_TRACES)  # (never raises)
        finally:
            later.task_done()


def flush_stores() -> None:
    """Wait until the writer thread has written every trace queued so far (at exit; tests)."""
    later = _STORE["queue"]
    if later is not None:
        later.join()


def stop_storing_in_background() -> None:
    """Write what is queued, stop the writer thread, and store before :func:`build` returns again (tests)."""
    with _RECORDINGS_LOCK:
        later, writer, _STORE["queue"], _STORE["writer"] = _STORE["queue"], _STORE["writer"], None, None
    if later is not None:
        later.put(None)
        writer.join()


WHOLE_KEPT = 512
"""Whole traces remembered for the forward-only asks of the same spec (as many as :func:`build` caches)."""
_WHOLE: dict[TraceSpec, StepTrace] = {}
"""Spec -> the whole trace :func:`build` returned for it: a scenario with checkpointing after the same one without
it (the page's checkbox) copies the forward's figures (:func:`forward_of`) instead of recording again."""


@functools.lru_cache(maxsize=1)
def _module_paths() -> tuple:
    """:data:`TRACE_MODULES` as paths (made once: :func:`build` runs for every trace a scenario asks for)."""
    from pathlib import Path

    package = Path(__file__).resolve().parent.parent
    return tuple(package / m for m in TRACE_MODULES)


_GC = {"pauses": 0, "was_enabled": False}
_GC_LOCK = threading.Lock()


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off while a trace is recorded and replayed (threads nest: the last to
    leave turns it back on, if it was on). A recording makes thousands of objects that all stay alive until it
    is replayed, so each collection the allocations trigger traverses all of them again, and the older
    generations the whole process: about a quarter of a never-seen shape's time on ``fitplan serve``. Nothing
    is lost: the few cycles a recording leaves (its Builder and Segments) are collected at the next collection
    after it."""
    with _GC_LOCK:
        if _GC["pauses"] == 0:
            _GC["was_enabled"] = gc.isenabled()
            gc.disable()
        _GC["pauses"] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC["pauses"] -= 1
            if _GC["pauses"] == 0 and _GC["was_enabled"]:
                gc.enable()


def build_afresh(spec: TraceSpec) -> StepTrace:
    """Trace one step of ``spec`` from its learned architecture and replay it (see the module doc)."""
    return finished(record(spec))


def record(spec: TraceSpec) -> Trace:
    """The recorded forward of ``spec``, not yet finished: :func:`record_afresh`'s, re-evaluated from the recording
    of the same scenario at another micro-batch and sequence length where that applies (:mod:`.reuse`)."""
    from fitplan.trace import reuse

    return reuse.record(spec, record_afresh)


def record_afresh(spec: TraceSpec) -> Trace:
    """The recorded forward of ``spec`` (:class:`.learned_graph.Builder`), not yet finished."""
    from fitplan.arch.archfile import load
    from fitplan.trace.learned_graph import Builder

    arch = spec.arch
    tr = Trace(spec)
    Builder(tr, load(arch.model_type), dict(arch.symbols)).run()
    return tr


def finished(tr: Trace) -> StepTrace | ForwardTrace:
    """The step trace of a recorded forward: :meth:`Trace.finish`, :func:`replay` and the time model's work (a
    :attr:`~TraceSpec.forward_only` spec: :meth:`Trace.finish` and the forward's replay only)."""
    tr.finish()
    if tr.spec.forward_only:
        return Replay(tr).run_forward()
    param_ops = tuple((name, any(o.rg for o in outs)) for name, outs in tr.param_outs.items())
    return attrs.evolve(replay(tr), work=op_work.step_work(tr), param_ops=param_ops)


# --------------------------------------------------------------------------- one recording, both checkpointing ways


RECORDINGS_KEPT = 64
"""Recordings kept in memory for the twin that has not been built yet (the oldest is dropped first)."""
_RECORDINGS: dict[tuple[TraceSpec, str], tuple[Any, Trace]] = {}
"""(twin spec, fingerprint) -> (the learned file the recording was made from, the recording)."""
_RECORDINGS_LOCK = threading.Lock()


def shares_recording(spec: TraceSpec) -> bool:
    """Whether ``spec``'s recorded forward serves it with and without gradient checkpointing. Checkpointing
    changes what the Builder records in one place only: under LoRA, peft's ``enable_input_require_grads`` hook
    makes the embedding's output require grad (``learned_segment.py``, ``embed_out``); everywhere else it
    marks the decoder layers' segments as checkpointed and records each layer's arguments (``ckpt_keep``,
    ``learned_graph.py`` ``run``), which :meth:`Trace.checkpointed` sets or clears. Everything after the
    recording (``finish``, ``replay``, ``op_work.step_work``) reads those two and the spec only.
    tests/test_step_trace_key.py compares the shared traces with traces recorded separately."""
    return spec.method not in ("lora", "qlora")


def build_sharing(spec: TraceSpec, fingerprint: str = "") -> StepTrace | ForwardTrace:
    """:func:`build_afresh`'s trace of ``spec``. A spec that :func:`shares_recording` is recorded with
    checkpointing on, and the recording is kept for its twin (the same spec, checkpointing the other way): the
    estimate of a scenario with checkpointing needs both traces (its activations without checkpointing are the
    reducer's input), and one without it asks for the checkpointed one in its advice. The twin then skips the
    recording (about half of a trace's time). A :attr:`~TraceSpec.forward_only` spec (what a scenario with
    checkpointing reads without it) keeps the recording for its whole self too, which the same scenario without
    checkpointing then replays without recording; it takes a kept recording without removing it.
    ``fingerprint``: the code and learned files' (:func:`build`); a kept recording serves only while
    ``archfile.load`` still returns the learned file it was made from (a relearned file, ``fitplan
    learn-architecture``'s verification, clears that cache)."""
    from fitplan.arch.archfile import load

    whole = attrs.evolve(spec, forward_only=False) if spec.forward_only else spec
    with _RECORDINGS_LOCK:
        kept = (_RECORDINGS.get if spec.forward_only else _RECORDINGS.pop)((whole, fingerprint), None)
    if kept is not None and kept[0] is load(spec.arch.model_type):
        return finished(kept[1].checkpointed(spec, copy=spec.forward_only))
    if not shares_recording(spec):
        return build_afresh(spec)
    af = load(spec.arch.model_type)
    tr = record(attrs.evolve(whole, checkpointing=True))
    if tr.reevaluated:  # the twin asks reuse.record again, which keeps the last two re-evaluated recordings: keeping
        return finished(tr.checkpointed(spec, copy=False))  # more alive costs more in the garbage collector's walks
    twins = [attrs.evolve(whole, checkpointing=not spec.checkpointing)] + ([whole] if spec.forward_only else [])
    with _RECORDINGS_LOCK:
        for twin in twins:
            _RECORDINGS[(twin, fingerprint)] = (af, tr.checkpointed(twin, copy=True))
        while len(_RECORDINGS) > RECORDINGS_KEPT:
            del _RECORDINGS[next(iter(_RECORDINGS))]
    return finished(tr.checkpointed(spec, copy=False))


# --------------------------------------------------------------------------- replay: forward and backward timelines


def recomputed_lifetimes(seg_ops: list[tuple[int, Op]], last_read: dict[int, int], stop: int,
                         to_the_end: set[int] = frozenset()) -> dict[int, int]:
    """Storage -> the last of a recomputed layer's ops ``seg_ops`` (``(index, op)``) that holds it: its last read in
    the layer, or ``stop`` (past every op: held to the recomputation's stop) for one whose recorded lifetime
    (``last_read``, over the whole forward) runs past the layer, a tensor the layer returns for a later one, and
    for one of ``to_the_end``, held to the end of the forward: autocast's copy of a weight that requires grad,
    which the cache of the recomputation's own ``torch.autocast`` context keeps until the stop unwinds it
    (torch/csrc/autocast_mode.cpp ``cached_cast``; torch/amp/autocast_mode.py ``__exit__`` clears the cache when
    the outermost context exits; torch/utils/checkpoint.py re-enters the forward's autocast state to recompute)."""
    end = seg_ops[-1][0] if seg_ops else -1
    last_in: dict[int, int] = {}
    for i, op in seg_ops:
        for sid in (*op.reads, *op.allocs):
            last_in[sid] = i if last_read.get(sid, -1) <= end and sid not in to_the_end else stop
    return last_in


def replay(tr: Trace) -> StepTrace:
    """Walk the recorded forward, then the backward, counting live bytes (see the module doc and :class:`Replay`)."""
    return Replay(tr).run()


@attrs.define(slots=True)
class Parts:
    """Bytes split into :data:`PARTS`, one named field each; the replay adds, subtracts and scales whole splits."""

    activations: int = 0
    logits: int = 0
    autocast_copies: int = 0
    temporaries: int = 0

    def add(self, part: str, n: int) -> None:
        """Count ``n`` more bytes under ``part`` (a name of :data:`PARTS`; negative: fewer)."""
        setattr(self, part, getattr(self, part) + n)

    def __add__(self, other: Parts) -> Parts:
        return Parts(self.activations + other.activations, self.logits + other.logits,
                     self.autocast_copies + other.autocast_copies, self.temporaries + other.temporaries)

    def __sub__(self, other: Parts) -> Parts:
        return Parts(self.activations - other.activations, self.logits - other.logits,
                     self.autocast_copies - other.autocast_copies, self.temporaries - other.temporaries)

    def __mul__(self, k: int) -> Parts:
        return Parts(self.activations * k, self.logits * k, self.autocast_copies * k, self.temporaries * k)

    def copy(self) -> Parts:
        return Parts(self.activations, self.logits, self.autocast_copies, self.temporaries)

    def saved(self) -> int:
        """The three parts that are tensors kept for the backward (all but the temporaries)."""
        return self.activations + self.logits + self.autocast_copies

    def astuple(self) -> tuple[int, int, int, int]:
        return (self.activations, self.logits, self.autocast_copies, self.temporaries)


@attrs.define(slots=True, eq=False)
class GradBuffer:
    """A gradient tensor flowing between backward ops: its bytes and how many pending inputs still hold it."""

    nbytes: int
    refs: int = 0

    def __str__(self) -> str:
        return f"[{self.nbytes}, {self.refs}]"


@attrs.define(slots=True)
class OnceFrees:
    """Frees, in a repeated segment, of what the prologue made for every layer (rotary tables, masks): they happen
    once, in the last copy the walk reaches, not once per copy. The backward's (:attr:`Replay.once`) and the
    forward's (:attr:`Replay.forward_once`): a model whose layers are its forward's last code frees its mask in
    the last layer (BART's decoder has no norm after its layers, so the causal mask ``create_causal_mask`` made is
    a local of ``BartDecoder.forward`` that dies as the last layer returns: transformers 5.24
    models/bart/modeling_bart.py), once, not in every layer the repeated segment stands for."""

    on: bool = False
    """Counting (the backward has started)."""
    nbytes: int = 0
    parts: Parts = attrs.Factory(Parts)

    def reset(self) -> None:
        self.nbytes, self.parts = 0, Parts()


class Replay:
    """One replay of a finished :class:`Trace`: the forward's timeline (:meth:`forward`), what it leaves for the
    backward (:meth:`end_forward`), then the backward's timeline (:meth:`backward`), each instant's live bytes
    kept as points, and the :class:`StepTrace` they make (:meth:`result`).

    Live bytes are counted for one copy of each repeated segment (``live``, split into ``live_parts``); the
    other copies of a segment of weight ``w`` are counted arithmetically (``phantom``, ``phantom_parts``):
    saved bytes are additive and live bytes affine in the repetitions (module doc)."""

    def __init__(self, tr: Trace) -> None:
        self.tr = tr
        self.ops, self.size, self.nseg = tr.ops, tr.size, len(tr.seg_names)
        self.weight, self.ckpt = tr.seg_weight, tr.seg_ckpt
        self.alloc_seg: dict[int, int] = {}
        """Storage -> the segment that allocated it."""
        self.last_read: dict[int, int] = {}
        """Storage -> the index of the last op that reads (or allocates) it."""
        self._lifetimes()
        self.carried = {sid for sid, i in self.last_read.items()
                        if self.ops[i].seg != self.alloc_seg.get(sid, self.ops[i].seg)}
        """Storages read in a later segment than the one that allocated them (not repeated per copy)."""
        self.savers: dict[int, int] = {}
        """Storage -> how many live autograd nodes saved it."""
        self.keepers: dict[int, int] = {}
        """Storage -> how many checkpointed layers keep it (their arguments)."""
        self._holders()
        self.pinned = (set(tr.pinned) - tr.uncached) | {tr.loss.sid} | tr.leaves
        self.plan = offload.plan(tr)
        """Activation offloading's plan (:mod:`.offload`; None: no offloading)."""
        self.stash = offload.Stash(self.plan) if self.plan is not None else None
        """The forward stash of the streamed copies, and what the GPU holds while the forward runs."""
        self.alive: set[int] = set()
        self.live = 0
        self.phantom = 0
        self.live_parts = Parts()
        self.phantom_parts = Parts()
        self.part_of: dict[int, str] = {}
        """Storage -> its part (:data:`PARTS`) while alive."""
        self.first_part: dict[int, str] = {}
        """Storage -> the part its forward phantom copies were counted under."""
        self.once = OnceFrees()
        self.forward_once = OnceFrees()
        """The forward's frees of the prologue's tensors in the current segment's copy (:class:`OnceFrees`)."""
        # the forward
        self.seg = 0
        self.seg_start, self.seg_start_parts = 0, Parts()
        self.seg_max, self.seg_max_parts = 0, Parts()
        self.peak, self.peak_parts = 0, Parts()
        self.seg_delta: dict[int, int] = {}
        """Segment -> what one copy of it leaves alive (its live bytes at its end minus at its start)."""
        self.seg_delta_parts: dict[int, Parts] = {}
        self.before_last, self.before_last_parts = 0, Parts()
        self.stash_start: tuple[int, Parts] = (0, Parts())
        """What only the forward stash held when the current segment started (:meth:`stash_only`)."""
        self.forward_peak = 0
        self.retained = 0
        self.saved_by_kind = {"activation": 0, "logits": 0, "autocast": 0}
        self.labels: dict[str, int] = {}
        # the backward
        self.grads_live = 0
        self.grads_phantom = 0
        self.pending: dict[int, GradBuffer] = {}
        """Tensor key -> its gradient, waiting for the op that produced the tensor."""
        self.pending_param: dict[int, list[GradBuffer]] = {}
        """Parameter key -> its gradient contributions, waiting for its last use."""
        self.points: list[tuple[int, int, int]] = []
        """``(other bytes, parameter gradient bytes, the op's parameter gradient bytes)`` per backward instant."""
        self.layer_points: list[tuple[int, int, int]] = []
        self.point_parts: dict[int, tuple[int, int, int, int]] = {}
        """A point's other bytes -> its :data:`PARTS`."""
        self.seg_points: list[tuple[int, int, int]] = []
        self.seg_parts: list[Parts] = []
        self.seg_once: list[tuple[int, Parts]] = []
        self.after_head = (0, 0)
        self.unpacked = False
        """An offloaded tensor has been brought back (:meth:`bring_back`): the next node's hook empties the stash."""

    def run(self) -> StepTrace:
        """The step trace: forward, end of forward, backward."""
        if DEBUG is not None:
            DEBUG.append(("replay", self.tr.spec))
        self.forward()
        self.end_forward()
        self.backward()
        return self.result()

    def run_forward(self) -> ForwardTrace:
        """The forward's figures only (:class:`ForwardTrace`): forward and end of forward."""
        if DEBUG is not None:
            DEBUG.append(("replay forward", self.tr.spec))
        self.forward()
        self.end_forward()
        return ForwardTrace(**self.forward_fields())

    # ---- what holds a storage

    def _lifetimes(self) -> None:
        """Each storage's allocating segment and the last op that touches it (the recorded lifetimes)."""
        for i, op in enumerate(self.ops):
            for sid in op.allocs:
                self.alloc_seg.setdefault(sid, op.seg)
                self.last_read.setdefault(sid, i)
            for sid in op.reads:
                self.last_read[sid] = i

    def _holders(self) -> None:
        """What holds each storage from the start: the nodes that saved it (outside checkpointed segments, whose
        saves are counted when they are recomputed) and the checkpoints that keep it."""
        for op in self.ops:
            if not self.ckpt[op.seg]:
                for sid in op.saved:
                    self.savers[sid] = self.savers.get(sid, 0) + 1
        for sids in self.tr.ckpt_keep.values():
            for sid in sids:
                self.keepers[sid] = self.keepers.get(sid, 0) + 1

    def held(self, sid: int) -> bool:
        """Something keeps ``sid`` alive: an autograd node, a checkpoint, the end of the forward, or the caller.
        While the forward runs under activation offloading, an offloaded save or input holds nothing on the GPU
        (the forward stash may: :meth:`.offload.Stash.gpu_held`)."""
        if self.stash is not None and self.stash.forward:
            return (self.stash.gpu_held(sid, self.savers, self.keepers) or sid in self.pinned
                    or sid in self.tr.external)
        return (self.savers.get(sid, 0) > 0 or self.keepers.get(sid, 0) > 0 or sid in self.pinned
                or sid in self.tr.external)

    def alloc(self, sid: int) -> None:
        """``sid`` is allocated, under its part: the loss head's, autocast's, a saved (or kept) activation, or else
        a temporary."""
        self.alive.add(sid)
        self.live += self.size[sid]
        kind = self.tr.kind[sid]
        part = ("logits" if kind == "logits" else "autocast_copies" if kind == "autocast" else
                "activations" if self.savers.get(sid, 0) > 0 or self.keepers.get(sid, 0) > 0 else "temporaries")
        self.part_of[sid] = part
        self.first_part.setdefault(sid, part)
        self.live_parts.add(part, self.size[sid])

    def free(self, sid: int, cur_seg: int) -> None:
        """``sid`` goes, in segment ``cur_seg``: a storage another repeated segment allocated takes its copies'
        bytes with it (the phantom), and the prologue's go once (:class:`OnceFrees`)."""
        if sid not in self.alive:
            return
        n = self.size[sid]
        self.alive.discard(sid)
        self.live -= n
        self.live_parts.add(self.part_of[sid], -n)
        sg = self.alloc_seg.get(sid, cur_seg)
        if sg == 0 and cur_seg != 0 and self.weight[cur_seg] > 1:
            once = self.once if self.once.on else self.forward_once
            once.nbytes += n
            once.parts.add(self.part_of[sid], n)
        if sg != cur_seg and self.weight[sg] > 1 and sid not in self.carried:
            self.phantom -= (self.weight[sg] - 1) * n
            self.phantom_parts.add(self.first_part[sid], -(self.weight[sg] - 1) * n)

    # ---- the forward

    def forward(self) -> None:
        """Run the ops in order: allocate their outputs, record the peak, free what nothing holds any more."""
        self.seg_start_parts = self.live_parts.copy()
        for i, op in enumerate(self.ops):
            if op.seg != self.seg:
                self._forward_segment_ends(op.seg, i)
            for sid in op.allocs:
                if sid not in self.alive:
                    self.alloc(sid)
            # (the first copy of a repeated segment has not made its one-time frees: :meth:`_forward_segment_ends`)
            cur = self.live + self.phantom + self.forward_once.nbytes
            if cur > self.peak:
                self.peak, self.peak_parts = cur, self.live_parts + self.phantom_parts + self.forward_once.parts
            if self.live > self.seg_max:
                self.seg_max, self.seg_max_parts = self.live, self.live_parts.copy()
            if DEBUG is not None:
                DEBUG.append(("forward", op.name, cur))
            if self.stash is not None and i in self.plan.packs:
                self._pack(i)
            for sid in (*op.reads, *op.allocs):
                if self.last_read.get(sid, -1) <= i and not self.held(sid):
                    self.free(sid, self.seg)
            for sid in op.releases:
                self.pinned.discard(sid)
                if not self.held(sid):
                    self.free(sid, self.seg)

    def _pack(self, i: int) -> None:
        """Activation offloading's packs at op ``i``: into the forward stash; what leaves it (or, without streams,
        each offloaded tensor at once) goes when nothing else holds it."""
        for sid in self.stash.push(self.plan.packs[i]):
            if self.last_read.get(sid, -1) <= i and not self.held(sid):
                self.free(sid, self.seg)

    def stash_only(self, i: int) -> tuple[int, Parts, list[int]]:
        """The bytes (total, by part) and storages alive at op ``i`` only because the forward stash holds them."""
        stash = self.stash
        sids = [sid for sid in dict.fromkeys(stash.order) if sid in self.alive and self.last_read.get(sid, -1) < i
                and not (stash.gpu_held(sid, self.savers, self.keepers, False) or sid in self.pinned
                         or sid in self.tr.external)]
        parts = Parts()
        for sid in sids:
            parts.add(self.part_of[sid], self.size[sid])
        return sum(parts.astuple()), parts, sids

    def _forward_segment_ends(self, next_seg: int, i: int) -> None:
        """The segment ``self.seg`` ends (op ``i`` starts the next): its delta is kept and, when it stands for ``w``
        copies, the other ``w - 1`` copies' delta goes to the phantom (and their highest instant may be the peak).
        Under activation offloading, what only the forward stash holds leaves with the next copy's packs: it is
        not repeated."""
        seg, w = self.seg, self.weight[self.seg]
        # per copy: the delta without the one-time frees of the prologue's tensors (the last copy makes them)
        once, self.forward_once = self.forward_once, OnceFrees()
        self.seg_delta[seg] = self.live - self.seg_start + once.nbytes
        self.seg_delta_parts[seg] = self.live_parts - self.seg_start_parts + once.parts
        if next_seg == self.nseg - 2:  # the last layer segment starts (its last repetition, with the phantom)
            self.before_last = self.live + self.phantom
            self.before_last_parts = self.live_parts + self.phantom_parts
        if w > 1:
            delta, delta_parts = self.seg_delta[seg], self.seg_delta_parts[seg]
            if self.stash is not None:
                so, so_parts, sids = self.stash_only(i)
                delta -= so - self.stash_start[0]
                delta_parts = delta_parts - so_parts + self.stash_start[1]
                self.carried.update(sid for sid in sids if self.alloc_seg.get(sid) == seg)
            if self.ckpt[seg]:  # what outlives a checkpointed layer is its output: the next layer's kept input
                delta_parts = Parts(delta_parts.activations + delta_parts.temporaries, delta_parts.logits,
                                    delta_parts.autocast_copies, 0)
            if self.seg_max + max(0, (w - 1) * delta) > self.peak:
                self.peak = self.seg_max + max(0, (w - 1) * delta)
                self.peak_parts = self.seg_max_parts + delta_parts * ((w - 1) * (delta > 0))
            self.phantom += (w - 1) * delta
            self.phantom_parts = self.phantom_parts + delta_parts * (w - 1)
        self.seg, self.seg_start, self.seg_max = next_seg, self.live, 0
        self.seg_start_parts = self.live_parts.copy()
        if self.stash is not None:
            self.stash_start = self.stash_only(i)[:2]

    def end_forward(self) -> None:
        """The forward returns: what only the forward held goes (the caller keeps the loss, autograd the leaves);
        what is left is what the step retains for the backward, counted by kind and by label."""
        tr = self.tr
        self.forward_peak = self.peak
        self.pinned.clear()
        self.pinned.update({tr.loss.sid} | tr.leaves)
        for sid in list(self.alive):
            if not self.held(sid):
                self.free(sid, self.seg)
        self.pinned.clear()
        self.pinned.update(tr.leaves)
        if self.stash is not None:
            self.stash.forward = False
        self.retained = self.live + self.phantom - self.size[tr.loss.sid]
        for sid in self.alive:
            if sid == tr.loss.sid:
                continue
            sg = self.alloc_seg.get(sid, 0)
            n = self.size[sid] * (1 if sid in self.carried else self.weight[sg])
            self.saved_by_kind[tr.kind[sid]] += n
            key = f"{tr.seg_names[sg]}: {tr.label[sid]}"
            self.labels[key] = self.labels.get(key, 0) + n

    # ---- the backward: gradients

    def gbytes(self, t: T) -> int:
        """The bytes of ``t``'s gradient (rounded to the allocator's block on CUDA)."""
        n = t.nbytes
        return -(-n // self.tr.spec.block) * self.tr.spec.block if self.tr.rounding else n

    def release(self, buf: GradBuffer) -> None:
        """One holder lets ``buf`` go; the last frees it."""
        buf.refs -= 1
        if buf.refs == 0:
            self.live -= buf.nbytes

    def give(self, t: T, buf: GradBuffer | None) -> None:
        """``t`` receives a gradient: ``buf`` passed through, or a new tensor; a second gradient of ``t`` is
        added to the first out of place (``input_buffer.cpp``)."""
        self.accumulate(t, self.grad_out(t, buf))

    def grad_out(self, t: T, buf: GradBuffer | None) -> GradBuffer:
        """The gradient a node returns for ``t``: ``buf`` passed through, or a new tensor."""
        if buf is None or buf.nbytes != self.gbytes(t):
            buf = GradBuffer(self.gbytes(t))
            self.live += buf.nbytes
        buf.refs += 1
        return buf

    def accumulate(self, t: T, buf: GradBuffer) -> None:
        """``buf`` goes to ``t``'s input buffer, summed out of place with a gradient already waiting there."""
        old = self.pending.get(t.key)
        if old is None:
            self.pending[t.key] = buf
            return
        summed = GradBuffer(self.gbytes(t), 1)  # InputBuffer accumulation: old + new, out of place
        self.live += summed.nbytes
        self.point()
        self.release(old)
        self.release(buf)
        self.pending[t.key] = summed

    def param_grad(self, key: int, nbytes: int, buf: GradBuffer | None, last: bool, clone: bool) -> None:
        """A parameter's gradient contribution: summed with the earlier ones, and at its last use (its first in
        the forward) handed to AccumulateGrad, which steals the tensor (or clones it: ``clone``)."""
        if buf is None or buf.nbytes != nbytes:
            buf = GradBuffer(nbytes)
            self.live += nbytes
        buf.refs += 1
        parts = self.pending_param.setdefault(key, [])
        parts.append(buf)
        if len(parts) > 1:  # AccumulateGrad's input buffer adds each contribution as it comes, out of place
            summed = GradBuffer(nbytes, 1)
            self.live += nbytes
            self.point()
            for p in parts:
                self.release(p)
            parts[:] = [summed]
        if not last:
            return  # AccumulateGrad waits for the parameter's other uses (a tied embedding, a chunked LM head)
        del self.pending_param[key]
        b = parts[0]
        self.grads_live += nbytes
        if clone:
            self.point()
            self.release(b)
        else:  # AccumulateGrad steals the tensor: its bytes are the parameter's gradient now
            self.live -= b.nbytes
            b.nbytes = 0
            self.release(b)

    # ---- the backward: instants and segments

    def point(self, extra: int = 0, name: str = "", op_grad: int = 0) -> None:
        """Record this instant of the current segment's copy (``extra``: the running op's temporaries)."""
        self.seg_points.append((self.live + extra, self.grads_live, op_grad))
        self.seg_once.append((self.once.nbytes, self.once.parts.copy()))
        lp = self.live_parts
        self.seg_parts.append(Parts(lp.activations, lp.logits, lp.autocast_copies, self.live + extra - lp.saved()))
        if DEBUG is not None:
            DEBUG.append(("backward", name,
                          self.live + extra + self.grads_live + self.phantom + self.grads_phantom,
                          self.live, extra, self.grads_live,
                          tuple((self.tr.label[sid], self.size[sid], PARTS.index(self.part_of[sid]))
                                for sid in self.alive),
                          tuple(b.nbytes for b in self.pending.values())))

    def flush(self, sg: int, start: tuple[int, int], start_parts: Parts) -> None:
        """The backward leaves segment ``sg``: its instants become points, once per copy when it stands for
        ``w`` copies (the first copy's and the last's: the others lie between), and the other copies' delta goes
        to the phantom."""
        w = self.weight[sg]
        pa, pg, ph = self.phantom, self.grads_phantom, self.phantom_parts
        first = len(self.points)
        if w > 1:
            # per copy: the segment's delta without its one-time frees; the first copy has not made them yet,
            # the last copy makes them at the same instants
            da, dg = self.live - start[0] + self.once.nbytes, self.grads_live - start[1]
            dp = self.live_parts - start_parts + self.once.parts
            dp.temporaries = da - dp.saved()
            dpw = dp * (w - 1)
            points, point_parts = self.points, self.point_parts  # (a point's parts are made once, for a new key)
            for (a, g, o), pv, (e, ev) in zip(self.seg_points, self.seg_parts, self.seg_once):
                first_copy, last_copy = a + e + pa, a + pa + (w - 1) * da
                points.append((first_copy, g + pg, o))
                if first_copy not in point_parts:
                    point_parts[first_copy] = (pv + ph + ev).astuple()
                points.append((last_copy, g + pg + (w - 1) * dg, o))
                if last_copy not in point_parts:
                    point_parts[last_copy] = (pv + ph + dpw).astuple()
            self.phantom += (w - 1) * da
            self.phantom_parts = ph + dp * (w - 1)
            self.grads_phantom += (w - 1) * dg
        else:
            self.points.extend((a + pa, g + pg, o) for a, g, o in self.seg_points)
            point_parts = self.point_parts
            for (a, _, _), pv in zip(self.seg_points, self.seg_parts):
                if a + pa not in point_parts:
                    point_parts[a + pa] = (pv + ph).astuple()
        if 0 < sg < self.nseg - 1:
            self.layer_points.extend(self.points[first:])
        self.seg_points.clear()
        self.seg_parts.clear()
        self.seg_once.clear()
        self.once.reset()

    def recompute(self, sg: int, unit: int) -> None:
        """Non-reentrant checkpoint's recomputation (torch/utils/checkpoint.py, torch 2.13): the layer's forward
        runs again until it has packed as many saved tensors as the original forward, parameters included
        ("early stop": the pack hook raises ``_StopRecomputationError``). Tensors live as long as the model's
        Python code holds them (the recorded lifetimes, holds past the stop included) until the stop unwinds the
        layer's frames, which frees every recomputed tensor nothing saved. A tensor a later layer reads (ZAYA's
        router state, which the layer returns for the next one) is held by those frames up to the stop too: its
        recorded lifetime runs past the layer. Autograd packs an op's inputs before its kernel runs and its
        outputs after (torchgen ``gen_variable_type.py``): a last op saving only inputs stops before allocating
        its outputs. A dead op (:meth:`Trace.drop_dead_saves`: its node died with its outputs in the forward, with
        the holders of what it saved) packs toward the stop but keeps nothing: the pack hook stores a recomputed
        tensor only for a holder still alive (``_recomputation_hook.pack_hook``, ``weak_holders[recomp_idx]()`` is
        None), so its saves live as long as the recomputing code holds them."""
        seg_ops = [(i, op) for i, op in enumerate(self.ops) if op.seg == sg and op.unit == unit]  # one layer
        last_saving = max((k for k, (_, op) in enumerate(seg_ops) if op.saved or op.saves_param), default=-1)
        if last_saving < 0:
            return
        stop = seg_ops[last_saving][1]
        packs_output = any(sid in stop.allocs for sid in stop.saved)
        last_in = recomputed_lifetimes(seg_ops, self.last_read, len(self.ops), self.tr.pinned - self.tr.uncached)
        for i, op in seg_ops[:last_saving + 1]:
            for sid in () if op.dead else op.saved:
                self.savers[sid] = self.savers.get(sid, 0) + 1
        made: list[int] = []
        for i, op in seg_ops[:last_saving + 1 if packs_output else last_saving]:
            for sid in op.allocs:
                if sid not in self.alive:
                    self.alloc(sid)
                    made.append(sid)
            self.point()
            for sid in (*op.reads, *op.allocs):
                if last_in.get(sid, -1) <= i and self.alloc_seg.get(sid) == sg and not self.held(sid):
                    self.free(sid, sg)
        for sid in made:  # the stop: what only the layer's Python frames held goes
            if not self.held(sid):
                self.free(sid, sg)

    # ---- the backward: the walk

    def backward(self) -> None:
        """Run the ops in reverse: the loss's gradient first, each op's gradients, checkpointed layers
        recomputed when first unpacked, what each op saved released after its backward."""
        tr = self.tr
        self.once.on = True
        self.give(tr.loss, None)
        self.pending[tr.loss.key].refs += 1  # torch.autograd.backward holds the root's gradient until it returns
        seg = self.nseg - 1
        start, start_parts = (self.live, self.grads_live), self.live_parts.copy()
        entered: set[int] = set()
        unit = -1
        for i in range(len(self.ops) - 1, -1, -1):
            op = self.ops[i]
            if op.unit != unit:
                self._layer_backward_ends(seg, unit)
                unit = op.unit
            if op.seg != seg:
                self.flush(seg, start, start_parts)
                if seg == self.nseg - 1:
                    self.after_head = (self.live + self.phantom, self.grads_live + self.grads_phantom)
                seg = op.seg
                start, start_parts = (self.live, self.grads_live), self.live_parts.copy()
            self._backward_op(op, seg, entered)
        self.flush(seg, start, start_parts)
        if DEBUG is not None:
            DEBUG.append(("end", "alive: " + ", ".join(f"{tr.label[i]}={self.size[i]}" for i in sorted(self.alive)),
                          self.live))
            DEBUG.append(("end", "pending: " + ", ".join(str(b) for b in self.pending.values()), 0))

    def _layer_backward_ends(self, seg: int, unit: int) -> None:
        """A checkpointed layer's backward ends: the inputs its checkpoint kept go (an offloaded input too, when no
        node saved it: each layer brought back its own copy)."""
        if self.ckpt[seg] and unit in self.tr.ckpt_keep:
            for sid in self.tr.ckpt_keep[unit]:
                self.keepers[sid] -= 1
                if not self.held(sid) or self._offloaded_input(sid):
                    self.free(sid, seg)

    def _offloaded_input(self, sid: int) -> bool:
        """``sid`` is a checkpoint input activation offloading moved and nothing else holds on the GPU."""
        return (self.stash is not None and sid in self.plan.kept and self.savers.get(sid, 0) <= 0
                and sid not in self.pinned and sid not in self.tr.external)

    def bring_back(self, sids: list[int]) -> None:
        """Activation offloading's unpack: an offloaded tensor not in the forward stash is copied back (a new GPU
        allocation), held like any saved tensor from here on."""
        for sid in sids:
            self.unpacked = True
            if sid not in self.alive:
                self.alloc(sid)

    def _clear_stash(self, seg: int) -> None:
        """The first backward node that unpacked an offloaded tensor has run: its hook empties the forward stash,
        and what only the stash held goes."""
        stash = self.stash
        for sid in stash.clear():
            if not (stash.gpu_held(sid, self.savers, self.keepers, False) or sid in self.pinned
                    or sid in self.tr.external):
                self.free(sid, seg)

    def _backward_op(self, op: Op, seg: int, entered: set[int]) -> None:
        """One op's backward, when a gradient reaches it: its inputs' and parameters' gradients; then what it
        saved is released."""
        incoming = [self.pending.pop(t.key, None) for t in op.outs]
        bufs = [b for b in incoming if b is not None]
        if self.ckpt[seg] and op.unit not in entered and bufs and (op.saved or op.saves_param):
            # the first backward op of the layer that unpacks a saved tensor (a frozen weight too: the checkpoint's
            # pack hook wraps every saved tensor, torch/utils/checkpoint.py _checkpoint_hook) triggers the
            # recomputation; the layer's ops saving nothing (residual adds, views, LoRA's scaling) ran their
            # backward before it
            entered.add(op.unit)
            if self.stash is not None:  # its offloaded inputs come back first
                self.bring_back([sid for sid in self.tr.ckpt_keep.get(op.unit, ()) if sid in self.plan.kept])
            self.recompute(seg, op.unit)
        given: list[tuple[T, GradBuffer]] = []
        if bufs:
            if self.stash is not None and not self.ckpt[seg]:
                self.bring_back([sid for sid in op.saved if sid in self.plan.saved])
            # the engine (torch/csrc/autograd/engine.cpp ``evaluate_function``) calls the node, whose incoming
            # gradients are locals of ``call_function`` and go when it returns; only then does it add each returned
            # gradient to the input buffer of the node it goes to (input_buffer.cpp, out of place when one waits)
            given = [(t, self.grad_out(t, incoming[kind] if 0 <= kind < len(incoming) else None))
                     for t, kind in zip(op.grad_ins, op.grad_kinds)]
            made = 0
            for key, nb, kind, last in op.params:
                self.param_grad(key, nb, incoming[kind] if 0 <= kind < len(incoming) else None, last, op.clone_grad)
                made += nb if last else 0
            self.point(op.bwd_temp, op.name, made)
            if op.cast_temp:
                self._cast_instant(op, seg, made)
            for buf in bufs:
                self.release(buf)
        if not (bufs and op.cast_temp and self.ckpt[seg]):
            self._release_saved(op, seg)
        # then, after the engine's ``release_variables``, each returned gradient goes to the input buffer of the node
        # it feeds (engine.cpp ``evaluate_function``; input_buffer.cpp, out of place when one waits)
        for t, buf in given:
            self.accumulate(t, buf)
        if self.stash is not None and not self.stash.cleared and self.unpacked:
            self._clear_stash(seg)

    def _cast_instant(self, op: Op, seg: int, made: int) -> None:
        """The instant autograd's engine casts a gradient the node returned to its input's dtype
        (``validate_outputs``, torch/csrc/autograd/engine.cpp), after ``apply`` returned and before
        ``call_function`` frees the incoming gradients: a recomputed layer's unpacked saved tensors are gone
        (they were ``apply``'s locals: torch/utils/checkpoint.py ``unpack_hook`` hands them over), a plain node's
        stay until the engine's ``release_variables`` after it."""
        if self.ckpt[seg]:
            self._release_saved(op, seg)
        self.point(op.cast_temp, op.name, made)

    def _release_saved(self, op: Op, seg: int) -> None:
        """The node lets go of what it saved: a storage no other node or frame holds is freed (a dead op's
        recomputation saved nothing)."""
        for sid in () if op.dead else op.saved:
            self.savers[sid] = self.savers.get(sid, 0) - 1
            if not self.held(sid):
                self.free(sid, seg)

    # ---- the result

    def result(self) -> StepTrace:
        """The :class:`StepTrace` of the walked timelines (frontiers of the backward points, the forward's peak and
        what it retained, the last layer's share)."""
        points = self.points
        frontiers = dict(backward_frontier=_frontier([(a, g) for a, g, _ in points]),
                         backward_frontier_accumulating=_frontier([(a, o) for a, _, o in points]),
                         backward_frontier_layers=_frontier([(a, g) for a, g, _ in self.layer_points]),
                         backward_frontier_bucketed=_frontier([(a, o) for a, g, o in points if g > 0]))
        before_grads = max((a for a, g, _ in points if g == 0), default=0)
        return StepTrace(
            **self.forward_fields(),
            **frontiers,
            backward_before_grads=before_grads,
            backward_points=tuple(points),
            backward_after_head=(int(self.after_head[0]), int(self.after_head[1])),
            backward_parts=_frontier_parts(self.point_parts, frontiers.values(), before_grads),
        )

    def forward_fields(self) -> dict[str, Any]:
        """The :data:`FORWARD_FIELDS` once the forward has ended (:meth:`end_forward`): what it retained, by kind
        and label, its peak, the last layer's share, the offloading plan's bytes."""
        tr, weight, last_layer = self.tr, self.weight, self.nseg - 2
        layer_delta = self.seg_delta.get(last_layer, 0)
        layer_delta_parts = self.seg_delta_parts.get(last_layer, Parts())
        kinds = self.saved_by_kind
        return dict(
            saved=tuple(sorted(self.labels.items(), key=lambda kv: -kv[1])),
            retained_bytes=int(self.retained),
            activation_bytes=int(self.retained - kinds["logits"] - kinds["autocast"]),
            logits_bytes=int(kinds["logits"]),
            autocast_copy_bytes=int(kinds["autocast"]),
            forward_peak_bytes=int(self.forward_peak),
            param_grad_bytes=int(tr.param_grad_total),
            buffer_bytes=int(tr.buffer_bytes),
            layer_bytes=int(layer_delta),
            max_param_grad_bytes=max((op.param_grad for op in self.ops), default=0),
            loss_bytes=int(self.size[tr.loss.sid]),
            forward_before_last_layer_bytes=int(self.before_last + max(0, weight[last_layer] - 1) * layer_delta),
            forward_peak_parts=_nonnegative(self.peak_parts.astuple()),
            forward_before_last_layer_parts=(self.before_last_parts + layer_delta_parts
                                             * max(0, weight[last_layer] - 1)).astuple(),
            offload_host_bytes=self.plan.host_bytes if self.plan is not None else 0,
            offload_copy_bytes=self.plan.copy_bytes if self.plan is not None else 0,
        )


def _frontier_parts(parts: dict[int, tuple[int, int, int, int]], frontiers, before_grads: int) -> tuple:
    """The PARTS of the points on the frontiers only (the three of the peak's breakdown and DeepSpeed's bucketed
    backward's) and of the last point before the first gradient (what the peak's breakdown looks up)."""
    keep = {a for frontier in frontiers for a, _ in frontier}
    keep.add(before_grads)
    return tuple(sorted((a, _nonnegative(p)) for a, p in parts.items() if a in keep))


def _nonnegative(p) -> tuple[int, int, int, int]:
    """The split with no negative part. The phantom copies of repeated layers are split by the category a
    tensor had when it was allocated; a layer that keeps (or frees) tensors an earlier segment allocated in
    the other category can leave a negative kept-activations or transients part: it is folded into the
    other of the two (as for checkpointed layers). The sum is unchanged (the peak is exact; this is only
    its breakdown)."""
    a, lg, ac, t = (int(x) for x in p)
    if t < 0:
        a, t = a + t, 0
    if a < 0:
        a, t = 0, t + a
    return (a, lg, ac, t)


def _frontier(pairs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The pairs not dominated by another (for non-negative weights x, y the maximum of ``x·a + y·g`` is
    reached on these)."""
    out: list[tuple[int, int]] = []
    for a, g in sorted(set(pairs), reverse=True):  # by a, then g, decreasing (the pairs are distinct)
        if not out or g > out[-1][1]:
            out.append((a, g))
    return tuple(out)
