"""The built-in sections of the estimate report: memory, time and cost (JSON objects and summary lines).

A third-party plugin adds its own section the same way (``fitplan_register_report_sections``). Sections
read the estimate's values; they never evaluate anything. Every quantity's ``json_key`` metadata names
where the JSON below puts it (tests/test_layout.py checks that they agree).
"""

from __future__ import annotations

from typing import Any

from fitplan.builtin.lora import qlora_line
from fitplan.output.formats import ReportSection
from fitplan.pluginmgr.hookspecs import hookimpl
from fitplan.rulesets.pricing import gpu_offers
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
        "defaults": list(v.get("assumed_defaults") or ()),
        "parallel": stack_json(est),
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


def stack_json(est) -> dict[str, Any]:
    """Which stack shards (``parallel.stack``, its words in ``stack_description``), over how many ranks, the
    ds_config values its rules used (DeepSpeed) and the stated assumptions of QLoRA."""
    v = est.values
    out: dict[str, Any] = {"stack": v["stack_name"], "stack_description": v["stack_description"],
                           "shard_degree": v["shard_degree"], "data_parallel_degree": v["data_parallel_degree"]}
    if v["stack_name"] == "deepspeed":
        out["ds_config"] = dict(v["deepspeed_config_values"])
    if est.scenario.model.method == "qlora":
        out["kbit_preparation"] = est.scenario.lora.kbit_preparation
    return out


def ds_config_text(est) -> str:
    """The DeepSpeed values the rules used, each with where it came from."""
    p = est.scenario.parallel
    vals = est.values["deepspeed_config_values"]
    parts = []
    for key in ("reduce_bucket_size", "overlap_comm", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                "stage3_max_reuse_distance", "sub_group_size"):
        if key.startswith(("stage3", "sub_group")) and p.zero_stage != 3:
            continue
        given = getattr(p, key)
        if given is None and key in ("stage3_max_reuse_distance", "sub_group_size"):
            continue  # named only when the scenario or a ds_config sets them
        how = "DeepSpeed default" if given is None else ('HF "auto"' if given == "auto" else "given")
        value = vals[key]
        parts.append(f"{key} {value:g} ({how})" if not isinstance(value, bool) else f"{key} {str(value).lower()} ({how})")
    return ", ".join(parts)


def liger_text(model_type: str) -> str:
    """What the setup line says under ``liger_kernel`` (trace/liger.py): that Liger is assumed, and how it is known."""
    from fitplan.trace.liger import patched_types

    if model_type not in patched_types():
        return f", use_liger_kernel (Liger patches nothing for {model_type})"
    return ", Liger-Kernel's RMSNorm, SwiGLU and RoPE kernels (derived from its source, not measured)"


def memory_lines(est, units: str) -> list[tuple[str, str]]:
    v = est.values
    s = est.scenario
    stack = v["stack_description"] + (f" over {v['data_parallel_degree']} GPUs" if v["stack_name"] != "none" else "")
    if v["stack_name"] == "deepspeed":
        stack += "; ds_config " + ds_config_text(est)
    lines = [
        ("model", f"{est.arch.name} ({format_count(v['param_count'])} params, {format_count(v['trainable_param_count'])} trainable)"),
        ("setup", f"{s.model.method}, {s.training.precision}, {v['optimizer_spec'].name}, micro-batch "
                  f"{s.training.per_device_train_batch_size} × seq {s.training.max_seq_length}"
                  + (", grad. checkpointing" if s.training.gradient_checkpointing else "")
                  + (f", activation offloading ({off})" if (off := getattr(s.training, "activation_offloading", "none"))
                     != "none" else "")
                  + (liger_text(est.arch.model_type) if getattr(s.training, "liger_kernel", False) else "")),
        ("stack", stack),
        ("assumptions", s.model.assumptions),
        *([("defaults", "; ".join(v["assumed_defaults"]))] if v.get("assumed_defaults") else []),
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
    bits = 8 if getattr(s.lora, "load_in_8bit", False) else 4
    q = qlora_line(v, est.arch, s.lora.kbit_preparation, bits)
    if q:
        lines.append((f"{bits}-bit", q))
    if v.get("optimizer_host_bytes"):
        lines.append(("CPU RAM (optimizer)", format_bytes(v["optimizer_host_bytes"], units)
                      + f" per process ({v['optimizer_spec'].name} keeps its states in host memory)"))
    return lines


def _num(v: Any) -> Any:
    return None if v is None else (int(v) if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 2**53) else v)


def likely_range(est) -> dict[str, Any] | None:
    """What the time's likely range is (null without a modelled time: no dataset, or a throughput given or
    measured): the factors on the modelled time and where they come from."""
    band, model = est.values.get("time_band"), est.rulesets.time_model
    if band is None or model is None or est.values.get("train_seconds") is None:
        return None
    return {"low_factor": band[0], "high_factor": band[1], "percentiles": list(model.band_percentiles),
            "runs": model.runs, "loo_median_error": model.loo_median, "loo_worst_error": model.loo_worst,
            "basis": band[2]}


def time_json(est) -> dict[str, Any]:
    """The ``time`` section: tokens, FLOPs, seconds and their likely range, throughput, MFU, the shares of the
    step (null when unknown)."""
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
        "seconds_low": v.get("train_seconds_low"),
        "seconds_high": v.get("train_seconds_high"),
        "likely_range": likely_range(est),
        "tokens_per_second": v.get("train_tokens_per_second"),
        "throughput_basis": v.get("throughput_basis"),
        "mfu": v.get("train_mfu"),
        "assumed_mfu": v.get("assumed_mfu"),
        "peak_flops_per_gpu": v.get("peak_flops_per_gpu"),
        "matmul_dtype": v.get("matmul_dtype"),
        "step_seconds": v.get("step_seconds"),
        "compute_seconds_per_step": v.get("compute_seconds_per_step"),
        "communication_share": v.get("communication_share"),
        "communication": _comm_json(v),
        "optimizer_share": v.get("optimizer_step_share"),
        "confidence": v.get("time_confidence"),
    }}


def _comm_json(v) -> dict[str, Any]:
    """Bytes per collective per step (``comm_volumes``) and where the GPUs sit (``topology``)."""
    vol = v.get("comm_volumes") or {}
    return {"volumes_bytes": {k: _num(x) for k, x in vol.items() if k not in ("overlap", "ranks", "windows", "calls")},
            "calls": vol.get("calls"), "ranks": vol.get("ranks"), "overlap": vol.get("overlap"),
            "topology": v.get("topology")}


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
        "on_demand_usd_low": v.get("on_demand_cost_usd_low"),
        "on_demand_usd_high": v.get("on_demand_cost_usd_high"),
        "spot_usd_low": v.get("spot_cost_usd_low"),
        "spot_usd_high": v.get("spot_cost_usd_high"),
        "on_demand_usd_per_run": None if v.get("on_demand_cost_usd") is None else v["on_demand_cost_usd"] / runs,
        "spot_usd_per_run": None if v.get("spot_cost_usd") is None else v["spot_cost_usd"] / runs,
        "provider": est.scenario.cost.provider,
        "instance": None if plan is None else plan.instance.id,
        "instance_count": None if plan is None else plan.count,
        "gpus_paid": None if plan is None else plan.gpus_paid,
        "gpus_used": v.get("world_size"),
        "gpus_idle": None if plan is None else max(0, plan.gpus_paid - v["world_size"]),
        "region": None if plan is None else plan.instance.region,
        "on_demand_per_hour": None if plan is None else plan.on_demand_per_hour,
        "spot_per_hour": None if plan is None else plan.spot_per_hour,
        "billing": None if plan is None else plan.provider.billing,
        "billed_seconds_on_demand": v.get("billed_seconds_on_demand"),
        "billed_seconds_spot": v.get("billed_seconds_spot"),
        "spot_overhead": None if plan is None else plan.provider.spot_overhead,
        "spot_risk": _spot_risk_json(v),
        "currency": v.get("cost_currency") or "USD",
    }
    return {"cost": out}


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:,.2f} h ({seconds:,.0f} s)"


def _likely(low: float | None, high: float | None, fmt) -> str:
    return "" if low is None or high is None else f", likely {fmt(low)}-{fmt(high)}"


def time_lines(est, units: str) -> list[tuple[str, str]]:
    v = est.values
    if v.get("train_tokens") is None:
        if v.get("online_settings") is not None:  # GRPO/RLOO: the dataset is its prompts (builtin/time/generation.py)
            return [("time", "give --num-examples (the prompts) to estimate the run's time and cost")]
        return [("time", "give --num-examples and --tokens-per-example (or --total-tokens) to estimate time and cost")]
    s = est.scenario
    d = s.dataset
    if v.get("online_settings") is not None and d.num_examples is not None:  # the prompts: online_train_tokens
        return _online_tokens(est) + _timed_lines(est, v)
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
    return lines + _timed_lines(est, v)


def _online_tokens(est) -> list[tuple[str, str]]:
    """GRPO/RLOO's training tokens: prompts × completions per prompt × (prompt + completion) × epochs
    (builtin/time/generation.py ``online_train_tokens``; the dataset's padding plays no part)."""
    v, o = est.values, est.values["online_settings"]
    how = (f"{est.scenario.dataset.num_examples:,} prompts × {o.num_generations} completions × "
           f"({o.prompt_length} + {o.max_completion_length}) tokens × {est.scenario.training.num_train_epochs:g} epoch(s)")
    return [("tokens", f"{v['train_tokens']:,.0f} trained ({how})"),
            ("FLOPs", f"{v['flops_per_token']:.3g} per token, {v['train_flops']:.3g} in all")]


def _timed_lines(est, v) -> list[tuple[str, str]]:
    """The time, its likely range, the optimizer step's share and the network (needs a time)."""
    lines: list[tuple[str, str]] = []
    if v.get("train_seconds") is None:
        lines.append(("time", "needs --gpu (or --tokens-per-second / --throughput-source)"))
        return lines
    tps = f"{v['train_tokens_per_second']:,.0f} tokens/s, {v['throughput_basis']}"
    if v.get("online_settings") is not None:  # the tokens/s and MFU are the training step's; the time adds generation
        tps = f"{v['train_tokens_per_second']:,.0f} tokens/s while training (plus each round's generation and " \
              f"scoring: the round time line), {v['throughput_basis']}"
    if v.get("train_mfu") is not None:
        tps += f"; achieved MFU {100 * v['train_mfu']:.1f} %"
        if v["train_mfu"] > 1:
            tps += f" (over 100 %: impossible at the {v.get('matmul_dtype')} peak; check --precision)"
    if v.get("communication_share") is not None:
        tps += f"; communication {100 * v['communication_share']:.1f} % of the step"
    likely = _likely(v.get("train_seconds_low"), v.get("train_seconds_high"), lambda x: f"{x / 3600:,.2f}")
    known = v.get("time_confidence")
    how = f" [{known['short']}: {known['basis']}]" if known else ""
    lines.append(("time", f"{_duration(v['train_seconds'])}{likely + ' h' if likely else ''} at {tps}{how}"))
    band = likely_range(est)
    if band is not None:
        lines.append(("likely range", f"× {band['low_factor']:.2f} to × {band['high_factor']:.2f}: {band['basis']} "
                                      f"(median error {100 * band['loo_median_error']:.0f} %)"))
    if v.get("optimizer_step_share") is not None:
        lines.append(("optimizer step", f"{100 * v['optimizer_step_share']:.1f} % of each step (update and gradient "
                                        f"clipping, whatever the batch)"))
    net = network_line(v)
    if net:
        lines.append(("network", net))
    return lines


def network_line(v) -> str | None:
    """When the GPUs span instances: how many, and what their collectives cross (the network)."""
    topo = v.get("topology")
    if not topo or topo["instances"] <= 1 or topo["gpus"] <= 1:
        return None
    vol = v.get("comm_volumes") or {}
    total = sum(vol.get(c, 0.0) for c in ("all_gather", "reduce_scatter", "all_reduce"))  # data-parallel bytes
    inside = f"{topo['gpus_per_instance']} GPU(s) each" + (f" over {topo['intra']}" if topo["gpus_per_instance"] > 1 else "")
    secs = v.get("comm_seconds_per_step")
    t = f", {secs:.3g} s of collectives per step" if secs else ""
    return (f"{topo['instances']} instances ({inside}): the collectives cross the network at "
            f"{topo['network_gbps']:g} GB/s per GPU ({format_bytes(total, 'GB')} per step{t}; {topo['source']})")


def missing_provider(est, shown: int = 4) -> str:
    """The cost line without ``--provider``: which providers rent this GPU, cheapest per GPU-hour first
    (:func:`fitplan.rulesets.pricing.gpu_offers`), so the user can pick one; no cost is guessed."""
    spec = est.values.get("gpu_spec")
    if spec is None:
        return "give --provider (and --gpu) to price it"
    offers = gpu_offers(est.rulesets, spec.id)
    if not offers:
        return f"give --provider to price it (no bundled provider rents {spec.name})"
    listed = ", ".join(f"{p.id} {price:,.2f} {p.currency}" for p, price in offers[:shown])
    more = f", {len(offers) - shown} more" if len(offers) > shown else ""
    return f"give --provider to price it ({spec.name} per GPU-hour on demand: {listed}{more})"


def cost_lines(est, units: str) -> list[tuple[str, str]]:
    v = est.values
    if v.get("gpu_hours") is None:
        return []
    runs = est.scenario.cost.runs
    plan = v.get("instance_choice")
    lines = [("GPU-hours", f"{v['gpu_hours']:,.2f}" + (f" ({runs} runs)" if runs > 1 else ""))]
    if plan is None:
        lines.append(("cost", missing_provider(est)))
        return lines
    cur = v.get("cost_currency") or "USD"
    per = f" for {runs} runs" if runs > 1 else ""
    money = lambda x: f"{x:,.2f}"  # noqa: E731
    spot = ("no spot price" if v.get("spot_cost_usd") is None else
            f"{v['spot_cost_usd']:,.2f} {cur} spot{_likely(v.get('spot_cost_usd_low'), v.get('spot_cost_usd_high'), money)}"
            + _spot_risk_text(v, plan))
    od = _likely(v.get("on_demand_cost_usd_low"), v.get("on_demand_cost_usd_high"), money)
    lines.append(("cost", f"{v['on_demand_cost_usd']:,.2f} {cur} on demand{od}, {spot}{per}"))
    lines.append(("instances", f"{plan.count} × {plan.provider.id} {plan.instance.id} ({plan.instance.gpus} × {plan.instance.gpu}"
                               + (f", {plan.instance.region}" if plan.instance.region else "") + f"), {plan.on_demand_per_hour:,.2f} {cur}/h"
                               + f", billed per {plan.provider.billing}"))
    idle = idle_line(plan, v["world_size"])
    if idle:
        lines.append(("billing", idle))
    return lines


def moe_json(est) -> dict[str, Any] | None:
    """The MoE routing statement (``moe_routing``: what memory assumes about tokens per expert), MoE models only."""
    r = est.values.get("moe_routing")
    return {"moe_routing": r} if r else None


def moe_lines(est, units: str) -> list[tuple[str, str]]:
    r = est.values.get("moe_routing")
    return [("MoE routing", r["assumption"])] if r else []


def idle_line(plan, used: int) -> str | None:
    """The explicit line when more GPUs are paid than used (instances come in fixed shapes)."""
    if plan.gpus_paid <= used:
        return None
    return (f"{plan.gpus_paid} GPUs paid, {used} used: {plan.gpus_paid - used} idle "
            f"({plan.instance.id} comes with {plan.instance.gpus} GPUs; the cost counts them all)")


SECTIONS = (
    ReportSection("memory", memory_json, memory_lines, order=10),
    ReportSection("moe", moe_json, moe_lines, order=15),
    ReportSection("time", time_json, time_lines, order=20),
    ReportSection("cost", cost_json, cost_lines, order=30),
)


def _spot_risk_json(v) -> dict:
    """The spot interruption model's numbers (:mod:`fitplan.builtin.spot_risk`; None where it does not apply)."""
    return {"checkpoint_bytes": v.get("checkpoint_bytes"), "checkpoint_seconds": v.get("checkpoint_seconds"),
            "mean_seconds_between_interruptions": v.get("spot_mtbi_seconds"),
            "checkpoint_interval_seconds": v.get("spot_checkpoint_interval_seconds"),
            "lost_seconds_per_interruption": v.get("spot_lost_seconds_per_interruption"),
            "time_factor": v.get("spot_time_factor")}


def _spot_risk_text(v, plan) -> str:
    """How spot time is lengthened: the interruption model (billed hours, checkpoint interval), or the flat overhead,
    which leaves spot unpriced for risk."""
    if v.get("spot_cost_usd") is None:
        return ""
    tau = v.get("spot_checkpoint_interval_seconds")
    if tau is None:
        if not plan.provider.spot_overhead:  # a reference table (the seed's) assumes no overhead
            return ""
        return (f" (+{100 * plan.provider.spot_overhead:g} % assumed interruption overhead: no interruption rate "
                "stated, spot unpriced for risk)")
    return (f" ({v['billed_seconds_spot'] / 3600:,.2f} h billed expected: checkpoint every {tau / 60:,.1f} min, "
            f"{v['spot_lost_seconds_per_interruption'] / 60:,.1f} min lost per interruption, one every "
            f"{v['spot_mtbi_seconds'] / 3600:,.2f} h)")


@hookimpl
def fitplan_register_report_sections(register):
    for s in SECTIONS:
        register(s)
