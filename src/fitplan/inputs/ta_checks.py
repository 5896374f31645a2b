"""What ``TrainingArguments.__post_init__`` refuses in a TrainingArguments JSON, refused here with its reason.

transformers 5.24 (``training_args.py``): the strategies are enums (``IntervalStrategy`` / ``SaveStrategy``:
``trainer_utils.py:389-399``, converted at :1558-1560, a ``ValueError`` for any other value), and
``_validate_args`` (:1723-1805) refuses contradictions: fp16 and bf16 both true, also for full evaluation;
a step interval above 1 that is no integer; a strategy of ``steps`` with no steps; ``load_best_model_at_end``
with strategies that differ; a plateau or greedy scheduler without evaluation; a negative ``warmup_steps``; a
``torch_empty_cache_steps`` that is no positive integer; a ``dataloader_prefetch_factor`` without workers.
A file the library would refuse is no run fitplan can estimate (docs/reliability.md, "Rules").
"""

from __future__ import annotations

from typing import Any

from fitplan.errors import FitplanError

STRATEGIES = {"eval_strategy": ("no", "steps", "epoch"), "logging_strategy": ("no", "steps", "epoch"),
              "save_strategy": ("no", "steps", "epoch", "best")}
"""Each strategy field's enum values, and TrainingArguments' defaults below."""
DEFAULTS = {"eval_strategy": "no", "logging_strategy": "steps", "save_strategy": "steps", "logging_steps": 500,
            "eval_steps": None, "save_steps": 500, "dataloader_num_workers": 0, "warmup_steps": 0}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check(data: dict[str, Any], path: str) -> None:
    """Refuse what ``TrainingArguments(**data)`` refuses (module doc), naming the file and key.

    :raises FitplanError: the library's reason, with the line of ``training_args.py`` it comes from."""
    def get(key: str) -> Any:
        return data.get(key, DEFAULTS.get(key))

    def bad(key: str, message: str, suggestion: str | None = None) -> FitplanError:
        return FitplanError(f"{message} (TrainingArguments refuses it: transformers/training_args.py)", file=path,
                            field=f"$.{key}", value=data.get(key), suggestion=suggestion)

    for key, allowed in STRATEGIES.items():
        if get(key) not in allowed:
            raise bad(key, f"{get(key)!r} is not a valid {'SaveStrategy' if key == 'save_strategy' else 'IntervalStrategy'}",
                      "one of " + ", ".join(allowed))
    if data.get("fp16_full_eval") is True and data.get("bf16_full_eval") is True:
        raise bad("fp16_full_eval", "At most one of fp16 and bf16 can be True for full eval, but not both")
    for key in ("logging_steps", "eval_steps", "save_steps", "warmup_steps", "torch_empty_cache_steps",
                "dataloader_num_workers"):
        v = data.get(key)
        if v is not None and not _number(v):
            raise bad(key, f"{key} must be a number, got {v!r}")
    if get("logging_strategy") == "steps" and get("logging_steps") == 0:
        raise bad("logging_steps", "logging strategy steps requires non-zero --logging_steps")
    if get("eval_strategy") == "steps" and not get("eval_steps") and not get("logging_steps"):
        raise bad("eval_steps", "evaluation strategy steps requires either non-zero --eval_steps or --logging_steps")
    for key, strategy in (("logging_steps", "logging_strategy"), ("eval_steps", "eval_strategy"),
                          ("save_steps", "save_strategy")):
        v = get(key)
        if get(strategy) == "steps" and v is not None and v > 1 and v != int(v):
            raise bad(key, f"--{key} must be an integer if bigger than 1: {v}")
    if data.get("load_best_model_at_end") is True and get("save_strategy") != "best" \
            and get("eval_strategy") != get("save_strategy"):
        raise bad("load_best_model_at_end", "--load_best_model_at_end requires the save and eval strategy to match, "
                  f"except when --save_strategy=\"best\" (eval {get('eval_strategy')}, save {get('save_strategy')})")
    if data.get("lr_scheduler_type") in ("reduce_lr_on_plateau", "greedy") and get("eval_strategy") == "no":
        raise bad("lr_scheduler_type", f"lr_scheduler_type {data['lr_scheduler_type']} requires an eval strategy")
    if get("warmup_steps") < 0:
        raise bad("warmup_steps", f"Got warmup_steps = {get('warmup_steps')}, Expected value warmup_steps >= 0")
    v = data.get("torch_empty_cache_steps")
    if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        raise bad("torch_empty_cache_steps", f"`torch_empty_cache_steps` must be an integer bigger than 0, got {v}.")
    if get("dataloader_num_workers") == 0 and data.get("dataloader_prefetch_factor") is not None:
        raise bad("dataloader_prefetch_factor", "--dataloader_prefetch_factor can only be set when data is loaded in a "
                  "different process, i.e. when --dataloader_num_workers > 0.")
