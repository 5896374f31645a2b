"""Query parameters → the command line's options, for ``fitplan serve``'s API.

A query names the CLI's long flags without their dashes (``?model=llama-2-7b&per-device-train-batch-size=4
&gradient-checkpointing=true``). They are turned into the argument list of the CLI command itself
(``--per-device-train-batch-size=4 --gradient-checkpointing``) and parsed by that command's click parser, so
that types, checks and error messages are the CLI's. Only the scenario's flags (plus ``--bf16`` / ``--fp16``)
and each endpoint's own extras are accepted: no query parameter reaches an option that reads a file
(``--deepspeed``, ``--training-args``, ``--ruleset-dir``, ``--policy``, a scenario file), and no text value
may name a local path (:func:`check_not_a_path`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import click

from fitplan.errors import FitplanError
from fitplan.inputs import scenario as sc
from fitplan.inputs.settings import LiveTable
from fitplan.inputs.sources import flag_for

SCENARIO_PARAMS: Mapping[str, str] = LiveTable(lambda: {flag_for(f)[2:]: f for f in sc.FIELD_SECTION})
"""Query name -> scenario field (``per-device-train-batch-size`` -> ``per_device_train_batch_size``), plugin
settings included."""
PRECISION_FLAGS = ("bf16", "fp16")
UPLOAD_PREFIX = "upload:"
"""``model=upload:<id>`` names a config.json uploaded to ``POST /api/upload``."""
MAX_PARAMS = 64
MAX_VALUE_CHARS = 512
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def check_not_a_path(name: str, value: str) -> None:
    """Refuse a value that names a local file or directory: anything path-like (a separator, a leading ``.``,
    ``/`` or ``~``, ``..``, a ``.json`` suffix) or that exists relative to the server's working directory.
    ``model`` may be a Hub id (``ORG/NAME[@revision]``) or ``upload:<id>``.

    :raises FitplanError: naming the parameter and the value.
    """
    from fitplan.inputs.hub import is_repo_id

    if name == "model" and value.startswith(UPLOAD_PREFIX):
        return
    hub_id = name == "model" and is_repo_id(value)
    path_like = ("\\" in value or "\x00" in value or value.startswith(("/", ".", "~")) or ".." in value
                 or value.lower().endswith(".json") or ("/" in value and not hub_id))
    if path_like or os.path.lexists(value.partition("@")[0] if hub_id else value):
        hint = ("drop the config.json on the page (POST /api/upload) or give a catalog name or a Hub id"
                if name == "model" else "give a name, not a path")
        raise FitplanError("the server reads no local file named in a query", field=name, value=value,
                           suggestion=hint)


def _options(command: click.Command) -> dict[str, click.Option]:
    return {o[2:]: p for p in command.params if isinstance(p, click.Option) for o in p.opts if o.startswith("--")}


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in TRUE or v in FALSE:
        return v in TRUE
    raise FitplanError(f"Invalid value for '--{name}': {value!r} is not a valid boolean", field=name, value=value,
                       suggestion="true or false")


def _pairs(items: Iterable[tuple[str, str]], allowed: Sequence[str]) -> dict[str, str]:
    seen: dict[str, str] = {}
    for n, (key, value) in enumerate(items):
        if n >= MAX_PARAMS:
            raise FitplanError(f"more than {MAX_PARAMS} query parameters", field="query")
        if key not in allowed:
            from fitplan.errors import unknown

            raise unknown("query parameter", key, allowed, field=key)
        if key in seen:
            raise FitplanError(f"query parameter {key!r} given twice", field=key, value=value)
        if len(value) > MAX_VALUE_CHARS:
            raise FitplanError(f"query parameter {key!r} longer than {MAX_VALUE_CHARS} characters", field=key)
        seen[key] = value
    return seen


def parse(command: click.Command, items: Iterable[tuple[str, str]], *, extras: Sequence[str] = (),
          positional: Sequence[str] = ()) -> dict[str, Any]:
    """The options ``command`` would receive for the query ``items`` (``(name, value)`` pairs): the scenario's
    flags, ``extras`` (more of ``command``'s long options) and ``positional`` (its arguments, by name). An
    empty value counts as not given.

    :raises FitplanError: an unknown or repeated parameter, a path, or what ``command``'s parser rejects
        (its message, as the CLI prints it).
    """
    options = _options(command)
    allowed = [*SCENARIO_PARAMS, *PRECISION_FLAGS, *extras, *positional]
    given = {k: v for k, v in _pairs(items, allowed).items() if v != ""}
    args: list[str] = []
    for key, value in given.items():
        if key in positional:
            continue
        opt = options[key]
        if opt.type is click.STRING:  # a number (mfu=.4) names no file
            check_not_a_path(key, value)
        if opt.is_flag:
            on = _bool(key, value)
            if on or opt.secondary_opts:
                args.append(f"--{key}" if on else opt.secondary_opts[0])
        else:
            args.append(f"--{key}={value}")
    args += ["--", *(given[p] for p in positional if p in given)]
    return dict(_parsed(command, tuple(args)))


@functools.lru_cache(maxsize=1024)
def _parsed(command: click.Command, args: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """``command``'s parameters for ``args`` (cached: click's parser takes about a millisecond, a third of an
    estimate; a slider sends the same few queries again and again)."""
    try:
        ctx = command.make_context(command.name or "fitplan", list(args))
    except click.ClickException as e:
        raise FitplanError(e.format_message()) from None
    return tuple(ctx.params.items())
