"""Breadth of ``fitplan learn-architecture``: every causal-LM ``model_type`` of the installed transformers.

For each ``model_type`` of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (transformers/models/auto/modeling_auto.py), the
config class's defaults (``AutoConfig.for_model(model_type)``, its ``text_config`` for a multimodal one, as the
CLI reads it) are written to a ``config.json`` and one child process runs, under ``nice -n 10``, with a wall-clock
timeout and a resident-memory cap (polled from ``/proc/<pid>/status``: ``VmRSS`` of the child and its children):

* ``--stage record`` (cheap): shrink the config as the learner does and record one bf16 training step (SDPA,
  or eager where the model has no SDPA) with the learner's recorder (what every learning starts with);
* ``--stage learn`` (heavy): the README command, ``fitplan learn-architecture config.json --out DIR``
  (learning and verification; exit 0: the file verified and was written, 2: refused with a reason).

Results go to a JSON file (resumed: types already there are skipped) and a markdown table for
docs/architectures.md. Heavy: run it once, on an otherwise idle machine if the timings matter::

    python bench/learn_breadth.py --stage learn --timeout 60 --mem-gb 3 --json /tmp/breadth.json --md /tmp/breadth.md
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


def interleaved(sample: dict[str, str]) -> list[str]:
    """The sample's types taking one of each stratum in turn, so that a run cut by ``--deadline`` covers all."""
    strata: dict[str, list[str]] = {}
    for t, kind in sample.items():
        strata.setdefault(kind, []).append(t)
    out: list[str] = []
    while any(strata.values()):
        out += [ts.pop(0) for ts in strata.values() if ts]
    return out


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def default_config(model_type: str) -> dict | None:
    """The config class's defaults as a ``config.json`` would state them, or None when the class rejects them."""
    from transformers import AutoConfig

    try:
        d = AutoConfig.for_model(model_type).to_dict()
    except Exception:  # noqa: BLE001 - its own defaults do not validate
        return None
    d["model_type"] = model_type
    return json.loads(json.dumps(d, default=str))


def rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (``VmRSS`` in ``/proc``)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += next(int(x.split()[1]) * 1024 for x in status.splitlines() if x.startswith("VmRSS:"))
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = (task / "children").read_text().split()
                todo += [int(k) for k in kids]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def run_one(model_type: str, stage: str, timeout: float, mem: int, env: dict) -> dict:
    cfg = default_config(model_type)
    if cfg is None:
        return {"model_type": model_type, "result": "refused", "reason": "the config class rejects its own defaults",
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
            rc, usage, peak, killed = wait(proc, t0, timeout, mem)
            fe.seek(0)
            err = fe.read()
        secs = time.monotonic() - t0
    cpu = usage.ru_utime + usage.ru_stime if usage else 0.0
    row = {"model_type": model_type, "seconds": round(secs, 1), "cpu_s": round(cpu, 1),
           "rss_mb": max(peak, (usage.ru_maxrss * 1024) if usage else 0) // 2**20}
    if killed:
        return {**row, "result": killed, "reason": f"past {timeout:.0f} s" if killed == "timeout" else
                f"past {mem // 2**20} MB resident"}
    if rc == 0:
        return {**row, "result": "recorded" if stage == "record" else "verified", "reason": ""}
    why = reason(err)
    return {**row, "result": classify(rc, why), "reason": why}


def wait(proc: subprocess.Popen, t0: float, timeout: float, mem: int):
    """Poll ``proc`` until it ends, is past ``timeout`` seconds or ``mem`` resident bytes; ``(exit status,
    rusage, peak resident bytes polled, killed)``. The rusage (``os.wait4``) holds the child's own CPU seconds
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
    (a verification names the variant and the op or tensor there), or the last line of a traceback."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip() and not x.startswith(("[transformers]", "W1", "Failed to load"))]
    for i, x in enumerate(lines):
        if x.startswith("error:"):
            head = x[len("error: "):]
            for hint in (" (report it", " (--no-shrink"):  # the suggestion, not the reason
                head = head.split(hint)[0]
            detail = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("error:") else ""
            return (head + (" / " + detail if detail else ""))[:400]
    return (lines[-1] if lines else "")[:400]


def table(rows: list[dict], bundled: set[str]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    out = ["| model_type | bundled | sample | result | CPU s | wall s | MB | reason |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["model_type"]):
        why = r["reason"].replace("|", "\\|").replace("\n", " ")
        out.append(f"| {r['model_type']} | {'yes' if r['model_type'] in bundled else ''} | "
                   f"{SAMPLE.get(r['model_type'], '')} | {r['result']} | {r.get('cpu_s', '')} | {r['seconds']} | "
                   f"{r['rss_mb']} | {why} |")
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    return f"{len(rows)} model types: {summary}\n\n" + "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=("record", "learn"), default="learn")
    ap.add_argument("--types", default="", help="comma-separated model types (default: every causal LM type)")
    ap.add_argument("--sample", action="store_true", help="the stratified sample (SAMPLE) only")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per type")
    ap.add_argument("--mem-gb", type=float, default=3.0, help="resident memory cap per type")
    ap.add_argument("--deadline", type=float, default=0.0, help="stop starting new types after this many minutes")
    ap.add_argument("--json", default="/tmp/learn_breadth.json")
    ap.add_argument("--md", default="")
    a = ap.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "plugins/fitplan-torch/src"),
                                                        os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "FITPLAN_NO_CACHE": "1", "OMP_NUM_THREADS": "1"}
    types = [t for t in a.types.split(",") if t] or (interleaved(SAMPLE) if a.sample else causal_lm_types())
    path = Path(a.json)
    done = {r["model_type"]: r for r in json.loads(path.read_text())} if path.is_file() else {}
    start = time.monotonic()
    for t in types:
        if t in done:
            continue
        if a.deadline and time.monotonic() - start > 60 * a.deadline:
            break
        row = run_one(t, a.stage, a.timeout, int(a.mem_gb * 2**30), env)
        done[t] = row
        print(f"{t:28s} {row['result']:14s} {row.get('cpu_s', 0):6.1f} CPU s {row['seconds']:6.1f} s "
              f"{row['rss_mb']:5d} MB  {row['reason'][:120]}",
              flush=True)
        path.write_text(json.dumps(list(done.values()), indent=1))
    bundled = {p.name[:-5] for p in (ROOT / "rulesets/architectures").glob("*.json") if not p.name.endswith(".graphs.json")}
    if a.md:
        every = sorted(set(causal_lm_types()) | set(types))
        rows = [done.get(t) or {"model_type": t, "result": "not run", "reason": "", "seconds": "", "rss_mb": ""}
                for t in every]
        Path(a.md).write_text(table(rows, bundled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
