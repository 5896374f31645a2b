"""What several optimizer families share: walking the trainable tensors in ``model.parameters()`` order, the
HF Trainer's weight-decay groups, bitsandbytes' quantisation constants."""

from __future__ import annotations

import math
from collections.abc import Callable

from fitplan.inputs.optimizer import OptimizerContext

TF = "transformers 5.24 trainer_optimizer.py"
"""The HF Trainer's optimizer handlers (``_OPTIMIZER_HANDLERS``): what each ``optim`` name builds."""

BNB_BLOCK = 256
"""bitsandbytes 0.50.2 quantises 8-bit states in blocks of 256 with one fp32 absmax each
(``bitsandbytes/optim/optimizer.py``, ``Optimizer2State.init_state``: ``blocksize = 256``, hard-coded)."""
BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes keeps tensors with fewer elements than this in fp32 states (``min_8bit_size`` default)."""
BNB_QMAP_BYTES = 256 * 4
"""One 256-entry fp32 quantisation map; bitsandbytes shares each map between all tensors of one optimizer
(``self.name2qmap``), so it is counted once per optimizer, not per tensor."""


def sequence(ctx: OptimizerContext) -> list[tuple[list[int], int]]:
    """The trainable tensors' element counts in ``model.parameters()`` order, as (block, repeats) pairs:
    consecutive entries with the same count > 1 are one decoder layer's tensors, repeated per layer."""
    blocks: list[tuple[list[int], int]] = []
    for shape, count in ctx.tensors:
        n = math.prod(shape)
        if blocks and count > 1 and blocks[-1][1] == count:
            blocks[-1][0].append(n)
        else:
            blocks.append(([n], count))
    return blocks


def max_sequential(ctx: OptimizerContext, live: Callable[[int, int], float]) -> float:
    """Max over the parameters, in order, of ``live(n_i, n_(i-1))``: a per-parameter step whose temporaries
    (a function of this tensor's size and of the previous one's, still bound in the loop) exist one at a time.
    Two repetitions of a repeated block cover every (previous, current) pair."""
    best, prev = 0.0, 0
    for numels, reps in sequence(ctx):
        for _ in range(min(reps, 2)):
            for n in numels:
                best = max(best, live(n, prev))
                prev = n
    return best


def largest(ctx: OptimizerContext) -> int:
    """The largest trainable tensor's element count."""
    return max((math.prod(shape) for shape, _ in ctx.tensors), default=0)


def bnb_8bit_bytes(n: int, states: int) -> int:
    """``states`` blockwise 8-bit states of an ``n``-element tensor: uint8 codes + one fp32 absmax per block."""
    return states * (n + 4 * math.ceil(n / BNB_BLOCK))


def bnb_states(ctx: OptimizerContext, states: int, *, eight_bit: bool, maps: int = 0) -> int:
    """bitsandbytes 0.50.2 ``Optimizer1State`` / ``Optimizer2State`` (and AdEMAMix's three states) per tensor:
    fp32 states (4 bytes whatever the parameter dtype) for 32-bit optimizers, tensors under 4,096 elements, and
    every ``nn.Embedding`` weight of an 8-bit optimizer (the HF Trainer registers
    ``GlobalOptimManager.register_module_override(module, "weight", {"optim_bits": 32})`` for each one,
    ``transformers/trainer.py`` ``create_optimizer``); otherwise blockwise 8-bit states; plus ``maps``
    shared quantisation maps per optimizer when any tensor is 8-bit."""
    total, any_8bit = 0, False
    for shape, count, _name, kind in ctx.entries():
        n = math.prod(shape)
        if not eight_bit or n < BNB_MIN_8BIT_SIZE or kind == "embedding":
            total += count * states * 4 * n
        else:
            total += count * bnb_8bit_bytes(n, states)
            any_8bit = True
    return total + (maps * BNB_QMAP_BYTES if any_8bit else 0)


def cpu_step_scalars(ctx: OptimizerContext) -> int:
    """torch's non-fused optimizers keep each tensor's ``step`` as a 0-d fp32 tensor created on the CPU
    (``torch.tensor(0.0)``): device memory only when the step runs on the CPU."""
    return 4 * ctx.num_tensors if ctx.device == "cpu" else 0
