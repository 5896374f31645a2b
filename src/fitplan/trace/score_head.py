"""The reward model's score head in the step trace (no torch): TRL's ``RewardTrainer`` (builtin/trl/reward.py).

At the LM head's call site the sequence classifier (transformers ``GenericForSequenceClassification.forward``,
transformers/modeling_layers.py) runs ``score`` (``nn.Linear(hidden, 1, bias=False)``) on every position, pools
the scores at each sequence's last non-pad token, and ``RewardTrainer.compute_loss`` (trl/trainer/
reward_trainer.py) takes ``-logsigmoid(chosen - rejected).mean()``. ``score`` is emitted as every Linear call
site (trace/kernels.py ``linear``: the GEMM saves the final hidden state and the weight; under autocast
their 16-bit copies); the pooling and the loss, over ``2b``-element tensors, as one op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitplan.trace import kernels
from fitplan.arch.archfile import SCORE

if TYPE_CHECKING:
    from fitplan.trace.learned_segment import Segment

RULE = {"d": ["self"], "s": [], "p": [0], "o": [1]}
"""The pooling and the loss as one op (``reward.pool``): differentiable in the scores, saving nothing of size
(the pooling's indices are ``2b`` int64); its backward allocates the scores' gradient (``index``'s backward:
zeros of the scores' shape)."""


def run(seg_inst: "Segment", site: dict[str, Any]):
    """Emit the score head at the LM head's call site: ``score(hidden)`` as ``F.linear`` runs it (its weight and
    input cast to the compute dtype under autocast, the weight's copy cached), the pooled rewards (``2b``), the
    loss."""
    b = seg_inst.b
    tr = b.tr
    h = seg_inst.ref(site["input"])
    weight = seg_inst.ref("p:" + SCORE[0])
    rows = b.spec.batch * b.spec.seq
    scores = kernels.linear(seg_inst, h, weight, rows, h.numel // rows, 1, 3, "score")
    prev = tr.kind_default
    tr.kind_default = "logits"
    rewards = tr.new(b.spec.batch, scores.dtype, False, "reward.rewards")
    tr.kind_default = prev
    b.emit("reward.pool", [("self", scores)], [rewards])
    loss = tr.new(1, "f32", False, "reward.loss")
    b.emit("sum.dim_IntList", [("self", rewards)], [loss])
    return loss
