"""A digest of many estimates, to show a pure refactor changes no figure: run it before and after, then diff.

Runs ``fitplan estimate`` in process over a fixed set of scenarios (models of several architecture types; full,
LoRA and QLoRA; checkpointing on and off; precisions; DPO, KTO, ORPO, GRPO; DeepSpeed ZeRO 1-3 and FSDP;
activation offloading's modes with checkpointing on and off; LoRA over 8-bit base weights; ``--format table`` and
``--format json``) with the disk cache off, and writes one line per scenario and format:
the arguments, the exit status and the SHA-256 of what the command printed. Every step trace the estimates
build is hashed too (``repr`` of :class:`fitplan.trace.step_trace.StepTrace`, every backward point included),
one line per trace in the order they were built.

    PYTHONPATH=src:plugins/fitplan-torch/src .venv/bin/python bench/estimates_digest.py /tmp/before.txt
    (change the code)
    PYTHONPATH=src:plugins/fitplan-torch/src .venv/bin/python bench/estimates_digest.py /tmp/after.txt
    diff /tmp/before.txt /tmp/after.txt && echo identical
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import os
import sys

os.environ["FITPLAN_NO_CACHE"] = "1"
os.environ.setdefault("COLUMNS", "200")

MODELS = ("llama-3.2-1b", "qwen2.5-0.5b", "gemma-2-2b", "gpt2", "mistral-7b", "phi-3-mini", "deepseek-v2-lite",
          "falcon-rw-1b", "granite-3.0-2b", "mixtral-8x7b")
SHAPES = (("--per-device-train-batch-size", "2", "--max-seq-length", "512"),
          ("--per-device-train-batch-size", "1", "--max-seq-length", "2048"))
METHODS = (("--method", "full", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused"),
           ("--method", "lora", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--lora-r", "16",
            "--lora-target-modules", "all-linear"),
           ("--method", "qlora", "--precision", "bf16-mixed", "--optim", "paged_adamw_8bit", "--lora-target-modules",
            "all-linear"))
CHECKPOINTING = (("--gradient-checkpointing",), ("--no-gradient-checkpointing",))
EXTRA = (
    ("--model", "llama-3.2-1b", "--precision", "32-true", "--optim", "adamw_torch"),
    ("--model", "llama-3.2-1b", "--precision", "16-mixed", "--optim", "adamw_torch", "--attn-implementation", "eager"),
    ("--model", "llama-3.2-1b", "--precision", "bf16-true", "--optim", "adamw_torch_fused", "--loss-implementation",
     "chunked"),
    ("--model", "llama-3.2-1b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--loss-implementation",
     "liger"),
    ("--model", "qwen2.5-0.5b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--device", "cpu"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-master", "--optim", "adamw_torch_fused", "--zero", "1",
     "--num-gpus", "8"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-master", "--optim", "adamw_torch_fused", "--zero", "2",
     "--num-gpus", "8", "--gradient-checkpointing"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-master", "--optim", "adamw_torch_fused", "--zero", "3",
     "--num-gpus", "8"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-master", "--optim", "adamw_torch_fused", "--zero", "3",
     "--num-gpus", "4", "--method", "lora", "--gradient-checkpointing"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-master", "--optim", "adamw_torch_fused", "--zero", "3",
     "--num-gpus", "8", "--offload-optimizer", "--offload-params"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--fsdp", "full_shard",
     "--num-gpus", "8"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--fsdp",
     "shard_grad_op", "--num-gpus", "4", "--gradient-checkpointing"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--fsdp", "full_shard",
     "--num-gpus", "8", "--method", "lora"),
    ("--model", "llama-3.2-1b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--trainer", "dpo"),
    ("--model", "llama-3.2-1b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--trainer", "dpo",
     "--method", "lora", "--gradient-checkpointing"),
    ("--model", "llama-3.2-1b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--trainer", "kto"),
    ("--model", "llama-3.2-1b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--trainer", "orpo"),
    ("--model", "llama-3.2-1b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--trainer", "cpo"),
    ("--model", "qwen2.5-0.5b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--trainer", "reward"),
    ("--model", "qwen2.5-0.5b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--trainer", "grpo",
     "--per-device-train-batch-size", "8"),
    ("--model", "qwen2.5-0.5b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--trainer", "grpo",
     "--per-device-train-batch-size", "4", "--num-generations", "4", "--beta", "0.04", "--method", "lora", "--gradient-checkpointing"),
    ("--model", "qwen2.5-0.5b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--trainer", "rloo",
     "--per-device-train-batch-size", "2"),
    ("--model", "llama-3.2-1b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--method", "lora",
     "--lora-target-modules", "all-linear", "--lora-dropout", "0.1"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--method", "lora",
     "--lora-modules-to-save", "lm_head"),
    ("--model", "llama-3.1-8b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--method", "lora",
     "--lora-target-modules", "q_proj,v_proj", "--gradient-checkpointing", "--gradient-accumulation-steps", "4"),
    ("--model", "gemma-3-1b", "--precision", "bf16-true", "--optim", "adamw_torch_fused"),
    ("--model", "olmo-1b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--gradient-checkpointing"),
    ("--model", "qwen3-0.6b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--method", "qlora",
     "--bnb-4bit-compute-dtype", "bfloat16"),
    ("--model", "stablelm-2-1.6b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused"),
    ("--model", "pythia-160m", "--precision", "16-mixed", "--optim", "adamw_torch"),
    ("--model", "smollm2-135m", "--precision", "32-true", "--optim", "sgd", "--gradient-checkpointing"),
    ("--model", "llama-3.2-1b", "--precision", "bf16-mixed", "--optim", "adamw_torch_fused", "--gpu", "h100-sxm",
     "--num-examples", "10000", "--tokens-per-example", "400", "--provider", "lambda"),
)

OFFLOAD_MODES = ("torchtune", "trl", "trl_sync", "unsloth")
"""``--activation-offloading`` modes (src/fitplan/trace/offload.py), each with checkpointing on and off."""
OFFLOAD = (
    ("--model", "llama-3.2-1b", *SHAPES[0], *METHODS[0]),
    ("--model", "mistral-7b", *SHAPES[0], *METHODS[1]),
)
INT8 = (
    ("--model", "llama-3.2-1b", *SHAPES[0], "--method", "qlora", "--load-in-8bit", "--precision", "bf16-mixed",
     "--optim", "adamw_torch_fused", "--lora-target-modules", "all-linear"),
    ("--model", "mistral-7b", *SHAPES[1], "--method", "qlora", "--load-in-8bit", "--precision", "bf16-mixed",
     "--optim", "paged_adamw_8bit"),
)
"""LoRA over LLM.int8 base Linears (``--load-in-8bit``: src/fitplan/trace/int8.py), checkpointing on and off, and
with TRL's offloading."""


def scenarios() -> list[tuple[str, ...]]:
    """The argument lists, in a fixed order."""
    out = [("--model", m, *shape, *method, *ck)
           for m, shape, method, ck in itertools.product(MODELS, SHAPES[:1], METHODS, CHECKPOINTING)]
    out += [("--model", m, *SHAPES[1], *METHODS[0], *CHECKPOINTING[0]) for m in MODELS]
    out += list(EXTRA)
    out += [(*base, "--activation-offloading", mode, *ck)
            for base, mode, ck in itertools.product(OFFLOAD, OFFLOAD_MODES, CHECKPOINTING)]
    out += [(*base, *ck) for base, ck in itertools.product(INT8, CHECKPOINTING)]
    return out + [(*INT8[0], "--activation-offloading", "trl", *CHECKPOINTING[0])]


def main(path: str) -> None:
    from fitplan.cli import main as cli
    from fitplan.trace import step_trace

    traces: list[str] = []
    finished = step_trace.finished

    def hashing(tr):
        result = finished(tr)
        traces.append(hashlib.sha256(repr(result).encode()).hexdigest())
        return result

    step_trace.finished = hashing
    lines = []
    for args in scenarios():
        for fmt in ("table", "json"):
            argv = ["estimate", *args, "--format", fmt]
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    cli(argv)
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
            digest = hashlib.sha256((out.getvalue() + "\0" + err.getvalue()).encode()).hexdigest()
            lines.append(f"{code} {digest} {' '.join(argv)}")
    lines += [f"trace {i} {h}" for i, h in enumerate(traces)]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    n = len(scenarios())
    codes = sum(1 for ln in lines if ln[0] == "0")
    print(f"{n} scenarios x 2 formats ({codes} exit 0), {len(traces)} step traces -> {path}")


if __name__ == "__main__":
    main(sys.argv[1])
