"""The token lengths of a dataset's examples, kept as a histogram of exact lengths.

A dataset of any size reduces to its distinct lengths and how many examples have each: every figure fitplan
reports (totals, percentiles, truncation at any ``max_seq_length``, the padding of any micro-batch) is a function
of that histogram, so one pass over the file serves every later question, and the summary a team shares
(``fitplan dataset --out``) holds no text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from fitplan.data.extra import need


def _np():
    return need("numpy")


@attrs.frozen(eq=False)
class Lengths:
    """Examples by token length: ``values`` (sorted, distinct, ≥ 0) and ``counts`` (≥ 1 each), numpy int64."""

    values: Any
    counts: Any

    @classmethod
    def from_counts(cls, counts: Mapping[int, int]) -> Lengths:
        np = _np()
        items = sorted((int(v), int(c)) for v, c in counts.items() if c)
        values = np.array([v for v, _ in items], dtype=np.int64)
        return cls(values, np.array([c for _, c in items], dtype=np.int64))

    @classmethod
    def from_lengths(cls, lengths: Iterable[int]) -> Lengths:
        np = _np()
        values, counts = np.unique(np.asarray(list(lengths), dtype=np.int64), return_counts=True)
        return cls(values, counts.astype(np.int64))

    # ------------------------------------------------------------------ totals

    @property
    def examples(self) -> int:
        return int(self.counts.sum())

    @property
    def total(self) -> int:
        return int((self.values * self.counts).sum())

    @property
    def mean(self) -> float:
        return self.total / self.examples if self.examples else 0.0

    @property
    def max(self) -> int:
        return int(self.values[-1]) if len(self.values) else 0

    @property
    def min(self) -> int:
        return int(self.values[0]) if len(self.values) else 0

    def percentile(self, q: float) -> int:
        """Nearest rank: the smallest length that at least ``q`` % of the examples do not exceed."""
        if not self.examples:
            return 0
        rank = max(1, math.ceil(q / 100 * self.examples))
        return int(self.values[int(_np().searchsorted(self.counts.cumsum(), rank))])

    # ------------------------------------------------------------------ truncation

    def truncated(self, max_length: int) -> Lengths:
        """Each example cut to at most ``max_length`` tokens (TRL's ``truncation_mode="keep_start"``)."""
        np = _np()
        keep = self.values < max_length
        over = int(self.counts[~keep].sum())
        values, counts = self.values[keep], self.counts[keep]
        if over:
            values, counts = np.append(values, max_length), np.append(counts, over)
        return Lengths(values, counts)

    def over(self, max_length: int) -> tuple[int, int]:
        """``(examples, tokens)`` beyond ``max_length``: how many are truncated and how many tokens are cut."""
        beyond = self.values > max_length
        return int(self.counts[beyond].sum()), int(((self.values[beyond] - max_length) * self.counts[beyond]).sum())

    def without(self, length: int, n: int) -> Lengths:
        """``n`` fewer examples of ``length`` (those TRL drops after truncation)."""
        if n <= 0:
            return self
        np = _np()
        i = int(np.searchsorted(self.values, length))
        if i >= len(self.values) or self.values[i] != length or self.counts[i] < n:
            raise ValueError(f"cannot remove {n} examples of length {length}")
        counts = self.counts.copy()
        counts[i] -= n
        keep = counts > 0
        return Lengths(self.values[keep], counts[keep])

    def at_least(self, length: int) -> int:
        """Examples of ``length`` tokens or more."""
        return int(self.counts[self.values >= length].sum())

    def non_empty(self) -> Lengths:
        keep = self.values > 0
        return Lengths(self.values[keep], self.counts[keep])

    def expand(self) -> Any:
        """Every example's length, sorted (a numpy array of ``examples`` entries)."""
        return _np().repeat(self.values, self.counts)

    # ------------------------------------------------------------------ display

    def bins(self, edges: list[int]) -> list[dict[str, int]]:
        """Examples and tokens per bin ``[edges[i], edges[i+1])``; the last bin is closed."""
        np = _np()
        out = []
        for i, lo in enumerate(edges[:-1]):
            hi = edges[i + 1]
            mask = (self.values >= lo) & ((self.values < hi) if i < len(edges) - 2 else (self.values <= hi))
            out.append({"from": int(lo), "to": int(hi), "examples": int(self.counts[mask].sum()),
                        "tokens": int(np.dot(self.values[mask], self.counts[mask]))})
        return out

    def to_dict(self) -> dict[str, list[int]]:
        return {"values": [int(v) for v in self.values], "counts": [int(c) for c in self.counts]}


def bin_edges(max_length: int, cut: int | None = None) -> list[int]:
    """Histogram edges: 0, then powers of two from 64 up to the longest example (and ``cut``, the
    ``max_seq_length``, when it falls inside)."""
    edges = [0]
    e = 64
    while e < max_length:
        edges.append(e)
        e *= 2
    edges.append(max(e, 1))
    if cut and 0 < cut < edges[-1] and cut not in edges:
        edges = sorted([*edges, cut])
    return edges
