"""fitplan's memory predictions against PyTorch, over a matrix of scenarios.

    .venv/bin/python bench/accuracy/run.py                  # the full CPU matrix -> docs/accuracy.md
    .venv/bin/python bench/accuracy/run.py --quick          # a few cases, to check the script
    .venv/bin/python bench/accuracy/run.py --device cuda --out results.md   # the CUDA column (bench/gpu_validate.sh)

Groups:

* ``tiny``: the tiny config of every bundled model type (tests/data/configs, 30) × precision {32-true,
  bf16-true, bf16-mixed} × attention {eager, sdpa where the model has it} × checkpointing {off, on} × method
  {full, LoRA on all linear layers}, real steps on the CPU (or on the GPU with ``--device cuda``), batch 2 ×
  128 tokens.
* ``shapes``: Llama-2 7B / 13B / 70B shapes under FakeTensorMode (CPU; real steps with ``--device cuda``
  where they fit on the GPU).
* ``sharded``: ZeRO-1 (DDP + ZeroRedundancyOptimizer) and FSDP2 ZeRO-2/ZeRO-3, two real gloo ranks on a
  tiny model, and rank 0 of 8 under a fake process group for the 7B shape.
* ``stacks``: the stacks users run, on the CPU: DeepSpeed 0.19.8 ZeRO 0-3 (bf16 and fp32, optimizer and
  parameter offload, default and small buckets, 2 and 4 gloo ranks; ZeRO-3 + LoRA on four model types, with and without
  checkpointing), bitsandbytes 0.50.2 QLoRA (nf4 / fp4,
  double quantisation, an MoE model whose fused experts stay 16-bit), 8-bit optimizers, and accelerate 1.16's
  FSDP2 / FSDP1 as the HF Trainer sets them up (bf16 / fp32, full_shard / shard_grad_op, activation
  checkpointing, LoRA, 2 and 4 gloo ranks).
  ``--groups stacks --out docs/accuracy-stacks.md --json bench/accuracy/results-stacks.json``; ``--only accelerate``
  (or ``--only zero3``) reruns the cases whose id contains it and keeps the other rows of the previous JSON.

Prints the median and worst relative error per component, and writes a Markdown report (and the raw
rows as JSON). Relative error = (predicted − measured) / measured: positive when fitplan over-predicts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "configs"
COMPONENTS = ("parameters", "gradients", "optimizer_states", "activations", "peak", "master_weights", "comm_buffers")
ARCHS = tuple(sorted(p.name for p in CONFIGS.glob("tiny-*")))
"""Every tiny config: one per bundled model type (docs/architectures.md), every switch of it on."""
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    # Llama-4's router subclasses nn.Linear but returns a tuple: peft 0.21 fails on it under all-linear
    # (peft/tuners/lora/layer.py ``result.dtype``), and fitplan refuses those targets (builtin/lora.py)
    "tiny-llama4": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "llama-4-scout-17b-16e": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
"""LoRA runs adapt every linear layer (peft's ``all-linear``) unless named here."""
TINY_BATCH, TINY_SEQ = 2, 128


def tiny_cases(quick: bool) -> list[dict[str, Any]]:
    out = []
    archs = ARCHS[:2] if quick else ARCHS
    from fitplan.arch.archfile import load

    for name in archs:
        mt = json.loads((CONFIGS / name / "config.json").read_text())["model_type"]
        attns = load(mt).data.get("attn_implementations") or ("eager", "sdpa")
        for precision in ("32-true", "bf16-true", "bf16-mixed"):
            for attn in [a for a in ("eager", "sdpa") if a in attns]:
                for ckpt in (False, True):
                    for method in ("full", "lora"):
                        if quick and (attn == "eager" or precision == "bf16-mixed"):
                            continue
                        fields = dict(model=str(CONFIGS / name / "config.json"), precision=precision, attn_implementation=attn,
                                      gradient_checkpointing=ckpt, method=method, per_device_train_batch_size=TINY_BATCH,
                                      max_seq_length=TINY_SEQ)
                        if method == "lora":
                            fields["lora_target_modules"] = LORA_TARGETS.get(name, ("all-linear",))
                        cid = f"{name} {precision} {attn}{' ckpt' if ckpt else ''} {method}"
                        out.append({"group": "tiny", "id": cid, "fields": fields, "mode": "cpu"})
    return out


def _attn_of(model: str) -> str:
    import fitplan
    from fitplan.arch.archfile import load

    impls = load(fitplan.estimate(model=model).arch.model_type).data.get("attn_implementations") or ["sdpa"]
    return "sdpa" if "sdpa" in impls else impls[0]


def shape_cases(quick: bool) -> list[dict[str, Any]]:
    rows = [
        ("llama-2-7b", dict(precision="bf16-true")),
        ("llama-2-7b", dict(precision="bf16-true", gradient_checkpointing=True)),
        ("llama-2-7b", dict(precision="bf16-mixed")),
        ("llama-2-7b", dict(precision="bf16-true", attn_implementation="eager")),
        ("llama-2-7b", dict(precision="bf16-true", method="lora", lora_r=16)),
        ("llama-2-13b", dict(precision="bf16-true")),
        ("llama-2-13b", dict(precision="bf16-true", method="lora", lora_r=16, gradient_checkpointing=True)),
        ("llama-2-13b", dict(precision="bf16-true", gradient_checkpointing=True, per_device_train_batch_size=4)),
        ("llama-2-70b", dict(precision="bf16-true", gradient_checkpointing=True)),
    ]
    # one published size per learned family (docs/architectures.md), bf16 with SDPA where the model has it
    for model in ("mistral-7b", "mixtral-8x7b", "qwen2.5-7b", "qwen1.5-moe-a2.7b", "qwen3-8b", "qwen3-30b-a3b", "gemma-7b",
                  "gemma-2-9b", "gemma-3-4b", "phi-2", "phi-3-mini", "gpt2-xl", "pythia-6.9b", "falcon-7b", "olmo-7b",
                  "olmo-2-7b", "starcoder2-7b", "starcoder", "command-r-v01", "granite-3.0-8b", "stablelm-2-1.6b",
                  "deepseek-v2-lite", "smollm3-3b", "glm-4-9b-0414", "exaone-4.0-32b", "ernie-4.5-0.3b", "gpt-oss-20b",
                  "llama-4-scout-17b-16e"):
        rows.append((model, dict(precision="bf16-true", attn_implementation=_attn_of(model))))
        rows.append((model, dict(precision="bf16-mixed", gradient_checkpointing=True, attn_implementation=_attn_of(model),
                                 method="lora", lora_r=16, lora_target_modules=LORA_TARGETS.get(model, ("all-linear",)))))
    if quick:
        rows = rows[:1]
    out = []
    for model, extra in rows:
        fields = {"model": model, "attn_implementation": "sdpa", "per_device_train_batch_size": 1, "max_seq_length": 512, **extra}
        if "lora_target_modules" in extra:
            extra = {k: v for k, v in extra.items() if k != "lora_target_modules"} | {"lora": ",".join(extra["lora_target_modules"])}
        tag = " ".join(f"{k}={v}" for k, v in extra.items())
        out.append({"group": "shapes", "id": f"{model} b{fields['per_device_train_batch_size']} s512 {tag}", "fields": fields,
                    "mode": "fake"})
    return out


def sharded_cases(quick: bool) -> list[dict[str, Any]]:
    tiny = str(CONFIGS / "tiny-llama" / "config.json")
    # PyTorch-native sharding (--stack torch): DDP + ZeroRedundancyOptimizer, fully_shard
    base = dict(model=tiny, precision="bf16-true", per_device_train_batch_size=TINY_BATCH, max_seq_length=TINY_SEQ, num_gpus=2,
                stack="torch")
    rows = [
        ("tiny-llama zero1 2 gloo ranks", dict(base, zero_stage=1), "cpu"),
        ("tiny-llama fsdp full_shard 2 gloo ranks", dict(base, fsdp="full_shard"), "cpu"),
        ("tiny-llama fsdp shard_grad_op 2 gloo ranks", dict(base, fsdp="shard_grad_op"), "cpu"),
    ]
    big = dict(model="llama-2-7b", precision="bf16-true", per_device_train_batch_size=1, max_seq_length=512, num_gpus=8,
               stack="torch")
    rows += [
        ("llama-2-7b zero1 rank 0 of 8 (fake pg)", dict(big, zero_stage=1), "fake"),
        ("llama-2-7b zero2/fsdp shard_grad_op rank 0 of 8 (fake pg)", dict(big, fsdp="shard_grad_op"), "fake"),
        ("llama-2-7b zero3/fsdp full_shard rank 0 of 8 (fake pg)", dict(big, zero_stage=3), "fake"),
    ]
    if quick:
        rows = rows[:1] + rows[-1:]
    return [{"group": "sharded", "id": cid, "fields": f, "mode": mode} for cid, f, mode in rows]


def stack_cases(quick: bool) -> list[dict[str, Any]]:
    tiny = str(CONFIGS / "tiny-llama" / "config.json")
    ds = dict(model=tiny, precision="bf16-master", per_device_train_batch_size=TINY_BATCH, max_seq_length=TINY_SEQ,
              num_gpus=2, stack="deepspeed")
    small = dict(reduce_bucket_size=20_000, stage3_prefetch_bucket_size=10_000, stage3_param_persistence_threshold=1_000)
    rows = [(f"deepspeed zero{k} bf16 2 ranks", dict(ds, zero_stage=k)) for k in (0, 1, 2, 3)]
    rows += [
        ("deepspeed zero1 fp32 2 ranks", dict(ds, zero_stage=1, precision="32-true")),
        ("deepspeed zero3 fp32 2 ranks", dict(ds, zero_stage=3, precision="32-true")),
        ("deepspeed zero2 bf16 optimizer offload", dict(ds, zero_stage=2, offload_optimizer=True)),
        ("deepspeed zero3 bf16 optimizer + parameter offload", dict(ds, zero_stage=3, offload_optimizer=True, offload_params=True)),
        ("deepspeed zero2 bf16 small buckets", dict(ds, zero_stage=2, **small)),
        ("deepspeed zero3 bf16 small buckets ckpt", dict(ds, zero_stage=3, gradient_checkpointing=True, **small)),
        ("deepspeed zero2 bf16 4 ranks", dict(ds, zero_stage=2, num_gpus=4)),
        ("deepspeed zero3 bf16 4 ranks small buckets", dict(ds, zero_stage=3, num_gpus=4, **small)),
        ("deepspeed zero2 lora bf16 2 ranks", dict(ds, zero_stage=2, method="lora", lora_target_modules=("q_proj", "v_proj"))),
        ("deepspeed zero3 lora bf16 2 ranks", dict(ds, zero_stage=3, method="lora", lora_target_modules=("q_proj", "v_proj"))),
    ]
    # ZeRO-3 + LoRA beyond the case the rules were found on: ranks, checkpointing, fp32, other model types (GPT-2's
    # Conv1D is not F.linear), full fine-tuning, all-linear adapters, and small buckets (the frozen modules before
    # the first adapter are gathered for their forward only)
    z3l = dict(ds, zero_stage=3, method="lora", lora_target_modules=("q_proj", "v_proj"))
    neox = dict(z3l, model=str(CONFIGS / "tiny-gpt-neox" / "config.json"), lora_target_modules=("query_key_value",))
    rows += [
        ("deepspeed zero3 lora bf16 4 ranks small buckets", dict(z3l, num_gpus=4, **small)),
        ("deepspeed zero3 lora bf16 2 ranks ckpt", dict(z3l, gradient_checkpointing=True)),
        ("deepspeed zero3 lora fp32 2 ranks", dict(z3l, precision="32-true")),
        ("deepspeed zero3 lora tiny-gpt-neox bf16 2 ranks", neox),
        ("deepspeed zero3 lora tiny-gpt-neox bf16 2 ranks small buckets", dict(neox, **small)),
        ("deepspeed zero3 lora tiny-gpt2 (Conv1D) bf16 2 ranks", dict(z3l, model=str(CONFIGS / "tiny-gpt2" / "config.json"),
                                                                     lora_target_modules=("c_attn",))),
        ("deepspeed zero3 lora all-linear tiny-mistral small buckets", dict(z3l, model=str(CONFIGS / "tiny-mistral" / "config.json"),
                                                                          lora_target_modules=("all-linear",), **small)),
        ("deepspeed zero3 full tiny-qwen2 bf16 2 ranks", dict(ds, zero_stage=3, model=str(CONFIGS / "tiny-qwen2" / "config.json"))),
    ]
    q = dict(precision="bf16-true", per_device_train_batch_size=TINY_BATCH, max_seq_length=TINY_SEQ, method="qlora",
             lora_target_modules=("all-linear",), gradient_checkpointing=True)
    rows += [
        ("qlora tiny-llama nf4 double-quant", dict(q, model=tiny)),
        ("qlora tiny-mistral nf4", dict(q, model=str(CONFIGS / "tiny-mistral" / "config.json"))),
        ("qlora tiny-mixtral (fused experts 16-bit)", dict(q, model=str(CONFIGS / "tiny-mixtral" / "config.json"))),
        ("qlora tiny-llama no k-bit preparation", dict(q, model=tiny, kbit_preparation="none")),
        ("adamw_8bit tiny-llama bf16", dict(model=tiny, precision="bf16-true", per_device_train_batch_size=TINY_BATCH,
                                            max_seq_length=TINY_SEQ, optim="adamw_8bit")),
        ("paged_adamw_8bit tiny-llama 32-true", dict(model=tiny, precision="32-true", per_device_train_batch_size=TINY_BATCH,
                                                     max_seq_length=TINY_SEQ, optim="paged_adamw_8bit")),
    ]
    rows += accelerate_fsdp_rows(tiny)
    if quick:
        rows = [r for r in rows if r[0] in ("deepspeed zero2 bf16 2 ranks", "qlora tiny-llama nf4 double-quant")]
    return [{"group": "stacks", "id": cid, "fields": f, "mode": "cpu"} for cid, f in rows]


def accelerate_fsdp_rows(tiny: str) -> list[tuple[str, dict[str, Any]]]:
    """accelerate 1.16 FSDP2 (the Trainer's default) and FSDP1 (``--stack fsdp1``), gloo ranks on the CPU."""
    base = dict(model=tiny, per_device_train_batch_size=TINY_BATCH, max_seq_length=TINY_SEQ, num_gpus=2, fsdp="full_shard",
                precision="bf16-mixed")
    lora = dict(method="lora", lora_target_modules=("q_proj", "v_proj"))
    rows = []
    for v in ("fsdp2", "fsdp1"):
        f = dict(base, stack=v)
        rows += [(f"accelerate {v} full_shard bf16 2 ranks", f),
                 (f"accelerate {v} full_shard fp32 2 ranks", dict(f, precision="32-true")),
                 (f"accelerate {v} full_shard bf16 activation checkpointing", dict(f, gradient_checkpointing=True)),
                 (f"accelerate {v} full_shard bf16 lora", dict(f, **lora)),
                 (f"accelerate {v} full_shard bf16 4 ranks", dict(f, num_gpus=4))]
    rows.insert(1, ("accelerate fsdp2 shard_grad_op bf16 2 ranks", dict(base, stack="fsdp2", fsdp="shard_grad_op")))
    return rows


def run_case(case: dict[str, Any], device: str) -> dict[str, Any]:
    import fitplan
    import fitplan_torch

    mode = case["mode"]
    if device == "cuda":
        mode = "cuda"
    t0 = time.perf_counter()
    row: dict[str, Any] = {"group": case["group"], "id": case["id"], "mode": mode}
    try:
        est = fitplan.estimate(**case["fields"])
        report = fitplan_torch.validate(est, mode=mode, memtracker=case["group"] == "tiny" and device == "cpu")
    except Exception as e:  # noqa: BLE001 - one failing case is a row, not the end of the run
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if os.environ.get("FITPLAN_BENCH_TRACEBACK"):
            traceback.print_exc()
    else:
        row["components"] = report["components"]
        row["peak_phase"] = report["peak_phase"]
        m = report["measured"]
        row["memtracker_agrees"] = (m.get("memtracker_peak") == m["peak"]) if m.get("memtracker_peak") is not None else None
        row["device"] = report["device"]
        if report.get("tokens_per_second"):
            row["tokens_per_second"] = report["tokens_per_second"]
        if m.get("cuda"):
            row["cuda"] = m["cuda"]
            row["counter_peak"] = m["peak"]
        if "ranks" in report:
            row["ranks"] = report["ranks"]
        if mode == "cuda" and case["group"] == "shapes":
            # the CPU referee's FakeTensorMode run of the same scenario, for the CUDA-vs-fake check
            try:
                fake = fitplan_torch.validate(est, mode="fake", memtracker=False)["measured"]
                row["fake"] = {"peak": fake["peak"], "retained": fake["retained"]}
            except Exception as e:  # noqa: BLE001
                row["fake"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def stats(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for comp in COMPONENTS:
        errs = [(r["components"][comp]["relative_error"], r["id"]) for r in rows
                if comp in r.get("components", {}) and r["components"][comp]["relative_error"] is not None]
        if not errs:
            continue
        worst = max(errs, key=lambda e: abs(e[0]))
        out[comp] = {"n": len(errs), "median_abs": statistics.median(abs(e) for e, _ in errs), "worst": worst[0],
                     "worst_case": worst[1], "exact": sum(1 for e, _ in errs if e == 0)}
    return out


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.2f} %"


def human(n: int | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def markdown(rows: list[dict[str, Any]], args, elapsed: float) -> str:
    import fitplan_torch.runner as runner

    v = runner.versions()
    import subprocess

    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        core = f"fitplan core at {sha}{' with uncommitted changes in src/' if dirty else ''}"
    except OSError:
        core = "fitplan core (unknown commit)"
    lines = [
        "# Accuracy: fitplan's memory predictions against PyTorch",
        "",
        f"Generated by `bench/accuracy/run.py{' --device cuda' if args.device == 'cuda' else ''}` on "
        f"{datetime.date.today().isoformat()} ({platform.machine()}, {os.cpu_count()} CPUs; "
        f"torch {v.get('torch')}, transformers {v.get('transformers')}, peft {v.get('peft')}; {core}) "
        f"in {elapsed / 60:.1f} minutes"
        f"{f' (only the cases whose id contains {args.only!r} were rerun; the other rows are the previous run' + chr(39) + 's)' if getattr(args, 'only', '') else ''}. "
        "Rerun it to refresh this page; `docs/validation.md` explains what is measured.",
        "",
        "Relative error = (predicted − measured) / measured: **positive when fitplan over-predicts**. "
        "Measured values come from the fitplan-torch referee: model states exactly from the tensors, activations "
        "as the bytes the forward pass leaves alive for backward (predicted: `saved_for_backward_bytes`), "
        "the peak from a live-storage counter over one steady-state step (predicted: `peak_bytes`). "
        "These numbers measure the core's memory model; they are not tuned to agree.",
        "",
        "What the CPU cannot show (see `docs/validation.md`): CUDA's 1-byte dropout masks (CPU masks use the input "
        "dtype), fused SDPA with dropout, kernel scratch, allocator rounding and reserve, the CUDA context.",
        "",
    ]
    groups = [("tiny", "Tiny architectures, real steps" + (" on CUDA" if args.device == "cuda" else " on the CPU")
               + f" (batch {TINY_BATCH} × {TINY_SEQ} tokens, AdamW foreach)"),
              ("shapes", "Real-size shapes" + (" on CUDA" if args.device == "cuda" else " under FakeTensorMode (no memory used)")),
              ("sharded", "Sharding, measured per rank (rank 0 shown)"),
              ("stacks", "Stacks users run: DeepSpeed, accelerate FSDP, bitsandbytes QLoRA and 8-bit optimizers (rank 0 shown)")]
    lines += ["## Summary", "", "| group | component | cases | exact | median abs. error | worst error | worst case |",
              "|---|---|---:|---:|---:|---:|---|"]
    for g, _ in groups:
        for comp, s in stats([r for r in rows if r["group"] == g]).items():
            lines.append(f"| {g} | {comp} | {s['n']} | {s['exact']} | {100 * s['median_abs']:.2f} % | {pct(s['worst'])} | {s['worst_case']} |")
    errors = [r for r in rows if "error" in r]
    mt = [r for r in rows if r.get("memtracker_agrees") is not None]
    lines += ["", f"Live-storage counter vs torch's MemTracker peak: {sum(r['memtracker_agrees'] for r in mt)} of {len(mt)} "
              "full-fine-tuning CPU runs agree to the byte (MemTracker cannot track LoRA's frozen parameters).", ""]
    if errors:
        lines += ["Cases that could not run (the error is the referee's or the core's, as stated):", ""]
        by_error: dict[str, list[str]] = {}
        for r in errors:
            by_error.setdefault(r["error"], []).append(r["id"])
        for err, ids in by_error.items():
            lines.append(f"- {len(ids)} case(s), e.g. `{ids[0]}`: {err}")
        lines.append("")
    cuda_rows = [r for r in rows if r.get("cuda")]
    if cuda_rows:
        lines += ["## CUDA: allocator vs the live-storage counter, and vs FakeTensorMode on the CPU", "",
                  "| case | max_memory_allocated | counter peak | max_memory_reserved | reserved / allocated | fake-mode peak (CPU referee) | tokens/s |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in cuda_rows:
            c = r["cuda"]
            fk = r.get("fake", {})
            ratio = c["max_memory_reserved"] / c["max_memory_allocated"] if c["max_memory_allocated"] else None
            lines.append(f"| {r['id']} | {human(c['max_memory_allocated'])} | {human(r.get('counter_peak'))} | "
                         f"{human(c['max_memory_reserved'])} | {'–' if ratio is None else f'{ratio:.3f}'} | "
                         f"{human(fk.get('peak')) if 'peak' in fk else fk.get('error', '–')} | "
                         f"{r.get('tokens_per_second', 0):.0f} |")
        lines.append("")
    for g, title in groups:
        grows = [r for r in rows if r["group"] == g and "components" in r]
        if not grows:
            continue
        lines += [f"## {title}", "",
                  "| case | parameters | gradients | optimizer states | activations (pred / meas) | act. error | peak (pred / meas) | peak error | peak phase (pred / meas) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in grows:
            c = r["components"]
            a, p = c["activations"], c["peak"]
            lines.append(
                f"| {r['id']} | {pct(c['parameters']['relative_error'])} | {pct(c['gradients']['relative_error'])} | "
                f"{pct(c['optimizer_states']['relative_error'])} | {human(a['predicted'])} / {human(a['measured'])} | "
                f"{pct(a['relative_error'])} | {human(p['predicted'])} / {human(p['measured'])} | {pct(p['relative_error'])} | "
                f"{r['peak_phase']['predicted']} / {r['peak_phase']['measured']} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--quick", action="store_true", help="a handful of cases")
    ap.add_argument("--groups", default="tiny,shapes,sharded", help="comma-separated: tiny, shapes, sharded, stacks")
    ap.add_argument("--out", default=str(ROOT / "docs" / "accuracy.md"), help="Markdown report")
    ap.add_argument("--json", default=str(ROOT / "bench" / "accuracy" / "results.json"), help="raw rows")
    ap.add_argument("--only", default="", help="run only the cases whose id contains this text (several: a|b); "
                    "the other cases' rows are kept from --json (the previous run)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        print("bench/accuracy/run.py needs torch, transformers and peft (see docs/validation.md)", file=sys.stderr)
        return 2
    groups = args.groups.split(",")
    cases: list[dict[str, Any]] = []
    if "tiny" in groups:
        cases += tiny_cases(args.quick)
    if "shapes" in groups:
        cases += shape_cases(args.quick)
    if "sharded" in groups:
        cases += sharded_cases(args.quick) if args.device == "cpu" else []
    if "stacks" in groups:
        cases += stack_cases(args.quick) if args.device == "cpu" else []
    t0 = time.perf_counter()
    rows = []
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    previous = {}
    if args.only and Path(args.json).exists():
        previous = {r["id"]: r for r in json.loads(Path(args.json).read_text(encoding="utf-8"))}
    for i, case in enumerate(cases, 1):
        if args.only and not any(part in case["id"] for part in args.only.split("|")):
            if case["id"] in previous:
                rows.append(previous[case["id"]])
            continue
        row = run_case(case, args.device)
        rows.append(row)
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")  # partial results survive a timeout
        status = row.get("error") or " ".join(f"{k[:5]} {pct(v['relative_error'])}" for k, v in row["components"].items())
        print(f"[{i}/{len(cases)}] {row['seconds']:6.1f}s {case['id']}: {status}", flush=True)
    elapsed = time.perf_counter() - t0
    print(f"\n{len(rows)} cases in {elapsed / 60:.1f} min")
    for g in ("tiny", "shapes", "sharded", "stacks"):
        for comp, s in stats([r for r in rows if r["group"] == g]).items():
            print(f"{g:8s} {comp:17s} median |err| {100 * s['median_abs']:6.2f} %   worst {pct(s['worst']):>10s}  ({s['worst_case']})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(markdown(rows, args, elapsed), encoding="utf-8")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
