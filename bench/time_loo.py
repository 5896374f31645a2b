"""Fit the time model's efficiency factors on published fine-tuning runs; report the leave-one-out error.

The published runs are the ``[[finetune_run]]`` rows of ``rulesets/throughput/published.toml`` without an
``exclude`` reason. For each, fitplan evaluates the run's scenario once (a run that states its network,
``network_gbps``, on an unpriced reference instance with that network: :func:`cluster_dir`); what the step costs at 100 % of
every peak (the roofline's terms, the optimizer's and the gradients' bytes, the communication) does not
depend on the efficiency factors, so the fit re-prices those parts only (:func:`predict`, which must agree
with ``fitplan estimate``: the script checks it on every row).

Fitted (nothing else): per GPU generation the GEMM efficiency; one attention / GEMM ratio; one memory-bandwidth
efficiency; one host time per kernel launch and per ZeRO-3 fetch. Loss: the mean absolute log error of time
(robust to a few badly described runs), each source's runs weighing as much in all as another source's
(:func:`source_weights`). Each row is then predicted with the factors fitted on the other rows
(leave-one-out): the time error is predicted / measured time − 1.

Writes ``rulesets/throughput/fitted.toml`` (the factors fitted on all rows, and the band: the 10th and 90th
percentiles of measured / leave-one-out-predicted time) and the block between the ``time-loo`` markers of
docs/time-and-cost.md. Usage: ``python bench/time_loo.py [--check]`` (``--check``: exit 1 if either is out of
date, write nothing).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

import fitplan
from fitplan.builtin.time import roofline
from fitplan.builtin.time.comm import COMM_OVERLAP_FRACTION
from fitplan.rulesets import loader

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "time-and-cost.md"
FITTED = ROOT / "rulesets" / "throughput" / "fitted.toml"
START, END = "<!-- time-loo:start -->", "<!-- time-loo:end -->"
GENERATIONS = ("ampere", "ada", "hopper")
PARAMS = ("gemm_ampere", "gemm_ada", "gemm_hopper", "attention_ratio", "memory", "host", "zero3_fetch")
"""One attention / GEMM ratio for every generation: a ratio per attention-kernel family (FlashAttention-2's, and
Hopper's) was tried and left the leave-one-out no better (median 5.9 % against 5.2 %), while Hopper's, seen only
through NVIDIA's Transformer Engine rows at 4,096 tokens, went to the cap of 1 (docs/time-and-cost.md)."""
PHASES = ("forward", "recompute", "backward")
BAND = (10.0, 90.0)


# --------------------------------------------------------------------------- each run's parts


def used_runs(rules) -> list:
    return sorted((r for r in rules.finetune_runs.values() if not r.exclude), key=lambda r: r.id)


def evaluate(run, tmp: Path, ruleset_dirs=()):
    fields = dict(run.scenario)
    if run.config:
        path = tmp / f"{run.id}.json"
        path.write_text(json.dumps(run.config), encoding="utf-8")
        fields["model"] = str(path)
    if run.network_gbps is not None:
        ruleset_dirs = (*ruleset_dirs, str(cluster_dir(run, tmp)))
        fields["provider"], fields["instance"] = CLUSTER, run.id
    return fitplan.estimate(total_tokens=1_000_000, ruleset_dirs=ruleset_dirs, **fields)


CLUSTER = "published-cluster"


def cluster_dir(run, tmp: Path) -> Path:
    """A ruleset folder with the servers a run's source states (``network_gbps`` GB/s between servers of
    ``num_gpus`` GPUs): an unpriced reference provider, so that the communication model sees the stated network
    (``builtin/sharding/comm.py`` ``topology``: an instance's ``network_gbps`` over its GPUs)."""
    folder = tmp / f"{run.id}-cluster"
    folder.mkdir(exist_ok=True)
    s = run.scenario
    (folder / "cluster.toml").write_text("\n".join([
        "[[provider]]", f'id = "{CLUSTER}"', 'name = "the servers a published run states"', "reference = true",
        'source = "bench/time_loo.py"', "",
        "[[instance]]", f'provider = "{CLUSTER}"', f'id = "{run.id}"', f'gpu = "{s["gpu"]}"', f"gpus = {s.get('num_gpus', 1)}",
        "on_demand_per_hour = 0", f"network_gbps = {run.network_gbps}", f"source = {json.dumps(run.source)}", ""]),
        encoding="utf-8")
    return folder


def parts(run, est) -> dict:
    """What does not depend on the efficiency factors: the roofline's terms at 100 % of the peaks, the
    per-step bytes (optimizer, accumulation, clipping) at 100 % of the bandwidth, the kernels, the transfers."""
    v = est.values
    gpu = v["gpu_spec"]
    bw = gpu.bandwidth_gbps * 1e9
    trace = v["step_trace"]
    ts = roofline.terms(trace.work, gpu.peak_tflops, gpu.bandwidth_gbps, compiled=bool(v["torch_compile"]),
                        tf32=bool(v["tf32"]), split=v["tensor_parallel"])
    world = v["world_size"]
    return {
        "id": run.id, "gen": gpu.generation, "k": v["gradient_accumulation_steps"], "gpu": gpu.id,
        "gpus": world, "method": v["method"], "publisher": run.source.split(" @")[0].split(",")[0].strip(),
        "kind": [0 if t.kind == "gemm" else 1 if t.kind == "attention" else 2 for t in ts],
        "phase": [PHASES.index(t.phase) for t in ts], "fetches": v["zero3_fetches_per_pass"],
        "f": [t.flop_seconds for t in ts], "b": [t.byte_seconds for t in ts], "n": [t.kernels for t in ts],
        "mem": (v["gradient_accumulation_bytes"] + v["grad_clip_bytes"] + v["fsdp_copy_out_bytes"]
                + v["fsdp_grad_cat_bytes"]) / bw,
        "opt": v["optimizer_step_bytes"] / bw, "opt_kernels": v["optimizer_step_kernels"],
        "micro_transfers": (v["comm_seconds_by_window"] or {}).get("micro", 0.0) + v["offload_seconds_per_step"],
        "last_transfers": (v["comm_seconds_by_window"] or {}).get("last", 0.0),
        "serial_transfers": (v["comm_seconds_by_window"] or {}).get("serial", 0.0),
        "tokens_per_gpu_step": v["tokens_per_step"] / world,
        "measured": run.tokens_per_second_per_gpu,
    }


class Data:
    """Every used run's parts as numpy arrays (terms of all runs concatenated)."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        self.ids = [r["id"] for r in rows]
        self.gen = np.array([GENERATIONS.index(r["gen"]) for r in rows])
        self.row = np.concatenate([np.full(len(r["kind"]), i) for i, r in enumerate(rows)])
        self.slot = self.row * len(PHASES) + np.concatenate([r["phase"] for r in rows])
        self.kind = np.concatenate([r["kind"] for r in rows])
        self.f = np.concatenate([r["f"] for r in rows])
        self.b = np.concatenate([r["b"] for r in rows])
        self.n = np.concatenate([r["n"] for r in rows])
        for key in ("k", "fetches", "mem", "opt", "opt_kernels", "micro_transfers", "last_transfers",
                    "serial_transfers", "tokens_per_gpu_step", "measured"):
            setattr(self, key, np.array([float(r[key]) for r in rows]))
        self.weight = source_weights(rows)


def source_weights(rows: list[dict]) -> np.ndarray:
    """Each run's weight in the fit: 1 / the number of used runs from its source. A source's table measures one
    stack many times over (llm-foundry publishes dozens of rows, NVIDIA's benchmarks three); unweighted, the
    largest table would set a GPU generation's efficiency for every stack."""
    names = [source_name(r) for r in rows]
    return np.array([1.0 / names.count(n) for n in names])


def efficiency(theta: np.ndarray) -> dict[str, float]:
    return dict(zip(PARAMS, np.exp(theta)))


def peaks_fractions(p: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The GEMM and attention efficiency of each generation (:data:`GENERATIONS`) and the memory efficiency, each
    at most 1 (a fraction of a peak; the loss also penalises the fit for pushing past it)."""
    gemm = np.minimum(p[:3], 1.0)
    att = np.minimum(gemm * p[3], 1.0)
    return gemm, att, min(p[4], 1.0)


def predict(d: Data, theta: np.ndarray) -> np.ndarray:
    """Predicted tokens/s per GPU of every run: the step model of ``builtin/time`` (roofline, overlap of host
    and GPU per phase, accumulation, clipping, optimizer, communication overlap), vectorised."""
    p = np.exp(theta)
    gemm_gen, att_gen, mem = peaks_fractions(p)
    gemm, att = gemm_gen[d.gen][d.row], att_gen[d.gen][d.row]
    host, fetch = p[5], p[6]
    t = np.where(d.kind == 2, d.b / mem, np.maximum(d.f / np.where(d.kind == 0, gemm, att), d.b / mem))
    nrows = len(d.rows)
    slots = nrows * len(PHASES)
    gpu = np.bincount(d.slot, t, slots)
    kernels = np.bincount(d.slot, d.n, slots)
    present = kernels > 0
    host_time = kernels * host + np.repeat(d.fetches * fetch, len(PHASES)) * present
    micro = np.where(present, np.sqrt(gpu ** 2 + host_time ** 2), 0.0).reshape(nrows, len(PHASES)).sum(axis=1)
    optimizer = np.sqrt((d.opt / mem) ** 2 + (d.opt_kernels * host) ** 2)
    compute = d.k * micro + d.mem / mem + optimizer
    hide = COMM_OVERLAP_FRACTION * d.k * micro  # exposed_transfer_seconds: beside the micro-steps only
    last_hidden = np.minimum(d.last_transfers, hide / d.k)
    exposed = d.last_transfers - last_hidden + np.maximum(0.0, d.micro_transfers - (hide - last_hidden)) + d.serial_transfers
    step = compute + exposed
    return d.tokens_per_gpu_step / step


def loss(d: Data, theta: np.ndarray, mask: np.ndarray) -> float:
    """Mean absolute log error of time, each source's rows weighing as much in all as another source's
    (:func:`source_weights`), plus a penalty on efficiencies above 1."""
    err = np.abs(np.log(predict(d, theta)[mask] / d.measured[mask]))
    w = d.weight[mask]
    p = np.exp(theta)
    over = np.sum(np.maximum(0.0, np.log(np.concatenate([p[:3], p[:3] * p[3], p[4:5]]))) ** 2) * 100  # efficiencies <= 1
    return float(np.sum(w * err) / np.sum(w) + over)


def nelder_mead(f, x0: np.ndarray, step: float = 0.3, iters: int = 3000, tol: float = 1e-10) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (the standard Nelder-Mead simplex: reflection, expansion, contraction, shrink)."""
    n = len(x0)
    pts = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(x) for x in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        centroid = np.mean(pts[:-1], axis=0)
        xr = centroid + (centroid - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0] + 0.5 * (x - pts[0]) for x in pts]
                vals = [f(x) for x in pts]
    return pts[int(np.argmin(vals))]


START_THETA = np.log(np.array([0.8, 0.9, 0.7, 0.8, 0.85, 2e-5, 3e-4]))


STARTS = (START_THETA, START_THETA + np.log(np.array([0.8, 0.8, 0.8, 1.0, 1.1, 2.0, 0.5])),
          START_THETA + np.log(np.array([1.1, 1.0, 1.2, 0.8, 0.9, 0.6, 2.0])))
"""Starting points of the fit (the best of the three is kept: the loss has flat directions)."""


def fit(d: Data, mask: np.ndarray, starts=STARTS, steps=(0.3, 0.1, 0.03)) -> np.ndarray:
    best, best_loss = None, math.inf
    for x in starts:
        for step in steps:  # restarts with smaller simplices
            x = nelder_mead(lambda t: loss(d, t, mask), x, step=step)
        value = loss(d, x, mask)
        if value < best_loss:
            best, best_loss = x, value
    return best


# --------------------------------------------------------------------------- outputs


def factors(d: Data, theta: np.ndarray) -> dict:
    p = np.exp(theta)
    gemm, att, mem = peaks_fractions(p)
    gens = {}
    for i, gen in enumerate(GENERATIONS):
        gens[gen] = {"gemm": gemm[i], "attention": att[i], "memory": mem, "runs": int(np.sum(d.gen == i))}
    return {"generations": gens, "host": p[5], "fetch": p[6]}


def calibrated_ratios(d: Data, theta: np.ndarray) -> np.ndarray:
    """What calibrating on one's own run leaves: for every ordered pair of distinct runs on the same GPU type
    published by the same source (one team's stack, as a user's own runs are), run i's measured / predicted time
    once the model (fitted on all runs, as users get it) is scaled by run j's measured / predicted time
    (``fitplan calibrate`` on j, then an estimate of i)."""
    q = predict(d, theta) / d.measured  # measured time / predicted time
    key = [(r["gpu"], r["publisher"]) for r in d.rows]
    return np.array([q[i] / q[j] for i in range(len(q)) for j in range(len(q)) if i != j and key[i] == key[j]])


def fitted_toml(d: Data, theta: np.ndarray, loo_ratio: np.ndarray, err: np.ndarray) -> str:
    """``loo_ratio``: each run's measured / leave-one-out predicted time."""
    f = factors(d, theta)
    low, high = np.percentile(loo_ratio, BAND)
    pairs = calibrated_ratios(d, theta)
    clow, chigh = np.percentile(pairs, BAND)
    worst = err[np.argmax(np.abs(err))]
    src = ("bench/time_loo.py: fitted on the %d used [[finetune_run]] rows of rulesets/throughput/published.toml "
           "(mean absolute log error of time)" % len(d.rows))
    lines = ["# Written by `python bench/time_loo.py` (do not edit: rerun it). The time model's efficiency factors,",
             "# fitted on published fine-tuning runs, and its leave-one-out band (docs/time-and-cost.md).", "",
             "[time_model]",
             f"host_seconds_per_kernel = {f['host']:.4g}",
             f"host_seconds_per_zero3_fetch = {f['fetch']:.4g}",
             f"band_low = {low:.4f}",
             f"band_high = {high:.4f}",
             f"band_percentiles = [{BAND[0]:g}, {BAND[1]:g}]",
             f"calibrated_band_low = {clow:.4f}",
             f"calibrated_band_high = {chigh:.4f}",
             f"calibrated_pairs = {len(pairs)}",
             f"loo_median = {np.median(np.abs(err)):.4f}",
             f"loo_worst = {worst:.4f}",
             f"runs = {len(d.rows)}",
             f"source = {json.dumps(src)}", ""]
    for gen, g in f["generations"].items():
        lines += ["[[time_efficiency]]", f'generation = "{gen}"', f"gemm = {g['gemm']:.4f}",
                  f"attention = {g['attention']:.4f}", f"memory = {g['memory']:.4f}", f"runs = {g['runs']}",
                  f"source = {json.dumps(src)}", ""]
    return "\n".join(lines)


def source_name(row: dict) -> str:
    """The repository a run was published in (``github.com/pytorch/torchtune README.md`` -> ``pytorch/torchtune``)."""
    return row["publisher"].split()[0].removeprefix("github.com/")


SUBSETS = (("full fine-tuning", lambda r: r["method"] == "full"), ("LoRA", lambda r: r["method"] == "lora"),
           ("QLoRA", lambda r: r["method"] == "qlora"), ("one GPU", lambda r: r["gpus"] == 1),
           ("several GPUs", lambda r: r["gpus"] > 1), ("Ampere", lambda r: r["gen"] == "ampere"),
           ("Ada", lambda r: r["gen"] == "ada"), ("Hopper", lambda r: r["gen"] == "hopper"))
"""The subsets the leave-one-out error is reported on (the issue's goals: LoRA and several GPUs)."""


def subset_lines(d: Data, err: np.ndarray) -> list[str]:
    """Median absolute and median signed error (the sign bias) and the worst error of each subset and each
    source, so that an error shared by one kind of run shows."""
    groups = [(name, [i for i, r in enumerate(d.rows) if test(r)]) for name, test in SUBSETS]
    sources = sorted({source_name(r) for r in d.rows})
    groups += [(f"source {s}", [i for i, r in enumerate(d.rows) if source_name(r) == s]) for s in sources]
    lines = ["| subset | runs | median abs. time error | median signed (bias) | worst (signed) |",
             "|---|---:|---:|---:|---:|"]
    for name, idx in groups:
        if not idx:
            continue
        e = err[idx]
        lines.append(f"| {name} | {len(idx)} | {100 * np.median(np.abs(e)):.1f} % | {100 * np.median(e):+.1f} % | "
                     f"{100 * e[np.argmax(np.abs(e))]:+.1f} % |")
    return lines


def report(d: Data, theta: np.ndarray, loo: np.ndarray, rules) -> str:
    err = d.measured / loo - 1
    f = factors(d, theta)
    excluded = sorted((r for r in rules.finetune_runs.values() if r.exclude), key=lambda r: r.id)
    methods = {m: sum(1 for r in d.rows if r["method"] == m) for m in ("full", "lora", "qlora")}
    lines = [f"Leave-one-out over the {len(d.rows)} used published fine-tuning runs (`rulesets/throughput/published.toml`; "
             f"{methods['full']} full, {methods['lora']} LoRA, {methods['qlora']} QLoRA; {len(excluded)} more rows excluded, "
             "each with its reason). Each run is predicted with the factors fitted on the others; time error = "
             "predicted / measured time − 1 (positive: fitplan is pessimistic).", "",
             "| | median abs. time error | mean abs. | worst (signed) | within ±15 % | within ±40 % |",
             "|---|---:|---:|---:|---:|---:|",
             f"| leave-one-out | {100 * np.median(np.abs(err)):.1f} % | {100 * np.mean(np.abs(err)):.1f} % | "
             f"{100 * err[np.argmax(np.abs(err))]:+.1f} % | {np.sum(np.abs(err) <= 0.15)} / {len(err)} | "
             f"{np.sum(np.abs(err) <= 0.40)} / {len(err)} |", "",
             f"By kind of run and by source ({len({source_name(r) for r in d.rows})} sources):", "",
             *subset_lines(d, err), "",
             "Fitted on all of them (`rulesets/throughput/fitted.toml`):", "",
             "| GPU generation | runs | GEMM | attention | memory |", "|---|---:|---:|---:|---:|"]
    for gen, g in f["generations"].items():
        lines.append(f"| {gen} | {g['runs']} | {100 * g['gemm']:.1f} % | {100 * g['attention']:.1f} % | {100 * g['memory']:.1f} % |")
    low, high = np.percentile(loo / d.measured, BAND)
    pairs = calibrated_ratios(d, theta)
    clow, chigh = np.percentile(pairs, BAND)
    lines += ["", f"Host: {1e6 * f['host']:.1f} µs per kernel launch, {1e6 * f['fetch']:.0f} µs per DeepSpeed ZeRO-3 "
              f"parameter fetch. Band (the {BAND[0]:g}th and {BAND[1]:g}th percentiles of measured / predicted time): "
              f"× {low:.2f} to × {high:.2f}; after `fitplan calibrate` on another run on the same GPU type from the same "
              f"source ({len(pairs)} ordered pairs of these runs): × {clow:.2f} to × {chigh:.2f}.", "",
              "| run | GPU | method | measured tokens/s/GPU | predicted (leave-one-out) | time error |",
              "|---|---|---|---:|---:|---:|"]
    for i in np.argsort(-np.abs(err)):
        r = d.rows[i]
        lines.append(f"| {r['id']} | {r['gpu']} × {r['gpus']} | {r['method']} | {d.measured[i]:,.0f} | {loo[i]:,.0f} | "
                     f"{100 * err[i]:+.0f} % |")
    return "\n".join(lines) + "\n"


def updated_doc(block: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    head, sep, rest = text.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{DOC}: markers {START} / {END} not found")
    return f"{head}{START}\n{block}{END}{tail}"


def check_against_fitplan(runs, d: Data, theta: np.ndarray, fitted: str) -> None:
    """The vectorised model must be fitplan's: evaluate every run with the fitted rulesets and compare."""
    pred = predict(d, theta)
    with tempfile.TemporaryDirectory() as tmp:
        rdir = Path(tmp) / "rules"
        rdir.mkdir()
        (rdir / "fitted.toml").write_text(fitted, encoding="utf-8")
        for i, run in enumerate(runs):
            est = evaluate(run, Path(tmp), [str(rdir)])
            got = est["train_tokens_per_second"] / est["world_size"]
            if abs(got / pred[i] - 1) > 1e-3:
                raise SystemExit(f"{run.id}: fitplan gives {got:.1f} tokens/s/GPU, the fit's model {pred[i]:.1f}")


def main(argv: list[str]) -> int:
    rules = loader.load()
    runs = used_runs(rules)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [parts(run, evaluate(run, Path(tmp))) for run in runs]
    d = Data(rows)
    everything = np.ones(len(rows), bool)
    theta = fit(d, everything)
    loo = np.empty(len(rows))
    for i in range(len(rows)):
        mask = everything.copy()
        mask[i] = False
        # leaving one run out moves the optimum a little: start from the fit on all runs (the multiple starts
        # are for the full fit's flat directions)
        loo[i] = predict(d, fit(d, mask, (theta,), steps=(0.1, 0.03)))[i]
    err = d.measured / loo - 1
    fitted = fitted_toml(d, theta, loo / d.measured, err)
    check_against_fitplan(runs, d, theta, fitted)
    block = report(d, theta, loo, rules)
    print(block)
    new_doc = updated_doc(block)
    if "--check" in argv:
        stale = [p for p, text in ((FITTED, fitted), (DOC, new_doc)) if not p.exists() or p.read_text(encoding="utf-8") != text]
        if stale:
            print("out of date: " + ", ".join(map(str, stale)) + ": run python bench/time_loo.py", file=sys.stderr)
            return 1
        return 0
    FITTED.write_text(fitted, encoding="utf-8")
    DOC.write_text(new_doc, encoding="utf-8")
    print(f"wrote {FITTED} and {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
