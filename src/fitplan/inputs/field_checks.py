"""The checks a scenario field runs when it is set (attrs validators): numbers within what makes physical sense,
printable text of bounded length, one of a field's choices, HF ``optim_args`` and DeepSpeed size keys as their
libraries parse them. Each refusal is a :class:`~fitplan.errors.FitplanError` naming the section, field and value."""

from __future__ import annotations

import math
import unicodedata

from typing import Any

import attrs

from fitplan.errors import FitplanError


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


def number_error(inst: Any, att: attrs.Attribute, value: Any, what: str) -> FitplanError:
    return FitplanError(f"{type(inst).__name__}.{att.name} must be {what}, got {value!r:.60}", field=att.name, value=value)


def positive(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A finite number > 0 and at most its :data:`LIMITS` (None: not given)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (float("inf"), -float("inf")):
        raise number_error(inst, att, value, "a finite number")
    if not value > 0:
        raise number_error(inst, att, value, "> 0")
    if value < MINIMA.get(att.name, 0):
        raise number_error(inst, att, value, f"at least {MINIMA[att.name]:g}")
    limit = LIMITS.get(att.name)
    if limit is not None and value > limit:
        raise number_error(inst, att, value, f"at most {limit:,g}")


def at_least_one(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """An integer >= 1 and at most its :data:`LIMITS`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise number_error(inst, att, value, "an integer >= 1")
    limit = LIMITS.get(att.name)
    if limit is not None and value > limit:
        raise number_error(inst, att, value, f"at most {limit:,g}")


def probability(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A dropout probability: a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise number_error(inst, att, value, "a probability in [0, 1)")


def printable(text: str) -> bool:
    """No control or format character (terminal escapes, bidirectional overrides, line separators); spaces of
    any kind are fine (U+00A0 and U+202F are common in macOS file names, which ``str.isprintable`` refuses)."""
    return text.isprintable() or all(c.isprintable() or unicodedata.category(c) == "Zs" for c in text)


def bounded_text(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A text of at most :data:`TEXT_LIMITS` characters, with no control character (None: not given)."""
    if value is None:
        return
    limit = TEXT_LIMITS.get(att.name, TEXT_LIMIT)
    if not isinstance(value, str) or len(value) > limit or not printable(value):
        what = f"a text of at most {limit:,} printable characters"
        raise FitplanError(f"{type(inst).__name__}.{att.name} must be {what}, got {value!r:.60}"
                           + (f" ({len(value):,} characters)" if isinstance(value, str) and len(value) > limit else ""),
                           field=att.name, value=value[:60] if isinstance(value, str) else value)


def module_names(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """LoRA target modules: 1 to 256 names of at most 256 printable characters."""
    if not isinstance(value, tuple) or not 1 <= len(value) <= 256 or not all(
            isinstance(v, str) and 0 < len(v) <= 256 and printable(v) for v in value):
        raise number_error(inst, att, value, "1 to 256 module names (or all-linear)")


def one_of(choices: tuple[str, ...]):
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


def optim_args(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """HF ``optim_args`` as the Trainer parses it (``key=value`` pairs split on ``,``, each with exactly one ``=``:
    ``trainer_optimizer._parse_optim_args``), each key fitplan reads within :data:`OPTIM_ARG_BOUNDS`."""
    bounded_text(inst, att, value)
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


MAX_ELEMENTS = 1e15
"""The largest DeepSpeed size key in elements: the largest parameter count fitplan takes (10^15)."""


def ds_value(inst: Any, att: attrs.Attribute, value: Any) -> None:
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


def fraction(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A share of the GPU's memory: a number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise number_error(inst, att, value, "a fraction in (0, 1]")


def non_negative(inst: Any, att: attrs.Attribute, value: Any) -> None:
    """A finite number >= 0 and at most its :data:`LIMITS` (None: not given)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise number_error(inst, att, value, "a finite number >= 0")
    if value > LIMITS.get(att.name, math.inf):
        raise number_error(inst, att, value, f"at most {LIMITS[att.name]:,g}")


def optional_count(inst: Any, att: attrs.Attribute, value: Any) -> None:
    if value is not None:
        at_least_one(inst, att, value)
