"""What is alive at the step's peak: the evidence behind a peak discrepancy.

    .venv/bin/python bench/accuracy/peak_snapshot.py --model tests/data/configs/tiny-mistral/config.json \
        --precision bf16-true --attn eager --checkpointing [--method lora] [--batch 2 --seq 128] [--fake]

Builds the scenario like ``fitplan validate`` does, runs a warm-up step, then one step under a live-storage
counter that remembers, for every storage, the operator that created it and the phase it was created in;
prints the storages live at the peak grouped that way, next to fitplan's predicted peak and phase.
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

    import fitplan
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
    est = comparable_estimate(fitplan.estimate(**fields), mode)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
