"""How each figure is known: a confidence entry per memory row (and the peak) and for the training time.

An entry is ``{"level", "band", "basis", "short"}``:

============ ==================================================================================================
level        meaning
============ ==================================================================================================
exact        reproduced to the byte by the referee (fitplan-torch) on the CPU: the same rule, the same tensors
             (``docs/accuracy.md``: 192/192 tiny runs, real-size shapes under FakeTensorMode;
             ``tests/test_optimizer_names.py``: 68/68 optimizer states)
source       modelled from the cited source of what allocates it (CUDA kernels, DeepSpeed, FSDP, bitsandbytes
             on CUDA, the caching allocator), not measured on that device here
calibrated   fitted to measurements of this setup (an ``[[mfu_calibration]]`` row from ``fitplan validate``)
measured     a throughput someone measured (``--tokens-per-second``, a ``[[throughput]]`` table)
approximate  an approximation; ``band`` is its relative error when known (the default MFU's leave-one-out
             error, a constant of the framework ruleset)
============ ==================================================================================================

``band``: the relative half-width (0.3 = ±30 %) or null; ``basis``: one sentence saying why; ``short``: the
compact form the table prints. The peak takes the weakest level of the rows it is made of.
"""

from __future__ import annotations

import functools
from collections import namedtuple
from typing import Any

from fitplan.engine.declarations import quantity
from fitplan.pluginmgr.hookspecs import hookimpl

LEVELS = ("exact", "source", "calibrated", "measured", "approximate")
"""From the surest to the least sure (the peak takes the last of its rows' levels in this order)."""

_Optimizer = namedtuple("_Optimizer", "name source measured_on_cpu frees_gradients")
"""What the confidence rules read of an ``OptimizerSpec`` (hashable, for the cache)."""

@functools.lru_cache(maxsize=256)
def entry(level: str, basis: str, band: float | None = None) -> dict[str, Any]:
    short = {"exact": "exact", "source": "source", "calibrated": "calibrated", "measured": "measured",
             "approximate": "approx."}[level]
    if band:
        short = f"±{100 * band:.0f} %"
    return {"level": level, "band": band, "basis": basis, "short": short}


def _activations(device: str) -> dict[str, Any]:
    if device == "cpu":
        return entry("exact", "step trace = the referee's saved-tensor and live-storage counts on the CPU")
    return entry("source", "step trace of the CUDA kernels' saved tensors (SDPA backends, autocast, 512-byte "
                           "allocator blocks): exact under FakeTensorMode shapes, not measured on a GPU here")


def _optimizer(spec, sharded: bool) -> dict[str, Any]:
    if sharded:
        return entry("source", "per-rank partitions as DeepSpeed ZeRO / FSDP allocate them (source)")
    if spec.measured_on_cpu:
        return entry("exact", f"{spec.name}: state bytes measured through the HF Trainer on the CPU "
                              "(fp32 and bf16), equal to the formula")
    return entry("source", f"{spec.name}: formula from {spec.source or 'its plugin'} (not measured here)")


def _temporaries(device: str, spec, peak_phase: str) -> dict[str, Any]:
    if peak_phase == "optimizer_step" and not spec.name.startswith(("adamw_torch", "sgd")):
        return entry("approximate", f"{spec.name}'s step temporaries: CPU code paths measured, the CUDA path read "
                                    "from source or estimated")
    return _activations(device)


CROSS_AUTOCAST = ("bf16-autocast-fp16w", "16-autocast-bf16w")
"""Autocast over 16-bit weights of the other 16-bit dtype: replayed on the graph recorded over fp32 weights
(``learned_graph.dtype_map``), whose embedding output and first residual add are fp32 where the run has the
load dtype (the referee, tiny Llama and Qwen2 on the CPU: activations +0.7 to +1.9 %, peak +0.2 to +7.9 %
with checkpointing: tests/test_hf_defaults.py)."""


def _cross_autocast() -> dict[str, Any]:
    return entry("approximate", "autocast over 16-bit weights of another dtype: the autocast graph recorded over "
                                "fp32 weights, with the weights in their load dtype (referee: up to +8 % at the peak)",
                 0.08)


FROM_THE_FILE = ("weights", "gradients", "activations", "logits", "autocast_copies", "temporaries")
"""The rows a learned architecture file gives (its parameter list and its step graphs)."""


def _unverified(path: str) -> dict[str, Any]:
    return entry("approximate", f"the learned architecture file {path} was written with `fitplan learn-architecture "
                                "--no-verify`: no fresh torch run checked its parameters and step graphs")


@quantity("confidence", json_key="memory.confidence", type="object", role="confidence")
def memory_confidence(device, method, optimizer_spec, shard_stage, shard_degree, peak_breakdown, peak_phase, precision,
                      arch, activation_offloading, load_in_8bit):
    """How each row of the peak breakdown (and the peak itself) is known: ``{row: entry}`` (module doc). The rows
    a learned file written with ``--no-verify`` gives are approximate (``ModelSpec.unverified``)."""
    o = optimizer_spec
    used = tuple(r for r, b in peak_breakdown.items() if b)
    derived = ("8-bit LoRA: bitsandbytes' MatMul8bitLt read from its source (the CPU runs another Function)"
               if load_in_8bit else "activation offloading with streams: the forward stash read from torchtune's and "
               "TRL's source (the referee runs it without streams)" if activation_offloading in ("torchtune", "trl")
               else None)
    return _memory_confidence(device, method, (o.name, o.source, o.measured_on_cpu, o.frees_gradients),
                              bool(shard_stage) and shard_degree > 1, used, peak_phase, precision in CROSS_AUTOCAST,
                              getattr(arch, "unverified", None), derived, bool(load_in_8bit))


@functools.lru_cache(maxsize=1024)
def _memory_confidence(device, method, optimizer, sharded, used, peak_phase, cross_autocast=False, unverified=None,
                       derived=None, int8=False):
    optimizer_spec = _Optimizer(*optimizer)
    acts = _cross_autocast() if cross_autocast else entry("source", derived) if derived else _activations(device)
    rows = {
        "weights": entry("source", "bitsandbytes LLM.int8 storage, int8 and an fp32 scale per row (source)") if int8
        else entry("source", "bitsandbytes NF4 storage with double quantisation (source)") if method == "qlora"
        else entry("exact", "parameter count × bytes per weight, as the referee counts them"),
        "master_weights": entry("source", "DeepSpeed / Megatron fp32 master copy (source)"),
        "gradients": entry("approximate", f"{optimizer_spec.name} frees each gradient as backward produces it: "
                                          "about one tensor's gradient") if optimizer_spec.frees_gradients
        else entry("exact", "one gradient per trainable parameter, in its dtype"),
        "optimizer_states": _optimizer(optimizer_spec, sharded),
        "activations": acts, "logits": acts, "autocast_copies": acts,
        "temporaries": acts if cross_autocast or derived else _temporaries(device, optimizer_spec, peak_phase),
        "comm_buffers": entry("source", "DDP buckets / DeepSpeed buffers sized from their source defaults"),
        "gathered_params": entry("source", "FSDP / ZeRO-3 all-gathered layers (source; 4 of 6 sharded CPU runs exact)"),
        "other": entry("exact", "buffers, the batch, allocator rounding"),
        "framework_overhead": entry("approximate", "CUDA context and allocator reserve: constants of the framework "
                                                   "ruleset, vary with the driver and the library versions"),
    }
    if unverified:
        rows.update({r: _unverified(unverified) for r in FROM_THE_FILE})
    worst = max((rows[r]["level"] for r in used if r in rows), key=LEVELS.index, default="exact")
    weakest = [r for r in used if r in rows and rows[r]["level"] == worst]
    bands = [rows[r]["band"] for r in weakest if rows[r]["band"]]
    rows["peak"] = entry(worst, "the weakest of the rows the peak is made of: " + ", ".join(weakest),
                         max(bands) if bands else None)
    return rows


@quantity("confidence", json_key="time.confidence", type="object")
def time_confidence(train_seconds, tokens_per_second, measured_tokens_per_second, mfu, mfu_calibrated,
                    step_time_calibration, rulesets):
    """How the training time is known (module doc): given or published throughput (measured), a calibrated MFU
    or step time (``fitplan calibrate``), or the roofline over the step's kernels (approximate, with the time
    model's worst leave-one-out error over the published fine-tuning runs as its band)."""
    if train_seconds is None:
        return None
    if tokens_per_second is not None:
        return entry("measured", "throughput given with --tokens-per-second")
    if measured_tokens_per_second is not None:
        return entry("measured", "a published throughput of the [[throughput]] tables")
    if mfu is not None:
        return entry("approximate", "FLOPs model at the MFU given with --mfu")
    if mfu_calibrated is not None:
        return entry("calibrated", "FLOPs model at an MFU measured on this GPU ([[mfu_calibration]])")
    if step_time_calibration is not None:
        return entry("calibrated", "roofline step time scaled to your run on this GPU ([[time_calibration]])")
    model = rulesets.time_model
    if model is None:
        return entry("approximate", "roofline over the step's kernels (no fitted time model: no band)")
    return entry("approximate", f"roofline over the step's kernels, fitted on {model.runs} published runs "
                 f"(leave-one-out error: median {100 * model.loo_median:.0f} %, worst {100 * model.loo_worst:+.0f} %)",
                 abs(model.loo_worst))


@hookimpl
def fitplan_register_quantities(register):
    register(memory_confidence)
    register(time_confidence)
