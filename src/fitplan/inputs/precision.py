"""Precision presets: the one table of what each ``--precision`` preset means.

========== ======= ======== ======= ======== =============================================
preset     weights compute  master  autocast what runs it
========== ======= ======== ======= ======== =============================================
32-true    fp32    fp32     -       -        plain fp32 (HF Trainer without bf16/fp16)
bf16-mixed fp32    bf16     -       yes      torch AMP (HF ``bf16=True``)
16-mixed   fp32    fp16     -       yes      torch AMP with a GradScaler (HF ``fp16=True``)
bf16-true  bf16    bf16     -       -        pure 16-bit (model loaded with ``torch_dtype=bfloat16``)
16-true    fp16    fp16     -       -        pure 16-bit (``torch_dtype=float16``)
bf16-master bf16   bf16     fp32    -        DeepSpeed / Megatron bf16 optimizer (fp32 master + states)
16-master  fp16    fp16     fp32    -        DeepSpeed / Megatron fp16 optimizer
========== ======= ======== ======= ======== =============================================

Lightning's names, plus ``*-master``. Optimizer states follow the parameters they update (torch creates
them with ``zeros_like(param)``): fp32 for the ``*-mixed`` and ``*-master`` presets, 16-bit for ``*-true``.
Activations are 16-bit whenever the compute dtype is.
"""

from __future__ import annotations

from attrs import frozen

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@frozen
class Preset:
    """One ``--precision`` preset (see the module table)."""

    name: str
    weight_dtype: str
    compute_dtype: str
    autocast: bool = False
    master: bool = False
    """fp32 master weights and fp32 optimizer states beside 16-bit weights (DeepSpeed's bf16/fp16 optimizers)."""
    hf_flag: str | None = None
    """The HF TrainingArguments flag (``bf16`` / ``fp16``) that selects this preset, if any."""
    torch_dtype: str | None = None
    """The ``torch_dtype`` the model is loaded with for pure 16-bit training, if any."""

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def state_dtype(self) -> str:
        """The dtype of full-precision optimizer states: fp32 with master weights, else the weights' dtype."""
        return "fp32" if self.master else self.weight_dtype

    @property
    def activation_bytes(self) -> int:
        return DTYPE_BYTES[self.compute_dtype]

    @property
    def sixteen_bit(self) -> bool:
        return self.compute_dtype != "fp32"

    @property
    def deepspeed(self) -> bool:
        """A precision a DeepSpeed engine runs: fp32, or its 16-bit optimizer with fp32 master weights."""
        return self.master or self.name == "32-true"


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("32-true", "fp32", "fp32"),
    Preset("bf16-mixed", "fp32", "bf16", autocast=True, hf_flag="bf16"),
    Preset("16-mixed", "fp32", "fp16", autocast=True, hf_flag="fp16"),
    Preset("bf16-true", "bf16", "bf16", torch_dtype="bfloat16"),
    Preset("16-true", "fp16", "fp16", torch_dtype="float16"),
    Preset("bf16-master", "bf16", "bf16", master=True, hf_flag="bf16"),
    Preset("16-master", "fp16", "fp16", master=True, hf_flag="fp16"),
)}
PRECISIONS: tuple[str, ...] = tuple(PRESETS)
MIXED_FOR_FLAG = {"bf16": "bf16-mixed", "fp16": "16-mixed"}
"""What the HF ``bf16`` / ``fp16`` flags select without DeepSpeed (autocast with fp32 weights)."""
MASTER_FOR_FLAG = {"bf16": "bf16-master", "fp16": "16-master"}
"""What DeepSpeed's ``bf16`` / ``fp16`` sections select (16-bit weights, fp32 master weights and states)."""


def preset(name: str) -> Preset:
    return PRESETS[name]
