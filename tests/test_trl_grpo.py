"""GRPO and RLOO with TRL 1.16 (``trainer = "grpo"``, ``"rloo"``): the round TRL resolves, its config checks, each
phase's peak against TRL's own ``GRPOTrainer`` / ``RLOOTrainer`` on the CPU (fitplan-torch's GRPO referee), the KV cache against transformers'
``DynamicCache``, vLLM's allocation and a round's time derived by hand from the cited formulas.

Every expected number is measured by torch / computed by TRL, or derived here by hand; every scenario states
``optim`` and ``precision``. The referee runs take about 20-40 s each on a quiet 2-core machine (module-scoped).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import fitplan
from fitplan import FitplanError

from conftest import run_cli, run_json

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"
warnings.filterwarnings("ignore", module="transformers")
warnings.filterwarnings("ignore", module="trl")

P, C, G, B = 8, 16, 4, 4
"""prompt tokens, completion tokens, num_generations, per_device_train_batch_size of the referee's runs."""


def _tiny(name: str, trainer: str = "grpo", precision: str = "32-true", **extra):
    return fitplan.estimate(model=str(CONFIGS / name / "config.json"), trainer=trainer, num_generations=G,
                            max_completion_length=C, prompt_length=P, per_device_train_batch_size=B,
                            optim="adamw_torch", precision=precision, device="cpu", **extra)


def _qwen7b(**extra):
    fields = dict(model="qwen2.5-7b", trainer="grpo", num_generations=8, max_completion_length=1024,
                  num_gpus=8, gpu="h100-sxm", optim="adamw_torch_fused", precision="bf16-true")
    fields.update(extra)
    return fitplan.estimate(**fields)


# --------------------------------------------------------------------------- the round, as TRL resolves it


@pytest.mark.parametrize("fields", [
    dict(per_device_train_batch_size=2, gradient_accumulation_steps=3, num_generations=3),
    dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=2, steps_per_generation=4),
    dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=4, generation_batch_size=8),
])
def test_round_matches_grpo_config(fields):
    trl = pytest.importorskip("trl")
    cfg = trl.GRPOConfig(output_dir="/tmp/fitplan-grpo-config", use_cpu=True, bf16=False, report_to=[], **fields)
    o = fitplan.estimate(model=str(CONFIGS / "tiny-llama" / "config.json"), trainer="grpo", optim="adamw_torch",
                         precision="32-true", device="cpu", **fields)["online_settings"]
    assert (o.generation_batch_size, o.steps_per_generation) == (cfg.generation_batch_size, cfg.steps_per_generation)
    assert o.sequence_length == o.prompt_length + cfg.max_completion_length  # TRL's default 512


@pytest.mark.parametrize("fields", [
    dict(per_device_train_batch_size=2, num_generations=8),                       # 2 sequences per round
    dict(per_device_train_batch_size=2, num_generations=1, generation_batch_size=2),
    dict(per_device_train_batch_size=2, num_generations=2, generation_batch_size=4, steps_per_generation=2),
    dict(per_device_train_batch_size=4, num_generations=2, generation_batch_size=6),  # 6 % 4
])
def test_trl_config_errors_are_trls(fields):
    trl = pytest.importorskip("trl")
    with pytest.raises(ValueError) as theirs:
        trl.GRPOConfig(output_dir="/tmp/fitplan-grpo-config", use_cpu=True, bf16=False, report_to=[], **fields)
    with pytest.raises(FitplanError) as ours:
        fitplan.estimate(model=str(CONFIGS / "tiny-llama" / "config.json"), trainer="grpo", optim="adamw_torch",
                         precision="32-true", device="cpu", **fields)
    their_words = str(theirs.value).split(". ")[0].rstrip(".")
    assert their_words in str(ours.value)


def test_cli_bad_trl_field_exits_2():
    r = subprocess.run([sys.executable, "-m", "fitplan", "estimate", "--trainer", "grpo", "--model", "qwen2.5-7b",
                        "--num-generations", "3", "--num-gpus", "8", "--optim", "adamw_torch_fused",
                        "--precision", "bf16-true"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "generation_batch_size (8) must be divisible by num_generations (3)" in r.stderr


def test_server_mode_gpus_do_not_train():
    # 9 GPUs, vLLM server on 1 (vllm_tensor_parallel_size 1): 8 train, the round is 8 sequences
    est = _qwen7b(num_gpus=9, use_vllm=True, vllm_mode="server")
    assert est["world_size"] == 8
    assert est["online_settings"].generation_batch_size == 8
    with pytest.raises(FitplanError, match="leaving none"):
        _qwen7b(num_gpus=1, use_vllm=True, vllm_mode="server")


def test_sft_is_untouched():
    est = fitplan.estimate(model="qwen2.5-7b", optim="adamw_torch_fused", precision="bf16-true", num_gpus=8)
    assert est["online_settings"] is None
    assert set(est["phase_bytes"]) == {"forward", "backward", "optimizer_step"}
    assert est.scenario.training.max_seq_length == 2048


# --------------------------------------------------------------------------- the KV cache, measured by torch


def test_kv_cache_is_transformers_dynamic_cache():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = json.loads((CONFIGS / "tiny-qwen2" / "config.json").read_text())
    config = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    ids = torch.randint(0, cfg["vocab_size"] - 1, (G, P))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=C, min_new_tokens=C,
                         do_sample=True, return_dict_in_generate=True, pad_token_id=0)
    cache = out.past_key_values
    measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    from fitplan.builtin.trl.generation import kv_cache_bytes

    arch = _tiny("tiny-qwen2").arch  # the cache after the last decode step, as fitplan sizes it
    assert kv_cache_bytes(arch.num_hidden_layers, G, arch.kv_dim, P + C - 1, 4) == measured
    # by hand: 2 layers × (K, V) × 4 sequences × (2 kv heads × 16) × (8 + 16 − 1) positions × 4 bytes
    assert measured == 2 * 2 * 4 * 32 * 23 * 4


# --------------------------------------------------------------------------- the referee: each phase within 1 %

LORA = {"lora_r": 8, "lora_target_modules": ("q_proj", "v_proj")}
REFEREE = {
    "dense-full-beta": ("tiny-llama", dict(beta=0.04), None),  # a reference copy: the scoring phase runs
    "dense-lora": ("tiny-qwen2", {}, LORA),
    "tied-full": ("tiny-gemma", {}, None),
    "moe-full": ("tiny-mixtral", {}, None),
    # RLOOTrainer: old log-probs always, beta 0.05 by default: with LoRA the reference is the adapter disabled
    "rloo-lora": ("tiny-qwen2", dict(trainer="rloo", beta=0.05), LORA),
    # GRPOConfig's own defaults: bf16 autocast over the fp32 weights, gradient checkpointing
    "dense-bf16-checkpointing": ("tiny-llama", dict(bf16=True, gradient_checkpointing=True), None),
}


@pytest.fixture(scope="module")
def referee():
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    from fitplan_torch.grpo import measure_grpo

    cache: dict[str, dict] = {}

    def measure(case: str) -> dict:
        if case not in cache:
            name, kw, lora = REFEREE[case]
            cfg = json.loads((CONFIGS / name / "config.json").read_text())
            kw = {"gradient_checkpointing": False, **kw}
            cache[case] = measure_grpo(cfg, prompt_length=P, max_completion_length=C, num_generations=G,
                                       per_device_train_batch_size=B, lora=lora, **kw)["phases"]
        return cache[case]

    return measure


@pytest.mark.parametrize("case", list(REFEREE))
def test_each_phase_within_one_percent_of_the_trainer(referee, case):
    name, kw, lora = REFEREE[case]
    extra = dict(method="lora", lora_r=lora["lora_r"], lora_target_modules=lora["lora_target_modules"]) if lora else {}
    kw = dict(kw)
    if kw.pop("bf16", False):
        extra["precision"] = "bf16-mixed"  # TrainingArguments bf16=True over fp32 weights
    est = _tiny(name, **kw, **extra)
    measured = referee(case)
    assert set(measured) == set(est["phase_bytes"]), (measured, est["phase_bytes"])
    off = {ph: est["phase_bytes"][ph] / b - 1 for ph, b in measured.items()}
    assert all(abs(x) <= 0.01 for x in off.values()), off


# --------------------------------------------------------------------------- phases: what each adds, by hand


def test_reference_copy_is_resident_in_every_phase():
    full, beta = _tiny("tiny-llama"), _tiny("tiny-llama", beta=0.04)
    # tiny-llama: embed 1000·64 + lm_head 64·1000 + 2 layers (4·64·64 + 3·64·176 + 2·64) + norm 64 = 228,672
    # parameters, fp32 (load dtype): 914,688 bytes
    copy = 228_672 * 4
    assert beta["ref_model_bytes"] == copy
    for ph in ("forward", "backward", "optimizer_step"):
        # beta != 0 also keeps the reference log-probs in the round's batch: 4 bytes per completion token
        assert beta["phase_bytes"][ph] - full["phase_bytes"][ph] == copy + 4 * B * C
    assert "scoring" not in full["phase_bytes"] and "scoring" in beta["phase_bytes"]


def test_vllm_colocate_reserve_by_hand():
    est = _qwen7b(use_vllm=True, vllm_mode="colocate")
    m = est["vllm_memory"]
    usable = 85_027_979_264  # rulesets/hardware/nvidia.toml, h100-sxm usable_bytes
    weights = 7_615_616_512 * 2  # rulesets/models/qwen.toml's count, served in bf16
    # profile: 4096 tokens × (3 × 18944 + 2 × 3584) × 2 bytes + sampler 2 × 256 × 152064 × 4
    acts = 4096 * (3 * 18944 + 2 * 3584) * 2 + 2 * 256 * 152064 * 4
    page = 2 * 16 * 4 * 128 * 2  # K and V × 16 tokens × 4 kv heads × 128 × bf16
    blocks = (int(usable * 0.3) - weights - acts) // page // 28
    assert (m["reserve_bytes"], m["weights_bytes"], m["activation_bytes"]) == (int(usable * 0.3), weights, acts)
    assert m["kv_blocks"] == blocks == 10_290
    assert m["kv_tokens"] == blocks * 16
    assert m["sequences_at_once"] == blocks * 16 // (256 + 1024)
    # colocated, awake for the whole run: the training process has the GPU less the reserve; its own phases
    # are those of a run whose vLLM is a server elsewhere (same round, 8 training GPUs)
    served = _qwen7b(use_vllm=True, vllm_mode="server", num_gpus=9)
    assert est["phase_bytes"] == served["phase_bytes"]
    assert est["usable_bytes"] == usable - int(usable * 0.3)
    assert served["usable_bytes"] == usable


def test_vllm_sleep_mode_needs_room_in_the_generation_phase_only():
    awake = _qwen7b(use_vllm=True)
    asleep = _qwen7b(use_vllm=True, vllm_enable_sleep_mode=True)
    usable, reserve = 85_027_979_264, int(85_027_979_264 * 0.3)
    assert awake["phase_bytes"] == asleep["phase_bytes"]
    assert awake["usable_bytes"] == usable - reserve and asleep["usable_bytes"] == usable
    gen, overhead = asleep["phase_bytes"]["generation"], asleep["framework_overhead_bytes"]
    assert asleep["vllm_sleep_headroom"] == usable - (gen + overhead + reserve)
    assert awake["vllm_sleep_headroom"] is None


# --------------------------------------------------------------------------- time, by hand


def test_decode_time_by_hand():
    est = _qwen7b(num_examples=800)
    rs = est["online_round_seconds"]
    eff = est["kernel_efficiency"]
    # one sequence per process (8 per round over 8 GPUs); 1023 decode steps at a mean cache of 256 + 512 positions
    kv = 1 * 28 * 2 * 512 * 768 * 2
    memory = (7_615_616_512 * 2 + kv) / (3350e9 * eff.memory)
    flops = 2 * est.arch.active_param_count / (989e12 * eff.gemm)  # h100-sxm bf16 dense peak 989 TFLOPS
    host = (12 * 28 + 10) * eff.host_seconds_per_kernel
    step = (max(memory, flops) ** 2 + host ** 2) ** 0.5
    assert rs["decode"] == pytest.approx(1023 * step, rel=1e-9)
    assert est["online_rounds"] == 800 * 8 / 8
    assert est["train_seconds"] == pytest.approx(
        est["online_rounds"] * (rs["generation"] + rs["scoring"] + rs["training"]), rel=1e-9)


def test_done_when_command_shows_phases_reserve_and_time():
    r = subprocess.run([sys.executable, "-m", "fitplan", "estimate", "--trainer", "grpo", "--model", "qwen2.5-7b",
                        "--num-generations", "8", "--max-completion-length", "1024", "--use-vllm", "--vllm-mode",
                        "colocate", "--num-gpus", "8", "--gpu", "h100-sxm", "--optim", "adamw_torch_fused",
                        "--precision", "bf16-true"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for word in ("phases", "generation", "vLLM", "for training", "round time", "decode"):
        assert word in r.stdout


def test_recommend_searches_grpo_plans():
    # the recommender varies batch, GPUs and method: the round is a quantity re-derived per plan, and its own
    # check (search vs estimate, search/recommend.py) holds for every ranked plan
    r = subprocess.run([sys.executable, "-m", "fitplan", "recommend", "--trainer", "grpo", "--model", "qwen2.5-7b",
                        "--num-examples", "1000", "--optim", "adamw_torch_fused", "--num-generations", "2",
                        "--per-device-train-batch-size", "2", "--format", "json"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plans"]


def test_zero3_gathers_the_whole_model_for_generate():
    # unwrap_model_for_generation(gather_deepspeed3_params=True): the generation phase holds the full bf16 weights
    # (rulesets/models/qwen.toml: 7,615,616,512 parameters), the rank's shard plus the gathered rest
    est = _qwen7b(zero_stage=3, stack="deepspeed", precision="bf16-master")
    gathered = est["generation_gathered_bytes"]
    assert gathered + est["weight_bytes"] == 7_615_616_512 * 2
    assert est["phase_rows"]["generation"]["gathered_params"] == gathered
    assert _qwen7b()["generation_gathered_bytes"] == 0  # DDP: every rank holds the whole model already


# --------------------------------------------------------------------------- the done-when command: time and cost

DONE_WHEN = ["estimate", "--trainer", "grpo", "--model", "qwen2.5-7b", "--num-generations", "8",
             "--max-completion-length", "1024", "--use-vllm", "--vllm-mode", "colocate", "--num-gpus", "8",
             "--gpu", "h100-sxm", "--optim", "adamw_torch_fused", "--precision", "bf16-true"]


def _cli(*args: str) -> dict[str, str]:
    """The report's lines as {label: text} (the first line of each label)."""
    r = subprocess.run([sys.executable, "-m", "fitplan", *args], capture_output=True, text=True, cwd=ROOT,
                       env={**__import__("os").environ, "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    lines: dict[str, str] = {}
    for line in r.stdout.splitlines():
        label, _, text = line.strip().partition("  ")
        if text and label not in lines:
            lines[label] = text.strip()
    return lines


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_done_when_command_without_prompts_asks_for_them():
    # TRL's GRPO dataset is prompts: the only thing missing for time and cost is how many
    assert _cli(*DONE_WHEN)["time"] == "give --num-examples (the prompts) to estimate the run's time and cost"


def test_done_when_command_with_prompts_splits_time_and_prices_it():
    import math
    import re
    import tomllib
    out = _cli(*DONE_WHEN, "--num-examples", "1000", "--provider", "lambda")
    # 1000 prompts × 8 completions × (256 assumed prompt + 1024 completion) tokens
    assert out["tokens"].startswith(f"{1000 * 8 * (256 + 1024):,} trained")
    seconds = _number(re.search(r"\(([\d,]+) s\)", out["time"]).group(1))
    gen, train = (float(x) for x in re.search(r"generation ([\d.]+) h \+ training ([\d.]+) h", out["round time"]).groups())
    assert gen + train == pytest.approx(seconds / 3600, abs=0.011)  # two rounded figures
    assert gen > 10 * train  # 1023 memory-bound decode steps per round against one training step
    # rulesets/pricing/lambda.toml: gpu_8x_h100_sxm5 at 31.92 USD/h, billed per minute; one instance holds 8 GPUs
    lam = tomllib.loads((ROOT / "rulesets" / "pricing" / "lambda.toml").read_text())
    inst = next(i for i in lam["instance"] if i["id"] == "gpu_8x_h100_sxm5")
    billed_hours = math.ceil(seconds / 60) / 60  # `seconds` is rounded to 1 s: at most one minute off
    cost = _number(re.match(r"([\d,.]+) USD on demand", out["cost"]).group(1))
    assert cost == pytest.approx(inst["on_demand_per_hour"] * billed_hours, abs=inst["on_demand_per_hour"] / 60)
    assert "lambda gpu_8x_h100_sxm5" in out["instances"]


def test_cost_without_provider_lists_who_rents_the_gpu():
    # as for SFT: no provider, no price; the line names the bundled providers renting the GPU, cheapest per GPU-hour
    # first (read here from rulesets/pricing/*.toml, the seed's reference table left out)
    import tomllib
    best: dict[str, float] = {}
    for path in (ROOT / "rulesets" / "pricing").glob("*.toml"):
        data = tomllib.loads(path.read_text())
        if any(p.get("reference") for p in data.get("provider", [])):
            continue
        for i in data.get("instance", []):
            if i["gpu"] == "h100-sxm":
                best[i["provider"]] = min(best.get(i["provider"], float("inf")), i["on_demand_per_hour"] / i["gpus"])
    for args in (DONE_WHEN, ["estimate", "--model", "qwen2.5-7b", "--num-gpus", "8", "--gpu", "h100-sxm",
                             "--optim", "adamw_torch_fused", "--precision", "bf16-true", "--tokens-per-example", "512"]):
        text = _cli(*args, "--num-examples", "1000")["cost"]
        head = "give --provider to price it (NVIDIA H100 SXM 80GB per GPU-hour on demand: "
        assert text.startswith(head)
        pairs = [item.rsplit(" ", 2) for item in text[len(head):].rstrip(")").split(", ") if "more" not in item]
        prices = [float(price) for _, price, _ in pairs]
        assert prices == sorted(prices) and len(pairs) == 4
        # a plugin's ruleset (tests' .test-plugins) may add providers; each bundled one shows its own cheapest price
        bundled = [(name, float(price)) for name, price, _ in pairs if name in best]
        assert bundled and all(price == pytest.approx(best[name], abs=0.005) for name, price in bundled)
        assert min(best, key=best.get) in [name for name, _ in bundled]  # the cheapest bundled one is listed


AS_WRITTEN = ("--trainer", "grpo", "--model", "qwen2.5-7b", "--num-generations", "8", "--max-completion-length", "1024",
             "--use-vllm", "--vllm-mode", "colocate", "--num-gpus", "8", "--gpu", "h100-sxm")
"""Issue #34's done-when command, exactly as written (no --provider, no --num-examples)."""


def _cheapest_h100_sxm_gpu_hour() -> tuple[str, float]:
    """By hand from the loaded pricing tables (the bundled rulesets/pricing/*.toml and the test plugins'): the
    least on-demand price per GPU-hour of an instance with h100-sxm GPUs, among USD providers that are not
    reference tables."""
    rules = fitplan.estimate(model="qwen2.5-7b", gpu="h100-sxm").rulesets
    best = None
    for (provider, _, _), inst in rules.instances.items():
        p = rules.providers.get(provider)
        if inst.gpu != "h100-sxm" or p is None or p.reference or p.currency != "USD":
            continue
        price = inst.on_demand_per_hour / inst.gpus
        if best is None or price < best[1]:
            best = (provider, price)
    return best


def test_done_when_command_exactly_as_written_shows_phases_reserve_time_and_cost():
    """The text report has the generation and training phases, vLLM's reserve, a round's time split into
    generation and training, and a cost: without --provider and --num-examples, a round and an hour of rounds
    at the cheapest bundled on-demand price, stated as such. The JSON's figures by hand: vLLM's reserve is
    ``gpu_memory_utilization`` (TRL default 0.3) × the GPU's total as torch reports it (81,089 MiB for an H100
    SXM, rulesets/hardware/nvidia.toml); the round's cost is its seconds × 8 GPUs × the cheapest GPU-hour."""
    r = run_cli("estimate", *AS_WRITTEN)
    assert r.returncode == 0, r.stderr
    phases = next(line for line in r.stdout.splitlines() if line.strip().startswith("phases"))
    assert "generation" in phases and "backward" in phases and "optimizer_step" in phases
    vllm_line = next(line for line in r.stdout.splitlines() if line.strip().startswith("vLLM"))
    assert "colocated, for the whole run" in vllm_line
    time_line = next(line for line in r.stdout.splitlines() if line.strip().startswith("round time"))
    assert "generation" in time_line and "training" in time_line
    cost = next(line for line in r.stdout.splitlines() if line.strip().startswith("round cost"))
    assert "cheapest bundled on-demand price" in cost and "per hour" in cost

    out = run_json("estimate", *AS_WRITTEN)
    assert out["vllm"]["reserve_bytes"] == int(0.3 * 81_089 * 2**20)
    provider, price = _cheapest_h100_sxm_gpu_hour()
    rs, c = out["round_seconds"], out["round_cost"]
    assert rs["total"] == pytest.approx(rs["generation"] + rs["scoring"] + rs["training"])
    assert c["provider"] == provider and c["per_gpu_hour"] == pytest.approx(price)
    assert c["per_hour"] == pytest.approx(8 * price)
    assert c["per_round"] == pytest.approx(rs["total"] * 8 * price / 3600)


def test_explain_derives_the_round_cost_from_the_round_time():
    r = run_cli("explain", *AS_WRITTEN, "online_round_cost")
    assert r.returncode == 0, r.stderr
    assert "online_round_cost = " in r.stdout and "online_round_seconds = " in r.stdout and "gpu_spec" in r.stdout
