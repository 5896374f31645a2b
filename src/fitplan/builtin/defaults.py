"""What the estimate assumed where the user said nothing: the pinned stack's own defaults, named.

transformers 5.24 / torch 2.13 decide these when a training script leaves them out; fitplan takes the same
values (``fitplan.inputs.scenario``'s defaults and ``fitplan.estimation.with_precision``) and every report
says which it took, so that a reader can tell an assumption from a choice:

* the load dtype: ``from_pretrained(dtype="auto")`` (modeling_utils.py: ``dtype=None`` becomes ``"auto"``),
  the config's ``dtype``/``torch_dtype``, else the checkpoint weights' dtype (assumed float32);
* the optimizer: ``TrainingArguments.optim``'s default on torch >= 2.8, ``adamw_torch_fused``
  (training_args.py ``default_optim``);
* the attention kernel: ``sdpa`` (``PreTrainedModel._check_and_adjust_attn_implementation`` picks SDPA when
  none is asked for and the model supports it);
* the loss: the model's ``ForCausalLMLoss`` (loss/loss_utils.py), which upcasts the logits to fp32 before
  cross-entropy (``loss_implementation = "hf"``; the others: trace/loss_heads.py).
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity
from fitplan.errors import FitplanError
from fitplan.inputs.precision import HF_WORD, hf_precision
from fitplan.inputs.scenario import Training
from fitplan.pluginmgr.hookspecs import hookimpl

import attrs

_TRAINING = {f.name: f.default for f in attrs.fields(Training)}


def _load_line(dtype, precision, bf16, fp16, arch, stack_name) -> str | None:
    """``dtype auto → bfloat16 (config.json) → bf16-autocast`` when the load dtype decided the preset, else None."""
    if dtype != "auto":
        return None
    learned = getattr(arch, "family", "") == "learned"
    loaded = (getattr(arch, "checkpoint_dtype", None) if learned else None) or "fp32"
    flag = "bf16" if bf16 else "fp16" if fp16 else None
    try:
        decided = hf_precision(flag, loaded, deepspeed=stack_name == "deepspeed")
    except FitplanError:
        decided = None
    if decided != precision:
        return None  # a named preset decided it
    where = ("config.json" if learned and getattr(arch, "checkpoint_dtype", None) else
             "none in config.json: float32 assumed" if learned else "no config: float32")
    return f"dtype auto → {HF_WORD[loaded]} ({where}) → {precision}"


@quantity("text", type="object", json_key="defaults")
def assumed_defaults(dtype, precision, bf16, fp16, optim, attn_implementation, arch, stack_name, assumptions,
                     loss_implementation, trainer, beta, method, precompute_ref_log_probs, cpo_alpha, loss_type):
    """The defaults of the pinned stack this estimate assumed (module doc), one phrase each; empty under
    ``--assumptions seed`` (the tutorial chapter's own simplifications apply). TRL's preference trainers
    replace the loss's phrase by theirs (builtin/trl/preference.py ``assumed_lines``)."""
    if assumptions == "seed":
        return []
    out = []
    load = _load_line(dtype, precision, bf16, fp16, arch, stack_name)
    if load:
        out.append(load)
    if optim == _TRAINING["optim"]:
        out.append(f"optim {optim} (HF default)")
    if attn_implementation == _TRAINING["attn_implementation"]:
        out.append(f"attention {attn_implementation} (HF default)")
    from fitplan.builtin.trl import preference, reference_free

    if trainer in preference.PREFERENCE:
        out += preference.assumed_lines(trainer, beta, method, precompute_ref_log_probs)
    elif trainer in reference_free.REFERENCE_FREE:
        out += reference_free.assumed_lines(trainer, beta, cpo_alpha, loss_type)
    elif trainer == "reward":
        out.append("loss RewardTrainer's -logsigmoid(chosen - rejected) on the score head (no LM head, no logits)")
    elif loss_implementation == _TRAINING["loss_implementation"]:
        out.append("loss ForCausalLMLoss (fp32 logits)")
    return out


@hookimpl
def fitplan_register_quantities(register):
    register(assumed_defaults)


@hookimpl
def fitplan_register_reducers(register):
    from fitplan.builtin.trl.grpo import online_defaults  # GRPO/RLOO's TRL defaults, on this plugin's quantity

    register(online_defaults)
