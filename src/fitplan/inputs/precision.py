"""Precision presets: the one table of what each ``--precision`` preset means, and how the HF words
(TrainingArguments ``bf16``/``fp16``, ``from_pretrained``'s ``dtype``) select one.

=================== ======= ======== ======= ======== ====================================================
preset              weights compute  master  autocast what runs it
=================== ======= ======== ======= ======== ====================================================
32-true             fp32    fp32     -       -        plain fp32 (HF Trainer without bf16/fp16, fp32 checkpoint)
bf16-mixed          fp32    bf16     -       yes      torch AMP over fp32 weights (HF ``bf16=True``, fp32 load)
16-mixed            fp32    fp16     -       yes      torch AMP with a GradScaler (HF ``fp16=True``, fp32 load)
bf16-true           bf16    bf16     -       -        pure 16-bit (a bf16 checkpoint, no ``bf16`` flag)
16-true             fp16    fp16     -       -        pure 16-bit (an fp16 checkpoint, no ``fp16`` flag)
bf16-autocast       bf16    bf16     -       yes      HF ``bf16=True`` on a bf16 checkpoint (transformers 5.24's default)
bf16-autocast-fp16w fp16    bf16     -       yes      HF ``bf16=True`` on an fp16 checkpoint (e.g. Llama-2)
16-autocast-bf16w   bf16    fp16     -       yes      HF ``fp16=True`` on a bf16 checkpoint
bf16-master         bf16    bf16     fp32    -        DeepSpeed / Megatron bf16 optimizer (fp32 master + states)
16-master           fp16    fp16     fp32    -        DeepSpeed / Megatron fp16 optimizer
=================== ======= ======== ======= ======== ====================================================

Lightning's names, plus ``*-master`` and the ``*-autocast*`` presets that transformers 5.24's defaults produce.
Optimizer states follow the parameters they update (torch creates them with ``zeros_like(param)``): fp32 for
the ``*-mixed`` and ``*-master`` presets, the weights' dtype otherwise. Activations are 16-bit whenever the
compute dtype is.

When the user names no preset, :func:`hf_precision` decides as the pinned stack does: ``from_pretrained``
loads the checkpoint's dtype (transformers 5.24 ``modeling_utils.py``: ``dtype=None`` becomes ``"auto"``, the
config's ``dtype``/``torch_dtype``; without one, the checkpoint weights' dtype, assumed float32), and the Trainer's ``bf16``/``fp16`` flags add
autocast over whatever was loaded (accelerate 1.16 ``Accelerator(mixed_precision=...)``, which never casts the
model's weights).
"""

from __future__ import annotations

from attrs import frozen

from fitplan.errors import FitplanError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
LOAD_DTYPES = ("auto", "float32", "bfloat16", "float16")
"""``--dtype``: ``from_pretrained``'s word for the load dtype (``auto``: the checkpoint's)."""
_DTYPE_WORDS = {
    "float32": "fp32", "float": "fp32", "fp32": "fp32", "f32": "fp32",
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "half": "fp16", "fp16": "fp16", "f16": "fp16",
}
"""Every spelling HF accepts for a floating dtype (``"bfloat16"``, ``"torch.bfloat16"``; transformers'
``BitsAndBytesConfig`` and ``from_pretrained`` take the torch names), plus fitplan's short names."""
HF_WORD = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def dtype_code(value: object, *, what: str = "dtype") -> str:
    """``fp32`` / ``bf16`` / ``fp16`` for any spelling of a floating dtype HF accepts (``bfloat16``,
    ``torch.bfloat16``, ``bf16``, ``float``, ``half``; case-insensitive).

    :raises FitplanError: another value, naming ``what`` and the spellings accepted.
    """
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text is not None and text.startswith("torch."):
        text = text[len("torch."):]
    code = _DTYPE_WORDS.get(text) if text is not None else None
    if code is None:
        raise FitplanError(f"{what} must be float32, bfloat16 or float16 (or torch.bfloat16, bf16, ...), got {value!r:.60}",
                           field=what, value=value, suggestion="e.g. bfloat16")
    return code


def load_dtype_word(value: object) -> str:
    """``--dtype`` normalised to ``from_pretrained``'s words: ``auto``, ``float32``, ``bfloat16``, ``float16``."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return HF_WORD[dtype_code(value, what="dtype")]


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
    def graph_class(self) -> str:
        """The precision class of a learned file's graph this preset replays (``fitplan.trace.learned_graph``
        ``dtype_map``): ``mixed`` for autocast over weights of another dtype, else ``16`` (the 16-bit graph, its
        bf16 renamed to the weight dtype: 32-true too)."""
        return "mixed" if self.autocast and self.weight_dtype != self.compute_dtype else "16"

    @property
    def deepspeed(self) -> bool:
        """A precision a DeepSpeed engine runs: fp32, or its 16-bit optimizer with fp32 master weights."""
        return self.master or self.name == "32-true"


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("32-true", "fp32", "fp32"),
    Preset("bf16-mixed", "fp32", "bf16", autocast=True, hf_flag="bf16"),
    Preset("16-mixed", "fp32", "fp16", autocast=True, hf_flag="fp16"),
    Preset("bf16-true", "bf16", "bf16"),
    Preset("16-true", "fp16", "fp16"),
    Preset("bf16-autocast", "bf16", "bf16", autocast=True, hf_flag="bf16"),
    Preset("bf16-autocast-fp16w", "fp16", "bf16", autocast=True, hf_flag="bf16"),
    Preset("16-autocast-bf16w", "bf16", "fp16", autocast=True, hf_flag="fp16"),
    Preset("bf16-master", "bf16", "bf16", master=True, hf_flag="bf16"),
    Preset("16-master", "fp16", "fp16", master=True, hf_flag="fp16"),
)}
PRECISIONS: tuple[str, ...] = tuple(PRESETS)
MIXED_FOR_FLAG = {"bf16": "bf16-mixed", "fp16": "16-mixed"}
"""What the HF ``bf16`` / ``fp16`` flags select over fp32 weights without DeepSpeed (autocast)."""
MASTER_FOR_FLAG = {"bf16": "bf16-master", "fp16": "16-master"}
"""What DeepSpeed's ``bf16`` / ``fp16`` sections select (16-bit weights, fp32 master weights and states)."""
_AUTOCAST = {("fp32", "bf16"): "bf16-mixed", ("fp32", "fp16"): "16-mixed", ("bf16", "bf16"): "bf16-autocast",
             ("fp16", "bf16"): "bf16-autocast-fp16w", ("bf16", "fp16"): "16-autocast-bf16w"}
_PLAIN = {"fp32": "32-true", "bf16": "bf16-true", "fp16": "16-true"}


def preset(name: str) -> Preset:
    return PRESETS[name]


def hf_precision(flag: str | None, loaded: str, *, deepspeed: bool = False) -> str:
    """The preset the HF Trainer runs for TrainingArguments' 16-bit ``flag`` (``bf16``, ``fp16`` or None) on
    weights loaded in ``loaded`` (``fp32``/``bf16``/``fp16``, what ``from_pretrained`` loaded):

    * no flag: the loaded dtype, trained as it is (``32-true``, ``bf16-true``, ``16-true``);
    * a flag: autocast in that dtype over the loaded weights (accelerate does not cast the model);
    * ``fp16`` over fp16 weights: torch's GradScaler refuses ("Attempting to unscale FP16 gradients.",
      torch/amp/grad_scaler.py ``_unscale_grads_``), so does fitplan;
    * under DeepSpeed: a flag selects its 16-bit optimizer (``*-master``: the engine casts the module,
      runtime/engine.py); no flag keeps the loaded dtype, and ZeRO's optimizer keeps fp32 partitions of 16-bit
      weights (runtime/zero/stage_1_and_2.py ``single_partition_of_fp32_groups``), which is ``*-master`` too.

    :raises FitplanError: fp16 autocast over fp16 weights.
    """
    if deepspeed:
        code = flag or loaded
        return "32-true" if code == "fp32" else MASTER_FOR_FLAG[code]
    if flag is None:
        return _PLAIN[loaded]
    if flag == "fp16" and loaded == "fp16":
        raise FitplanError("fp16=True on a model loaded in float16: torch's GradScaler refuses to unscale fp16 "
                           "gradients ('Attempting to unscale FP16 gradients.', torch/amp/grad_scaler.py), so the HF "
                           "Trainer fails at the first step", field="fp16", value=True,
                           suggestion="load the model in float32 (--dtype float32) for fp16 mixed precision, or use --bf16")
    return _AUTOCAST[(loaded, flag)]


def deepspeed_twin(name: str) -> str:
    """The preset a plan of preset ``name`` runs when DeepSpeed runs it, the training semantics kept (what
    :func:`hf_precision` gives under DeepSpeed for the same flag and load dtype): ``bf16-mixed``,
    ``bf16-autocast`` and ``bf16-true`` become ``bf16-master``; ``32-true`` and the ``*-master`` presets stay."""
    p = PRESETS[name]
    if p.master:
        return name
    return hf_precision(p.hf_flag if p.autocast else None, p.weight_dtype, deepspeed=True)
