"""Loop-invariant evaluation of the compiled graph, for searches over nested loops.

A search varies its inputs in nested loops (method, then precision, ..., then micro-batch). A quantity
whose inputs are all fixed at loop level L need not be recomputed inside the deeper loops: this module
gives every step of the compiled graph the level of its deepest-varying input and runs, at each level,
only the steps of that level. Quantity functions are pure (docs/style.md), so the values are exactly those
of a full :meth:`~fitplan.engine.graph.CompiledGraph.evaluate` on the same inputs; ``tests/test_recommend.py``
checks that against the ordinary estimate.

Only the steps that the ``targets`` need are kept (the ancestors of the targets in the graph).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx

from fitplan.engine.graph import CompiledGraph
from fitplan.engine.interpreter import run, step_deps


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
        self.foreign: list[tuple[str, ...]] = [tuple(s[1] for s in steps if s[1] in compiled.foreign)
                                              for steps in self.by_level]
        """Third-party steps per level, checked as :meth:`CompiledGraph.evaluate` checks them."""

    def depends_on(self, name: str) -> bool:
        """Whether any target depends on the input ``name``."""
        return name in self.inputs

    def level(self, name: str) -> int:
        """The loop level at which ``name`` is (re)computed (-1: once for the whole search)."""
        return self.level_of.get(name, -1)

    def run(self, v: dict[str, Any], level: int) -> None:
        """Compute, in ``v``, the steps of ``level`` (their inputs at that level and above must be set)."""
        run(self.by_level[level + 1], v, None, self.compiled._step_error)
        if self.foreign[level + 1]:
            self.compiled.check_foreign(v, self.foreign[level + 1])

    def steps_per_level(self) -> list[int]:
        return [len(s) for s in self.by_level]
