"""Write what fitplan prints and emits for a fixed set of runs into a folder, so that two trees can be compared
byte for byte (``diff -r``): a refactoring that must not change a number, such as declaring ``offload_params``
through the settings hook (issue #26), or ``activation_offloading`` and ``load_in_8bit`` (issue #33).

    PYTHONPATH=OLD/src python bench/outputs_snapshot.py /tmp/before
    PYTHONPATH=NEW/src python bench/outputs_snapshot.py /tmp/after
    diff -r /tmp/before /tmp/after | grep -v "candidate plans in"   # the recommend tables' wall-clock line differs

84 estimates (llama-2-7b and qwen2.5-0.5b; ZeRO 0/2/3 with and without optimizer and parameter offload; bf16-mixed
and bf16-master, which DeepSpeed refuses for the first: 32 refusals, compared too; 1 and 4 GPUs; full and LoRA;
FSDP with and without offload), each as ``--format json`` and as ``--emit all`` files, and 7 ``fitplan recommend``
runs (JSON and table), three of which choose parameter offload. Then #33's two fields: 29 estimates (every
activation offloading mode with and without checkpointing, full and LoRA; 8-bit and 4-bit QLoRA; the refusals: 8-bit
without QLoRA, offloading under DPO, Unsloth's without checkpointing, an unknown mode) as JSON, table and
``--emit all``; every recipe of ``tests/data/recipes`` and copies that turn offloading or 8 bits on, and two
TrainingArguments JSONs, through ``--recipe`` / ``--training-args`` (JSON and the scenario TOML); ``estimate --help``
and the page's form fields (``/api/options``).
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


def offload_estimates() -> list[list[str]]:
    """Issue #33's fields: ``activation_offloading`` (each mode x checkpointing x full/LoRA) and ``load_in_8bit``."""
    job = ["--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--gpu", "a100-80gb", *DATA, "--provider",
           "aws", "--per-device-train-batch-size", "2", "--max-seq-length", "1024"]
    out = [["--model", m, "--method", method, "--activation-offloading", mode, *job]
           + ["--gradient-checkpointing"] * ckpt
           for m, mode, ckpt, method in itertools.product(["llama-3.1-8b"], ["none", "torchtune", "trl", "trl_sync",
                                                                             "unsloth"], [False, True], ["full", "lora"])]
    for extra in (["--method", "qlora", "--load-in-8bit"], ["--method", "qlora", "--no-load-in-8bit"],
                  ["--method", "qlora", "--load-in-8bit", "--activation-offloading", "trl_sync"],
                  ["--method", "qlora", "--load-in-8bit", "--gradient-checkpointing", "--kbit-preparation", "none"],
                  ["--method", "lora", "--load-in-8bit"], ["--method", "lora", "--activation-offloading", "trl",
                                                            "--trainer", "dpo"],
                  ["--method", "qlora", "--load-in-8bit", "--trainer", "dpo"],
                  ["--method", "lora", "--activation-offloading", "cpu"], ["--activation-offloading", "torchtune"]):
        out.append(["--model", "qwen2.5-0.5b", *extra, *job])
    return out


def recipe_runs(tmp: str) -> list[list[str]]:
    """``--recipe`` for every recipe of tests/data/recipes, copies of some with offloading or 8 bits turned on,
    and ``--training-args`` for TRL's ``activation_offloading`` (true, and a value it refuses)."""
    root = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "recipes")
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                   if f.endswith((".yml", ".yaml")) and "deepspeed" not in d and "examples" not in d)
    changes = {"torchtune/llama3_1-8B_lora_single_device.yaml": ("enable_activation_offloading: False",
                                                                 "enable_activation_offloading: True"),
               "torchtune/llama2-7B_lora_single_device.yaml": ("enable_activation_offloading: False",
                                                               "enable_activation_offloading: True"),
               "axolotl/llama-3-lora-1b.yml": ("adapter: lora", "adapter: lora\nactivation_offloading: true"),
               "axolotl/llama-3-fft-8b.yaml": ("base_model:", "activation_offloading: legacy\nbase_model:"),
               "llamafactory/train_lora-llama3_lora_sft.yaml": ("stage: sft", "stage: sft\nuse_unsloth_gc: true"),
               "llamafactory/train_qlora-llama3_lora_sft_otfq.yaml": ("quantization_bit: 4", "quantization_bit: 8")}
    for i, (name, (old, new)) in enumerate(sorted(changes.items())):
        text = open(os.path.join(root, name), encoding="utf-8").read()
        assert old in text, name
        files.append(os.path.join(tmp, f"{i}-{os.path.basename(name)}"))
        with open(files[-1], "w", encoding="utf-8") as f:
            f.write(text.replace(old, new, 1))
    out = [["--recipe", f, "--gpu", "a100-80gb"] for f in files]
    for i, body in enumerate(('{"activation_offloading": true, "gradient_checkpointing": true, "bf16": true}',
                              '{"activation_offloading": "yes"}')):
        with open(os.path.join(tmp, f"args{i}.json"), "w", encoding="utf-8") as f:
            f.write(body)
        out.append(["--model", "qwen2.5-0.5b", "--training-args", f.name, "--gpu", "a100-80gb"])
    return out


def emitted(runner: CliRunner, args: list[str], kind: str = "all") -> str:
    d = tempfile.mkdtemp()
    try:
        res = runner.invoke(cli, ["estimate", *args, "--emit", kind, d + "/e", "--format", "json"])
        files = {f: open(f"{d}/e/{f}", encoding="utf-8").read() for f in sorted(os.listdir(d + "/e"))} \
            if os.path.isdir(d + "/e") else {}
        return f"EXIT {res.exit_code}\n{failure(res) if res.exit_code not in (0, 3) else ''}" + json.dumps(files, indent=1, sort_keys=True)
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
    offload = offload_estimates()
    for i, args in enumerate(offload):
        write_estimate(runner, args, f"{out}/off{i:03d}", table=True)
    tmp = os.path.join(tempfile.gettempdir(), "fitplan-outputs-snapshot")  # one path: warnings name the files
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        recipes = recipe_runs(tmp)
        for i, args in enumerate(recipes):
            write_estimate(runner, args, f"{out}/imp{i:03d}", kind="scenario")
    finally:
        shutil.rmtree(tmp)
    with open(f"{out}/help.txt", "w", encoding="utf-8") as f:
        f.write(runner.invoke(cli, ["estimate", "--help"], terminal_width=120).output)
    with open(f"{out}/form.json", "w", encoding="utf-8") as f:
        f.write(json.dumps(form_fields(), indent=1, default=str))
    print(f"{len(estimates())} estimates, {len(RECOMMEND)} recommend runs, {len(offload)} offloading and 8-bit "
          f"estimates, {len(recipes)} imports written to {out}")


def write_estimate(runner: CliRunner, args: list[str], stem: str, table: bool = False, kind: str = "all") -> None:
    """``stem.json`` (``--format json``, the command line on its first line), ``stem.txt`` (the table, with
    ``table``), ``stem.emit`` (the ``--emit KIND`` files)."""
    for fmt in ["json"] + ["table"] * table:
        res = runner.invoke(cli, ["estimate", *args, "--format", fmt], terminal_width=120)
        text = res.output if res.exit_code in (0, 3) else f"EXIT {res.exit_code}\n{res.output}{failure(res)}"
        with open(f"{stem}.{'json' if fmt == 'json' else 'txt'}", "w", encoding="utf-8") as f:
            f.write(" ".join(os.path.basename(a) for a in args) + "\n" + text)
    with open(f"{stem}.emit", "w", encoding="utf-8") as f:
        f.write(emitted(runner, args, kind))


def failure(res) -> str:
    """What a failed run said: its standard error, or the error the CLI's entry point would print (``cli`` alone
    lets a ``FitplanError`` through to ``fitplan.cli.main``)."""
    e = res.exception
    return res.stderr + (f"{type(e).__name__}: {e}\n" if e is not None and not isinstance(e, SystemExit) else "")


def form_fields() -> list[dict]:
    """What ``fitplan serve``'s ``/api/options`` gives the page's form for each scenario field."""
    from fitplan.context import get_context
    from fitplan.web.api import field_rows

    return field_rows(get_context(()))


if __name__ == "__main__":
    main(sys.argv[1])
