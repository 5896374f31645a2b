"""Writing a learned architecture: ``<model_type>.json`` (config rules, parameters, layer pattern) and
``<model_type>.graphs.json`` (the recorded step graphs), in format 2 (:mod:`fitplan.arch.archformat`: one
named row a line, deterministic), and the per-op diff against the files a write replaces."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from fitplan.api import archformat

GRAPH_KEYS = ("variants", "segments", "autograd")
DIFF_LINES = 200
"""The most lines of a per-op diff the learner prints (the whole diff is ``git diff`` of the written files)."""


def split(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    header = {k: v for k, v in data.items() if k not in GRAPH_KEYS}
    graphs = {"format": data["format"], "model_type": data["model_type"], **{k: data[k] for k in GRAPH_KEYS if k in data}}
    header["layer_sites"] = sorted({s["module"] for seg in data["segments"].values()
                                    for s in seg.get("sites", ()) if "{i}" in s["module"]})
    return header, graphs


def texts(data: dict[str, Any]) -> tuple[str, str]:
    """The text of the header file and of the graphs file for the in-memory ``data``."""
    header, graphs = split(data)
    return (archformat.dumps(archformat.encode_header(header)), archformat.dumps(archformat.encode_graphs(graphs)))


def write(data: dict[str, Any], directory: str | Path, log=None) -> list[Path]:
    """Write both files (both or neither); with ``log``, first log the per-op diff against the files they
    replace (:func:`op_diff`)."""
    from fitplan.api import make_private, write_all

    d = Path(directory)
    make_private(d)  # 0700, as fitplan's cache folders (docs/reliability.md "Caches")
    mt = data["model_type"]
    p1 = d / f"{mt}.json"
    p2 = d / f"{mt}.graphs.json"
    t1, t2 = texts(data)
    if log is not None:
        for line in op_diff(d, mt, t1, t2):
            log(line)
    write_all([(p1, t1.encode("utf-8")), (p2, t2.encode("utf-8"))])  # both or neither
    return [p1, p2]


def read(directory: str | Path, model_type: str) -> dict[str, Any]:
    """The in-memory learned file (what :func:`write` was given, less ``layer_sites``) of a format-2 pair;
    a format-1 pair (positional rows) is read as it is, so :mod:`.reformat` can rewrite it."""
    d = Path(directory)
    return read_texts((d / f"{model_type}.json").read_text(encoding="utf-8"),
                      (d / f"{model_type}.graphs.json").read_text(encoding="utf-8"), str(d / model_type))


def read_texts(header_text: str, graphs_text: str, name: str) -> dict[str, Any]:
    """:func:`read` of the two files' texts (``name``: the pair's path less ``.json``, for errors)."""
    header, graphs = json.loads(header_text), json.loads(graphs_text)
    if header.get("format") == archformat.FORMAT:
        header = archformat.decode_header(header, name + ".json")
    if graphs.get("format") == archformat.FORMAT:
        graphs = archformat.decode_graphs(graphs, name + ".graphs.json")
    header.pop("layer_sites", None)
    return {**header, **{k: graphs[k] for k in GRAPH_KEYS if k in graphs}}


def op_diff(directory: Path, model_type: str, header_text: str, graphs_text: str) -> list[str]:
    """What a write of these texts changes, row by row (an op, a tensor, a parameter), against the files in
    ``directory`` (format 1 or 2; none: nothing to compare): a count per file, then a unified diff without
    context, at most :data:`DIFF_LINES` lines."""
    try:
        old = texts(read(directory, model_type))
    except (OSError, ValueError, KeyError):
        return []
    out: list[str] = []
    for name, before, after in ((f"{model_type}.json", old[0], header_text),
                                (f"{model_type}.graphs.json", old[1], graphs_text)):
        lines = list(difflib.unified_diff(before.splitlines(), after.splitlines(), f"a/{name}", f"b/{name}",
                                          n=0, lineterm=""))
        removed = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
        added = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
        out.append(f"  {name}: {removed} line(s) removed, {added} added (one row a line)" if lines
                   else f"  {name}: unchanged")
        out += lines[:DIFF_LINES]
        if len(lines) > DIFF_LINES:
            out.append(f"  ... {len(lines) - DIFF_LINES} more diff lines (git diff shows them all)")
    return out


def _combos(data: dict[str, Any]) -> list[str | None]:
    if "combos" in data:
        return data["combos"]
    return [data.get("flags", {}).get("when")]


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One file for two learnings of the same model type with different switches (biases, parallel
    blocks, ...): the variants of both, each parameter present under the switches it was seen with."""
    if a["model_type"] != b["model_type"]:
        raise ValueError(f"cannot merge {a['model_type']} with {b['model_type']}")
    if (a["layers"].get("kind") or None) != (b["layers"].get("kind") or None):
        raise ValueError("the two learnings disagree on the layer pattern")
    ca, cb = _combos(a), _combos(b)
    out = dict(a)
    whens_b = {v.get("when") for v in b["variants"]}
    out["variants"] = [v for v in a["variants"] if v.get("when") not in whens_b] + list(b["variants"])
    out["segments"] = {**a["segments"], **b["segments"]}
    out["autograd"] = {**a.get("autograd", {}), **b.get("autograd", {})}
    out["combos"] = [c for c in ca if c not in cb] + cb

    def side(e, combos):
        """Where one side's entry exists: its own condition (``not tie_word_embeddings``, or one from an
        earlier merge) under that side's switch combinations."""
        when = " or ".join(f"({c})" for c in dict.fromkeys(combos)) if combos and None not in combos else None
        parts = [x for x in (e[4], when) if x]
        return " and ".join(f"({x})" for x in parts) if parts else None

    def cond_of(entries_a, entries_b, key_len):
        by: dict[tuple[str, str], list[Any]] = {}  # by name and shape: one entry per shape the switches give
        for entries, combos in ((entries_a, ca), (entries_b, cb)):
            for e in entries:
                by.setdefault((e[0], json.dumps(e[1])), [e, []])[1].append(side(e, combos))
        merged = []
        for e, conds in by.values():
            e = list(e)
            e[4] = None if None in conds else " or ".join(dict.fromkeys(conds)) if len(conds) > 1 else conds[0]
            merged.append(e)
        return merged

    out["params"] = cond_of(a["params"], b["params"], 5)
    fa, fb = a["config"]["fields"], b["config"]["fields"]
    fields = {}
    for k in list(fa) + [k for k in fb if k not in fa]:
        spec = dict(fa.get(k) or fb[k])
        if spec.get("size") and (k not in fa or k not in fb):
            # a size only one side's graphs use: required only under that side's switches
            side = [c for c in (ca if k in fa else cb) if c]
            if side and spec.get("when") is None:
                spec["when"] = " or ".join(f"({c})" for c in side)
        fields[k] = spec
    out["config"] = {**a["config"], "fields": fields,
                     "checks": a["config"]["checks"] + [c for c in b["config"]["checks"] if c not in a["config"]["checks"]]}
    bufs = {x[0]: list(x) for x in a["buffers"]}
    for x in b["buffers"]:
        mine = bufs.setdefault(x[0], list(x))
        if len(mine) > 4 and len(x) > 4:  # held by the layer kinds of either learning
            mine[4] = sorted(set(mine[4]) | set(x[4]))
        elif len(mine) > 4:  # (the other side's file names no kinds: every layer)
            del mine[4]
    out["buffers"] = list(bufs.values())
    kinds = list(a["layers"]["kinds"]) + [k for k in b["layers"]["kinds"] if k not in a["layers"]["kinds"]]
    out["layers"] = {**a["layers"], "kinds": kinds}
    out["tied"] = a["tied"] + [t for t in b["tied"] if t not in a["tied"]]
    out["flags"] = {"values": None, "when": " or ".join(f"({c})" for c in out["combos"] if c) or None}
    out.update(held_sizes([a, b]))
    repeats = {**a.get("repeats", {}), **b.get("repeats", {})}
    if repeats:
        out["repeats"] = repeats
    return out


def held_sizes(parts) -> dict[str, Any]:
    """The file's ``held``, from learnings or files that each may have one: config values no probe could change
    alone (DeepSeek's ``qk_rope_head_dim``, which the config class copies into ``head_dim``; Phi-3's
    ``partial_rotary_factor``), constants in the sizes; the core refuses a config with another value. Absent
    when there is none, so files without any are unchanged."""
    held: dict[str, Any] = {}
    for part in parts:
        held.update(part.get("held") or {})
    return {"held": dict(sorted(held.items()))} if held else {}
