"""What is alive at the step's peak: the evidence behind a peak discrepancy.

    .venv/bin/python bench/accuracy/peak_snapshot.py --model tests/data/configs/tiny-mistral/config.json \
        --precision bf16-true --attn eager --checkpointing [--method lora] [--batch 2 --seq 128] [--fake]

Builds the scenario like ``fitplan validate`` does, runs a warm-up step, then one step under a live-storage
counter that remembers, for every storage, the operator that created it and the phase it was created in;
prints the storages live at the peak grouped that way, next to fitplan's predicted peak and phase, then what
fitplan's replay holds at its own highest backward instant (the tensors of the layer copy it walks; the other
copies' bytes are the "phantom" total).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import warnings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", default="bf16-true")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--method", default="full")
    ap.add_argument("--lora-targets", default="q_proj,v_proj")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--optim", default="adamw_torch")
    ap.add_argument("--fake", action="store_true", help="under FakeTensorMode (real-size shapes)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")

    import os

    os.environ["FITPLAN_NO_CACHE"] = "1"  # replay the trace here, so that its timeline is collected
    import fitplan
    from fitplan.trace import step_trace
    from fitplan_torch.estimation_bridge import run_config
    from fitplan_torch.measure import LiveBytes, optimizer_state_tensors
    from fitplan_torch.runner import comparable_estimate
    from fitplan_torch.single import build_all, fake_mode
    from fitplan_torch.step import train_step

    fields = dict(model=args.model, precision=args.precision, attn_implementation=args.attn, per_device_train_batch_size=args.batch,
                  max_seq_length=args.seq, method=args.method, gradient_checkpointing=args.checkpointing, optim=args.optim)
    if args.method != "full":
        fields["lora_target_modules"] = tuple(args.lora_targets.split(","))
    mode = "fake" if args.fake else "cpu"
    step_trace.DEBUG = timeline = []
    est = comparable_estimate(fitplan.estimate(**fields), mode)
    step_trace.DEBUG = None
    rc = run_config(est, {}, mode)
    with fake_mode() if args.fake else contextlib.nullcontext() as fake:
        model, opt, batch = build_all(rc, fake)
        train_step(model, opt, batch, precision=rc.precision, device_type="cpu")
        counter = LiveBytes(snapshot=True)
        counter.track([*model.parameters(), *model.buffers(), *optimizer_state_tensors(opt), *batch.values()])
        with counter:
            train_step(model, opt, batch, precision=rc.precision, device_type="cpu", counter=counter)
    groups: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for n, op, phase in counter.peak_snapshot:
        groups[(phase, op)].append(n)
    print(f"measured peak {counter.peak} bytes in {counter.peak_phase}; fitplan predicts {est['peak_bytes']} in {est['peak_phase']}"
          f" (difference {est['peak_bytes'] - counter.peak:+d})\n")
    print(f"{'bytes':>14} {'count':>6}  created in / by")
    for (phase, op), sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(sizes):14d} {len(sizes):6d}  {phase:15s} {op}   sizes {sorted(set(sizes), reverse=True)[:4]}")
    _print_replay_peak(timeline, (args.checkpointing, args.precision, args.attn, args.batch, args.seq))
    return 0


def _print_replay_peak(timeline: list, wanted: tuple) -> None:
    """fitplan's side: the live tensors at the replay's highest backward instant, by recorded label."""
    starts = [i for i, e in enumerate(timeline) if e[0] == "replay"]
    spans = [(timeline[i][1], i, (starts + [len(timeline)])[k + 1]) for k, i in enumerate(starts)]
    # one replay per trace the estimate built: the one of this scenario (a *-mixed run may replay its *-true twin)
    mine = [(spec.precision != wanted[1], i, end) for spec, i, end in spans
            if (spec.checkpointing, spec.attn, spec.batch, spec.seq) == (wanted[0], *wanted[2:])]
    if not mine:
        return
    _, i, end = min(mine)
    points = [e for e in timeline[i:end] if e[0] == "backward"]
    if not points:
        return
    _, name, total, live, extra, grads, alive, _pending = max(points, key=lambda e: e[2])
    print(f"\nfitplan's replay, highest backward instant: {total} bytes at {name} (live {live}, op temporaries {extra},"
          f" parameter gradients {grads}, the rest: other layer copies)")
    groups: dict[str, list[int]] = collections.defaultdict(list)
    for label, n, cat in alive:
        groups[f"{label} [{('saved', 'logits', 'autocast', 'temporary')[cat]}]"].append(n)
    print(f"{'bytes':>14} {'count':>6}  label")
    for label, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(sizes):14d} {len(sizes):6d}  {label}   sizes {sorted(set(sizes), reverse=True)[:4]}")


if __name__ == "__main__":
    sys.exit(main())
