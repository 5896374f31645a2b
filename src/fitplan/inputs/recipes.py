"""Reading the fine-tuning recipes users copy: a torchtune recipe config, an axolotl config or a LLaMA-Factory
config (YAML), given as ``fitplan estimate RECIPE.yaml`` (the scenario file's channel: a ``.yaml`` / ``.yml``
path is a recipe, anything else a scenario TOML).

Which framework wrote the file is told by its keys (:func:`framework`): torchtune configs instantiate
components (``model: {_component_: torchtune.models...}``), axolotl's name the ``base_model``, LLaMA-Factory's
the ``model_name_or_path`` with a ``stage`` or ``finetuning_type``. Each framework's reader
(:mod:`.recipe_torchtune`, :mod:`.recipe_axolotl`, :mod:`.recipe_llamafactory`) turns the keys into flat
scenario fields through a :class:`~.recipe_reader.Recipe`, which keeps the rule every reader follows (its
module doc).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fitplan.errors import FitplanError

SUFFIXES = (".yaml", ".yml")
FRAMEWORKS = ("torchtune", "axolotl", "llamafactory")


def is_recipe(path: str | Path) -> bool:
    """Whether the scenario file ``path`` is a recipe (a YAML file) rather than a scenario TOML."""
    return Path(path).suffix.lower() in SUFFIXES


def read_recipe(path: str | Path) -> dict[str, Any]:
    """The recipe as ``yaml.safe_load`` reads it (what the three frameworks use); a syntax error names its line."""
    from fitplan.inputs.files import loads_yaml, read_text

    data = loads_yaml(read_text(path, field="SCENARIO_FILE"), file=str(path), field="SCENARIO_FILE")
    if not isinstance(data, dict):
        raise FitplanError("a recipe must be a mapping of keys", file=str(path), field="$", value=type(data).__name__,
                           suggestion="a torchtune, axolotl or LLaMA-Factory YAML config")
    return data


def framework(data: dict[str, Any], path: str) -> str:
    """Which framework's config ``data`` is, from its keys (module doc)."""
    model = data.get("model")
    if isinstance(model, dict) and "_component_" in model:
        return "torchtune"
    if "base_model" in data:
        return "axolotl"
    if "model_name_or_path" in data and ("stage" in data or "finetuning_type" in data):
        return "llamafactory"
    raise FitplanError("not a recipe fitplan reads: no torchtune model._component_, no axolotl base_model, no "
                       "LLaMA-Factory model_name_or_path with stage / finetuning_type", file=path, field="$",
                       suggestion="a scenario file is TOML (.toml); recipes are torchtune, axolotl or LLaMA-Factory YAML")


def recipe_fields(path: str | Path, *, known_optimizers: Any = None,
                  checks: list[Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Flat scenario fields of the recipe at ``path``, and the warnings (what was assumed, ignored or unknown)."""
    data = read_recipe(path)
    name = framework(data, str(path))
    from fitplan.inputs.recipe_reader import Recipe

    recipe = Recipe(data, str(path), name, known_optimizers, checks)
    if name == "torchtune":
        from fitplan.inputs.recipe_torchtune import read
    elif name == "axolotl":
        from fitplan.inputs.recipe_axolotl import read
    else:
        from fitplan.inputs.recipe_llamafactory import read
    read(recipe)
    recipe.finish()
    return recipe.fields, recipe.warnings
