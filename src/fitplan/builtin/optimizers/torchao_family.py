"""torchao 0.18 low-bit AdamW (``adamw_torch_8bit``, ``adamw_torch_4bit``) as the HF Trainer builds it
(``_get_torchao_optimizer``: ``block_size`` 256 for both, the 4-bit class default of 128 overridden).

``torchao/optim/adam.py`` ``_new_buffer`` quantises a state only when ``numel >= 4096 and numel % block_size
== 0``; otherwise ``zeros_like(p)`` (the parameter's dtype). Each quantised state holds uint8 codes (n bytes,
n/2 for 4-bit), an fp32 scale per block and its **own** quantisation map (256 fp32 entries for 8-bit, 16 for
4-bit: ``subclass_8bit.py`` / ``subclass_4bit.py``), not a shared one. ``step`` is ``torch.tensor(0.0)`` on
the CPU. Measured exactly by the referee on this CPU. The step is ``torch.compile``d per parameter: its
temporaries were measured for the CPU (inductor C++) only; CUDA (Triton) is not measured.
"""

from __future__ import annotations

import math

from fitplan.builtin.optimizers._common import TF, cpu_step_scalars, largest
from fitplan.inputs.optimizer import OptimizerSpec

BLOCK = 256
"""``block_size`` the Trainer passes (``optim_args`` may change it)."""
MIN_NUMEL = 4096


def _states(bits: int):
    code_bytes, qmap = (1.0, 256 * 4) if bits == 8 else (0.5, 16 * 4)

    def f(ctx):
        block = ctx.arg("block_size", BLOCK, int)
        total = 0.0
        for shape, count in ctx.tensors:
            n = math.prod(shape)
            if n >= MIN_NUMEL and n % block == 0:
                total += count * 2 * (code_bytes * n + 4 * (n // block) + qmap)
            else:
                total += count * 2 * n * ctx.state_bytes
        return total + cpu_step_scalars(ctx)

    f.__doc__ = f"two {bits}-bit states per quantisable tensor (codes, fp32 scales, a per-state map); small ones like p"
    return f


def _temp(per_elem: float):
    def f(ctx):
        return per_elem * largest(ctx)

    f.__doc__ = (f"the compiled single-parameter step's buffers, measured on the CPU: about {per_elem:g} bytes per "
                 "element of the largest tensor (CUDA/Triton not measured)")
    return f


SPECS = tuple(
    OptimizerSpec(
        name=f"adamw_torch_{bits}bit", state_bytes=_states(bits), step_temp_bytes=_temp(temp), flops_per_param=30,
        states_per_param=0.5 if bits == 8 else 0.25, hf=True, search=False, measured_on_cpu=True,
        torch_class=f"torchao.optim.AdamW{bits}bit", torch_kwargs={"block_size": BLOCK},
        doc=f"torchao AdamW{bits}bit: two {bits}-bit blockwise states (block 256) with per-state maps; tensors under "
            "4,096 elements (or not a multiple of the block) keep states like the parameter.",
        source=f"torchao 0.18 torchao/optim/adam.py, subclass_{bits}bit.py; {TF} _get_torchao_optimizer",
    )
    for bits, temp in ((8, 8.0), (4, 26.0))
)
