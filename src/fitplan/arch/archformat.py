"""Format 2 of the learned architecture files: every row a named object on a line of its own.

The reader (:mod:`.archfile`) and the trace that replays a file work on the in-memory layout the learner
produces: positional lists (a parameter entry is ``[name, shape, role, layer_kinds, when, dtype]``, a tensor
``[shape, dtype, base]``, an op ``[name, [[arg, ref], ...], outs, extra]``). On disk those rows are objects
with named fields, one per line, so that relearning a model type changes its files op by op in ``git diff``
(docs/architectures.md, "File format"). This module converts between the two, both ways, losslessly:

* :func:`decode` structures a file's rows through fitplan's cattrs converter
  (:func:`fitplan.inputs.convert.structure`: unknown keys and wrong types are errors naming the file and the
  ``$.path`` of the row) and returns the in-memory layout;
* :func:`encode` turns the in-memory layout into the file's objects, :func:`dumps` lays them out one row a
  line (deterministic: the same data gives the same bytes).

Format 1 (the same rows as positional lists, one minified line for the graphs) is refused by the reader;
``python -m fitplan_torch.learn.reformat FILES`` rewrites such files as format 2.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

FORMAT = 2
REFORMAT = "python -m fitplan_torch.learn.reformat"
"""The command that rewrites format-1 files (fitplan-torch's ``learn/reformat.py``)."""


# --------------------------------------------------------------------------- rows of the header file


@attrs.frozen
class ParamRow:
    """A parameter tensor (``params``): its name (``{i}`` for the layer index), its shape (one size expression
    per dimension), its role (``embedding``, ``output``, ``linear:<module>``, ...), the layer kinds that hold
    it (null: it is outside the decoder layers), the switch condition under which it exists, its dtype code,
    and ``linear`` for a Linear that is not ``nn.Linear`` (``conv1d``: GPT-2's ``Conv1D``; ``custom``: a
    subclass, which peft adapts and bitsandbytes leaves in 16 bits)."""

    name: str
    shape: list[str]
    role: str
    layer_kinds: list[str] | None
    when: str | None
    dtype: str
    linear: str | None = None


@attrs.frozen
class BufferRow:
    """A registered buffer (``buffers``): name, shape, dtype code, whether it belongs to the decoder layers, and the
    layer kinds that hold it (null: every layer, as files written before this field say; MiniMax's lightning
    attention buffers are in its linear-attention layers only)."""

    name: str
    shape: list[str]
    dtype: str
    per_layer: bool
    layer_kinds: list[str] | None = None


@attrs.frozen
class TiedRow:
    """A parameter that is another's tensor (``tied``) when ``when`` holds (null: always)."""

    name: str
    target: str
    when: str | None


@attrs.frozen
class CheckRow:
    """A validity check of the config class (``config.checks``): the expression, the field it names, the
    message."""

    expr: str
    field: str
    message: str


# --------------------------------------------------------------------------- rows of the graphs file


@attrs.frozen
class TensorRow:
    """A tensor an op returns (``segments.<id>.tensors``): ``id`` is ``t<index>``, the name ops use;
    ``base`` is the tensor whose storage it views (null: a storage of its own; ``const``: a constant the
    model keeps)."""

    id: str
    shape: list[str]
    dtype: str
    base: str | None


@attrs.frozen
class OpRow:
    """An aten op (``segments.<id>.ops``): its name, its tensor arguments by name (a reference, or a list of
    them), the tensors it returns, and what else the learner recorded (``extra``: on disk, the row's other
    keys, e.g. ``g`` the requires-grad pattern, ``sc`` its scalar arguments, ``pseudo`` a fused kernel)."""

    op: str
    args: dict[str, Any]
    out: list[str]
    extra: dict[str, Any] = attrs.Factory(dict)


@attrs.frozen
class RepeatRow:
    """A block of ops run once per head (``segments.<id>.rep``, docs/architectures.md "Repeated blocks"): ops
    ``first`` .. ``first + len - 1`` are one repetition, run ``n`` times (an expression over the config's
    symbols); ``each`` the tensors that exist once per repetition; ``carry`` (a loop over the sequence that carries
    its state, Mamba's reference scan) ``{X: Y}``: in repetition ``r >= 1`` the body's ``X`` is repetition ``r - 1``'s
    ``Y`` (absent: the repetitions are independent)."""

    n: str
    first: int
    len: int
    each: list[str]
    carry: dict[str, str] = attrs.Factory(dict)


@attrs.frozen
class SegmentRows:
    """A recorded segment (the prologue, a decoder layer, the epilogue)."""

    args: list[Any]
    tensors: list[TensorRow]
    ops: list[OpRow]
    die: dict[str, Any]
    sites: list[dict[str, Any]] | None = None
    out: str | None = None
    loss: str | None = None
    logits_from: int | None = None
    embed_out: str | None = None
    rep: list[RepeatRow] | None = None


_SEGMENT_KEYS = ("t", "ops", "args", "die", "out", "sites", "loss", "logits_from", "embed_out", "rep")
"""The in-memory segment's keys, in the learner's order (:func:`decode` writes them back in this order)."""
_OP_KEYS = frozenset(("op", "in", "out"))


def converter() -> Any:
    """fitplan's cattrs converter (:data:`fitplan.inputs.convert.CONVERTER`: unknown keys are errors) with this
    module's row hooks registered: hand-written, they check what the generated ones would (the keys, each
    field's type) without generating code on first use, which a command that reads one file would pay for."""
    from fitplan.inputs.convert import CONVERTER

    if not getattr(converter, "ready", False):
        for cls, checks in _ROW_CHECKS.items():
            CONVERTER.register_structure_hook(cls, _row_hook(cls, checks))
        CONVERTER.register_structure_hook(OpRow, _structure_op)
        converter.ready = True
    return CONVERTER


def _str(v: Any) -> bool:
    return type(v) is str


def _opt_str(v: Any) -> bool:
    return v is None or type(v) is str


def _strs(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _opt_strs(v: Any) -> bool:
    return v is None or _strs(v)


def _str_map(v: Any) -> bool:
    return type(v) is dict and all(type(k) is str and type(x) is str for k, x in v.items())


def _bool(v: Any) -> bool:
    return type(v) is bool


def _int(v: Any) -> bool:
    return type(v) is int


_ROW_CHECKS: dict[type, dict[str, Any]] = {
    ParamRow: {"name": _str, "shape": _strs, "role": _str, "layer_kinds": _opt_strs, "when": _opt_str, "dtype": _str,
               "linear": _opt_str},
    BufferRow: {"name": _str, "shape": _strs, "dtype": _str, "per_layer": _bool},
    TiedRow: {"name": _str, "target": _str, "when": _opt_str},
    CheckRow: {"expr": _str, "field": _str, "message": _str},
    TensorRow: {"id": _str, "shape": _strs, "dtype": _str, "base": _opt_str},
    RepeatRow: {"n": _str, "first": _int, "len": _int, "each": _strs, "carry": _str_map},
}
"""Each row's fields and the type each must have (a list of size expressions is a list of strings)."""
_WORDS = {_str: "a string", _opt_str: "a string or null", _strs: "a list of strings",
          _opt_strs: "a list of strings or null", _bool: "true or false", _int: "an integer",
          _str_map: "an object of strings"}


def _row_hook(cls: type, checks: dict[str, Any]):
    """The structure hook of a row class: exactly its fields (those with a default may be left out), each of the
    type :data:`_ROW_CHECKS` says."""
    fields = attrs.fields(cls)
    allowed = frozenset(f.name for f in fields)
    required = frozenset(f.name for f in fields if f.default is attrs.NOTHING)
    what = "a " + cls.__name__.removesuffix("Row").lower()
    items = tuple(checks.items())

    def hook(v: Any, _: Any) -> Any:
        if type(v) is not dict or not required <= v.keys() <= allowed:
            _row_keys(v, required, allowed, what)
        for k, ok in items:
            if k in v and not ok(v[k]):
                raise ValueError(f"{what}'s {k} must be {_WORDS[ok]}, got {v[k]!r}")
        return cls(**v)

    return hook


def _structure_op(v: Any, _: Any) -> OpRow:
    """An op row: ``op``, ``in``, ``out`` and any other key as the op's ``extra``."""
    if type(v) is not dict or not _OP_KEYS <= v.keys():
        _row_keys(v, _OP_KEYS, None, "an op")
    if type(v["op"]) is not str or type(v["in"]) is not dict or type(v["out"]) is not list:
        raise ValueError(f"an op's op is a name, in an object, out a list; got {v!r}")
    extra = {k: x for k, x in v.items() if k not in _OP_KEYS} if len(v) > 3 else {}
    return OpRow(v["op"], v["in"], v["out"], extra)


def _row_keys(v: Any, required: frozenset[str], allowed: frozenset[str] | None, what: str) -> None:
    """:raises ValueError: ``v`` is not an object with the ``required`` keys and no key outside ``allowed``
    (None: any other key is allowed); those missing, or unknown, are named."""
    if not isinstance(v, dict):
        raise ValueError(f"{what} is an object with {', '.join(sorted(required))}, got {v!r}")
    missing = sorted(required - v.keys())
    if missing:
        raise KeyError(missing[0])
    unknown = sorted(v.keys() - (allowed or v.keys()))
    raise ValueError(f"unknown key(s) {', '.join(unknown)} in {what} (allowed: {', '.join(sorted(allowed or ()))})")


def structure(data: Any, cls: Any, file: str, root: str) -> Any:
    """``data`` as ``cls`` through :func:`converter`; any problem is one FitplanError naming the file and the
    ``$.path`` of each error (as :func:`fitplan.inputs.convert.structure` words them)."""
    try:
        return converter().structure(data, cls)
    except Exception as e:  # cattrs raises ExceptionGroups; flatten them
        raise structure_error(e, file, root) from None


def structure_error(e: BaseException, file: str, root: str) -> Exception:
    """The FitplanError for a structuring error (one line, or the first 20 of several), as
    :func:`fitplan.inputs.convert.structure` words them: ``message @ $.path``."""
    from fitplan.errors import FitplanError
    from fitplan.inputs.convert import error_lines

    lines = error_lines(e, root)
    if len(lines) == 1:
        msg, _, where = lines[0].rpartition(" @ ")
        return FitplanError(msg, file=file, field=where)
    return FitplanError(f"{len(lines)} errors in the learned file", file=file, details=lines[:20])


def structure_rows(data: Any, cls: type, file: str, root: str) -> list[Any]:
    """A list of rows of ``cls``, each through the converter's hook for ``cls`` (a header's few rows: without
    the dispatch of ``list[cls]``, which costs a command more than the rows do)."""
    from fitplan.errors import FitplanError

    if type(data) is not list:
        raise FitplanError(f"a list of rows, got {type(data).__name__}", file=file, field=root)
    hook = converter().get_structure_hook(cls)
    out = []
    for i, row in enumerate(data):
        try:
            out.append(hook(row, cls))
        except Exception as e:  # noqa: BLE001 - the row's error, named by its path
            raise structure_error(e, file, f"{root}[{i}]") from None
    return out


# --------------------------------------------------------------------------- in memory -> file


def encode_header(header: dict[str, Any]) -> dict[str, Any]:
    """The header file's object for the in-memory header (the named rows in place of the lists)."""
    out = {k: v for k, v in header.items()}
    out["format"] = FORMAT
    out["params"] = [_param_row(p) for p in header["params"]]
    out["buffers"] = [{"name": n, "shape": s, "dtype": d, "per_layer": per, **({"layer_kinds": k[0]} if k else {})}
                      for n, s, d, per, *k in header.get("buffers", [])]
    out["tied"] = [{"name": n, "target": t, "when": w} for n, t, w in header.get("tied", [])]
    config = dict(header["config"])
    config["checks"] = [{"expr": e, "field": f, "message": m} for e, f, m in config.get("checks", [])]
    out["config"] = config
    return out


def _param_row(p: list[Any]) -> dict[str, Any]:
    if not 6 <= len(p) <= 7:
        raise ValueError(f"a parameter entry of {len(p)} fields ({p!r}); format {FORMAT} names 6 or 7: add the new one "
                         "to ParamRow (src/fitplan/arch/archformat.py)")
    row = dict(zip(("name", "shape", "role", "layer_kinds", "when", "dtype"), p[:6]))
    if len(p) > 6:
        row["linear"] = p[6]
    return row


def encode_graphs(graphs: dict[str, Any]) -> dict[str, Any]:
    """The graphs file's object for the in-memory graphs (``variants``, ``segments``, ``autograd``)."""
    out = {k: v for k, v in graphs.items()}
    out["format"] = FORMAT
    out["segments"] = {sid: _segment_object(seg, sid) for sid, seg in graphs["segments"].items()}
    return out


def _segment_object(seg: dict[str, Any], sid: str) -> dict[str, Any]:
    extra = [k for k in seg if k not in _SEGMENT_KEYS]
    if extra:
        raise ValueError(f"segment {sid}: format {FORMAT} has no field for {', '.join(extra)}: add it to SegmentRows "
                         "and _SEGMENT_KEYS (src/fitplan/arch/archformat.py)")
    odd = next((t for t in seg["t"] if len(t) != 3), None)
    if odd is not None:
        raise ValueError(f"segment {sid}: a tensor of {len(odd)} fields ({odd!r}); format {FORMAT} names 3 (shape, "
                         "dtype, base): add the new one to TensorRow (src/fitplan/arch/archformat.py)")
    out: dict[str, Any] = {"args": seg["args"]}
    for k in ("out", "loss", "logits_from", "embed_out"):
        if k in seg:
            out[k] = seg[k]
    out["tensors"] = [{"id": f"t{i}", "shape": s, "dtype": d, "base": b} for i, (s, d, b) in enumerate(seg["t"])]
    out["ops"] = [_op_object(op, sid) for op in seg["ops"]]
    out["die"] = seg["die"]
    if "sites" in seg:
        out["sites"] = seg["sites"]
    if "rep" in seg:
        out["rep"] = [{"n": r["n"], "first": r["first"], "len": r["len"], "each": r["each"],
                       **({"carry": r["carry"]} if r.get("carry") else {})} for r in seg["rep"]]
    return out


def _op_object(op: list[Any], sid: str) -> dict[str, Any]:
    name, args, outs = op[:3]
    extra = op[3] if len(op) > 3 else {}
    named = {k: v for k, v in args}
    if len(named) != len(args) or set(extra) & set(_OP_KEYS):
        raise ValueError(f"segment {sid}: op {name} repeats an argument name or uses a reserved key: {op!r}")
    return {"op": name, "in": named, "out": outs, **extra}


# --------------------------------------------------------------------------- file -> in memory


def decode_header(data: dict[str, Any], file: str) -> dict[str, Any]:
    """The in-memory header of a format-2 header file (rows structured through the cattrs converter)."""
    out = dict(data)
    out["params"] = [[r.name, r.shape, r.role, r.layer_kinds, r.when, r.dtype, *([r.linear] if r.linear else [])]
                     for r in structure_rows(data.get("params"), ParamRow, file, "$.params")]
    if "buffers" in data:
        out["buffers"] = [[r.name, r.shape, r.dtype, r.per_layer, *([r.layer_kinds] if r.layer_kinds is not None else [])]
                          for r in structure_rows(data["buffers"], BufferRow, file, "$.buffers")]
    if "tied" in data:
        out["tied"] = [[r.name, r.target, r.when]
                       for r in structure_rows(data["tied"], TiedRow, file, "$.tied")]
    config = dict(data.get("config") or {})
    if "checks" in config:
        config["checks"] = [[r.expr, r.field, r.message] for r in
                            structure_rows(config["checks"], CheckRow, file, "$.config.checks")]
    out["config"] = config
    return out


def decode_graphs(data: dict[str, Any], file: str) -> dict[str, Any]:
    """The in-memory graphs of a format-2 graphs file (segments structured through the cattrs converter)."""
    from fitplan.errors import FitplanError

    out = dict(data)
    segments = {}
    for sid, raw in (data.get("segments") or {}).items():
        seg = structure(raw, SegmentRows, file=file, root=f"$.segments.{sid}")
        for i, t in enumerate(seg.tensors):
            if t.id != f"t{i}":
                raise FitplanError(f"tensor {i} of segment {sid} is named {t.id!r}, not 't{i}'", file=file,
                                   field=f"$.segments.{sid}.tensors[{i}].id", value=t.id)
        segments[sid] = _segment_memory(seg, raw)
    out["segments"] = segments
    return out


def _segment_memory(seg: SegmentRows, raw: dict[str, Any]) -> dict[str, Any]:
    full = {
        "t": [[t.shape, t.dtype, t.base] for t in seg.tensors],
        "ops": [[o.op, [[k, v] for k, v in o.args.items()], o.out, *([o.extra] if o.extra else [])] for o in seg.ops],
        "args": seg.args, "die": seg.die, "out": seg.out, "sites": seg.sites, "loss": seg.loss,
        "logits_from": seg.logits_from, "embed_out": seg.embed_out,
        "rep": None if seg.rep is None else [{"n": r.n, "first": r.first, "len": r.len, "each": r.each,
                                              **({"carry": r.carry} if r.carry else {})} for r in seg.rep],
    }
    return {k: full[k] for k in _SEGMENT_KEYS if k in raw or k == "t"}


# --------------------------------------------------------------------------- the text of a file

ROWS = frozenset({"params", "buffers", "tied", "checks", "fields", "variants", "tensors", "ops", "sites", "autograd",
                  "rep"})
"""Containers whose items are rows: each item on a line of its own, written compact."""


def dumps(obj: Any) -> str:
    """A file's text: objects spread over lines (one space of indent per level), the items of :data:`ROWS`
    one per line, any other list on one line."""
    return _text(obj, 0, row=False) + "\n"


def _text(v: Any, depth: int, *, row: bool) -> str:
    if row or not isinstance(v, (dict, list)) or not v:
        return json.dumps(v, ensure_ascii=True)
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(v, dict):
        items = [f"{inner}{json.dumps(k)}: {_text(x, depth + 1, row=False)}" if k not in ROWS else
                 f"{inner}{json.dumps(k)}: {_rows(x, depth + 1)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return json.dumps(v, ensure_ascii=True)


def _rows(v: Any, depth: int) -> str:
    """A container of rows: each item (a list's, or a mapping's value with its key) on a line."""
    if not isinstance(v, (dict, list)) or not v:
        return json.dumps(v, ensure_ascii=True)
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(v, dict):
        lines = [f"{inner}{json.dumps(k)}: {_row(x)}" for k, x in v.items()]
        return "{\n" + ",\n".join(lines) + "\n" + pad + "}"
    return "[\n" + ",\n".join(inner + _row(x) for x in v) + "\n" + pad + "]"


def _row(v: Any) -> str:
    """One row, compact (no space after ``,`` and ``:``: the graphs files hold a few hundred thousand)."""
    return json.dumps(v, separators=(",", ":"), ensure_ascii=True)
