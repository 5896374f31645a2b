"""Which modules LoRA adapts: peft 0.21's ``target_modules`` semantics, in one place.

Used by the LoRA reducer (trainable adapter tensors), the step trace (where adapters run) and the
torch referee (what it asks peft for), so the three cannot disagree. peft
(``tuners/tuners_utils.py`` ``check_target_module_exists`` and ``_maybe_include_all_linear_layers``):

* ``"all-linear"``: every ``nn.Linear`` and ``Conv1D`` module except the output embedding (the LM head);
* a single string that is not a plain name: a regular expression, ``re.fullmatch`` against the module's
  full name (``model.layers.0.self_attn.q_proj``);
* a list of names: a module matches when its full name equals one, or ends with ``"." + name``.

For MoE models whose experts transformers 5 fuses into 3-D parameters (Mixtral, Qwen2-MoE), peft 0.21
converts the v4 expert names to ``target_parameters`` (``utils/transformers_weight_conversion.py``:
``w1``/``w3`` -> ``gate_up_proj`` with twice the rank, ``w2`` -> ``down_proj``, ``gate`` -> the
router's weight); the learned file carries that mapping (``lora.parameter_targets``), so "all-linear"
also adapts the experts and the router there, as peft does.
"""

from __future__ import annotations

import re
from typing import Any

from fitplan.errors import FitplanError

ALL_LINEAR = "all-linear"
_PLAIN = re.compile(r"^[A-Za-z0-9_.\-]+$")


def is_regex(targets: tuple[str, ...]) -> bool:
    return len(targets) == 1 and targets[0].lower() != ALL_LINEAR and not _PLAIN.match(targets[0])


def peft_target_modules(targets: tuple[str, ...]) -> str | list[str]:
    """What to pass to ``peft.LoraConfig(target_modules=...)`` for fitplan's ``lora_target_modules``: the
    string itself for ``all-linear`` and for a regular expression (peft treats a str as a regex), else a list."""
    if len(targets) == 1 and (targets[0].lower() == ALL_LINEAR or is_regex(targets)):
        return targets[0]
    return list(targets)


def module_matches(module: str, targets: tuple[str, ...], *, output_module: str | None = None) -> bool:
    """Does peft adapt the ``nn.Linear``/``Conv1D`` named ``module`` (full name) for ``targets``?"""
    if not targets:
        return False
    if len(targets) == 1 and targets[0].lower() == ALL_LINEAR:
        return module != output_module
    if is_regex(targets):
        return re.fullmatch(targets[0], module) is not None
    return any(module == t or module.endswith("." + t) for t in targets)


def lora_site_matches(module: str, targets: tuple[str, ...], af: Any) -> bool:
    """:func:`module_matches` with the output module of a learned architecture file. For a model type whose
    MoE layout peft 0.21 converts (the file's ``lora.parameter_targets``: Mixtral, Qwen3-MoE, DeepSeek...),
    the converted names (``gate_proj``, ``up_proj``, ``down_proj``, ``gate``, ``w1``...) leave the module
    targets for parameter targets (peft/utils/transformers_weight_conversion.py, ``_convert_peft_config_moe``):
    an ``nn.Linear`` of that name (a dense layer's MLP) gets no adapter."""
    converted = ((getattr(af, "lora", None) or {}).get("parameter_targets")) or {}
    if converted and module.rsplit(".", 1)[-1] in converted:
        return False
    return module_matches(module, targets, output_module=getattr(af, "output_module", None))


def embedding_matches(module: str, targets: tuple[str, ...]) -> bool:
    """Does peft wrap the ``nn.Embedding`` named ``module`` in a ``lora.Embedding``? By name or regular
    expression only: ``all-linear`` selects ``nn.Linear`` and ``Conv1D`` modules, never an embedding
    (peft ``tuners_utils.py`` ``_maybe_include_all_linear_layers``)."""
    if not targets or (len(targets) == 1 and targets[0].lower() == ALL_LINEAR):
        return False
    return module_matches(module, targets)


def unmatched_targets(targets: tuple[str, ...], modules: list[str]) -> list[str]:
    """Targets that match none of ``modules`` (peft raises for a list target that matches nothing)."""
    if not targets or (len(targets) == 1 and (targets[0].lower() == ALL_LINEAR or is_regex(targets))):
        if is_regex(targets) and not any(re.fullmatch(targets[0], m) for m in modules):
            return list(targets)
        return []
    return [t for t in targets if not any(m == t or m.endswith("." + t) for m in modules)]


def parameter_targets(af, targets: tuple[str, ...]) -> dict[str, int]:
    """peft's v4 -> v5 MoE conversion (``utils/transformers_weight_conversion.py``): which parameters the
    targets reach, with the rank multiplier of a fused parameter (``gate_up_proj``: w1 + w3 -> 2r)."""
    conv = af.lora.get("parameter_targets", {})
    if not conv:
        return {}
    if len(targets) == 1 and targets[0].lower() == ALL_LINEAR:
        chosen = set(conv)
    elif is_regex(targets):
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


def base_copies_input(seg: dict[str, Any], site: dict[str, Any]) -> bool:
    """Whether the base ``nn.Linear`` of ``site`` made its input contiguous (a ``clone`` of the site's input among
    its recorded ops: aten's ``linear`` -> ``matmul`` reshapes a non-contiguous 3-D input, a copy, before ``mm``;
    Mamba's ``x_proj`` reads ``hidden_states.transpose(1, 2)``, transformers 5.24 modeling_mamba.py). peft's
    ``lora_A`` then reads the same input: where peft passes it uncast (adapters in the input's dtype: 32-true),
    its ``F.linear`` copies it again, and ``mm`` saves that copy; a cast input is the copy ``mm`` reads."""
    return any(op[0] == "clone" and dict(op[1]).get("self") == site["input"]
               for op in seg["ops"][site["start"]:site["end"]])


def contiguous_input(inst, site: dict[str, Any], x, xd, label: str):
    """``lora_A``'s input: ``xd``, or, where peft passes the site's input ``x`` as it is and the base Linear copied
    it (:func:`base_copies_input`), the copy ``F.linear`` makes of it (a new tensor, saved by ``mm``)."""
    if xd is not x or inst.b.mixed or not base_copies_input(inst.seg, site):  # autocast's cast is mm's input
        return xd
    out = inst.b.tr.new(x.numel, x.dtype, False, label + ".lora_A.contiguous")
    inst.b.emit("clone", [("self", x)], [out], label=label + ".lora_A.contiguous")
    return out
