"""The breakdown explains the whole peak: for every catalog model and a sweep of setups, the JSON rows of the
peak phase (``memory.peak_breakdown_bytes``) sum exactly to ``memory.per_gpu_bytes.peak``; every row is declared
by a memory quantity's ``row`` metadata; every row and the time carry a documented confidence entry."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fitplan
from fitplan.builtin.confidence import LEVELS
from fitplan.context import get_context
from fitplan.errors import FitplanError
from fitplan.output.estimate_report import sections_json

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted(get_context(()).rulesets.models)

SETUPS = st.fixed_dictionaries({
    "precision": st.sampled_from(["32-true", "bf16-mixed", "bf16-true", "16-mixed", "bf16-master"]),
    "method": st.sampled_from(["full", "lora", "qlora"]),
    "per_device_train_batch_size": st.sampled_from([1, 2, 8]),
    "max_seq_length": st.sampled_from([128, 1024, 4096]),
    "gradient_checkpointing": st.booleans(),
    "gradient_accumulation_steps": st.sampled_from([1, 4]),
    "optim": st.sampled_from(["adamw_torch", "adamw_torch_fused", "adamw_8bit", "adafactor", "sgd", "lomo",
                              "schedule_free_adamw"]),
    "parallel": st.sampled_from([{}, {"zero_stage": 2, "num_gpus": 8}, {"zero_stage": 3, "num_gpus": 4},
                                 {"fsdp": "full_shard", "num_gpus": 8}, {"num_gpus": 2}]),
    "device": st.sampled_from(["cuda", "cpu"]),
})


def _memory(est) -> dict:
    return sections_json(est)["memory"]


def _rows(est) -> set[str]:
    return {q.row for _, q in est.registry.compiled().rows()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), setup=SETUPS)
def test_peak_rows_sum_exactly_to_the_peak(model, setup):
    kw = dict(setup)
    kw.update(kw.pop("parallel"))
    if kw["method"] == "qlora" and kw["precision"] == "bf16-master":
        kw["precision"] = "bf16-true"
    try:
        est = fitplan.estimate(model=model, gpu="h100-sxm", **kw)
    except FitplanError:
        return  # a combination fitplan refuses (e.g. positions beyond a learned table)
    mem = _memory(est)
    rows = mem["peak_breakdown_bytes"]
    assert sum(rows.values()) == mem["per_gpu_bytes"]["peak"] == mem["phases_bytes"][mem["peak_phase"]]
    assert set(rows) <= _rows(est), set(rows) - _rows(est)
    assert all(isinstance(b, int) and b >= 0 for b in rows.values()), rows
    t = est["step_trace"]
    if t is not None:  # every instant's split, not only the peak's, is a split (no negative part)
        assert min(t.forward_peak_parts) >= 0 and all(min(p) >= 0 and sum(p) == a for a, p in t.backward_parts)
    for row, b in rows.items():
        if b:
            assert mem["confidence"][row]["level"] in LEVELS
    assert mem["confidence"]["peak"]["level"] in LEVELS


@pytest.mark.parametrize("model", MODELS)
def test_every_catalog_model_default_setup(model):
    est = fitplan.estimate(model=model, precision="bf16-mixed", gradient_checkpointing=True, per_device_train_batch_size=2,
                           max_seq_length=512)
    mem = _memory(est)
    assert sum(mem["peak_breakdown_bytes"].values()) == mem["per_gpu_bytes"]["peak"]


def test_rows_are_alive_at_the_peak_not_component_totals():
    """At an optimizer-step peak the activations are gone: no activation row, the gradients whole; the step's
    temporaries are the foreach AdamW list (one state-sized tensor per parameter: the trainable bytes again); the
    logged 4-byte loss and the batch are "other"."""
    est = fitplan.estimate(model="llama-2-7b", precision="32-true", optim="adamw_torch", per_device_train_batch_size=1,
                           max_seq_length=256)
    rows = _memory(est)["peak_breakdown_bytes"]
    assert est["peak_phase"] == "optimizer_step"
    assert rows.get("activations", 0) == 0
    n = est["trainable_param_count"]
    assert rows["weights"] == rows["gradients"] == rows["temporaries"] == 4 * n
    # input_ids + labels (int64, 2 × 2,048 B), rotary inv_freq twice (2 × 64 fp32 = 512 B), the logged 4-byte loss:
    # each a multiple of CUDA's 512-byte allocator block
    assert rows["other"] == 2 * 8 * 256 + 512 + 512
    assert rows["optimizer_states"] == 2 * 4 * n


def test_time_confidence_and_the_table_shows_it(cli):
    proc = cli("estimate", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--method", "lora", "--total-tokens", "1000000")
    assert proc.returncode == 0, proc.stderr
    assert "known" in proc.stdout and "exact" in proc.stdout
    # the fitted time model's worst leave-one-out error, as bench/time_loo.py wrote it
    band = tomllib.loads((ROOT / "rulesets" / "throughput" / "fitted.toml").read_text())["time_model"]["loo_worst"]
    assert f"±{100 * abs(band):.0f} %" in proc.stdout
    given = fitplan.estimate(model="llama-2-7b", gpu="a100-80gb", method="lora", total_tokens=10**6, tokens_per_second=1000)
    assert given["time_confidence"]["level"] == "measured"
    default = fitplan.estimate(model="llama-2-7b", gpu="a100-80gb", method="lora", total_tokens=10**6)
    assert default["time_confidence"]["level"] == "approximate" and default["time_confidence"]["band"] == abs(band)
    assert fitplan.estimate(model="llama-2-7b")["time_confidence"] is None  # no time, no confidence
