"""Padding and packing figures against numbers worked out by hand on tiny datasets, against a Monte Carlo
simulation, and against transformers' own length-grouped sampler; a sample's confidence interval against the
textbook formula."""

from __future__ import annotations

import itertools
import math
import random

import pytest

np = pytest.importorskip("numpy")

from fitplan.data import padding  # noqa: E402
from fitplan.data.lengths import Lengths, bin_edges  # noqa: E402


def L(*xs: int) -> Lengths:
    return Lengths.from_lengths(xs)


def test_lengths_statistics_by_hand():
    h = L(5, 1, 3, 3, 10)
    assert (h.examples, h.total, h.max, h.min) == (5, 22, 10, 1)
    # nearest rank: p50 -> rank ceil(2.5) = 3rd smallest of 1,3,3,5,10; p90 -> rank 5; p20 -> rank 1
    assert (h.percentile(50), h.percentile(90), h.percentile(20)) == (3, 10, 1)
    assert h.over(4) == (2, 1 + 6)  # 5 and 10 are cut to 4: 1 + 6 tokens
    assert h.truncated(4).expand().tolist() == [1, 3, 3, 4, 4]
    assert h.bins([0, 4, 8, 16]) == [{"from": 0, "to": 4, "examples": 3, "tokens": 7},
                                     {"from": 4, "to": 8, "examples": 1, "tokens": 5},
                                     {"from": 8, "to": 16, "examples": 1, "tokens": 10}]
    assert bin_edges(300, 100) == [0, 64, 100, 128, 256, 512]


def test_longest_by_hand():
    # {1,2,3,4}, batches of 2 drawn at random: the 6 pairs have maxima 2,3,4,3,4,4 -> E[max] = 20/6;
    # two batches of 2: 2 · 2 · 20/6 = 40/3 tokens computed for 10 real ones
    b = padding.batching("longest", L(1, 2, 3, 4), max_length=100, batch=2)
    assert b.computed_tokens == pytest.approx(40 / 3)
    assert (b.real_tokens, b.seq_length) == (10, 4)
    assert b.efficiency == pytest.approx(10 / (40 / 3))


def test_longest_with_a_partial_batch_and_truncation_by_hand():
    # {1..5}, batch 2: two full batches and one of 1. Pairs (10): maxima 2 once, 3 twice, 4 three times,
    # 5 four times -> E[max_2] = 40/10 = 4; E[max_1] = mean = 3 -> 2·2·4 + 1·3 = 19
    assert padding.batching("longest", L(1, 2, 3, 4, 5), 100, 2).computed_tokens == pytest.approx(19)
    # cut at 3: {1,2,3,3,3}: pairs with max 2: one, every other pair has max 3 -> E[max_2] = (2 + 27)/10
    b = padding.batching("longest", L(1, 2, 3, 4, 5), 3, 2)
    assert b.computed_tokens == pytest.approx(2 * 2 * 2.9 + 12 / 5)
    assert (b.real_tokens, b.seq_length) == (12, 3)


def test_longest_agrees_with_shuffled_batches():
    """The exact expectation against the average of 3,000 shuffles batched as a DataLoader does."""
    rng = random.Random(1)
    xs = [rng.choice([5, 20, 21, 50, 200, 700]) for _ in range(37)]
    exact = padding.batching("longest", Lengths.from_lengths(xs), 512, 4).computed_tokens
    total = 0
    for _ in range(3000):
        rng.shuffle(xs)
        total += sum(len(xs[i:i + 4]) * min(512, max(xs[i:i + 4])) for i in range(0, len(xs), 4))
    assert exact == pytest.approx(total / 3000, rel=0.01)


def test_pad_and_pack_by_hand():
    h = L(3, 5, 8, 0)
    pad = padding.batching("pad", h, 6, 2)
    assert (pad.computed_tokens, pad.real_tokens, pad.seq_length) == (4 * 6, 3 + 5 + 6 + 0, 6)
    pack = padding.batching("pack", h, 6, 2)  # bfd drops the empty example, truncates 8 to 6, no padding
    assert (pack.computed_tokens, pack.real_tokens, pack.examples, pack.seq_length) == (14, 14, 3, 6)
    free = padding.batching("padding_free", L(3, 5, 8, 2), 6, 4)  # one batch of all four: 18 tokens, not cut
    assert (free.computed_tokens, free.seq_length) == (18, math.ceil(18 / 4))


def test_group_by_length_by_hand():
    # 8 examples 1..8, micro-batch 2 × 4 accumulation steps: the sampler's batch is 8, one megabatch
    # (min(8 // 32, 50) -> 1), sorted descending: micro-batches (8,7)(6,5)(4,3)(2,1): 2·(8+6+4+2) = 40
    b = padding.batching("group_by_length", L(*range(1, 9)), 100, 2, accumulation=4)
    assert (b.computed_tokens, b.real_tokens, b.seq_length) == (40, 36, 8)


def test_group_by_length_follows_transformers_sampler():
    """Given the same permutation, the order is transformers' ``get_length_grouped_indices``'s."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lens = np.random.default_rng(3).integers(1, 900, 2000)
    for batch in (4, 16, 100):
        g = torch.Generator()
        g.manual_seed(batch)
        order = get_length_grouped_indices(lens.tolist(), batch, generator=g)
        g.manual_seed(batch)
        perm = torch.randperm(len(lens), generator=g).numpy()
        assert (padding.group_by_length_order(lens, batch, perm) == lens[order]).all()


def test_dropped_prompt_completion_examples():
    # lengths 4, 9, 12 with prompts 2, 8, 10; at max_length 8 the last two are cut to 8 and the prompts of
    # 8 and 10 tokens fill it: TRL drops both. Padding to the longest: one example of 4 left.
    from fitplan.data.figures import batching
    from fitplan.data.summary import DatasetSummary

    s = DatasetSummary("prompt_completion", "text", 3, L(4, 9, 12), L(2, 8, 10), 0, {}, {})
    b = batching(s, "longest", 8, 2)
    assert (b.examples, b.real_tokens, b.computed_tokens) == (1, 4, 4)
    assert batching(s, "pack", 8, 2).real_tokens == 4 + 8 + 8  # packing keeps them (truncated)


def test_sample_interval_matches_the_textbook_formula():
    """A sample's total: N/n × the sample's, with a 95 % interval close to 1.96 · N · sd/√n · √(1 − n/N)."""
    from fitplan.data.figures import figures
    from fitplan.data.summary import DatasetSummary

    rng = np.random.default_rng(0)
    population = rng.lognormal(5, 1, 20_000).astype(int) + 1
    sample = rng.choice(population, 1_000, replace=False)
    s = DatasetSummary("text", "text", 20_000, Lengths.from_lengths(sample.tolist()), None, 0, {}, {})
    f = figures(s, 4096, 8)
    est = 20_000 * sample.mean()
    assert f["tokens"]["total"] == pytest.approx(est)
    half = 1.96 * 20_000 * sample.std(ddof=1) / math.sqrt(1000) * math.sqrt(1 - 1000 / 20_000)
    lo, hi = f["tokens"]["total_ci"]
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.2)
    assert lo < population.sum() < hi
    assert f["padding"]["pack"]["computed_tokens_ci"][0] < f["padding"]["pack"]["computed_tokens_per_epoch"]


def test_no_interval_when_every_example_is_read():
    from fitplan.data.figures import figures
    from fitplan.data.summary import DatasetSummary

    s = DatasetSummary("text", "text", 4, L(1, 2, 3, 4), None, 0, {}, {})
    f = figures(s, 100, 2)
    assert f["tokens"]["total_ci"] is None and f["sample"] is None
    assert f["padding"]["longest"]["computed_tokens_per_epoch"] == pytest.approx(40 / 3)
    assert set(itertools.chain(f["padding"])) == set(padding.MODES)


def test_the_worked_example_of_docs_dataset_md():
    """docs/dataset.md's numbers, worked out by hand there."""
    h = L(80, 120, 300, 400, 1500, 2600)
    got = {m: padding.batching(m, h, 2048, 2) for m in padding.MODES}
    assert h.over(2048) == (1, 552) and got["pack"].real_tokens == 4448
    assert got["pad"].computed_tokens == 12288 and got["pad"].efficiency == pytest.approx(0.362, abs=5e-4)
    assert got["longest"].computed_tokens == pytest.approx(3 * 2 * 18160 / 15)
    assert got["longest"].efficiency == pytest.approx(0.612, abs=5e-4) and got["longest"].seq_length == 2048
    assert padding.batching("group_by_length", h, 2048, 2, accumulation=4).computed_tokens == 5136
    assert (got["pack"].computed_tokens, got["padding_free"].computed_tokens) == (4448, 5000)
    wide = padding.batching("longest", h, 4096, 2)
    assert (wide.computed_tokens, wide.seq_length) == (pytest.approx(8368), 2600)


@pytest.mark.parametrize("xs,batch", [((3, 1, 4, 1, 5), 2), ((9, 2, 6, 5, 3, 5), 4), ((7, 7, 1, 2), 3), ((10,), 2)])
def test_longest_equals_every_order_enumerated(xs, batch):
    """The formula against the exact mean over every ordering of the examples (a DataLoader's random order)."""
    total = count = 0
    for order in itertools.permutations(xs):
        total += sum(len(order[i:i + batch]) * max(order[i:i + batch]) for i in range(0, len(order), batch))
        count += 1
    assert padding.longest_tokens(Lengths.from_lengths(xs), batch) == pytest.approx(total / count, rel=1e-12)
