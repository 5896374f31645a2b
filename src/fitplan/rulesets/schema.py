"""The schemas of ruleset files: every table a ruleset TOML may hold, as frozen attrs classes.

Structured by the strict cattrs converter (:mod:`fitplan.inputs.convert`): unknown keys, wrong types and
values out of range are errors naming the file and the ``$.path``. Policy and advice conditions are checked
for syntax here (compiled by :mod:`fitplan.rulesets.conditions`); their names are checked against the plugins'
vocabulary by ``fitplan rulesets check``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import attrs
from attrs import field, frozen

from fitplan.errors import FitplanError
from fitplan.rulesets.conditions import compile_condition
from fitplan.rulesets.templates import template_names


MAXIMA: dict[str, float] = {
    "memory_bytes": 2**44, "usable_bytes": 2**44, "bandwidth_gbps": 1e5, "interconnect_gbps": 1e5,
    "inter_node_gbps": 1e5, "host_memory_gib": 2**20, "gpus_per_node": 1024, "gpus": 1024, "on_demand_per_hour": 1e5, "spot_per_hour": 1e5,
    "minimum_seconds": 86_400 * 31, "spot_overhead": 10, "spot_interruptions_per_hour": 3600, "checkpoint_gbps": 1e5, "cuda_context_bytes": 2**40, "cublas_workspace_bytes": 2**40,
    "allocator_reserve_ratio": 10, "allocator_block_bytes": 2**30, "param_count": 1e15, "max_seq_length": 2**24,
    "num_gpus": 1e6, "tokens_per_second_per_gpu": 1e9, "tokens_per_second": 1e12, "penalty": 1e6, "peak_tflops": 1e6,
}
"""The largest value of a ruleset number that makes physical sense (16 TiB of GPU memory, $100,000 an hour,
a million TFLOPS): beyond it a value is a typo (a missing decimal point, bytes written as bits)."""
MINIMA: dict[str, float] = {
    "bandwidth_gbps": 1e-3, "interconnect_gbps": 1e-3, "inter_node_gbps": 1e-3, "network_gbps": 1e-3,
    "peak_tflops": 1e-3, "tokens_per_second_per_gpu": 1e-3, "tokens_per_second": 1e-3, "mfu": 1e-4, "scale": 1e-3,
    "measured_tokens_per_second_per_gpu": 1e-3, "predicted_tokens_per_second_per_gpu": 1e-3,
}
"""The smallest non-zero value of a rate (a megabyte a second, a gigaflop, a thousandth of a token a second, an
MFU of 0.01 %, a calibration a thousand times faster): a time is a size over a rate, so a rate near zero would
give an infinite time (1e-300 GB/s is a typo, never a GPU). Zero stays allowed where the field allows it."""
MAXIMA["scale"] = 1e3
MAXIMA.update({"network_gbps": 1e5, "measured_tokens_per_second_per_gpu": 1e9, "predicted_tokens_per_second_per_gpu": 1e9,
               "host_seconds_per_kernel": 3600, "host_seconds_per_zero3_fetch": 3600, "band_low": 1e3, "band_high": 1e3,
               "loo_median": 1e3, "runs": 1e6})
"""Rates as the other rates; a host overhead of at most an hour per kernel or fetch; a likely range of at most a
thousand times the estimate; at most a million fitted runs."""
ID = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,127}$")
"""Ids of GPUs, providers, models, rows and rules: lowercase, as ``--gpu`` / ``--model`` / ``--provider`` look
them up (an uppercase id could never be selected)."""


def _check_number(inst: Any, att: attrs.Attribute, value: Any, positive: bool) -> None:
    if value is None:
        return
    where = f"{type(inst).__name__}.{att.name}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FitplanError(f"{where} must be a finite number, got {value!r}", field=att.name, value=value)
    if value <= 0 if positive else value < 0:
        raise FitplanError(f"{where} must be {'> 0' if positive else '>= 0'}, got {value!r}", field=att.name, value=value)
    low = MINIMA.get(att.name)
    if low is not None and 0 < value < low:
        raise FitplanError(f"{where} must be 0 or at least {low:g}, got {value!r}" if not positive else
                           f"{where} must be at least {low:g}, got {value!r}", field=att.name, value=value,
                           suggestion="check the unit")
    limit = MAXIMA.get(att.name)
    if limit is not None and value > limit:
        raise FitplanError(f"{type(inst).__name__}.{att.name} must be at most {limit:,g}, got {value!r}", field=att.name,
                           value=value, suggestion="check the unit")


def _nonneg(inst: Any, att: attrs.Attribute, value: Any) -> None:
    _check_number(inst, att, value, positive=False)


def _pos(inst: Any, att: attrs.Attribute, value: Any) -> None:
    _check_number(inst, att, value, positive=True)


def _id(inst: Any, att: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or not ID.match(value):
        raise FitplanError(f"{type(inst).__name__}.{att.name} must be a lowercase id (letters, digits, '.', '_', '+', "
                           f"'-'; at most 128), got {value!r:.60}", field=att.name, value=value,
                           suggestion=f"write {value.lower()!r}" if isinstance(value, str) and ID.match(value.lower()) else None)


def _tflops(inst: Any, att: attrs.Attribute, value: dict[str, float]) -> None:
    for dtype, v in value.items():
        if dtype not in DTYPES:
            from fitplan.errors import did_you_mean

            raise FitplanError(f"GPU.peak_tflops has unknown dtype {dtype!r}", field=f"peak_tflops.{dtype}", value=dtype,
                               suggestion=did_you_mean(dtype, DTYPES) or "dtypes: " + ", ".join(DTYPES))
        _check_number(inst, att, v, positive=True)


DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")


@frozen
class GPU:
    """One GPU model. ``usable_bytes`` is what ``torch.cuda.get_device_properties().total_memory`` reports."""

    id: str = field(validator=_id)
    name: str
    memory_bytes: int = field(validator=_pos)
    usable_bytes: int = field(validator=_pos)
    peak_tflops: dict[str, float] = field(validator=_tflops)
    """Dense peak TFLOPS per dtype: keys among fp32, tf32, bf16, fp16, fp8, int8."""
    bandwidth_gbps: float = field(validator=_pos)
    source: str
    aliases: tuple[str, ...] = ()
    interconnect: str = "pcie"
    interconnect_gbps: float = field(default=32.0, validator=_pos)
    """Per-GPU bidirectional-ish bandwidth within a node (NVLink or PCIe), GB/s."""
    inter_node_gbps: float = field(default=50.0, validator=_pos)
    """Per-GPU network bandwidth between nodes, GB/s (e.g. 400 Gb/s InfiniBand = 50 GB/s)."""
    gpus_per_node: int = field(default=8, validator=_pos)
    generation: str = ""
    """The GPU's architecture generation (``volta``, ``turing``, ``ampere``, ``ada``, ``hopper``, ``blackwell``,
    ``cdna3``): the time model's efficiency factors are fitted per generation (``[[time_efficiency]]``)."""

    @usable_bytes.validator
    def _usable_le_memory(self, att: attrs.Attribute, value: int) -> None:
        if value > self.memory_bytes * 1.1:
            raise FitplanError(
                f"GPU.usable_bytes ({value}) exceeds memory_bytes ({self.memory_bytes})", field=att.name, value=value
            )


@frozen
class Provider:
    id: str = field(validator=_id)
    name: str
    source: str
    billing: str = field(default="second", validator=attrs.validators.in_(("second", "minute", "hour")))
    """Billing granularity: usage is rounded up to a whole unit."""
    minimum_seconds: int = field(default=60, validator=_nonneg)
    currency: str = "USD"
    spot_overhead: float = field(default=0.1, validator=_nonneg)
    """Extra fraction of run time lost to spot interruptions and restarts (0.1 = +10 %): the flat assumption used
    where ``spot_interruptions_per_hour`` is not stated."""
    spot_interruptions_per_hour: float | None = field(default=None, validator=_nonneg)
    """Mean spot interruptions per instance-hour (λ), from a public dated source named in ``source``; None: not
    published, spot is unpriced for risk (the flat ``spot_overhead`` is used). :mod:`fitplan.builtin.spot_risk`."""
    reference: bool = False
    """A reference table, not a market (the seed chapter's approximate, undated prices): priced when named
    (``--provider``, ``--providers``) but never chosen by ``fitplan recommend`` on its own."""


@frozen
class Instance:
    """A rentable machine: ``gpus`` × ``gpu`` at an hourly price for the whole instance."""

    provider: str = field(validator=_id)
    id: str
    gpu: str = field(validator=_id)
    gpus: int = field(validator=_pos)
    on_demand_per_hour: float = field(validator=_nonneg)
    source: str
    spot_per_hour: float | None = field(default=None, validator=_nonneg)
    region: str = ""
    date: str = ""
    interconnect: str | None = None
    """How the instance's GPUs talk to each other (``nvlink``, ``pcie-gen4``, ...); None: the GPU ruleset's
    ``interconnect`` (a one-GPU instance has none)."""
    interconnect_gbps: float | None = field(default=None, validator=_nonneg)
    """Per-GPU GB/s inside the instance; None: the GPU ruleset's ``interconnect_gbps``."""
    network_gbps: float | None = field(default=None, validator=_nonneg)
    """GB/s (gigabytes) of network bandwidth of the whole instance to other instances (AWS "Up to 25 Gigabit"
    is 3.125); None: the GPU ruleset's ``inter_node_gbps`` per GPU (``fitplan estimate`` says it assumes it;
    ``fitplan recommend`` never combines such instances)."""
    host_memory_gib: float | None = field(default=None, validator=_nonneg)
    """GiB of host RAM of the whole instance (the provider's stated memory); None: not stated, so the
    recommender cannot check a CPU-offload plan's host memory against it (it says so)."""
    checkpoint_gbps: float | None = field(default=None, validator=_nonneg)
    """GB/s at which the instance writes (and reads back) a checkpoint to its disk or network storage; None: not
    stated, so a spot run's checkpoint time and interruption cost are not modelled."""


@frozen
class Framework:
    """What CUDA and PyTorch add beyond tensor bytes. Calibrated by ``fitplan validate --calibrate-out``."""

    cuda_context_bytes: int = field(default=500 * 2**20, validator=_nonneg)
    cublas_workspace_bytes: int = field(default=8 * 2**20, validator=_nonneg)
    allocator_reserve_ratio: float = field(default=1.05, validator=_pos)
    """reserved / allocated at the peak (caching allocator fragmentation)."""
    allocator_block_bytes: int = field(default=512, validator=_pos)
    source: str = ""


@frozen
class MfuRow:
    """A published MFU measurement: what one training setup reached on one GPU."""

    id: str = field(validator=_id)
    gpu: str
    param_count: float = field(validator=_pos)
    """Model size (total parameters), e.g. ``6.7e9``."""
    mfu: float = field(validator=_pos)
    """Model FLOPs utilisation as a fraction (0.46 = 46 %), as the source reports it."""
    source: str
    model: str = ""
    method: str = "full"
    max_seq_length: int | None = field(default=None, validator=_pos)
    num_gpus: int | None = field(default=None, validator=_pos)
    tokens_per_second_per_gpu: float | None = field(default=None, validator=_pos)
    note: str = ""

    @mfu.validator
    def _fraction(self, att: attrs.Attribute, value: float) -> None:
        if value > 1:
            raise FitplanError(f"MfuRow.mfu is a fraction (0.46 = 46 %), got {value!r}", field="mfu", value=value,
                               suggestion="write percentages as fractions")


@frozen
class ThroughputRow:
    """Measured training throughput, in a named set selected by ``--throughput-source``."""

    id: str = field(validator=_id)
    set: str
    gpu: str
    param_count: float = field(validator=_pos)
    tokens_per_second: float = field(validator=_pos)
    """Tokens per second of the whole run (all ``num_gpus`` together)."""
    source: str
    num_gpus: int = field(default=1, validator=_pos)
    model: str = ""
    note: str = ""


@frozen
class MfuCalibration:
    """An MFU measured on a real GPU (written by ``fitplan validate --calibrate-out``)."""

    gpu: str
    mfu: float = field(validator=_pos)
    source: str = ""
    model: str = ""
    method: str = ""
    date: str = ""

    @mfu.validator
    def _fraction(self, att: attrs.Attribute, value: float) -> None:
        if value > 1:
            raise FitplanError(f"MfuCalibration.mfu is a fraction (0.41 = 41 %), got {value!r}", field="mfu", value=value)


def _fraction_of_peak(inst: Any, att: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not 0 < value <= 1:
        raise FitplanError(f"{type(inst).__name__}.{att.name} is a fraction of a peak in (0, 1], got {value!r}",
                           field=att.name, value=value)


@frozen
class FinetuneRun:
    """A published, measured fine-tuning throughput: the setup it ran (as fitplan scenario fields) and the
    tokens per second per GPU its source reports. ``bench/time_loo.py`` fits the time model's efficiency
    factors on the rows without an ``exclude`` reason and reports the leave-one-out error."""

    id: str
    source: str
    """Where the number is: repository, file and commit, or URL."""
    location: str
    """The table row / line within the source."""
    stack: str
    """What ran it (torchtune, HF Trainer, NeMo, ...), and the settings that matter for speed."""
    tokens_per_second_per_gpu: float = field(validator=_pos)
    scenario: dict[str, Any] = attrs.Factory(dict)
    """The run as flat fitplan scenario fields (``model``, ``method``, ``gpu``, ``num_gpus``, ...)."""
    model: str = ""
    """The model as the source names it."""
    config: dict[str, Any] = attrs.Factory(dict)
    """An HF ``config.json`` for a model outside the catalog (then ``scenario`` names no model)."""
    tokens: str = ""
    """What the source counts as a token (padding or not, prompt tokens or not)."""
    derivation: str = ""
    """The arithmetic from the reported figure to tokens per second per GPU."""
    note: str = ""
    exclude: str = ""
    """Why the row is not used to fit the time model (empty: it is used)."""
    network_gbps: float | None = field(default=None, validator=_nonneg)
    """GB/s between the run's servers, per server, as its source states it (``bench/time_loo.py`` prices the run
    on an instance of ``num_gpus`` GPUs with this network); None: a bundled instance in ``scenario``, or the GPU
    ruleset's ``inter_node_gbps``."""


@frozen
class TimeEfficiency:
    """Achievable fractions of a GPU generation's peaks, fitted from published runs (``bench/time_loo.py``)."""

    generation: str
    gemm: float = field(validator=_fraction_of_peak)
    """GEMM FLOP/s as a fraction of the dense peak."""
    attention: float = field(validator=_fraction_of_peak)
    """Fused attention kernels' FLOP/s as a fraction of the dense peak."""
    memory: float = field(validator=_fraction_of_peak)
    """Memory-bound kernels' bytes/s as a fraction of the HBM bandwidth."""
    source: str = ""
    runs: int = 0
    """Published runs on this generation the fit used."""


@frozen
class TimeModel:
    """The time model's global fitted values and its leave-one-out band (``bench/time_loo.py``)."""

    host_seconds_per_kernel: float = field(validator=_pos)
    """CPU time to launch one kernel in eager PyTorch (Python, dispatcher, autograd, CUDA launch)."""
    band_low: float = field(validator=_pos)
    """The 10th percentile of measured / predicted time over the published runs, each predicted without
    itself (leave-one-out): the modelled time × this is the low end of the likely range."""
    band_high: float = field(validator=_pos)
    loo_median: float = field(validator=_nonneg)
    """Median absolute leave-one-out error of time (0.1 = 10 %)."""
    loo_worst: float
    """The worst leave-one-out error of time, signed (predicted / measured − 1)."""
    runs: int = field(validator=_pos)
    host_seconds_per_zero3_fetch: float = field(default=0.0, validator=_nonneg)
    """Host time of one DeepSpeed ZeRO-3 parameter fetch (per parameter tensor per pass), not overlapped."""
    source: str = ""
    band_percentiles: tuple[float, float] = (10.0, 90.0)
    calibrated_band_low: float = field(default=0.0, validator=_nonneg)
    """After ``fitplan calibrate`` on a run on the same GPU type: the 10th percentile of another published run's
    measured / predicted time (same GPU type, same source) once the model is scaled by the first run's (0: not
    fitted, the band stays)."""
    calibrated_band_high: float = field(default=0.0, validator=_nonneg)
    calibrated_pairs: int = field(default=0, validator=_nonneg)
    """Ordered pairs of published runs on one GPU type behind the calibrated band."""


@frozen
class TimeCalibration:
    """A measured run's step time over the time model's (``fitplan calibrate``): later estimates on this GPU
    (and this model and method, when named) multiply the roofline's step time by ``scale``."""

    gpu: str
    scale: float = field(validator=_pos)
    source: str = ""
    model: str = ""
    method: str = ""
    measured_tokens_per_second_per_gpu: float | None = field(default=None, validator=_pos)
    predicted_tokens_per_second_per_gpu: float | None = field(default=None, validator=_pos)
    """What the time model gave for the measured run, before this calibration."""
    date: str = ""


@frozen
class ModelEntry:
    """A catalog model: the fields of its HF ``config.json``."""

    id: str = field(validator=_id)
    config: dict[str, Any]
    source: str
    aliases: tuple[str, ...] = ()
    hf_id: str = ""


def _valid_condition(inst: Any, att: attrs.Attribute, value: Any) -> None:
    compile_condition(value)


def _valid_message(inst: Any, att: attrs.Attribute, value: str) -> None:
    template_names(value)


def _valid_variant(inst: Any, att: attrs.Attribute, value: dict[str, Any]) -> None:
    from fitplan.inputs.scenario import FIELD_SECTION

    for k, v in value.items():
        if k not in FIELD_SECTION:
            from fitplan.errors import unknown

            e = unknown("scenario field", k, FIELD_SECTION)
            raise FitplanError(e.message, field=f"variant.{k}", value=k, suggestion=e.suggestion)
        if isinstance(v, Mapping) and (set(v) != {"from"} or not isinstance(v["from"], str)):
            raise FitplanError(f"variant.{k} must be a value or {{ from = \"name\" }}, got {v!r:.60}", field=f"variant.{k}",
                               value=v)


@frozen
class AdviceRule:
    """One ``[[advice]]`` entry."""

    id: str = field(validator=_id)
    condition: dict[str, Any] = field(validator=_valid_condition)
    message: str = field(validator=_valid_message)
    checklist: str = ""
    """The seed checklist item the rule implements (the chapter's own words)."""
    variant: dict[str, Any] = field(factory=dict, validator=_valid_variant)
    """Scenario fields to change to compute ``variant_*`` / ``delta_*`` / ``ratio_*`` names."""
    source: str = ""


ACTIONS = ("forbid", "penalise")


def _valid_action(inst: Any, att: attrs.Attribute, value: Any) -> None:
    if value not in ACTIONS:
        from fitplan.errors import did_you_mean

        raise FitplanError(f"{type(inst).__name__}.action must be one of {', '.join(ACTIONS)}, got {value!r}",
                           field="action", value=value,
                           suggestion=did_you_mean(str(value), [*ACTIONS, "penalize"]) or "forbid rejects, penalise ranks lower")


@frozen
class PolicyRule:
    """One ``[[policy]]`` entry."""

    id: str = field(validator=_id)
    description: str
    condition: dict[str, Any] = field(validator=_valid_condition)
    action: str = field(default="forbid", validator=_valid_action)
    penalty: float = field(default=0.0)
    """``penalise`` only: the ranking objective is multiplied by ``1 + penalty``."""
    source: str = ""

    @penalty.validator
    def _penalty(self, att: attrs.Attribute, value: float) -> None:
        _check_number(self, att, value, positive=False)
        if isinstance(value, bool) or value < 0:
            raise FitplanError(f"PolicyRule.penalty must be >= 0, got {value!r}", field="penalty", value=value)
        if self.action == "penalise" and value == 0:
            raise FitplanError("a penalise rule needs penalty > 0 (0.25 = the objective × 1.25)", field="penalty",
                               value=value, suggestion="add penalty = 0.25, or use action = \"forbid\"")


@frozen
class RulesetFile:
    """The top level of one ruleset TOML file."""

    gpu: list[GPU] = attrs.Factory(list)
    provider: list[Provider] = attrs.Factory(list)
    instance: list[Instance] = attrs.Factory(list)
    model: list[ModelEntry] = attrs.Factory(list)
    framework: Framework | None = None
    mfu: list[MfuRow] = attrs.Factory(list)
    throughput: list[ThroughputRow] = attrs.Factory(list)
    mfu_calibration: list[MfuCalibration] = attrs.Factory(list)
    finetune_run: list[FinetuneRun] = attrs.Factory(list)
    time_efficiency: list[TimeEfficiency] = attrs.Factory(list)
    time_model: TimeModel | None = None
    time_calibration: list[TimeCalibration] = attrs.Factory(list)
    policy: list[PolicyRule] = attrs.Factory(list)
    """Organisation policies (docs/policies.md)."""
    advice: list[AdviceRule] = attrs.Factory(list)
    """Advice rules: the seed's optimisation checklist (``rulesets/advice/checklist.toml``)."""


