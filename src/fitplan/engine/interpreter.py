"""The one step interpreter: runs a list of compiled steps over a dict of values.

A compiled graph is a list of positional step tuples (no objects, no hook calls, so that one evaluation
stays under 100 µs):

* ``(Q, name, func, deps)``: a quantity, ``values[name] = func(*values[deps])``;
* ``(R, name, prev, condition, condition_deps, transform, transform_deps)``: a reducer in a chain; when
  the condition holds, ``values[name] = transform(values[prev], *values[transform_deps])``, else the value
  passes through;
* ``(ALIAS, name, prev)``: the end of a chain takes its last link's value.

Both the full evaluation (:meth:`fitplan.engine.graph.CompiledGraph.evaluate`) and the staged one of the
recommender (:class:`fitplan.engine.staging.StagedGraph`) run steps through :func:`run`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fitplan.errors import FitplanError

Q, R, ALIAS = 0, 1, 2
"""Step kinds."""


def run(steps: Iterable[tuple], v: dict[str, Any], applied: dict[str, bool] | None = None,
        fail: Callable[[tuple, dict[str, Any], Exception], Exception] | None = None) -> None:
    """Run ``steps`` in order, reading and writing ``v``; record in ``applied`` whether each reducer applied.

    A :class:`~fitplan.errors.FitplanError` (the user's input) propagates as it is; any other exception is
    turned by ``fail(step, values, exception)`` into the error to raise (the compiled graph names the plugin).
    """
    step: tuple = ()
    try:
        for step in steps:
            kind = step[0]
            if kind == Q:
                v[step[1]] = step[2](*[v[d] for d in step[3]])
            elif kind == R:
                _, name, prev, cond, cdeps, fn, tdeps = step
                if cond(*[v[d] for d in cdeps]):
                    v[name] = fn(v[prev], *[v[d] for d in tdeps])
                    if applied is not None:
                        applied[name] = True
                else:
                    v[name] = v[prev]
                    if applied is not None:
                        applied[name] = False
            else:
                v[step[1]] = v[step[2]]
    except FitplanError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the caller names the plugin and the quantity
        if fail is None:
            raise
        raise fail(step, v, e) from e


def step_deps(step: tuple) -> tuple[str, ...]:
    """The names a step reads."""
    kind = step[0]
    if kind == Q:
        return step[3]
    if kind == R:
        return (step[2], *step[4], *step[6])
    return (step[2],)
