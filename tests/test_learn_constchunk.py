"""The gated delta rule learned across chunks (issue #32, fitplan_torch/learn/constchunk.py).

transformers 5.24 modeling_qwen3_next.py ``torch_chunk_gated_delta_rule(chunk_size=64)`` (olmo_hybrid's too) pads
the sequence to a multiple of the constant 64 and loops over the chunks in Python. Expected values are derived by
hand from that code (``pad_size = (64 - s % 64) % 64``: ``64*ceil(s/64)`` rows in ``ceil(s/64)`` chunks, the loop
running once per chunk, its first iteration kept as recorded by the fold) or measured by torch (the referee's
memory check); never read off the learner's output. Tests that import torch are referee/slow (tests/conftest.py).
"""

from __future__ import annotations

import copy

import pytest
from conftest import bench_module

from fitplan_torch.learn.constchunk import fit_count
from fitplan_torch.learn.fit import FitError, Fitter


def _ceil(s: int) -> int:
    return -(-s // 64)


# (b, s, heads) at a base, one probe per variable and two joint probes, as the learner probes (derive.make_probes):
# s from 252 to 262 spans 4 and 5 chunks of 64
_ROWS = [(2, 254, 4), (3, 254, 4), (2, 258, 4), (2, 254, 12), (3, 260, 12), (4, 262, 18)]


def _fitter() -> Fitter:
    return Fitter([{"b": b, "s": s, "h": h} for b, s, h in _ROWS], {"b": 1, "s": 2, "h": 3})


def test_the_chunk_loop_sizes_fit_by_hand():
    """Padded rows ``64*ceil(s/64)`` (256 at s=254, 320 at 258..262), the bmm view's ``b*heads*ceil(s/64)`` rows
    (2*4*4 = 32 at the base, 3*12*5 = 180 at the first joint probe), the chunk count, the fold's count (chunks less
    the first iteration: 3 at the base, 4 at s=258). Control: a count no form fits (7 at one probe) is refused.
    The chunk forms divide by the chunk the padded length was fitted with, so that one is fitted first, as the
    pad precedes the loop in the recording."""
    f = _fitter()
    assert f.fit([64 * _ceil(s) for _, s, _ in _ROWS]) == "64*ceil_div(s, 64)"
    assert f.fit([b * h * _ceil(s) for b, s, h in _ROWS]) == "b*h*ceil_div(s, 64)"
    assert f.fit([_ceil(s) for _, s, _ in _ROWS]) == "ceil_div(s, 64)"
    assert fit_count(f, [_ceil(s) - 1 for _, s, _ in _ROWS]) == "ceil_div(s, 64) - 1"
    with pytest.raises(FitError):
        fit_count(f, [3, 3, 4, 3, 4, 7])


def _learn():
    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V
    from fitplan_torch.learn.command import shrink

    cfg = shrink(bench_module("learn_breadth").default_config("olmo_hybrid"))
    logs: list[str] = []
    data, _, _ = derive.learn_full(cfg, log=logs.append, variants=(("mixed", "eager"),))
    heldout, _, _ = V.heldout(cfg, [], derive.Regime("as given", None), 2, 16)
    return data, heldout, logs


def _errors(data, cfg, s: int) -> list[tuple[float, float]]:
    from fitplan_torch.learn import verify as V

    _, rows = V.check_memory(data, cfg, lambda *a: None, cases=[("bf16-mixed", "eager", False, "full")], b=2, s=s)
    return [(r["activations"], r["peak"]) for r in rows]


def test_olmo_hybrid_learns_across_chunks_and_matches_torch():
    """olmo_hybrid shrunk, bf16-mixed eager: two regimes (``s > 64`` and ``s <= 64``, no ``s <=`` bound left on the
    several-chunk one); the referee (torch, b=2) measures activations and peak within 1 % at one chunk (21, 64),
    two (65, 128, a multiple of 64), five (300). Control: the same file with the loop's count one too many
    (``ceil_div(s, 64)``, each chunk's iteration: the fold keeps the first as recorded) is off at 300."""
    pytest.importorskip("torch")
    data, cfg, logs = _learn()
    assert any("constant chunk 64" in line for line in logs), logs
    whens = [v["when"] for v in data["variants"]]
    assert any("(s > 64)" in w for w in whens) and any("s <= 64" in w for w in whens), whens
    assert not any("(s > 64)" in w and "s <= 64" in w for w in whens), whens
    for s in (21, 64, 65, 128, 300):
        for act, peak in _errors(data, cfg, s):
            assert abs(act) <= 0.01 and abs(peak) <= 0.01, (s, act, peak)
    bad = copy.deepcopy(data)
    counts = [r for seg in bad["segments"].values() for r in seg.get("rep", ()) if r["n"] == "ceil_div(s, 64) - 1"]
    assert counts, "no repeated block over the chunks"
    for r in counts:
        r["n"] = "ceil_div(s, 64)"
    act, _ = _errors(bad, cfg, 300)[0]
    assert act > 0.01, act
