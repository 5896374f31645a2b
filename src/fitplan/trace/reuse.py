"""One recording of a scenario's forward, re-evaluated at every micro-batch and sequence length it applies to.

Recording a step (:func:`.step_trace.record_afresh`: the learned file's ops instantiated by
:class:`.learned_graph.Builder`) is about half of a never-seen shape's time on ``fitplan serve``, and a new
micro-batch × sequence length changes only the sizes in it whenever no decision the recording takes depends on
them. :func:`record` therefore records a scenario once with ``b`` and ``s`` symbolic (:mod:`.symbolic`: every
size remembers its expression, every decision is a guard), keeps that recording (a :class:`Template`) under the
scenario without its ``b`` and ``s``, and answers a later ``(b, s)`` by evaluating the template's expressions
there (:meth:`Template.at`): when every guard holds, the recording would be the same ops with these sizes, so the
trace is the template's ops with the evaluated sizes (new tensors and ops; the template is never changed); when
one fails (a chunked loss head whose chunk count changes, a ``b == 1`` branch), the scenario is recorded again
and that template kept too (:data:`PER_SCENARIO` of them). tests/test_trace_reuse.py compares re-evaluated
traces with fresh recordings field by field over models, setups and shapes.
"""

from __future__ import annotations

import operator
import threading
from typing import Any, Callable

import attrs

from fitplan.trace.symbolic import Sym, Tape, start

TEMPLATES_KEPT = 16
"""Scenarios (without ``b`` and ``s``) whose templates are kept in memory; the oldest is dropped first. A template
holds about 3,000 objects the garbage collector walks (a kept recording about 2,500): at most 48 are kept."""
PER_SCENARIO = 3
"""Templates kept per scenario (each recorded where the earlier ones' guards failed: a micro-batch of one is one)."""
_TEMPLATES: dict[Any, list[Template]] = {}
_LOCK = threading.Lock()
SEEN_KEPT = 1024
"""Scenarios (without ``b`` and ``s``) remembered as recorded once (:func:`record`)."""
_SEEN: dict[Any, tuple[Any, int]] = {}
"""Scenario -> the learned file it was last recorded from, and how many times it was recorded from it."""
PLAIN = 2
"""A scenario's recordings made plainly before its first template (:func:`record`)."""
STATS = {"plain": 0, "recorded": 0, "reused": 0, "again": 0}
"""How many traces were recorded plainly, recorded as new templates, re-evaluated from one, and handed out again
from :data:`_LAST` (tests, benches)."""
LAST_KEPT = 2
"""Re-evaluated recordings kept for the next ask of the same spec (:func:`record`)."""
_LAST: dict[Any, tuple[Any, Any]] = {}
"""Spec -> (the learned file, a re-evaluated recording no caller has changed): a scenario with gradient
checkpointing asks for its forward without it and then for the whole step, each the same recording (with
checkpointing on, :func:`.step_trace.build_sharing`), one right after the other."""
_SYM = Sym
_OP_GET: Any = None
"""``operator.attrgetter`` of every field of :class:`.step_trace.Op`, in order (set on first use: this module
imports nothing of :mod:`.step_trace`, which imports it)."""


def _is_sym(x: Any) -> bool:
    return isinstance(x, _SYM)


@attrs.define(eq=False)
class Template:
    """A recording made with symbolic ``b`` and ``s`` (:func:`.step_trace.record_afresh` of a spec holding
    them), the learned file it was made from, and where its symbolic values are (found once, by :func:`plan`)."""

    tape: Tape
    tr: Any
    learned: Any
    sized: list[int] = attrs.Factory(list)
    """The indices of the recording's storages whose size or raw size is symbolic."""
    tensors: list[Any] = attrs.Factory(list)
    """The tensors whose numel or shape is symbolic (each gets a new tensor per evaluation)."""
    ops: list[tuple[Any, int]] = attrs.Factory(list)
    """Each op and what in it is symbolic (:data:`OUTS`, ... bits; 0: nothing, the op is shared)."""
    unevaluated: str | None = None
    """Where a symbolic value sits that :func:`instantiate` does not evaluate (:func:`unevaluated`): then the
    template is never used."""

    def at(self, spec: Any) -> Any | None:
        """The recording of ``spec`` (this template's scenario at ``spec``'s ``b`` and ``s``): a new
        :class:`.step_trace.Trace`, or None when a guard does not hold there."""
        if self.unevaluated is not None:
            return None
        vals = self.tape.values(spec.batch, spec.seq)
        if vals is None:
            return None
        return instantiate(self, spec, vals)


OUTS, GRAD_INS, PARAMS, SCALARS, WORK = 1, 2, 4, 8, 16
"""What of an op :func:`instantiate` evaluates: its outputs, its gradient inputs (tensors with a symbolic size), its
parameters' gradient bytes, its ``param_grad``, ``bwd_temp`` and ``cast_temp``, its kernels' work."""


def plan(tpl: Template) -> None:
    """Find the template recording's symbolic values: storages, tensors, and per op what :func:`instantiate`
    evaluates."""
    tr = tpl.tr
    tpl.sized = [i for i, (x, y) in enumerate(zip(tr.size, tr.raw)) if _is_sym(x) or _is_sym(y)]
    seen: dict[int, Any] = {}

    def symbolic(t: Any) -> bool:
        if t is None:
            return False
        if id(t) not in seen:
            seen[id(t)] = t if _is_sym(t.numel) or (t.shape and any(_is_sym(d) for d in t.shape)) else None
        return seen[id(t)] is not None

    for op in tr.ops:
        what = ((OUTS if any([symbolic(t) for t in op.outs]) else 0)
                | (GRAD_INS if any([symbolic(t) for t in op.grad_ins]) else 0)
                | (PARAMS if any(_is_sym(p[1]) for p in op.params) else 0)
                | (SCALARS if _is_sym(op.param_grad) or _is_sym(op.bwd_temp) or _is_sym(op.cast_temp) else 0)
                | (WORK if op.work is not None and any(_is_sym(x) for ks in op.work for k in ks for x in k) else 0))
        tpl.ops.append((op, what))
    symbolic(tr.loss)
    tpl.tensors = [t for t in seen.values() if t is not None]
    tpl.unevaluated = unevaluated(tpl)


def unevaluated(tpl: Template) -> str | None:
    """Where in the template's recording a symbolic value sits that :func:`instantiate` would not evaluate (None:
    nowhere; else the template is not used, since what reads that value after the recording would read the
    template's number). Not walked: the spec, a view's ``base`` (read while recording only, by
    :mod:`.learned_segment`), ``param_outs`` (read for ``rg`` only), and what :func:`instantiate` evaluates."""
    tr = tpl.tr
    Op, T = (type(tr.ops[0]) if tr.ops else None), type(tr.loss)
    evaluated = {id(t) for t in tpl.tensors}
    seen: set[int] = set()

    def walk(x: Any, path: str) -> str | None:
        if type(x) is Sym:
            return path
        if type(x) in (int, float, str, bool, type(None)) or id(x) in seen:
            return None
        seen.add(id(x))
        if isinstance(x, (list, tuple, set, frozenset)):
            items: Any = enumerate(x)
        elif isinstance(x, dict):
            items = ((f"{k!r}", v) for pair in x.items() for k, v in (pair, (f"key {pair[0]!r}", pair[0])))
        elif type(x) is T:
            skip = {"base"} | ({"numel", "shape"} if id(x) in evaluated else set())
            items = ((f.name, getattr(x, f.name)) for f in attrs.fields(T) if f.name not in skip)
        elif type(x) is Op:
            items = ((f.name, getattr(x, f.name)) for f in attrs.fields(Op)
                     if f.name not in ("params", "param_grad", "bwd_temp", "cast_temp", "work"))
        elif hasattr(x, "__dict__"):
            items = vars(x).items()
        else:
            return None
        for k, v in items:
            found = walk(v, f"{path}.{k}")
            if found is not None:
                return found
        return None

    skipped = (tr.spec, tr.param_outs, tr.buffer_bytes, tr.size, tr.raw)  # (evaluated, or not read for sizes)
    for name, v in vars(tr).items():
        if any(v is x for x in skipped):
            continue
        found = walk(v, name)
        if found is not None:
            return found
    return None


def instantiate(tpl: Template, spec: Any, vals: list[Any]) -> Any:
    """The template's recording with every symbolic value evaluated (``vals``: the tape's nodes at ``spec``'s
    ``b`` and ``s``): the op list is new, and so is every op and tensor that holds a symbolic value; what nothing
    changes after a recording (labels, segments, storages' ids and kinds, parameters, the ops without a symbolic
    value, which :meth:`.step_trace.Trace.finish` copies before it changes one) is shared with the template."""
    global _OP_GET
    src = tpl.tr
    Op = type(src.ops[0]) if src.ops else None
    if _OP_GET is None and Op is not None:
        _OP_GET = operator.attrgetter(*[f.name for f in attrs.fields(Op)])
    tr = object.__new__(type(src))
    tr.__dict__.update(src.__dict__)
    tr.spec = spec
    size, raw = list(src.size), list(src.raw)
    for i in tpl.sized:
        x, y = size[i], raw[i]
        if _is_sym(x):
            size[i] = vals[x.n]
        if _is_sym(y):
            raw[i] = vals[y.n]
    tr.size, tr.raw = size, raw
    tr.buffer_bytes = _v(src.buffer_bytes, vals)
    memo = {id(t): _tensor(t, vals) for t in tpl.tensors}
    ops = []
    for op, what in tpl.ops:
        if not what:
            ops.append(op)
            continue
        new = Op(*_OP_GET(op))
        if what & OUTS:
            new.outs = tuple([memo.get(id(t), t) for t in op.outs])
        if what & GRAD_INS:
            new.grad_ins = tuple([memo.get(id(t), t) for t in op.grad_ins])
        if what & PARAMS:
            new.params = tuple([(k, _v(nb, vals), kind, last) for k, nb, kind, last in op.params])
        if what & SCALARS:
            new.param_grad, new.bwd_temp, new.cast_temp = (_v(op.param_grad, vals), _v(op.bwd_temp, vals),
                                                           _v(op.cast_temp, vals))
        if what & WORK:
            new.work = _work(op.work, vals)
        ops.append(new)
    tr.ops = ops
    tr.loss = memo.get(id(src.loss), src.loss)
    tr.shared_ops = True  # (the ops without a symbolic value are the template's)
    tr.reevaluated = True
    return tr


def _v(x: Any, vals: list[Any]) -> Any:
    return vals[x.n] if isinstance(x, _SYM) else x


def _tensor(t: Any, vals: list[Any]) -> Any:
    """A new tensor: ``t`` with its numel and shape evaluated (the replay keys gradients by a tensor's identity:
    one new tensor per template tensor)."""
    shape = t.shape
    return type(t)(t.sid, _v(t.numel, vals), t.dtype, t.rg, t.layout, t.param, t.base, t.name,
                   tuple([_v(d, vals) for d in shape]) if shape is not None else None, t.tie)


def _work(work: Any, vals: list[Any]) -> Any:
    return type(work)(*[tuple([type(k)(k[0], k[1], _v(k[2], vals), _v(k[3], vals), _v(k[4], vals)) for k in kernels])
                        for kernels in work])


def make(spec: Any, learned: Any, record_afresh: Callable[[Any], Any]) -> Template:
    """Record ``spec``'s scenario with symbolic ``b`` and ``s`` (``record_afresh``:
    :func:`.step_trace.record_afresh`)."""
    tape, b, s = start(spec.batch, spec.seq)
    tpl = Template(tape, record_afresh(attrs.evolve(spec, batch=b, seq=s)), learned)
    plan(tpl)
    return tpl


def record(spec: Any, record_afresh: Callable[[Any], Any]) -> Any:
    """The recorded forward of ``spec`` (what ``record_afresh``, :func:`.step_trace.record_afresh`, returns), from a
    kept template of its scenario where one applies at its ``b`` and ``s``. A scenario's first :data:`PLAIN`
    recordings are plain ones (a symbolic recording takes about two and a half times as long: a command that
    estimates one scenario, and its advice's micro-batch-1 variant, never pays for it); a later one, at a
    ``(b, s)`` no kept template applies to, makes a template and keeps it."""
    from fitplan.arch.archfile import load

    learned = load(spec.arch.model_type)
    with _LOCK:
        last = _LAST.get(spec)
    if last is not None and last[0] is learned:
        STATS["again"] += 1
        return handed_out(last[1])
    key = attrs.evolve(spec, batch=0, seq=0)
    with _LOCK:
        kept = [t for t in _TEMPLATES.get(key, ()) if t.learned is learned]
        was = _SEEN.pop(key, None)
        seen = was[1] + 1 if was is not None and was[0] is learned else 1
        _SEEN[key] = (learned, seen)
        while len(_SEEN) > SEEN_KEPT:
            del _SEEN[next(iter(_SEEN))]
    for tpl in kept:
        tr = tpl.at(spec)
        if tr is not None:
            STATS["reused"] += 1
            with _LOCK:
                _LAST[spec] = (learned, tr)
                while len(_LAST) > LAST_KEPT:
                    del _LAST[next(iter(_LAST))]
            return handed_out(tr)
    if seen <= PLAIN:
        STATS["plain"] += 1
        return record_afresh(spec)
    tpl = make(spec, learned, record_afresh)
    STATS["recorded"] += 1
    with _LOCK:
        got = _TEMPLATES.pop(key, [])
        _TEMPLATES[key] = ([tpl] + [t for t in got if t.learned is learned])[:PER_SCENARIO]
        while len(_TEMPLATES) > TEMPLATES_KEPT:
            del _TEMPLATES[next(iter(_TEMPLATES))]
    tr = tpl.at(spec)
    return tr if tr is not None else record_afresh(spec)  # (its own b and s hold every guard it wrote)


def handed_out(tr: Any) -> Any:
    """A copy of the re-evaluated recording ``tr`` for a caller to change: its own op list (the ops are shared,
    and :meth:`.step_trace.Trace.finish` copies one before changing it: ``shared_ops``), everything else shared
    (what :meth:`.step_trace.Trace.checkpointed` and ``finish`` change they replace, never change in place)."""
    new = object.__new__(type(tr))
    new.__dict__.update(tr.__dict__)
    new.ops = list(tr.ops)
    return new


def clear() -> None:
    """Forget every template, every scenario seen and the re-evaluated recordings kept (tests)."""
    with _LOCK:
        _LAST.clear()
        _TEMPLATES.clear()
        _SEEN.clear()
