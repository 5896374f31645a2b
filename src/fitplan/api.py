"""The public plugin API: every type and helper a plugin (``plugins/``, or a third-party package) imports from
fitplan, in one module, versioned by :data:`PLUGIN_API` (docs/hooks.md, "The plugin API").

A plugin imports ``from fitplan.api import ...`` and nothing else of fitplan (``tests/test_layout.py`` checks
``plugins/``): the modules behind these names may move, these names do not, except as the deprecation policy in
docs/hooks.md says. The declarations a plugin registers at load time (``hookimpl``, ``quantity``, ``Name``,
``OptimizerSpec``, ``OutputFormat``, ...) are imported with this module; the helpers behind them (the estimate,
the architecture files, the writer) are imported on first use (PEP 562 ``__getattr__``), so that importing the
API costs a plugin's load no more than importing ``fitplan`` does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fitplan import estimate, scenario_from_dict
from fitplan.engine.declarations import Name, Quantity, Reducer, quantity, reducer
from fitplan.errors import FitplanError, PluginError, did_you_mean
from fitplan.inputs.optimizer import OptimizerContext, OptimizerSpec
from fitplan.inputs.scenario import Scenario
from fitplan.inputs.settings import Search, Setting
from fitplan.output.formats import OutputFormat, RenderOptions, ReportSection
from fitplan.pluginmgr.hookspecs import hookimpl

PLUGIN_API = (1, 2)
"""(major, minor): the minor grows when a name is added; the major when a name is removed or changes its
signature or meaning, after a minor release that warned about it (docs/hooks.md)."""

LAZY: dict[str, str] = {
    # an estimate
    "Estimate": "fitplan.estimation:Estimate",
    "evaluate": "fitplan.estimation:evaluate",
    "hf_config_for": "fitplan.estimation:hf_config_for",
    "deepspeed_config": "fitplan.output.exports:deepspeed_config",
    # the precision presets (the referee builds the same dtypes)
    "PRESETS": "fitplan.inputs.precision:PRESETS",
    "HF_WORD": "fitplan.inputs.precision:HF_WORD",
    # the architecture files and the trace (fitplan-torch's learner writes and verifies them)
    "compile_expr": "fitplan.arch.archexpr:compile_expr",
    "load_arch_file": "fitplan.arch.archfile:load",
    "decoder_config": "fitplan.arch.architecture:decoder_config",
    "arch_dirs": "fitplan.arch.archfile:user_dirs",
    "autograd_table": "fitplan.arch.archfile:autograd_table",
    "peft_target_modules": "fitplan.trace.lora_targets:peft_target_modules",
    "archformat": "fitplan.arch.archformat",  # the files' format 2 codec (the learner writes, reformat converts)
    # files
    "read_json": "fitplan.inputs.files:read_json",
    "write_all": "fitplan.files:write_all",
    "make_private": "fitplan.diskcache:make_private",
}
"""Names imported on first use: name -> ``module:attribute`` (or ``module``: the module itself)."""

DEPRECATED: dict[str, tuple[str, str]] = {}
"""Names on their way out: name -> (``module:attribute``, what to use instead). Still served, with a
``DeprecationWarning``, until the next major :data:`PLUGIN_API`."""

__all__ = [
    "PLUGIN_API", "FitplanError", "Name", "OptimizerContext", "OptimizerSpec", "OutputFormat", "PluginError",
    "Quantity", "Reducer", "RenderOptions", "ReportSection", "Scenario", "Search", "Setting", "clear_arch_caches", "did_you_mean",
    "estimate", "hookimpl", "quantity", "reducer", "scenario_from_dict", *LAZY,
]


def clear_arch_caches() -> None:
    """Forget the architecture files read so far, the parameter groups computed from them and the traces built
    in this process: after a plugin changes what ``FITPLAN_ARCH_DIR`` points at (a file being learned). The ruleset
    files parsed so far are read again too: their model presets were checked against the files then in force."""
    from fitplan.arch import archfile, architecture
    from fitplan.rulesets import loader
    from fitplan.trace import step_trace

    loader._PARSED.clear()
    archfile.load.cache_clear()
    architecture.clear_caches()
    step_trace.build.cache_clear()


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr) if attr else importlib.import_module(module)


def __getattr__(name: str) -> Any:
    if name in LAZY:
        value = _resolve(LAZY[name])
        globals()[name] = value
        return value
    if name in DEPRECATED:
        import warnings

        target, instead = DEPRECATED[name]
        warnings.warn(f"fitplan.api.{name} is deprecated (PLUGIN_API {PLUGIN_API[0]}.x): {instead}",
                      DeprecationWarning, stacklevel=2)
        return _resolve(target)
    raise AttributeError(f"module 'fitplan.api' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers: the LAZY names, served by __getattr__ (hence unused here)
    from fitplan.arch import archformat  # noqa: F401
    from fitplan.arch.archexpr import compile_expr  # noqa: F401
    from fitplan.arch.archfile import autograd_table  # noqa: F401
    from fitplan.arch.archfile import load as load_arch_file  # noqa: F401
    from fitplan.arch.archfile import user_dirs as arch_dirs  # noqa: F401
    from fitplan.arch.architecture import decoder_config  # noqa: F401
    from fitplan.diskcache import make_private  # noqa: F401
    from fitplan.estimation import Estimate, evaluate, hf_config_for  # noqa: F401
    from fitplan.files import write_all  # noqa: F401
    from fitplan.inputs.files import read_json  # noqa: F401
    from fitplan.inputs.precision import HF_WORD, PRESETS  # noqa: F401
    from fitplan.output.exports import deepspeed_config  # noqa: F401
    from fitplan.trace.lora_targets import peft_target_modules  # noqa: F401
