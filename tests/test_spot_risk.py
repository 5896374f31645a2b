"""Spot risk (fitplan.builtin.spot_risk): where a provider states an interruption rate and the instance its
checkpoint bandwidth, spot time is priced with Young's checkpoint interval and the work lost per interruption;
otherwise with the provider's flat ``spot_overhead``, and the report says spot is unpriced for risk.

Hand derivation for a bare 1B-parameter model, full fine-tuning in fp32 with torch AdamW (``32-true``: no master
copy): the checkpoint holds 4 B of weights and 8 B of Adam states (``exp_avg``, ``exp_avg_sq`` in fp32:
torch/optim/adamw.py) per parameter, 12e9 bytes; at 1 GB/s, C = 12 s. With λ = 0.5 interruptions per hour,
M = 7200 s; τ = √(2 · 12 · 7200) = √172800 = 415.692 s; L = (τ + C)/2 + C = 225.846 s;
factor = (1 + C/τ) / (1 − L/M) = 1.028868 / 0.968633 = 1.062185.
Every test states ``optim`` and ``precision``.
"""

from __future__ import annotations

import math

import pytest

import fitplan

RULESET = """
[[gpu]]
id = "spotgpu"
name = "spot test GPU"
memory_bytes = 200_000_000_000
usable_bytes = 200_000_000_000
bandwidth_gbps = 1000
interconnect_gbps = 100
gpus_per_node = 8
peak_tflops = {{ fp32 = 50, bf16 = 500 }}
source = "test fixture"

[[provider]]
id = "spotco"
name = "spotco"
billing = "second"
minimum_seconds = 0
source = "test fixture"
{rate}

[[instance]]
provider = "spotco"
id = "one"
gpu = "spotgpu"
gpus = 1
on_demand_per_hour = 3.0
spot_per_hour = 1.0
source = "test fixture"
{bandwidth}
"""
JOB = dict(params="1B", method="full", optim="adamw_torch", precision="32-true", total_tokens=1_000_000,
           gpu="spotgpu", provider="spotco", per_device_train_batch_size=1, gradient_accumulation_steps=1)


def _estimate(tmp_path, rate: str, bandwidth: str):
    from fitplan.context import get_context
    from fitplan.estimation import evaluate

    d = tmp_path / f"rules{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    (d / "spot.toml").write_text(RULESET.format(rate=rate, bandwidth=bandwidth))
    ctx = get_context((str(d),))
    return evaluate(fitplan.scenario_from_dict(JOB), ctx.registry, ctx.rulesets)


def test_the_interruption_model_by_hand(tmp_path):
    est = _estimate(tmp_path, "spot_interruptions_per_hour = 0.5", "checkpoint_gbps = 1.0")
    v = est.values
    assert v["checkpoint_bytes"] == 12_000_000_000
    assert v["checkpoint_seconds"] == pytest.approx(12.0)
    assert v["spot_mtbi_seconds"] == pytest.approx(7200.0)
    assert v["spot_checkpoint_interval_seconds"] == pytest.approx(415.692, abs=1e-3)
    assert v["spot_lost_seconds_per_interruption"] == pytest.approx(225.846, abs=1e-3)
    assert v["spot_time_factor"] == pytest.approx(1.062185, abs=1e-6)
    t = v["train_seconds"]
    assert v["billed_seconds_spot"] == math.ceil(t * v["spot_time_factor"] - 1e-9)  # the factor checked above
    assert v["spot_cost_usd"] == pytest.approx(v["billed_seconds_spot"] / 3600 * 1.0)


def test_without_a_rate_spot_keeps_the_flat_overhead_and_says_it_is_unpriced_for_risk(tmp_path):
    est = _estimate(tmp_path, "", "checkpoint_gbps = 1.0")
    v = est.values
    assert v["spot_checkpoint_interval_seconds"] is None
    assert v["spot_time_factor"] == pytest.approx(1.1)  # the default spot_overhead 0.1
    assert v["billed_seconds_spot"] == math.ceil(v["train_seconds"] * 1.1 - 1e-9)


def test_without_a_checkpoint_bandwidth_the_model_is_not_applied(tmp_path):
    est = _estimate(tmp_path, "spot_interruptions_per_hour = 0.5", "")
    assert est.values["checkpoint_seconds"] is None and est.values["spot_time_factor"] == pytest.approx(1.1)


def test_interruptions_faster_than_the_loss_leave_spot_unpriced(tmp_path):
    # λ = 3600/h: M = 1 s, τ = √24 ≈ 4.9 s, L ≈ 20.4 s ≥ M: the run would not finish in expectation
    est = _estimate(tmp_path, "spot_interruptions_per_hour = 3600", "checkpoint_gbps = 1.0")
    assert est.values["spot_time_factor"] is None and est.values["spot_cost_usd"] is None


def test_the_estimate_report_gives_billed_hours_and_the_interval_or_says_unpriced(tmp_path):
    from conftest import run_cli

    for rate, expect in (("spot_interruptions_per_hour = 0.5", "checkpoint every 6.9 min"),  # τ = 415.69 s
                         ("", "spot unpriced for risk")):
        d = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "spot.toml").write_text(RULESET.format(rate=rate, bandwidth="checkpoint_gbps = 1.0"))
        out = run_cli("estimate", "--ruleset-dir", str(d), "--params", "1B", "--method", "full", "--optim",
                      "adamw_torch", "--precision", "32-true", "--total-tokens", "1000000", "--gpu", "spotgpu",
                      "--provider", "spotco", "--per-device-train-batch-size", "1",
                      "--gradient-accumulation-steps", "1").stdout
        assert expect in " ".join(out.split()), out


def test_recommend_on_spot_says_the_billed_hours_and_the_interval(tmp_path):
    from conftest import run_cli

    d = tmp_path / "rules"
    d.mkdir()
    (d / "spot.toml").write_text(RULESET.format(rate="spot_interruptions_per_hour = 0.5",
                                                bandwidth="checkpoint_gbps = 1.0"))
    out = run_cli("recommend", "--ruleset-dir", str(d), "--params", "1B", "--method", "full", "--optim", "adamw_torch",
                  "--precision", "32-true", "--total-tokens", "1000000", "--gpus", "spotgpu", "--num-gpus", "1",
                  "--no-gradient-checkpointing", "--zero", "0", "--no-offload-optimizer", "--no-offload-params",
                  "--effective-batch-size", "1", "--markets", "spot", "--format", "markdown").stdout
    assert "checkpoint every 6.9 min" in out, out  # τ = 415.69 s (module docstring)
