"""Writing a learned architecture: ``<model_type>.json`` (config rules, parameters, layer pattern) and
``<model_type>.graphs.json`` (the recorded step graphs), compact and deterministic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GRAPH_KEYS = ("variants", "segments", "autograd")


def split(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    header = {k: v for k, v in data.items() if k not in GRAPH_KEYS}
    graphs = {"format": data["format"], "model_type": data["model_type"], **{k: data[k] for k in GRAPH_KEYS if k in data}}
    header["layer_sites"] = sorted({s["module"] for seg in data["segments"].values()
                                    for s in seg.get("sites", ()) if "{i}" in s["module"]})
    return header, graphs


def dumps(obj: Any, *, pretty: bool = False) -> str:
    if pretty:
        return json.dumps(obj, indent=1, sort_keys=False) + "\n"
    return json.dumps(obj, separators=(",", ":"), sort_keys=False) + "\n"


def write(data: dict[str, Any], directory: str | Path) -> list[Path]:
    from fitplan.diskcache import make_private
    from fitplan.output.files import write_all

    d = Path(directory)
    make_private(d)  # 0700, as fitplan's cache folders (docs/reliability.md "Caches")
    header, graphs = split(data)
    mt = data["model_type"]
    p1 = d / f"{mt}.json"
    p2 = d / f"{mt}.graphs.json"
    write_all([(p1, dumps(header, pretty=True).encode("utf-8")), (p2, dumps(graphs).encode("utf-8"))])  # both or neither
    return [p1, p2]


def read(directory: str | Path, model_type: str) -> dict[str, Any]:
    d = Path(directory)
    header = json.loads((d / f"{model_type}.json").read_text(encoding="utf-8"))
    graphs = json.loads((d / f"{model_type}.graphs.json").read_text(encoding="utf-8"))
    header.pop("layer_sites", None)
    return {**header, **{k: graphs[k] for k in GRAPH_KEYS if k in graphs}}


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
    bufs = {x[0]: x for x in a["buffers"]}
    for x in b["buffers"]:
        bufs.setdefault(x[0], x)
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
