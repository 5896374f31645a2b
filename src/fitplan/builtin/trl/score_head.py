"""The reward model's score head in the step trace (no torch): TRL's ``RewardTrainer`` (builtin/trl/reward.py).

At the LM head's call site the sequence classifier (transformers ``GenericForSequenceClassification.forward``,
transformers/modeling_layers.py) runs ``score`` (``nn.Linear(hidden, 1, bias=False)``) on every position, pools
the scores at each sequence's last non-pad token, and ``RewardTrainer.compute_loss`` (trl/trainer/
reward_trainer.py) takes ``-logsigmoid(chosen - rejected).mean()``. One op stands for all of it: it saves the
final hidden state and ``score.weight`` (the GEMM's saves), its backward allocates their gradients; its
``2b·s`` scores are a transient, its ``2b`` rewards the differentiable output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import op_work
from ..archfile import SCORE

if TYPE_CHECKING:
    from ..learned_segment import Segment

RULE = {"d": ["self", "weight"], "s": [], "p": [0, 0], "o": [1, 0]}
"""The score head as one op: differentiable in the final hidden state and ``score.weight``; saves the hidden
state and the weight (given explicitly); its outputs: the pooled rewards (differentiable), the transient
scores."""


def run(seg_inst: "Segment", site: dict[str, Any]):
    """Emit the score head at the LM head's call site: ``score(hidden)`` over every position, the pooled
    rewards (``2b``), and the loss."""
    b = seg_inst.b
    tr = b.tr
    if b.mixed:
        from ...errors import FitplanError

        raise FitplanError("trainer 'reward' under autocast (a *-mixed precision, TRL's bf16=True over fp32 weights) "
                           "is not modelled yet", field="precision", value=b.spec.precision,
                           suggestion="load the weights in 16-bit (bf16-true) or use 32-true")
    h = seg_inst.ref(site["input"])
    weight = seg_inst.ref("p:" + SCORE[0])
    rows = b.spec.batch * b.spec.seq
    hidden = h.numel // rows
    prev = tr.kind_default
    tr.kind_default = "logits"
    rewards = tr.new(b.spec.batch, h.dtype, False, "reward.rewards")
    transient = tr.new(rows, h.dtype, False, "reward.scores")
    tr.kind_default = prev
    b.emit("reward.score", [("self", h), ("weight", weight)], [rewards, transient], extra={"sv": [h, weight]})
    op = tr.ops[-1]
    mm = op_work.gemm(rows, hidden, 1, h.dtype, h.nbytes, weight.nbytes, transient.nbytes, input_grad=h.rg,
                      weight_grad=weight.rg)
    op.work = op_work.Work(mm.fwd, mm.fwd + mm.bwd if op.outs else ())
    loss = tr.new(1, "f32", False, "reward.loss")
    b.emit("sum.dim_IntList", [("self", rewards)], [loss])
    return loss
