"""The step model: the roofline over the step trace's kernels, the optimizer step, QLoRA's dequantization, the
likely range. Expected values are derived by hand from the formulas of docs/time-and-cost.md ("The step model")
and the fixture rulesets written here (a GPU with round peaks and round efficiency factors).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fitplan
from conftest import bench_module

ROOT = Path(__file__).resolve().parents[1]

FIXTURE = """
[[gpu]]
id = "rooflinegpu"
name = "Roofline test GPU"
memory_bytes = 100_000_000_000
usable_bytes = 100_000_000_000
bandwidth_gbps = 1000
interconnect = "nvlink-test"
interconnect_gbps = 500
inter_node_gbps = 20
gpus_per_node = 8
generation = "testgen"
peak_tflops = { fp32 = 10, bf16 = 100, fp16 = 100 }
source = "test fixture"

[[time_efficiency]]
generation = "testgen"
gemm = 0.5
attention = 0.25
memory = 0.5

[time_model]
host_seconds_per_kernel = 1e-9
band_low = 0.8
band_high = 1.25
loo_median = 0.1
loo_worst = 0.3
runs = 10

[[provider]]
id = "testcloud"
name = "Test cloud"
billing = "second"
minimum_seconds = 0
spot_overhead = 0
source = "test fixture"

[[instance]]
provider = "testcloud"
id = "one-roofline"
gpu = "rooflinegpu"
gpus = 1
on_demand_per_hour = 3.6
spot_per_hour = 1.8
source = "test fixture"
"""


def est(rdir, **kw):
    """The derivations below are for foreach AdamW (``adamw_torch``) unless a test names another optimizer."""
    return fitplan.estimate(ruleset_dirs=[rdir], **{"optim": "adamw_torch", **kw})


# --------------------------------------------------------------------------- the optimizer step and the batch


def test_tiny_batch_full_fine_tune_is_slower_per_token(rdir):
    # --params 1B in fp32 (bare: no trace, its FLOPs at the GEMM efficiency), s = 1,000, adamw_torch (foreach):
    #   micro-step b = 1: 6e9 FLOP/token × 1,000 tokens / (10 TFLOPS × 0.5) = 1.2 s;  b = 16: 19.2 s
    #   optimizer: 1e9 × (14·4 + 2·4 + 2·4) = 72e9 B / (1,000 GB/s × 0.5) = 0.144 s (its 336 launches × 1 ns: nothing)
    #   clipping: 3 × 4e9 B of fp32 gradients / 5e11 B/s = 0.024 s
    #   b = 1: step 1.2 + 0.144 + 0.024 = 1.368 s -> 1,000 / 1.368 = 731.0 tokens/s; optimizer share 0.168 / 1.368
    #   b = 16: step 19.368 s -> 16,000 / 19.368 = 826.1 tokens/s
    common = dict(params="1B", gpu="rooflinegpu", max_seq_length=1000, total_tokens=1_000_000)
    small = est(rdir, per_device_train_batch_size=1, **common)
    large = est(rdir, per_device_train_batch_size=16, **common)
    assert small["optimizer_step_seconds"] == pytest.approx(0.144, rel=1e-5)
    assert small["grad_clip_seconds"] == pytest.approx(0.024)
    assert small["step_seconds"] == pytest.approx(1.368, rel=1e-5)
    assert small["train_tokens_per_second"] == pytest.approx(1000 / 1.368, rel=1e-5)
    assert large["train_tokens_per_second"] == pytest.approx(16000 / 19.368, rel=1e-5)
    assert small["train_tokens_per_second"] < large["train_tokens_per_second"]
    assert small["optimizer_step_share"] == pytest.approx(0.168 / 1.368, rel=1e-5)
    assert large["optimizer_step_share"] == pytest.approx(0.168 / 19.368, rel=1e-5)


def test_gradient_accumulation_pays_accumulate_passes(rdir):
    # k = 4 micro-steps of 1 × 1,000 tokens: 4 × 1.2 s + accumulation (4 − 1) × 3 × 4e9 B / 5e11 = 0.072 s
    # + clipping 0.024 + optimizer 0.144 = 5.04 s
    e = est(rdir, params="1B", gpu="rooflinegpu", max_seq_length=1000, gradient_accumulation_steps=4)
    assert e["gradient_accumulation_seconds"] == pytest.approx(0.072)
    assert e["step_seconds"] == pytest.approx(5.04, rel=1e-5)


def test_fused_adamw_moves_fewer_bytes(rdir):
    # fused AdamW reads p, g, m, v and writes p, m, v once: (3·4 + 4·4) = 28 B/param -> 28e9 / 5e11 = 0.056 s
    e = est(rdir, params="1B", gpu="rooflinegpu", optim="adamw_torch_fused")
    assert e["optimizer_step_bytes"] == 28e9
    assert e["optimizer_step_seconds"] == pytest.approx(0.056, rel=1e-4)


def test_optimizer_share_in_explain_and_json(cli, rdir):
    args = ("--params", "1B", "--gpu", "rooflinegpu", "--max-seq-length", "1000", "--total-tokens", "1000000",
            "--optim", "adamw_torch", "--ruleset-dir", rdir)
    p = cli("explain", "optimizer_share", *args, "--format", "json")
    assert p.returncode == 0, p.stderr
    tree = json.loads(p.stdout)["tree"]
    assert tree["name"] == "optimizer_step_share"
    assert float(tree["value"]) == pytest.approx(0.168 / 1.368, rel=1e-5)
    assert {c["name"] for c in tree["children"]} >= {"optimizer_step_seconds", "grad_clip_seconds", "step_seconds"}
    p = cli("estimate", *args, "--format", "json")
    assert json.loads(p.stdout)["time"]["optimizer_share"] == pytest.approx(0.168 / 1.368, rel=1e-5)
    assert "optimizer step" in cli("estimate", *args).stdout


# --------------------------------------------------------------------------- QLoRA and LoRA


def _linears(cfg: dict) -> dict[str, int]:
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    d = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    return {"q": h * q, "k": h * kv, "v": h * kv, "o": q * h, "gate": h * i, "up": h * i, "down": i * h}


def test_qlora_pays_its_dequantization(rdir):
    # tiny-llama (h 64, I 176, 2 layers), LoRA r 8 on q_proj, v_proj, bf16-true, no checkpointing. bitsandbytes
    # dequantizes every quantized Linear (all but lm_head) before its forward GEMM: 0.5 + 4/64 bytes read, 2 written
    # per weight; and again in the backward when the Linear's input needs a gradient: not layer 0's q, k, v (their
    # input, the norm of the frozen embedding output, needs none), every other Linear.
    path = ROOT / "tests/data/configs/tiny-llama/config.json"
    cfg = json.loads(path.read_text())
    n = _linears(cfg)
    layers = cfg["num_hidden_layers"]
    per_layer = sum(n.values())
    executions = layers * per_layer + (per_layer - n["q"] - n["k"] - n["v"]) + (layers - 1) * per_layer
    expected = executions * (0.5 + 4 / 64 + 2) / (1000e9 * 0.5)
    common = dict(model=str(path), gpu="rooflinegpu", precision="bf16-true", lora_r=8,
                  lora_target_modules=["q_proj", "v_proj"], max_seq_length=64, total_tokens=100_000)
    q = est(rdir, method="qlora", **common)
    lo = est(rdir, method="lora", **common)
    assert q["micro_step_time"]["dequant"] == pytest.approx(expected, rel=1e-9)
    assert "dequant" not in lo["micro_step_time"]
    assert q["train_tokens_per_second"] < lo["train_tokens_per_second"]


def test_qlora_dequantizes_then_runs_the_16_bit_gemm(rdir):
    # bitsandbytes 0.50.2 MatMul4Bit.forward calls its gemm_4bit op, which on CUDA past M = 1,536 rows
    # (_gemm_4bit_custom_max_m, backends/cuda/ops.py:926, 954-955) runs _dequant_linear_fallback: dequantize the
    # NF4 weight to the activations' dtype, then F.linear (ops.py:904-916); MatMul4Bit.backward dequantizes again
    # for the input gradient and the frozen weight gets none. tiny-llama (h 64, I 176, 2 layers), QLoRA r 8 on
    # q_proj, v_proj, bf16 base (kbit_preparation "none"), adapters fp32 (peft's autocast_adapter_dtype), one
    # sequence of M = 2,048 tokens, no checkpointing. Per execution:
    M, h, i, r = 2048, 64, 176, 8
    sq, rect = h * h, h * i  # q, k, v, o; gate, up, down
    deq = 0.5 + 4 / 64 + 2  # packed weight, one fp32 absmax per 64, bf16 out
    gemm_sq = (2 * M * h * h, 2 * (M * h + h * h + M * h))
    gemm_rect = (2 * M * h * i, 2 * (M * h + h * i + M * i))
    lm_head = (2 * M * h * 1000, 2 * (M * h + h * 1000 + M * 1000))
    adapter = (2 * M * h * r, 4 * (M * h + h * r + M * r))  # A (h -> r) and B (r -> h) move the same in fp32
    # forward: every base Linear once (8 square, 6 rectangular), LM head, 8 adapter GEMMs; backward: the input
    # gradient of every base Linear whose input needs one (not layer 0's q, k, v: 5 square, 6 rectangular), each
    # after its own dequantization; the LM head's input gradient; adapters: 8 weight gradients, 4 input gradients
    # of B, 2 of A (not layer 0's)
    expected = {
        ("dequant", "forward", "", 0.0, sq * deq, 8), ("dequant", "forward", "", 0.0, rect * deq, 6),
        ("dequant", "backward", "", 0.0, sq * deq, 5), ("dequant", "backward", "", 0.0, rect * deq, 6),
        ("gemm", "forward", "bf16", *gemm_sq, 8), ("gemm", "forward", "bf16", *gemm_rect, 6),
        ("gemm", "forward", "bf16", *lm_head, 1), ("gemm", "forward", "f32", *adapter, 8),
        ("gemm", "backward", "bf16", *gemm_sq, 5), ("gemm", "backward", "bf16", *gemm_rect, 6),
        ("gemm", "backward", "bf16", *lm_head, 1), ("gemm", "backward", "f32", *adapter, 14),
    }
    e = est(rdir, model=str(ROOT / "tests/data/configs/tiny-llama/config.json"), gpu="rooflinegpu", method="qlora",
            kbit_preparation="none", precision="bf16-true", lora_r=r, lora_target_modules=["q_proj", "v_proj"],
            max_seq_length=M, per_device_train_batch_size=1, total_tokens=100_000)
    got = {(w.kind, w.phase, w.dtype, w.flops, w.bytes, w.count) for w in e["step_trace"].work
           if w.kind in ("gemm", "dequant")}
    assert got == expected
    # the roofline (fixture: bf16 100 TFLOPS, fp32 10, GEMM efficiency 0.5; 1,000 GB/s at 0.5): every one of these
    # GEMMs is bandwidth-bound at h = 64 but the LM head's, dequantization always is
    bw = 1000e9 * 0.5

    def seconds(kind, dtype, flops, nbytes):
        return max(flops / ({"bf16": 100e12, "f32": 10e12}[dtype] * 0.5), nbytes / bw) if kind == "gemm" else nbytes / bw

    parts = {k: sum(c * seconds(kind, dt, f, b) for kind, _, dt, f, b, c in expected if kind == k) for k in ("gemm", "dequant")}
    assert e["micro_step_time"]["dequant"] == pytest.approx(parts["dequant"], rel=1e-9)
    assert e["micro_step_time"]["gemm"] == pytest.approx(parts["gemm"], rel=1e-9)


def test_qlora_is_a_few_percent_slower_than_lora_at_scale():
    # the bundled fitted factors: llama-2-7b, all-linear r 16, bf16, micro-batch 4 × 2,048, checkpointing, A100:
    # three dequantizations of ~6.5e9 weights (2.56 B each) per micro-step against ~1.1e14 FLOPs of GEMMs
    common = dict(model="llama-2-7b", gpu="a100-80gb", precision="bf16-true", lora_r=16,
                  lora_target_modules=["all-linear"], per_device_train_batch_size=4, max_seq_length=2048,
                  gradient_checkpointing=True, total_tokens=10_000_000)
    # the dequantization overhead alone: the base left in bf16 (kbit_preparation = "none", as torchtune does);
    # peft's prepare_model_for_kbit_training (the default) makes the non-quantized compute fp32 (docs/stacks.md)
    q = fitplan.estimate(method="qlora", kbit_preparation="none", **common)["train_tokens_per_second"]
    lo = fitplan.estimate(method="lora", **common)["train_tokens_per_second"]
    assert 0.85 < q / lo < 1.0


# --------------------------------------------------------------------------- the step trace's work records


def test_work_records_count_six_n_for_full_fine_tuning():
    # the GEMM FLOPs of one micro-step of llama-2-7b: forward 2 × the matmul weights per token (lm_head included),
    # backward twice that. The matmul weights: N − embeddings = 6,607,343,616 (tests/test_time.py) less the RMSNorm
    # weights (2 × 4,096 per layer × 32 + 4,096 final = 266,240), which multiply elementwise
    e = fitplan.estimate(model="llama-2-7b", precision="bf16-true", per_device_train_batch_size=1, max_seq_length=512)
    work = e["step_trace"].work
    gemm = {ph: sum(w.flops * w.count for w in work if w.kind == "gemm" and w.phase == ph) for ph in ("forward", "backward")}
    assert gemm["forward"] == 2 * (6_607_343_616 - 266_240) * 512
    assert gemm["backward"] == 2 * gemm["forward"]
    # flash attention, causal: 4·b·a·s²·d / 2 per layer forward, 2.5 × that backward
    att = sum(w.flops * w.count for w in work if w.kind == "attention" and w.phase == "forward")
    assert att == 32 * 4 * 32 * 512 * 512 * 128 / 2


def test_lora_adapter_gemms_and_the_frozen_base():
    # llama-2-7b, LoRA r 16 on q_proj and v_proj (peft 0.21: lora_B(lora_A(x)) * scaling, two thin GEMMs per target),
    # micro-batch 1 × 512. Forward: every base matmul weight (6,607,343,616 − 266,240 norm weights, test above) and
    # per target 2·s·h·r (A) + 2·s·r·h (B). Backward: no weight gradient for the frozen base; its input gradient
    # wherever the input needs one: not layer 0's q, k, v (their input, the norm of the frozen embeddings' output,
    # needs none); for the adapters both weight gradients, B's input gradient (A's output trains) and A's input
    # gradient except in layer 0.
    s, h, r, L = 512, 4096, 16, 32
    base = 6_607_343_616 - 266_240
    adapter = 2 * s * h * r  # one thin GEMM of A or B
    e = fitplan.estimate(model="llama-2-7b", method="lora", lora_r=r, lora_target_modules=["q_proj", "v_proj"],
                         precision="bf16-true", optim="adamw_torch", per_device_train_batch_size=1, max_seq_length=s)
    work = e["step_trace"].work
    gemm = {ph: sum(w.flops * w.count for w in work if w.kind == "gemm" and w.phase == ph) for ph in ("forward", "backward")}
    targets = 2 * L
    assert gemm["forward"] == 2 * base * s + targets * 2 * adapter
    base_input_grads = 2 * (base - 3 * h * h) * s
    adapter_backward = targets * 3 * adapter + (targets - 2) * adapter
    assert gemm["backward"] == base_input_grads + adapter_backward


def test_aten_work_of_views_in_place_ops_and_products():
    from fitplan.trace.op_work import aten
    from fitplan.trace.step_trace import T

    x = T(0, 6 * 4, "f32", True)
    view = T(0, 6 * 4, "f32", True)
    assert aten("view", {"self": x}, [view], [], [], [], 0, True) is None  # a view launches nothing
    inplace = aten("add_.Tensor", {"self": x}, [view], [], [], [], 0, True)
    assert [k.bytes for k in inplace.fwd] == [2 * 24 * 4]  # reads and writes its 24 fp32 elements
    # (6 × 4) @ (4 × 10) with shapes unknown: K² = 24 · 40 / 60; 2·6·4·10 FLOPs; both operands and the output once
    w = T(-1, 4 * 10, "f32", True, param=True)
    out = T(1, 6 * 10, "f32", True)
    work = aten("mm", {"self": x, "mat2": w}, [out], [x, w], [x], [-1], 160, True)
    assert [(k.kind, k.flops, k.bytes) for k in work.fwd] == [("gemm", 480, (24 + 40 + 60) * 4)]
    assert [k.flops for k in work.bwd] == [480, 480]  # the input and the weight gradient
    frozen = aten("mm", {"self": x, "mat2": T(-1, 40, "f32", False, param=True)}, [out], [], [x], [-1], 0, True)
    assert len(frozen.bwd) == 1  # a frozen weight has no weight-gradient GEMM


def test_checkpointing_recomputes_the_forward():
    e = fitplan.estimate(model="llama-2-7b", precision="bf16-true", gradient_checkpointing=True, max_seq_length=512)
    work = e["step_trace"].work
    fwd = sum(w.flops * w.count for w in work if w.kind == "gemm" and w.phase == "forward")
    rec = sum(w.flops * w.count for w in work if w.kind == "gemm" and w.phase == "recompute")
    # every decoder layer's GEMMs run again; the LM head (2 × 4,096 × 32,000 per token) does not
    assert rec == fwd - 2 * 4096 * 32000 * 512


def test_compile_fuses_elementwise_runs():
    e = fitplan.estimate(model="llama-2-7b", precision="bf16-true", max_seq_length=512)
    work = e["step_trace"].work

    def moved(mode):
        return sum(w.bytes * w.count for w in work if w.kind == "elementwise" and w.mode in ("", mode))

    def kernels(mode):
        return sum(w.count for w in work if w.kind == "elementwise" and w.mode in ("", mode))

    assert moved("compiled") < moved("eager")
    assert kernels("compiled") < kernels("eager") / 2


# --------------------------------------------------------------------------- the likely range


def test_band_on_time_and_cost(rdir, cli):
    # fixture band × 0.8 to × 1.25; 1B fp32 at b = 1: 1,000,000 tokens / (1,000 / 1.368) = 1,368 s
    e = est(rdir, params="1B", gpu="rooflinegpu", max_seq_length=1000, total_tokens=1_000_000, provider="testcloud")
    assert e["train_seconds"] == pytest.approx(1368, rel=1e-5)
    assert e["train_seconds_low"] == pytest.approx(0.8 * 1368, rel=1e-5)
    assert e["train_seconds_high"] == pytest.approx(1.25 * 1368, rel=1e-5)
    # per-second billing at 3.60 USD/h: 1 USD per 1,000 s; spot at 1.80 USD/h
    assert e["on_demand_cost_usd"] == pytest.approx(1.368, rel=1e-3)
    assert e["on_demand_cost_usd_low"] == pytest.approx(0.8 * 1.368, rel=1e-3)
    assert e["spot_cost_usd_high"] == pytest.approx(1.25 * 0.684, rel=1e-3)
    p = cli("estimate", "--params", "1B", "--gpu", "rooflinegpu", "--max-seq-length", "1000", "--total-tokens", "1000000",
            "--optim", "adamw_torch", "--provider", "testcloud", "--ruleset-dir", rdir, "--format", "json")
    out = json.loads(p.stdout)
    assert out["time"]["seconds_low"] == pytest.approx(0.8 * 1368, rel=1e-5)
    assert out["time"]["likely_range"]["low_factor"] == 0.8 and out["time"]["likely_range"]["runs"] == 10
    assert out["cost"]["on_demand_usd_high"] == pytest.approx(1.25 * 1.368, rel=1e-3)
    md = cli("estimate", "--params", "1B", "--gpu", "rooflinegpu", "--max-seq-length", "1000", "--total-tokens",
             "1000000", "--optim", "adamw_torch", "--ruleset-dir", rdir, "--format", "markdown").stdout
    assert "likely 0.30-0.48 h" in md  # 1,094.4 s and 1,710 s


def test_no_band_when_the_throughput_is_given(rdir):
    e = est(rdir, params="1B", gpu="rooflinegpu", total_tokens=1_000_000, tokens_per_second=1000)
    assert e["train_seconds"] == 1000 and e["train_seconds_low"] is None and e["time_band"] is None


def _bundled_fit():
    import tomllib

    return tomllib.loads((ROOT / "rulesets" / "throughput" / "fitted.toml").read_text())


def test_band_widens_on_a_gpu_generation_without_published_runs():
    # no published run on Blackwell: its efficiency is the run-weighted mean m of the fitted generations' GEMM
    # efficiencies; time goes as 1 / efficiency, so the fitted extremes put it between m / max and m / min of m's
    fit = _bundled_fit()
    rows = fit["time_efficiency"]
    assert "blackwell" not in {r["generation"] for r in rows}
    m = sum(r["gemm"] * r["runs"] for r in rows) / sum(r["runs"] for r in rows)
    low = fit["time_model"]["band_low"] * min(1.0, m / max(r["gemm"] for r in rows))
    high = fit["time_model"]["band_high"] * max(1.0, m / min(r["gemm"] for r in rows))
    common = dict(model="llama-2-7b", precision="bf16-true", optim="adamw_torch", total_tokens=10_000_000)
    b200 = fitplan.estimate(gpu="b200", **common)
    assert b200["time_band"][:2] == pytest.approx((low, high), rel=1e-12)
    assert "no published run on blackwell" in b200["time_band"][2]
    h100 = fitplan.estimate(gpu="h100-sxm", **common)  # a fitted generation keeps the leave-one-out band
    assert h100["time_band"][:2] == (fit["time_model"]["band_low"], fit["time_model"]["band_high"])


def test_band_after_calibrating_on_your_run(tmp_path):
    # a [[time_calibration]] row for the GPU: the band becomes the one calibration leaves on the published runs
    # (bench/time_loo.py: one run's measured / predicted time applied to another of the same GPU type and source)
    fit = _bundled_fit()["time_model"]
    (tmp_path / "calib.toml").write_text('[[time_calibration]]\ngpu = "a100-80gb"\nscale = 1.1\nsource = "test"\n')
    e = fitplan.estimate(model="llama-2-7b", gpu="a100-80gb", precision="bf16-true", optim="adamw_torch",
                         total_tokens=10_000_000, ruleset_dirs=[str(tmp_path)])
    assert e["step_time_calibration"].scale == 1.1
    assert e["time_band"][:2] == (fit["calibrated_band_low"], fit["calibrated_band_high"])
    assert f"{fit['calibrated_pairs']} ordered pairs" in e["time_band"][2]
    assert e["train_seconds_high"] == pytest.approx(e["train_seconds"] * fit["calibrated_band_high"])


# --------------------------------------------------------------------------- the published runs


def test_published_runs_are_valid_and_enough():
    from fitplan.rulesets import loader

    rules = loader.load()
    used = [r for r in rules.finetune_runs.values() if not r.exclude]
    assert len(used) >= 80  # issue #28: at least 80 published runs
    assert len({r.source.split()[0] for r in used}) >= 8  # ... from at least 8 independent sources
    assert {r.scenario.get("method") for r in used} == {"full", "lora", "qlora"}
    assert {r.scenario["gpu"] for r in used} >= {"a100-80gb", "h100-sxm", "rtx-4090"}
    assert max(r.scenario.get("num_gpus", 1) * r.scenario.get("num_nodes", 1) for r in used) >= 16
    assert rules.time_model is not None and rules.time_model.runs == len(used)
    assert rules.time_model.loo_median <= 0.08 and abs(rules.time_model.loo_worst) <= 0.40


def test_used_multi_server_runs_state_their_network():
    # the exclusion rule every source's rows get (docs/time-and-cost.md): a run across servers is used only where
    # its source states the network between them, entered as network_gbps (a bundled instance would also do)
    from fitplan.rulesets import loader

    rules = loader.load()
    across = [r for r in rules.finetune_runs.values() if r.scenario.get("num_nodes", 1) > 1]
    used = [r for r in across if not r.exclude]
    assert used and len(used) < len(across)  # some are used, some were excluded for it
    unstated = [r.id for r in used if r.network_gbps is None and not r.scenario.get("instance")]
    assert unstated == []


def _time_loo():
    return bench_module("time_loo")


def test_a_published_run_is_priced_on_the_network_it_states(rdir, tmp_path):
    import attrs

    from fitplan.rulesets.schema import FinetuneRun

    scenario = {"model": "llama-3.2-1b", "gpu": "rooflinegpu", "num_gpus": 8, "num_nodes": 2, "method": "full",
                "precision": "bf16-mixed", "optim": "adamw_torch", "per_device_train_batch_size": 1,
                "max_seq_length": 512}
    run = FinetuneRun(id="two-servers", source="test", location="", stack="", tokens_per_second_per_gpu=1.0,
                      scenario=scenario, network_gbps=40.0)
    topo = _time_loo().evaluate(run, tmp_path, [rdir])["topology"]
    # 40 GB/s per server of 8 GPUs: 5 GB/s per GPU, where the fixture GPU's own figure is 20
    assert topo["network_gbps"] == pytest.approx(40.0 / 8)
    assert topo["instances"] == 2 and topo["gpus_per_instance"] == 8
    unstated = _time_loo().evaluate(attrs.evolve(run, network_gbps=None), tmp_path, [rdir])["topology"]
    assert unstated["network_gbps"] == pytest.approx(20.0)


def test_a_published_run_states_its_network_or_an_instance_not_both(tmp_path):
    from fitplan.errors import FitplanError
    from fitplan.rulesets import loader

    (tmp_path / "runs.toml").write_text("""
[[finetune_run]]
id = "both"
source = "test"
location = "row 1"
stack = "test"
tokens_per_second_per_gpu = 100.0
network_gbps = 50
[finetune_run.scenario]
model = "llama-2-7b"
gpu = "a100-80gb"
provider = "aws"
instance = "p4de.24xlarge"
num_gpus = 8
num_nodes = 2
""", encoding="utf-8")
    with pytest.raises(FitplanError, match="network_gbps or a bundled provider/instance, not both"):
        loader.load([tmp_path])


@pytest.mark.slow
def test_time_loo_doc_and_fit_are_current():
    # refits and reruns the leave-one-out (about a minute on two cores)
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "time_loo.py"), "--check"], capture_output=True,
                       text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr


def test_nemo_performance_lora_rows_run_the_recipes_adapters():
    # NVIDIA dgxc-benchmarking's Llama 3 8B LoRA rows (llama3/finetuning/llama3_finetune.py @ 8f5cbb37) call NeMo's
    # recipes/llama3_8b.py finetune_recipe(peft_scheme="lora", performance_mode=True): peft.dim = 8, and
    # finetune_performance_optimizations sets peft.target_modules = ['linear_qkv'] (NeMo v2.1.0): rank-8 adapters on
    # q, k and v only, not the LoRA class's defaults (every linear layer, dim 32). Llama 3 8B: 32 layers, hidden 4096,
    # 8 KV heads of 128 (k and v project to 1024). Per layer, A is 4096 × 8 for each of q, k, v; B is 8 × 4096 (q)
    # and 8 × 1024 (k, v): 3·32,768 + 32,768 + 2·8,192 = 147,456; × 32 layers = 4,718,592 (NeMo's one adapter on
    # the fused projection would hold 32·(4096·8 + 8·6144) = 2,621,440: the rows' note says why three are priced).
    from fitplan.rulesets import loader

    rows = [r for r in loader.load().finetune_runs.values() if r.id.startswith("dgxc-llama3-8b-lora-bf16")]
    assert len(rows) == 2
    for run in rows:
        assert run.scenario["optim"] == "adamw_torch_fused" and run.scenario["precision"] == "bf16-true"
        e = fitplan.estimate(total_tokens=1_000_000, **run.scenario)
        assert e["adapter_param_count"] == 32 * (3 * 4096 * 8 + 8 * 4096 + 2 * 8 * 1024) == 4_718_592


@pytest.mark.parametrize("checkpointing, passes", [(False, 2), (True, 3)])
def test_tensor_parallel_collectives_are_on_the_data_path(rdir, checkpointing, passes):
    # Llama 3.2 1B (16 layers, hidden 2048) under tensor parallelism 2, no data parallelism, 3 micro-steps of 2 × 512
    # bf16 tokens: each collective runs over b·s·h·2 = 2·512·2048·2 = 4,194,304 bytes, two per layer in the forward,
    # two in the backward, two more in the recomputed forward with checkpointing (sharding/comm.py
    # TP_COLLECTIVES_PER_LAYER). The next op waits for each (torch's RowwiseParallel: an async collective waited at
    # its first use), so all of them are in the serial window, exposed whole.
    act = 2 * 512 * 2048 * 2
    calls = 3 * 16 * 2 * passes
    e = est(rdir, model="llama-3.2-1b", gpu="rooflinegpu", num_gpus=2, tensor_parallel=2, method="full",
            precision="bf16-mixed", optim="adamw_torch", per_device_train_batch_size=2, max_seq_length=512,
            gradient_accumulation_steps=3, gradient_checkpointing=checkpointing)
    windows = e["comm_volumes"]["windows"]
    assert windows["serial"]["tp_all_reduce"] == calls * act
    assert windows["micro"]["tp_all_reduce"] == windows["last"]["tp_all_reduce"] == 0
    # each call a ring all-reduce over 2 GPUs: sends 2·(2−1)/2 × 4 MiB; fixture NVLink 500 GB/s, half per direction,
    # × 0.8 NCCL = 200 GB/s; NCCL's Simple protocol is the fastest at 4 MiB: 8.4 µs + 2 ring steps × 3.4 µs
    # + 4,194,304 / 200e9 s (LL128: 17.8 µs + 22.8 µs; LL: 7.8 µs + 4,194,304 / 87.7e9 s)
    per_call = (8.4 + 2 * 3.4) * 1e-6 + act / 200e9
    assert e["comm_seconds_by_window"]["serial"] == pytest.approx(calls * per_call, rel=1e-6)
    assert e["exposed_transfer_seconds"] == pytest.approx(e["comm_seconds_by_window"]["serial"], rel=1e-6)
