"""The estimate report's GRPO/RLOO section: the generation round, each phase's peak, vLLM's share of the GPU
and a round's time split into generation and training (builtin/trl/grpo.py, vllm.py, builtin/time/generation.py).
Left out for the other trainers."""

from __future__ import annotations

from typing import Any

from fitplan.output.formats import ReportSection
from fitplan.pluginmgr.hookspecs import hookimpl
from fitplan.units import format_bytes


def _settings(o) -> dict[str, Any]:
    return {"trainer": o.trainer, "num_generations": o.num_generations,
            "max_completion_length": o.max_completion_length, "prompt_length": o.prompt_length,
            "generation_batch_size": o.generation_batch_size, "steps_per_generation": o.steps_per_generation,
            "sequences_per_process": o.local_generation_batch, "beta": o.beta, "old_log_probs": o.old_logps,
            "reference": o.reference, "training_processes": o.processes}


def online_json(est) -> dict[str, Any] | None:
    """The ``trl`` object: the round's settings, ``phases_bytes``, ``vllm`` (or null), ``round_seconds`` (or
    null), ``rounds``, the run's ``generation_seconds`` / ``training_seconds`` (null without a dataset size) and
    ``round_cost`` (without ``--provider``: a round at the cheapest bundled price; null otherwise)."""
    v = est.values
    o = v.get("online_settings")
    if o is None:
        return None
    rs, rounds = v.get("online_round_seconds"), v.get("online_rounds")
    gen = None if rs is None or rounds is None else rounds * (rs["generation"] + rs["scoring"])
    total = v.get("train_seconds")
    return {"settings": _settings(o), "phases_bytes": {k: int(x) for k, x in v["phase_bytes"].items()},
            "vllm": v.get("vllm_memory"), "vllm_sleep_headroom_bytes": v.get("vllm_sleep_headroom"), "round_seconds": rs, "rounds": rounds,
            "generation_seconds": gen, "training_seconds": None if gen is None or total is None else total - gen,
            "round_cost": v.get("online_round_cost")}


def _round_line(o) -> str:
    ref = {"none": "no reference model (beta 0)", "adapter": "reference = adapter disabled",
           "copy": "reference = a second model"}[o.reference]
    return (f"{o.trainer.upper()}: {o.generation_batch_size} sequences per round ({o.num_generations} per prompt, "
            f"{o.local_generation_batch} per process, every {o.steps_per_generation} micro-step(s)), prompt "
            f"{o.prompt_length} + completion {o.max_completion_length} tokens; {ref}"
            + ("; old log-probs scored" if o.old_logps else ""))


def _vllm_line(m, units: str) -> str:
    where = ("on its own GPU(s): " + str(m["server_gpus"]) if m["mode"] == "server" else
             "colocated, " + ("asleep outside generation" if m["sleep"] else "for the whole run"))
    return (f"{format_bytes(m['reserve_bytes'], units)} per GPU ({100 * m['utilization']:g} % of it, {where}): "
            f"weights {format_bytes(m['weights_bytes'], units)}, profiled activations ≈ "
            f"{format_bytes(m['activation_bytes'], units)}, KV cache {format_bytes(m['kv_cache_bytes'], units)} "
            f"({m['kv_blocks']:,} blocks, {m['kv_tokens']:,} tokens, {m['sequences_at_once']:,} sequences at once)")


def _time_line(rs, rounds, v) -> str:
    train = "n/a" if rs["training"] is None else f"{rs['training']:.2f} s"
    out = (f"per round: generation {rs['generation']:.2f} s (prefill {rs['prefill']:.2f} + decode "
           f"{rs['decode']:.2f}), scoring {rs['scoring']:.2f} s, training {train}")
    if rounds is not None and v.get("train_seconds") is not None:
        gen = rounds * (rs["generation"] + rs["scoring"])
        out += (f"; run: {rounds:,.0f} rounds, generation {gen / 3600:,.2f} h + training "
                f"{(v['train_seconds'] - gen) / 3600:,.2f} h")
    plan = v.get("instance_choice")
    if plan is not None and rs.get("total") is not None:
        out += f"; {rs['total'] * plan.on_demand_per_hour / 3600:,.4f} {plan.provider.currency} per round on demand"
    return out


def online_lines(est, units: str) -> list[tuple[str, str]]:
    v = est.values
    o = v.get("online_settings")
    if o is None:
        return []
    phases = ", ".join(f"{k} {format_bytes(x, units)}" for k, x in v["phase_bytes"].items())
    lines = [("round", _round_line(o)), ("phases", phases)]
    gen = v.get("generation_rows")
    if gen is not None:
        lines.append(("generation", f"KV cache {format_bytes(gen['kv_cache'], units)} (in the activations row), "
                                    f"sampling / prefill {format_bytes(gen['temporaries'], units)}"))
    if v.get("ref_model_bytes"):
        lines.append(("reference", f"{format_bytes(v['ref_model_bytes'], units)} (a second model, in the weights "
                                   "row of every phase)"))
    if v.get("vllm_memory") is not None:
        lines.append(("vLLM", _vllm_line(v["vllm_memory"], units)))
        if v["vllm_memory"]["mode"] == "colocate" and v.get("usable_bytes") is not None:
            left = format_bytes(v["usable_bytes"], units)
            if not v["vllm_memory"]["sleep"]:
                lines.append(("for training", f"{left} per GPU usable by the training process, vLLM's reserve "
                              "taken (awake for the whole run)"))
            else:
                room = v["vllm_sleep_headroom"]
                lines.append(("for training", f"{left} per GPU outside generation (vLLM asleep); in the generation "
                              f"phase, beside vLLM's reserve: {format_bytes(room, units)} left"
                              + ("" if room >= 0 else " (does NOT fit)")))
    if v.get("online_round_seconds") is not None:
        lines.append(("round time", _time_line(v["online_round_seconds"], v.get("online_rounds"), v)))
    if v.get("online_round_cost") is not None:
        lines.append(("round cost", _cost_line(v["online_round_cost"], v.get("gpu_spec"))))
    return lines


def _cost_line(c, spec) -> str:
    """Without ``--provider``: a round and an hour of rounds at the cheapest bundled on-demand GPU-hour, stated as
    such (builtin/trl/grpo.py ``online_round_cost``)."""
    cur = c["currency"]
    name = spec.name if spec is not None else "this GPU"
    return (f"{c['per_round']:,.4f} {cur} per round, {c['per_hour']:,.2f} {cur} per hour of rounds for "
            f"{c['gpus']} GPUs at the cheapest bundled on-demand price for {name} ({c['provider']} "
            f"{c['per_gpu_hour']:,.2f} {cur}/GPU-h); --provider prices a chosen one, --num-examples the run")


SECTION = ReportSection("trl", online_json, online_lines, order=25)


@hookimpl
def fitplan_register_report_sections(register):
    register(SECTION)
