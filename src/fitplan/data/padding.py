"""What each padding or packing mode makes the GPUs compute per epoch, from the examples' token lengths.

The modes are what TRL 1.16's ``SFTTrainer`` (trl/trainer/sft_trainer.py, trl/data_utils.py) and transformers
5.24's ``Trainer`` (trainer.py ``_get_train_sampler``, trainer_pt_utils.py) do with a tokenized dataset:

* ``pad``: every example padded to ``max_seq_length`` (``pad_to_multiple_of=max_length``; the seed chapter's
  model): ``examples × max_seq_length``; memory sees ``max_seq_length``.
* ``longest``: TRL's default (``packing=False``): the collator pads each micro-batch to its longest example, the
  ``RandomSampler`` draws the batches at random. The expected tokens over the shuffle are exact: a micro-batch of
  ``m`` examples drawn without replacement has ``P(max ≤ v) = C(F(v), m) / C(N, m)`` (``F(v)``: examples of at
  most ``v`` tokens), so ``E = ⌊N/b⌋·b·E[max_b] + r·E[max_r]`` with ``r = N mod b``. Memory sees the longest
  (truncated) example: the batch that holds it is padded to it.
* ``group_by_length``: ``train_sampling_strategy="group_by_length"``: ``get_length_grouped_indices`` shuffles,
  cuts megabatches of ``min(N // (4·B), 50)·B`` examples (``B`` = micro-batch × accumulation steps), sorts each
  by length and moves the longest example first; micro-batches are padded to their longest. Simulated on one
  shuffle (numpy, seed given).
* ``pack``: ``packing=True`` with the default ``packing_strategy="bfd"``: examples truncated to
  ``max_seq_length`` are bin-packed into rows of at most ``max_seq_length`` tokens, and bfd switches on
  ``padding_free``, so a micro-batch is its rows' tokens flattened: no padding is computed (the ``bfd_split``
  and ``wrapped`` strategies lose nothing to truncation: their tokens are the untruncated total). Memory sees
  ``max_seq_length`` per row.
* ``padding_free``: ``padding_free=True`` without packing: a micro-batch is its examples concatenated. TRL
  refuses it with a ``max_length`` (it cannot truncate), so lengths are not truncated; memory sees the largest
  micro-batch of one shuffle (seed given), as ``micro-batch × ⌈largest / micro-batch⌉`` tokens.

Truncation drops examples too: with completion-only loss (TRL's default for prompt-completion data), an example
whose prompt fills ``max_seq_length`` has no label left and TRL's ``_prepare_dataset`` filters it out (not when
packing). Such examples are all cut to ``max_seq_length`` tokens, so they are removed from that length.
"""

from __future__ import annotations

import math

import attrs

from fitplan.data.extra import need
from fitplan.data.lengths import Lengths

MODES = ("pad", "longest", "group_by_length", "pack", "padding_free")
"""The padding modes, in the order reports list them."""

DESCRIPTIONS = {
    "pad": "padded to max_seq_length",
    "longest": "padded to the longest in each micro-batch (random order)",
    "group_by_length": "padded to the longest, batches grouped by length",
    "pack": "packed (bfd, padding-free)",
    "padding_free": "padding-free, not packed (no truncation)",
}

MEGABATCH_MAX = 50
"""transformers' ``get_length_grouped_indices``: at most 50 batches per megabatch."""


@attrs.frozen
class Batching:
    """One padding mode over one epoch.

    :ivar computed_tokens: token positions the GPUs compute (real tokens plus padding).
    :ivar real_tokens: tokens trained on (after truncation and the examples TRL drops; a float when scaled
        from a sample).
    :ivar examples: examples trained on.
    :ivar seq_length: the sequence length memory must hold (the realized one: see the module doc).
    :ivar basis: how ``computed_tokens`` is known (exact, an expectation over the shuffle, one simulated shuffle).
    """

    mode: str
    computed_tokens: float
    real_tokens: float
    examples: int
    seq_length: int
    seq_length_basis: str
    basis: str

    @property
    def padding_tokens(self) -> float:
        return self.computed_tokens - self.real_tokens

    @property
    def efficiency(self) -> float:
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 1.0


def trained_lengths(lengths: Lengths, max_length: int, dropped: int = 0) -> Lengths:
    """The lengths TRL trains on without packing: truncated to ``max_length``, less ``dropped`` examples."""
    return lengths.truncated(max_length).without(max_length, dropped)


def expected_max(lengths: Lengths, m: int):
    """``E[max]`` of ``m`` examples drawn without replacement (``m ≤ examples``)."""
    np = need("numpy")
    n = lengths.examples
    cum = lengths.counts.cumsum().astype(np.float64)
    # P(max <= v_i) = C(F_i, m) / C(n, m) = prod_j (F_i - j) / (n - j), 0 when F_i < m
    cdf = np.ones_like(cum)
    for j in range(m):
        cdf *= np.clip((cum - j) / (n - j), 0.0, None)
    pmf = np.diff(np.concatenate(([0.0], cdf)))
    return float(np.dot(pmf, lengths.values))


def longest_tokens(lengths: Lengths, batch: int) -> float:
    """Expected tokens computed per epoch when each micro-batch is padded to its longest (random batches)."""
    n = lengths.examples
    full, rest = divmod(n, batch)
    total = full * batch * expected_max(lengths, batch) if full else 0.0
    if rest:
        total += rest * expected_max(lengths, rest)
    return total


def group_by_length_order(values, batch_size: int, perm):
    """The lengths in the order ``get_length_grouped_indices`` (transformers 5.24) yields them, given its
    random permutation ``perm``: megabatches sorted by length, descending, the longest example moved first."""
    np = need("numpy")
    n = len(values)
    mult = min(n // (batch_size * 4), MEGABATCH_MAX) or 1
    size = mult * batch_size
    shuffled = values[perm]
    full = n // size * size
    mega = [row for row in -np.sort(-shuffled[:full].reshape(-1, size), axis=1)]
    if full < n:
        mega.append(-np.sort(-shuffled[full:]))
    if not mega:
        return shuffled
    top = int(np.argmax([m[0] for m in mega]))
    mega[0][0], mega[top][0] = mega[top][0], mega[0][0]
    return np.concatenate(mega)


def batch_padded_tokens(ordered, batch: int) -> int:
    """Tokens computed when consecutive micro-batches of ``ordered`` are padded to their longest."""
    np = need("numpy")
    n = len(ordered)
    batch = max(1, min(batch, n))
    pad = (-n) % batch
    rows = np.concatenate((ordered, np.zeros(pad, dtype=ordered.dtype))).reshape(-1, batch)
    sizes = np.full(len(rows), batch)
    if pad:
        sizes[-1] = batch - pad
    return int(np.dot(rows.max(axis=1), sizes))


def group_by_length_tokens(lengths: Lengths, batch: int, accumulation: int, seed: int) -> int:
    """Tokens computed per epoch under ``group_by_length`` on one shuffle (numpy's generator, ``seed``)."""
    np = need("numpy")
    values = lengths.expand()
    perm = np.random.default_rng(seed).permutation(len(values))
    return batch_padded_tokens(group_by_length_order(values, batch * accumulation, perm), batch)


def largest_batch_tokens(lengths: Lengths, batch: int, seed: int) -> int:
    """The largest sum of ``batch`` consecutive lengths in one shuffle (numpy's generator, ``seed``)."""
    np = need("numpy")
    values = np.random.default_rng(seed).permutation(lengths.expand())
    batch = max(1, min(batch, len(values)))
    pad = (-len(values)) % batch
    return int(np.concatenate((values, np.zeros(pad, dtype=values.dtype))).reshape(-1, batch).sum(axis=1).max())


def batching(mode: str, lengths: Lengths, max_length: int, batch: int, accumulation: int = 1, *,
             dropped: int = 0, seed: int = 0) -> Batching:
    """Mode ``mode`` over the examples ``lengths`` (untruncated), micro-batch ``batch``, ``accumulation`` steps;
    ``dropped``: examples TRL filters out after truncation (their prompt fills ``max_length``)."""
    if mode == "pack":
        packed = lengths.non_empty().truncated(max_length)
        return Batching(mode, float(packed.total), packed.total, packed.examples, max_length,
                        "max_seq_length (packed rows)", "exact")
    if mode == "padding_free":
        largest = largest_batch_tokens(lengths, batch, seed) if lengths.examples else 0
        return Batching(mode, float(lengths.total), lengths.total, lengths.examples, max(1, math.ceil(largest / batch)),
                        f"the largest micro-batch of one shuffle (seed {seed}): {largest:,} tokens", "exact")
    trained = trained_lengths(lengths, max_length, dropped)
    if not trained.examples:  # every example dropped: nothing to size memory on but the limit
        return Batching(mode, 0.0, 0, 0, max_length, "max_seq_length (no example left)", "exact")
    longest = f"the longest example ({trained.max:,} tokens" + (", truncated)" if lengths.max > max_length else ")")
    if mode == "pad":
        return Batching(mode, float(trained.examples * max_length), trained.total, trained.examples, max_length,
                        "max_seq_length (every example padded to it)", "exact")
    if mode == "longest":
        return Batching(mode, longest_tokens(trained, batch), trained.total,
                        trained.examples, trained.max, longest, "expected over the random order (exact formula)")
    if mode == "group_by_length":
        tokens = group_by_length_tokens(trained, batch, accumulation, seed)
        return Batching(mode, float(tokens), trained.total, trained.examples, trained.max, longest,
                        f"one simulated shuffle (seed {seed})")
    from fitplan.errors import unknown

    raise unknown("padding mode", mode, MODES, field="padding")
