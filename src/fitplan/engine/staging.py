"""Loop-invariant evaluation of the compiled graph, for searches over nested loops.

A search varies its inputs in nested loops (method, then precision, ..., then micro-batch). A quantity
whose inputs are all fixed at loop level L need not be recomputed inside the deeper loops: this module
gives every step of the compiled graph the level of its deepest-varying input and runs, at each level,
only the steps of that level. Quantity functions are pure (STYLE.md), so the values are exactly those
of a full :meth:`~fitplan.engine.graph.CompiledGraph.evaluate` on the same inputs; ``tests/test_recommend.py``
checks that against the ordinary estimate.

Only the steps that the ``targets`` need are kept (the ancestors of the targets in the graph).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx

from fitplan.errors import FitplanError
from fitplan.engine.graph import Q, R, CompiledGraph


def step_deps(step: tuple) -> tuple[str, ...]:
    kind = step[0]
    if kind == Q:
        return step[3]
    if kind == R:
        return (step[2], *step[4], *step[6])
    return (step[2],)


class StagedGraph:
    """The steps needed for ``targets``, grouped by loop level.

    :param levels: the input names that vary at each loop level, outermost first. Inputs named at no
        level are fixed for the whole search (level -1, run once by :meth:`run` with ``level=-1``).
    """

    def __init__(self, compiled: CompiledGraph, targets: Iterable[str], levels: Sequence[Iterable[str]]) -> None:
        self.compiled = compiled
        self.targets = tuple(targets)
        missing = [t for t in self.targets if t not in compiled.graph]
        if missing:
            from fitplan.errors import unknown

            raise unknown("quantity", missing[0], compiled.quantities)
        needed: set[str] = set(self.targets)
        for t in self.targets:
            needed |= nx.ancestors(compiled.graph, t)
        self.inputs = frozenset(n for n in needed if compiled.nodes[n].kind == "input")
        level_of: dict[str, int] = {}
        for i, names in enumerate(levels):
            for n in names:
                level_of[n] = i
        self.level_names = [tuple(names) for names in levels]
        self.by_level: list[list[tuple]] = [[] for _ in range(len(levels) + 1)]
        for step in compiled.steps:
            name = step[1]
            if name not in needed:
                continue
            lvl = max((level_of.get(d, -1) for d in step_deps(step)), default=-1)
            level_of[name] = lvl
            self.by_level[lvl + 1].append(step)
        self.level_of = level_of

    def depends_on(self, name: str) -> bool:
        """Whether any target depends on the input ``name``."""
        return name in self.inputs

    def level(self, name: str) -> int:
        """The loop level at which ``name`` is (re)computed (-1: once for the whole search)."""
        return self.level_of.get(name, -1)

    def run(self, v: dict[str, Any], level: int) -> None:
        """Compute, in ``v``, the steps of ``level`` (their inputs at that level and above must be set)."""
        step: tuple = ()
        try:
            for step in self.by_level[level + 1]:
                kind = step[0]
                if kind == Q:
                    v[step[1]] = step[2](*[v[d] for d in step[3]])
                elif kind == R:
                    _, name, prev, cond, cdeps, fn, tdeps = step
                    if cond(*[v[d] for d in cdeps]):
                        v[name] = fn(v[prev], *[v[d] for d in tdeps])
                    else:
                        v[name] = v[prev]
                else:
                    v[step[1]] = v[step[2]]
        except FitplanError:
            raise
        except Exception as e:  # noqa: BLE001 - the same plugin-naming error as a full evaluation
            raise self.compiled._step_error(step, v, e) from e

    def steps_per_level(self) -> list[int]:
        return [len(s) for s in self.by_level]
