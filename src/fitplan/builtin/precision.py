"""Precision presets as quantities: the bytes per element of each kind of tensor.

The presets themselves are one table, :data:`fitplan.inputs.precision.PRESETS`; this plugin reads it:

========== ======= ===== ====== ====== ===========
preset     weights grads master states activations
========== ======= ===== ====== ====== ===========
32-true    4       4     -      4      4
bf16-mixed 4       4     -      4      2 (autocast)
16-mixed   4       4     -      4      2 (autocast)
bf16-true  2       2     -      2      2
16-true    2       2     -      2      2
bf16-autocast 2    2     -      2      2 (autocast over bf16 weights: HF bf16=True, dtype auto)
bf16-autocast-fp16w 2 2   -      2      2 (autocast over fp16 weights)
16-autocast-bf16w 2 2     -      2      2 (fp16 autocast over bf16 weights)
bf16-master 2      2     4      4      2 (DeepSpeed / Megatron)
16-master  2       2     4      4      2
========== ======= ===== ====== ====== ===========

Sources: torch.amp autocast keeps fp32 parameters and runs matmuls in 16-bit; torch optimizers
create states with ``torch.zeros_like(param)`` (so bf16 weights give bf16 states); DeepSpeed's
bf16/fp16 optimizers keep fp32 master weights and fp32 Adam states (ZeRO paper, 2+2+12 bytes).
Activations in the table are the dtype of the residual stream and of most saved tensors; the step
trace (``trace/step_trace.py``) follows each op's own dtype (RMSNorm's fp32 upcast, fp32 softmax and
log-softmax, autocast's 16-bit copies of fp32 tensors).

LoRA (peft 0.21, ``autocast_adapter_dtype=True``): adapters are fp32 whatever the base dtype, so their
gradients and AdamW states are fp32 too (``trainable_dtype_bytes`` = 4). Exact, measured with torch
2.13 on eight tiny architectures in 32-true, bf16-true and bf16-mixed (tests/test_memory_model.py).

Under ``--assumptions seed`` the chapter's simplification holds instead: "bf16 + mixed precision"
is 2-byte weights and gradients with fp32 AdamW states and no master copy (2 + 2 + 8 bytes).
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity
from fitplan.inputs.precision import DTYPE_BYTES, PRESETS
from fitplan.pluginmgr.hookspecs import hookimpl


@quantity("bytes/param")
def weight_dtype_bytes(precision, assumptions):
    """Bytes per stored weight: 4 for 32-true and for autocast (``*-mixed``: fp32 weights), 2 for
    ``*-true`` and ``*-master``. Seed assumptions: 2 for any 16-bit preset (the chapter's bf16 row)."""
    p = PRESETS[precision]
    if assumptions == "seed":
        return 2 if p.sixteen_bit else 4
    return p.weight_bytes


@quantity("bytes/param")
def master_weight_dtype_bytes(precision, assumptions):
    """Bytes per fp32 master weight: 4 for ``*-master`` (DeepSpeed/Megatron keep an fp32 copy), else 0."""
    if assumptions == "seed":
        return 0
    return 4 if PRESETS[precision].master else 0


@quantity("bytes/elem")
def optimizer_state_dtype_bytes(precision, assumptions, method, kbit_preparation):
    """Bytes per full-precision optimizer state element. torch optimizers create states like their
    parameter (2 for ``*-true``; 4 for LoRA adapters, which peft keeps in fp32, 2 for TRL's bf16 QLoRA
    adapters); DeepSpeed keeps fp32 states (``*-master``); the seed assumes fp32 always."""
    if method == "qlora" and kbit_preparation == "trl" and assumptions != "seed":
        return 2
    if assumptions == "seed" or method != "full":
        return 4
    return DTYPE_BYTES[PRESETS[precision].state_dtype]


@quantity("bytes/elem")
def activation_dtype_bytes(precision):
    """Bytes per activation element: 4 in 32-true, 2 under any 16-bit preset (autocast or 16-bit weights)."""
    return PRESETS[precision].activation_bytes


@quantity("dtype", type="text")
def compute_dtype(precision):
    """The dtype matmuls run in (selects the GPU's peak FLOP/s): fp32, bf16 or fp16."""
    return PRESETS[precision].compute_dtype


@hookimpl
def fitplan_register_quantities(register):
    for q in (weight_dtype_bytes, master_weight_dtype_bytes, optimizer_state_dtype_bytes,
              activation_dtype_bytes, compute_dtype):
        register(q)
