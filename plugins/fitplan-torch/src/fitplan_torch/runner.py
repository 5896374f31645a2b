"""``fitplan validate``: choose a mode, run the scenario, compare with the estimate.

Modes:

* ``cpu``: the real model with random weights on the CPU. Exact for everything a CPU allocates; see
  :data:`CPU_CAVEATS` for what differs from CUDA. Refused when the run would not fit in RAM.
* ``fake``: the same step under ``FakeTensorMode`` on the CPU device: real shapes and dtypes, no
  memory, no compute. Real-size models (7B-70B) in seconds; byte-identical to ``cpu`` on small models.
* ``cuda``: the real model on the GPU; adds ``torch.cuda.max_memory_allocated``, reserved memory,
  step time and tokens/s; can write a calibrated ``[framework]`` ruleset (``calibrate_out``).
* ``auto``: ``cuda`` when a GPU is visible, else ``cpu`` when the run fits in RAM, else ``fake``.

Sharded scenarios (``--zero`` / ``--fsdp`` with ``--num-gpus N``) run per rank: two real gloo ranks
on the CPU when N = 2, else one process with torch's fake process group (see :mod:`.distributed`).
DeepSpeed (:mod:`.ds_stack`) and accelerate's FSDP1 / FSDP2 (:mod:`.accel_fsdp`) always run N real gloo ranks.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

from fitplan.api import FitplanError

from . import _deps

MODES = ("auto", "cpu", "fake", "cuda")
TRAINER_STACKS = ("fsdp1", "fsdp2", "deepspeed")
"""Stacks ``--driver trainer`` runs through ``Trainer.train()`` (:mod:`.trainer_fsdp`, :mod:`.trainer_ds`)."""
COMPONENTS = ("parameters", "gradients", "optimizer_states", "activations", "peak")
PREDICTED = {"parameters": ("row", "weights"), "gradients": ("row", "gradients"),
             "optimizer_states": ("row", "optimizer_states"), "activations": ("role", "saved"), "peak": ("role", "peak")}
"""What the referee measures -> the quantity fitplan predicts it with, found by its breakdown row or role."""


def predicted_quantity(estimate, component: str) -> str:
    """The name of the quantity that predicts a measured ``component`` (through the quantities' metadata)."""
    kind, key = PREDICTED[component]
    compiled = estimate.registry.compiled()
    if kind == "role":
        return compiled.role(key)
    return next(name for name, q in compiled.quantities.items() if q.row == key)
def predicted_row(estimate, row: str) -> str:
    compiled = estimate.registry.compiled()
    return next(name for name, q in compiled.quantities.items() if q.row == row)


def host_and_device_peak(estimate) -> int:
    """On the CPU referee the GPU's and the host's bytes share one memory: each phase's device bytes plus
    the offloaded ones (and the host optimizer's temporaries during the step)."""
    host = dict(estimate["offload_host_bytes"])
    temp = host.pop("step_temp", 0)
    resident = sum(host.values())
    phases = estimate["phase_bytes"]
    return int(max(v + resident + (temp if k == "optimizer_step" else 0) for k, v in phases.items()))


CPU_CAVEATS = (
    "CPU dropout saves a mask in the input dtype (CUDA: 1 byte per element)",
    "CPU SDPA with dropout > 0 takes the decomposed math path (probabilities materialised)",
    "kernel scratch is invisible on the CPU; no 512-byte rounding, allocator reserve or CUDA context",
)
RAM_FRACTION = 0.5
"""A real CPU run is refused when fitplan's predicted peak exceeds this fraction of available RAM."""


def relative_error(predicted: int, measured: int) -> float | None:
    """``(predicted − measured) / measured``: positive when fitplan over-predicts."""
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return (predicted - measured) / measured


def component(predicted: int, measured: int) -> dict[str, Any]:
    return {"predicted": int(predicted), "measured": int(measured), "relative_error": relative_error(predicted, measured)}


def available_ram() -> int:
    """MemAvailable from /proc/meminfo (Linux), else total physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def choose_mode(estimate, options: dict[str, Any]) -> str:
    mode = options.get("mode") or "auto"
    if mode not in MODES:
        raise FitplanError(f"unknown validation mode {mode!r}", field="--mode", value=mode, suggestion="one of " + ", ".join(MODES))
    torch = _deps.torch()
    if mode == "cuda" and not torch.cuda.is_available():
        raise FitplanError("--mode cuda needs a CUDA GPU, and torch sees none", field="--mode", value=mode,
                           suggestion="use --mode cpu (small models) or --mode fake (any size)")
    if mode == "auto":
        if torch.cuda.is_available() and _fits_on_gpu(estimate, options):
            return "cuda"
        return "cpu" if _fits_in_ram(estimate, options) else "fake"
    if mode == "cuda" and not _fits_on_gpu(estimate, options):
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        raise FitplanError(
            f"this run is too large for this GPU: fitplan predicts a {estimate['peak_bytes'] / 2**30:.1f} GiB peak per rank "
            f"and the GPU has {total / 2**30:.1f} GiB", field="--mode", value="cuda",
            suggestion="use --mode fake (FakeTensorMode: real shapes, no memory)")
    if mode == "cpu" and not _fits_in_ram(estimate, options):
        limit = _ram_limit(options)
        raise FitplanError(
            f"this run is too large for real CPU memory: fitplan predicts a {estimate['peak_bytes'] / 2**30:.1f} GiB peak per rank, "
            f"and a real CPU run is allowed {limit / 2**30:.1f} GiB ({RAM_FRACTION:.0%} of available RAM)",
            field="--mode", value="cpu", suggestion="use --mode fake (FakeTensorMode: real shapes, no memory)")
    return mode


def _ram_limit(options: dict[str, Any]) -> int:
    return int(options.get("max_cpu_bytes") or RAM_FRACTION * available_ram())


def _fits_in_ram(estimate, options: dict[str, Any]) -> bool:
    ranks = _real_ranks(estimate, options)
    return estimate["peak_bytes"] * max(1, ranks) <= _ram_limit(options)


GPU_FRACTION = 0.9
"""A CUDA run is refused when fitplan's predicted peak exceeds this fraction of the GPU's memory."""


def _fits_on_gpu(estimate, options: dict[str, Any]) -> bool:
    torch = _deps.torch()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return estimate["peak_bytes"] <= GPU_FRACTION * total


def _world(estimate) -> int:
    return int(estimate["world_size"])


def sharded(estimate) -> bool:
    """Data parallel over more than one GPU (DDP, ZeRO-1, FSDP2) or any DeepSpeed run: measured per rank."""
    return _world(estimate) > 1 or engine_stack(estimate)


def deepspeed(estimate) -> bool:
    return estimate["stack_name"] == "deepspeed"


def engine_stack(estimate) -> bool:
    """DeepSpeed or accelerate's FSDP: engines that need one real gloo process per rank, on the CPU."""
    return estimate["stack_name"] in ("deepspeed", "fsdp1", "fsdp2")


def check_supported(estimate) -> None:
    """What the referee cannot run, refused with a reason."""
    s = estimate.scenario
    trainer = getattr(getattr(s, "trl", None), "trainer", "sft")
    if trainer != "sft":
        raise FitplanError(f"fitplan validate runs the HF Trainer's step, not TRL's {trainer!r} trainer", field="trainer",
                           value=trainer, suggestion="TRL's trainers are measured by fitplan_torch.trl_referee (measure_dpo, "
                           "measure_orpo, measure_reward) and fitplan_torch.grpo (tests/test_trl_*.py, docs/trl.md)")
    loss = getattr(s.training, "loss_implementation", "hf")
    from .loss_heads import check

    check(loss)
    if getattr(s.training, "liger_kernel", False):
        raise FitplanError("the torch referee cannot run Liger-Kernel's RMSNorm, SwiGLU and RoPE kernels: they are "
                           "Triton (CUDA) code (tests/test_liger_kernels.py derives them from Liger's source)",
                           field="liger_kernel", value=True, suggestion="validate the scenario without liger_kernel")
    if loss != "hf" and sharded(estimate):
        raise FitplanError("the torch referee runs a chunked loss on one device only", field="loss_implementation",
                           value=loss, suggestion="validate the chunked loss with --num-gpus 1")
    if getattr(s.lora, "load_in_8bit", False):
        raise FitplanError("the torch referee does not build 8-bit models: bitsandbytes 0.50.2 trains them with "
                           "MatMul8bitFp on the CPU and MatMul8bitLt on CUDA (autograd/_functions.py matmul), so a CPU "
                           "run would not measure what a GPU keeps (tests/test_int8_lora.py derives it from the source)",
                           field="load_in_8bit", value=True, suggestion="validate the 4-bit QLoRA scenario")
    offload = getattr(s.training, "activation_offloading", "none")
    if offload != "none" and sharded(estimate):
        raise FitplanError("the torch referee runs activation offloading on one device only",
                           field="activation_offloading", value=offload, suggestion="validate it with --num-gpus 1")
    if offload != "none" and (offload != "trl_sync" or loss != "hf"):
        raise FitplanError("the torch referee runs TRL's activation offloading without streams around the model's "
                           "own loss (CUDA streams need a GPU; tests/test_offload.py derives the stream's stash from the "
                           "source)", field="activation_offloading", value=offload,
                           suggestion="validate activation_offloading = \"trl_sync\" with loss_implementation = \"hf\"")
    if s.parallel.tensor_parallel > 1:
        raise FitplanError("the torch referee does not implement tensor parallelism", field="tensor_parallel",
                           value=s.parallel.tensor_parallel, suggestion="validate with --tensor-parallel 1")
    stack = estimate["stack_name"]
    if (s.parallel.offload_optimizer or s.parallel.offload_params) and stack != "deepspeed":
        raise FitplanError("the torch referee runs CPU offload under DeepSpeed only (FSDP's CPUOffload pins host memory, "
                           "which needs an accelerator: torch/distributed/fsdp/_flat_param.py, _fsdp_param.py pin_memory)",
                           field="offload_optimizer", value=True,
                           suggestion="validate the scenario without --offload-optimizer / --offload-params")
    if stack in ("fsdp1", "fsdp2") and s.training.precision not in ("32-true", "bf16-mixed", "bf16-true"):
        raise FitplanError("the accelerate FSDP referee runs fp32 and bf16 on the CPU", field="precision",
                           value=s.training.precision, suggestion="validate bf16-mixed (the same memory layout as 16-mixed)")
    if stack in ("fsdp1", "fsdp2") and s.model.method == "qlora":
        raise FitplanError("the accelerate FSDP referee does not run QLoRA (bitsandbytes' 4-bit storage under FSDP)",
                           field="method", value="qlora", suggestion="validate LoRA under FSDP, or QLoRA on one GPU")
    if stack == "deepspeed" and s.training.precision not in ("32-true", "bf16-master"):
        raise FitplanError("DeepSpeed's CPU accelerator refuses fp16 on CPUs without fp16 support (deepspeed/runtime/"
                           "engine.py:2003, accelerator/cpu_accelerator.py:228-233)", field="precision",
                           value=s.training.precision, suggestion="validate bf16-master (the same memory layout)")
    if s.parallel.fsdp == "hybrid_shard" and s.hardware.num_nodes > 1:
        raise FitplanError("the torch referee runs hybrid_shard on one node only", field="fsdp", value="hybrid_shard",
                           suggestion="validate one node (--num-nodes 1), where hybrid_shard is full_shard")


def _real_ranks(estimate, options: dict[str, Any]) -> int:
    if not sharded(estimate):
        return 1
    if engine_stack(estimate):  # DeepSpeed and accelerate need real ranks: every rank is its own process
        return _world(estimate)
    return _world(estimate) if _world(estimate) <= int(options.get("max_real_ranks", 2)) else 1


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes"):
        try:  # package metadata: importing deepspeed would print its accelerator banner on stdout
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def run_validation(scenario, estimate, options: dict[str, Any]) -> dict[str, Any]:
    """The ``fitplan_validate`` hook's body."""
    _deps.torch()
    _deps.transformers()
    options = dict(options or {})
    check_supported(estimate)
    mode = choose_mode(estimate, options)
    steps = int(options.get("steps") or 1)
    if steps < 1:
        raise FitplanError(f"--steps must be >= 1, got {steps}", field="--steps", value=steps)
    if options.get("calibrate_out") and mode != "cuda":
        raise FitplanError("--calibrate-out measures CUDA's framework overhead (context, cuBLAS workspace, allocator "
                           "reserve), which does not exist on the CPU or under FakeTensorMode",
                           field="--calibrate-out", value=options["calibrate_out"],
                           suggestion="run it on a GPU machine with --mode cuda")
    if (options.get("driver") or "accelerate") != "accelerate" and estimate["stack_name"] not in TRAINER_STACKS:
        raise FitplanError("--driver trainer runs accelerate's FSDP or DeepSpeed through the HF Trainer; this "
                           f"scenario's stack is {estimate['stack_name']}", field="--driver", value=options.get("driver"),
                           suggestion="add --fsdp full_shard (or --zero N), or leave --driver out")
    from .estimation_bridge import run_config

    cuda_estimate = estimate
    estimate = comparable_estimate(estimate, mode)
    rc = run_config(estimate, options, mode)
    if engine_stack(estimate) and mode != "cpu":
        what = "DeepSpeed referee runs real gloo ranks on the CPU (DS_ACCELERATOR=cpu)" if deepspeed(estimate) else \
            "accelerate FSDP referee runs real gloo ranks on the CPU"
        raise FitplanError(f"the {what}", field="--mode", value=mode, suggestion="use --mode cpu on a small model")
    if sharded(estimate):
        from .distributed import run_sharded

        result = run_sharded(rc, steps=steps, real_ranks=_real_ranks(estimate, options) if mode == "cpu" else 1)
    else:
        from .single import run_single

        result = run_single(rc, steps=steps)
    report = make_report(estimate, result, mode, rc)
    if estimate is not cuda_estimate:
        report["predicted_for_device"] = referee_device(mode)
        report["notes"].append(f"predictions are fitplan's for --device {referee_device(mode)} (the kernels this referee ran); "
                               f"for --device {cuda_estimate.scenario.hardware.device} fitplan predicts a peak of "
                               f"{int(cuda_estimate['peak_bytes'])} bytes")
    if options.get("calibrate_out"):
        from .calibrate import calibration_from_measurement, write_framework_toml

        cal = calibration_from_measurement(result["cuda_calibration"])
        rows = mfu_rows(estimate, report)
        write_framework_toml(options["calibrate_out"], cal, rows)
        report["calibration"] = {"file": str(options["calibrate_out"]), "framework": cal, "mfu_calibration": rows}
    return report


def mfu_rows(estimate, report: dict[str, Any]) -> list[dict[str, Any]]:
    """An ``[[mfu_calibration]]`` row when the scenario names its GPU and the step was timed on CUDA:
    MFU = tokens/s × FLOPs per token / (peak FLOP/s of one GPU)."""
    s = estimate.scenario
    tps = report.get("tokens_per_second")
    try:
        peak = estimate["peak_flops_per_gpu"]
        per_token = estimate["flops_per_token"]
    except FitplanError:
        return []
    if not (s.hardware.gpu and tps and peak and per_token):
        return []
    mfu = tps * per_token / peak
    if not 0 < mfu <= 1:
        return []
    import datetime

    return [{"gpu": s.hardware.gpu, "mfu": round(mfu, 4), "model": s.model.model or "", "method": s.model.method,
             "source": f"fitplan validate --calibrate-out, {report['device']}, b={s.training.per_device_train_batch_size} "
                       f"s={s.training.max_seq_length} {s.training.precision}",
             "date": datetime.date.today().isoformat()}]


def referee_device(mode: str) -> str:
    return "cuda" if mode == "cuda" else "cpu"


def comparable_estimate(estimate, mode: str):
    """The estimate for the device whose kernels the referee runs: fitplan's ``hardware.device`` (cuda or
    cpu) changes what it predicts (CPU dropout masks, AdamW's step scalars, allocator rounding); a CPU or
    FakeTensorMode run is compared with the ``cpu`` prediction. Cores without the field are used as is."""
    hw = estimate.scenario.hardware
    want = referee_device(mode)
    if not hasattr(hw, "device") or hw.device == want:
        return estimate
    from fitplan.api import evaluate

    return evaluate(estimate.scenario.replace(device=want), estimate.registry, estimate.rulesets)


def make_report(estimate, result: dict[str, Any], mode: str, rc) -> dict[str, Any]:
    m = result["measurement"]
    measured = {
        "parameters": m["parameters"],
        "gradients": m["gradients"],
        "optimizer_states": m["optimizer_states"],
        "activations": m["retained"],
        "peak": m["cuda"]["max_memory_allocated"] if m.get("cuda") else m["peak"],
    }
    predicted = {k: estimate[predicted_quantity(estimate, k)] for k in COMPONENTS}
    if "master_weights" in m:  # DeepSpeed: the engine's own tensors, device and host (offload) together
        host = estimate["offload_host_bytes"]
        for k, row in (("master_weights", "master_weights"), ("comm_buffers", "comm_buffers")):
            measured[k] = m[k]
            predicted[k] = estimate[predicted_row(estimate, row)]
        for k, h in (("parameters", "weights"), ("master_weights", "master_weights"), ("gradients", "gradients"),
                     ("optimizer_states", "optimizer_states")):
            predicted[k] += host[h]
        predicted["peak"] = host_and_device_peak(estimate)
    components = {k: component(predicted[k], measured[k]) for k in predicted}
    predicted_phase = str(estimate["peak_phase"])
    report: dict[str, Any] = {
        "mode": mode,
        "device": result["device"],
        "model": rc.model_name,
        "world_size": result.get("world_size", 1),
        "rank": result.get("rank", 0),
        "components": components,
        "peak_phase": {"predicted": predicted_phase, "measured": m["peak_phase"]},
        "measured": m,
        "step_seconds": m["step_seconds"],
        "versions": versions(),
        "notes": list(result.get("notes", ())),
    }
    if mode == "cpu":
        report["notes"].extend(CPU_CAVEATS)
    if m.get("cuda"):
        tokens = rc.batch * rc.seq
        secs = m["cuda"].get("uninstrumented_step_seconds") or m["step_seconds"]
        report["tokens_per_second"] = tokens / secs if secs else None
        report["counter_peak"] = m["peak"]
    if "ranks" in result:
        report["ranks"] = result["ranks"]
    return report
