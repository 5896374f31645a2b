"""The scenario: everything the user states about a run.

Frozen attrs classes, one per section of a scenario TOML file. Field names are unique
across sections, so that the flattened scenario (:func:`flatten`) is the namespace that
quantity functions draw their inputs from. Names follow the Hugging Face vocabulary
(TrainingArguments, peft's LoraConfig) wherever it has one.
"""

from __future__ import annotations

import math
import unicodedata

from collections.abc import Mapping
from typing import Any

import attrs
from attrs import field, frozen

from fitplan.errors import FitplanError
from fitplan.inputs import settings
from fitplan.inputs.convert import structure
from fitplan.inputs.precision import PRECISIONS, dtype_code, load_dtype_word

METHODS = ("full", "lora", "qlora")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
LOSS_IMPLEMENTATIONS = ("hf", "chunked", "chunked_compiled", "liger", "cce", "trl_grpo")
"""How the loss head runs (trace/loss_heads.py, docs/memory-model.md "Loss implementations")."""
ACTIVATION_OFFLOADING = ("none", "torchtune", "trl", "trl_sync", "unsloth")
"""Activation offloading (trace/offload.py ``OFFLOAD_MODES``): torchtune's and TRL's ``OffloadActivations``."""
FSDP_MODES = ("full_shard", "shard_grad_op", "hybrid_shard")
STACKS = ("deepspeed", "fsdp1", "fsdp2", "ddp", "torch")
"""Who shards (``inputs/stacks.py``): DeepSpeed ZeRO 0-3, accelerate's FSDP1 / FSDP2 as the HF Trainer sets them
up, plain DDP, or PyTorch-native ZeRO (DDP + ZeroRedundancyOptimizer, bare ``fully_shard``)."""
KBIT_PREPARATION = ("peft", "trl", "none")
ASSUMPTIONS = ("realistic", "seed")
PADDING = ("pad", "pack", "longest", "group_by_length", "padding_free")
"""How micro-batches are formed (fitplan.data.padding): padded to max_seq_length, packed (TRL packing, bfd),
padded to the longest in each micro-batch (TRL's default; with group_by_length, batches grouped by length),
padding-free. The last three need the examples' lengths (``dataset_path``)."""
DEVICES = ("cuda", "cpu")
TRAINERS = ("sft", "dpo", "kto", "orpo", "cpo", "reward", "grpo", "rloo")
"""TRL 1.16's trainers fitplan models (docs/trl.md): supervised (SFTTrainer, the plain HF Trainer's step),
preference (DPO, KTO, reward model) and online RL with generation (GRPO, RLOO)."""
VLLM_MODES = ("colocate", "server")


LIMITS: dict[str, float] = {
    "per_device_train_batch_size": 2**20, "gradient_accumulation_steps": 2**20, "max_seq_length": 2**24,
    "num_train_epochs": 10_000, "lora_r": 65_536, "lora_alpha": 1e6, "tensor_parallel": 4096, "num_gpus": 65_536,
    "num_nodes": 65_536, "num_examples": 1e13, "tokens_per_example": 1e9, "total_tokens": 1e16, "runs": 1e6,
    "tokens_per_second": 1e12, "dataset_sample": 1e12, "num_generations": 65_536, "max_completion_length": 2**24,
    "prompt_length": 2**24, "generation_batch_size": 2**24, "steps_per_generation": 2**20,
    "vllm_tensor_parallel_size": 4096, "beta": 1e6,
}
"""The largest value of a number that makes physical sense (a micro-batch of a million sequences, a sequence of
16M tokens, 65,536 GPUs, 10^16 tokens): beyond it a value is a typo, and refusing it keeps the arithmetic finite."""
MINIMA: dict[str, float] = {"tokens_per_second": 1e-3, "mfu": 1e-4}
"""The smallest value of a rate that makes sense: below it a time comes out infinite."""
TEXT_LIMITS: dict[str, int] = {"model": 4096, "params": 64, "dataset_path": 4096, "tokenizer": 4096,
                               "chat_template_path": 4096}
"""The longest text a field takes (paths are long); every other text field: :data:`TEXT_LIMIT`."""
TEXT_LIMIT = 256


def _number_error(inst: Any, att: attrs.Attribute, value: Any, what: str) -> FitplanError:
    return FitplanError(f"{type(inst).__name__}.{att.name} must be {what}, got {value!r:.60}", field=att.name, value=value)


def _positive(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A finite number > 0 and at most its :data:`LIMITS` (None: not given)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (float("inf"), -float("inf")):
        raise _number_error(inst, att, value, "a finite number")
    if not value > 0:
        raise _number_error(inst, att, value, "> 0")
    if value < MINIMA.get(att.name, 0):
        raise _number_error(inst, att, value, f"at least {MINIMA[att.name]:g}")
    limit = LIMITS.get(att.name)
    if limit is not None and value > limit:
        raise _number_error(inst, att, value, f"at most {limit:,g}")


def _at_least_one(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """An integer >= 1 and at most its :data:`LIMITS`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _number_error(inst, att, value, "an integer >= 1")
    limit = LIMITS.get(att.name)
    if limit is not None and value > limit:
        raise _number_error(inst, att, value, f"at most {limit:,g}")


def _probability(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A dropout probability: a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise _number_error(inst, att, value, "a probability in [0, 1)")


def printable(text: str) -> bool:
    """No control or format character (terminal escapes, bidirectional overrides, line separators); spaces of
    any kind are fine (U+00A0 and U+202F are common in macOS file names, which ``str.isprintable`` refuses)."""
    return text.isprintable() or all(c.isprintable() or unicodedata.category(c) == "Zs" for c in text)


def _text(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A text of at most :data:`TEXT_LIMITS` characters, with no control character (None: not given)."""
    if value is None:
        return
    limit = TEXT_LIMITS.get(att.name, TEXT_LIMIT)
    if not isinstance(value, str) or len(value) > limit or not printable(value):
        what = f"a text of at most {limit:,} printable characters"
        raise FitplanError(f"{type(inst).__name__}.{att.name} must be {what}, got {value!r:.60}"
                           + (f" ({len(value):,} characters)" if isinstance(value, str) and len(value) > limit else ""),
                           field=att.name, value=value[:60] if isinstance(value, str) else value)


def _module_names(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """LoRA target modules: 1 to 256 names of at most 256 printable characters."""
    if not isinstance(value, tuple) or not 1 <= len(value) <= 256 or not all(
            isinstance(v, str) and 0 < len(v) <= 256 and printable(v) for v in value):
        raise _number_error(inst, att, value, "1 to 256 module names (or all-linear)")


def _one_of(choices: tuple[str, ...]):
    def check(inst: Any, att: attrs.Attribute, value: Any) -> None:
        if value is None and None in choices:
            return
        if value not in choices:
            from fitplan.errors import did_you_mean

            shown = [str(c) for c in choices if c is not None]
            hint = (did_you_mean(value, shown) if isinstance(value, str) else None) or "valid: " + ", ".join(shown)
            raise FitplanError(
                f"{type(inst).__name__}.{att.name} must be one of {', '.join(shown)}, got {value!r}",
                field=att.name,
                value=value,
                suggestion=hint,
            )

    check.choices = choices  # type: ignore[attr-defined]  # read by CHOICES (rule conditions)
    return check


OPTIM_ARG_BOUNDS: dict[str, tuple[str, float, float]] = {
    "rank": ("int", 1, 65_536), "block_size": ("int", 1, 2**20), "momentum": ("float", 0, 1), "centered": ("bool", 0, 0),
}
"""The ``optim_args`` keys fitplan reads (GaLore/APOLLO ``rank``, torchao ``block_size``, SGD/RMSprop ``momentum``
and ``centered``) with their kind and range: the Trainer converts them with ``int()`` / ``float()`` (transformers
trainer_optimizer.py), torch refuses a negative momentum (torch/optim/sgd.py), and a rank above 65,536 is wider
than any layer; ``momentum`` NaN or above 1 diverges."""


def _optim_args(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """HF ``optim_args`` as the Trainer parses it (``key=value`` pairs split on ``,``, each with exactly one ``=``:
    ``trainer_optimizer._parse_optim_args``), each key fitplan reads within :data:`OPTIM_ARG_BOUNDS`."""
    _text(inst, att, value)
    for mapping in filter(None, value.replace(" ", "").split(",")):
        if mapping.count("=") != 1:
            raise FitplanError(f"Training.optim_args: {mapping!r} is not key=value (the Trainer's "
                               "_parse_optim_args splits each item on '=')", field="optim_args", value=value,
                               suggestion="e.g. rank=64,momentum=0.9")
        key, text = mapping.split("=")
        if key not in OPTIM_ARG_BOUNDS:
            continue
        kind, low, high = OPTIM_ARG_BOUNDS[key]
        if kind == "bool":
            ok = text.lower() in ("true", "false", "1", "0")
        else:
            try:
                x = int(text) if kind == "int" else float(text)
                ok = low <= x <= high  # NaN compares false
            except ValueError:
                ok = False
        if not ok:
            want = "true or false" if kind == "bool" else f"{'an integer' if kind == 'int' else 'a number'} in [{low:g}, {high:g}]"
            raise FitplanError(f"Training.optim_args: {key} must be {want}, got {text!r}", field="optim_args",
                               value=value, suggestion=f"e.g. {key}={'true' if kind == 'bool' else int(max(low, 1))}")


@frozen
class Model(settings.Section):
    """Which model: a catalog name or a path to an HF ``config.json`` (``model``), or a bare count (``params``)."""
    extra: settings.Values = settings.extra_field()

    model: str | None = field(default=None, validator=_text)
    params: str | None = field(default=None, validator=_text)
    method: str = field(default="full", validator=_one_of(METHODS))
    assumptions: str = field(default="realistic", validator=_one_of(ASSUMPTIONS))


@frozen
class Training(settings.Section):
    """The HF TrainingArguments that change memory and time."""
    extra: settings.Values = settings.extra_field()

    per_device_train_batch_size: int = field(default=1, validator=_at_least_one)
    gradient_accumulation_steps: int = field(default=1, validator=_at_least_one)
    max_seq_length: int = field(default=2048, validator=_at_least_one)
    gradient_checkpointing: bool = False
    optim: str = field(default="adamw_torch_fused", validator=_text)
    """HF ``TrainingArguments.optim``; the default is transformers 5.24's on torch >= 2.8 (training_args.py
    ``default_optim``: ``adamw_torch_fused``)."""
    optim_args: str = field(default="", validator=_optim_args)
    """HF ``optim_args``: ``"rank=64,momentum=0.9"`` (GaLore/APOLLO rank, SGD/RMSprop momentum, torchao block_size)."""
    optim_target_modules: tuple[str, ...] = field(default=(), validator=lambda i, a, v: v == () or _module_names(i, a, v))
    """HF ``optim_target_modules`` (GaLore, APOLLO): module names, ``all-linear``, or one regular expression."""
    precision: str | None = field(default=None, validator=_one_of((None, *PRECISIONS)))  # type: ignore[arg-type]
    """A preset of :mod:`fitplan.inputs.precision` (Lightning's names), or None: what the HF words decide
    (``bf16``, ``fp16`` and the load ``dtype``: :func:`fitplan.inputs.precision.hf_precision`)."""
    dtype: str = field(default="auto", converter=load_dtype_word)
    """``from_pretrained``'s ``dtype``: ``auto`` (transformers 5.24's default: the checkpoint's ``dtype`` /
    ``torch_dtype``, float32 when its config states none), ``float32``, ``bfloat16`` or ``float16``."""
    bf16: bool = False
    """HF ``TrainingArguments.bf16``: bf16 autocast over the loaded weights (DeepSpeed: its bf16 optimizer)."""
    fp16: bool = field(default=False)
    """HF ``TrainingArguments.fp16``: fp16 autocast with a GradScaler (DeepSpeed: its fp16 optimizer)."""
    attn_implementation: str = field(default="sdpa", validator=_one_of(ATTN_IMPLEMENTATIONS))
    num_train_epochs: float = field(default=1.0, validator=_positive)
    tf32: bool = False
    """HF ``tf32``: fp32 matmuls on TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32``); off by default."""
    torch_compile: bool = False
    """HF ``torch_compile``: the model runs under ``torch.compile`` (Inductor fuses elementwise ops: time only)."""
    optimizer_in_bwd: bool = field(default=False)
    """torchtune's ``optimizer_in_bwd``: one optimizer per parameter, stepped in the parameter's
    post-accumulate-grad hook, which then frees its gradient (no gradient outlives the backward); one micro-batch
    per step, one GPU."""
    loss_implementation: str = field(default="hf", validator=_one_of(LOSS_IMPLEMENTATIONS))
    """The loss head: ``hf`` (the model's ``ForCausalLMLoss`` over the whole fp32 logits), ``chunked`` (torchtune's
    ``CEWithChunkedOutputLoss``, 8 chunks, eager), ``chunked_compiled`` (the same with its ``compute_cross_entropy``
    under ``torch.compile``, torchtune's ``compile: True``), ``liger`` (Liger-Kernel's fused linear cross-entropy,
    TrainingArguments ``use_liger_kernel``), ``cce`` (Apple's Cut Cross-Entropy)."""
    activation_offloading: str = field(default="none", validator=_one_of(ACTIVATION_OFFLOADING))
    """Saved tensors moved to pinned host memory in the forward and brought back in the backward: ``torchtune``
    (its recipes' ``enable_activation_offloading``: copies on a second CUDA stream, the last five kept on the GPU,
    the loss outside the hooks), ``trl`` (TRL's ``OffloadActivations`` as axolotl's ``activation_offloading: true``
    runs it: the same, the model's own loss inside the hooks), ``trl_sync`` (``use_streams=False``, axolotl's
    ``legacy``); with gradient checkpointing the layer inputs move; ``unsloth`` (Unsloth's offloaded checkpointing,
    LLaMA-Factory's ``use_unsloth_gc``: only the layer inputs, with checkpointing) (trace/offload.py)."""


    @fp16.validator
    def _one_flag(self, att: attrs.Attribute, value: bool) -> None:
        if value and self.bf16:
            raise FitplanError("Training.bf16 and Training.fp16 are both true: TrainingArguments refuses both",
                               field="fp16", value=value, suggestion="choose one")

    @optimizer_in_bwd.validator
    def _in_bwd_alone(self, att: attrs.Attribute, value: bool) -> None:
        if value and self.gradient_accumulation_steps > 1:
            raise FitplanError("Training.optimizer_in_bwd steps every parameter in the backward: torchtune refuses "
                               "gradient accumulation with it (recipes/full_finetune_single_device.py)",
                               field="optimizer_in_bwd", value=value, suggestion="gradient_accumulation_steps = 1")


@frozen
class Lora(settings.Section):
    """peft's LoraConfig fields (used when ``method`` is lora or qlora)."""
    extra: settings.Values = settings.extra_field()

    lora_r: int = field(default=8, validator=_at_least_one)
    lora_alpha: int = field(default=16, validator=_positive)
    lora_target_modules: tuple[str, ...] | None = field(default=None, validator=lambda i, a, v: v is None or _module_names(i, a, v))
    """peft's ``target_modules``: module names, ``all-linear``, or one regular expression. None (not given): what
    peft chooses without it, its default for the model type (``fitplan.estimation.with_default_targets``); an
    empty list is an error, as in peft."""
    lora_dropout: float = field(default=0.0, validator=_probability)
    lora_modules_to_save: tuple[str, ...] = field(default=(), validator=lambda i, a, v: v == () or _module_names(i, a, v))
    """peft's ``modules_to_save``: modules outside the decoder layers (``embed_tokens``, ``lm_head``) trained whole,
    as a copy beside the frozen original (``ModulesToSaveWrapper``); builtin/lora.py says where fitplan models it."""
    bnb_4bit_use_double_quant: bool = True
    load_in_8bit: bool = False
    """With ``method = "qlora"``: the base Linears in LLM.int8 (transformers' ``BitsAndBytesConfig(load_in_8bit=True)``,
    bitsandbytes ``Linear8bitLt``) instead of NF4: axolotl's and LLaMA-Factory's 8-bit LoRA (trace/kernels.py)."""
    autocast_adapter_dtype: bool = True
    """peft's ``get_peft_model(..., autocast_adapter_dtype=True)``: 16-bit adapters are upcast to fp32 (their
    GEMMs then run in fp32 without autocast). False keeps them in the base weights' dtype, as torchtune's
    LoRA modules are."""
    bnb_4bit_compute_dtype: str | None = field(
        default=None, converter=lambda v: None if v is None else dtype_code(v, what="bnb_4bit_compute_dtype"))
    """transformers' ``BitsAndBytesConfig.bnb_4bit_compute_dtype`` (None: float32), in any spelling HF takes
    (``bfloat16``, ``torch.bfloat16``, ``bf16``), kept as fitplan's short name. bitsandbytes 0.50.2 computes in
    the input's dtype whenever that is fp32 or bf16 (``Linear4bit.set_compute_type``): fitplan warns when it differs."""
    kbit_preparation: str = field(default="peft", validator=_one_of(KBIT_PREPARATION))
    """QLoRA: what the training script does after loading the 4-bit model (a stated assumption): ``peft``
    (``prepare_model_for_kbit_training``: every non-quantized parameter cast to fp32, LoRA in fp32), ``trl``
    (TRL's SFTTrainer: base parameters stay in the load dtype, LoRA weights cast to bf16) or ``none``
    (``get_peft_model`` alone: base in the load dtype, LoRA in fp32)."""


MAX_ELEMENTS = 1e15
"""The largest DeepSpeed size key in elements: the largest parameter count fitplan takes (10^15)."""


def _ds_value(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A DeepSpeed size key as its pydantic model takes it (``int``, ``ge=0``; ``reduce_bucket_size`` ``gt=0``:
    deepspeed/runtime/zero/config.py): a whole number of elements, at most :data:`MAX_ELEMENTS`, or "auto"."""
    if value is None or value == "auto":
        return
    try:
        x = float(value)
        ok = math.isfinite(x) and x >= 0 and x.is_integer() and x <= MAX_ELEMENTS
    except (TypeError, ValueError):
        ok = False
    if ok and att.name == "reduce_bucket_size" and float(value) == 0:
        ok = False
    if not ok or isinstance(value, bool):
        low = "> 0" if att.name == "reduce_bucket_size" else ">= 0"
        raise FitplanError(f"{type(inst).__name__}.{att.name} must be a whole number of elements {low} and at most "
                           f"{MAX_ELEMENTS:g}, or \"auto\", got {value!r:.60} (DeepSpeed's config model takes an integer: "
                           "deepspeed/runtime/zero/config.py)",
                           field=att.name, value=value, suggestion='e.g. 5e8, 200000000 or "auto" (hidden size squared)')


@frozen
class Parallel(settings.Section):
    """Sharding and parallelism."""
    extra: settings.Values = settings.extra_field()

    zero_stage: int = field(default=0, validator=_one_of((0, 1, 2, 3)))  # type: ignore[arg-type]
    fsdp: str | None = field(default=None, validator=_one_of((None, *FSDP_MODES)))  # type: ignore[arg-type]
    offload_optimizer: bool = False
    tensor_parallel: int = field(default=1, validator=_at_least_one)
    stack: str | None = field(default=None, validator=_one_of((None, *STACKS)))  # type: ignore[arg-type]
    """Which implementation shards (None: ``--zero``/offload/``*-master`` mean DeepSpeed, ``--fsdp`` means the HF
    Trainer's default FSDP2, several GPUs otherwise mean DDP): see ``inputs/stacks.py``."""
    fsdp_sharding_strategy: str | None = field(default=None, validator=_one_of((None, *FSDP_MODES)))  # type: ignore[arg-type]
    """FSDP1 only: the ``FSDP_SHARDING_STRATEGY`` that ``accelerate launch`` exports from an accelerate config's
    ``fsdp_sharding_strategy`` (None: unset, FULL_SHARD). FSDP1 runs it, not the Trainer's ``fsdp`` mode."""
    reduce_bucket_size: str | None = field(default=None, validator=_ds_value)
    """DeepSpeed ``zero_optimization.reduce_bucket_size`` in elements: None = DeepSpeed's default (5e8), "auto" =
    HF's hidden²."""
    overlap_comm: bool | None = None
    """DeepSpeed ``overlap_comm`` (None: DeepSpeed's default, on at stage 3 only)."""
    stage3_prefetch_bucket_size: str | None = field(default=None, validator=_ds_value)
    """DeepSpeed stage 3 prefetch in elements: None = 5e7, "auto" = 0.9·hidden²."""
    stage3_param_persistence_threshold: str | None = field(default=None, validator=_ds_value)
    """DeepSpeed stage 3: parameters of at most this many elements stay whole: None = 1e5, "auto" = 10·hidden."""
    stage3_max_live_parameters: str | None = field(default=None, validator=_ds_value)
    """DeepSpeed stage 3: prefetch stops at this many gathered elements (None = 1e9)."""
    stage3_max_reuse_distance: str | None = field(default=None, validator=_ds_value)
    """DeepSpeed stage 3: a module's gathered parameters stay when it is used again within this many elements of
    the trace (None = 1e9; 0 releases every module after its forward)."""
    sub_group_size: str | None = field(default=None, validator=_ds_value)
    """DeepSpeed stage 3: the fp32 partitions are grouped in sub-groups of this many elements (None = 1e9)."""


@frozen
class Hardware(settings.Section):
    """Where it runs."""
    extra: settings.Values = settings.extra_field()

    gpu: str | None = field(default=None, validator=_text)
    num_gpus: int = field(default=1, validator=_at_least_one)
    num_nodes: int = field(default=1, validator=_at_least_one)
    device: str = field(default="cuda", validator=_one_of(DEVICES))
    """Whose kernels run the step: ``cuda`` (default) or ``cpu``, what fitplan-torch's CPU and FakeTensor
    referees run (CPU dropout keeps its mask in the input dtype, CPU SDPA with dropout takes the math path,
    no 512-byte allocator rounding, AdamW's ``step`` scalars live with the parameters)."""


@frozen
class Dataset(settings.Section):
    """How much data: examples × tokens per example, or total tokens; × epochs (in Training). Or the dataset
    itself (``dataset_path``: a data file or directory, or a summary TOML), read as TRL's SFT trainer reads it
    (docs/dataset.md)."""
    extra: settings.Values = settings.extra_field()

    num_examples: int | None = field(default=None, validator=_positive)
    tokens_per_example: float | None = field(default=None, validator=_positive)
    total_tokens: int | None = field(default=None, validator=_positive)
    padding: str = field(default="pack", validator=_one_of(PADDING))
    dataset_path: str | None = field(default=None, validator=_text)
    dataset_text_field: str = field(default="text", validator=_text)
    """TRL's ``SFTConfig.dataset_text_field``: the column of plain-text examples."""
    tokenizer: str | None = field(default=None, validator=_text)
    """A tokenizer directory or Hugging Face id (default: the model's)."""
    chat_template_path: str | None = field(default=None, validator=_text)
    """TRL's ``SFTConfig.chat_template_path``: a ``.jinja`` file replacing the tokenizer's chat template."""
    dataset_split: str | None = field(default=None, validator=_text)
    dataset_sample: int | None = field(default=None, validator=_positive)
    """Tokenize a random sample of this many examples (totals scaled, with a confidence interval)."""


@frozen
class Cost(settings.Section):
    """How it is paid for and how fast it goes, when stated."""
    extra: settings.Values = settings.extra_field()

    provider: str | None = field(default=None, validator=_text)
    instance: str | None = field(default=None, validator=_text)
    runs: int = field(default=1, validator=_at_least_one)
    tokens_per_second: float | None = field(default=None, validator=_positive)
    """Measured training throughput of the whole run (all GPUs), overriding every model of it."""
    mfu: float | None = field(default=None, validator=_positive)
    """Model FLOPs utilisation (0.4 = 40 %), overriding the ruleset default and calibration."""
    throughput_source: str | None = field(default=None, validator=_text)
    """A named set of measured throughputs in the ``[[throughput]]`` ruleset (e.g. ``seed``)."""
    region: str | None = field(default=None, validator=_text)
    """Only price instances in this region (default: the cheapest region)."""

    @mfu.validator
    def _mfu_fraction(self, att: attrs.Attribute, value: Any) -> None:
        if value is not None and value > 1:
            raise FitplanError(f"Cost.mfu is a fraction of the GPU's peak (0.4 = 40 %), got {value!r}", field="mfu",
                               value=value, suggestion="write 40 % as 0.4")


def _fraction(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A share of the GPU's memory: a number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise _number_error(inst, att, value, "a fraction in (0, 1]")


def _non_negative(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A finite number >= 0 and at most its :data:`LIMITS` (None: not given)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _number_error(inst, att, value, "a finite number >= 0")
    if value > LIMITS.get(att.name, math.inf):
        raise _number_error(inst, att, value, f"at most {LIMITS[att.name]:,g}")


def _optional_count(inst: Any, att: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _at_least_one(inst, att, value)


@frozen
class Trl(settings.Section):
    """TRL 1.16's trainer and the fields of its config (``DPOConfig``, ``KTOConfig``, ``RewardConfig``,
    ``GRPOConfig``, ``RLOOConfig``) that change memory or time, spelled as TRL spells them. ``None``: the
    trainer's own default (``trl/trainer/*_config.py``), stated in the report's assumed defaults."""
    extra: settings.Values = settings.extra_field()

    trainer: str = field(default="sft", validator=_one_of(TRAINERS))
    beta: float | None = field(default=None, validator=_non_negative)
    """The KL coefficient; 0 skips the reference model in GRPO (TRL defaults: DPO/KTO 0.1, GRPO 0.0, RLOO 0.05)."""
    precompute_ref_log_probs: bool = False
    cpo_alpha: float | None = field(default=None, validator=_non_negative)
    """CPO: the weight of the NLL term (TRL default 1.0); 0 skips it (and with it its logits' copy and log-softmax)."""
    loss_type: str | None = None
    """CPO: ``sigmoid`` (default), ``hinge``, ``ipo``, ``simpo`` or ``alphapo`` (which sets ``cpo_alpha = 0``); the
    other trainers' ``loss_type`` changes no byte fitplan counts."""
    """DPO/KTO: the reference log-probabilities are computed once before training (no reference forward per step)."""
    num_generations: int | None = field(default=None, validator=_optional_count)
    """GRPO/RLOO: completions sampled per prompt (TRL defaults: GRPO 8, RLOO 2)."""
    max_completion_length: int | None = field(default=None, validator=_optional_count)
    """GRPO/RLOO: the longest completion generated, in tokens (TRL default 512)."""
    prompt_length: int | None = field(default=None, validator=_optional_count)
    """GRPO/RLOO: the longest prompt in tokens (fitplan's own field: TRL 1.16 does not truncate prompts)."""
    generation_batch_size: int | None = field(default=None, validator=_optional_count)
    """GRPO/RLOO: sequences generated per generation round, all processes (TRL: per-device batch x processes x
    steps_per_generation)."""
    steps_per_generation: int | None = field(default=None, validator=_optional_count)
    """GRPO/RLOO: optimizer micro-steps per generation round (TRL default: gradient_accumulation_steps)."""
    use_vllm: bool = False
    """GRPO/RLOO: generate with vLLM instead of transformers' ``generate``."""
    vllm_mode: str = field(default="colocate", validator=_one_of(VLLM_MODES))
    """``colocate`` (vLLM shares the training GPUs) or ``server`` (``trl vllm-serve`` on GPUs of its own)."""
    vllm_gpu_memory_utilization: float = field(default=0.3, validator=_fraction)
    """The share of each GPU's memory vLLM takes (TRL default 0.3)."""
    vllm_enable_sleep_mode: bool = False
    """vLLM's sleep mode: its weights and KV cache leave the GPU while the policy trains."""
    vllm_tensor_parallel_size: int = field(default=1, validator=_at_least_one)
    """vLLM's tensor-parallel degree in colocate mode."""


@frozen
class Scenario:
    """Everything the user states. Build it with :func:`fitplan.scenario_from_dict`."""

    model: Model = Model()
    training: Training = Training()
    lora: Lora = Lora()
    parallel: Parallel = Parallel()
    hardware: Hardware = Hardware()
    dataset: Dataset = Dataset()
    cost: Cost = Cost()
    trl: Trl = Trl()

    def __attrs_post_init__(self) -> None:
        """Bounds on products of fields of two sections, so that no channel (flags, a scenario file, an import,
        the API) reaches a total beyond :data:`LIMITS` through two values that are each within theirs."""
        gpus = self.hardware.num_gpus * self.hardware.num_nodes
        if gpus > LIMITS["num_gpus"]:
            raise FitplanError(f"Hardware.num_gpus x num_nodes is {gpus:,} GPUs, at most {LIMITS['num_gpus']:,g}",
                               field="num_nodes", value=self.hardware.num_nodes, suggestion="num_gpus is per node")
        d = self.dataset
        if d.num_examples is not None and d.tokens_per_example is not None \
                and d.num_examples * d.tokens_per_example > LIMITS["total_tokens"]:
            raise FitplanError(f"Dataset.num_examples x tokens_per_example is {d.num_examples * d.tokens_per_example:,.3g} "
                               f"tokens, at most {LIMITS['total_tokens']:,g} (the bound of total_tokens)",
                               field="tokens_per_example", value=d.tokens_per_example)

    def replace(self, **flat: Any) -> Scenario:
        """A copy with flat field names changed: ``s.replace(zero_stage=2, per_device_train_batch_size=4)``."""
        return from_flat({**flatten(self), **flat})


SECTIONS: dict[str, type] = {f.name: f.type for f in attrs.fields(attrs.resolve_types(Scenario))}


def builtin_fields(cls: type) -> list[attrs.Attribute]:
    """A section's own fields (without ``extra``, where its plugin settings are kept)."""
    return [f for f in attrs.fields(cls) if f.name != "extra"]


settings.OWN_FIELDS.update({name: frozenset(f.name for f in builtin_fields(cls)) for name, cls in SECTIONS.items()})


ORDER: settings.LiveTable = settings.LiveTable(
    lambda: {section: settings.ordered(builtin_fields(cls), section) for section, cls in SECTIONS.items()})
"""Section -> its fields in order: its own, each plugin setting after the field it names (``after``), the others at
the end: the order of the TOML file, ``--help`` and :func:`flatten`."""
FIELD_SECTION: settings.LiveTable = settings.LiveTable(lambda: {f.name: s for s, fs in ORDER.items() for f in fs})
"""Flat field name -> its section, plugin settings included (names are unique across sections)."""
CHOICES: Mapping[str, tuple[Any, ...]] = settings.LiveTable(lambda: {
    f.name: f.choices if isinstance(f, settings.Setting) else tuple(c for c in f.validator.choices if c is not None)
    for fs in ORDER.values() for f in fs if (f.choices if isinstance(f, settings.Setting) else hasattr(f.validator, "choices"))})
"""Field -> the values it can take (``method``: full, lora, qlora): a rule condition comparing it with anything
else can never match (``fitplan rulesets check``)."""
FIELD_TYPES: Mapping[str, str] = settings.LiveTable(lambda: {
    f.name: settings.RULE_TYPES[f.type] if isinstance(f, settings.Setting) else "any" if f.validator is _ds_value
    else settings.rule_type(f.type) for fs in ORDER.values() for f in fs})
"""Field -> its type as rule conditions name types (``number``, ``text``, ``bool``; ``any`` otherwise)."""


def section_values(s: Scenario, section: str) -> dict[str, Any]:
    """One section's fields, plugin settings included, in :data:`ORDER`: name -> value."""
    return {f.name: getattr(getattr(s, section), f.name) for f in ORDER[section]}


def flatten(s: Scenario) -> dict[str, Any]:
    """The scenario as one flat dict of field name -> value (plugin settings included)."""
    out: dict[str, Any] = {}
    for section, fs in ORDER.current().items():
        part = getattr(s, section)
        out.update((f.name, getattr(part, f.name)) for f in fs)
    return out


def from_flat(values: dict[str, Any]) -> Scenario:
    """Build a scenario from flat field names (unknown names are errors)."""
    nested: dict[str, dict[str, Any]] = {}
    sections = FIELD_SECTION.current()
    for name, value in values.items():
        section = sections.get(name)
        if section is None:
            from fitplan.errors import unknown

            raise unknown("scenario field", name, FIELD_SECTION)
        nested.setdefault(section, {})[name] = value
    return from_nested(nested)


def from_nested(nested: dict[str, Any], *, file: str | None = None) -> Scenario:
    """Build a scenario from ``{"section": {field: value}}`` (strict: wrong types and unknown keys are errors;
    a plugin setting is checked by its declaration, :meth:`fitplan.inputs.settings.Setting.check`)."""
    return structure(settings.split(nested, file), Scenario, file=file)
