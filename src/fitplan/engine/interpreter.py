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

A graph evaluated many times (a search, the server, the benchmark) runs the same steps as one straight-line
function (:func:`straight_line`, made once per compiled graph after its first evaluations:
:attr:`~fitplan.engine.graph.CompiledGraph.STRAIGHT_AFTER`): values in local variables, no loop, no per-step
dispatch, which is most of an evaluation's time otherwise. It computes exactly what :func:`run` computes, in the same order; when any step
raises, the evaluation is run again through :func:`run` (quantity functions are pure, docs/style.md), which
finds the failing step and names its plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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
    except BaseException as e:  # noqa: BLE001 - the caller names the plugin and the quantity
        if fail is None or isinstance(e, (KeyboardInterrupt, GeneratorExit)):  # Ctrl-C stops fitplan
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


def straight_line(steps: Sequence[tuple]) -> Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, bool]]]:
    """``steps`` as one generated function ``f(inputs) -> (values, applied)``, equal to ``v = dict(inputs)``
    then :func:`run` (the same values and ``applied`` flags, in the same insertion order). A step that raises
    propagates its exception unnamed: the caller runs :func:`run` to name it.

    The generated source holds only local variable names (``x0``, ``x1``, ...), the functions as ``f0``,
    ``f1``, ... and the value names as string literals (``repr``): nothing of a plugin's is executed as code
    (the pattern attrs and dataclasses use for ``__init__``). Why generated code and not a loop: on the
    default graph (243 steps) it evaluates in about half the time of :func:`run`, of a loop over integer
    slots, or of one prepared closure per step (measured side by side, 2026-12-07); the recommender evaluates
    the graph for every candidate plan.
    """
    local: dict[str, str] = {}
    funcs: dict[str, Callable] = {}
    inputs: list[str] = []
    body: list[str] = []

    def ref(name: str) -> str:
        if name not in local:
            local[name] = f"x{len(local)}"
            inputs.append(f"    {local[name]} = inputs[{name!r}]")
        return local[name]

    def fn(f: Callable) -> str:
        key = f"f{len(funcs)}"
        funcs[key] = f
        return key

    written: list[str] = []
    reducers: list[tuple[str, str]] = []
    for step in steps:
        kind, name = step[0], step[1]
        if kind == Q:
            args = ", ".join(ref(d) for d in step[3])
            code = f"{fn(step[2])}({args})"
        elif kind == R:
            _, _, prev, cond, cdeps, tf, tdeps = step
            flag = f"a{len(reducers)}"
            p = ref(prev)
            cargs = ", ".join(ref(d) for d in cdeps)
            targs = "".join(f", {ref(d)}" for d in tdeps)
            out = local[name] = f"x{len(local)}"
            body += [f"    if {fn(cond)}({cargs}):", f"        {flag} = True", f"        {out} = {fn(tf)}({p}{targs})",
                     "    else:", f"        {flag} = False", f"        {out} = {p}"]
            reducers.append((name, flag))
            written.append(name)
            continue
        else:
            code = ref(step[2])
        local[name] = f"x{len(local)}"
        body.append(f"    {local[name]} = {code}")
        written.append(name)
    values = "".join(f"{n!r}: {local[n]}, " for n in written)
    flags = "".join(f"{n!r}: {flag}, " for n, flag in reducers)
    source = "\n".join(["def evaluate(inputs):", *inputs, *body,
                         f"    return {{**inputs, {values}}}, {{{flags}}}", ""])
    namespace: dict[str, Any] = dict(funcs)
    exec(compile(source, "<fitplan compiled graph>", "exec"), namespace)  # noqa: S102 - see the docstring
    return namespace["evaluate"]
