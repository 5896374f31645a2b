"""Training time: tokens, FLOPs per token, peak, a stated MFU, communication, throughput sources (the step model's
roofline: tests/test_time_model.py).

Every expected number is derived by hand in the comment next to it, from the formulas in
docs/time-and-cost.md and the fixture rulesets written here.
"""

from __future__ import annotations

import math

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fitplan
from fitplan.errors import FitplanError

ROOT = Path(__file__).resolve().parents[1]

FIXTURE = """
[[gpu]]
id = "testgpu"
name = "Test GPU"
aliases = ["Test-GPU"]
memory_bytes = 100_000_000_000
usable_bytes = 100_000_000_000
bandwidth_gbps = 1000
interconnect = "nvlink-test"
interconnect_gbps = 500      # NVLink-style (bidirectional): a ring sees 500 × 0.5 × 0.8 = 200 GB/s
inter_node_gbps = 20         # 20 × 0.8 = 16 GB/s
gpus_per_node = 8
peak_tflops = { fp32 = 10, tf32 = 40, bf16 = 100, fp16 = 100 }
source = "test fixture"

[[mfu_calibration]]
gpu = "testgpu"
mfu = 0.3
source = "test: measured on testgpu"

[[mfu_calibration]]
gpu = "Test-GPU"             # an alias, as `fitplan validate --calibrate-out` may write the user's --gpu
model = "llama-2-7b"
method = "full"
mfu = 0.25
source = "test: measured on testgpu with llama-2-7b"
"""


def est(rdir=None, **kw):
    return fitplan.estimate(ruleset_dirs=[rdir] if rdir else [], **kw)


# --------------------------------------------------------------------------- tokens


def test_seed_tokens_and_seconds():
    # the seed: 10,000 × 512 = 5,120,000 tokens; × 3 epochs = 15,360,000; at 1,000 tokens/s: 15,360 s ≈ 4.3 h
    e = est(params="7B", num_examples=10_000, tokens_per_example=512, num_train_epochs=3, tokens_per_second=1000)
    assert e["dataset_tokens"] == 5_120_000
    assert e["train_tokens"] == 15_360_000
    assert e["train_seconds"] == pytest.approx(15_360)
    assert round(e["train_seconds"] / 3600, 1) == 4.3
    assert e["padding_tokens"] == 0


def test_total_tokens_and_epochs():
    # 1,000,000 tokens × 2.5 epochs = 2,500,000 tokens; at 500 tokens/s: 5,000 s
    e = est(params="1B", total_tokens=1_000_000, num_train_epochs=2.5, tokens_per_second=500)
    assert e["train_tokens"] == 2_500_000
    assert e["train_seconds"] == pytest.approx(5_000)


def test_padding_counts_max_seq_length_and_reports_waste():
    # 100 examples of mean 300 tokens padded to 512, 2 epochs: 100 × 512 × 2 = 102,400 tokens processed,
    # of which (51,200 − 30,000) × 2 = 42,400 are padding
    e = est(params="1B", num_examples=100, tokens_per_example=300, padding="pad", max_seq_length=512, num_train_epochs=2)
    assert e["train_tokens"] == 102_400
    assert e["padding_tokens"] == 42_400
    assert e["truncated_tokens"] == 0
    packed = est(params="1B", num_examples=100, tokens_per_example=300, max_seq_length=512, num_train_epochs=2)
    assert packed["train_tokens"] == 60_000 and packed["padding_tokens"] == 0


def test_padding_truncates_longer_examples():
    # mean 600 > 512: each example costs 512, 100 × (600 − 512) = 8,800 tokens are cut off
    e = est(params="1B", num_examples=100, tokens_per_example=600, padding="pad", max_seq_length=512)
    assert e["train_tokens"] == 51_200
    assert e["truncated_tokens"] == 8_800 and e["padding_tokens"] == 0


def test_no_dataset_gives_nulls_not_errors():
    e = est(params="7B", gpu="a100-80gb")
    for name in ("train_tokens", "train_flops", "train_seconds", "gpu_hours", "on_demand_cost_usd", "spot_cost_usd"):
        assert e[name] is None, name


def test_partial_dataset_is_an_error():
    with pytest.raises(FitplanError, match="--tokens-per-example needs --num-examples"):
        est(params="7B", tokens_per_example=512)
    with pytest.raises(FitplanError, match="disagrees"):
        est(params="7B", num_examples=10, tokens_per_example=100, total_tokens=5_000)
    with pytest.raises(FitplanError, match="--padding pad needs --num-examples"):
        est(params="7B", total_tokens=5_000, padding="pad")


# --------------------------------------------------------------------------- FLOPs per token


def test_bare_params_six_and_eight_n_without_attention():
    # a bare count has no layers: 6 × 7e9 = 4.2e10; with full recomputation 8 × 7e9 = 5.6e10
    assert est(params="7B")["flops_per_token"] == 4.2e10
    assert est(params="7B")["attention_flops_per_token"] == 0
    assert est(params="7B", gradient_checkpointing=True)["flops_per_token"] == 5.6e10


def test_llama_2_7b_full_flops_per_token():
    # Llama-2-7b: 6,738,415,616 params, embed_tokens 32,000 × 4,096 = 131,072,000 (a lookup, not counted),
    # N = 6,607,343,616; attention at s = 2,048: 12 × 32 × 4,096 × 2,048 = 3,221,225,472
    # 6N + attention = 39,644,061,696 + 3,221,225,472 = 42,865,287,168
    e = est(model="llama-2-7b", max_seq_length=2048)
    assert e["flops_param_count"] == 6_607_343_616
    assert e["attention_flops_per_token"] == 3_221_225_472
    assert e["flops_per_token"] == 42_865_287_168
    # checkpointing: 8N + 16·L·h·s = 52,858,748,928 + 4,294,967,296 = 57,153,716,224
    assert est(model="llama-2-7b", max_seq_length=2048, gradient_checkpointing=True)["flops_per_token"] == 57_153_716_224


def test_lora_flops_per_token():
    # LoRA r = 8 on q_proj, v_proj: per layer 2 × (8 × 4,096 + 4,096 × 8) = 131,072; × 32 layers = 4,194,304
    # 4N + 6·N_adapter + attention = 26,429,374,464 + 25,165,824 + 3,221,225,472 = 29,675,765,760
    e = est(model="llama-2-7b", method="lora", lora_r=8, lora_target_modules=["q_proj", "v_proj"], max_seq_length=2048)
    assert e["adapter_param_count"] == 4_194_304
    assert e["flops_per_token"] == 29_675_765_760


def test_moe_counts_active_parameters():
    e = est(model="mixtral-8x7b")
    arch = e.arch
    embed = arch.vocab_size * arch.hidden_size
    assert e["flops_param_count"] == arch.active_param_count - embed
    assert arch.param_count > 3 * e["flops_param_count"]  # 46.7B total, ~12.9B active


# --------------------------------------------------------------------------- peak and MFU


def test_peak_dtype_fp32_is_not_tf32_unless_asked():
    # A100: fp32 19.5, tf32 156, bf16 312 TFLOPS (dense)
    assert est(params="1B", gpu="a100-80gb")["peak_flops_per_gpu"] == 19.5e12
    assert est(params="1B", gpu="a100-80gb", tf32=True)["peak_flops_per_gpu"] == 156e12
    assert est(params="1B", gpu="a100-80gb", precision="bf16-mixed")["peak_flops_per_gpu"] == 312e12
    # T4 has no bf16 tensor cores: bf16 runs at the fp32 rate, 8.1 TFLOPS
    assert est(params="1B", gpu="t4", precision="bf16-mixed")["peak_flops_per_gpu"] == 8.1e12
    assert est(params="1B")["peak_flops_per_gpu"] is None


def test_default_time_model_is_the_fitted_roofline():
    # without --mfu or a calibration, the step is priced by the roofline at the factors fitted for the GPU's
    # generation (rulesets/throughput/fitted.toml), and says so
    e = est(model="llama-2-7b", gpu="h100-sxm", precision="bf16-mixed", total_tokens=1_000_000)
    assert e["assumed_mfu"] is None
    assert "roofline" in e["throughput_basis"] and "hopper" in e["throughput_basis"]
    assert e["kernel_efficiency"].gemm == e.rulesets.time_efficiencies["hopper"].gemm
    # a generation without published runs (the T4's turing) uses the run-weighted mean, and says so
    t4 = est(model="llama-2-7b", gpu="t4", precision="16-mixed", total_tokens=1_000_000)
    assert "no published run on turing GPUs" in t4["throughput_basis"]


def test_mfu_override_and_calibration(rdir):
    assert est(rdir, params="7B", gpu="testgpu")["assumed_mfu"] == 0.3  # GPU-wide calibration
    assert est(rdir, model="llama-2-7b", gpu="testgpu")["assumed_mfu"] == 0.25  # model + method row is more specific
    assert est(rdir, model="llama-2-7b", gpu="testgpu", mfu=0.5)["assumed_mfu"] == 0.5  # --mfu wins
    with pytest.raises(FitplanError, match="fraction"):
        est(params="7B", mfu=40)


# --------------------------------------------------------------------------- one step


def test_single_gpu_step_and_time(rdir):
    # --params 1B, fp32 (peak 10 TFLOPS), MFU 0.5, b = 1, s = 1,000: 6e9 × 1,000 / 5e12 = 1.2 s per step;
    # 1,000 tokens per step -> 833.33 tokens/s; 100,000 tokens -> 120 s
    e = est(rdir, params="1B", gpu="testgpu", mfu=0.5, max_seq_length=1000, total_tokens=100_000)
    assert e["compute_seconds_per_step"] == pytest.approx(1.2)
    assert e["step_seconds"] == pytest.approx(1.2)
    assert e["train_tokens_per_second"] == pytest.approx(1000 / 1.2)
    assert e["train_seconds"] == pytest.approx(120)
    assert e["communication_share"] == 0
    assert e["train_mfu"] == pytest.approx(0.5)


def test_ddp_communication_hidden_within_a_node(rdir):
    # 2 GPUs, fp32 grads G = 4e9 B: all-reduce 2 × 1/2 × 4e9 = 4e9 B at 200 GB/s = 0.02 s, in DDP's buckets
    # (1 MiB, then 25 MiB: 154 calls), each paying NCCL's ring Simple latency 8.4 + 2 steps × 3.4 µs (NVLink);
    # compute 1.2 s hides up to 0.6 s -> step 1.2 s, nothing exposed
    e = est(rdir, params="1B", gpu="testgpu", mfu=0.5, max_seq_length=1000, num_gpus=2, total_tokens=100_000)
    assert e["comm_bytes_per_step"] == {"intra": pytest.approx(4e9), "inter": 0}
    buckets = 1 + math.ceil((4e9 - 2**20) / (25 * 2**20))
    assert buckets == 154
    assert e["comm_seconds_per_step"] == pytest.approx(0.02 + buckets * (8.4 + 2 * 3.4) * 1e-6)
    assert e["step_seconds"] == pytest.approx(1.2)
    assert e["communication_share"] == 0
    assert e["train_tokens_per_second"] == pytest.approx(2000 / 1.2)  # 2 replicas × 1,000 tokens per step


def test_inter_node_communication_is_exposed(rdir):
    # 2 nodes × 1 GPU, bf16 compute (peak 100 TFLOPS, MFU 0.5): compute 6e12 / 5e13 = 0.12 s;
    # bf16-mixed keeps fp32 grads: 4e9 B over the network at 16 GB/s = 0.25 s, in DDP's 154 buckets, each paying
    # NCCL's ring Simple latency 8.4 + 2 network steps × 14.0 µs; hidden 0.06 s -> exposed comm - 0.06 s
    e = est(rdir, params="1B", gpu="testgpu", mfu=0.5, max_seq_length=1000, num_nodes=2, precision="bf16-mixed",
            total_tokens=100_000)
    assert e["comm_bytes_per_step"] == {"intra": 0, "inter": pytest.approx(4e9)}
    comm = 0.25 + 154 * (8.4 + 2 * 14.0) * 1e-6
    step = 0.12 + comm - 0.06
    assert e["comm_seconds_per_step"] == pytest.approx(comm)
    assert e["step_seconds"] == pytest.approx(step)
    assert e["communication_share"] == pytest.approx((comm - 0.06) / step)
    assert e["train_tokens_per_second"] == pytest.approx(2000 / step)
    # the achieved MFU is below the assumed one by the exposed share
    assert e["train_mfu"] == pytest.approx(0.5 * 0.12 / step)


def test_a_ring_across_nodes_uses_every_nic_of_a_node(rdir):
    # 2 nodes × 8 GPUs, DDP of 1B parameters under bf16-mixed (fp32 gradients, 4e9 B), 154 buckets (test above).
    # The ring all-reduce sends 2 × 15/16 × 4e9 = 7.5e9 B per GPU. NCCL gives each channel its own NIC and adds the
    # channels' bandwidths (tuning.cc: busBw = nChannels × bwInter), so the ring crosses the network at the node's
    # 8 × 16 GB/s = 128 GB/s (under the 200 GB/s of NVLink inside it), not at one GPU's 16 GB/s.
    # Latency per bucket (Simple): 8.4 µs + 28 NVLink steps × 3.4 µs + 2 network steps × 14.0 µs = 131.6 µs
    e = est(rdir, params="1B", gpu="testgpu", mfu=0.5, max_seq_length=1000, num_gpus=8, num_nodes=2,
            precision="bf16-mixed", total_tokens=100_000)
    assert e["comm_bytes_per_step"] == {"intra": 0, "inter": pytest.approx(7.5e9)}
    assert e["comm_seconds_per_step"] == pytest.approx(7.5e9 / 128e9 + 154 * 131.6e-6)
    # one GPU per node keeps one NIC per rank (the test above: 16 GB/s)
    one = est(rdir, params="1B", gpu="testgpu", mfu=0.5, max_seq_length=1000, num_gpus=1, num_nodes=16,
              precision="bf16-mixed", total_tokens=100_000)
    assert one["comm_seconds_per_step"] > 7.5e9 / 16e9


def test_zero3_moves_one_and_a_half_times_ddp(rdir):
    # bf16 (DDP: bf16-true; DeepSpeed: its bf16 optimizer, 16-bit weights and gradients), 4 GPUs: P = G = 2e9 B,
    # f = 3/4. DDP 2fG = 3e9; ZeRO-3 2fP + fG = 4.5e9 (1.5×: a bare 1e9-element tensor is not reused within
    # stage3_max_reuse_distance, so it is gathered again for the backward); ZeRO-1/2 fG + fP = 3e9
    common = dict(params="1B", gpu="testgpu", num_gpus=4)
    ddp = est(rdir, precision="bf16-true", **common)["comm_bytes_per_step"]["intra"]
    common["precision"] = "bf16-master"
    z1 = est(rdir, zero_stage=1, **common)["comm_bytes_per_step"]["intra"]
    z2 = est(rdir, zero_stage=2, **common)["comm_bytes_per_step"]["intra"]
    z3 = est(rdir, zero_stage=3, **common)["comm_bytes_per_step"]["intra"]
    assert (ddp, z1, z2, z3) == (pytest.approx(3e9), pytest.approx(3e9), pytest.approx(3e9), pytest.approx(4.5e9))
    # with 4 micro-steps ZeRO-2 reduce-scatters every micro-step: 4 × 1.5e9 + 1.5e9 = 7.5e9; ZeRO-3: 4 × 4.5e9
    assert est(rdir, zero_stage=2, gradient_accumulation_steps=4, **common)["comm_bytes_per_step"]["intra"] == pytest.approx(7.5e9)
    assert est(rdir, zero_stage=3, gradient_accumulation_steps=4, **common)["comm_bytes_per_step"]["intra"] == pytest.approx(18e9)


def test_cpu_offload_pcie_copies(rdir):
    # ZeRO-2 over 2 GPUs, fp32: gradient shard 4e9 / 2 down + parameter shard 4e9 / 2 up = 4e9 B at 25 GB/s = 0.16 s
    e = est(rdir, params="1B", gpu="testgpu", num_gpus=2, zero_stage=2, offload_optimizer=True)
    assert e["offload_seconds_per_step"] == pytest.approx(0.16)


# --------------------------------------------------------------------------- throughput sources


def test_seed_throughput_source():
    # the seed's table: 7B on A100-40GB ~1,000 tokens/s (llama-2-7b is 6.74B, within the 1.3 factor)
    e = est(model="llama-2-7b", gpu="a100-40gb", throughput_source="seed", total_tokens=15_360_000)
    assert e["train_tokens_per_second"] == 1000
    assert e["train_seconds"] == pytest.approx(15_360)
    assert e["communication_share"] is None
    # linear scaling to 2 GPUs: 2,000 tokens/s; 70B on 8 × H100: 800 tokens/s
    assert est(model="llama-2-7b", gpu="a100-40gb", num_gpus=2, throughput_source="seed")["train_tokens_per_second"] == 2000
    assert est(params="70B", gpu="h100-sxm", num_gpus=8, throughput_source="seed")["train_tokens_per_second"] == 800


def test_throughput_source_errors():
    with pytest.raises(FitplanError, match="no row for a 13B model on h100-sxm") as info:
        est(params="13B", gpu="h100-sxm", throughput_source="seed")
    assert "13B on 1× a100-80gb" in info.value.suggestion
    with pytest.raises(FitplanError, match="unknown throughput source 'sed'"):
        est(params="7B", gpu="a100-40gb", throughput_source="sed")


def test_given_throughput_implies_mfu():
    # 1,000 tokens/s × 4.2e10 FLOPs per token / 312e12 FLOP/s = 0.1346 (bf16 on one A100)
    e = est(params="7B", gpu="a100-40gb", precision="bf16-mixed", tokens_per_second=1000, total_tokens=1_000_000)
    assert e["train_mfu"] == pytest.approx(4.2e13 / 312e12)


# --------------------------------------------------------------------------- reports


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "fitplan", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_json_time_section():
    p = _cli("estimate", "--params", "7B", "--num-examples", "10000", "--tokens-per-example", "512",
             "--num-train-epochs", "3", "--tokens-per-second", "1000", "--format", "json")
    assert p.returncode == 0, p.stderr
    t = json.loads(p.stdout)["time"]
    assert t["tokens"] == 15_360_000 and t["seconds"] == 15_360 and t["tokens_per_second"] == 1000
    assert t["flops"] == 15_360_000 * 4.2e10
    assert t["mfu"] is None and t["communication_share"] is None  # no GPU: no peak


def test_explain_train_seconds():
    # flops_per_token carries the TRL trainers' reducers: its raw rule (and the attention term's doc) is 7 deep
    texts = []
    for depth in ("7", "8"):  # a deeper tree shows everything a shallower one does (nothing cut is elided later)
        p = _cli("explain", "train_seconds", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--num-gpus", "8", "--bf16",
                 "--zero", "2", "--num-examples", "10000", "--tokens-per-example", "512", "--num-train-epochs", "3",
                 "--format", "json", "--depth", depth)
        assert p.returncode == 0, p.stderr
        texts.append(p.stdout)
    for text in texts:
        for name in ("train_tokens", "train_tokens_per_second", "step_seconds", "compute_seconds_per_step",
                     "comm_seconds_by_window", "micro_step_time", "optimizer_step_seconds", "kernel_efficiency",
                     "assumed_mfu"):
            assert f'"{name}"' in text, name
        assert "PaLM" in text  # the attention term's source shows in its doc


def test_deepspeed_zero2_lora_moves_only_the_adapters(rdir):
    # DeepSpeed stages 1-2 flatten the optimizer's parameter groups (stage_1_and_2.py): only the trainable LoRA
    # weights are reduce-scattered and all-gathered. Llama-2-7B, r = 8 on q_proj and v_proj: 32 layers × 2 ×
    # (4096 × 8 + 8 × 4096) = 4,194,304 parameters, G = 2 B each = 8,388,608 B; 4 GPUs, f = 3/4: f·G + f·G
    e = est(rdir, model="llama-2-7b", method="lora", lora_r=8, lora_target_modules=("q_proj", "v_proj"),
            precision="bf16-master", zero_stage=2, num_gpus=4, gpu="testgpu")
    assert e["trainable_param_count"] == 4_194_304
    assert e["comm_bytes_per_step"]["intra"] == pytest.approx(2 * 0.75 * 8_388_608)
