"""Sizes the learner writes from an op's own arguments rather than from the probes' values alone (issue #32):
a strided slice's length (Cohere Compass and Qwen3.5's rotary frequencies interleaved for three position axes)
and a size over a field the learner held (DBRX's rotary frequencies).

Expected values come from torch itself (the slice taken on a real tensor) or by hand from the model code cited at
each test, never from fitplan's output.
"""

from __future__ import annotations

import pytest

from fitplan.arch.archexpr import compile_expr


def _compass_text(head_dim: int) -> dict:
    """A one-layer CohereCompassTextConfig: rope_parameters per layer type, ``mrope_section`` left at the class's
    [24, 20, 20] (models/cohere_compass/modeling_cohere_compass.py ``CohereCompassRotaryEmbedding``)."""
    return {"model_type": "cohere_compass_text", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": head_dim,
            "layer_types": ["full_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}}


@pytest.mark.parametrize("n", [8, 12, 18, 21, 64, 100])
@pytest.mark.parametrize("start,end,step", [(1, 60, 3), (2, 60, 3), (0, 2**63 - 1, 2), (3, 10, 1), (0, 5, 1)])
def test_a_slice_length_is_torch_s(n, start, end, step):
    """``slice_length`` against the length torch gives ``x[:, start:end:step]`` on a real tensor of ``n`` columns,
    at sizes on both sides of the end's clamp and at every residue of the step."""
    torch = pytest.importorskip("torch")
    from fitplan_torch.learn.slicesizes import slice_length

    want = torch.zeros(2, n)[:, start:end:step].shape[1]
    assert compile_expr(slice_length("n", start, end, step))({"n": n}) == want


def test_a_slice_is_not_what_the_probes_alone_suggest():
    """The control for the rule above: at the head dims the learner probes (16, 24, 36: 8, 12 and 18 frequencies),
    ``ceil_div(head_dim//2, 3)`` and the slice's own length over them agree; at the published 128 (64 frequencies,
    ``freqs[..., 1:60:3]`` keeps 20) only the slice's length is right (the other says 22)."""
    from fitplan_torch.learn.slicesizes import slice_length

    right = compile_expr(slice_length("head_dim//2", 1, 60, 3))
    probes_only = compile_expr("ceil_div(head_dim//2, 3)")
    for hd in (16, 24, 36):
        assert right({"head_dim": hd}) == probes_only({"head_dim": hd})
    assert (right({"head_dim": 128}), probes_only({"head_dim": 128})) == (20, 22)


def test_compass_rotary_slices_are_written_from_their_bounds():
    """Record the real CohereCompass text model at head dims 16 (base), 24 (its own probe) and 36 and symbolize the
    prologue: the two interleaved slices ``freqs[..., 1:60:3]`` and ``freqs[..., 2:60:3]`` of
    ``recomposition_frequencies`` (``head_dim // 2`` frequencies, ``arange(0, dim, 2)``) are written as their
    lengths. By hand: 1:60:3 of 8, 12, 18 keeps 3, 4, 6; 2:60:3 keeps 2, 4, 6; at head_dim 128, 20 and 20. Before,
    no expression over head_dim fit 3, 4, 6 (the learner refused)."""
    pytest.importorskip("transformers")
    from fitplan_torch.learn.derive import run, symbolize
    from fitplan_torch.learn.fit import Fitter
    from fitplan_torch.learn.segments import Cut

    dims = [16, 24, 36]
    cuts = [Cut(run(_compass_text(hd), "32", "eager", 2, 8), {}) for hd in dims]
    fitter = Fitter([{"head_dim": hd, "b": 2, "s": 8} for hd in dims], {"head_dim": 1})
    sym = symbolize(cuts, fitter, log=lambda *a: None)
    pro = next(n for n, sg in enumerate(cuts[0].segments) if sg["kind"] == "prologue")
    exprs = {d for t in sym[pro]["sym_tensors"] for d in t[0] if "ceil_div(min(60" in str(d)}
    assert exprs, "no slice length in the prologue"
    for e in exprs:
        got = [compile_expr(e)({"head_dim": hd}) for hd in (16, 24, 36, 128)]
        assert got in ([3, 4, 6, 20], [2, 4, 6, 20])


def test_fit_a_size_over_a_held_field():
    """DBRX: ``head_dim = d_model // n_heads`` (models/dbrx/modeling_dbrx.py ``DbrxAttention``) and
    ``arange(0, head_dim, 2)`` rotary frequencies, with ``n_heads`` held at 8 by the learner: 256 // 8 // 2 = 16 at
    the base and 384 // 8 // 2 = 24 at d_model's probe. Control: without the held field in the environment, no
    expression fits (the coefficient 1/16 is not one the fitter guesses)."""
    from fitplan_torch.learn.fit import FitError, Fitter

    d = [256, 256, 384, 256, 384]
    y = [x // 8 // 2 for x in d]
    fitter = Fitter([{"d_model": x, "n_heads": 8, "b": 2, "s": 16} for x in d], {"d_model": 2})
    assert fitter.fit(y) == "d_model//n_heads//2"
    with pytest.raises(FitError):
        Fitter([{"d_model": x, "b": 2, "s": 16} for x in d], {"d_model": 2}).fit(y)
