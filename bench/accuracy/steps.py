"""fitplan's step peak against the referee's highest optimizer step on the sharded stacks (issue #31).

Each case runs on 2 (or 4) gloo ranks on the CPU (tiny Llama, 2 x 32 tokens, ``adamw_torch_fused``): accelerate FSDP1 /
FSDP2 through the real ``Trainer.train()`` (``driver=trainer``, fitplan_torch/trainer_fsdp.py) or through
``Accelerator.prepare`` and a bare step (``driver=accelerate``), DeepSpeed driven directly (fitplan_torch/ds_stack.py)
or through ``Trainer.train()`` with ``deepspeed=<ds_config>`` ("Trainer DeepSpeed" cases, fitplan_torch/trainer_ds.py:
fitplan reads the same ds_config and TrainingArguments as ``--deepspeed`` / ``--training-args`` files).
The referee runs at least four optimizer steps and reports every step's peak. Prints a Markdown table for
docs/accuracy-stacks.md ("Several steps")::

    python bench/accuracy/steps.py                 # every case (about 50 minutes on 2 busy cores)
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


AUTO_DS = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
           "gradient_clipping": "auto", "bf16": {"enabled": "auto"}}
"""The top of a ds_config as HF's examples write it: every value the Trainer fills left "auto"."""
AUTO_ZERO = {"reduce_bucket_size": "auto"}
AUTO_ZERO3 = {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}
SMALL_ZERO = {"reduce_bucket_size": 2000, "allgather_bucket_size": 2000}
SMALL_ZERO3 = {"reduce_bucket_size": 2000, "stage3_prefetch_bucket_size": 1000, "stage3_param_persistence_threshold": 100}


def ds_case(label: str, stage: int, zero: dict, *, bf16: bool = True, ckpt: bool = False, gpus: int = 2,
            offload: bool = False) -> tuple[str, dict, dict]:
    """A DeepSpeed-through-the-Trainer case: the ds_config (``ds``) and the TrainingArguments (``ta``) fitplan reads
    through ``--deepspeed`` / ``--training-args`` and the referee hands to ``TrainingArguments``."""
    z = {"stage": stage, **zero}
    if offload:
        z["offload_optimizer"] = {"device": "cpu"}
    ds = {**AUTO_DS, "zero_optimization": z}
    ta = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "bf16": bf16, "optim": "adamw_torch_fused",
          "gradient_checkpointing": ckpt}
    return label, {"ds": ds, "ta": ta, "num_gpus": gpus}, dict(T)


CASES.update({
    "f1_bf16_4": ("Trainer FSDP1 full_shard bf16, 4 ranks",
                  dict(fsdp="full_shard", stack="fsdp1", precision="bf16-mixed", num_gpus=4), dict(T, max_real_ranks=4)),
    "f2_bf16_4": ("Trainer FSDP2 full_shard bf16, 4 ranks",
                  dict(fsdp="full_shard", stack="fsdp2", precision="bf16-mixed", num_gpus=4), dict(T, max_real_ranks=4)),
    "f2_fp32_4": ("Trainer FSDP2 full_shard fp32, 4 ranks",
                  dict(fsdp="full_shard", stack="fsdp2", precision="32-true", num_gpus=4), dict(T, max_real_ranks=4)),
    "tds1_auto": ds_case("Trainer DeepSpeed ZeRO-1 bf16, auto buckets", 1, AUTO_ZERO),
    "tds2_auto": ds_case("Trainer DeepSpeed ZeRO-2 bf16, auto buckets", 2, AUTO_ZERO),
    "tds3_auto": ds_case("Trainer DeepSpeed ZeRO-3 bf16, auto buckets", 3, AUTO_ZERO3),
    "tds2_fp32": ds_case("Trainer DeepSpeed ZeRO-2 fp32, auto buckets", 2, AUTO_ZERO, bf16=False),
    "tds3_fp32": ds_case("Trainer DeepSpeed ZeRO-3 fp32, auto buckets", 3, AUTO_ZERO3, bf16=False),
    "tds2_ckpt": ds_case("Trainer DeepSpeed ZeRO-2 bf16 checkpointing", 2, AUTO_ZERO, ckpt=True),
    "tds3_ckpt": ds_case("Trainer DeepSpeed ZeRO-3 bf16 checkpointing", 3, AUTO_ZERO3, ckpt=True),
    "tds2_small": ds_case("Trainer DeepSpeed ZeRO-2 bf16, small explicit buckets", 2, SMALL_ZERO),
    "tds3_small": ds_case("Trainer DeepSpeed ZeRO-3 bf16, small explicit buckets", 3, SMALL_ZERO3),
    "tds3_small_ckpt": ds_case("Trainer DeepSpeed ZeRO-3 bf16, small explicit buckets, checkpointing", 3, SMALL_ZERO3,
                               ckpt=True),
    "tds2_offload": ds_case("Trainer DeepSpeed ZeRO-2 bf16, optimizer offload", 2, AUTO_ZERO, offload=True),
    "tds3_offload": ds_case("Trainer DeepSpeed ZeRO-3 bf16, optimizer offload", 3, AUTO_ZERO3, offload=True),
    "tds2_4": ds_case("Trainer DeepSpeed ZeRO-2 bf16, 4 ranks", 2, AUTO_ZERO, gpus=4),
    "tds3_4": ds_case("Trainer DeepSpeed ZeRO-3 bf16, 4 ranks", 3, AUTO_ZERO3, gpus=4),
})


def estimate_from_files(ds: dict, ta: dict, **flags):
    """fitplan's estimate fed the ds_config and TrainingArguments as files (``--deepspeed`` / ``--training-args``)."""
    import tempfile

    import fitplan
    from fitplan.inputs.sources import from_options

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "ds.json").write_text(json.dumps(ds))
        (Path(d) / "args.json").write_text(json.dumps(ta))
        opts = {"deepspeed": str(Path(d) / "ds.json"), "training_args": str(Path(d) / "args.json"), "model": TINY,
                "max_seq_length": BASE["max_seq_length"], **flags}
        return fitplan.estimate(from_options(opts).scenario)


def run(name: str) -> dict:
    import fitplan_torch

    import fitplan

    label, fields, options = CASES[name]
    t0 = time.time()
    if "ds" in fields:
        est = estimate_from_files(fields["ds"], fields["ta"], num_gpus=fields["num_gpus"])
        options = dict(options, ds_config=fields["ds"], max_real_ranks=fields["num_gpus"])
    else:
        est = fitplan.estimate(**{**BASE, **fields})
    r = fitplan_torch.validate(est, mode="cpu", **options)
    m, peak = r["measured"], r["components"]["peak"]
    return {"case": name, "label": label, "measured": peak["measured"], "components": {
                k: v["relative_error"] for k, v in r["components"].items()}, "phase_peaks": m.get("phase_peaks"), "predicted": peak["predicted"],
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
