"""From a fitplan Estimate to a plain, picklable description of the run (spawned ranks receive it)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class OptimizerRef:
    """The parts of an :class:`fitplan.OptimizerSpec` torch needs (the spec itself holds lambdas)."""

    name: str
    torch_class: str
    torch_kwargs: dict[str, Any]


@attrs.frozen
class RunConfig:
    model_name: str
    config: dict[str, Any]
    precision: str
    attn_implementation: str
    method: str
    lora: dict[str, Any]
    gradient_checkpointing: bool
    batch: int
    seq: int
    optimizer: OptimizerRef
    device: str
    fake: bool
    seed: int = 0
    zero_stage: int = 0
    fsdp: str | None = None
    world_size: int = 1
    memtracker: bool = True
    accumulation: int = 1
    stack: str = ""
    """The sharding implementation fitplan modelled (``deepspeed``, ``fsdp1``, ``fsdp2``, ``torch``, ``ddp``, ``none``)."""
    ds_config: dict[str, Any] = attrs.Factory(dict)
    """DeepSpeed: the ds_config fitplan modelled (its "auto" values resolved)."""
    ds_config_raw: dict[str, Any] = attrs.Factory(dict)
    """DeepSpeed through the HF Trainer (``driver="trainer"``): the user's ds_config as given, "auto" values and
    all, for ``TrainingArguments(deepspeed=...)`` to fill (:mod:`.trainer_ds`); empty: :attr:`ds_config`."""
    loss_implementation: str = "hf"
    """How the loss head runs (:mod:`.loss_heads`): ``hf`` or ``chunked``."""
    optimizer_in_bwd: bool = False
    """torchtune's ``optimizer_in_bwd`` (:mod:`.in_backward`)."""
    activation_offloading: str = "none"
    """Activation offloading (:mod:`.offload`): ``none``, ``sync`` (the CPU runs it) or ``streams`` (CUDA)."""
    driver: str = "accelerate"
    """accelerate FSDP: ``accelerate`` (``Accelerator.prepare`` and a bare step, :mod:`.accel_fsdp`) or ``trainer``
    (``Trainer.train()``, :mod:`.trainer_fsdp`); DeepSpeed: ``accelerate`` (``deepspeed.initialize`` driven
    directly, :mod:`.ds_stack`) or ``trainer`` (``Trainer.train()`` with ``deepspeed=``, :mod:`.trainer_ds`)."""
    use_orig_params: bool = True
    """FSDP1's ``use_orig_params`` (the Trainer's default True)."""
    fsdp1_strategy: str = ""
    """FSDP1: the ``FSDP_SHARDING_STRATEGY`` ``accelerate launch`` exports (empty: unset, FULL_SHARD)."""


def model_config(estimate) -> dict[str, Any]:
    from fitplan.api import hf_config_for

    return dict(hf_config_for(estimate.scenario, estimate.rulesets))


def run_config(estimate, options: dict[str, Any], mode: str) -> RunConfig:
    s = estimate.scenario
    spec = estimate["optimizer_spec"]
    lora = {"lora_r": s.lora.lora_r, "lora_alpha": s.lora.lora_alpha, "lora_target_modules": tuple(s.lora.lora_target_modules or ()),
            "lora_dropout": s.lora.lora_dropout, "bnb_4bit_use_double_quant": s.lora.bnb_4bit_use_double_quant,
            "bnb_4bit_compute_dtype": getattr(s.lora, "bnb_4bit_compute_dtype", None),
            "kbit_preparation": getattr(s.lora, "kbit_preparation", "peft"),
            "lora_modules_to_save": tuple(getattr(s.lora, "lora_modules_to_save", ()) or ())}
    return RunConfig(
        model_name=str(estimate.arch.name), config=model_config(estimate), precision=s.training.precision,
        attn_implementation=s.training.attn_implementation, method=s.model.method, lora=lora,
        gradient_checkpointing=bool(s.training.gradient_checkpointing), batch=s.training.per_device_train_batch_size,
        seq=s.training.max_seq_length, optimizer=OptimizerRef(spec.name, spec.torch_class, dict(spec.torch_kwargs)),
        device="cuda" if mode == "cuda" else "cpu", fake=mode == "fake", seed=int(options.get("seed", 0)),
        zero_stage=s.parallel.zero_stage, fsdp=s.parallel.fsdp, world_size=int(estimate["world_size"]),
        memtracker=bool(options.get("memtracker", True)), accumulation=s.training.gradient_accumulation_steps,
        stack=str(estimate["stack_name"]), ds_config=ds_config(estimate) if estimate["stack_name"] == "deepspeed" else {},
        loss_implementation=getattr(s.training, "loss_implementation", "hf"),
        optimizer_in_bwd=bool(getattr(s.training, "optimizer_in_bwd", False)),
        activation_offloading=str(getattr(s.training, "activation_offloading", "none")),
        driver=str(options.get("driver") or "accelerate"), use_orig_params=bool(options.get("use_orig_params", True)),
        fsdp1_strategy=str(options.get("fsdp1_strategy") or getattr(s.parallel, "fsdp_sharding_strategy", None) or ""),
        ds_config_raw=dict(options.get("ds_config") or {}),
    )


def ds_config(estimate) -> dict[str, Any]:
    """The ds_config fitplan modelled (``fitplan.output.exports.deepspeed_config``), with its "auto" values
    resolved as the HF Trainer would (the referee drives DeepSpeed without the Trainer) and the Trainer's
    ``gradient_clipping`` (``max_grad_norm`` 1.0)."""
    from fitplan.api import deepspeed_config

    cfg = deepspeed_config(estimate.scenario)
    values = estimate["deepspeed_config_values"]
    zero = cfg["zero_optimization"]
    for key, value in list(zero.items()):
        if value == "auto":
            zero[key] = int(values[key])
    cfg["gradient_clipping"] = 1.0
    cfg.pop("fp16", None) if not cfg.get("fp16", {}).get("enabled") else None
    return cfg
