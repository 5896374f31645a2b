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
import re
import tempfile
from pathlib import Path
from typing import Any

PRECISIONS = {"16": ("bf16-true", "32-true"), "mixed": ("bf16-mixed",)}


@contextlib.contextmanager
def installed(data: dict[str, Any]):
    """The file, readable by fitplan's core, for the duration of the block (traces of a file being learned are
    not kept in fitplan's disk cache)."""
    from fitplan.api import clear_arch_caches

    from .files import write

    with tempfile.TemporaryDirectory() as d:
        write(data, d)
        old = os.environ.get("FITPLAN_ARCH_DIR")
        old_cache = os.environ.get("FITPLAN_NO_CACHE")
        os.environ["FITPLAN_ARCH_DIR"] = d + (os.pathsep + old if old else "")
        os.environ["FITPLAN_NO_CACHE"] = "1"
        clear_arch_caches()
        try:
            yield Path(d)
        finally:
            for var, value in (("FITPLAN_ARCH_DIR", old), ("FITPLAN_NO_CACHE", old_cache)):
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
            clear_arch_caches()


def heldout(base: dict[str, Any], variables: list[str], regime, b: int, s: int,
            runs=None) -> tuple[dict[str, Any], int, int]:
    """A config in ``regime`` with every variable at a size no probe used (scaled by 5/2 or nudged), kept
    :func:`.derive.typical` as the probes are: a hidden size of 480 over 36 heads gives 13-wide heads, whose
    rotary halves do not pair up, and the model itself fails (OLMo-3, 12 GQA heads scaled by 3). ``runs(cfg, b,
    s)``: a candidate must also run (a relation the model needs and neither the class nor ``typical`` states,
    such as experts divisible by the expert groups): a held-out config that does not run checks nothing."""
    start = regime.setup(copy.deepcopy(base), b, s)
    bb = b if "b" in regime.fixed else b + 1
    if not regime.valid(start, b + 1, s + 5):
        # the base itself is outside the regime at s + 5 (a chunk dividing s, :mod:`.chunkregimes`): the variables
        # the regime's condition names first, so that the sizes enter the regime before the others are checked in it
        named = set(re.findall(r"[A-Za-z_]\w*", regime.when or ""))
        variables = sorted(variables, key=lambda v: v not in named)
    return _scaled(start, variables, regime, b, s, bb, runs), bb, s + 5


def _scaled(cfg: dict[str, Any], variables: list[str], regime, b: int, s: int, bb: int, runs) -> dict[str, Any]:
    """:func:`heldout`'s sizes, each variable in turn at its first candidate that is typical, in the regime and runs."""
    from .derive import hf_config, typical

    for v in variables:
        if v in regime.fixed or not isinstance(cfg.get(v), int):
            continue
        for cand in (cfg[v] * 5 // 2, cfg[v] * 2 + 2, cfg[v] + 6, cfg[v] * 3, cfg[v] * 2, cfg[v] * 3 // 2):
            trial = regime.couple({**cfg, v: cand})
            if not typical(trial):
                continue
            try:
                hf_config(trial)
            except Exception:  # noqa: BLE001 - the class rejects it: try another
                continue
            if regime.valid(trial, b + 1, s + 5) and (runs is None or runs(trial, bb, s + 5)):
                cfg = trial
                break
    return cfg


def steps(precision: str, attn: str):
    """``runs(cfg, b, s)`` for :func:`heldout`: one training step of the model, in ``precision`` under ``attn``,
    raises nothing."""
    def runs(cfg: dict[str, Any], b: int, s: int) -> bool:
        from .derive import batch_for, build

        try:
            model, config = build(cfg, precision, attn)
            model(**batch_for(config, b, s)).loss.backward()
        except Exception:  # noqa: BLE001 - it does not run: the caller tries another size
            return False
        return True
    return runs


class _NotRun(Exception):
    """The held-out config (``cfg``) does not run: ``error``."""

    def __init__(self, cfg: dict[str, Any], error: BaseException) -> None:
        super().__init__(str(error))
        self.cfg, self.error = cfg, error


def _heldout_run(res: dict[str, Any], free: list[str], reg, precision: str, attn: str):
    """The held-out config of a learned class and its fresh recording: the first sizes :func:`heldout` finds,
    recorded at once; only where that recording fails, sizes each checked by a training step (one model built
    and stepped per variable: most of the check's cost where the first sizes run, as they mostly do).

    :raises _NotRun: with the config and the error, where even the checked sizes do not run."""
    from .derive import run

    p0 = res["probes"][0]
    for runs in (None, steps(precision, attn)):
        cfg, b, s = heldout(p0.cfg, free, reg, p0.b, p0.s, runs=runs)
        try:
            return cfg, b, s, run(cfg, precision, attn, b, s)
        except Exception as e:  # noqa: BLE001
            if runs is not None:
                raise _NotRun(cfg, e) from None
    raise AssertionError("unreachable")


def check_graph(data: dict[str, Any], results: dict, specs, log) -> list[str]:
    """Check 1 (see the module doc). Each problem names the variant, the segment, the op and the tensor."""
    from fitplan.api import load_arch_file

    problems: list[str] = []
    with installed(data):
        af = load_arch_file(data["model_type"])
        for precision, attn, reg in specs:
            res = results[(precision, attn, reg.name)]
            free = free_variables(res, data)
            where = f"{precision}/{attn} [{reg.name}]"
            try:
                cfg, b, s, rec = _heldout_run(res, free, reg, precision, attn)
            except _NotRun as e:
                problems.append(f"{where}: the held-out config does not run ({held_sizes(e.cfg, res['variables'])}): "
                                f"{failing_line(e.error)}")
                log(f"  graph check {where}: the held-out config does not run")
                continue
            found = _compare(af, cfg, rec, b, s, where)
            problems += found
            log(f"  graph check {where} at b={b} s={s}: {'ok' if not found else str(len(found)) + ' problem(s)'}")
    return problems


def free_variables(res: dict[str, Any], data: dict[str, Any]) -> list[str]:
    """The variables a held-out config of one learned variant may change: not a size the variant held, nor one the
    file holds (its ``held`` is the union over every variant and the layer pattern: ``files.held_sizes``), since the
    file refuses a config that states another value of it, and a check at such a config checks nothing the file
    serves. Inkling's file held ``swa_num_key_value_heads`` at 2 (held by another variant or by the layer pattern
    search, not by the variant checked), and that variant's held-out config at 5 was refused by the file itself
    (the breadth row's reason; the type was not rerun with this change)."""
    held = {**(res.get("held") or {}), **(data.get("held") or {})}
    return [v for v in res["variables"] if v not in held]


def _compare(af, cfg: dict[str, Any], rec, b: int, s: int, where: str) -> list[str]:
    """The file evaluated at ``cfg`` against the fresh recording ``rec``, segment by segment: the first op whose
    name differs, or the first tensor whose shape or dtype differs (with the op that makes it)."""
    from fitplan.api import compile_expr

    from .segments import Cut

    problems = []
    env = {**af.symbols(cfg), "b": b, "s": s}
    v = af.variant(*_variant_key(where), env)
    cut = Cut(rec, {})
    names = ["prologue"] + [f"layer {i}" for i in range(len(cut.segments) - 2)] + ["epilogue"]
    kinds = af.layer_kinds(env)
    for n, seg in enumerate(cut.segments):
        sid = v["prologue"] if n == 0 else v["epilogue"] if n == len(cut.segments) - 1 else v["layers"][kinds[n - 1]]
        fseg = af.segments[sid]
        e = env if seg["layer"] is None else {**env, "i": seg["layer"]}
        f_ops, r_ops = [o[0] for o in fseg["ops"]], [o[0] for o in seg["ops"]]
        if f_ops != r_ops:
            k = next((j for j, (x, y) in enumerate(zip(f_ops, r_ops)) if x != y), min(len(f_ops), len(r_ops)))
            problems.append(f"{where} {names[n]}: op {k} differs at b={b} s={s}: the file has "
                            f"{f_ops[k] if k < len(f_ops) else 'no op'}, the model ran "
                            f"{r_ops[k] if k < len(r_ops) else 'no op'} ({len(f_ops)} vs {len(r_ops)} ops)")
            continue
        for k, (t_file, t_rec) in enumerate(zip(fseg["t"], seg["tensors"])):
            shape = [int(compile_expr(d)(e)) for d in t_file[0]]
            if shape != list(t_rec[0]) or t_file[1] != t_rec[1]:
                problems.append(f"{where} {names[n]} t{k} (made by {_maker(fseg, k)}): the file says {shape} "
                                f"{t_file[1]} = {t_file[0]}, the model made {list(t_rec[0])} {t_rec[1]}")
                break
    return problems


def _variant_key(where: str) -> tuple[str, str]:
    precision, attn = where.split(" ", 1)[0].split("/")
    return precision, attn


def _maker(fseg: dict[str, Any], k: int) -> str:
    """The op of a file segment whose outputs hold tensor ``t<k>`` (an argument when no op makes it)."""
    for op in fseg["ops"]:
        if f"t{k}" in op[2]:
            return op[0]
    return "an argument of the segment"


def held_sizes(cfg: dict[str, Any], variables: list[str]) -> str:
    return ", ".join(f"{v}={cfg[v]}" for v in variables if v in cfg)


def failing_line(e: BaseException) -> str:
    """The exception and the model code line it came from (the last frame under ``transformers/models``)."""
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/transformers/models/" in f.filename]
    msg = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    if frames:
        f = frames[-1]
        msg += f" at {f.filename.split('/transformers/', 1)[1]}:{f.lineno} `{(f.line or '').strip()[:100]}`"
    return msg


def check_memory(data: dict[str, Any], config: dict[str, Any], log, *, tolerance: float = 0.01,
                 cases=None, b: int = 3, s: int = 21) -> tuple[list[str], list[dict[str, Any]]]:
    """Check 2 (see the module doc). Returns problems and one row per case."""
    from fitplan.api import estimate

    from .. import validate

    problems: list[str] = []
    rows: list[dict[str, Any]] = []
    if cases is None:
        ckpts = (False, True) if supports_checkpointing(config) and not data.get("kept_graphs") else (False,)
        if len(ckpts) == 1:
            log("  memory: no checkpointing cases (" + ("the estimate refuses checkpointing: the model keeps a tensor "
                f"with autograd history as {', '.join(data['kept_graphs'])}, learn/keptgraph.py)"
                if data.get("kept_graphs") else "the model class does not support gradient checkpointing") + ")")
        kernels = [a for a in ("sdpa", "eager") if a in data.get("attn_implementations", ("sdpa", "eager"))]
        learned = {p for v in data.get("variants", ()) for p in PRECISIONS.get(v.get("precision"), ())}
        cases = [(p, a, ck, m) for p in ("32-true", "bf16-true", "bf16-mixed") for a in kernels
                 for ck in ckpts for m in ("full", "lora")  # OpenAI-GPT has no SDPA: eager only
                 if p in learned or not learned]  # DBRX does not run under autocast: no bf16-mixed graph
    with installed(data), tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        for precision, attn, ckpt, method in cases:
            kw = dict(model=str(path), precision=precision, attn_implementation=attn, gradient_checkpointing=ckpt,
                      per_device_train_batch_size=b, max_seq_length=s, device="cpu", optim="adamw_torch")
            if method == "lora":
                kw.update(method="lora", lora_r=8, lora_target_modules=lora_targets(data))
            est = estimate(**kw)
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


def lora_targets(data: dict[str, Any]) -> tuple[str, ...]:
    """The memory check's LoRA targets: ``all-linear``, or where peft cannot adapt some of the linear layers of
    this model type, every linear layer's name but those. Two cases: peft 0.21's
    ``_check_lora_target_modules_mamba`` (peft/tuners/tuners_utils.py: LoRA on ``out_proj`` / ``conv1d`` of
    falcon_h1, mamba, mamba2, falcon_mamba and nemotron_h raises a ValueError, ``all-linear`` included; asked
    here of peft itself, per name), and an ``nn.Linear`` subclass whose forward returns a tuple (the learned
    file's ``lora.non_tensor_linears``: Llama-4's and PhiMoE's routers), which ``all-linear`` selects and whose
    LoRA forward then fails (peft/tuners/lora/layer.py, ``result.dtype``): the estimate refuses such targets, so
    the check names the others."""
    roles = [p["role"] if isinstance(p, dict) else p[2] for p in data.get("params", ())]  # a row, or as written
    names = sorted({r.split(":", 1)[1] for r in roles if r.startswith("linear:")})
    tuples = {m.rsplit(".", 1)[-1] for m in data.get("lora", {}).get("non_tensor_linears", ())}
    kept = [n for n in names if n not in tuples and _peft_adapts_on(data["model_type"], n)]
    return ("all-linear",) if not names or (len(kept) == len(names) and not tuples) else tuple(kept)


def _peft_adapts_on(model_type: str, name: str) -> bool:
    """Whether peft 0.21's per-model-type check (``_check_lora_target_modules_mamba``) lets LoRA target ``name``."""
    from types import SimpleNamespace

    import peft
    from peft.tuners import tuners_utils

    check = getattr(tuners_utils, "_check_lora_target_modules_mamba", None)
    if check is None:
        return True
    try:
        check(peft.LoraConfig(target_modules=[name]), SimpleNamespace(config=SimpleNamespace(model_type=model_type)), name)
    except ValueError:
        return False
    return True


def supports_checkpointing(config: dict[str, Any]) -> bool:
    """The model class's ``supports_gradient_checkpointing`` (``PreTrainedModel.gradient_checkpointing_enable``
    raises "does not support activation checkpointing" otherwise: transformers/modeling_utils.py): CTRL's is
    False, so the referee cannot run its checkpointing cases."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from .derive import hf_config

    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config(config))]
    except (KeyError, ValueError):
        return True
    return bool(getattr(cls, "supports_gradient_checkpointing", True))


def _isclose(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)
