"""Write what fitplan prints and emits for a fixed set of runs into a folder, so that two trees can be compared
byte for byte (``diff -r``): a refactoring that must not change a number, such as declaring ``offload_params``
through the settings hook (issue #26).

    PYTHONPATH=OLD/src python bench/outputs_snapshot.py /tmp/before
    PYTHONPATH=NEW/src python bench/outputs_snapshot.py /tmp/after
    diff -r /tmp/before /tmp/after | grep -v "candidate plans in"   # the recommend tables' wall-clock line differs

84 estimates (llama-2-7b and qwen2.5-0.5b; ZeRO 0/2/3 with and without optimizer and parameter offload; bf16-mixed
and bf16-master, which DeepSpeed refuses for the first: 32 refusals, compared too; 1 and 4 GPUs; full and LoRA;
FSDP with and without offload), each as ``--format json`` and as ``--emit all`` files, and 7 ``fitplan recommend``
runs (JSON and table), three of which choose parameter offload.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import tempfile

from click.testing import CliRunner

from fitplan.cli import cli, load_commands

DATA = ["--num-examples", "1000", "--tokens-per-example", "512"]
RECOMMEND = [
    ["--model", "llama-2-7b", "--gpus", "a100-80gb,h100-sxm", "--providers", "aws", "--objective", "gpus"],
    ["--model", "qwen2.5-0.5b", "--gpus", "a100-40gb", *DATA],
    ["--model", "llama-2-7b", "--gpus", "a10g", "--max-gpus", "8", *DATA],
    ["--model", "llama-2-7b", "--gpus", "a100-80gb", "--offload-params", *DATA],
    ["--model", "llama-2-13b", "--gpus", "a100-40gb", "--providers", "aws,gcp", "--max-gpus", "8", "--precision",
     "32-true", "--objective", "gpus", "--top", "10"],
    ["--model", "llama-2-13b", "--gpus", "a100-40gb,a100-80gb", "--providers", "aws,gcp", "--max-gpus", "8",
     "--precision", "32-true", *DATA, "--top", "10"],
    ["--model", "llama-2-70b", "--gpus", "a100-80gb", "--max-gpus", "8", "--objective", "gpus", "--top", "10"],
]


def estimates() -> list[list[str]]:
    out = []
    for m, (z, oo, op), prec, n, method in itertools.product(
            ["llama-2-7b", "qwen2.5-0.5b"],
            [(0, False, False), (2, True, False), (3, True, True), (3, False, True), (3, True, False)],
            ["bf16-mixed", "bf16-master"], [1, 4], ["full", "lora"]):
        args = ["--model", m, "--zero", str(z), "--precision", prec, "--num-gpus", str(n), "--method", method,
                "--optim", "adamw_torch_fused", "--gpu", "a100-80gb", *DATA, "--provider", "aws",
                "--per-device-train-batch-size", "2", "--max-seq-length", "1024"]
        out.append(args + ["--offload-optimizer"] * oo + ["--offload-params"] * op)
    for m, op in itertools.product(["llama-2-7b", "qwen2.5-0.5b"], [False, True]):
        out.append(["--model", m, "--fsdp", "full_shard", "--num-gpus", "4", "--precision", "bf16-mixed", "--optim",
                    "adamw_torch_fused", "--gpu", "a100-80gb"] + ["--offload-params", "--offload-optimizer"] * op)
    return out


def emitted(runner: CliRunner, args: list[str]) -> str:
    d = tempfile.mkdtemp()
    try:
        res = runner.invoke(cli, ["estimate", *args, "--emit", "all", d + "/e", "--format", "json"])
        files = {f: open(f"{d}/e/{f}", encoding="utf-8").read() for f in sorted(os.listdir(d + "/e"))} \
            if os.path.isdir(d + "/e") else {}
        return f"EXIT {res.exit_code}\n" + json.dumps(files, indent=1, sort_keys=True)
    finally:
        shutil.rmtree(d)


def main(out: str) -> None:
    load_commands()
    os.makedirs(out, exist_ok=True)
    runner = CliRunner()
    for i, args in enumerate(estimates()):
        res = runner.invoke(cli, ["estimate", *args, "--format", "json"])
        text = res.output if res.exit_code in (0, 3) else f"EXIT {res.exit_code}\n{res.output}{res.stderr}"
        with open(f"{out}/est{i:03d}.json", "w", encoding="utf-8") as f:
            f.write(" ".join(args) + "\n" + text)
        with open(f"{out}/est{i:03d}.emit", "w", encoding="utf-8") as f:
            f.write(emitted(runner, args))
    for i, args in enumerate(RECOMMEND):
        args = [*args, "--optim", "adamw_torch_fused"] + ([] if "--precision" in args else ["--precision", "bf16-mixed"])
        for fmt, ext in ((["--format", "json"], "json"), ([], "txt")):
            res = runner.invoke(cli, ["recommend", *args, *fmt])
            with open(f"{out}/rec{i}.{ext}", "w", encoding="utf-8") as f:
                f.write(" ".join(args) + f"\nEXIT {res.exit_code}\n" + res.output + res.stderr)
    print(f"{len(estimates())} estimates, {len(RECOMMEND)} recommend runs written to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
