"""The Mamba-2 mixer's chunked scan off CUDA (transformers 5.24 ``torch_forward`` / ``mamba2_chunk_scan``) under
autocast (issue #32: nemotron_h bf16-mixed peak 13 % low, mamba2 1.9 % low, once the shrink gave them 16-wide
heads): ``M = G * L`` multiplies ``G``, a bf16 ``bmm`` (the einsum under autocast), by ``L``, an fp32
``exp(segment_sum(A))``. The node returns ``G``'s gradient in fp32 (``mul_tensor_backward`` is ``grad * other``,
FunctionsManual.cpp) and autograd's engine casts it to bf16 after the node returns (engine.cpp
``validate_outputs``), while the incoming gradient is still alive: at that instant ``G``'s gradient is there in
both widths (fitplan/trace/learned_graph.py ``broadcast_gradients``, step_trace.py ``_cast_instant``). Under
gradient checkpointing the node's unpacked saved tensors are freed before the cast (they are ``apply``'s locals:
torch/utils/checkpoint.py ``unpack_hook``), so there the cast is not the peak.

Expected values are measured by the referee (torch), never taken from fitplan's output; torch's own instant is
derived by hand in tests/test_learn_referee_backward.py. Tests that import torch are referee/slow
(tests/conftest.py).
"""

from __future__ import annotations

import pytest
from conftest import bench_module

CASES = [("bf16-mixed", "eager", False, "full"), ("bf16-mixed", "eager", True, "full")]


def _peaks(data, heldout) -> list[float]:
    from fitplan_torch.learn import verify as V

    _, rows = V.check_memory(data, heldout, lambda *a: None, cases=CASES)
    for row in rows:
        assert all(row[k] == 0 for k in ("parameters", "gradients", "optimizer_states")), row
        assert abs(row["activations"]) < 1e-9, row
    return [row["peak"] for row in rows]


def test_mamba2_chunk_scan_cast_instant_is_the_referees(monkeypatch):
    """mamba2 (its class defaults, shrunk: 8 heads of 16, chunk 256, so a 21-token sequence pads to one chunk of
    256): bf16-mixed eager peaks in the scan's ``G * L`` backward; without the checkpoint it was 1.9 % low (the
    bf16 copy of ``G``'s gradient), now within 0.01 % with and without checkpointing. Controls: without the cast's
    instant the plain case is low again; with the cast's instant but the recomputed saved tensors kept, the
    checkpointed case is high."""
    pytest.importorskip("torch")
    from fitplan.trace import step_trace

    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V
    from fitplan_torch.learn.command import shrink

    cfg = shrink(bench_module("learn_breadth").default_config("mamba2"))
    data, _, _ = derive.learn_full(cfg, log=lambda *a: None, variants=(("16", "eager"), ("mixed", "eager")),
                                   first_only=True)
    heldout, _, _ = V.heldout(cfg, [], derive.Regime("as given", None), 2, 16)
    assert all(abs(p) < 1e-3 for p in _peaks(data, heldout))

    def skipped(self, op, seg, made):  # no cast instant (what the node's saved tensors do is unchanged)
        if self.ckpt[seg]:
            self._release_saved(op, seg)

    monkeypatch.setattr(step_trace.Replay, "_cast_instant", skipped)
    plain, ckpt = _peaks(data, heldout)
    assert plain < -0.01 and abs(ckpt) < 1e-3

    def kept(self, op, seg, made):  # the cast's instant with the node's saved tensors still alive
        self.point(op.cast_temp, op.name, made)
        if self.ckpt[seg]:
            self._release_saved(op, seg)

    monkeypatch.setattr(step_trace.Replay, "_cast_instant", kept)
    plain, ckpt = _peaks(data, heldout)
    assert abs(plain) < 1e-3 and ckpt > 0.01
