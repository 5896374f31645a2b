"""8-bit LoRA (``method = "qlora"`` with ``load_in_8bit``: bitsandbytes 0.50.2 ``Linear8bitLt``, trace/kernels.py
``int8_linear``), derived by hand from bitsandbytes' source: the CPU runs another autograd Function
(``MatMul8bitFp``) than CUDA (``MatMul8bitLt``), so the torch referee cannot measure what a GPU keeps and refuses
it. Every scenario states ``optim`` and ``precision``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import fitplan
from fitplan import FitplanError
from fitplan.inputs.recipes import recipe_fields

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "tests" / "data" / "recipes"

# Llama-3.1-8B (config.json): h = 4096, I = 14336, 32 layers, 8 KV heads of 128 (kv = 1024), 8,030,261,248 parameters
H, I, KV, L, P = 4096, 14336, 1024, 32, 8_030_261_248
LINEARS = [(H, H), (KV, H), (KV, H), (H, H), (I, H), (I, H), (H, I)]  # (out, in): q, k, v, o, gate, up, down
B, S = 2, 1024
T = B * S


def _llama(bits8: bool, ckpt: bool, **extra):
    return fitplan.estimate(model="llama-3.1-8b", precision="bf16-true", dtype="bfloat16", optim="adamw_torch_fused",
                            per_device_train_batch_size=B, max_seq_length=S, gradient_checkpointing=ckpt,
                            method="qlora", lora_r=8, lora_target_modules=("all-linear",), kbit_preparation="none",
                            load_in_8bit=bits8, **extra)


def test_int8_weights_are_one_byte_an_element_and_a_float_per_output_row():
    # Int8Params: CB int8 (out, in) and SCB fp32 (out,) from int8_vectorwise_quant (bitsandbytes nn/modules.py,
    # functional.py); the rest of the model (embeddings, norms, lm_head: transformers' get_keys_to_not_convert)
    # in bf16; peft's adapters fp32 (autocast_adapter_dtype): r·(in + out) per Linear
    q = L * sum(o * i for o, i in LINEARS)
    rows = L * sum(o for o, _ in LINEARS)
    adapters = L * sum(8 * (o + i) for o, i in LINEARS)
    want = 2 * (P - q) + q + 4 * rows + 4 * adapters
    assert _llama(True, True)["weight_bytes"] == want == 9_170_591_744


def test_the_8bit_matmul_keeps_its_input_through_checkpointing():
    # MatMul8bitLt.forward: ctx.tensors = (CAt, subA, A), a ctx attribute: the checkpoint's saved-tensor hooks never
    # see it, so every 8-bit Linear's input stays from the forward to its layer's backward: per layer the attention
    # norm's output (q, k, v share it), the attention output (o), the MLP norm's output (gate, up) and the product
    # before down: E·T·(3h + I) more than 4-bit QLoRA, whose matmul_4bit saves nothing batch-sized
    four, eight = _llama(False, True), _llama(True, True)
    assert eight["step_trace"].retained_bytes - four["step_trace"].retained_bytes == L * 2 * T * (3 * H + I)


def test_without_checkpointing_the_8bit_inputs_add_what_nothing_else_saved():
    # without checkpointing the attention output is saved by SDPA already (o_proj's input), and layer 0's
    # attention norm output does not require grad (the embedding is frozen): per layer the two norm outputs and
    # the down projection's input, layer 0 without its attention norm output
    four, eight = _llama(False, False), _llama(True, False)
    extra = (L - 1) * 2 * T * (2 * H + I) + 2 * T * (H + I)
    assert eight["step_trace"].retained_bytes - four["step_trace"].retained_bytes == extra


def test_its_backward_dequantizes_the_whole_weight_in_the_inputs_dtype():
    # MatMul8bitLt.backward: CB.to(ctx.dtype_A, copy=True).mul_(SCB.unsqueeze(1).mul(1 / 127)): out·in·E plus the
    # fp32 row scales, a transient of its node
    from fitplan.builtin.activations import trace_for  # noqa: F401 (the spec as estimate builds it)
    from fitplan.trace.step_trace import TraceSpec, record

    arch = _llama(True, True).arch
    tr = record(TraceSpec(arch, B, S, "bf16-true", "sdpa", True, "qlora", 8, ("all-linear",), 0.0, "cuda",
                          adapter_dtype="fp32", quant_compute="bf16", quant_bits=8))
    base = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    temps = sorted({op.bwd_temp for op in tr.ops if op.name.endswith(base)})  # the base layers' ops, by module
    assert temps == sorted({o * i * 2 + 4 * o for o, i in LINEARS})


def test_offloading_does_not_move_what_the_8bit_matmul_keeps():
    # TRL's hooks (without streams) move each layer's checkpointed input; the 8-bit Linears' inputs are ctx
    # attributes, which no hook sees: the same E·T·(3h + I) per layer stays
    four, eight = _llama(False, True, activation_offloading="trl_sync"), _llama(True, True, activation_offloading="trl_sync")
    assert eight["step_trace"].retained_bytes - four["step_trace"].retained_bytes == L * 2 * T * (3 * H + I)


def test_load_in_8bit_needs_the_qlora_method():
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model="llama-3.1-8b", precision="bf16-true", optim="adamw_torch_fused", method="lora",
                         load_in_8bit=True)
    assert (e.value.field, e.value.value) == ("load_in_8bit", True)


@pytest.mark.parametrize(("text", "want"), [
    ("base_model: x/y\nadapter: lora\nload_in_8bit: true\n",
     {"method": "qlora", "load_in_8bit": True, "kbit_preparation": "none"}),
    ("model_name_or_path: x/y\nstage: sft\nquantization_bit: 8\n",
     {"method": "qlora", "load_in_8bit": True, "kbit_preparation": "none"}),
    ("model_name_or_path: x/y\nstage: sft\nquantization_bit: 4\n", {"method": "qlora", "load_in_8bit": None}),
])
def test_recipes_import_8bit_lora(tmp_path, text, want):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    fields, _ = recipe_fields(path)
    assert {k: fields.get(k) for k in want} == want


def test_axolotls_public_8bit_recipe_imports_and_names_what_is_not_modelled():
    # axolotl @ 067b021 examples/llama-3/lora-8b.yml: load_in_8bit with adapter lora; its lora_modules_to_save
    # (embed_tokens, lm_head: bf16 copies beside fp32 adapters) is what fitplan does not price (docs/recipes.md)
    path = RECIPES / "axolotl" / "llama-3-lora-8b.yml"
    fields, _ = recipe_fields(path)
    assert (fields["method"], fields["load_in_8bit"], fields["kbit_preparation"]) == ("qlora", True, "none")
    with pytest.raises(FitplanError, match="lora_modules_to_save"):
        fitplan.estimate(**fields)
    fields.pop("lora_modules_to_save")
    assert fitplan.estimate(**fields)["weight_bytes"] > 0


def test_an_axolotl_8bit_model_without_an_adapter_is_refused(tmp_path):
    path = tmp_path / "recipe.yml"
    path.write_text("base_model: x/y\nload_in_8bit: true\n")
    with pytest.raises(FitplanError) as e:
        recipe_fields(path)
    assert (e.value.file, e.value.field, e.value.value) == (str(path), "$.load_in_8bit", True)


def test_the_referee_refuses_8bit_models():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    try:
        import fitplan_torch  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    import fitplan_torch

    est = fitplan.estimate(model=str(ROOT / "tests" / "data" / "configs" / "tiny-llama" / "config.json"),
                           precision="bf16-true", optim="adamw_torch", method="qlora", lora_target_modules=("q_proj",),
                           load_in_8bit=True, device="cpu", max_seq_length=16)
    with pytest.raises(FitplanError, match="MatMul8bitFp"):
        fitplan_torch.validate(est, mode="cpu", memtracker=False)
