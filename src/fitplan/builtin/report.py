"""The built-in sections of the estimate report: memory, time and cost (JSON objects and summary lines).

A third-party plugin adds its own section the same way (``fitplan_register_report_sections``). Sections
read the estimate's values; they never evaluate anything. Every quantity's ``json_key`` metadata names
where the JSON below puts it (tests/test_layout.py checks that they agree).
"""

from __future__ import annotations

from typing import Any

from fitplan.output.formats import ReportSection
from fitplan.pluginmgr.hookspecs import hookimpl
from fitplan.units import format_bytes, format_count


def memory_json(est) -> dict[str, Any]:
    """The model, the GPU, the optimizer and the ``memory`` object: per-GPU bytes of each component (the
    quantities whose ``json_key`` is ``memory.per_gpu_bytes.*``), the peak's phase and each phase's bytes,
    the GPU's usable memory, the verdict and the CPU RAM of offload."""
    v = est.values
    arch = est.arch
    gpu = v["gpu_spec"]
    per_gpu = {q.json_key.rsplit(".", 1)[1]: int(v[name]) for name, q in est.registry.compiled().quantities.items()
               if q.json_key.startswith("memory.per_gpu_bytes.") and name in v}
    return {
        "assumptions": est.scenario.model.assumptions,
        "model": {"name": arch.name, "family": arch.family, "param_count": v["param_count"],
                  "trainable_param_count": v["trainable_param_count"], "source": arch.source},
        "gpu": None if gpu is None else {"id": gpu.id, "name": gpu.name, "usable_bytes": gpu.usable_bytes},
        "optimizer": v["optimizer_spec"].name,
        "world_size": v["world_size"],
        "memory": {
            "per_gpu_bytes": per_gpu,
            "peak_breakdown_bytes": dict(v["peak_breakdown"]),
            "confidence": v.get("memory_confidence"),
            "peak_phase": v["peak_phase"],
            "phases_bytes": {k: int(x) for k, x in v["phase_bytes"].items()},
            "usable_bytes": v["usable_bytes"],
            "fits": v["fits"],
            "headroom_bytes": v["headroom_bytes"],
            "cpu_offload_bytes": v["cpu_offload_bytes"],
            "optimizer_host_bytes": v.get("optimizer_host_bytes", 0),
            "unit": "bytes",
        },
    }


def memory_lines(est, units: str) -> list[tuple[str, str]]:
    v = est.values
    s = est.scenario
    sharded = f", ZeRO-{v['shard_stage']} over {v['shard_degree']} GPUs" if v["shard_stage"] and v["shard_degree"] > 1 else ""
    lines = [
        ("model", f"{est.arch.name} ({format_count(v['param_count'])} params, {format_count(v['trainable_param_count'])} trainable)"),
        ("setup", f"{s.model.method}, {s.training.precision}, {v['optimizer_spec'].name}, micro-batch "
                  f"{s.training.per_device_train_batch_size} × seq {s.training.max_seq_length}"
                  + (", grad. checkpointing" if s.training.gradient_checkpointing else "") + sharded),
        ("assumptions", s.model.assumptions),
        ("peak (allocated)", f"{format_bytes(v['peak_bytes'], units)} at {v['peak_phase'].replace('_', ' ')}"
         + (f" [{v['memory_confidence']['peak']['short']}]" if v.get("memory_confidence") else "")),
        ("device total", format_bytes(v["device_total_bytes"], units) + " (peak + CUDA context + allocator reserve)"),
    ]
    if v["gpu_spec"] is not None:
        verdict = "fits" if v["fits"] else "does NOT fit"
        lines.append(("GPU", f"{v['gpu_spec'].name}: {format_bytes(v['usable_bytes'], units)} usable, {verdict} "
                             f"(headroom {format_bytes(v['headroom_bytes'], units)})"))
    if v["cpu_offload_bytes"]:
        lines.append(("CPU RAM (offload)", format_bytes(v["cpu_offload_bytes"], units) + " per node"))
    if v.get("optimizer_host_bytes"):
        lines.append(("CPU RAM (optimizer)", format_bytes(v["optimizer_host_bytes"], units)
                      + f" per process ({v['optimizer_spec'].name} keeps its states in host memory)"))
    return lines


def _num(v: Any) -> Any:
    return None if v is None else (int(v) if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 2**53) else v)


def time_json(est) -> dict[str, Any]:
    """The ``time`` section: tokens, FLOPs, seconds, throughput, MFU, communication share (null when unknown)."""
    v = est.values
    return {"time": {
        "tokens": _num(v.get("train_tokens")),
        "dataset_tokens": _num(v.get("dataset_tokens")),
        "padding_tokens": _num(v.get("padding_tokens")),
        "truncated_tokens": _num(v.get("truncated_tokens")),
        "flops_per_token": _num(v.get("flops_per_token")),
        "flops": _num(v.get("train_flops")),
        "seconds": v.get("train_seconds"),
        "hours": None if v.get("train_seconds") is None else v["train_seconds"] / 3600,
        "tokens_per_second": v.get("train_tokens_per_second"),
        "throughput_basis": v.get("throughput_basis"),
        "mfu": v.get("train_mfu"),
        "assumed_mfu": v.get("assumed_mfu"),
        "peak_flops_per_gpu": v.get("peak_flops_per_gpu"),
        "matmul_dtype": v.get("matmul_dtype"),
        "step_seconds": v.get("step_seconds"),
        "communication_share": v.get("communication_share"),
        "confidence": v.get("time_confidence"),
    }}


def cost_json(est) -> dict[str, Any]:
    """The ``cost`` section: GPU-hours, on-demand and spot totals over ``runs`` (null when unknown), in ``currency``."""
    v = est.values
    plan = v.get("instance_choice")
    runs = est.scenario.cost.runs
    out: dict[str, Any] = {
        "gpu_hours": v.get("gpu_hours"),
        "runs": runs,
        "on_demand_usd": v.get("on_demand_cost_usd"),
        "spot_usd": v.get("spot_cost_usd"),
        "on_demand_usd_per_run": None if v.get("on_demand_cost_usd") is None else v["on_demand_cost_usd"] / runs,
        "spot_usd_per_run": None if v.get("spot_cost_usd") is None else v["spot_cost_usd"] / runs,
        "provider": est.scenario.cost.provider,
        "instance": None if plan is None else plan.instance.id,
        "instance_count": None if plan is None else plan.count,
        "gpus_paid": None if plan is None else plan.gpus_paid,
        "region": None if plan is None else plan.instance.region,
        "on_demand_per_hour": None if plan is None else plan.on_demand_per_hour,
        "spot_per_hour": None if plan is None else plan.spot_per_hour,
        "billing": None if plan is None else plan.provider.billing,
        "billed_seconds_on_demand": v.get("billed_seconds_on_demand"),
        "billed_seconds_spot": v.get("billed_seconds_spot"),
        "spot_overhead": None if plan is None else plan.provider.spot_overhead,
        "currency": v.get("cost_currency") or "USD",
    }
    return {"cost": out}


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:,.2f} h ({seconds:,.0f} s)"


def time_lines(est, units: str) -> list[tuple[str, str]]:
    v = est.values
    if v.get("train_tokens") is None:
        return [("time", "give --num-examples and --tokens-per-example (or --total-tokens) to estimate time and cost")]
    s = est.scenario
    d = s.dataset
    how = (f"dataset {d.dataset_path}" if d.dataset_path else
           f"{d.num_examples:,} examples × {d.tokens_per_example:,.0f} tokens" if d.total_tokens is None
           else f"{d.total_tokens:,} tokens") + f" × {s.training.num_train_epochs:g} epoch(s)"
    mode = {"pack": "packed", "pad": f"padded to {s.training.max_seq_length}", "longest": "padded to the longest "
            "in each micro-batch", "group_by_length": "grouped by length, padded to the longest",
            "padding_free": "padding-free"}.get(d.padding, d.padding)
    tokens = f"{v['train_tokens']:,.0f} ({how}, {mode})"
    if v.get("padding_tokens"):
        tokens += f"; {v['padding_tokens']:,.0f} of them padding ({100 * v['padding_tokens'] / v['train_tokens']:.1f} %)"
    if v.get("truncated_tokens"):
        tokens += f"; {v['truncated_tokens']:,.0f} tokens truncated"
    lines = [("tokens", tokens),
             ("FLOPs", f"{v['flops_per_token']:.3g} per token, {v['train_flops']:.3g} in all")]
    if v.get("train_seconds") is None:
        lines.append(("time", "needs --gpu (or --tokens-per-second / --throughput-source)"))
        return lines
    tps = f"{v['train_tokens_per_second']:,.0f} tokens/s, {v['throughput_basis']}"
    if v.get("train_mfu") is not None:
        tps += f"; achieved MFU {100 * v['train_mfu']:.1f} %"
        if v["train_mfu"] > 1:
            tps += f" (over 100 %: impossible at the {v.get('matmul_dtype')} peak; check --precision)"
    if v.get("communication_share") is not None:
        tps += f"; communication {100 * v['communication_share']:.1f} % of the step"
    known = v.get("time_confidence")
    how = f" [{known['short']}: {known['basis']}]" if known else ""
    lines.append(("time", f"{_duration(v['train_seconds'])} at {tps}{how}"))
    return lines


def cost_lines(est, units: str) -> list[tuple[str, str]]:
    v = est.values
    if v.get("gpu_hours") is None:
        return []
    runs = est.scenario.cost.runs
    plan = v.get("instance_choice")
    lines = [("GPU-hours", f"{v['gpu_hours']:,.2f}" + (f" ({runs} runs)" if runs > 1 else ""))]
    if plan is None:
        lines.append(("cost", "give --provider (and --gpu) to price it"))
        return lines
    cur = v.get("cost_currency") or "USD"
    per = f" for {runs} runs" if runs > 1 else ""
    spot = ("no spot price" if v.get("spot_cost_usd") is None else
            f"{v['spot_cost_usd']:,.2f} {cur} spot" + (f" (+{100 * plan.provider.spot_overhead:g} % interruption overhead)"
                                                        if plan.provider.spot_overhead else ""))
    lines.append(("cost", f"{v['on_demand_cost_usd']:,.2f} {cur} on demand, {spot}{per}"))
    lines.append(("instances", f"{plan.count} × {plan.provider.id} {plan.instance.id} ({plan.instance.gpus} × {plan.instance.gpu}"
                               + (f", {plan.instance.region}" if plan.instance.region else "") + f"), {plan.on_demand_per_hour:,.2f} {cur}/h"
                               + f", billed per {plan.provider.billing}"))
    return lines


def moe_json(est) -> dict[str, Any] | None:
    """The MoE routing statement (``moe_routing``: what memory assumes about tokens per expert), MoE models only."""
    r = est.values.get("moe_routing")
    return {"moe_routing": r} if r else None


def moe_lines(est, units: str) -> list[tuple[str, str]]:
    r = est.values.get("moe_routing")
    return [("MoE routing", r["assumption"])] if r else []


SECTIONS = (
    ReportSection("memory", memory_json, memory_lines, order=10),
    ReportSection("moe", moe_json, moe_lines, order=15),
    ReportSection("time", time_json, time_lines, order=20),
    ReportSection("cost", cost_json, cost_lines, order=30),
)


@hookimpl
def fitplan_register_report_sections(register):
    for s in SECTIONS:
        register(s)
