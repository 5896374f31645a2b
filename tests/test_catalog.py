"""The bundled ruleset data: model catalog, GPUs, providers and instances.

Expected parameter counts are the *published* ones (Hugging Face safetensors metadata, model cards and
papers), typed in here independently of fitplan's code: a mismatch means a wrong config field in the
catalog or a missing detail in ``fitplan.arch.architecture``, never a number to copy from the code's output.
"""

from __future__ import annotations

import pytest

from fitplan.rulesets import loader as rulesets
from fitplan.arch.architecture import spec_from_config
from fitplan.errors import FitplanError


@pytest.fixture(scope="module")
def rs() -> rulesets.Rulesets:
    return rulesets.load()


def count(rs: rulesets.Rulesets, name: str) -> int:
    return spec_from_config(rs.model_entry(name).config).param_count


# ------------------------------------------------------------------------------------------------ models

# The counts the task names.
TASK_COUNTS = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "mistral-7b": 7_241_732_096,  # Mistral-7B-v0.1
    "llama-3-8b": 8_030_261_248,  # Meta-Llama-3-8B
    "gpt2": 124_439_808,
}

# Other published counts (HF model pages' safetensors parameter counts / model cards).
PUBLISHED_COUNTS = {
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "tinyllama-1.1b": 1_100_048_384,
    "codellama-7b": 6_738_546_688,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "mistral-7b-v0.3": 7_248_023_552,
    "mistral-nemo-12b": 12_247_782_400,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648,
    "qwen1.5-moe-a2.7b": 14_315_784_192,
    "qwen3-0.6b": 596_049_920,
    "qwen3-4b": 4_022_468_096,
    "qwen3-8b": 8_190_735_360,
    "gemma-2b": 2_506_172_416,
    "gemma-7b": 8_537_680_896,
    "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984,
    "gemma-2-27b": 27_227_128_320,
    "phi-3-mini": 3_821_079_552,
    "phi-3.5-mini": 3_821_079_552,
    "phi-3-medium": 13_960_238_080,
    "pythia-160m": 162_322_944,
    "pythia-1b": 1_011_781_632,
    "pythia-6.9b": 6_857_302_016,
    "falcon-7b": 6_921_720_704,
    "falcon-rw-1b": 1_311_625_216,
    "olmo-1b": 1_176_764_416,
    "olmo-7b": 6_888_095_744,
}

# Entries the catalog must hold (the popular models fitplan promises to know by name).
REQUIRED_MODELS = {
    "llama-2-7b", "llama-2-13b", "llama-2-70b", "mistral-7b", "llama-3-8b", "llama-3.1-8b", "llama-3.1-70b",
    "llama-3.2-1b", "llama-3.2-3b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b",
    "qwen2.5-72b", "gemma-2b", "gemma-7b", "gemma-2-9b", "gemma-2-27b", "phi-3-mini", "phi-3-medium", "gpt2",
    "gpt2-medium", "gpt2-large", "gpt2-xl", "pythia-1b", "pythia-6.9b", "mixtral-8x7b", "qwen1.5-moe-a2.7b",
    "falcon-7b", "tinyllama-1.1b", "mistral-nemo-12b",
}


@pytest.mark.parametrize("name,expected", sorted(TASK_COUNTS.items()))
def test_task_counts_exact(rs, name, expected):
    assert count(rs, name) == expected


@pytest.mark.parametrize("name,expected", sorted(PUBLISHED_COUNTS.items()))
def test_published_counts_exact(rs, name, expected):
    assert count(rs, name) == expected


def test_moe_totals_and_active_counts(rs):
    mixtral = spec_from_config(rs.model_entry("mixtral-8x7b").config)
    assert round(mixtral.active_param_count / 1e8) == 129  # "12.9B active parameters" (Mistral AI)
    big = spec_from_config(rs.model_entry("mixtral-8x22b").config)
    assert round(big.param_count / 1e9) == 141 and round(big.active_param_count / 1e9) == 39  # "141B, 39B active"
    qmoe = spec_from_config(rs.model_entry("qwen1.5-moe-a2.7b").config)
    assert abs(qmoe.active_param_count / 1e9 - 2.7) < 0.05  # "A2.7B": 2.7B activated
    assert qmoe.num_experts == 60 and qmoe.num_experts_per_tok == 4


def test_catalog_size_and_required_entries(rs):
    assert len(rs.models) >= 28
    assert REQUIRED_MODELS <= set(rs.models)
    assert set(TASK_COUNTS) | set(PUBLISHED_COUNTS) <= set(rs.models)


def test_every_catalog_entry_parses_and_has_a_source(rs):
    for mid, m in rs.models.items():
        assert mid == mid.lower() and " " not in mid
        assert m.source.startswith("https://huggingface.co/") and m.source.endswith("/config.json"), mid
        assert m.hf_id and m.hf_id in m.source, mid
        spec = spec_from_config(m.config, name=mid)
        assert spec.param_count > 0 and spec.model_type == m.config["model_type"]


def test_names_resolve_without_ambiguity(rs):
    owner: dict[str, str] = {}
    for mid, m in rs.models.items():
        for name in (mid, m.hf_id, *m.aliases):
            key = name.lower()
            assert owner.setdefault(key, mid) == mid, f"{name!r} names both {owner[key]} and {mid}"
            assert rs.model_entry(name).id == mid
    assert rs.model_entry("meta-llama/Llama-2-7b-hf").id == "llama-2-7b"
    assert rs.model_entry("mistralai/Mistral-7B-v0.1").id == "mistral-7b"
    assert rs.model_entry("Meta-Llama/Meta-Llama-3-8B").id == "llama-3-8b"


# The checkpoint dtype that from_pretrained(dtype="auto") loads the weights in: the "torch_dtype" of the published
# config.json, float32 where it states none. Typed in from public copies of those config.json files:
PUBLISHED_DTYPES = {
    # meta-llama/Llama-2-7b-hf: scaleapi/llm-engine model-engine/tests/unit/domain/test_llm_use_cases.py
    "llama-2-7b": "float16",
    # meta-llama/Llama-3.1-8B: citsjtu2020/LLM-Prof sglang/Model_Config.md
    "llama-3.1-8b": "bfloat16",
    # openai-community/gpt2 states none: mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py ("gpt2")
    "gpt2": None,
    # google/gemma-2-9b (a base Gemma 2 checkpoint stored in float32, unlike its -it sibling):
    # NVIDIA-NeMo/Megatron-Bridge tests/unit_tests/models/gemma/test_gemma2_bridge.py
    "gemma-2-9b": "float32",
    # microsoft/Phi-3.5-mini-instruct: mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py ("phi-3_5")
    "phi-3.5-mini": "bfloat16",
    # openai/gpt-oss-20b states none (its config.json has no torch_dtype key): public copies of that file
    "gpt-oss-20b": None,
    # issue #25, filled from public copies of the published config.json files (each entry's comment names its copy):
    # mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py ("gpt2_medium", "gpt_bigcode", "stablelm", "olmo2_7b",
    # "olmo2_13b"); the Hub's own stabilityai/stablelm-2-12b config.json (revision 74dd3f5); copies in public test
    # and training code for DeepSeek-V2, falcon-7b, ERNIE-4.5-0.3B-PT; a re-upload of pythia-160m's checkpoint config
    "gpt2-medium": None,
    "gpt-bigcode-santacoder": None,
    "stablelm-3b-4e1t": "bfloat16",
    "stablelm-2-12b": "bfloat16",
    "olmo-2-7b": "float32",
    "olmo-2-13b": "float32",
    "deepseek-v2": "bfloat16",
    "falcon-7b": "bfloat16",
    "ernie-4.5-0.3b": "bfloat16",
    "pythia-160m": "float16",
}


@pytest.mark.parametrize("name,expected", PUBLISHED_DTYPES.items())
def test_published_checkpoint_dtypes(rs, name, expected):
    assert rs.model_entry(name).config.get("torch_dtype") == expected


def test_catalog_dtypes_are_torch_dtype_names(rs):
    """A stated dtype is one of the names a config.json writes (``str(torch.bfloat16).split(".")[1]``)."""
    stated = {mid: m.config["torch_dtype"] for mid, m in rs.models.items() if "torch_dtype" in m.config}
    assert stated and set(stated.values()) <= {"float32", "bfloat16", "float16"}, stated


# ------------------------------------------------------------------------------------------------ GPUs

# Vendor datasheets (each GPU's `source`; docs/sources.md, 'Hardware'): id -> (bandwidth GB/s, bf16 or fp16 dense TFLOPS, fp32 TFLOPS, fp8 or None, NVLink GB/s or None)
DATASHEET_GPUS = {
    "t4": (320, 65, 8.1, None, None),
    "a10g": (600, 70, 31.2, None, None),
    "l4": (300, 121, 30.3, 242.5, None),
    "l40s": (864, 362, 91.6, 733, None),
    "rtx-3090": (936, 71, 35.6, None, None),
    "rtx-4090": (1008, 165.2, 82.6, 330.3, None),
    "v100-16gb": (900, 125, 15.7, None, 300),
    "v100-32gb": (900, 125, 15.7, None, 300),
    "a100-40gb": (1555, 312, 19.5, None, 600),
    "a100-80gb": (2039, 312, 19.5, None, 600),
    "h100-sxm": (3350, 989, 67, 1979, 900),
    "h100-pcie": (2000, 756, 51, 1513, None),
    "h200": (4800, 989, 67, 1979, 900),
    "b200": (8000, 2250, 80, 4500, 1800),
    "mi300x": (5300, 1307, 163.4, 2615, None),
}

# The seed chapter's spellings (single- and multi-GPU tables, price table) -> GPU id.
SEED_SPELLINGS = {
    "RTX 3090": "rtx-3090",
    "RTX 4090": "rtx-4090",
    "A100-40GB": "a100-40gb",
    "A100-80GB": "a100-80gb",
    "H100": "h100-sxm",
    "T4": "t4",
    "A10G": "a10g",
}

# Other names users type, as printed by torch.cuda.get_device_name() or vendors.
COMMON_SPELLINGS = {
    "h100": "h100-sxm",
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "H100 PCIe": "h100-pcie",
    "H200": "h200",
    "B200": "b200",
    "MI300X": "mi300x",
    "Tesla T4": "t4",
    "NVIDIA A100-SXM4-80GB": "a100-80gb",
    "L4": "l4",
    "L40S": "l40s",
    "V100-32GB": "v100-32gb",
}

GiB = 2**30


def test_datasheet_gpus_present_with_datasheet_figures(rs):
    assert set(DATASHEET_GPUS) <= set(rs.gpus)
    for gid, (bw, tensor, fp32, fp8, nvlink) in DATASHEET_GPUS.items():
        g = rs.gpu(gid)
        assert g.bandwidth_gbps == bw, gid
        assert g.peak_tflops.get("bf16", g.peak_tflops.get("fp16")) == pytest.approx(tensor, rel=0.001), gid
        assert g.peak_tflops["fp32"] == pytest.approx(fp32), gid
        assert g.peak_tflops.get("fp8") == (None if fp8 is None else pytest.approx(fp8, rel=0.001)), gid
        if nvlink is not None:
            assert g.interconnect.startswith("nvlink") and g.interconnect_gbps == nvlink, gid
        else:
            assert not g.interconnect.startswith("nvlink"), gid


def test_no_bf16_on_turing_and_volta(rs):
    for gid in ("t4", "v100-16gb", "v100-32gb"):
        assert "bf16" not in rs.gpu(gid).peak_tflops and "tf32" not in rs.gpu(gid).peak_tflops
        assert "fp16" in rs.gpu(gid).peak_tflops


@pytest.mark.parametrize("spelling,gid", sorted({**SEED_SPELLINGS, **COMMON_SPELLINGS}.items()))
def test_gpu_spellings_resolve(rs, spelling, gid):
    assert rs.gpu(spelling).id == gid


@pytest.mark.parametrize("name", ["a100", "v100"])
def test_ambiguous_gpu_names_are_not_aliases(rs, name):
    with pytest.raises(FitplanError):
        rs.gpu(name)


def test_gpu_entries_are_consistent(rs):
    owner: dict[str, str] = {}
    for gid, g in rs.gpus.items():
        assert gid == gid.lower() and g.source and g.name
        for name in (gid, *g.aliases):
            key = name.lower()
            assert owner.setdefault(key, gid) == gid, f"{name!r} names both {owner[key]} and {gid}"
        assert set(g.peak_tflops) <= {"fp32", "tf32", "bf16", "fp16", "fp8", "int8"}, gid
        # torch's total is below the nominal capacity, by less than 8 % (B200: 192 GB nominal, ~180 exposed)
        assert 0.9 * g.memory_bytes < g.usable_bytes < g.memory_bytes, gid
        assert g.inter_node_gbps <= g.interconnect_gbps and g.gpus_per_node >= 1


def test_usable_memory_matches_known_readings(rs):
    # torch total_memory readings (MiB); nvidia-smi prints a few hundred MiB more (H100 81,559; H200 143,771)
    assert rs.gpu("h100-sxm").usable_bytes == 81_089 * 2**20
    assert rs.gpu("h200").usable_bytes == 143_156 * 2**20
    assert rs.gpu("a100-40gb").usable_bytes == 40_536 * 2**20
    assert rs.gpu("t4").usable_bytes == 15_102 * 2**20
    assert rs.gpu("mi300x").usable_bytes == 196_592 * 2**20
    assert rs.gpu("h100-sxm").memory_bytes == 80 * GiB and rs.gpu("h200").memory_bytes == 141 * GiB


# ------------------------------------------------------------------------------------------------ pricing

# Published price rows (each row's `source`; docs/sources.md, 'Cloud prices'): (provider, instance, region) -> (gpu, gpus, on-demand, spot)
PUBLISHED_INSTANCES = {
    ("aws", "g4dn.xlarge", "us-east-1"): ("t4", 1, 0.526, 0.21),
    ("aws", "g5.xlarge", "us-east-1"): ("a10g", 1, 1.006, 0.43),
    ("aws", "g6.xlarge", "us-east-1"): ("l4", 1, 0.805, 0.37),
    ("aws", "p4d.24xlarge", "us-east-1"): ("a100-40gb", 8, 21.96, None),
    ("aws", "p4de.24xlarge", "us-east-1"): ("a100-80gb", 8, 27.45, None),
    ("aws", "p5.48xlarge", "us-east-1"): ("h100-sxm", 8, 55.04, 10.2),
    ("aws", "p5en.48xlarge", "us-east-1"): ("h200", 8, 63.30, None),
    ("aws", "p6-b200.48xlarge", "us-east-1"): ("b200", 8, 113.93, None),
    ("gcp", "a2-highgpu-1g", "us-central1"): ("a100-40gb", 1, 3.673, 1.804),
    ("lambda", "gpu_8x_h100_sxm5", "any"): ("h100-sxm", 8, 8 * 3.99, None),
    ("lambda", "gpu_8x_a100_80gb_sxm4", "any"): ("a100-80gb", 8, 8 * 2.79, None),
    ("lambda", "gpu_8x_b200_sxm6", "any"): ("b200", 8, 8 * 6.69, None),
    # re-read on runpod.io 2026-11-09 (datareceipts/data-receipts 109-gpu-pricing; the 2025-11 rows had 3.29 / 1.59)
    ("runpod", "1x-h100-sxm", "secure"): ("h100-sxm", 1, 3.99, None),
    ("runpod", "1x-a100-80gb-sxm", "secure"): ("a100-80gb", 1, 1.79, None),
    # issue 15's providers, from their pages as transcribed (the rows' `source`): on demand and spot per instance
    ("coreweave", "hgx-h100", "north-america"): ("h100-sxm", 8, 49.24, 19.71),
    ("hyperstack", "1x-rtx-a6000", "any"): ("rtx-a6000", 1, 0.50, 0.40),
    ("nebius", "gpu-h100-sxm_8gpu-128vcpu-1600gb", "eu-north1"): ("h100-sxm", 8, 8 * 3.85, None),
    ("lambda", "gpu_1x_b200_sxm6", "any"): ("b200", 1, 6.99, None),
    ("runpod", "1x-rtx-4090", "secure"): ("rtx-4090", 1, 0.74, None),
    ("runpod", "1x-l4", "secure"): ("l4", 1, 0.49, None),
}

# The seed chapter's table, "Tarification des GPU (Approximative)": its spelling -> (on-demand, spot)
SEED_PRICES = {"T4": (0.50, 0.15), "A10G": (1.50, 0.45), "A100-40GB": (4.00, 1.20), "A100-80GB": (6.00, 1.80),
               "H100": (8.00, 2.40)}


@pytest.mark.parametrize("key", sorted(PUBLISHED_INSTANCES))
def test_published_price_rows(rs, key):
    gpu, gpus, od, spot = PUBLISHED_INSTANCES[key]
    inst = rs.instances[key]
    assert (inst.gpu, inst.gpus) == (gpu, gpus)
    assert inst.on_demand_per_hour == pytest.approx(od)
    assert inst.spot_per_hour == (None if spot is None else pytest.approx(spot))


def test_seed_price_table(rs):
    seed = [i for i in rs.instances.values() if i.provider == "seed"]
    assert len(seed) == len(SEED_PRICES)
    for spelling, (od, spot) in SEED_PRICES.items():
        gid = rs.gpu(spelling).id
        (inst,) = [i for i in seed if i.gpu == gid]
        assert inst.gpus == 1 and inst.on_demand_per_hour == od and inst.spot_per_hour == spot
    # The chapter's worked example: 4 h on an A100-40GB = $16 on demand, $4.80 spot, no spot overhead.
    (a100,) = [i for i in seed if i.gpu == "a100-40gb"]
    assert 4 * a100.on_demand_per_hour == pytest.approx(16.0)
    assert 4 * a100.spot_per_hour == pytest.approx(4.80)
    assert rs.provider("seed").spot_overhead == 0


def test_instances_reference_known_gpus_and_providers(rs):
    assert {"aws", "gcp", "lambda", "runpod", "seed"} <= set(rs.providers)
    for (prov, iid, region), inst in rs.instances.items():
        assert inst.gpu in rs.gpus, (prov, iid)
        assert rs.provider(inst.provider).id == prov
        assert inst.source and inst.date and region, (prov, iid)
        assert inst.on_demand_per_hour > 0
        if inst.spot_per_hour is not None:
            assert inst.spot_per_hour < inst.on_demand_per_hour


def test_providers(rs):
    for p in rs.providers.values():
        assert p.currency == "USD" and p.source
    assert (rs.provider("aws").billing, rs.provider("aws").minimum_seconds) == ("second", 60)
    assert (rs.provider("gcp").billing, rs.provider("gcp").minimum_seconds) == ("second", 60)
    assert rs.provider("runpod").billing == "second"
    assert rs.provider("lambda").billing == "minute"
    assert not any(i.spot_per_hour for i in rs.instances.values() if i.provider == "lambda")  # Lambda has no spot


# ------------------------------------------------------------------------------------------------ files


def test_bundled_rulesets_check_clean():
    assert rulesets.check_paths([rulesets.bundled_dir()]) == []
