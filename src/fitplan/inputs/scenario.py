"""The scenario: everything the user states about a run.

Frozen attrs classes, one per section of a scenario TOML file. Field names are unique
across sections, so that the flattened scenario (:func:`flatten`) is the namespace that
quantity functions draw their inputs from. Names follow the Hugging Face vocabulary
(TrainingArguments, peft's LoraConfig) wherever it has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from attrs import field, frozen

from fitplan.errors import FitplanError
from fitplan.inputs import field_checks as checks, settings
from fitplan.inputs.convert import structure
from fitplan.inputs.precision import PRECISIONS, dtype_code, load_dtype_word

METHODS = ("full", "lora", "qlora")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
LOSS_IMPLEMENTATIONS = ("hf", "chunked", "chunked_compiled", "liger", "cce", "trl_grpo")
"""How the loss head runs (trace/loss_heads.py, docs/memory-model.md "Loss implementations")."""
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


@frozen
class Model(settings.Section):
    """Which model: a catalog name or a path to an HF ``config.json`` (``model``), or a bare count (``params``)."""
    extra: settings.Values = settings.extra_field()

    model: str | None = field(default=None, validator=checks.bounded_text)
    params: str | None = field(default=None, validator=checks.bounded_text)
    method: str = field(default="full", validator=checks.one_of(METHODS))
    assumptions: str = field(default="realistic", validator=checks.one_of(ASSUMPTIONS))


@frozen
class Training(settings.Section):
    """The HF TrainingArguments that change memory and time."""
    extra: settings.Values = settings.extra_field()

    per_device_train_batch_size: int = field(default=1, validator=checks.at_least_one)
    gradient_accumulation_steps: int = field(default=1, validator=checks.at_least_one)
    max_seq_length: int = field(default=2048, validator=checks.at_least_one)
    gradient_checkpointing: bool = False
    optim: str = field(default="adamw_torch_fused", validator=checks.bounded_text)
    """HF ``TrainingArguments.optim``; the default is transformers 5.24's on torch >= 2.8 (training_args.py
    ``default_optim``: ``adamw_torch_fused``)."""
    optim_args: str = field(default="", validator=checks.optim_args)
    """HF ``optim_args``: ``"rank=64,momentum=0.9"`` (GaLore/APOLLO rank, SGD/RMSprop momentum, torchao block_size)."""
    optim_target_modules: tuple[str, ...] = field(default=(), validator=lambda i, a, v: v == () or checks.module_names(i, a, v))
    """HF ``optim_target_modules`` (GaLore, APOLLO): module names, ``all-linear``, or one regular expression."""
    precision: str | None = field(default=None, validator=checks.one_of((None, *PRECISIONS)))  # type: ignore[arg-type]
    """A preset of :mod:`fitplan.inputs.precision` (Lightning's names), or None: what the HF words decide
    (``bf16``, ``fp16`` and the load ``dtype``: :func:`fitplan.inputs.precision.hf_precision`)."""
    dtype: str = field(default="auto", converter=load_dtype_word)
    """``from_pretrained``'s ``dtype``: ``auto`` (transformers 5.24's default: the checkpoint's ``dtype`` /
    ``torch_dtype``, float32 when its config states none), ``float32``, ``bfloat16`` or ``float16``."""
    bf16: bool = False
    """HF ``TrainingArguments.bf16``: bf16 autocast over the loaded weights (DeepSpeed: its bf16 optimizer)."""
    fp16: bool = field(default=False)
    """HF ``TrainingArguments.fp16``: fp16 autocast with a GradScaler (DeepSpeed: its fp16 optimizer)."""
    attn_implementation: str = field(default="sdpa", validator=checks.one_of(ATTN_IMPLEMENTATIONS))
    num_train_epochs: float = field(default=1.0, validator=checks.positive)
    tf32: bool = False
    """HF ``tf32``: fp32 matmuls on TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32``); off by default."""
    torch_compile: bool = False
    """HF ``torch_compile``: the model runs under ``torch.compile`` (Inductor fuses elementwise ops: time only)."""
    optimizer_in_bwd: bool = field(default=False)
    """torchtune's ``optimizer_in_bwd``: one optimizer per parameter, stepped in the parameter's
    post-accumulate-grad hook, which then frees its gradient (no gradient outlives the backward); one micro-batch
    per step, one GPU."""
    loss_implementation: str = field(default="hf", validator=checks.one_of(LOSS_IMPLEMENTATIONS))
    """The loss head: ``hf`` (the model's ``ForCausalLMLoss`` over the whole fp32 logits), ``chunked`` (torchtune's
    ``CEWithChunkedOutputLoss``, 8 chunks, eager), ``chunked_compiled`` (the same with its ``compute_cross_entropy``
    under ``torch.compile``, torchtune's ``compile: True``), ``liger`` (Liger-Kernel's fused linear cross-entropy,
    TrainingArguments ``use_liger_kernel``), ``cce`` (Apple's Cut Cross-Entropy)."""

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

    lora_r: int = field(default=8, validator=checks.at_least_one)
    lora_alpha: int = field(default=16, validator=checks.positive)
    lora_target_modules: tuple[str, ...] | None = field(default=None, validator=lambda i, a, v: v is None or checks.module_names(i, a, v))
    """peft's ``target_modules``: module names, ``all-linear``, or one regular expression. None (not given): what
    peft chooses without it, its default for the model type (``fitplan.estimation.with_default_targets``); an
    empty list is an error, as in peft."""
    lora_dropout: float = field(default=0.0, validator=checks.probability)
    lora_modules_to_save: tuple[str, ...] = field(default=(), validator=lambda i, a, v: v == () or checks.module_names(i, a, v))
    """peft's ``modules_to_save``: modules outside the decoder layers (``embed_tokens``, ``lm_head``) trained whole,
    as a copy beside the frozen original (``ModulesToSaveWrapper``); builtin/lora.py says where fitplan models it."""
    bnb_4bit_use_double_quant: bool = True
    autocast_adapter_dtype: bool = True
    """peft's ``get_peft_model(..., autocast_adapter_dtype=True)``: 16-bit adapters are upcast to fp32 (their
    GEMMs then run in fp32 without autocast). False keeps them in the base weights' dtype, as torchtune's
    LoRA modules are."""
    bnb_4bit_compute_dtype: str | None = field(
        default=None, converter=lambda v: None if v is None else dtype_code(v, what="bnb_4bit_compute_dtype"))
    """transformers' ``BitsAndBytesConfig.bnb_4bit_compute_dtype`` (None: float32), in any spelling HF takes
    (``bfloat16``, ``torch.bfloat16``, ``bf16``), kept as fitplan's short name. bitsandbytes 0.50.2 computes in
    the input's dtype whenever that is fp32 or bf16 (``Linear4bit.set_compute_type``): fitplan warns when it differs."""
    kbit_preparation: str = field(default="peft", validator=checks.one_of(KBIT_PREPARATION))
    """QLoRA: what the training script does after loading the 4-bit model (a stated assumption): ``peft``
    (``prepare_model_for_kbit_training``: every non-quantized parameter cast to fp32, LoRA in fp32), ``trl``
    (TRL's SFTTrainer: base parameters stay in the load dtype, LoRA weights cast to bf16) or ``none``
    (``get_peft_model`` alone: base in the load dtype, LoRA in fp32)."""


@frozen
class Parallel(settings.Section):
    """Sharding and parallelism."""
    extra: settings.Values = settings.extra_field()

    zero_stage: int = field(default=0, validator=checks.one_of((0, 1, 2, 3)))  # type: ignore[arg-type]
    fsdp: str | None = field(default=None, validator=checks.one_of((None, *FSDP_MODES)))  # type: ignore[arg-type]
    offload_optimizer: bool = False
    tensor_parallel: int = field(default=1, validator=checks.at_least_one)
    stack: str | None = field(default=None, validator=checks.one_of((None, *STACKS)))  # type: ignore[arg-type]
    """Which implementation shards (None: ``--zero``/offload/``*-master`` mean DeepSpeed, ``--fsdp`` means the HF
    Trainer's default FSDP2, several GPUs otherwise mean DDP): see ``inputs/stacks.py``."""
    fsdp_sharding_strategy: str | None = field(default=None, validator=checks.one_of((None, *FSDP_MODES)))  # type: ignore[arg-type]
    """FSDP1 only: the ``FSDP_SHARDING_STRATEGY`` that ``accelerate launch`` exports from an accelerate config's
    ``fsdp_sharding_strategy`` (None: unset, FULL_SHARD). FSDP1 runs it, not the Trainer's ``fsdp`` mode."""
    reduce_bucket_size: str | None = field(default=None, validator=checks.ds_value)
    """DeepSpeed ``zero_optimization.reduce_bucket_size`` in elements: None = DeepSpeed's default (5e8), "auto" =
    HF's hidden²."""
    overlap_comm: bool | None = None
    """DeepSpeed ``overlap_comm`` (None: DeepSpeed's default, on at stage 3 only)."""
    stage3_prefetch_bucket_size: str | None = field(default=None, validator=checks.ds_value)
    """DeepSpeed stage 3 prefetch in elements: None = 5e7, "auto" = 0.9·hidden²."""
    stage3_param_persistence_threshold: str | None = field(default=None, validator=checks.ds_value)
    """DeepSpeed stage 3: parameters of at most this many elements stay whole: None = 1e5, "auto" = 10·hidden."""
    stage3_max_live_parameters: str | None = field(default=None, validator=checks.ds_value)
    """DeepSpeed stage 3: prefetch stops at this many gathered elements (None = 1e9)."""
    stage3_max_reuse_distance: str | None = field(default=None, validator=checks.ds_value)
    """DeepSpeed stage 3: a module's gathered parameters stay when it is used again within this many elements of
    the trace (None = 1e9; 0 releases every module after its forward)."""
    sub_group_size: str | None = field(default=None, validator=checks.ds_value)
    """DeepSpeed stage 3: the fp32 partitions are grouped in sub-groups of this many elements (None = 1e9)."""


@frozen
class Hardware(settings.Section):
    """Where it runs."""
    extra: settings.Values = settings.extra_field()

    gpu: str | None = field(default=None, validator=checks.bounded_text)
    num_gpus: int = field(default=1, validator=checks.at_least_one)
    num_nodes: int = field(default=1, validator=checks.at_least_one)
    device: str = field(default="cuda", validator=checks.one_of(DEVICES))
    """Whose kernels run the step: ``cuda`` (default) or ``cpu``, what fitplan-torch's CPU and FakeTensor
    referees run (CPU dropout keeps its mask in the input dtype, CPU SDPA with dropout takes the math path,
    no 512-byte allocator rounding, AdamW's ``step`` scalars live with the parameters)."""


@frozen
class Dataset(settings.Section):
    """How much data: examples × tokens per example, or total tokens; × epochs (in Training). Or the dataset
    itself (``dataset_path``: a data file or directory, or a summary TOML), read as TRL's SFT trainer reads it
    (docs/dataset.md)."""
    extra: settings.Values = settings.extra_field()

    num_examples: int | None = field(default=None, validator=checks.positive)
    tokens_per_example: float | None = field(default=None, validator=checks.positive)
    total_tokens: int | None = field(default=None, validator=checks.positive)
    padding: str = field(default="pack", validator=checks.one_of(PADDING))
    dataset_path: str | None = field(default=None, validator=checks.bounded_text)
    dataset_text_field: str = field(default="text", validator=checks.bounded_text)
    """TRL's ``SFTConfig.dataset_text_field``: the column of plain-text examples."""
    tokenizer: str | None = field(default=None, validator=checks.bounded_text)
    """A tokenizer directory or Hugging Face id (default: the model's)."""
    chat_template_path: str | None = field(default=None, validator=checks.bounded_text)
    """TRL's ``SFTConfig.chat_template_path``: a ``.jinja`` file replacing the tokenizer's chat template."""
    dataset_split: str | None = field(default=None, validator=checks.bounded_text)
    dataset_sample: int | None = field(default=None, validator=checks.positive)
    """Tokenize a random sample of this many examples (totals scaled, with a confidence interval)."""


@frozen
class Cost(settings.Section):
    """How it is paid for and how fast it goes, when stated."""
    extra: settings.Values = settings.extra_field()

    provider: str | None = field(default=None, validator=checks.bounded_text)
    instance: str | None = field(default=None, validator=checks.bounded_text)
    runs: int = field(default=1, validator=checks.at_least_one)
    tokens_per_second: float | None = field(default=None, validator=checks.positive)
    """Measured training throughput of the whole run (all GPUs), overriding every model of it."""
    mfu: float | None = field(default=None, validator=checks.positive)
    """Model FLOPs utilisation (0.4 = 40 %), overriding the ruleset default and calibration."""
    throughput_source: str | None = field(default=None, validator=checks.bounded_text)
    """A named set of measured throughputs in the ``[[throughput]]`` ruleset (e.g. ``seed``)."""
    region: str | None = field(default=None, validator=checks.bounded_text)
    """Only price instances in this region (default: the cheapest region)."""

    @mfu.validator
    def _mfu_fraction(self, att: attrs.Attribute, value: Any) -> None:
        if value is not None and value > 1:
            raise FitplanError(f"Cost.mfu is a fraction of the GPU's peak (0.4 = 40 %), got {value!r}", field="mfu",
                               value=value, suggestion="write 40 % as 0.4")


@frozen
class Trl(settings.Section):
    """TRL 1.16's trainer and the fields of its config (``DPOConfig``, ``KTOConfig``, ``RewardConfig``,
    ``GRPOConfig``, ``RLOOConfig``) that change memory or time, spelled as TRL spells them. ``None``: the
    trainer's own default (``trl/trainer/*_config.py``), stated in the report's assumed defaults."""
    extra: settings.Values = settings.extra_field()

    trainer: str = field(default="sft", validator=checks.one_of(TRAINERS))
    beta: float | None = field(default=None, validator=checks.non_negative)
    """The KL coefficient; 0 skips the reference model in GRPO (TRL defaults: DPO/KTO 0.1, GRPO 0.0, RLOO 0.05)."""
    precompute_ref_log_probs: bool = False
    cpo_alpha: float | None = field(default=None, validator=checks.non_negative)
    """CPO: the weight of the NLL term (TRL default 1.0); 0 skips it (and with it its logits' copy and log-softmax)."""
    loss_type: str | None = None
    """CPO: ``sigmoid`` (default), ``hinge``, ``ipo``, ``simpo`` or ``alphapo`` (which sets ``cpo_alpha = 0``); the
    other trainers' ``loss_type`` changes no byte fitplan counts."""
    """DPO/KTO: the reference log-probabilities are computed once before training (no reference forward per step)."""
    num_generations: int | None = field(default=None, validator=checks.optional_count)
    """GRPO/RLOO: completions sampled per prompt (TRL defaults: GRPO 8, RLOO 2)."""
    max_completion_length: int | None = field(default=None, validator=checks.optional_count)
    """GRPO/RLOO: the longest completion generated, in tokens (TRL default 512)."""
    prompt_length: int | None = field(default=None, validator=checks.optional_count)
    """GRPO/RLOO: the longest prompt in tokens (fitplan's own field: TRL 1.16 does not truncate prompts)."""
    generation_batch_size: int | None = field(default=None, validator=checks.optional_count)
    """GRPO/RLOO: sequences generated per generation round, all processes (TRL: per-device batch x processes x
    steps_per_generation)."""
    steps_per_generation: int | None = field(default=None, validator=checks.optional_count)
    """GRPO/RLOO: optimizer micro-steps per generation round (TRL default: gradient_accumulation_steps)."""
    use_vllm: bool = False
    """GRPO/RLOO: generate with vLLM instead of transformers' ``generate``."""
    vllm_mode: str = field(default="colocate", validator=checks.one_of(VLLM_MODES))
    """``colocate`` (vLLM shares the training GPUs) or ``server`` (``trl vllm-serve`` on GPUs of its own)."""
    vllm_gpu_memory_utilization: float = field(default=0.3, validator=checks.fraction)
    """The share of each GPU's memory vLLM takes (TRL default 0.3)."""
    vllm_enable_sleep_mode: bool = False
    """vLLM's sleep mode: its weights and KV cache leave the GPU while the policy trains."""
    vllm_tensor_parallel_size: int = field(default=1, validator=checks.at_least_one)
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
        the API) reaches a total beyond :data:`checks.LIMITS` through two values that are each within theirs."""
        gpus = self.hardware.num_gpus * self.hardware.num_nodes
        if gpus > checks.LIMITS["num_gpus"]:
            raise FitplanError(f"Hardware.num_gpus x num_nodes is {gpus:,} GPUs, at most {checks.LIMITS['num_gpus']:,g}",
                               field="num_nodes", value=self.hardware.num_nodes, suggestion="num_gpus is per node")
        d = self.dataset
        if d.num_examples is not None and d.tokens_per_example is not None \
                and d.num_examples * d.tokens_per_example > checks.LIMITS["total_tokens"]:
            raise FitplanError(f"Dataset.num_examples x tokens_per_example is {d.num_examples * d.tokens_per_example:,.3g} "
                               f"tokens, at most {checks.LIMITS['total_tokens']:,g} (the bound of total_tokens)",
                               field="tokens_per_example", value=d.tokens_per_example)

    def replace(self, **flat: Any) -> Scenario:
        """A copy with flat field names changed: ``s.replace(zero_stage=2, per_device_train_batch_size=4)``. Text
        set to a string (None where allowed) needs no conversion: only the changed sections are built again (their
        validators, then the scenario's checks, run), 10x quicker for the page's per-GPU and per-provider variants;
        anything else, or a refused value, goes through :func:`from_flat` (cattrs' conversions and error)."""
        if flat and all(_settable_text(name, value) for name, value in flat.items()):
            by_section: dict[str, dict[str, Any]] = {}
            for name, value in flat.items():
                by_section.setdefault(FIELD_SECTION[name], {})[name] = value
            try:
                return attrs.evolve(self, **{section: attrs.evolve(getattr(self, section), **fields)
                                             for section, fields in by_section.items()})
            except Exception:  # noqa: BLE001 - refused: from_flat says why, as it would have
                pass
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
    f.name: settings.RULE_TYPES[f.type] if isinstance(f, settings.Setting) else "any" if f.validator is checks.ds_value
    else settings.rule_type(f.type) for fs in ORDER.values() for f in fs})
"""Field -> its type as rule conditions name types (``number``, ``text``, ``bool``; ``any`` otherwise)."""


def section_values(s: Scenario, section: str) -> dict[str, Any]:
    """One section's fields, plugin settings included, in :data:`ORDER`: name -> value."""
    return {f.name: getattr(getattr(s, section), f.name) for f in ORDER[section]}


TEXT_FIELDS: dict[str, bool] = {
    f.name: str(f.type) != "str" for cls in SECTIONS.values() for f in builtin_fields(cls)
    if str(f.type) in ("str", "str | None")}
"""Text field -> whether it may be None (its type ``str | None``), for :meth:`Scenario.replace`."""


def _settable_text(name: str, value: Any) -> bool:
    """Structuring ``value`` into text field ``name`` gives it back unchanged (a ``str``; None where allowed)."""
    optional = TEXT_FIELDS.get(name)
    return optional is not None and (type(value) is str or (value is None and optional))


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
