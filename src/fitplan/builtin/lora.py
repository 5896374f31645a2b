"""LoRA and QLoRA reducers.

LoRA (Hu et al. 2021; peft): each adapted Linear of shape (out, in) gets A (r, in) and B (out, r);
only those are trainable. QLoRA (Dettmers et al. 2023): the frozen decoder-layer Linear weights are
stored in 4-bit NF4 (0.5 B/param) with one absmax per 64-element block: fp32 (4 B) without double
quantisation, or 8-bit with one fp32 second-level constant per 256 blocks with it (bitsandbytes
``bnb_4bit_use_double_quant``). Embeddings, norms and the LM head stay in 16-bit.
"""

from __future__ import annotations

from fitplan.engine.declarations import reducer
from fitplan.errors import FitplanError
from fitplan.pluginmgr.hookspecs import hookimpl

NF4_BLOCK = 64
DOUBLE_QUANT_BLOCK = 256


def _matches(module: str, targets) -> bool:
    return module in targets or module.rsplit(".", 1)[-1] in targets or "all-linear" in targets


def adapter_tensors(arch, lora_r, lora_target_modules):
    """The LoRA A and B tensors for every targeted Linear weight of ``arch``."""
    out = []
    matched = set()
    for g in arch.param_groups():
        if not (g.layer and g.is_matrix and g.name.endswith(".weight")) or g.module == "router":
            continue
        if _matches(g.module, lora_target_modules):
            matched.add(g.module)
            outf, inf = g.shape[-2], g.shape[-1]
            out.append(((lora_r, inf), g.count))
            out.append(((outf, lora_r), g.count))
    missing = [t for t in lora_target_modules if t != "all-linear" and not any(_matches(m, (t,)) for m in matched)]
    if missing or not out:
        modules = sorted({g.module for g in arch.param_groups() if g.layer and g.is_matrix and g.module != "router"})
        raise FitplanError(
            f"LoRA target module(s) {', '.join(missing) or ', '.join(lora_target_modules)} not found in {arch.name}",
            field="lora_target_modules", value=",".join(lora_target_modules),
            suggestion="modules of this model: " + ", ".join(modules),
        )
    return tuple(out)


@reducer("trainable_tensors", when=lambda method: method in ("lora", "qlora"))
def lora(value, arch, lora_r, lora_target_modules):
    """Only the adapters train: A (r × in) and B (out × r) per targeted Linear (peft LoraConfig)."""
    return adapter_tensors(arch, lora_r, lora_target_modules)


def quantized_param_count(arch) -> int:
    """Parameters QLoRA stores in NF4: the Linear weights inside the decoder layers."""
    return sum(g.total for g in arch.param_groups()
               if g.layer and g.is_matrix and g.name.endswith(".weight") and g.module != "router")


def nf4_bytes(n: int, double_quant: bool) -> float:
    blocks = -(-n // NF4_BLOCK)
    if double_quant:
        return n / 2 + blocks * 1 + -(-blocks // DOUBLE_QUANT_BLOCK) * 4
    return n / 2 + blocks * 4


@reducer("weight_bytes", when=lambda method, assumptions: method == "qlora" and assumptions != "seed")
def qlora(value, arch, weight_dtype_bytes, bnb_4bit_use_double_quant):
    """Frozen decoder-layer Linear weights in NF4: 0.5 B/param + absmax constants (double-quantised or fp32)."""
    q = quantized_param_count(arch)
    return int(value - q * weight_dtype_bytes + nf4_bytes(q, bnb_4bit_use_double_quant))


@hookimpl
def fitplan_register_reducers(register):
    register(lora)
    register(qlora)
