"""Which implementation shards the run (the "stack"), what the user's flags mean under it, and what it refuses.

A flag means what it means to the tool the user runs it with:

* ``--zero N`` (and ``--offload-*``, a ``*-master`` precision, a ds_config): **DeepSpeed** ZeRO-N as the HF
  Trainer drives it through accelerate. With nothing but ``--zero N`` the ds_config is the one accelerate
  writes for ``accelerate config`` without a file (accelerate/utils/dataclasses.py:1201-1221): the stage and
  the offload devices, every other key left to DeepSpeed's defaults (deepspeed/runtime/zero/config.py:
  ``reduce_bucket_size`` 5e8, ``overlap_comm`` only at stage 3, ``stage3_prefetch_bucket_size`` 5e7,
  ``stage3_param_persistence_threshold`` 1e5, ``stage3_max_live_parameters`` 1e9). A ds_config's ``"auto"``
  values are resolved as transformers/integrations/deepspeed.py:232-241 does (hidden², 0.9·hidden², 10·hidden).
* ``--fsdp MODE``: accelerate's FSDP as the HF Trainer configures it; the Trainer's default is **FSDP2**
  (``fsdp_config["version"]``, default 2: transformers/training_args.py:2826); ``--stack fsdp1`` for the
  deprecated FSDP1. Under FSDP1 the strategy comes from ``FSDP_SHARDING_STRATEGY`` (default FULL_SHARD)
  before the Trainer's value (accelerate/utils/dataclasses.py:1719-1728, accelerator.py:1919), so
  ``shard_grad_op`` runs FULL_SHARD: fitplan models what runs and says so (:func:`effective_fsdp_mode`).
* several GPUs and nothing else: **DDP**.
* ``--stack torch``: PyTorch-native sharding as fitplan-torch's plain referee runs it (ZeRO-1 = DDP +
  ``ZeroRedundancyOptimizer``, stages 2/3 = bare ``fully_shard`` on each decoder layer and the root).
"""

from __future__ import annotations

from typing import Any

from fitplan.errors import FitplanError
from fitplan.inputs.precision import PRESETS

STACK_NAMES = {
    "deepspeed": "DeepSpeed ZeRO-{stage}",
    "fsdp2": "FSDP2 (accelerate / HF Trainer, {mode})",
    "fsdp1": "FSDP1 (accelerate / HF Trainer, {mode})",
    "ddp": "DDP (PyTorch DistributedDataParallel)",
    "torch": "PyTorch-native {native}",
    "none": "single GPU (no data parallelism)",
}
DS_DEFAULTS = {"reduce_bucket_size": 500_000_000, "stage3_prefetch_bucket_size": 50_000_000,
               "stage3_param_persistence_threshold": 100_000, "stage3_max_live_parameters": 1_000_000_000,
               "stage3_max_reuse_distance": 1_000_000_000, "sub_group_size": 1_000_000_000}
"""DeepSpeed 0.19.8's defaults for absent keys (deepspeed/runtime/zero/config.py:113, 222, 228, 245, 251, 182)."""
FSDP1_STRATEGY_ENV_DEFAULT = "full_shard"
"""What FSDP1 runs when ``FSDP_SHARDING_STRATEGY`` is unset (accelerate/utils/dataclasses.py:1719-1728)."""


def resolve(stack: str | None, zero_stage: int, fsdp: str | None, offload_optimizer: bool, offload_params: bool,
            precision: str | None, data_parallel: int) -> str:
    """The stack that runs: the explicit ``--stack``, else what the other flags imply (module doc); ``precision``
    None: not decided yet (the HF words decide it once the stack is known)."""
    if stack:
        return stack
    if fsdp:
        return "fsdp2"
    if zero_stage or offload_optimizer or offload_params or (precision is not None and PRESETS[precision].master):
        return "deepspeed"
    return "ddp" if data_parallel > 1 else "none"


def effective_fsdp_mode(stack: str, fsdp: str | None, env_strategy: str | None = None) -> str | None:
    """The FSDP strategy that runs: FSDP1 ignores the Trainer's ``shard_grad_op`` / ``hybrid_shard`` and runs
    ``FSDP_SHARDING_STRATEGY`` (``env_strategy``, the scenario's ``fsdp_sharding_strategy``), FULL_SHARD when it is
    unset (module doc)."""
    if stack == "fsdp1" and fsdp:
        return env_strategy or FSDP1_STRATEGY_ENV_DEFAULT
    return fsdp


def describe(stack: str, zero_stage: int, fsdp: str | None, offload_optimizer: bool, offload_params: bool,
             env_strategy: str | None = None) -> str:
    """The stack in words, for every output (``DeepSpeed ZeRO-2 + optimizer offload``)."""
    mode = effective_fsdp_mode(stack, fsdp, env_strategy) or "full_shard"
    native = {0: "DDP", 1: "ZeRO-1 (DDP + ZeroRedundancyOptimizer)"}.get(zero_stage, f"FSDP2 fully_shard ({mode})")
    text = STACK_NAMES[stack].format(stage=zero_stage, mode=mode, native=native)
    if stack == "fsdp1" and fsdp and env_strategy:
        text += f" (FSDP_SHARDING_STRATEGY={env_strategy.upper()})"
    elif stack == "fsdp1" and fsdp and fsdp != mode:
        text += f"; --fsdp {fsdp} runs FULL_SHARD under FSDP1 unless FSDP_SHARDING_STRATEGY is set"
    extras = [w for w, on in (("optimizer", offload_optimizer), ("parameter", offload_params)) if on]
    if extras:
        text += " + " + " and ".join(extras) + " offload"
    return text


def check(stack: str | None, zero_stage: int, fsdp: str | None, offload_optimizer: bool, offload_params: bool,
          precision: str, data_parallel: int) -> str:
    """Resolve the stack and refuse what it cannot run, naming the flag. Returns the stack."""
    s = resolve(stack, zero_stage, fsdp, offload_optimizer, offload_params, precision, data_parallel)
    p = PRESETS[precision]
    if zero_stage and fsdp:
        raise FitplanError(f"--zero {zero_stage} (DeepSpeed) and --fsdp {fsdp} (FSDP) are two different stacks",
                           field="zero_stage", value=zero_stage, suggestion="give one: --zero N for DeepSpeed, --fsdp MODE for FSDP")
    if s == "deepspeed":
        _check_deepspeed(zero_stage, fsdp, offload_optimizer, offload_params, precision, p)
    elif s in ("fsdp1", "fsdp2"):
        _check_fsdp(s, zero_stage, fsdp, offload_optimizer, offload_params, precision, p)
    else:
        for flag, on in (("offload_optimizer", offload_optimizer), ("offload_params", offload_params)):
            if on:
                raise FitplanError(f"--{flag.replace('_', '-')} needs a stack that offloads: DeepSpeed ZeRO (--zero 1-3) or "
                                   f"FSDP (--fsdp ... with both offload flags); the stack here is {s}",
                                   field=flag, value=True, suggestion="add --zero 2 (DeepSpeed ZeRO-Offload) or drop the flag")
        if p.master:
            raise FitplanError(f"--precision {precision} (fp32 master weights beside 16-bit weights) is DeepSpeed's "
                               f"16-bit optimizer; --stack {s} has none", field="precision", value=precision,
                               suggestion="use --precision bf16-mixed (torch AMP) or bf16-true, or --stack deepspeed")
        if s == "ddp" and fsdp:
            raise FitplanError(f"--stack ddp does not shard: --fsdp {fsdp} is FSDP (--stack fsdp2 or fsdp1) or PyTorch-native "
                               "fully_shard (--stack torch)", field="fsdp", value=fsdp,
                               suggestion="drop --stack ddp, or drop --fsdp")
        if s == "ddp" and zero_stage:
            raise FitplanError(f"--stack ddp does not shard: --zero {zero_stage} needs DeepSpeed (--stack deepspeed) "
                               "or PyTorch-native ZeRO (--stack torch)", field="zero_stage", value=zero_stage)
    return s


def _check_deepspeed(zero_stage, fsdp, offload_optimizer, offload_params, precision, p) -> None:
    if fsdp:
        raise FitplanError(f"--fsdp {fsdp} is FSDP, not DeepSpeed", field="fsdp", value=fsdp,
                           suggestion="drop --stack deepspeed, or use --zero 3 (DeepSpeed's full sharding)")
    if offload_optimizer and zero_stage < 1:
        raise FitplanError("--offload-optimizer needs DeepSpeed ZeRO stage 1, 2 or 3 (zero_optimization.offload_optimizer "
                           "is a ZeRO feature: ZeRO-Offload)", field="offload_optimizer", value=True,
                           suggestion="add --zero 2 (the usual ZeRO-Offload), or drop --offload-optimizer")
    if offload_params and zero_stage < 3:
        raise FitplanError(f"--offload-params needs DeepSpeed ZeRO stage 3 (zero_optimization.offload_param partitions "
                           f"parameters, which stages 0-2 keep whole); stage here: {zero_stage}",
                           field="offload_params", value=True, suggestion="use --zero 3, or drop --offload-params")
    if not p.deepspeed:
        want = {"bf16": "bf16-master", "fp16": "16-master"}.get(p.compute_dtype, "32-true")
        raise FitplanError(f"DeepSpeed does not run --precision {precision}: with bf16/fp16 enabled it casts the model "
                           f"to 16 bits and keeps fp32 master weights and states (runtime/engine.py:2080-2088), "
                           f"without them it trains in fp32", field="precision", value=precision,
                           suggestion=f"use --precision {want} (what HF bf16=True/fp16=True gives under DeepSpeed; --bf16 picks it)")


def _check_fsdp(s, zero_stage, fsdp, offload_optimizer, offload_params, precision, p) -> None:
    if zero_stage:
        raise FitplanError(f"--zero {zero_stage} is DeepSpeed; --stack {s} shards with --fsdp full_shard / shard_grad_op",
                           field="zero_stage", value=zero_stage, suggestion="use --fsdp full_shard (≈ ZeRO-3) or shard_grad_op (≈ ZeRO-2)")
    if not fsdp:
        raise FitplanError(f"--stack {s} needs an FSDP strategy", field="fsdp", value=None,
                           suggestion="add --fsdp full_shard (or shard_grad_op, hybrid_shard)")
    if s == "fsdp2" and fsdp == "hybrid_shard":
        raise FitplanError("hybrid_shard is an FSDP1 strategy: the HF Trainer refuses it with FSDP2 "
                           "(transformers/training_args.py:2888-2938)", field="fsdp", value=fsdp,
                           suggestion="use --stack fsdp1, or --fsdp full_shard")
    if offload_optimizer != offload_params:
        flag = "offload_params" if offload_optimizer else "offload_optimizer"
        raise FitplanError("FSDP offloads parameters, gradients and the optimizer step together "
                           "(CPUOffload(offload_params=True); HF: --fsdp 'full_shard offload')",
                           field=flag, value=False, suggestion="give both --offload-optimizer and --offload-params, or neither")
    if p.master:
        raise FitplanError(f"--precision {precision} is DeepSpeed's 16-bit optimizer; FSDP keeps fp32 shards and gathers "
                           "them in bf16 (--precision bf16-mixed, HF bf16=True)", field="precision", value=precision,
                           suggestion="use --precision bf16-mixed")


DS_ONLY_FIELDS = ("reduce_bucket_size", "overlap_comm", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                  "stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size")
"""Scenario fields that are ``zero_optimization`` keys: they mean something under DeepSpeed only."""


def check_ds_only(stack: str, values: dict[str, Any]) -> None:
    """Refuse a DeepSpeed ``zero_optimization`` key (``values``: field -> value, None = not given) under another
    stack: no other stack reads it, so the estimate would silently ignore it."""
    if stack == "deepspeed":
        return
    for name in DS_ONLY_FIELDS:
        if values.get(name) is not None:
            raise FitplanError(f"--{name.replace('_', '-')} is a DeepSpeed zero_optimization key; the stack here is "
                               f"{stack}, which has no such setting", field=name, value=values[name],
                               suggestion="add --zero N (DeepSpeed), or drop the key")


def ds_value(value: Any, key: str, hidden: int) -> int:
    """A DeepSpeed size key's value in elements: the scenario's number, HF's "auto" rule, or DeepSpeed's default."""
    if value is None:
        return DS_DEFAULTS[key]
    if value == "auto":
        return {"reduce_bucket_size": hidden * hidden, "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                "stage3_param_persistence_threshold": 10 * hidden}.get(key, DS_DEFAULTS.get(key, 0))
    return int(float(value))


DS_CPU_OPTIMIZERS = {"adagrad": ("DeepSpeedCPUAdagrad", 1), "lion_32bit": ("DeepSpeedCPULion", 1)}
"""Under ZeRO ``offload_optimizer`` (cpu or nvme) accelerate replaces the Trainer's torch optimizer by a DeepSpeed
CPU optimizer (``map_pytorch_optim_to_deepspeed``, accelerate/utils/deepspeed.py:29-97, called when
``zero_force_ds_cpu_optimizer`` is true, its default: accelerator.py:2336-2346; DeepSpeed itself refuses any other
client optimizer then, runtime/engine.py:2342-2347): torch ``Adagrad`` -> ``DeepSpeedCPUAdagrad``, 32-bit
bitsandbytes ``Lion`` -> ``DeepSpeedCPULion`` (one fp32 state each), every other optimizer -> ``DeepSpeedCPUAdam``
(``exp_avg`` and ``exp_avg_sq`` in fp32, ``fp32_optimizer_states=True``: deepspeed/ops/adam/cpu_adam.py; its
``step`` a Python int, no step temporaries). HF ``optim`` names -> (class, fp32 states per element)."""
DS_CPU_ADAM_NAMES = frozenset({"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw_torch_xla",
                               "adamw_torch_npu_fused", "adamw_anyprecision", "paged_adamw_32bit", "adamw_bnb_32bit"})
"""The optimizers whose states DeepSpeedCPUAdam reproduces (two fp32 moments): no warning for them."""


def ds_cpu_optimizer(optim: str) -> tuple[str, int]:
    """The DeepSpeed CPU optimizer that runs under ZeRO optimizer offload for HF ``optim`` (see
    :data:`DS_CPU_OPTIMIZERS`), and its fp32 states per trainable element."""
    return DS_CPU_OPTIMIZERS.get(optim, ("DeepSpeedCPUAdam", 2))
