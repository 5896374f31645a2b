"""The ``fitplan`` command line (click + rich).

The group holds no command of its own: every command, the built-in ones included, comes from a plugin's
``fitplan_register_commands`` (the built-ins from ``fitplan.builtin.commands``; their code is in
:mod:`fitplan.cli.commands`). Exit statuses (docs/reliability.md): 0 success; 2 bad input (a
:class:`~fitplan.errors.FitplanError`, printed without a traceback, naming the file, field and value); 70 an
internal error (a bug in fitplan or a plugin: one line, the traceback only with ``FITPLAN_DEBUG=1``); 1 an
operating-system failure (a full disk, an unwritable standard output); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import sys

import click

from fitplan import __version__
from fitplan.app.commands import Group
from fitplan.errors import FitplanError


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="fitplan")
def cli() -> None:
    """Will a fine-tuning run fit, how long will it take, and what will it cost?"""


def load_commands(group: click.Group = cli) -> None:
    """Add every plugin's commands (the built-in ones included) to ``group``, once."""
    if group.commands or getattr(group, "deferred", None):
        return
    from fitplan.pluginmgr.registry import default_registry

    default_registry().register_commands(group)


INTERNAL_ERROR = 70
"""Exit status of an unexpected exception (``EX_SOFTWARE``): not the user's input, a bug."""
ENVIRONMENT_ERROR = 1
"""Exit status of an operating-system failure that is neither the input nor a bug (a full disk, an unwritable
standard output)."""
INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), wherever it arrives."""


def _detach_stdout() -> None:
    """Point standard output at /dev/null, so that flushing it again at exit does not fail a second time
    (the Python documentation's advice for SIGPIPE)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> None:
    from fitplan.output.console import console, escape

    try:
        load_commands()
        cli.main(args=argv, prog_name="fitplan", standalone_mode=False)
    except FitplanError as e:
        console(err=True).print(f"[bold red]error:[/] {escape(e.render())}", markup=True, highlight=False)
        sys.exit(e.exit_code)
    except click.exceptions.Abort as e:
        if isinstance(e.__context__, KeyboardInterrupt):  # click turns Ctrl-C inside a command into Abort
            click.echo("interrupted", err=True)
            sys.exit(INTERRUPTED)
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except BrokenPipeError:
        _detach_stdout()
        sys.exit(0)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(INTERRUPTED)
    except OSError as e:  # the environment, not the input: a full disk, stdout on /dev/full, a lost mount
        where = f"{e.filename}: " if e.filename else ""
        _detach_stdout()
        console(err=True).print(f"[bold red]error:[/] {escape(where)}{escape(e.strerror or str(e))}",
                                markup=True, highlight=False)
        sys.exit(ENVIRONMENT_ERROR)
    except Exception as e:  # noqa: BLE001 - a bug: one line, not a traceback
        import os

        if os.environ.get("FITPLAN_DEBUG"):
            raise
        console(err=True).print(f"[bold red]internal error:[/] {escape(type(e).__name__)}: {escape(e)} "
                                "(a bug in fitplan or a plugin; FITPLAN_DEBUG=1 shows the traceback)",
                                markup=True, highlight=False)
        sys.exit(INTERNAL_ERROR)
