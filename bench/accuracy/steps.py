"""fitplan's step peak against the referee's highest optimizer step on the sharded stacks (issue #31).

Each case runs on 2 gloo ranks on the CPU (tiny Llama, 2 x 32 tokens, ``adamw_torch_fused``): accelerate FSDP1 /
FSDP2 through the real ``Trainer.train()`` (``driver=trainer``, fitplan_torch/trainer_fsdp.py) or through
``Accelerator.prepare`` and a bare step (``driver=accelerate``), DeepSpeed driven directly (fitplan_torch/ds_stack.py).
The referee runs at least four optimizer steps and reports every step's peak. Prints a Markdown table for
docs/accuracy-stacks.md ("Several steps")::

    python bench/accuracy/steps.py                 # every case (about 15 minutes on 2 busy cores)
    python bench/accuracy/steps.py f1_sgo_env ds2  # some
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

TINY = str(Path(__file__).resolve().parents[2] / "tests" / "data" / "configs" / "tiny-llama" / "config.json")
BASE = dict(model=TINY, per_device_train_batch_size=2, max_seq_length=32, num_gpus=2, optim="adamw_torch_fused")
T = {"driver": "trainer"}
A = {"driver": "accelerate"}
AUTO3 = dict(reduce_bucket_size="auto", stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto")
CASES: dict[str, tuple[str, dict, dict]] = {
    "f1_bf16": ("Trainer FSDP1 full_shard bf16", dict(fsdp="full_shard", stack="fsdp1", precision="bf16-mixed"), T),
    "f1_fp32": ("Trainer FSDP1 full_shard fp32", dict(fsdp="full_shard", stack="fsdp1", precision="32-true"), T),
    "f1_ckpt": ("Trainer FSDP1 full_shard bf16 checkpointing",
                dict(fsdp="full_shard", stack="fsdp1", precision="bf16-mixed", gradient_checkpointing=True), T),
    "f1_no_orig": ("Trainer FSDP1 full_shard bf16 use_orig_params=False",
                   dict(fsdp="full_shard", stack="fsdp1", precision="bf16-mixed"), dict(T, use_orig_params=False)),
    "f1_sgo_trainer": ('Trainer FSDP1 fsdp="shard_grad_op" (runs FULL_SHARD)',
                       dict(fsdp="shard_grad_op", stack="fsdp1", precision="bf16-mixed"), T),
    "f1_sgo_env": ("Trainer FSDP1 FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP bf16",
                   dict(fsdp="shard_grad_op", stack="fsdp1", precision="bf16-mixed", fsdp_sharding_strategy="shard_grad_op"), T),
    "f2_bf16": ("Trainer FSDP2 full_shard bf16", dict(fsdp="full_shard", stack="fsdp2", precision="bf16-mixed"), T),
    "f2_fp32": ("Trainer FSDP2 full_shard fp32", dict(fsdp="full_shard", stack="fsdp2", precision="32-true"), T),
    "f2_ckpt": ("Trainer FSDP2 full_shard bf16 checkpointing",
                dict(fsdp="full_shard", stack="fsdp2", precision="bf16-mixed", gradient_checkpointing=True), T),
    "f2_sgo": ("Trainer FSDP2 shard_grad_op bf16", dict(fsdp="shard_grad_op", stack="fsdp2", precision="bf16-mixed"), T),
    "f2_lora": ("Trainer FSDP2 full_shard bf16 LoRA",
                dict(fsdp="full_shard", stack="fsdp2", precision="bf16-mixed", method="lora"), T),
    "f1_lora": ("Trainer FSDP1 full_shard bf16 LoRA",
                dict(fsdp="full_shard", stack="fsdp1", precision="bf16-mixed", method="lora"), T),
    "a1_bf16": ("accelerate FSDP1 full_shard bf16", dict(fsdp="full_shard", stack="fsdp1", precision="bf16-mixed"), A),
    "a2_fp32": ("accelerate FSDP2 full_shard fp32", dict(fsdp="full_shard", stack="fsdp2", precision="32-true"), A),
    "ds0_bf16": ("DeepSpeed ZeRO-0 bf16", dict(zero_stage=0, precision="bf16-master", stack="deepspeed"), {}),
    "ds1_auto": ("DeepSpeed ZeRO-1 bf16, auto buckets", dict(zero_stage=1, precision="bf16-master", reduce_bucket_size="auto"), {}),
    "ds2_auto": ("DeepSpeed ZeRO-2 bf16, auto buckets", dict(zero_stage=2, precision="bf16-master", reduce_bucket_size="auto"), {}),
    "ds3_auto": ("DeepSpeed ZeRO-3 bf16, auto buckets", dict(zero_stage=3, precision="bf16-master", **AUTO3), {}),
}


def run(name: str) -> dict:
    import fitplan
    import fitplan_torch

    label, fields, options = CASES[name]
    t0 = time.time()
    est = fitplan.estimate(**BASE, **fields)
    r = fitplan_torch.validate(est, mode="cpu", **options)
    m, peak = r["measured"], r["components"]["peak"]
    return {"case": name, "label": label, "measured": peak["measured"], "predicted": peak["predicted"],
            "error": peak["relative_error"], "peak_step": m.get("peak_step"), "step_peaks": m.get("step_peaks"),
            "phase": r["peak_phase"], "seconds": round(time.time() - t0)}


def row(x: dict) -> str:
    steps = ", ".join(f"{p:,}" for p in x["step_peaks"] or [])
    return (f"| {x['label']} | {x['measured']:,} | {x['peak_step']} ({steps}) | {x['predicted']:,} | "
            f"{100 * x['error']:+.2f} % | {x['phase']['predicted']} / {x['phase']['measured']} |")


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    print("| case | referee: highest step (B) | which step (every step's peak) | fitplan (B) | error | phase (pred / meas) |")
    print("|---|---:|---|---:|---:|---|")
    for n in names:
        x = run(n)
        print(row(x), flush=True)
        print(json.dumps(x), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
