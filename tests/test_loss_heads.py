"""The loss implementations (``loss_implementation``: hf, chunked, liger, cce; src/fitplan/trace/loss_heads.py).

torchtune's chunked cross-entropy is measured by the torch referee (fitplan-torch runs the step with the loss
computed the torchtune way); Liger's fused linear cross-entropy and Apple's Cut Cross-Entropy are Triton (CUDA
only), so their bytes are derived here by hand from their sources. Every scenario states ``optim`` and ``precision``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fitplan
from fitplan import FitplanError
from referee_support import fitplan_torch_referee

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"

# --------------------------------------------------------------------------- Liger: by hand from the source

# Llama-3.1-8B: h = 4096, V = 128256 (its config.json); b = 2, s = 2048: BT = 4096 tokens; bf16 weights, CPU (no
# allocator rounding). Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py @ 00eba634,
# fused_linear_cross_entropy_forward:
#   grad_input = torch.zeros_like(_input)                      -> BT·h elements in the input's dtype (bf16)
#   grad_weight = torch.zeros_like(weight) if weight_needs_grad -> V·h in the weight's dtype (accum_dtype None)
# and LigerFusedLinearCrossEntropyFunction.forward: ctx.save_for_backward(grad_input.detach(),
# grad_weight.detach() ...): those two are what the forward leaves for the backward (the logits never whole).
B, S, H, V = 2, 2048, 4096, 128256
GRAD_INPUT = 2 * B * S * H
GRAD_WEIGHT = 2 * V * H
# its chunk: inc_factor = cdiv(V, 1·H) = cdiv(128256, 4096) = 32; chunk_size = next_power_of_2(cdiv(4096, 32)) = 128
LIGER_ROWS = 128


def _llama_8b(loss: str, method: str, **extra):
    lora = dict(method="lora", lora_r=8, lora_target_modules=("q_proj", "v_proj")) if method == "lora" else {}
    return fitplan.estimate(model="llama-3.1-8b", precision="bf16-true", optim="adamw_torch", per_device_train_batch_size=B,
                            max_seq_length=S, device="cpu", gradient_checkpointing=True, loss_implementation=loss,
                            **lora, **extra)


def test_liger_keeps_the_input_gradient_and_the_trained_head_weights_gradient():
    # LoRA: the LM head is frozen (weight.requires_grad False: no grad_weight); full fine-tuning: both
    assert _llama_8b("liger", "lora")["logits_bytes"] == GRAD_INPUT == 33_554_432
    assert _llama_8b("liger", "full")["logits_bytes"] == GRAD_INPUT + GRAD_WEIGHT == 1_084_227_584


def test_liger_chunk_rule():
    from fitplan.trace.loss_heads import liger_chunk_rows

    assert liger_chunk_rows(B * S, V, H) == LIGER_ROWS
    # the example in the source's comment: BT = 4096·4, V = 32000, H = 4096 -> inc_factor 8, chunk_size 2048
    assert liger_chunk_rows(4096 * 4, 32000, 4096) == 2048
    assert liger_chunk_rows(10, 32000, 4096) == 2  # cdiv(10, 8) = 2, a power of two already
    assert liger_chunk_rows(3, 100, 4096) == 3  # one chunk covers BT when the budget allows (never more than BT)


def test_cut_cross_entropy_keeps_a_log_sum_exp_per_token_and_the_hidden_state():
    # apple/ml-cross-entropy cut_cross_entropy/cce.py @ 3a798378, LinearCrossEntropyFunction.forward:
    # ctx.save_for_backward(e, c, bias, lse, targets, valids, logit_avg), with cce_lse_forward.py
    #   lse = e.new_full((B,), -inf, dtype=torch.float32)          -> 4·T bytes
    #   logit_avg = e.new_full((V,), 0.0, dtype=torch.float32)     -> 4·V (filter_eps "auto": return_logit_avg)
    # and e, the hidden state (b·s, h) itself: under LoRA nothing else keeps the final norm's output (the frozen
    # LM head's mm saves only its weight), so the saved activations grow by exactly E·T·h over hf
    cce, hf = _llama_8b("cce", "lora"), _llama_8b("hf", "lora")
    assert cce["logits_bytes"] == 4 * B * S + 4 * V == 529_408
    assert cce["activation_bytes"] - hf["activation_bytes"] == 2 * B * S * H
    # full fine-tuning: the LM head's mm already saved its input under hf
    assert _llama_8b("cce", "full")["activation_bytes"] == _llama_8b("hf", "full")["activation_bytes"]


def test_chunked_keeps_every_chunks_fp32_log_probabilities():
    # eager F.cross_entropy = log_softmax (saves its fp32 output) + nll_loss (saves its target and total_weight),
    # per chunk (torchtune ce_chunked_output_loss.py compute_cross_entropy): 4·b·s·V in all, as hf; the targets are
    # reshape copies of the (b, s/8) label chunks (b > 1: not contiguous), 8·b·s bytes; 8 total_weight scalars of 4
    # bytes; the 8-byte token count the final division saves
    e = _llama_8b("chunked", "lora")
    assert e["logits_bytes"] == 4 * B * S * V + 8 * B * S + 8 * 4 + 8


def test_compiled_chunked_keeps_the_16bit_chunks_and_two_fp32_values_per_row():
    # torchtune compile: True compiles compute_cross_entropy (training/_compile.py compile_loss): per chunk the graph
    # saves its bf16 input (2·b·(s/8)·V, 2·b·s·V over the 8 chunks), the target chunk (a reshape copy, b > 1: 8·b·s
    # in all) and the row maximum and log-sum-exp (fp32, 4·b·s each in all), measured below; plus div's 8-byte count
    e = _llama_8b("chunked_compiled", "lora")
    assert e["logits_bytes"] == 2 * B * S * V + 8 * B * S + 2 * 4 * B * S + 8
    # what goes: the fp32 log-probabilities (4·b·s·V) and the per-chunk total_weight scalars of the eager loss
    eager = _llama_8b("chunked", "lora")
    assert eager["logits_bytes"] - e["logits_bytes"] == 4 * B * S * V + 8 * 4 - 2 * B * S * V - 2 * 4 * B * S
    assert e["peak_bytes"] < eager["peak_bytes"]


def _compiler():
    import shutil

    return shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(_compiler() is None, reason="Inductor's CPU backend needs a C++ compiler")
def test_compiled_cross_entropy_saves_its_16bit_input_and_two_fp32_values_per_row():
    """Measured: torchtune's ``compute_cross_entropy`` (``F.cross_entropy(logits.float(), labels,
    reduction="sum")``) under torch.compile (Inductor, CPU) saves, through autograd's saved-tensor hooks, the bf16
    logits themselves, the labels and two fp32 ``(rows, 1)`` tensors; its backward returns a bf16 gradient.
    This is what ``chunked_compiled`` keeps per chunk (trace/loss_heads.py)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    def compute_cross_entropy(logits, labels):
        return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")

    compiled = torch.compile(compute_cross_entropy)
    rows, vocab = 24, 96
    weight = torch.randn(vocab, 16, dtype=torch.bfloat16, requires_grad=True)
    logits = torch.randn(rows, 16, dtype=torch.bfloat16) @ weight.t()
    labels = torch.randint(0, vocab, (rows,))
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compiled(logits, labels)
    kept = sorted((tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in saved)
    assert kept == [((rows,), "int64"), ((rows, 1), "float32"), ((rows, 1), "float32"), ((rows, vocab), "bfloat16")]
    chunk = next(t for t in saved if t.dtype == torch.bfloat16)
    assert chunk.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()  # the chunk, not a copy
    grad = torch.autograd.grad(loss, logits)[0]
    assert grad.dtype == torch.bfloat16


def test_chunked_and_liger_lower_the_peak_of_the_hf_loss():
    hf, chunked, liger = (_llama_8b(loss, "lora") for loss in ("hf", "chunked", "liger"))
    # hf's peak is in the backward: the fp32 log-probabilities, their gradient and the gradient of the upcast,
    # each 4·b·s·V (3.9 GiB here); chunked holds the saved log-probabilities and one chunk's temporaries
    assert liger["peak_bytes"] < chunked["peak_bytes"] < hf["peak_bytes"]
    assert _llama_8b("cce", "lora")["peak_bytes"] < chunked["peak_bytes"]
    assert hf["peak_phase"] == "backward" and chunked["peak_phase"] == "forward"


def test_unknown_loss_implementation_is_refused():
    with pytest.raises(FitplanError, match="loss_implementation"):
        fitplan.estimate(model="llama-3.1-8b", precision="bf16-true", optim="adamw_torch", loss_implementation="fused")


# --------------------------------------------------------------------------- chunked: the torch referee

CASES = [
    # (precision, method, checkpointing): full fine-tuning differentiates the LM head 8 times (its gradient summed
    # as each chunk's arrives); LoRA freezes it; autocast casts its weight once (cached) for the 8 chunks
    ("bf16-true", "full", False),
    ("bf16-true", "lora", True),
    ("bf16-mixed", "full", True),
]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-mistral"])
@pytest.mark.parametrize(("precision", "method", "ckpt"), CASES, ids=lambda v: str(v))
def test_chunked_loss_against_torch(name, precision, method, ckpt):
    _check_chunked_against_torch(name, precision, method, ckpt)


def test_chunked_loss_with_tied_embeddings_against_torch():
    # Gemma's LM head is its input embedding: 8 head gradients and the embedding's, summed as they arrive
    _check_chunked_against_torch("tiny-gemma", "bf16-true", "full", False)


def _check_chunked_against_torch(name, precision, method, ckpt):
    fitplan_torch = fitplan_torch_referee()
    lora = dict(method="lora", lora_r=8, lora_target_modules=("q_proj", "v_proj")) if method == "lora" else {}
    est = fitplan.estimate(model=str(CONFIGS / name / "config.json"), precision=precision, optim="adamw_torch",
                           per_device_train_batch_size=2, max_seq_length=64, gradient_checkpointing=ckpt,
                           loss_implementation="chunked", device="cpu", **lora)
    report = fitplan_torch.validate(est, mode="cpu", memtracker=False)
    off = {k: c["relative_error"] for k, c in report["components"].items()}
    assert all(abs(v) <= 0.01 for v in off.values()), off
    assert report["peak_phase"]["predicted"] == report["peak_phase"]["measured"]


@pytest.mark.parametrize("loss", ["liger", "cce"])
def test_the_referee_refuses_the_triton_losses(loss):
    fitplan_torch = fitplan_torch_referee()
    est = fitplan.estimate(model=str(CONFIGS / "tiny-llama" / "config.json"), precision="bf16-true", optim="adamw_torch",
                           per_device_train_batch_size=1, max_seq_length=16, loss_implementation=loss, device="cpu")
    with pytest.raises(FitplanError, match="Triton"):
        fitplan_torch.validate(est, mode="cpu", memtracker=False)
