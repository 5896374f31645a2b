"""The referee's saved-tensor meter (plugins/fitplan-torch measure.py ``SavedTensors``) must not keep alive what a
step without it frees (issue #32: BigBird's pooler branch).

torch asks that a pack hook's return value hold no reference to the tensor it packs (torch/autograd/graph.py
``saved_tensors_hooks``, torch 2.13): an op that saves its own output (``tanh``) would then hold that output, and
through the output's ``grad_fn`` the node itself, in a cycle the garbage collector cannot see. A branch the loss
never reads (BigBird's ``tanh(pooler(sequence_output[:, 0]))``, which ``BigBirdForCausalLM`` drops: transformers
5.24 models/big_bird/modeling_big_bird.py) then stayed alive under the meter for good: the referee measured 768 B
(32-true) and 8960 B (bf16-mixed: the pooler's bf16 weight copy and input too) of activations that a plain step
frees as the forward returns, and that fitplan's replay frees (trace/step_trace.py ``drop_dead_saves``).

Expected values: torch itself (a step without the meter, its gradients and what it frees) and the shapes by hand.
"""

from __future__ import annotations

import weakref

import pytest


def _step(torch, make):
    """``h = x @ w`` (``w`` a parameter: the meter leaves it out); a dead ``tanh(h[:, 0])`` dropped as a model's
    output field is; the loss ``(h * h).sum()``. ``make(w)``: the meter. Returns (is the dead branch's storage alive
    after the forward, the meter's bytes, ``x``'s and ``w``'s gradients)."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 64, requires_grad=True)
    w = torch.randn(64, 64, requires_grad=True)
    meter = make(w)
    with meter:
        h = x @ w
        dead = torch.tanh(h[:, 0])
        loss = (h * h).sum()
    ref = weakref.ref(dead.untyped_storage())
    del dead
    alive = ref() is not None
    saved = getattr(meter, "bytes", 0)
    loss.backward()
    return alive, saved, x.grad, w.grad


def test_a_branch_the_loss_never_reads_is_freed_under_the_meter():
    """Without the meter the dead branch's 3 × 64 fp32 output is freed when dropped; under it too now, and the
    meter's saved bytes are ``h`` (read twice by ``mul``, one storage: 3 × 5 × 64 × 4 = 3840 B) and ``x`` (saved by
    the matmul: 3840 B), not the dead ``tanh``'s 768 B; the gradients are the plain step's. Control: a pack hook
    that returns the tensor itself (the meter before this fix) keeps it alive and counts its 768 B."""
    torch = pytest.importorskip("torch")
    from fitplan_torch.measure import SavedTensors

    class Plain:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    alive, _, gx, gw = _step(torch, lambda w: Plain())
    assert not alive
    alive, saved, mx, mw = _step(torch, lambda w: SavedTensors(exclude=[w]))
    assert not alive and saved == 2 * 3 * 5 * 64 * 4
    assert torch.equal(gx, mx) and torch.equal(gw, mw)

    class Holding(SavedTensors):
        def _pack(self, t):
            super()._pack(t)
            return t

    alive, saved, _, _ = _step(torch, lambda w: Holding(exclude=[w]))
    assert alive and saved == 2 * 3 * 5 * 64 * 4 + 3 * 64 * 4
