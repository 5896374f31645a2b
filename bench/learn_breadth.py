"""Breadth of ``fitplan learn-architecture``: every causal-LM ``model_type`` of the installed transformers.

For each ``model_type`` of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (transformers/models/auto/modeling_auto.py), the
config class's defaults (``AutoConfig.for_model(model_type)``, its ``text_config`` or ``decoder`` for a composite
one, as the CLI reads it; where the defaults are not a runnable config, with the few fields of
``bench/breadth/configs/<type>.json`` over them, which the row and the table then name as its ``config``) are
written to a ``config.json`` and one child process runs, under ``nice -n 10``, with a wall-clock timeout
(``--cpu-timeout``: a CPU-seconds limit too, from ``/proc/<pid>/stat``) and a resident-memory cap (polled from
``/proc/<pid>/status``: ``VmRSS`` of the child and its children):

* ``--stage record`` (cheap): shrink the config as the learner does and record one bf16 training step (SDPA,
  or eager where the model has no SDPA) with the learner's recorder (what every learning starts with);
* ``--stage learn`` (heavy): the README command, ``fitplan learn-architecture config.json --out DIR``
  (learning and verification; exit 0: the file verified and was written, 2: refused with a reason).

What runs: ``--only a,b`` (reruns them even where a result exists), ``--sample`` (the stratified sample) or
``--all`` (every type); ``--interleave`` orders them one stratum at a time. Each result is a row of the last
``--json`` file (written as it goes); types that any ``--json`` file already holds are skipped, except those
named by ``--only``. ``--md`` writes the table of docs/architectures.md over all types from every ``--json`` file
(later files win per type; ``--before`` files fill the "earlier / before" columns); with nothing to run, it only
writes the table. Heavy: run it on an otherwise idle machine if the timings matter::

    python bench/learn_breadth.py --stage learn --all --interleave --timeout 900 --mem-gb 4 --json /tmp/breadth.json
    python bench/learn_breadth.py --before bench/breadth/learn-before.json --json bench/breadth/*.json --md /tmp/b.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = r"""
import json, sys
from fitplan import FitplanError
from fitplan_torch.learn.command import _read_config, shrink
from fitplan_torch.learn import derive
try:
    cfg = shrink(_read_config(sys.argv[1]))
except FitplanError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
try:
    derive.run(cfg, "16", "sdpa", 2, 16)
except ValueError as e:  # no SDPA in its transformers code: the learner then records eager only
    if "does not support an attention implementation" not in str(e):
        raise
    derive.run(cfg, "16", "eager", 2, 16)
print("recorded")
"""


SAMPLE = {
    **dict.fromkeys(("apertus", "arcee", "cwm", "exaone", "glm", "helium", "internlm3", "olmo3", "seed_oss",
                     "ministral3", "smollm3", "llama"), "dense"),
    **dict.fromkeys(("afmoe", "dots1", "ernie4_5_moe", "glm4_moe", "granitemoe", "hunyuan_v1_moe", "jetmoe",
                     "minimax_m2", "olmoe", "phimoe", "deepseek_v2", "qwen3_moe"), "MoE"),
    **dict.fromkeys(("bamba", "falcon_h1", "falcon_mamba", "jamba", "lfm2", "mamba", "mamba2", "nemotron_h",
                     "qwen3_next", "recurrent_gemma", "zamba2"), "hybrid/SSM"),
    **dict.fromkeys(("biogpt", "bloom", "codegen", "ctrl", "gpt_neo", "gptj", "mpt", "openai-gpt", "opt", "persimmon",
                     "xglm"), "old"),
}
"""The stratified sample (``--sample``): new dense decoders, MoE, hybrid / state-space, and older types (GPT-2
era, ALiBi, parallel blocks); a few bundled ones (llama, qwen3_moe, deepseek_v2, bloom...) as a check that a
type fitplan learned before still learns from its class defaults."""


def interleaved(strata_of: dict[str, str]) -> list[str]:
    """The types taking one of each stratum in turn, so that a run cut by ``--deadline`` covers all."""
    strata: dict[str, list[str]] = {}
    for t, kind in strata_of.items():
        strata.setdefault(kind, []).append(t)
    out: list[str] = []
    while any(strata.values()):
        out += [ts.pop(0) for ts in strata.values() if ts]
    return out


HYBRID_KEYS = ("ssm", "mamba", "conv", "linear_", "block_type", "recurrent")
"""Config keys of a state-space, convolution or linear-attention layer (Mamba, LFM2, Qwen3-Next, RecurrentGemma)."""


def stratum(model_type: str) -> str:
    """The sample's stratum of ``model_type``, or one guessed from its config class's defaults (for ordering and
    the table only, never for a result): a config with a text, vision or audio part is ``multimodal``, an encoder or
    encoder-decoder type (``is_encoder_decoder``, or a masked-LM type of modeling_auto.py) ``encoder-style``, keys
    of a state-space / convolution / linear-attention layer ``hybrid/SSM``, an expert count ``MoE``, no rotary
    key (learned or fixed absolute positions, ALiBi) ``old``, the rest ``dense``."""
    if model_type in SAMPLE:
        return SAMPLE[model_type]
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    cfg = default_config(model_type) or {}
    keys = " ".join(cfg)
    if any(f"{part}_config" in cfg for part in ("text", "vision", "audio", "vq")):
        return "multimodal"
    if cfg.get("is_encoder_decoder") or model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "encoder-style"
    if any(k in keys for k in HYBRID_KEYS) or model_type in ("rwkv", "xlstm"):
        return "hybrid/SSM"
    if "expert" in keys:
        return "MoE"
    return "dense" if ("rope" in keys or "rotary" in keys) else "old"


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


FIXTURES = ROOT / "bench/breadth/configs"
"""Per type, ``<model_type>.json``: the few fields a real source states (transformers' own ``*ModelTester`` or the
type's published config, named by its ``_source``) where the class defaults are not a runnable config: a field
left None or unset that the model needs, defaults the class rejects, or defaults the model's code cannot run."""


def fixture(model_type: str) -> dict | None:
    """The fixture's fields for ``model_type`` (its ``_``-keys, the source notes, left out), or None: none exists."""
    path = FIXTURES / f"{model_type}.json"
    if not path.is_file():
        return None
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def fixture_label(model_type: str) -> str:
    """What the table says of a type that ran from a fixture: its ``_config`` (e.g. "transformers tests")."""
    return json.loads((FIXTURES / f"{model_type}.json").read_text()).get("_config", "fixture")


def default_config(model_type: str) -> dict | None:
    """The config class's defaults as a ``config.json`` would state them, with the type's fixture fields (if one
    exists) passed to the class over them, or None when the class rejects them."""
    from transformers import AutoConfig

    try:
        d = AutoConfig.for_model(model_type, **(fixture(model_type) or {})).to_dict()
    except Exception:  # noqa: BLE001 - its own defaults do not validate
        return None
    d["model_type"] = model_type
    return json.loads(json.dumps(d, default=str))


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``/proc/<pid>/task/*/children``); a process that ended meanwhile is left out."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(k) for k in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        out.append(p)
    return out


def rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (``VmRSS`` in ``/proc``)."""
    total = 0
    for p in tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += next(int(x.split()[1]) * 1024 for x in status.splitlines() if x.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue
    return total


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) spent so far by ``pid`` and its live descendants: fields 14 and 15 of
    ``/proc/<pid>/stat`` (proc(5)), in clock ticks, after the command name's closing parenthesis."""
    ticks = 0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def run_one(model_type: str, stage: str, timeout: float, mem: int, env: dict, cpu_limit: float = 0.0) -> dict:
    cfg = default_config(model_type)
    source = {"config": fixture_label(model_type)} if fixture(model_type) is not None else {}
    if cfg is None:
        return {"model_type": model_type, "stage": stage, "result": "refused", **source,
                "reason": "the config class rejects " + ("the fixture's config" if source else "its own defaults"),
                "seconds": 0.0, "rss_mb": 0}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(cfg), encoding="utf-8")
        if stage == "record":
            cmd = [sys.executable, "-c", RECORD, str(path)]
        else:
            cmd = [sys.executable, "-m", "fitplan", "learn-architecture", str(path), "--out", str(Path(d) / "out"),
                   "--quiet"]
        t0 = time.monotonic()
        with open(Path(d) / "stdout", "w+") as fo, open(Path(d) / "stderr", "w+") as fe:
            proc = subprocess.Popen(["nice", "-n", "10", *cmd], stdout=fo, stderr=fe, env=env, text=True, cwd=d)
            rc, usage, peak, killed = wait(proc, t0, timeout, mem, cpu_limit)
            fe.seek(0)
            err = fe.read()
        secs = time.monotonic() - t0
    cpu = usage.ru_utime + usage.ru_stime if usage else 0.0
    row = {"model_type": model_type, "stage": stage, **source, "at": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
           "seconds": round(secs, 1), "cpu_s": round(cpu, 1),
           "rss_mb": max(peak, (usage.ru_maxrss * 1024) if usage else 0) // 2**20}
    if killed:
        why = {"timeout": f"past {timeout:.0f} s", "cpu": f"past {cpu_limit:.0f} CPU s"}.get(killed)
        return {**row, "result": "memory" if killed == "memory" else "timeout",
                "reason": why or f"past {mem // 2**20} MB resident"}
    if rc == 0:
        return {**row, "result": "recorded" if stage == "record" else "verified", "reason": ""}
    why = reason(err)
    return {**row, "result": classify(rc, why), "reason": why}


def wait(proc: subprocess.Popen, t0: float, timeout: float, mem: int, cpu_limit: float = 0.0):
    """Poll ``proc`` until it ends, is past ``timeout`` wall seconds, ``cpu_limit`` CPU seconds (0: no limit) or
    ``mem`` resident bytes; ``(exit status, rusage, peak resident bytes polled, killed)``. On a loaded machine a
    wall-clock limit stops a starved type (kolibri1: 130 CPU s at 900 s wall, then verified at 214 CPU s); a CPU
    limit stops only a costly one. The rusage (``os.wait4``) holds the child's own CPU seconds
    (user + system, its waited-for descendants included): the learner's cost, whatever the machine's load."""
    peak, killed = 0, None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage, peak, killed
        peak = max(peak, rss_bytes(proc.pid))
        if not killed and peak > mem:
            killed = "memory"
        elif not killed and time.monotonic() - t0 > timeout:
            killed = "timeout"
        elif not killed and cpu_limit and cpu_seconds(proc.pid) > cpu_limit:
            killed = "cpu"
        if killed:
            proc.kill()
        time.sleep(1.0)


def classify(rc: int, why: str) -> str:
    """The learn stage's result from the exit status and the error line: the verification refused the file
    (``learned, not verified``), the learner refused a construct (``refused``, the reason names it), shrinking or
    the config class refused the config (``refused``), or it crashed (``failed``)."""
    if rc != 2:
        return f"failed (exit {rc})"
    if "does not reproduce a fresh run" in why:
        return "not verified"
    return "refused"


def reason(stderr: str) -> str:
    """The error of a child's stderr: fitplan's ``error:`` line without its suggestion, with its first detail
    (a verification names the variant and the op or tensor there), its internal error's message whole, or the
    last line of a traceback."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip() and not x.startswith(("[transformers]", "W1", "Failed to load"))]
    for i, x in enumerate(lines):
        if x.startswith("error:"):
            head = x[len("error: "):]
            for hint in (" (report it", " (--no-shrink"):  # the suggestion, not the reason
                head = head.split(hint)[0]
            detail = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("error:") else ""
            return (head + (" / " + detail if detail else ""))[:400]
    for i, x in enumerate(lines):  # fitplan's internal error (exit 70): its message may span several lines
        if x.startswith("internal error:"):
            return " ".join(lines[i:])[:400]
    return (lines[-1] if lines else "")[:400]


HEADER = ("| model_type | bundled | stratum | record (earlier) | record (now) | learn (before) | learn (now) | CPU s "
          "| MB | reason (now) |\n|---|---|---|---|---|---|---|---|---|---|")


def row_stage(row: dict, path: str) -> str:
    """The stage a row came from: its ``stage`` key; a row written before rows had one is ``record`` when its
    file's name says so or it was recorded, else ``learn``."""
    if "stage" in row:
        return row["stage"]
    return "record" if "record" in Path(path).name or row["result"] == "recorded" else "learn"


def merged(paths: list[str]) -> dict[tuple[str, str], dict]:
    """The rows of the JSON files by ``(stage, model_type)``, a later file's row replacing an earlier one's; each
    row's ``from`` names its file."""
    out: dict[tuple[str, str], dict] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text()):
            out[row_stage(row, path), row["model_type"]] = {**row, "from": Path(path).name}
    return out


def columns(t: str, before: dict, now: dict) -> tuple[list[str], dict | None, str]:
    """The four result columns of type ``t``, the learn row its figures come from, and its reason: the latest
    learn row's, else (a type not learned) the record stage's where it did not record."""
    rec_e, rec_n = before.get(("record", t)), now.get(("record", t))
    learn_b, learn_n = before.get(("learn", t)), now.get(("learn", t))
    if rec_n:
        rec_now = rec_n["result"]
    elif rec_e:
        rec_now = "recorded" if rec_e["result"] == "recorded" else f"{rec_e['result']} (not rerun)"
    else:
        rec_now = "not run"
    learn_now = learn_n["result"] if learn_n else ("not rerun" if learn_b else "not run")
    cols = [rec_e["result"] if rec_e else "not run", rec_now, learn_b["result"] if learn_b else "not run", learn_now]
    shown = learn_n or learn_b
    rec = rec_n or rec_e
    why = (shown or {}).get("reason", "") or (rec["reason"] if rec and rec["result"] != "recorded" else "")
    return cols, shown, why


HINTS = (" (report it", " (--no-shrink", " (learn this config", " (state ")
"""How fitplan's suggestions after an error begin: the table keeps the reason, not the advice."""


def short_reason(why: str, width: int = 240) -> str:
    """``why`` without the suggestion in its head (kept: the detail after `` / ``, which names the variant and op
    of a failed verification), on one line, cut to ``width`` characters."""
    head, sep, detail = why.partition(") / ")
    for hint in HINTS:
        if hint in head:
            head = head.split(hint)[0]
            why = head + (" / " + detail if sep else "")
    return why.replace("\n", " ")[:width]


def cpu_cell(row: dict | None) -> str:
    """CPU seconds of a learn row; a row measured by hand, outside the bench, has wall seconds only (``~N wall``)."""
    if not row:
        return ""
    return str(row["cpu_s"]) if row.get("cpu_s") is not None else f"~{row['seconds']:.0f} wall"


def table(types: list[str], before: dict, now: dict, bundled: set[str], strata: dict[str, str]) -> str:
    """The breadth table of docs/architectures.md over ``types`` (``before`` and ``now``: ``merged`` rows;
    ``strata``: each type's stratum), with a line counting the learn stage's latest results."""
    counts: dict[str, int] = {}
    lines = [HEADER]
    for t in sorted(types):
        cols, shown, why = columns(t, before, now)
        counts[cols[3]] = counts.get(cols[3], 0) + 1
        mb = (shown or {}).get("rss_mb") or ""
        if (shown or {}).get("config"):  # run from a fixture (FIXTURES), not the class defaults: said in the row
            why = f"config: {shown['config']}" + (f"; {why}" if why else "")
        cells = [t, "yes" if t in bundled else "", strata.get(t, ""), *cols, cpu_cell(shown), str(mb),
                 short_reason(why).replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    return f"{len(types)} model types, learn (now): {summary}\n\n" + "\n".join(lines) + "\n"


def selected(a: argparse.Namespace, known: set[str]) -> list[str]:
    """The types to run: ``--only`` (all of them), else ``--sample`` or ``--all`` less those already ``known``;
    ``--interleave`` orders them one stratum at a time."""
    if a.only:
        types = [t for t in a.only.split(",") if t]
    elif a.sample or a.all:
        types = [t for t in (list(SAMPLE) if a.sample else causal_lm_types()) if t not in known]
    else:
        return []
    types = [t for t in types if t not in a.skip.split(",")]
    return interleaved({t: stratum(t) for t in types}) if a.interleave else types


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=("record", "learn"), default="learn")
    ap.add_argument("--only", "--types", dest="only", default="", help="comma-separated model types, rerun")
    ap.add_argument("--sample", action="store_true", help="the stratified sample (SAMPLE), less the types run")
    ap.add_argument("--all", action="store_true", help="every causal LM type, less the types run")
    ap.add_argument("--interleave", action="store_true", help="one type of each stratum in turn")
    ap.add_argument("--skip", default="", help="comma-separated model types not to run (e.g. past the timeout at "
                    "the record stage already)")
    ap.add_argument("--timeout", type=float, default=60.0, help="wall-clock seconds per type")
    ap.add_argument("--cpu-timeout", type=float, default=0.0, help="CPU seconds per type (0: none); with a loose "
                    "--timeout, what a loaded machine should limit")
    ap.add_argument("--mem-gb", type=float, default=3.0, help="resident memory cap per type")
    ap.add_argument("--deadline", type=float, default=0.0, help="stop starting new types after this many minutes")
    ap.add_argument("--json", nargs="+", action="extend", help="result files; the last one is written")
    ap.add_argument("--before", nargs="+", action="extend", default=[], help="earlier results (table only)")
    ap.add_argument("--md", default="")
    a = ap.parse_args(argv)
    paths = a.json or ["/tmp/learn_breadth.json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "plugins/fitplan-torch/src"),
                                                        os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "FITPLAN_NO_CACHE": "1", "OMP_NUM_THREADS": "1"}
    known = {t for (stage, t) in merged([p for p in [*a.before, *paths] if Path(p).is_file()]) if stage == a.stage}
    out = Path(paths[-1])
    rows = json.loads(out.read_text()) if out.is_file() else []
    start = time.monotonic()
    for t in selected(a, known):
        if a.deadline and time.monotonic() - start > 60 * a.deadline:
            break
        row = run_one(t, a.stage, a.timeout, int(a.mem_gb * 2**30), env, a.cpu_timeout)
        rows = [r for r in rows if (row_stage(r, str(out)), r["model_type"]) != (a.stage, t)] + [row]
        print(f"{t:28s} {row['result']:14s} {row.get('cpu_s', 0):6.1f} CPU s {row['seconds']:6.1f} s "
              f"{row['rss_mb']:5d} MB  {row['reason'][:120]}", flush=True)
        out.write_text(json.dumps(rows, indent=1))
    if a.md:
        bundled = {p.name[:-5] for p in (ROOT / "rulesets/architectures").glob("*.json")
                   if not p.name.endswith(".graphs.json")}
        now = merged([p for p in paths if Path(p).is_file()])
        every = causal_lm_types()
        Path(a.md).write_text(table(every, merged(a.before), now, bundled, {t: stratum(t) for t in every}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
