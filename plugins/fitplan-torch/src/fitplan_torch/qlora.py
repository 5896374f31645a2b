"""QLoRA as users' scripts build it, on any device bitsandbytes 0.50.2 has kernels for (its CPU backend too).

* The random-weight model is saved to a temporary directory and loaded back with
  ``from_pretrained(dir, quantization_config=BitsAndBytesConfig(load_in_4bit=True, ...), device_map=device,
  dtype=...)``: transformers' bitsandbytes quantizer swaps ``nn.Linear`` for ``Linear4bit`` while loading
  (transformers/integrations/bitsandbytes.py:162-236), which ``from_config`` does not do.
* ``BitsAndBytesConfig``: nf4, double quantization as the scenario says, ``bnb_4bit_compute_dtype`` the
  scenario's (default: the precision's compute dtype).
* After loading, the scenario's ``kbit_preparation``: ``peft`` runs ``prepare_model_for_kbit_training``
  (peft/utils/other.py:158-259; with ``use_gradient_checkpointing`` only when the scenario checkpoints, and
  non-reentrant); ``trl`` casts the adapters to bf16 as TRL's SFTTrainer does (trl/trainer/sft_trainer.py:908-911);
  ``none`` is ``get_peft_model`` alone.
* Parameters measured: the packed 4-bit weights *and* their quantization state (absmax, codes, nested
  constants: :func:`quant_state_tensors`), which live outside ``model.parameters()``.

Training mode only: an eval-mode 4-bit forward on the CPU repacks the weights and fails when an
``out_features`` is not a multiple of 32 (bitsandbytes functional.py:1676-1725).
"""

from __future__ import annotations

import tempfile
from typing import Any

from . import _deps

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def load_4bit(config, *, dtype, compute: str, double_quant: bool, device: str, seed: int):
    """The config's model with random weights, loaded back in 4 bits (module doc)."""
    torch = _deps.torch()
    transformers = _deps.transformers()
    _deps.need("bitsandbytes")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    qc = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                         bnb_4bit_use_double_quant=bool(double_quant),
                                         bnb_4bit_compute_dtype=getattr(torch, DTYPES[compute]))
    with tempfile.TemporaryDirectory(prefix="fitplan-qlora-") as tmp:
        model.save_pretrained(tmp)
        del model
        return transformers.AutoModelForCausalLM.from_pretrained(
            tmp, quantization_config=qc, device_map=device, dtype=dtype,
            attn_implementation=getattr(config, "_attn_implementation", None) or "sdpa")


def prepare(model, preparation: str, gradient_checkpointing: bool):
    """What the script does after loading, before LoRA (``peft``: prepare_model_for_kbit_training)."""
    if preparation != "peft":
        return model
    peft = _deps.peft()
    return peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})


def after_lora(model, preparation: str) -> None:
    """TRL's SFTTrainer casts a 4-bit model's trainable parameters to bf16 (DoRA magnitudes excepted)."""
    if preparation != "trl":
        return
    torch = _deps.torch()
    for name, p in model.named_parameters():
        if p.requires_grad and "lora_magnitude_vector" not in name:
            p.data = p.data.to(torch.bfloat16)


def quant_state_tensors(model) -> list[Any]:
    """Every ``Linear4bit``'s quantization state: absmax, code, and with double quantization the nested
    absmax, code and offset (bitsandbytes functional.py:938-951)."""
    torch = _deps.torch()
    out: list[Any] = []
    for m in model.modules():
        w = getattr(m, "weight", None)
        qs = getattr(w, "quant_state", None)
        if qs is None:
            continue
        for t in (qs.absmax, qs.code, getattr(qs, "offset", None)):
            if isinstance(t, torch.Tensor):
                out.append(t)
        s2 = getattr(qs, "state2", None)
        if s2 is not None:
            out += [t for t in (s2.absmax, s2.code) if isinstance(t, torch.Tensor)]
    return out
