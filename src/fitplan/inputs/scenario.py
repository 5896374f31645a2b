"""The scenario: everything the user states about a run.

Frozen attrs classes, one per section of a scenario TOML file. Field names are unique
across sections, so that the flattened scenario (:func:`flatten`) is the namespace that
quantity functions draw their inputs from. Names follow the Hugging Face vocabulary
(TrainingArguments, peft's LoraConfig) wherever it has one.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import field, frozen

from fitplan.errors import FitplanError
from fitplan.inputs.convert import structure
from fitplan.inputs.precision import PRECISIONS

METHODS = ("full", "lora", "qlora")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
FSDP_MODES = ("full_shard", "shard_grad_op", "hybrid_shard")
ASSUMPTIONS = ("realistic", "seed")
PADDING = ("pad", "pack")
DEVICES = ("cuda", "cpu")


def _positive(inst: Any, att: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not value > 0:
        raise FitplanError(
            f"{type(inst).__name__}.{att.name} must be > 0, got {value!r}", field=att.name, value=value
        )


def _at_least_one(inst: Any, att: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FitplanError(
            f"{type(inst).__name__}.{att.name} must be an integer >= 1, got {value!r}", field=att.name, value=value
        )


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

    return check


@frozen
class Model:
    """Which model: a catalog name or a path to an HF ``config.json`` (``model``), or a bare count (``params``)."""

    model: str | None = None
    params: str | None = None
    method: str = field(default="full", validator=_one_of(METHODS))
    assumptions: str = field(default="realistic", validator=_one_of(ASSUMPTIONS))


@frozen
class Training:
    """The HF TrainingArguments that change memory and time."""

    per_device_train_batch_size: int = field(default=1, validator=_at_least_one)
    gradient_accumulation_steps: int = field(default=1, validator=_at_least_one)
    max_seq_length: int = field(default=2048, validator=_at_least_one)
    gradient_checkpointing: bool = False
    optim: str = "adamw_torch"
    precision: str = field(default="32-true", validator=_one_of(PRECISIONS))
    attn_implementation: str = field(default="sdpa", validator=_one_of(ATTN_IMPLEMENTATIONS))
    num_train_epochs: float = field(default=1.0, validator=_positive)
    tf32: bool = False
    """HF ``tf32``: fp32 matmuls on TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32``); off by default."""
    torch_compile: bool = False
    """HF ``torch_compile``: the model runs under ``torch.compile`` (Inductor fuses elementwise ops: time only)."""


@frozen
class Lora:
    """peft's LoraConfig fields (used when ``method`` is lora or qlora)."""

    lora_r: int = field(default=8, validator=_at_least_one)
    lora_alpha: int = 16
    lora_target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    lora_dropout: float = 0.0
    bnb_4bit_use_double_quant: bool = True
    autocast_adapter_dtype: bool = True
    """peft's ``get_peft_model(..., autocast_adapter_dtype=True)``: 16-bit adapters are upcast to fp32 (their
    GEMMs then run in fp32 without autocast). False keeps them in the base weights' dtype, as torchtune's
    LoRA modules are."""


@frozen
class Parallel:
    """Sharding and parallelism."""

    zero_stage: int = field(default=0, validator=_one_of((0, 1, 2, 3)))  # type: ignore[arg-type]
    fsdp: str | None = field(default=None, validator=_one_of((None, *FSDP_MODES)))  # type: ignore[arg-type]
    offload_optimizer: bool = False
    offload_params: bool = False
    tensor_parallel: int = field(default=1, validator=_at_least_one)


@frozen
class Hardware:
    """Where it runs."""

    gpu: str | None = None
    num_gpus: int = field(default=1, validator=_at_least_one)
    num_nodes: int = field(default=1, validator=_at_least_one)
    device: str = field(default="cuda", validator=_one_of(DEVICES))
    """Whose kernels run the step: ``cuda`` (default) or ``cpu``, what fitplan-torch's CPU and FakeTensor
    referees run (CPU dropout keeps its mask in the input dtype, CPU SDPA with dropout takes the math path,
    no 512-byte allocator rounding, AdamW's ``step`` scalars live with the parameters)."""


@frozen
class Dataset:
    """How much data: examples × tokens per example, or total tokens; × epochs (in Training)."""

    num_examples: int | None = field(default=None, validator=_positive)
    tokens_per_example: float | None = field(default=None, validator=_positive)
    total_tokens: int | None = field(default=None, validator=_positive)
    padding: str = field(default="pack", validator=_one_of(PADDING))


@frozen
class Cost:
    """How it is paid for and how fast it goes, when stated."""

    provider: str | None = None
    instance: str | None = None
    runs: int = field(default=1, validator=_at_least_one)
    tokens_per_second: float | None = field(default=None, validator=_positive)
    """Measured training throughput of the whole run (all GPUs), overriding every model of it."""
    mfu: float | None = field(default=None, validator=_positive)
    """Model FLOPs utilisation (0.4 = 40 %), overriding the ruleset default and calibration."""
    throughput_source: str | None = None
    """A named set of measured throughputs in the ``[[throughput]]`` ruleset (e.g. ``seed``)."""
    region: str | None = None
    """Only price instances in this region (default: the cheapest region)."""

    @mfu.validator
    def _mfu_fraction(self, att: attrs.Attribute, value: Any) -> None:
        if value is not None and value > 1:
            raise FitplanError(f"Cost.mfu is a fraction of the GPU's peak (0.4 = 40 %), got {value!r}", field="mfu",
                               value=value, suggestion="write 40 % as 0.4")


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

    def replace(self, **flat: Any) -> Scenario:
        """A copy with flat field names changed: ``s.replace(zero_stage=2, per_device_train_batch_size=4)``."""
        return from_flat({**flatten(self), **flat})


def _resolve_sections() -> dict[str, type]:
    hints = attrs.resolve_types(Scenario)
    return {f.name: f.type for f in attrs.fields(hints)}


SECTIONS = _resolve_sections()
FIELD_SECTION: dict[str, str] = {
    f.name: section for section, cls in SECTIONS.items() for f in attrs.fields(cls)
}
"""Flat field name -> its section. Field names are unique across sections."""


def flatten(s: Scenario) -> dict[str, Any]:
    """The scenario as one flat dict of field name -> value."""
    out: dict[str, Any] = {}
    for section in SECTIONS:
        out.update(attrs.asdict(getattr(s, section), recurse=False))
    return out


def from_flat(values: dict[str, Any]) -> Scenario:
    """Build a scenario from flat field names (unknown names are errors)."""
    nested: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        section = FIELD_SECTION.get(name)
        if section is None:
            from fitplan.errors import unknown

            raise unknown("scenario field", name, FIELD_SECTION)
        nested.setdefault(section, {})[name] = value
    return from_nested(nested)


def from_nested(nested: dict[str, Any], *, file: str | None = None) -> Scenario:
    """Build a scenario from ``{"section": {field: value}}`` (strict: wrong types and unknown keys are errors)."""
    return structure(nested, Scenario, file=file)
