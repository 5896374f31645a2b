"""Checking a learned file against the real thing, at sizes it was not derived from.

Two checks, both through fitplan's own core (the file is written to a scratch directory and read the way
``fitplan estimate`` reads it):

1. **the graph**: for every recorded variant, a config in that variant's regime with sizes no probe used
   is recorded afresh; the file, evaluated for that config (its config rules included), must give the
   same ops with the same shapes and dtypes, exactly;
2. **the memory**: the referee (``fitplan validate``'s CPU run) measures full fine-tuning and LoRA on all
   linear layers, with and without gradient checkpointing, in every precision class and attention kernel;
   parameters, gradients and optimizer states must be exact, saved activations and the step peak within
   ``tolerance``.

:func:`verify` returns the problems found; ``fitplan learn-architecture`` refuses to write a file with any.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

PRECISIONS = {"16": ("bf16-true", "32-true"), "mixed": ("bf16-mixed",)}


@contextlib.contextmanager
def installed(data: dict[str, Any]):
    """The file, readable by fitplan's core, for the duration of the block (traces of a file being learned are
    not kept in fitplan's disk cache)."""
    from fitplan.builtin import archfile

    from .files import write

    with tempfile.TemporaryDirectory() as d:
        write(data, d)
        old = os.environ.get("FITPLAN_ARCH_DIR")
        old_cache = os.environ.get("FITPLAN_NO_CACHE")
        os.environ["FITPLAN_ARCH_DIR"] = d + (os.pathsep + old if old else "")
        os.environ["FITPLAN_NO_CACHE"] = "1"
        archfile.load.cache_clear()
        _clear_caches()
        try:
            yield Path(d)
        finally:
            for var, value in (("FITPLAN_ARCH_DIR", old), ("FITPLAN_NO_CACHE", old_cache)):
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
            archfile.load.cache_clear()
            _clear_caches()


def _clear_caches() -> None:
    from fitplan.builtin import step_trace
    from fitplan.inputs import architecture

    step_trace.build.cache_clear()
    architecture._param_groups.cache_clear()
    architecture._param_count.cache_clear()


def heldout(base: dict[str, Any], variables: list[str], regime, b: int, s: int) -> tuple[dict[str, Any], int, int]:
    """A config in ``regime`` with every variable at a size no probe used (scaled by 5/2 or nudged)."""
    from .derive import hf_config

    cfg = regime.setup(copy.deepcopy(base), b, s)
    for v in variables:
        if v in regime.fixed or not isinstance(cfg.get(v), int):
            continue
        for cand in (cfg[v] * 5 // 2, cfg[v] * 2 + 2, cfg[v] + 6, cfg[v] * 3):
            trial = regime.couple({**cfg, v: cand})
            try:
                hf_config(trial)
            except Exception:  # noqa: BLE001 - the class rejects it: try another
                continue
            if regime.valid(trial, b + 1, s + 5):
                cfg = trial
                break
    bb = b if "b" in regime.fixed else b + 1
    return cfg, bb, s + 5


def check_graph(data: dict[str, Any], results: dict, specs, log) -> list[str]:
    """Check 1 (see the module doc)."""
    from fitplan.builtin.archexpr import compile_expr
    from fitplan.builtin.archfile import load

    from .derive import run, signature
    from .segments import Cut

    problems: list[str] = []
    with installed(data):
        af = load(data["model_type"])
        for precision, attn, reg in specs:
            res = results[(precision, attn, reg.name)]
            cfg, b, s = heldout(res["probes"][0].cfg, res["variables"], reg, res["probes"][0].b, res["probes"][0].s)
            try:
                rec = run(cfg, precision, attn, b, s)
            except Exception as e:  # noqa: BLE001
                problems.append(f"{precision}/{attn} [{reg.name}]: the held-out config does not run: {e}")
                continue
            env = {**af.symbols(cfg), "b": b, "s": s}
            v = af.variant(precision, attn, env)
            cut = Cut(rec, {})
            names = ["prologue"] + [f"layer {i}" for i in range(len(cut.segments) - 2)] + ["epilogue"]
            kinds = af.layer_kinds(env)
            for n, seg in enumerate(cut.segments):
                if n == 0:
                    sid = v["prologue"]
                elif n == len(cut.segments) - 1:
                    sid = v["epilogue"]
                else:
                    sid = v["layers"][kinds[n - 1]]
                fseg = af.segments[sid]
                e = env if seg["layer"] is None else {**env, "i": seg["layer"]}
                if [o[0] for o in fseg["ops"]] != [o[0] for o in seg["ops"]]:
                    problems.append(f"{precision}/{attn} [{reg.name}] {names[n]}: the ops differ at b={b} s={s}")
                    continue
                for k, (t_file, t_rec) in enumerate(zip(fseg["t"], seg["tensors"])):
                    shape = [int(compile_expr(d)(e)) for d in t_file[0]]
                    if shape != list(t_rec[0]) or t_file[1] != t_rec[1]:
                        problems.append(f"{precision}/{attn} [{reg.name}] {names[n]} t{k}: the file says {shape} "
                                        f"{t_file[1]}, the model made {list(t_rec[0])} {t_rec[1]}")
                        break
            log(f"  graph check {precision}/{attn} [{reg.name}] at b={b} s={s}: "
                f"{'ok' if not problems else str(len(problems)) + ' problem(s)'}")
    return problems


def check_memory(data: dict[str, Any], config: dict[str, Any], log, *, tolerance: float = 0.01,
                 cases=None, b: int = 3, s: int = 21) -> tuple[list[str], list[dict[str, Any]]]:
    """Check 2 (see the module doc). Returns problems and one row per case."""
    import fitplan

    from .. import validate

    problems: list[str] = []
    rows: list[dict[str, Any]] = []
    if cases is None:
        cases = [(p, a, ck, m) for p in ("32-true", "bf16-true", "bf16-mixed") for a in ("sdpa", "eager")
                 for ck in (False, True) for m in ("full", "lora")]
    with installed(data), tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        for precision, attn, ckpt, method in cases:
            kw = dict(model=str(path), precision=precision, attn_implementation=attn, gradient_checkpointing=ckpt,
                      per_device_train_batch_size=b, max_seq_length=s, device="cpu", optim="adamw_torch")
            if method == "lora":
                kw.update(method="lora", lora_r=8, lora_target_modules=("all-linear",))
            est = fitplan.estimate(**kw)
            rep = validate(est, mode="cpu", memtracker=False)
            comp = rep["components"]
            row = {"precision": precision, "attn": attn, "checkpointing": ckpt, "method": method,
                   **{k: comp[k]["relative_error"] for k in comp}}
            rows.append(row)
            bad = [k for k in ("parameters", "gradients", "optimizer_states") if comp[k]["predicted"] != comp[k]["measured"]]
            bad += [k for k in ("activations", "peak") if comp[k]["relative_error"] is None
                    or abs(comp[k]["relative_error"]) > tolerance]
            if bad:
                problems.append(f"{precision} {attn} {'ckpt ' if ckpt else ''}{method}: " + ", ".join(
                    f"{k} predicted {comp[k]['predicted']} measured {comp[k]['measured']}" for k in bad))
            log(f"  memory {precision:10s} {attn:5s} {'ckpt' if ckpt else '    '} {method:4s}: activations "
                f"{comp['activations']['relative_error']:+.4%}, peak {comp['peak']['relative_error']:+.4%}")
    return problems, rows


def _isclose(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)
