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
  frees what the forward freed, the stop releases what the layer's frames held;
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
checkpointing settings (:func:`build_sharing`): the recording is about half of a trace's time.
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
        self.param_outs: dict[str, list[T]] = {}
        """Parameter name -> the outputs of the ops that read it (their ``rg`` is final once the forward is built)."""
        self.param_tensors: list[T] = []
        self.shared_ops = False
        """The :class:`Op` objects are shared with a checkpointing twin (:meth:`checkpointed`)."""
        """Every parameter tensor made for the recording (:meth:`param`), kept so that their ids stay unique."""

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
        """A parameter (or buffer) tensor, held by the trace for as long as it lives: a parameter's gradient is
        known by :attr:`T.key`, its ``id``, which must stay unique through the recording and the replay (a LoRA
        adapter that nothing else holds would otherwise leave its ``id`` to the next site's adapter, whose
        gradient and autocast copy would then be taken for its own)."""
        t = T(-1, numel, dtype, rg, param=True)
        self.param_tensors.append(t)
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
             params: list[tuple[T, int]], node: bool, *, bwd_temp: int = 0, work: Any = None) -> None:
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
                           saves_param=any(t is not None and t.sid < 0 for t in saved) if saved else False))

    def finish(self) -> None:
        """Drop what dead nodes saved (:meth:`drop_dead_saves`), mark each parameter's last use in the backward
        (its first in the forward): where its gradient is complete, and count the parameter gradient bytes
        (weighted by layer repetition)."""
        self.drop_dead_saves()
        first: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            for key, *_ in op.params:
                first.setdefault(key, i)
        total = 0
        for i, op in enumerate(self.ops):
            if not op.params:
                continue
            new = []
            for key, nb, kind, _ in op.params:
                last = first[key] == i
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

    def drop_dead_saves(self) -> None:
        """An autograd node lives as long as a tensor it produced or a node downstream of it: once the forward
        returns, only the loss's ancestors and the nodes of the tensors the caller still holds are alive, and a
        node that dies frees what it saved. A branch whose outputs lead nowhere differentiable (DeepSeek's group
        routing: ``topk`` values summed, then only a ``topk``'s indices used) saved its tensors for nothing, and
        they are freed when the model's code drops the branch's outputs. Walking the ops backward from the loss
        (an op is live when one of its outputs shares a storage with a gradient input of a live op, an
        over-approximation that keeps every in-place version's node), a dead op's saves are dropped, outside
        checkpointed segments (their recompute is modelled op by op)."""
        if self.loss is None:
            return
        live = {self.loss.sid} | (self.pinned - self.uncached)
        for i in range(len(self.ops) - 1, -1, -1):
            op = self.ops[i]
            if not op.outs:
                continue
            if any(t.sid in live for t in op.outs):
                live.update(t.sid for t in op.grad_ins if t.sid >= 0)
            elif op.saved and not self.seg_ckpt[op.seg]:
                self._own_op(i).saved = ()

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
TRACE_MODULES = ("trace/step_trace.py", "trace/learned_graph.py", "trace/learned_segment.py",
                 "trace/kernels.py", "trace/int8.py", "trace/op_work.py", "arch/archexpr.py", "arch/archfile.py", "arch/archformat.py",
                 "arch/learned_repeat.py", "trace/lora_targets.py", "trace/loss_heads.py", "trace/fused_head.py", "trace/score_head.py",
                 "trace/logits_head.py", "trace/offload.py", "inputs/precision.py", "inputs/files.py", "inputs/convert.py", "errors.py")
"""Every fitplan module that building a trace runs (tests/test_disk_cache.py checks the list against the
imports): their size and mtime are part of a kept trace's key."""
KEEP_TRACES = 4000
"""Kept traces on disk (about 15 KB each); beyond this the oldest half is removed."""


@functools.lru_cache(maxsize=512)
def build(spec: TraceSpec) -> StepTrace:
    """The step trace of ``spec``: kept on disk from an earlier run, else built (see the module doc), from the
    recording its checkpointing twin left when there is one (:func:`build_sharing`)."""
    import pickle
    from pathlib import Path

    from fitplan import diskcache
    from fitplan.arch.archfile import BUNDLED, user_dirs

    package = Path(__file__).resolve().parent.parent
    key = (TRACE_FORMAT, pickle.dumps(spec, protocol=4),
           diskcache.code_fingerprint(tuple(package / m for m in TRACE_MODULES), (*user_dirs(), BUNDLED)))
    name = diskcache.entry_name(spec.arch.model_type, key[1])
    trace = diskcache.load("traces", name, key)
    if not isinstance(trace, StepTrace):
        with gc_paused():
            trace = build_sharing(spec, key[2])
        diskcache.store("traces", name, key, trace, keep=KEEP_TRACES)
    return trace


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
    """The recorded forward of ``spec`` (:class:`.learned_graph.Builder`), not yet finished."""
    from fitplan.arch.archfile import load
    from fitplan.trace.learned_graph import Builder

    arch = spec.arch
    tr = Trace(spec)
    Builder(tr, load(arch.model_type), dict(arch.symbols)).run()
    return tr


def finished(tr: Trace) -> StepTrace:
    """The step trace of a recorded forward: :meth:`Trace.finish`, :func:`replay` and the time model's work."""
    tr.finish()
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


def build_sharing(spec: TraceSpec, fingerprint: str = "") -> StepTrace:
    """:func:`build_afresh`'s trace of ``spec``. A spec that :func:`shares_recording` is recorded with
    checkpointing on, and the recording is kept for its twin (the same spec, checkpointing the other way): the
    estimate of a scenario with checkpointing needs both traces (its activations without checkpointing are the
    reducer's input), and one without it asks for the checkpointed one in its advice. The twin then skips the
    recording (about half of a trace's time). ``fingerprint``: the code and learned files' (:func:`build`); a kept
    recording serves only while ``archfile.load`` still returns the learned file it was made from (a relearned
    file, ``fitplan learn-architecture``'s verification, clears that cache)."""
    from fitplan.arch.archfile import load

    with _RECORDINGS_LOCK:
        kept = _RECORDINGS.pop((spec, fingerprint), None)
    if kept is not None and kept[0] is load(spec.arch.model_type):
        return finished(kept[1])
    if not shares_recording(spec):
        return build_afresh(spec)
    af = load(spec.arch.model_type)
    tr = record(attrs.evolve(spec, checkpointing=True))
    twin = attrs.evolve(spec, checkpointing=not spec.checkpointing)
    with _RECORDINGS_LOCK:
        _RECORDINGS[(twin, fingerprint)] = (af, tr.checkpointed(twin, copy=True))
        while len(_RECORDINGS) > RECORDINGS_KEPT:
            del _RECORDINGS[next(iter(_RECORDINGS))]
    return finished(tr.checkpointed(spec, copy=False))


# --------------------------------------------------------------------------- replay: forward and backward timelines


def replay(tr: Trace) -> StepTrace:
    """Walk the recorded forward, then the backward, counting live bytes (see the module doc)."""
    ops, size, nseg = tr.ops, tr.size, len(tr.seg_names)
    if DEBUG is not None:
        DEBUG.append(("replay", tr.spec))
    weight, ckpt = tr.seg_weight, tr.seg_ckpt
    alloc_seg: dict[int, int] = {}
    last_read: dict[int, int] = {}
    for i, op in enumerate(ops):
        for sid in op.allocs:
            alloc_seg.setdefault(sid, op.seg)
            last_read.setdefault(sid, i)
        for sid in op.reads:
            last_read[sid] = i
    carried = {sid for sid, i in last_read.items() if ops[i].seg != alloc_seg.get(sid, ops[i].seg)}
    savers: dict[int, int] = {}
    for op in ops:
        if not ckpt[op.seg]:
            for sid in op.saved:
                savers[sid] = savers.get(sid, 0) + 1
    keepers: dict[int, int] = {}
    for sids in tr.ckpt_keep.values():
        for sid in sids:
            keepers[sid] = keepers.get(sid, 0) + 1
    pinned = (set(tr.pinned) - tr.uncached) | {tr.loss.sid} | tr.leaves
    plan = offload.plan(tr)
    stash = offload.Stash(plan) if plan is not None else None  # activation offloading (trace/offload.py)
    alive: set[int] = set()
    state = {"live": 0, "phantom": 0}
    # live and phantom bytes by category (PARTS: saved activations, logits/loss, autocast copies, temporaries)
    cat_of: dict[int, int] = {}
    first_cat: dict[int, int] = {}
    live_v, ph_v = [0, 0, 0, 0], [0, 0, 0, 0]

    def alloc(sid: int) -> None:
        alive.add(sid)
        state["live"] += size[sid]
        k = tr.kind[sid]
        c = 1 if k == "logits" else 2 if k == "autocast" else 0 if savers.get(sid, 0) > 0 or keepers.get(sid, 0) > 0 else 3
        cat_of[sid] = c
        first_cat.setdefault(sid, c)  # the category its forward phantom copies were counted under
        live_v[c] += size[sid]

    def held(sid: int) -> bool:
        if stash is not None and stash.forward:
            return stash.gpu_held(sid, savers, keepers) or sid in pinned or sid in tr.external
        return savers.get(sid, 0) > 0 or keepers.get(sid, 0) > 0 or sid in pinned or sid in tr.external

    once = {"bytes": 0, "v": [0, 0, 0, 0], "on": False}
    """Backward frees, in a repeated segment, of what the prologue made for every layer (rotary tables,
    masks): they happen once, in the last copy the backward reaches, not once per copy."""

    def free(sid: int, cur_seg: int) -> None:
        if sid not in alive:
            return
        alive.discard(sid)
        state["live"] -= size[sid]
        live_v[cat_of[sid]] -= size[sid]
        sg = alloc_seg.get(sid, cur_seg)
        if once["on"] and sg == 0 and cur_seg != 0 and weight[cur_seg] > 1:
            once["bytes"] += size[sid]
            once["v"][cat_of[sid]] += size[sid]
        if sg != cur_seg and weight[sg] > 1 and sid not in carried:
            state["phantom"] -= (weight[sg] - 1) * size[sid]
            ph_v[first_cat[sid]] -= (weight[sg] - 1) * size[sid]

    # ---- forward
    seg_delta: dict[int, int] = {}
    seg_delta_v: dict[int, list[int]] = {}
    before_last, before_last_v = 0, [0, 0, 0, 0]
    peak, peak_v = 0, [0, 0, 0, 0]
    seg, seg_start, seg_max = 0, 0, 0
    seg_start_v, seg_max_v = list(live_v), [0, 0, 0, 0]
    so_start: tuple[int, list[int]] = (0, [0, 0, 0, 0])

    def stash_only(i: int) -> tuple[int, list[int], list[int]]:
        """The bytes (total, by part) and storages alive only because the forward stash holds them at op ``i``."""
        sids = [sid for sid in dict.fromkeys(stash.order) if sid in alive and last_read.get(sid, -1) < i
                and not (stash.gpu_held(sid, savers, keepers, False) or sid in pinned or sid in tr.external)]
        v = [0, 0, 0, 0]
        for sid in sids:
            v[cat_of[sid]] += size[sid]
        return sum(v), v, sids
    for i, op in enumerate(ops):
        if op.seg != seg:
            seg_delta[seg] = state["live"] - seg_start
            seg_delta_v[seg] = [a - b for a, b in zip(live_v, seg_start_v)]
            if op.seg == nseg - 2:  # the last layer segment starts (its last repetition, with the phantom)
                before_last = state["live"] + state["phantom"]
                before_last_v = [a + b for a, b in zip(live_v, ph_v)]
            if weight[seg] > 1:
                delta = state["live"] - seg_start
                delta_v = [a - b for a, b in zip(live_v, seg_start_v)]
                if stash is not None:  # what only the stash holds leaves with the next copy's packs: not repeated
                    so, so_v, sids = stash_only(i)
                    delta -= so - so_start[0]
                    delta_v = [d - a + b for d, a, b in zip(delta_v, so_v, so_start[1])]
                    carried.update(sid for sid in sids if alloc_seg.get(sid) == seg)
                if ckpt[seg]:  # what outlives a checkpointed layer is its output: the next layer's kept input
                    delta_v = [delta_v[0] + delta_v[3], delta_v[1], delta_v[2], 0]
                if seg_max + max(0, (weight[seg] - 1) * delta) > peak:
                    peak = seg_max + max(0, (weight[seg] - 1) * delta)
                    peak_v = [m + (weight[seg] - 1) * d * (delta > 0) for m, d in zip(seg_max_v, delta_v)]
                state["phantom"] += (weight[seg] - 1) * delta
                ph_v = [p + (weight[seg] - 1) * d for p, d in zip(ph_v, delta_v)]
            seg, seg_start, seg_max = op.seg, state["live"], 0
            seg_start_v = list(live_v)
            so_start = stash_only(i)[:2] if stash is not None else (0, [])
        for sid in op.allocs:
            if sid not in alive:
                alloc(sid)
        cur = state["live"] + state["phantom"]
        if cur > peak:
            peak, peak_v = cur, [a + b for a, b in zip(live_v, ph_v)]
        if state["live"] > seg_max:
            seg_max, seg_max_v = state["live"], list(live_v)
        if DEBUG is not None:
            DEBUG.append(("forward", op.name, cur))
        for sid in stash.push(plan.packs[i]) if stash is not None and i in plan.packs else ():
            if last_read.get(sid, -1) <= i and not held(sid):
                free(sid, seg)
        for sid in (*op.reads, *op.allocs):
            if last_read.get(sid, -1) <= i and not held(sid):
                free(sid, seg)
        for sid in op.releases:
            pinned.discard(sid)
            if not held(sid):
                free(sid, seg)
    forward_peak = peak
    pinned.clear()
    pinned.update({tr.loss.sid} | tr.leaves)  # the caller holds the loss, autograd the leaves
    for sid in list(alive):
        if not held(sid):
            free(sid, seg)
    pinned.clear()
    pinned.update(tr.leaves)
    if stash is not None:
        stash.forward = False
    retained_total = state["live"] + state["phantom"] - size[tr.loss.sid]
    saved_by_kind = {"activation": 0, "logits": 0, "autocast": 0}
    labels: dict[str, int] = {}
    for sid in alive:
        if sid == tr.loss.sid:
            continue
        sg = alloc_seg.get(sid, 0)
        n = size[sid] * (1 if sid in carried else weight[sg])
        saved_by_kind[tr.kind[sid]] += n
        key = f"{tr.seg_names[sg]}: {tr.label[sid]}"
        labels[key] = labels.get(key, 0) + n

    # ---- backward
    points: list[tuple[int, int, int]] = []
    layer_points: list[tuple[int, int, int]] = []
    grads = {"live": 0, "phantom": 0}
    pending: dict[int, list[int]] = {}  # id(T) -> [bytes, refs]
    pending_param: dict[int, list[list[int]]] = {}

    def gbytes(t: T) -> int:
        n = t.nbytes
        return -(-n // tr.spec.block) * tr.spec.block if tr.rounding else n

    def release(buf: list[int]) -> None:
        buf[1] -= 1
        if buf[1] == 0:
            state["live"] -= buf[0]

    def give(t: T, buf: list[int] | None) -> None:
        if buf is None or buf[0] != gbytes(t):
            buf = [gbytes(t), 0]
            state["live"] += buf[0]
        buf[1] += 1
        old = pending.get(t.key)
        if old is None:
            pending[t.key] = buf
            return
        summed = [gbytes(t), 1]  # InputBuffer accumulation: old + new, out of place
        state["live"] += summed[0]
        point()
        release(old)
        release(buf)
        pending[t.key] = summed

    def param_grad(key: int, nbytes: int, buf: list[int] | None, last: bool, clone: bool) -> None:
        if buf is None or buf[0] != nbytes:
            buf = [nbytes, 0]
            state["live"] += nbytes
        buf[1] += 1
        parts = pending_param.setdefault(key, [])
        parts.append(buf)
        if len(parts) > 1:  # AccumulateGrad's input buffer adds each contribution as it comes, out of place
            summed = [nbytes, 1]
            state["live"] += nbytes
            point()
            for p in parts:
                release(p)
            parts[:] = [summed]
        if not last:
            return  # AccumulateGrad waits for the parameter's other uses (a tied embedding, a chunked LM head)
        del pending_param[key]
        b = parts[0]
        grads["live"] += nbytes
        if clone:
            point()
            release(b)
        else:  # AccumulateGrad steals the tensor: its bytes are the parameter's gradient now
            state["live"] -= b[0]
            b[0] = 0
            release(b)

    seg_points: list[tuple[int, int, int]] = []
    seg_parts: list[list[int]] = []
    parts: dict[int, tuple[int, int, int, int]] = {}  # a point's other bytes -> its PARTS

    seg_once: list[tuple[int, list[int]]] = []

    def point(extra: int = 0, name: str = "", op_grad: int = 0) -> None:
        seg_points.append((state["live"] + extra, grads["live"], op_grad))
        seg_once.append((once["bytes"], list(once["v"])))
        saved = live_v[0] + live_v[1] + live_v[2]
        seg_parts.append([live_v[0], live_v[1], live_v[2], state["live"] + extra - saved])
        if DEBUG is not None:
            DEBUG.append(("backward", name, state["live"] + extra + grads["live"] + state["phantom"] + grads["phantom"],
                          state["live"], extra, grads["live"],
                          tuple((tr.label[sid], size[sid], cat_of[sid]) for sid in alive),
                          tuple(b[0] for b in pending.values())))

    def flush(sg: int, start: tuple[int, int], start_v: list[int]) -> None:
        nonlocal ph_v
        w = weight[sg]
        pa, pg = state["phantom"], grads["phantom"]
        first = len(points)
        if w > 1:
            # per copy: the segment's delta without its one-time frees; the first copy has not made them yet,
            # the last copy makes them at the same instants
            da, dg = state["live"] - start[0] + once["bytes"], grads["live"] - start[1]
            da_v = [live_v[i] - start_v[i] + once["v"][i] for i in range(3)]
            da_v.append(da - sum(da_v))
            for (a, g, o), pv, (e, ev) in zip(seg_points, seg_parts, seg_once):
                points.append((a + e + pa, g + pg, o))
                parts.setdefault(a + e + pa, tuple(x + y + z for x, y, z in zip(pv, ph_v, ev)))
                points.append((a + pa + (w - 1) * da, g + pg + (w - 1) * dg, o))
                parts.setdefault(a + pa + (w - 1) * da, tuple(x + y + (w - 1) * d for x, y, d in zip(pv, ph_v, da_v)))
            state["phantom"] += (w - 1) * da
            ph_v = [p + (w - 1) * d for p, d in zip(ph_v, da_v)]
            grads["phantom"] += (w - 1) * dg
        else:
            points.extend((a + pa, g + pg, o) for a, g, o in seg_points)
            for (a, _, _), pv in zip(seg_points, seg_parts):
                parts.setdefault(a + pa, tuple(x + y for x, y in zip(pv, ph_v)))
        if 0 < sg < nseg - 1:
            layer_points.extend(points[first:])
        seg_points.clear()
        seg_parts.clear()
        seg_once.clear()
        once["bytes"], once["v"] = 0, [0, 0, 0, 0]

    def recompute(sg: int, unit: int) -> None:
        """Non-reentrant checkpoint's recomputation (torch/utils/checkpoint.py, torch 2.13): the layer's forward
        runs again until it has packed as many saved tensors as the original forward, parameters included
        ("early stop": the pack hook raises ``_StopRecomputationError``). Tensors live as long as the model's Python code holds them
        (the recorded lifetimes, holds past the stop included) until the stop unwinds the layer's frames,
        which frees every recomputed tensor nothing saved. Autograd packs an op's inputs before its kernel
        runs and its outputs after (torchgen ``gen_variable_type.py``): a last op saving only inputs stops
        before allocating its outputs."""
        seg_ops = [(i, op) for i, op in enumerate(ops) if op.seg == sg and op.unit == unit]  # one layer's checkpoint
        last_saving = max((k for k, (_, op) in enumerate(seg_ops) if op.saved or op.saves_param), default=-1)
        if last_saving < 0:
            return
        stop = seg_ops[last_saving][1]
        packs_output = any(sid in stop.allocs for sid in stop.saved)
        last_in: dict[int, int] = {}
        for i, op in seg_ops:
            for sid in (*op.reads, *op.allocs):
                last_in[sid] = i
        for i, op in seg_ops[:last_saving + 1]:
            for sid in op.saved:
                savers[sid] = savers.get(sid, 0) + 1
        made: list[int] = []
        for i, op in seg_ops[:last_saving + 1 if packs_output else last_saving]:
            for sid in op.allocs:
                if sid not in alive:
                    alloc(sid)
                    made.append(sid)
            point()
            for sid in (*op.reads, *op.allocs):
                if last_in.get(sid, -1) <= i and alloc_seg.get(sid) == sg and not held(sid):
                    free(sid, sg)
        for sid in made:  # the stop: what only the layer's Python frames held goes
            if not held(sid):
                free(sid, sg)

    def before_sum(op: Op, incoming: list) -> None:
        """An op whose backward holds temporaries (``bwd_temp``) returns its gradients before autograd adds them to
        the gradients already waiting for the same tensors (torch/csrc/autograd/input_buffer.cpp accumulates
        after the node returns): at its peak its temporaries, the gradients it made and the waiting ones are all
        alive. :func:`give` sums at once, so that instant is recorded here, when a sum follows (RMSNorm's
        ``pow`` backward: its two temporaries beside the other branch's gradient of the same input)."""
        new = 0
        summed = False
        for t, kind in zip(op.grad_ins, op.grad_kinds):
            buf = incoming[kind] if 0 <= kind < len(incoming) else None
            if buf is None or buf[0] != gbytes(t):
                new += gbytes(t)
            summed = summed or t.key in pending
        if summed:
            point(op.bwd_temp + new, op.name)

    unpacked = {"any": False}

    def bring_back(sids: list[int]) -> None:
        """Activation offloading's unpack: an offloaded tensor not in the forward stash is copied back (a new GPU
        allocation), held like any saved tensor from here on."""
        for sid in sids:
            unpacked["any"] = True
            if sid not in alive:
                alloc(sid)

    after_head = (0, 0)
    once["on"] = True
    loss = tr.loss
    give(loss, None)
    pending[loss.key][1] += 1  # torch.autograd.backward holds the root's gradient (ones_like) until it returns
    seg = nseg - 1
    seg_start = (state["live"], grads["live"])
    seg_start_v = list(live_v)
    entered: set[int] = set()
    unit = -1
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.unit != unit:
            if ckpt[seg] and unit in tr.ckpt_keep:  # the layer's checkpoint backward ends: its inputs go
                for sid in tr.ckpt_keep[unit]:
                    keepers[sid] -= 1
                    if not held(sid) or (stash is not None and sid in plan.kept and savers.get(sid, 0) <= 0
                                         and sid not in pinned and sid not in tr.external):
                        free(sid, seg)  # (an offloaded input: each layer brings back its own copy)
            unit = op.unit
        if op.seg != seg:
            flush(seg, seg_start, seg_start_v)
            if seg == nseg - 1:
                after_head = (state["live"] + state["phantom"], grads["live"] + grads["phantom"])
            seg = op.seg
            seg_start = (state["live"], grads["live"])
            seg_start_v = list(live_v)
        incoming = [pending.pop(t.key, None) for t in op.outs]
        bufs = [b for b in incoming if b is not None]
        if ckpt[seg] and op.unit not in entered and bufs and (op.saved or op.saves_param):
            # the first backward op of the layer that unpacks a saved tensor (a frozen weight too: the checkpoint's
            # pack hook wraps every saved tensor, torch/utils/checkpoint.py _checkpoint_hook) triggers the
            # recomputation; the
            # layer's ops saving nothing (residual adds, views, LoRA's scaling) ran their backward before it
            entered.add(op.unit)
            if stash is not None:  # its offloaded inputs come back first
                bring_back([sid for sid in tr.ckpt_keep.get(op.unit, ()) if sid in plan.kept])
            recompute(seg, op.unit)
        if bufs:
            if stash is not None and not ckpt[seg]:
                bring_back([sid for sid in op.saved if sid in plan.saved])
            if op.bwd_temp > 0:
                before_sum(op, incoming)
            for t, kind in zip(op.grad_ins, op.grad_kinds):
                give(t, incoming[kind] if 0 <= kind < len(incoming) else None)
            made = 0
            for key, nb, kind, last in op.params:
                param_grad(key, nb, incoming[kind] if 0 <= kind < len(incoming) else None, last, op.clone_grad)
                made += nb if last else 0
            point(op.bwd_temp, op.name, made)
            for buf in bufs:
                release(buf)
        for sid in op.saved:
            savers[sid] = savers.get(sid, 0) - 1
            if not held(sid):
                free(sid, seg)
        if stash is not None and not stash.cleared and unpacked["any"]:  # its node hook empties the forward stash:
            for sid in stash.clear():  # an offloaded tensor comes back from the host when its node runs
                if not (stash.gpu_held(sid, savers, keepers, False) or sid in pinned or sid in tr.external):
                    free(sid, seg)
    flush(seg, seg_start, seg_start_v)
    if DEBUG is not None:
        DEBUG.append(("end", "alive: " + ", ".join(f"{tr.label[i]}={size[i]}" for i in sorted(alive)), state["live"]))
        DEBUG.append(("end", "pending: " + ", ".join(str(b) for b in pending.values()), 0))
    return StepTrace(
        saved=tuple(sorted(labels.items(), key=lambda kv: -kv[1])),
        backward_frontier=_frontier([(a, g) for a, g, _ in points]),
        backward_frontier_accumulating=_frontier([(a, o) for a, _, o in points]),
        backward_frontier_layers=_frontier([(a, g) for a, g, _ in layer_points]),
        backward_before_grads=max((a for a, g, _ in points if g == 0), default=0),
        backward_frontier_bucketed=_frontier([(a, o) for a, g, o in points if g > 0]),
        retained_bytes=int(retained_total),
        activation_bytes=int(retained_total - saved_by_kind["logits"] - saved_by_kind["autocast"]),
        logits_bytes=int(saved_by_kind["logits"]),
        autocast_copy_bytes=int(saved_by_kind["autocast"]),
        forward_peak_bytes=int(forward_peak),
        backward_points=tuple(points),
        param_grad_bytes=int(tr.param_grad_total),
        buffer_bytes=int(tr.buffer_bytes),
        layer_bytes=int(seg_delta.get(nseg - 2, 0)),
        max_param_grad_bytes=max((op.param_grad for op in ops), default=0),
        loss_bytes=int(size[tr.loss.sid]),
        backward_after_head=(int(after_head[0]), int(after_head[1])),
        forward_before_last_layer_bytes=int(before_last + max(0, weight[nseg - 2] - 1) * seg_delta.get(nseg - 2, 0)),
        forward_peak_parts=_nonnegative(peak_v),
        forward_before_last_layer_parts=tuple(int(b + max(0, weight[nseg - 2] - 1) * d) for b, d in
                                              zip(before_last_v, seg_delta_v.get(nseg - 2, [0, 0, 0, 0]))),
        backward_parts=_frontier_parts(parts, points, layer_points),
        offload_host_bytes=plan.host_bytes if plan is not None else 0,
        offload_copy_bytes=plan.copy_bytes if plan is not None else 0,
    )


def _frontier_parts(parts: dict[int, tuple[int, int, int, int]], points: list, layer_points: list) -> tuple:
    """The PARTS of the points on the three frontiers only (what the peak's breakdown looks up)."""
    keep = {a for a, _ in _frontier([(a, g) for a, g, _ in points])}
    keep |= {a for a, _ in _frontier([(a, o) for a, _, o in points])}
    keep |= {a for a, _ in _frontier([(a, g) for a, g, _ in layer_points])}
    keep |= {a for a, _ in _frontier([(a, o) for a, g, o in points if g > 0])}  # DeepSpeed's bucketed backward
    keep.add(max((a for a, g, _ in points if g == 0), default=0))
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
    for a, g in sorted(set(pairs), key=lambda p: (-p[0], -p[1])):
        if not out or g > out[-1][1]:
            out.append((a, g))
    return tuple(out)
