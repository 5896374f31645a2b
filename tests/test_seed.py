"""The seed chapter's memory section, reproduced under --assumptions seed.

Every expected value below is derived from the chapter's own text (docs/sources.md, "The seed chapter"),
not from fitplan: "weights_fp32 = parameters * 4", "optimizer_fp32 = parameters * 4 * 2",
"Activations réduites de ~30%", and its ``estimate_memory`` function, re-implemented here verbatim as the reference.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fitplan
from conftest import run_json

B = 10**9


def seed(params: str, precision: str, **kw):
    return fitplan.estimate(params=params, precision=precision, assumptions="seed", optim="adamw_torch", **kw)


def test_7b_fp32_is_28_28_56():
    # "weights_fp32 = parameters * 4  # 28 GB", "gradients_fp32 ... # 28 GB", "optimizer_fp32 = parameters * 4 * 2 # 56 GB"
    e = seed("7B", "32-true")
    assert e["weight_bytes"] == 7_000_000_000 * 4 == 28 * B
    assert e["gradient_bytes"] == 28 * B
    assert e["optimizer_state_bytes"] == 7_000_000_000 * 4 * 2 == 56 * B
    assert e["model_state_bytes"] == 112 * B  # "Total : ~112 GB"


def test_7b_bf16_mixed_is_14_14_56():
    # "weights_bf16 = parameters * 2 # 14 GB", "optimizer_fp32 = parameters * 4 * 2 # 56 GB (conservé en fp32)"
    e = seed("7B", "bf16-mixed")
    assert (e["weight_bytes"], e["gradient_bytes"], e["optimizer_state_bytes"]) == (14 * B, 14 * B, 56 * B)
    assert e["model_state_bytes"] == 84 * B  # "Total : ~84 GB"


def test_done_when_cli_json():
    out = run_json("estimate", "--params", "7B", "--precision", "32-true", "--optim", "adamw_torch", "--assumptions", "seed")
    mem = out["memory"]["per_gpu_bytes"]
    assert (mem["weights"], mem["gradients"], mem["optimizer_states"]) == (28_000_000_000, 28_000_000_000, 56_000_000_000)


# The chapter's table: size -> (full fp32, full bf16, with gradient checkpointing), in GB, all "~".
TABLE = {"1B": (16, 12, 8), "7B": (112, 84, 60), "13B": (208, 156, 110), "70B": (1100, 840, 600)}


@pytest.mark.parametrize("size", TABLE)
def test_memory_table(size):
    n = int(size[:-1]) * B
    fp32, bf16, ckpt = TABLE[size]
    e32 = seed(size, "32-true")
    e16 = seed(size, "bf16-mixed")
    # columns 1 and 2: weights + gradients + AdamW states, exactly 16 and 12 bytes per parameter
    assert e32["model_state_bytes"] == 16 * n
    assert e16["model_state_bytes"] == 12 * n
    assert e32["model_state_bytes"] == pytest.approx(fp32 * B, rel=0.02)  # 70B: 1.12 TB printed as "~1.1 TB"
    assert e16["model_state_bytes"] == bf16 * B
    # column 3: "Activations réduites de ~30%" applied to the bf16 total (plus the chapter's activation line)
    ec = seed(size, "bf16-mixed", gradient_checkpointing=True, per_device_train_batch_size=1, max_seq_length=512)
    activations = 1 * 512 * 4096 * 4
    assert ec["peak_bytes"] == int((12 * n + activations) * 0.7)
    assert ec["peak_bytes"] == pytest.approx(ckpt * B, rel=0.06)  # the table rounds 8.4 -> 8, 58.8 -> 60, 588 -> 600


def chapter_estimate_memory(param_count: int, batch_size: int, seq_len: int, precision: str = "bf16") -> float:
    """The chapter's function, verbatim in substance (GiB: it divides by 1024**3)."""
    bytes_per_param = 2 if precision == "bf16" else 4
    weights_gb = (param_count * bytes_per_param) / 1024**3
    gradients_gb = weights_gb
    optimizer_gb = (param_count * 4 * 2) / 1024**3
    activation_gb = (batch_size * seq_len * 4096 * 4) / 1024**3
    return weights_gb + gradients_gb + optimizer_gb + activation_gb


@settings(max_examples=60, deadline=None)
@given(
    params=st.integers(min_value=10**6, max_value=10**11),
    batch=st.integers(min_value=1, max_value=64),
    seq=st.integers(min_value=1, max_value=32768),
    precision=st.sampled_from(["bf16", "fp32"]),
)
def test_estimate_memory_function(params, batch, seq, precision):
    e = fitplan.estimate(params=str(params), precision="bf16-mixed" if precision == "bf16" else "32-true",
                         assumptions="seed", per_device_train_batch_size=batch, max_seq_length=seq)
    assert e["peak_bytes"] / 1024**3 == pytest.approx(chapter_estimate_memory(params, batch, seq, precision), rel=1e-12)


def test_realistic_is_default_and_explain_names_the_difference(cli):
    e = fitplan.estimate(params="7B", precision="bf16-mixed")
    assert e.scenario.model.assumptions == "realistic"
    # torch AMP keeps fp32 weights: 4 bytes, not the chapter's 2
    assert e["weight_bytes"] == 28 * B
    proc = cli("explain", "weights", "--params", "7B", "--precision", "bf16-mixed")
    assert proc.returncode == 0, proc.stderr
    assert "seed chapter's assumptions" in proc.stdout
    assert "14.00 GB under the seed" in proc.stdout


def test_time_and_cost_examples_under_seed_assumptions():
    # "10,000 exemples × 512 tokens × 3 époques = 15,360,000 tokens; à 1,000 tokens/s, 15,360 s ≈ 4.3 h"
    e = seed("7B", "bf16-mixed", gpu="a100-40gb", num_examples=10_000, tokens_per_example=512, num_train_epochs=3,
             tokens_per_second=1000)
    assert e["train_tokens"] == 15_360_000 and e["train_seconds"] == 15_360
    assert e["train_seconds_low"] is None  # a given throughput has no model error to show
    # "4 heures sur A100-40GB: 4 × $4.00 = $16 (à la demande), 4 × $1.20 = $4.80 (spot); 5 exécutions: $80 / $24"
    c = seed("7B", "bf16-mixed", gpu="a100-40gb", provider="seed", total_tokens=14_400_000, tokens_per_second=1000, runs=5)
    assert (c["on_demand_cost_usd"], c["spot_cost_usd"]) == (pytest.approx(80.0), pytest.approx(24.0))
    # the chapter's throughput table picks its 1,000 tokens/s for a 7B model on an A100-40GB by itself
    t = seed("7B", "bf16-mixed", gpu="a100-40gb", total_tokens=15_360_000, throughput_source="seed")
    assert t["train_seconds"] == pytest.approx(15_360)
