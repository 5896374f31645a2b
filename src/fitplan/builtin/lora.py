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


def adapter_tensors(arch, lora_r, lora_target_modules):
    """The LoRA A and B tensors peft 0.21 creates for ``lora_target_modules`` on ``arch``
    (:mod:`.lora_targets`): A (r, in) and B (out, r) per targeted ``nn.Linear`` / ``Conv1D``; for MoE
    models whose experts peft maps to parameter targets (the learned file's ``lora.parameter_targets``),
    ``lora.ParamWrapper`` factors A (r·E, in) and B (out, r·E) per expert stack (r doubled for the fused
    ``gate_up_proj``) and A (r, in), B (out, r) for a 2-D router weight."""
    from .lora_targets import ALL_LINEAR, module_matches, unmatched_targets

    targets = tuple(lora_target_modules)
    groups = arch.param_groups()
    out: dict[tuple[int, ...], int] = {}
    linear = [g for g in groups if g.linear is not None]
    output = "lm_head"
    from .archfile import load

    af = load(arch.model_type)
    output = af.output_module
    layers = arch.num_hidden_layers
    names: list[str] = []
    for g in linear:
        paths = [g.path.replace("{i}", str(i)) for i in range(layers)] if "{i}" in g.path else [g.path]
        per_path = g.count // max(1, len(paths)) if "{i}" in g.path else g.count
        for path in paths:
            names.append(path)
            if module_matches(path, targets, output_module=output):
                in_f, out_f = g.linear
                for shape in ((lora_r, in_f), (out_f, lora_r)):
                    out[shape] = out.get(shape, 0) + per_path
    param_targets = _parameter_targets(af, targets)
    for g in groups:
        leaf = g.name.rsplit(".", 1)[-1]
        key = next((t for t in param_targets if g.name.endswith("." + t)), None)
        if key is None:
            continue
        mult = param_targets[key]
        if len(g.shape) >= 3:
            e, out_f, in_f = g.shape[0], g.shape[-2], g.shape[-1]
            shapes = ((lora_r * mult * e, in_f), (out_f, lora_r * mult * e))
        else:
            out_f, in_f = g.shape[0], g.shape[-1]
            shapes = ((lora_r * mult, in_f), (out_f, lora_r * mult))
        names.append(g.name)
        del leaf
        for shape in shapes:
            out[shape] = out.get(shape, 0) + g.count
    missing = unmatched_targets(targets, names + list(_converted_names(af)))
    if missing or not out:
        modules = sorted({g.path.rsplit(".", 1)[-1] for g in linear} | set(_converted_names(af)))
        raise FitplanError(
            f"LoRA target module(s) {', '.join(missing) or ', '.join(targets)} not found in {arch.name}",
            field="lora_target_modules", value=",".join(targets),
            suggestion="modules of this model: " + ", ".join(modules) + f", or {ALL_LINEAR}",
        )
    return tuple(out.items())


def _converted_names(af) -> list[str]:
    return list(af.lora.get("parameter_targets", {}))


def _parameter_targets(af, targets: tuple[str, ...]) -> dict[str, int]:
    """peft's v4 -> v5 MoE conversion (``utils/transformers_weight_conversion.py``): which parameters the
    targets reach, with the rank multiplier of a fused parameter (``gate_up_proj``: w1 + w3 -> 2r)."""
    from .lora_targets import ALL_LINEAR, is_regex

    conv = af.lora.get("parameter_targets", {})
    if not conv:
        return {}
    if len(targets) == 1 and targets[0].lower() == ALL_LINEAR:
        chosen = set(conv)
    elif is_regex(targets):
        import re

        chosen = {k for k in conv if re.fullmatch(targets[0], k) or re.search(targets[0], k)}
    else:
        chosen = {k for k in conv if any(t == k or t.endswith("." + k) for t in targets)}
    out: dict[str, int] = {}
    for k in chosen:
        param, fused = conv[k]
        group = [o for o, (p2, _) in conv.items() if p2 == param]
        if fused > 1 and not all(o in chosen for o in group):
            raise FitplanError(f"LoRA target {k!r} is fused with {', '.join(sorted(set(group) - {k}))} into {param!r} "
                               "in transformers 5: peft needs them all", field="lora_target_modules", value=k)
        out[param] = fused if fused > 1 else 1
    return out


@reducer("trainable_tensors", when=lambda method: method in ("lora", "qlora"))
def lora(value, arch, lora_r, lora_target_modules):
    """Only the adapters train: A (r × in) and B (out × r) per targeted Linear (peft LoraConfig)."""
    return adapter_tensors(arch, lora_r, lora_target_modules)


def quantized_param_count(arch) -> int:
    """Parameters QLoRA stores in NF4: the ``nn.Linear`` / ``Conv1D`` weights inside the decoder layers
    (bitsandbytes replaces only those; fused 3-D expert parameters stay in 16-bit)."""
    return sum(g.total for g in arch.param_groups() if g.layer and g.linear is not None)


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
