"""The figures of a dataset summary for a ``max_seq_length`` and a micro-batch: totals, percentiles,
truncation, each padding mode's computed tokens; for a sample, scaled to the whole dataset with a confidence
interval.

A sample of ``n`` of the dataset's ``N`` examples (drawn uniformly without replacement) estimates a total as
``N/n ×`` the sample's. The interval is a bootstrap percentile interval: ``BOOTSTRAP`` resamples of ``n``
examples from the sample's lengths (a multinomial draw on its histogram, seeded), each figure recomputed,
the 2.5th and 97.5th percentiles taken, and their distance from the estimate shrunk by the finite-population
correction ``√(1 − n/N)``. Percentiles and the maximum come from the sample as they are (the true maximum can
only be larger).
"""

from __future__ import annotations

from typing import Any

from fitplan.data import padding
from fitplan.data.extra import need
from fitplan.data.lengths import Lengths, bin_edges
from fitplan.data.summary import DatasetSummary

BOOTSTRAP = 200
CONFIDENCE = 0.95


def dropped(summary: DatasetSummary, max_length: int) -> int:
    """Examples TRL drops after truncating prompt-completion data, among those read: the prompt fills
    ``max_length`` (completion-only loss leaves them no label)."""
    return 0 if summary.prompts is None else summary.prompts.at_least(max_length)


def batching(summary: DatasetSummary, mode: str, max_length: int, batch: int, accumulation: int = 1) -> padding.Batching:
    """Mode ``mode`` over one epoch of the whole dataset (a sample's figures scaled by ``N/n``); memoized."""
    key = ("batching", mode, max_length, batch, accumulation)
    if key not in summary.memo:
        b = padding.batching(mode, summary.lengths, max_length, batch, accumulation,
                             dropped=dropped(summary, max_length) if mode not in ("pack", "padding_free") else 0,
                             seed=summary.seed)
        f = summary.examples / summary.read
        if f != 1:
            b = padding.Batching(b.mode, b.computed_tokens * f, b.real_tokens * f, round(b.examples * f),
                                 b.seq_length, b.seq_length_basis + " (in the sample)", b.basis + f", scaled from a "
                                 f"sample of {summary.read:,}")
        summary.memo[key] = b
    return summary.memo[key]


def _point(lengths: Lengths, max_length: int, batch: int, accumulation: int, drop: int, seed: int) -> dict[str, float]:
    """The additive figures of one set of lengths (unscaled)."""
    over, cut = lengths.over(max_length)
    out = {"tokens.total": float(lengths.total), "truncated_examples": float(over), "tokens_cut": float(cut)}
    for mode in padding.MODES:
        d = drop if mode not in ("pack", "padding_free") else 0
        out[f"padding.{mode}"] = padding.batching(mode, lengths, max_length, batch, accumulation,
                                                  dropped=min(d, lengths.truncated(max_length).at_least(max_length)),
                                                  seed=seed).computed_tokens
    return out


def intervals(summary: DatasetSummary, max_length: int, batch: int, accumulation: int) -> dict[str, list[float]]:
    """95 % intervals of the scaled totals, by figure name (empty when every example was read)."""
    if not summary.sampled:
        return {}
    np = need("numpy")
    rng = np.random.default_rng(summary.seed)
    n, f = summary.read, summary.examples / summary.read
    drop = dropped(summary, max_length)
    point = _point(summary.lengths, max_length, batch, accumulation, drop, summary.seed)
    p = summary.lengths.counts / n
    reps: dict[str, list[float]] = {k: [] for k in point}
    for _ in range(BOOTSTRAP):
        counts = rng.multinomial(n, p)
        keep = counts > 0
        rep = _point(Lengths(summary.lengths.values[keep], counts[keep]), max_length, batch, accumulation, drop,
                     summary.seed)
        for k, v in rep.items():
            reps[k].append(v)
    shrink = (1 - n / summary.examples) ** 0.5
    tail = (1 - CONFIDENCE) / 2 * 100
    out = {}
    for k, est in point.items():
        lo, hi = np.percentile(reps[k], [tail, 100 - tail])
        out[k] = [f * (est - (est - lo) * shrink), f * (est + (hi - est) * shrink)]
    return out


def figures(summary: DatasetSummary, max_length: int, batch: int, accumulation: int = 1) -> dict[str, Any]:
    """Everything ``fitplan dataset`` reports, as a JSON-ready dict (docs/dataset.md lists the keys)."""
    h, f = summary.lengths, summary.examples / summary.read
    over, cut = h.over(max_length)
    ci = intervals(summary, max_length, batch, accumulation)
    total = h.total * f
    modes = {}
    for mode in padding.MODES:
        b = batching(summary, mode, max_length, batch, accumulation)
        modes[mode] = {"computed_tokens_per_epoch": b.computed_tokens, "real_tokens_per_epoch": b.real_tokens,
                       "padding_tokens_per_epoch": b.padding_tokens, "efficiency": b.efficiency,
                       "examples": b.examples, "seq_length": b.seq_length, "seq_length_basis": b.seq_length_basis,
                       "basis": b.basis, "description": padding.DESCRIPTIONS[mode],
                       "computed_tokens_ci": ci.get(f"padding.{mode}")}
    return {
        "examples": summary.examples,
        "kind": summary.kind,
        "tokens": {"total": total, "total_ci": ci.get("tokens.total"), "mean": h.mean, "min": h.min,
                   "p50": h.percentile(50), "p90": h.percentile(90), "p99": h.percentile(99), "max": h.max},
        "max_seq_length": max_length,
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": accumulation,
        "truncated_examples": over * f,
        "truncated_examples_ci": ci.get("truncated_examples"),
        "truncated_examples_share": over / h.examples if h.examples else 0.0,
        "tokens_cut": cut * f,
        "tokens_cut_ci": ci.get("tokens_cut"),
        "tokens_cut_share": cut / h.total if h.total else 0.0,
        "dropped_examples": dropped(summary, max_length) * f,
        "padding": modes,
        "histogram": h.bins(bin_edges(h.max, max_length)),
        "sample": None if not summary.sampled else {
            "read": summary.read, "seed": summary.seed, "confidence": CONFIDENCE,
            "method": f"bootstrap percentile interval ({BOOTSTRAP} resamples), finite-population corrected"},
        "source": summary.source,
        "tokenizer": summary.tokenizer,
    }
