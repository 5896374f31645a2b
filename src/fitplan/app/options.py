"""Options shared by the commands: the scenario's flags (one per field), ``--format`` / ``--out``, and the
steps every command takes: build the scenario, load the context, evaluate, write the report."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import attrs
import click

from fitplan.inputs import scenario as sc
from fitplan.inputs.settings import Setting
from fitplan.inputs.sources import flag_for

HELP = {
    "model": "Catalog name (fitplan models list) or path to an HF config.json.",
    "params": "A bare parameter count instead of a model, e.g. 7B.",
    "method": "full | lora | qlora.",
    "assumptions": "realistic (default) | seed (the tutorial chapter's simplifications).",
    "precision": "Lightning-style preset: 32-true | bf16-mixed | 16-mixed | bf16-true | 16-true | bf16-master | 16-master "
                 "(and bf16-autocast, bf16-autocast-fp16w, 16-autocast-bf16w). Default: what --bf16/--fp16 and --dtype "
                 "select, as the HF Trainer does.",
    "dtype": "from_pretrained's dtype: auto (default, transformers 5.24: the checkpoint's dtype from its config) | "
             "float32 | bfloat16 | float16 (torch.bfloat16 and bf16 accepted).",
    "bf16": "HF TrainingArguments bf16=True: bf16 autocast over the loaded weights (under DeepSpeed: its bf16 optimizer).",
    "fp16": "HF TrainingArguments fp16=True: fp16 autocast with a GradScaler (under DeepSpeed: its fp16 optimizer).",
    "optim": "HF TrainingArguments.optim: every transformers 5.24 OptimizerNames value (adamw_torch, adamw_torch_fused, "
             "adamw_8bit, paged_adamw_32bit, lion_8bit, adafactor, galore_adamw, lomo, ...; a few refused with the "
             "reason); `fitplan plugins` lists them.",
    "optim_args": "HF optim_args, e.g. rank=64 (GaLore/APOLLO), momentum=0.9 (sgd, rmsprop), block_size=128 (torchao).",
    "optim_target_modules": "HF optim_target_modules for GaLore/APOLLO: comma-separated module names, or all-linear.",
    "attn_implementation": "eager | sdpa | flash_attention_2.",
    "lora_target_modules": "Comma-separated module names, e.g. q_proj,v_proj (or all-linear). Default: what peft chooses without them (its list for the model type: q_proj,v_proj on Llama, c_attn on GPT-2).",
    "lora_modules_to_save": "peft's modules_to_save: modules trained whole beside LoRA, e.g. embed_tokens,lm_head "
                            "(outside the decoder layers, untied, with the copy in the adapters' dtype).",
    "zero_stage": "DeepSpeed ZeRO stage 0-3.",
    "fsdp": "full_shard | shard_grad_op | hybrid_shard.",
    "gpu": "GPU id or alias from the hardware ruleset (e.g. a100-80gb, h100-sxm).",
    "num_examples": "Dataset examples (with --tokens-per-example; or give --total-tokens).",
    "tokens_per_example": "Mean tokens per example.",
    "total_tokens": "Tokens in the dataset (one epoch).",
    "padding": "pack (default: TRL packing, no padding) | pad (every example padded to --max-seq-length) | longest "
               "(TRL's default: padded to the longest in each micro-batch) | group_by_length | padding_free; the last "
               "three need --dataset.",
    "dataset_path": "The dataset (JSONL, JSON, CSV, Parquet, a saved `datasets` directory) or a summary TOML from "
                    "`fitplan dataset --out`: its tokens replace --num-examples/--total-tokens (docs/dataset.md).",
    "dataset_text_field": "With --dataset: the column of plain-text examples (default text).",
    "tokenizer": "With --dataset: a tokenizer directory or Hugging Face id (default: the model's).",
    "chat_template_path": "With --dataset: a .jinja chat template replacing the tokenizer's.",
    "dataset_split": "With --dataset: the split of a saved DatasetDict (default train).",
    "dataset_sample": "With --dataset: tokenize a random sample of N examples (totals get a confidence interval).",
    "num_train_epochs": "Passes over the dataset (default 1).",
    "tf32": "HF tf32: fp32 matmuls on TF32 tensor cores (off by default in PyTorch and the HF Trainer).",
    "loss_implementation": "hf (default: the model's loss over the whole fp32 logits) | chunked (torchtune's "
                           "CEWithChunkedOutputLoss: LM head and fp32 cross-entropy per chunk of 8) | chunked_compiled (the same with "
                           "torchtune's compile: True: the 16-bit chunks are kept, no fp32 log-probabilities) | liger (Liger-Kernel's "
                           "fused linear cross-entropy, TrainingArguments use_liger_kernel; the logits never whole) | cce "
                           "(Apple's Cut Cross-Entropy: only a log-sum-exp per token is kept) | trl_grpo (TRL 1.16's fused "
                           "log-prob head as GRPO/RLOO run it: their default).",
    "optimizer_in_bwd": "torchtune optimizer_in_bwd: each parameter steps in its gradient's hook, which frees the "
                        "gradient (no optimizer-step phase holding every gradient); one GPU, no accumulation.",
    "activation_offloading": "none (default) | torchtune (its recipes' enable_activation_offloading: saved tensors to "
                             "pinned host memory on a second CUDA stream, the loss outside the hooks) | trl (TRL's "
                             "OffloadActivations as axolotl's activation_offloading: true runs it) | trl_sync (without "
                             "streams: axolotl's legacy) | unsloth (Unsloth's offloaded checkpointing, LLaMA-Factory's "
                             "use_unsloth_gc: only the layer inputs). With checkpointing the layer inputs move.",
    "load_in_8bit": "With --method qlora: the base Linears in LLM.int8 (bitsandbytes Linear8bitLt) instead of NF4.",
    "torch_compile": "HF torch_compile: the model runs under torch.compile (fused elementwise kernels; changes time only).",
    "provider": "Pricing provider id (aws, gcp, lambda, runpod, seed, ...) to price the run.",
    "instance": "Force an instance type of the provider (default: the cheapest shape covering the GPUs).",
    "region": "Only consider instances in this region (default: the cheapest region).",
    "runs": "Number of runs to pay for (experiments; the seed counts 5).",
    "tokens_per_second": "Measured throughput of the whole run, overriding the time model.",
    "mfu": "Model FLOPs utilisation (0.4 = 40 %): price the step at this MFU instead of the roofline.",
    "throughput_source": "Use a [[throughput]] ruleset table of measured tokens/s (e.g. seed).",
    "trainer": "TRL 1.16 trainer: sft (default; the HF Trainer's step) | dpo | kto | orpo | cpo | reward | grpo | rloo "
               "(docs/trl.md).",
    "beta": "TRL beta, the KL coefficient (default: the trainer's: DPO/KTO 0.1, GRPO 0.0, RLOO 0.05); 0 drops GRPO's "
            "reference model.",
    "precompute_ref_log_probs": "TRL DPO/KTO: reference log-probabilities computed once before training.",
    "cpo_alpha": "TRL CPO: weight of the NLL term (default 1.0); 0 skips it.",
    "loss_type": "TRL CPO: sigmoid (default) | hinge | ipo | simpo | alphapo (sets cpo_alpha 0).",
    "num_generations": "TRL GRPO/RLOO: completions per prompt (default GRPO 8, RLOO 2).",
    "max_completion_length": "TRL GRPO/RLOO: the longest completion in tokens (default 512).",
    "prompt_length": "GRPO/RLOO: the longest prompt in tokens (TRL does not truncate prompts).",
    "generation_batch_size": "TRL GRPO/RLOO: sequences per generation round, all processes.",
    "steps_per_generation": "TRL GRPO/RLOO: micro-steps per generation round (default: gradient accumulation steps).",
    "use_vllm": "TRL GRPO/RLOO: generate with vLLM.",
    "vllm_mode": "TRL: colocate (default: vLLM on the training GPUs) | server (trl vllm-serve on its own GPUs).",
    "vllm_gpu_memory_utilization": "TRL: the share of each GPU's memory vLLM reserves (default 0.3).",
    "vllm_enable_sleep_mode": "TRL: vLLM's sleep mode (weights and KV cache off the GPU while training).",
    "vllm_tensor_parallel_size": "TRL: vLLM's tensor-parallel degree in colocate mode (default 1).",
}


def _click_type(field: attrs.Attribute | Setting) -> Any:
    if isinstance(field, Setting):
        return {"bool": bool, "int": int, "float": float, "text": str}[field.type]
    text = str(field.type)
    if "bool" in text:
        return bool
    if "int" in text and "float" not in text:
        return int
    if "float" in text:
        return float
    return str


class OptimOption(click.Option):
    """``--optim``: its help also names the optimizers plugins add (not HF names), read when help is shown."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None:
            return None
        extra = plugin_optimizers()
        if extra:
            record = (record[0], record[1] + " From plugins (not HF names): " + ", ".join(extra) + ".")
        return record


def plugin_optimizers() -> list[str]:
    """``name (plugin)`` of each optimizer a non-built-in plugin registers."""
    reg = registry()
    return sorted(f"{o.name} ({o.plugin})" for o in reg.optimizers.values() if not o.plugin.startswith("fitplan.builtin."))


def scenario_options(func: Callable) -> Callable:
    """Add one option per scenario field, plugin settings included (default None, so only given flags override a
    scenario file)."""
    for section, fields in reversed(list(sc.ORDER.items())):
        for f in reversed(fields):
            flag = flag_for(f.name)
            typ = _click_type(f)
            help_text = (f.help if isinstance(f, Setting) else HELP.get(f.name)) or f"{section}.{f.name} (default: {f.default!r})"
            if typ is bool:
                opt = click.option(f"{flag}/--no-{flag[2:]}", f.name, default=None, help=help_text)
            else:
                opt = click.option(flag, f.name, type=typ, default=None, help=help_text,
                                   cls=OptimOption if f.name == "optim" else click.Option)
            func = opt(func)
    func = click.option("--accelerate-config", "accelerate_config", type=click.Path(dir_okay=False), default=None,
                        help="An accelerate config YAML (what `accelerate config` writes: distributed type, mixed "
                             "precision, processes, machines, FSDP or DeepSpeed settings).")(func)
    func = click.option("--recipe", "recipe", type=click.Path(dir_okay=False), default=None,
                        help="A torchtune, axolotl or LLaMA-Factory recipe YAML (docs/recipes.md), over the scenario "
                             "file and under the other files and the flags; a .yaml scenario file is one too.")(func)
    func = click.option("--deepspeed", "deepspeed", type=click.Path(dir_okay=False), default=None, help="A DeepSpeed config JSON (ZeRO stage, offload, bf16/fp16, micro-batch).")(func)
    func = click.option("--training-args", "training_args", type=click.Path(dir_okay=False), default=None,
                        help="An HF TrainingArguments JSON (batch, accumulation, checkpointing, optim, bf16/fp16, epochs, deepspeed, fsdp).")(func)
    func = click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False),
                        help="Extra ruleset directory (repeatable; later ones override earlier ones and the bundled rulesets).")(func)
    func = click.argument("scenario_file", required=False, type=click.Path(dir_okay=False))(func)
    return func


class FormatChoice(click.ParamType):
    """``--format NAME``: one of the formats the plugins declare for a kind of report (checked when parsed)."""

    name = "format"

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def names(self) -> list[str]:
        from fitplan.pluginmgr.registry import default_registry

        return default_registry().format_names(self.kind)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(self.names()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if value not in self.names():
            self.fail(f"{value!r} is not one of {', '.join(map(repr, self.names()))}", param, ctx)
        return value


def format_option(kind: str, default: str = "table") -> Callable:
    """``--format`` for a command rendering ``kind`` reports."""
    return click.option("--format", "fmt", type=FormatChoice(kind), default=default, show_default=True,
                        help="Output format (fitplan plugins lists the formats).")


def _check_out(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        from fitplan.files import check_target

        check_target(value)
    return value


def out_option(func: Callable) -> Callable:
    """``--out FILE``, checked when the options are read (before anything is computed)."""
    return click.option("--out", "out", type=click.Path(dir_okay=False), default=None, callback=_check_out,
                        help="Write the report to this file (written whole, or not at all).")(func)


def registry():
    from fitplan.pluginmgr.registry import default_registry

    return default_registry()


def scenario_from(options: dict[str, Any]):
    """The scenario of a command's options (:func:`fitplan.inputs.sources.from_options`); the importers'
    warnings go to stderr."""
    from fitplan.inputs.sources import from_options

    reg = registry()
    built = from_options(options, known_optimizers=[*reg.optimizers, *reg.optimizer_aliases])
    for w in built.warnings:
        warn(w)
    return built


def estimate_from(options: dict[str, Any]):
    """Build the scenario, load the context and evaluate: the :class:`~fitplan.estimation.Estimate`."""
    from fitplan.context import get_context
    from fitplan.estimation import evaluate

    built = scenario_from(options)
    ctx = get_context(built.ruleset_dirs)
    return evaluate(built.scenario, ctx.registry, ctx.rulesets)


def warn(text: str) -> None:
    from fitplan.output.console import console, escape

    console(err=True).print(f"[yellow]warning:[/] {escape(text)}", markup=True, highlight=False)


def emit(kind: str, report: Any, fmt: str, out: str | None = None, units: str = "GB",
         also: tuple[Any, ...] = ()) -> None:
    """Render ``report`` with format ``fmt`` and write it to ``out`` or stdout. ``also``: more files of the
    same command (:class:`fitplan.files.Batch`), committed together with ``out``: all or none."""
    from fitplan.output.console import options_for
    from fitplan.output.formats import RenderOptions

    f = registry().format(kind, fmt)
    files = []
    if out is not None:
        files.append((out, f.render(kind, report, RenderOptions(units=units)).encode("utf-8")))
    else:
        text = f.render(kind, report, options_for(sys.stdout, units))
        try:
            click.echo(text, nl=False)
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as e:  # a full disk, /dev/full: the CLI's exit status 1
            raise OSError(e.errno, e.strerror, "standard output") from None
    if not files and not also:
        return
    from fitplan.files import Batch  # only when writing

    batch = Batch()
    for path, data in files:
        batch.add(path, data)
    for more in also:
        batch.extend(more)
    for p in batch.commit():
        click.echo(f"wrote {p}", err=True)
