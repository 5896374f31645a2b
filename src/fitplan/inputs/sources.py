"""Where a scenario comes from: mappings, a scenario TOML file, HF TrainingArguments and DeepSpeed JSON,
and command-line flags, merged in that order (flags win); and back again, the flags that rebuild one.

Flag names follow the scenario's field names (``--per-device-train-batch-size`` sets
``per_device_train_batch_size``) except those in :data:`FLAG_NAMES`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from fitplan.errors import FitplanError
from fitplan.inputs import scenario as sc

FLAG_NAMES = {"zero_stage": "--zero", "dataset_path": "--dataset", "dataset_text_field": "--text-field",
              "chat_template_path": "--chat-template", "dataset_split": "--split", "dataset_sample": "--sample"}
"""Flags whose name differs from their field (``--zero`` sets ``zero_stage``)."""


def flag_for(field: str) -> str:
    """The command-line flag that sets scenario field ``field``."""
    return FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def scenario_from_dict(data: dict[str, Any], *, file: str | None = None) -> sc.Scenario:
    """Nested (``{"training": {...}}``) or flat (``{"optim": ...}``) mappings, or a mix of both."""
    nested: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key in sc.SECTIONS and isinstance(value, dict):
            nested.setdefault(key, {}).update(value)
        elif key in sc.FIELD_SECTION:
            nested.setdefault(sc.FIELD_SECTION[key], {})[key] = value
        else:
            from fitplan.errors import did_you_mean

            hint = did_you_mean(key, [*sc.SECTIONS, *sc.FIELD_SECTION]) or "sections: " + ", ".join(sc.SECTIONS)
            raise FitplanError(f"unknown key {key!r}", file=file, field=f"$.{key}", value=key, suggestion=hint)
    return sc.from_nested(nested, file=file)


def load_scenario_file(path: str | Path) -> dict[str, Any]:
    """Read a scenario TOML file into a nested dict (validated later, together with flags)."""
    from fitplan.inputs.files import read_toml

    return read_toml(path, field="SCENARIO_FILE")


def merge(base: dict[str, Any], flat_overrides: dict[str, Any]) -> dict[str, Any]:
    """Overlay flat field overrides on a (nested or flat) scenario mapping."""
    out: dict[str, Any] = {}
    for key, value in base.items():
        if key in sc.SECTIONS and isinstance(value, dict):
            out.setdefault(key, {}).update(value)
        else:
            out.setdefault(sc.FIELD_SECTION.get(key, key), {})
            if key in sc.FIELD_SECTION:
                out[sc.FIELD_SECTION[key]][key] = value
            else:
                out[key] = value
    for key, value in flat_overrides.items():
        section = sc.FIELD_SECTION.get(key)
        if section is None:
            from fitplan.errors import unknown

            raise unknown("scenario field", key, sc.FIELD_SECTION)
        out.setdefault(section, {})
        if not isinstance(out[section], dict):
            out[section] = {}
        if key != section and not isinstance(out.get(key, {}), dict):
            out.pop(key, None)
        out[section][key] = value
    return out


@attrs.frozen
class FromOptions:
    """A scenario built from command-line options (:func:`from_options`).

    :ivar fixed: the flat names of the fields the user set (in the scenario file, an imported JSON or a
        flag): ``fitplan recommend`` searches only the others.
    :ivar warnings: what the importers had to assume or ignore.
    """

    scenario: sc.Scenario
    ruleset_dirs: tuple[str, ...]
    fixed: frozenset[str]
    warnings: tuple[str, ...]


def from_options(options: dict[str, Any], *, known_optimizers: Any = None) -> FromOptions:
    """Scenario file (or recipe YAML), then ``--recipe``, then accelerate config YAML, then TrainingArguments JSON,
    then DeepSpeed JSON, then flags (flags win). ``options`` holds the CLI's scenario options by field name (None:
    not given) plus ``scenario_file``, ``recipe``, ``ruleset_dirs``, ``accelerate_config``, ``deepspeed`` and
    ``training_args``; it is not changed."""
    from fitplan.inputs.importers import deepspeed_fields, training_args_fields

    scenario_file = options.get("scenario_file")
    bf16, fp16 = options.get("bf16") or False, options.get("fp16") or False
    flags = {k: v for k, v in options.items() if v is not None and k in sc.FIELD_SECTION}
    if bf16 and fp16:
        raise FitplanError("--bf16 and --fp16 are mutually exclusive (TrainingArguments refuses both)",
                           field="--bf16/--fp16")
    overrides: dict[str, Any] = {}
    warnings: list[str] = []
    checks: list[Any] = []
    base = _scenario_base(scenario_file, known_optimizers, warnings, checks)
    if options.get("recipe") is not None:
        from fitplan.inputs.recipes import recipe_fields

        fields, recipe_warnings = recipe_fields(_path(options["recipe"], "--recipe"), known_optimizers=known_optimizers,
                                                checks=checks)
        overrides.update(fields)
        warnings += recipe_warnings
    if options.get("accelerate_config") is not None:
        from fitplan.inputs.accelerate_config import accelerate_fields

        overrides.update(accelerate_fields(_path(options["accelerate_config"], "--accelerate-config"), warnings, checks))
    if options.get("training_args") is not None:
        fields, ta_warnings = training_args_fields(_path(options["training_args"], "--training-args"),
                                                   known_optimizers=known_optimizers, checks=checks)
        overrides.update(fields)
        warnings += ta_warnings
    if options.get("deepspeed") is not None:
        stated = bf16 or fp16 or options.get("training_args")
        ta_bf16 = bf16 or bool(overrides.get("bf16"))
        ta_fp16 = fp16 or bool(overrides.get("fp16"))
        overrides.update(deepspeed_fields(_path(options["deepspeed"], "--deepspeed"), bf16=ta_bf16 if stated else None,
                                          fp16=ta_fp16 if stated else None, warnings=warnings, checks=checks))
    overrides.update(flags)
    fixed = set(overrides)
    for key, value in base.items():
        fixed |= set(value) if key in sc.SECTIONS and isinstance(value, dict) else {key}
    s = scenario_from_dict(merge(base, overrides), file=scenario_file)
    for check in checks:  # what needs the final scenario (DeepSpeed's train_batch_size assertion)
        check(s)
    return FromOptions(s, tuple(options.get("ruleset_dirs") or ()), frozenset(fixed), tuple(warnings))


def _scenario_base(path: str | None, known_optimizers: Any, warnings: list[str], checks: list[Any]) -> dict[str, Any]:
    """The scenario file: a TOML scenario, or a recipe YAML (torchtune, axolotl, LLaMA-Factory:
    :mod:`fitplan.inputs.recipes`) read into flat fields."""
    if not path:
        return {}
    from fitplan.inputs.recipes import is_recipe, recipe_fields

    if not is_recipe(path):
        return load_scenario_file(path)
    fields, recipe_warnings = recipe_fields(path, known_optimizers=known_optimizers, checks=checks)
    warnings += recipe_warnings
    return fields


def flags_given(options: dict[str, Any]) -> set[str]:
    return {k for k, v in options.items() if v is not None and k in sc.FIELD_SECTION}


def _path(text: str, flag: str) -> str:
    if not str(text).strip():
        raise FitplanError(f"{flag} needs a path to a file, got an empty one", field=flag, value=text)
    return text


def scenario_args(s: sc.Scenario) -> list[str]:
    """Command-line flags that rebuild ``s`` (every field that differs from its default)."""
    default = sc.flatten(sc.Scenario())
    args: list[str] = []
    for name, value in sc.flatten(s).items():
        if value == default[name]:
            continue
        flag = flag_for(name)
        if isinstance(value, bool):
            args.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, tuple):
            args += [flag, ",".join(value)]
        elif isinstance(value, float) and value.is_integer():
            args += [flag, str(int(value)) if name != "num_train_epochs" else repr(value)]
        else:
            args += [flag, str(value)]
    return args


