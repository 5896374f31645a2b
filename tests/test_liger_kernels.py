"""Liger-Kernel's RMSNorm, SwiGLU and RoPE kernels as ``use_liger_kernel`` installs them (trace/liger.py).

The Triton kernels run on CUDA only, so no referee measures them here: every expected value is derived by hand from
Liger-Kernel 0.8.2 (ead96b61) src/liger_kernel/ops/{rms_norm,swiglu,rope}.py and transformers 5.24's Llama forward.
"""

from __future__ import annotations

import json

import pytest

import fitplan
from fitplan import FitplanError
from fitplan.inputs.importers import training_args_fields
from fitplan.trace import liger

# Llama-3.1-8B (config.json): h = 4096, I = 14336, 32 layers, 32 heads of 128, 8 KV heads; b = 2, s = 2048: T = 4096
# tokens; bf16 weights (E = 2), CPU (no allocator rounding)
L, T, H, I, E = 32, 4096, 4096, 14336, 2
Q, KV, D = 4096, 1024, 128


def _llama_8b(method: str, **extra):
    lora = dict(method="lora", lora_r=8, lora_target_modules=("q_proj", "v_proj")) if method == "lora" else {}
    return fitplan.estimate(model="llama-3.1-8b", precision="bf16-true", optim="adamw_torch", per_device_train_batch_size=2,
                            max_seq_length=2048, device="cpu", gradient_checkpointing=False, loss_implementation="liger",
                            **lora, **extra)


def test_saved_activations_full_fine_tuning():
    # HF's LlamaRMSNorm (bf16 input): x.to(fp32) is saved by pow and by x·rsqrt (4·T·h), rsqrt (4·T), and weight ·
    # normed.to(bf16) saves the bf16 normed (E·T·h) for the weight's gradient: (4 + E)·T·h + 4·T. Liger's saves X
    # (E·T·h; nothing else keeps a layer's input or the residual) and RSTD (4·T): 4·T·h less per norm.
    # HF's MLP: silu saves gate (E·T·I), the product saves silu(gate) and up (2·E·T·I); Liger saves gate and up:
    # E·T·I less. RoPE: both keep only cos/sin (q·cos saves cos, rotate_half(q)·sin saves sin; Liger saves both).
    # Two norms and an MLP per layer, and the final norm.
    saved = L * (2 * 4 * T * H + E * T * I) + 4 * T * H
    assert saved == 8_120_172_544
    assert _llama_8b("full")["activation_bytes"] - _llama_8b("full", liger_kernel=True)["activation_bytes"] == saved


def test_saved_activations_lora():
    # LoRA on q/v: the norms' weights are frozen, so HF's weight · normed saves nothing and a norm keeps the fp32
    # copy and rsqrt: Liger's E·T·h input in place of the 4·T·h copy saves 2·T·h. Layer 0's input_layernorm reads
    # the embedding output, which requires no grad: no node under either. The MLP as in full fine-tuning.
    saved = (2 * L - 1 + 1) * 2 * T * H + L * E * T * I
    assert saved == 5_905_580_032
    assert _llama_8b("lora")["activation_bytes"] - _llama_8b("lora", liger_kernel=True)["activation_bytes"] == saved


def test_forward_launches_one_kernel_per_fused_construct():
    # HF per layer (the learned Llama graph, one kernel per non-view op): each RMSNorm _to_copy, pow, mean, add,
    # rsqrt, mul, _to_copy, mul (8); the MLP's silu and mul (2); RoPE on q and on k: mul, neg, cat, mul, add (5 each,
    # the slices are views). Liger: one kernel each: 2 + 1 + 1. The final norm 8 -> 1.
    fewer = L * ((2 * 8 + 2 + 2 * 5) - 4) + 7

    def forward_kernels(e):
        return sum(w.count for w in e["step_trace"].work
                   if w.kind == "elementwise" and w.phase == "forward" and w.mode != "compiled")

    assert forward_kernels(_llama_8b("full")) - forward_kernels(_llama_8b("full", liger_kernel=True)) == fewer == 775


def test_kernel_bytes_by_hand():
    # RMSNorm forward: reads X (E·T·h) and W (E·h), writes Y (E·T·h) and RSTD (4·T); backward: reads dY, X, W, RSTD,
    # writes dX and the fp32 partial sums (sm × h × 4), then sums them (reads those, writes 4·h) and casts to bf16
    x = E * T * H
    part = liger.SM_COUNT * H * 4
    w = liger.rms_norm_work(x, T, H, "bf16", backward=True)
    assert [k.bytes for k in w.fwd] == [2 * x + E * H + 4 * T]
    assert [k.bytes for k in w.bwd] == [3 * x + E * H + 4 * T + part, part + 4 * H, 4 * H + E * H]
    assert len(liger.rms_norm_work(x, T, H, "f32", backward=True).bwd) == 2  # fp32 weight: no cast
    assert liger.rms_norm_work(x, T, H, "bf16", backward=False).bwd == ()
    # SwiGLU: a, b read and c written; backward reads dc, a, b and writes da, db
    n = E * T * I
    s = liger.swiglu_work(n, backward=True)
    assert [k.bytes for k in s.fwd] == [3 * n] and [k.bytes for k in s.bwd] == [5 * n]
    # RoPE: q and k read and written in place, cos and sin (b, s, d) read; the backward the same on dq, dk
    qk, table = E * T * (Q + KV), 2 * E * T * D
    r = liger.rope_work(qk, table, backward=True)
    assert [k.bytes for k in r.fwd] == [k.bytes for k in r.bwd] == [2 * qk + table]


def test_types_liger_does_not_patch_run_unchanged_and_unmodelled_patches_are_refused():
    gpt2 = dict(model="gpt2", precision="bf16-true", optim="adamw_torch", device="cpu", max_seq_length=256)
    plain = fitplan.estimate(**gpt2)
    # MODEL_TYPE_TO_APPLY_LIGER_FN has no gpt2: nothing is patched, the fused loss (it comes with the patch) included
    patched = fitplan.estimate(**gpt2, liger_kernel=True, loss_implementation="liger")
    assert patched["peak_bytes"] == plain["peak_bytes"] and patched["logits_bytes"] == plain["logits_bytes"]
    with pytest.raises(FitplanError, match="apply_liger_kernel_to_gemma"):
        fitplan.estimate(model="gemma-2b", precision="bf16-true", optim="adamw_torch", device="cpu", liger_kernel=True)


def test_the_setup_line_says_liger_is_assumed():
    from fitplan.builtin.report import memory_lines

    def setup(model, **extra):
        est = fitplan.estimate(model=model, precision="bf16-true", optim="adamw_torch", device="cpu", max_seq_length=256,
                               **extra)
        return dict(memory_lines(est, "GB"))["setup"]

    assert setup("llama-3.1-8b", liger_kernel=True).endswith(
        ", Liger-Kernel's RMSNorm, SwiGLU and RoPE kernels (derived from its source, not measured)")
    assert setup("gpt2", liger_kernel=True).endswith(", use_liger_kernel (Liger patches nothing for gpt2)")
    assert "Liger" not in setup("llama-3.1-8b")


def test_training_args_use_liger_kernel(tmp_path):
    p = tmp_path / "args.json"
    p.write_text(json.dumps({"use_liger_kernel": True, "per_device_train_batch_size": 2}))
    fields, notes = training_args_fields(p)
    assert fields == {"per_device_train_batch_size": 2, "liger_kernel": True, "loss_implementation": "liger"}
    assert any("use_liger_kernel: estimated with Liger-Kernel's fused RMSNorm" in n for n in notes)
    p.write_text(json.dumps({"use_liger_kernel": True, "liger_kernel_config": {"rope": False}}))
    assert any("liger_kernel_config {'rope': False} is not modelled" in n for n in training_args_fields(p)[1])
    p.write_text(json.dumps({"use_liger_kernel": False}))
    assert training_args_fields(p)[0] == {"liger_kernel": False}
    p.write_text(json.dumps({"use_liger_kernel": "yes"}))
    with pytest.raises(FitplanError) as err:
        training_args_fields(p)
    assert err.value.render().startswith(f"{p}: use_liger_kernel must be true or false, got 'yes' @ $.use_liger_kernel")


def test_the_torch_referee_refuses_liger_kernels():
    runner = pytest.importorskip("fitplan_torch.runner")
    est = fitplan.estimate(model="llama-3.1-8b", precision="bf16-true", optim="adamw_torch", device="cpu",
                           max_seq_length=256, liger_kernel=True)
    with pytest.raises(FitplanError, match="Liger-Kernel's RMSNorm, SwiGLU and RoPE kernels"):
        runner.check_supported(est)
