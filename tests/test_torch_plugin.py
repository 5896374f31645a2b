"""The torch validation plugin (plugins/fitplan-torch): fitplan's predictions against what PyTorch allocates.

Every expected number here is measured by torch (or counted by transformers), never taken from
fitplan's own output. Model states must match to the byte; where fitplan is off, the case is a strict
xfail naming the term, the bytes and the cause, for the core to fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]
try:
    import fitplan_torch  # noqa: F401
except ImportError:  # not pip-installed: use the source tree (the CLI test then skips)
    sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))

import fitplan  # noqa: E402
import fitplan_torch  # noqa: E402
from fitplan import FitplanError  # noqa: E402
from fitplan.arch.architecture import spec_from_config  # noqa: E402

CONFIGS = ROOT / "tests" / "data" / "configs"
ARCHS = ("tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-gemma", "tiny-phi3", "tiny-gpt2", "tiny-mixtral", "tiny-gpt-neox")
LORA_TARGETS = {"tiny-phi3": ("qkv_proj",), "tiny-gpt-neox": ("query_key_value",), "tiny-gpt2": ("c_attn",)}
STATES = ("parameters", "gradients", "optimizer_states")

warnings.filterwarnings("ignore", module="transformers")
warnings.filterwarnings("ignore", module="peft")

# Known discrepancies in the core, found by this referee (see the plugin's report):
MIXTRAL_FUSED_EXPERTS = (
    "fitplan counts Mixtral experts as E separate gate/up/down Linear weights; transformers 5 stores them fused "
    "as two 3-D parameters per layer (experts.gate_up_proj (E, 2I, h), experts.down_proj (E, h, I)): 10 fewer tensors "
    "per layer, so AdamW has 20 fewer 4-byte step scalars (optimizer states over-predicted by 80 bytes)")
GPT2_LORA_NAMES = (
    "fitplan names GPT-2's attention Linear modules query_key_value/dense; HF's GPT-2 names them attn.c_attn and "
    "attn.c_proj (Conv1D), so --lora-target-modules c_attn is rejected by the estimate")


def config_path(name: str) -> str:
    return str(CONFIGS / name / "config.json")


def load_config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def run(name: str, mode: str = "cpu", **fields):
    fields.setdefault("per_device_train_batch_size", 1)
    fields.setdefault("max_seq_length", 16)
    memtracker = fields.pop("memtracker", False)
    est = fitplan.estimate(model=config_path(name), **fields)
    return fitplan_torch.validate(est, mode=mode, memtracker=memtracker)


# --------------------------------------------------------------------------- the tiny configs themselves


@pytest.mark.parametrize("name", ARCHS)
def test_param_count_matches_transformers(name):
    from fitplan_torch.build import build_model

    cfg = load_config(name)
    model = build_model(cfg, precision="32-true", attn_implementation="sdpa", method="full")
    assert spec_from_config(cfg).param_count == model.num_parameters()


# --------------------------------------------------------------------------- model states, to the byte


def _core_fused_experts() -> bool:
    spec = spec_from_config(json.loads((CONFIGS / "tiny-mixtral" / "config.json").read_text()))
    return any("gate_up_proj" in g.name for g in spec.param_groups())


def _core_gpt2_hf_names() -> bool:
    spec = spec_from_config(json.loads((CONFIGS / "tiny-gpt2" / "config.json").read_text()))
    return any(g.module == "c_attn" for g in spec.param_groups())


def _case_marks(name: str, method: str):
    # strict xfails while the core has the discrepancy; they turn into plain passes once the core is fixed
    if name == "tiny-mixtral" and method == "full" and not _core_fused_experts():
        return [pytest.mark.xfail(strict=True, reason=MIXTRAL_FUSED_EXPERTS)]
    if name == "tiny-gpt2" and method == "lora" and not _core_gpt2_hf_names():
        return [pytest.mark.xfail(strict=True, raises=FitplanError, reason=GPT2_LORA_NAMES)]
    return []


MODEL_STATE_CASES = [
    pytest.param(name, method, precision, marks=_case_marks(name, method), id=f"{name}-{method}-{precision}")
    for name in ARCHS
    for method, precision in (("full", "32-true"), ("full", "bf16-true"), ("full", "bf16-mixed"), ("lora", "bf16-true"))
]


@pytest.mark.parametrize(("name", "method", "precision"), MODEL_STATE_CASES)
def test_model_states_exact(name, method, precision):
    extra = {"lora_target_modules": LORA_TARGETS.get(name, ("q_proj", "v_proj"))} if method == "lora" else {}
    report = run(name, method=method, precision=precision, **extra)
    c = report["components"]
    assert {k: c[k]["predicted"] - c[k]["measured"] for k in STATES} == dict.fromkeys(STATES, 0)


def test_lora_trainable_states_follow_adapters_only():
    full = run("tiny-llama", precision="bf16-true")["components"]
    lora = run("tiny-llama", precision="bf16-true", method="lora", lora_r=4)["components"]
    # peft keeps the adapters in fp32: q_proj and v_proj get A (r×64) and B (out×r) in both layers
    # (q out 64, v out 64) -> 2 layers × 2 modules × (4·64 + 64·4) params × 4 bytes
    assert lora["gradients"]["measured"] == 2 * 2 * (4 * 64 + 64 * 4) * 4
    assert lora["parameters"]["measured"] == full["parameters"]["measured"] + lora["gradients"]["measured"]


# --------------------------------------------------------------------------- the instruments agree


@pytest.mark.parametrize(("name", "precision", "attn", "ckpt"), [
    ("tiny-llama", "bf16-true", "sdpa", False),
    ("tiny-mistral", "32-true", "eager", True),
    ("tiny-gemma", "bf16-mixed", "sdpa", False),
    ("tiny-gpt2", "32-true", "eager", False),
    ("tiny-mixtral", "bf16-true", "sdpa", False),
    # fp32 experts under autocast: _grouped_mm's meta kernel would refuse them (fitplan_torch.build.real_path_under_fake)
    ("tiny-mixtral", "bf16-mixed", "sdpa", False),
])
def test_fake_tensor_mode_matches_real_to_the_byte(name, precision, attn, ckpt):
    kw = dict(precision=precision, attn_implementation=attn, gradient_checkpointing=ckpt,
              per_device_train_batch_size=2, max_seq_length=32)
    real = run(name, "cpu", **kw)["measured"]
    fake = run(name, "fake", **kw)["measured"]
    keys = ("parameters", "buffers", "gradients", "optimizer_states", "inputs", "saved_tensors", "retained", "peak",
            "peak_phase", "phase_peaks", "start")
    assert {k: fake[k] for k in keys} == {k: real[k] for k in keys}


def test_fake_lora_matches_real():
    kw = dict(precision="bf16-true", method="lora", gradient_checkpointing=True, per_device_train_batch_size=2, max_seq_length=32)
    real, fake = run("tiny-qwen2", "cpu", **kw)["measured"], run("tiny-qwen2", "fake", **kw)["measured"]
    assert (fake["peak"], fake["retained"], fake["parameters"]) == (real["peak"], real["retained"], real["parameters"])


def test_live_counter_agrees_with_memtracker():
    m = run("tiny-llama", precision="32-true", per_device_train_batch_size=2, max_seq_length=32, memtracker=True)["measured"]
    assert m["memtracker_error"] is None
    assert m["peak"] == m["memtracker_peak"]


def test_saved_tensor_hooks_see_what_the_forward_retains():
    # without checkpointing, what the forward leaves alive is what autograd saved, except the input ids
    # (saved by the embedding, allocated before the step)
    m = run("tiny-llama", precision="bf16-true", per_device_train_batch_size=2, max_seq_length=32)["measured"]
    assert m["saved_tensors"] - m["retained"] == 2 * 32 * 8


def test_gradient_accumulation_carries_gradients_into_the_next_forward():
    one = run("tiny-llama", precision="bf16-true", per_device_train_batch_size=2, max_seq_length=32)["measured"]
    two = run("tiny-llama", precision="bf16-true", per_device_train_batch_size=2, max_seq_length=32,
              gradient_accumulation_steps=2)["measured"]
    assert (two["retained"], two["gradients"]) == (one["retained"], one["gradients"])
    # the second micro-batch's forward runs with the first one's gradients (and its 4-byte fp32 loss) alive
    assert two["phase_peaks"]["forward"] == one["phase_peaks"]["forward"] + one["gradients"] + 4


def test_report_shape():
    r = run("tiny-llama", precision="bf16-true")
    assert r["mode"] == "cpu" and r["device"] == "cpu" and r["model"] == "tiny-llama"
    assert set(r["components"]) == {"parameters", "gradients", "optimizer_states", "activations", "peak"}
    for c in r["components"].values():
        assert c["relative_error"] == pytest.approx((c["predicted"] - c["measured"]) / c["measured"])
    assert r["peak_phase"]["measured"] in ("forward", "backward", "optimizer_step")
    json.dumps(r)


# --------------------------------------------------------------------------- sharding per rank


def test_zero1_two_gloo_ranks_split_the_optimizer_states():
    single = run("tiny-llama", precision="32-true")["measured"]
    r = run("tiny-llama", precision="32-true", zero_stage=1, num_gpus=2, stack="torch")
    ranks = r["ranks"]
    assert r["world_size"] == 2 and len(ranks) == 2 and "gloo" in r["device"]
    assert sum(x["optimizer_states"] for x in ranks) == single["optimizer_states"]
    # ZeroRedundancyOptimizer assigns whole tensors: each rank is within one tensor's states of half
    largest = 1000 * 64 * 4 * 2 + 4
    for x in ranks:
        assert abs(x["optimizer_states"] - single["optimizer_states"] / 2) <= largest
        assert x["parameters"] == single["parameters"] and x["gradients"] == single["gradients"]


def test_fsdp2_two_gloo_ranks_halve_every_model_state():
    single = run("tiny-llama", precision="bf16-true")["measured"]
    r = run("tiny-llama", precision="bf16-true", fsdp="full_shard", num_gpus=2, stack="torch")
    for x in r["ranks"]:  # every tiny-llama tensor has an even first dimension: exact halves
        assert x["parameters"] == single["parameters"] // 2
        assert x["gradients"] == single["gradients"] // 2
        assert x["optimizer_states"] == (single["optimizer_states"] - 4 * 21) // 2 + 4 * 21


def test_plain_data_parallel_keeps_ddp_buckets():
    # stage 0 over 4 GPUs: DDP (rank 0 of a fake process group) holds a gradient-sized bucket copy from the start
    single = run("tiny-llama", precision="bf16-true")["measured"]
    r = run("tiny-llama", precision="bf16-true", num_gpus=4)
    m = r["measured"]
    assert "fake process group" in r["device"]
    assert (m["parameters"], m["gradients"], m["optimizer_states"]) == (single["parameters"], single["gradients"], single["optimizer_states"])
    assert m["start"] - single["start"] == single["gradients"]


def test_fake_process_group_gives_rank_zero_of_eight():
    single = run("tiny-llama", precision="bf16-true")["measured"]
    r = run("tiny-llama", mode="fake", precision="bf16-true", zero_stage=3, num_gpus=8, stack="torch")
    assert r["world_size"] == 8 and "fake process group" in r["device"]
    assert r["measured"]["parameters"] == single["parameters"] // 8


# --------------------------------------------------------------------------- refusals and errors


def test_too_large_for_cpu_memory_suggests_fake_mode():
    est = fitplan.estimate(model="llama-2-7b", precision="bf16-true", per_device_train_batch_size=1, max_seq_length=512)
    with pytest.raises(FitplanError, match="too large for real CPU memory") as e:
        fitplan_torch.validate(est, mode="cpu", max_cpu_bytes=8 * 2**30)
    assert "--mode fake" in e.value.suggestion


def test_auto_mode_falls_back_to_fake_when_too_large():
    est = fitplan.estimate(model=config_path("tiny-llama"), per_device_train_batch_size=1, max_seq_length=16)
    r = fitplan_torch.validate(est, mode="auto", max_cpu_bytes=1000, memtracker=False)
    assert r["mode"] == "fake"


def test_model_without_architecture_cannot_be_built():
    est = fitplan.estimate(params="7B")
    with pytest.raises(FitplanError, match="model architecture"):
        fitplan_torch.validate(est, mode="fake")


def test_unbuildable_config_is_a_fitplan_error(tmp_path):
    cfg = load_config("tiny-llama")
    # a field the memory model does not read (the learned file has no switch on it) but transformers does:
    # an unknown activation is refused by fitplan itself now (a switch not learned)
    cfg["rope_parameters"] = {"rope_type": "no-such-rope", "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    est = fitplan.estimate(model=str(tmp_path / "config.json"), max_seq_length=16)
    with pytest.raises(FitplanError, match="cannot build"):
        fitplan_torch.validate(est, mode="cpu")


@pytest.mark.parametrize(("fields", "match"), [
    ({"precision": "16-master", "zero_stage": 2, "num_gpus": 2}, "refuses fp16"),
    ({"attn_implementation": "flash_attention_2"}, "CUDA only"),
    ({"tensor_parallel": 2, "num_gpus": 2}, "tensor parallelism"),
    ({"fsdp": "full_shard", "num_gpus": 2, "offload_optimizer": True, "offload_params": True}, "pins host memory"),
    ({"fsdp": "full_shard", "num_gpus": 2, "precision": "16-mixed"}, "runs fp32 and bf16"),
])
def test_what_the_cpu_cannot_run_is_refused_clearly(fields, match):
    est = fitplan.estimate(model=config_path("tiny-llama"), max_seq_length=16, **fields)
    with pytest.raises(FitplanError, match=match):
        fitplan_torch.validate(est, mode="cpu")


def test_accelerate_fsdp_needs_real_ranks_on_the_cpu():
    est = fitplan.estimate(model=config_path("tiny-llama"), max_seq_length=16, fsdp="full_shard", num_gpus=2)
    with pytest.raises(FitplanError, match="accelerate FSDP referee runs real gloo ranks"):
        fitplan_torch.validate(est, mode="fake")


def test_cuda_mode_without_a_gpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    est = fitplan.estimate(model=config_path("tiny-llama"), max_seq_length=16)
    with pytest.raises(FitplanError, match="needs a CUDA GPU"):
        fitplan_torch.validate(est, mode="cuda")


def test_missing_torch_is_a_clear_fitplan_error():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import fitplan, fitplan_torch, fitplan_torch.plugin\n"
        "est = fitplan.estimate(model=sys.argv[1], max_seq_length=16)\n"
        "try:\n"
        "    fitplan_torch.plugin.fitplan_validate(est.scenario, est, {'mode': 'cpu', 'steps': 1, 'calibrate_out': None})\n"
        "except fitplan.FitplanError as e:\n"
        "    print(e.suggestion)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins" / "fitplan-torch" / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code, config_path("tiny-llama")], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install torch==2.13.0" in out.stdout


# --------------------------------------------------------------------------- calibration


def test_calibration_writer_round_trips_through_ruleset_dir(tmp_path):
    from fitplan_torch.calibrate import calibration_from_measurement, write_framework_toml

    raw = {"device_name": "NVIDIA H200", "total_bytes": 150_000_000_000, "free_bytes": 100_000_000_000,
           "memory_reserved": 49_000_000_000, "memory_allocated": 1_000_000, "max_memory_allocated": 40_000_000_000,
           "max_memory_reserved": 42_000_000_000, "cublas_workspace_bytes": 8_519_680, "torch_version": "2.13.0"}
    cal = calibration_from_measurement(raw)
    assert cal["cuda_context_bytes"] == 150_000_000_000 - 100_000_000_000 - 49_000_000_000
    assert cal["allocator_reserve_ratio"] == 1.05
    assert cal["cublas_workspace_bytes"] == 8_519_680
    row = {"gpu": "h200", "mfu": 0.41, "model": "llama-2-7b", "method": "full", "source": "test", "date": "2025-01-01"}
    write_framework_toml(tmp_path / "calibration.toml", cal, [row])
    from fitplan.rulesets import loader as rulesets

    assert rulesets.check_paths([tmp_path]) == []
    est = fitplan.estimate(model="llama-2-7b", max_seq_length=16, ruleset_dirs=[tmp_path])
    fw = est["framework"]
    assert (fw.cuda_context_bytes, fw.cublas_workspace_bytes, fw.allocator_reserve_ratio) == (1_000_000_000, 8_519_680, 1.05)


def test_calibration_needs_a_step_that_allocated():
    from fitplan_torch.calibrate import calibration_from_measurement

    with pytest.raises(FitplanError, match="max_memory_allocated"):
        calibration_from_measurement({"total_bytes": 1, "free_bytes": 0, "memory_reserved": 0, "max_memory_allocated": 0,
                                      "max_memory_reserved": 0})


def test_calibrate_is_refused_off_cuda(tmp_path):
    est = fitplan.estimate(model=config_path("tiny-llama"), max_seq_length=16)
    with pytest.raises(FitplanError, match="does not exist on the CPU"):
        fitplan_torch.validate(est, mode="cpu", calibrate_out=str(tmp_path / "c.toml"))
    assert not (tmp_path / "c.toml").exists()


# --------------------------------------------------------------------------- the Trainer callback


def test_callback_logs_predicted_and_measured_peak_in_a_trainer_run(tmp_path):
    import transformers
    from fitplan_torch.build import build_model

    est = fitplan.estimate(model=config_path("tiny-llama"), precision="32-true", per_device_train_batch_size=2, max_seq_length=16)
    model = build_model(load_config("tiny-llama"), precision="32-true", attn_implementation="sdpa", method="full")
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(4):
        ids = torch.randint(0, 1000, (16,), generator=g)
        data.append({"input_ids": ids, "labels": ids.clone()})
    cb = fitplan_torch.FitplanCallback(est)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2, use_cpu=True,
                                          report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    assert [r["step"] for r in cb.history] == [1, 2]
    params = sum(p.numel() * 4 for p in model.parameters())
    for r in cb.history:
        assert r["peak_predicted_bytes"] == est["peak_bytes"]
        assert r["peak_measured_bytes"] > 3 * params  # weights + gradients + AdamW's two states at least
        assert r["tokens_per_second"] > 0
    assert cb.summary()["steps"] == 2


# --------------------------------------------------------------------------- the command line


def _plugin_installed() -> bool:
    import importlib.metadata

    return any(ep.value.startswith("fitplan_torch") for ep in importlib.metadata.entry_points(group="fitplan"))


@pytest.mark.skipif(not _plugin_installed(), reason="fitplan-torch is not pip-installed (no entry point)")
def test_cli_validate_json():
    out = subprocess.run([sys.executable, "-m", "fitplan", "validate", "--model", config_path("tiny-gemma"), "--precision",
                          "bf16-true", "--per-device-train-batch-size", "1", "--max-seq-length", "16", "--mode", "cpu",
                          "--format", "json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["components"]["parameters"]["relative_error"] == 0.0


@pytest.mark.skipif(not _plugin_installed(), reason="fitplan-torch is not pip-installed (no entry point)")
def test_cli_too_large_exits_2_without_traceback():
    out = subprocess.run([sys.executable, "-m", "fitplan", "validate", "--model", "llama-2-70b", "--max-seq-length", "512",
                          "--mode", "cpu"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2
    assert "--mode fake" in out.stderr and "Traceback" not in out.stderr
