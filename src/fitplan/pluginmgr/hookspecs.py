"""Every fitplan hook, in one module.

Plugins implement these with ``@fitplan.hookimpl``. Built-in contributors and reducers
(``fitplan.builtin.*``) are registered exactly like third-party plugins, which are found
through the ``fitplan`` entry-point group. Implementations may accept fewer arguments than
the spec (so specs can grow); never give an implementation argument a default value.

Hooks that declare things receive a ``register`` callback rather than returning lists, so
the core knows which plugin declared what and can name both sides of a conflict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    import click

    from fitplan.engine.declarations import Name, Quantity, Reducer
    from fitplan.estimation import Estimate
    from fitplan.inputs.optimizer import OptimizerSpec
    from fitplan.inputs.scenario import Scenario
    from fitplan.inputs.settings import Setting
    from fitplan.output.formats import OutputFormat, ReportSection

hookspec = pluggy.HookspecMarker("fitplan")
hookimpl = pluggy.HookimplMarker("fitplan")


# --------------------------------------------------------------------------- the quantity graph


@hookspec
def fitplan_register_quantities(register: Callable[[Quantity], None]) -> None:
    """Declare quantities: memory contributors and every other named number.

    Call ``register(Quantity(...))`` (or use :func:`fitplan.quantity` to build one from a
    function whose parameter names are its dependencies). A name already declared by another
    plugin is an error naming both plugins.

    :param register: the callback that adds one :class:`fitplan.Quantity` to the graph.
    """


@hookspec
def fitplan_register_reducers(register: Callable[[Reducer], None]) -> None:
    """Declare reducers: transforms applied to a quantity when their condition holds.

    Reducers on one target form an ordered chain (``after`` / ``before`` name other
    reducers on the same target). A reducer whose target no plugin declares is an error.

    :param register: the callback that adds one :class:`fitplan.Reducer`.
    """


@hookspec
def fitplan_register_optimizers(register: Callable[[OptimizerSpec], None]) -> None:
    """Declare optimizers (what ``--optim NAME`` accepts).

    This is the hook a third-party optimizer plugin implements: an :class:`fitplan.OptimizerSpec`
    gives the state bytes (a function of the trainable parameter tensors and the state dtype),
    the step temporaries, and the optimizer FLOPs per parameter.

    :param register: the callback that adds one :class:`fitplan.OptimizerSpec`.
    """


@hookspec
def fitplan_register_names(register: Callable[[Name], None]) -> None:
    """Declare names that policy and advice conditions (and reports) may use besides quantities and inputs:
    values derived from an evaluated estimate, such as ``train_hours`` or ``gpus_paid``.

    :param register: the callback that adds one :class:`fitplan.Name`. A name already declared (by a
        quantity, an input or another plugin) is an error naming both plugins.
    """


# --------------------------------------------------------------------------- the scenario


@hookspec
def fitplan_register_settings(register: Callable[[Setting], None]) -> None:
    """Declare scenario fields (settings): each one, in one :class:`fitplan.api.Setting`, is a field of its
    scenario section with its type, default and bounds, a CLI flag and a field of the page's form with its help,
    a search dimension of ``fitplan recommend`` when it says how (``search``), a key of the scenario TOML export,
    and an input of the quantities that name it.

    :param register: the callback that adds one :class:`fitplan.api.Setting`. A name that is already a scenario
        field, or that another plugin declared, is an error naming the plugin(s).
    """


# --------------------------------------------------------------------------- rulesets


@hookspec
def fitplan_ruleset_dirs() -> list[str] | None:
    """Directories of TOML rulesets that this plugin ships (an organisation's prices and policies).

    They are loaded after the bundled rulesets and before any ``--ruleset-dir``.

    :returns: a list of directory paths (``str`` or ``pathlib.Path``).
    """


# --------------------------------------------------------------------------- the command line


@hookspec
def fitplan_register_commands(cli: click.Group) -> None:
    """Add sub-commands to the ``fitplan`` command line (the built-in commands are added the same way).

    :param cli: a :class:`click.Group` for this plugin; call ``cli.add_command(...)`` or use it as a decorator.
        Its commands join the ``fitplan`` group; a command name that another plugin already added is an
        error naming both plugins.
    """


# --------------------------------------------------------------------------- output


@hookspec
def fitplan_register_formats(register: Callable[[OutputFormat], None]) -> None:
    """Declare output formats (what ``--format NAME`` accepts for each kind of report).

    :param register: the callback that adds one :class:`fitplan.output.formats.OutputFormat` (a name, a file
        extension, the report kinds it renders and a pure ``render(kind, report, options) -> str``). A
        format name already declared for a report kind is an error naming both plugins.
    """


@hookspec
def fitplan_register_report_sections(register: Callable[[ReportSection], None]) -> None:
    """Declare sections of the estimate report: a JSON object and summary lines computed from an estimate.

    :param register: the callback that adds one :class:`fitplan.output.formats.ReportSection`.
    """


# --------------------------------------------------------------------------- validation


@hookspec(firstresult=True)
def fitplan_validate(scenario: Scenario, estimate: Estimate, options: dict[str, Any]) -> dict[str, Any] | None:
    """Run ``scenario`` for real and compare the measurement with ``estimate``.

    Implemented by the torch validation plugin (``fitplan-torch``). Stops at the first non-None result.

    :param scenario: the scenario to run.
    :param estimate: fitplan's estimate for it.
    :param options: ``mode`` (``auto``, ``cpu``, ``fake``, ``cuda``), ``steps``, ``calibrate_out`` and other run options.
    :returns: a JSON-ready report with a ``components`` mapping of ``predicted``, ``measured`` and ``relative_error``.
    """
