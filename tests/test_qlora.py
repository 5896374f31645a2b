"""QLoRA as transformers 5.24 and bitsandbytes 0.50.2 build it, derived by hand from their source
(builtin/lora.py's docstring cites the lines); the CPU referee measures the same rules on tiny models
(docs/accuracy-stacks.md).

A 4-bit weight of n elements with double quantisation: ceil(n/2) packed bytes, one uint8 absmax per 64-element
block, one fp32 absmax per 256 blocks, the 16-entry fp32 code (64 B), the 256-entry fp32 second-level code and
its fp32 offset (1,028 B) — one set per Linear4bit.
"""

from __future__ import annotations

import math

import fitplan


def nf4(n: int) -> int:
    blocks = math.ceil(n / 64)
    return math.ceil(n / 2) + blocks + math.ceil(blocks / 256) * 4 + 64 + 1028


def test_llama_2_7b_qlora_weights_by_hand():
    # 32 layers × (4 attention projections 4096² + 3 MLP 4096 × 11008) in 4 bits
    layer = 4 * nf4(4096 * 4096) + 3 * nf4(4096 * 11008)
    assert nf4(4096 * 4096) == 8_388_608 + 262_144 + 4_096 + 1_092
    # unquantized: embedding + head 2 × 32000 × 4096, 65 norms of 4096; prepare_model_for_kbit_training -> fp32
    unquantized = 2 * 32000 * 4096 + 65 * 4096
    adapters = 32 * 2 * (4096 * 8 + 8 * 4096)  # r = 8 on q_proj and v_proj, fp32
    e = fitplan.estimate(model="llama-2-7b", method="qlora", precision="bf16-true", lora_r=8,
                         lora_target_modules=("q_proj", "v_proj"))
    assert e["qlora_unquantized_param_count"] == unquantized
    assert e["weight_bytes"] == 32 * layer + 4 * unquantized + 4 * adapters
    # without the k-bit preparation the unquantized base stays in bf16
    none = fitplan.estimate(model="llama-2-7b", method="qlora", precision="bf16-true", lora_r=8,
                            lora_target_modules=("q_proj", "v_proj"), kbit_preparation="none")
    assert none["weight_bytes"] == 32 * layer + 2 * unquantized + 4 * adapters


def test_without_double_quantisation_absmax_is_fp32():
    n = 4096 * 4096
    single = math.ceil(n / 2) + 4 * math.ceil(n / 64) + 64
    dq = fitplan.estimate(model="llama-2-7b", method="qlora", precision="bf16-true", lora_target_modules=("q_proj",),
                          lora_r=8)
    plain = fitplan.estimate(model="llama-2-7b", method="qlora", precision="bf16-true", lora_target_modules=("q_proj",),
                             lora_r=8, bnb_4bit_use_double_quant=False)
    assert plain["weight_bytes"] - dq["weight_bytes"] == 32 * 4 * (single - nf4(n)) + 32 * 3 * (
        math.ceil(4096 * 11008 / 2) + 4 * math.ceil(4096 * 11008 / 64) + 64 - nf4(4096 * 11008))


def test_mixtral_fused_experts_stay_16_bit_and_the_output_says_what_they_cost():
    # transformers 5's MixtralExperts keeps gate_up_proj / down_proj as 3-D parameters, not nn.Linear: bitsandbytes
    # leaves them; 32 layers × 8 experts × 3 × 4096 × 14336 = 45,097,156,608 parameters
    e = fitplan.estimate(model="mixtral-8x7b", method="qlora", precision="bf16-true", gradient_checkpointing=True,
                         gpu="h100-sxm")
    experts = 32 * 8 * 3 * 4096 * 14336
    assert e["qlora_unquantized_param_count"] >= experts
    assert e["qlora_unquantized_bytes"] == 4 * e["qlora_unquantized_param_count"]  # peft's fp32 cast
    from fitplan.rules.advice import advise

    tips = {a.id: a for a in advise(e)}
    assert "qlora-unquantized-fp32" in tips and "fused MoE experts" in tips["qlora-unquantized-fp32"].message
    # TRL's SFTTrainer (kbit_preparation = "trl") keeps them in bf16 and casts the adapters to bf16 as well:
    # 2 bytes less per unquantized parameter and per adapter parameter
    trl = fitplan.estimate(model="mixtral-8x7b", method="qlora", precision="bf16-true", gradient_checkpointing=True,
                           kbit_preparation="trl")
    assert e["weight_bytes"] - trl["weight_bytes"] == 2 * (e["qlora_unquantized_param_count"] + e["trainable_param_count"])
