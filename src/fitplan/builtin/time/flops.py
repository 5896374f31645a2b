"""FLOPs: per token (6·N + attention, LoRA, recomputation), the whole run's, and the GPU's peak FLOP/s.

FLOPs are what the published runs' MFU is counted in (``train_mfu``); the time itself comes from the
roofline over the step trace's kernels (:mod:`fitplan.builtin.time.step`).
"""

from __future__ import annotations

import functools

from fitplan.builtin.time import roofline
from fitplan.engine.declarations import quantity

_EMBEDDINGS = ("embed_tokens", "embed_positions")



@functools.lru_cache(maxsize=256)
def _matmul_params(arch) -> int:
    if arch.count_only:
        return arch.param_count
    emb = sum(g.total for g in arch.param_groups() if g.module in _EMBEDDINGS)
    n = arch.active_param_count - emb
    if arch.tie_word_embeddings:
        n += arch.vocab_size * arch.hidden_size  # the LM head multiplies by the tied embedding matrix
    return n


@quantity("params")
def flops_param_count(arch):
    """N in "6·N FLOPs per token": the parameters that do one multiply-add per token. Total parameters
    minus the input embeddings (a lookup, not a matmul; a tied LM head is counted once), and for MoE only
    the active ones (``arch.active_param_count``: ``num_experts_per_tok`` experts per token), as torchtitan's
    ``get_num_flop_per_token`` counts. A ``--params`` count (bare, or with a typical shape) is used as is."""
    return _matmul_params(arch)


@quantity("FLOP/token")
def attention_flops_per_token(arch, max_seq_length):
    """Attention score and value matmuls, forward + backward: ``12·L·(a·d_head)·s`` per token
    (PaLM, Chowdhery et al. 2022, appendix B; nanoGPT ``estimate_mfu``; causal masking not discounted, as
    those sources do). 0 for a ``--params`` model: its layers and width are not known."""
    if arch.count_only:
        return 0
    return 12 * arch.num_hidden_layers * arch.q_dim * max_seq_length


@quantity("FLOP/token", json_key="time.flops_per_token")
def flops_per_token(method, gradient_checkpointing, flops_param_count, adapter_param_count, attention_flops_per_token):
    """Training FLOPs per processed token.

    * full fine-tuning: ``6·N + 12·L·h·s`` (forward 2N, backward 4N: Kaplan et al. 2020; attention: PaLM
      appendix B);
    * gradient checkpointing (full recomputation) runs the forward twice: ``8·N + 16·L·h·s`` (Narayanan et
      al. 2021);
    * LoRA / QLoRA: the frozen base needs no weight gradients, only input gradients: forward 2N + backward
      2N, plus the adapters' full ``6·N_adapter``: ``4·N + 6·N_adapter + 12·L·h·s`` (+ one more forward,
      ``2·N + 2·N_adapter + 4·L·h·s``, with checkpointing). QLoRA's dequantisation costs time, not FLOPs.

    N is ``flops_param_count`` (active parameters for MoE)."""
    n, a, att = flops_param_count, adapter_param_count, attention_flops_per_token
    if method == "full":
        total = 6 * n + att
        extra = 2 * n + att / 3
    else:
        total = 4 * n + 6 * a + att
        extra = 2 * n + 2 * a + att / 3
    return total + (extra if gradient_checkpointing else 0)


@quantity("FLOP", json_key="time.flops", short="flops")
def train_flops(flops_per_token, train_tokens):
    """FLOPs of the whole run: FLOPs per token × tokens processed."""
    return None if train_tokens is None else flops_per_token * train_tokens


# --------------------------------------------------------------------------- peak

@quantity("dtype", json_key="time.matmul_dtype", type="text")
def matmul_dtype(compute_dtype, tf32):
    """The dtype whose peak applies. fp32 training runs full-fp32 matmuls: PyTorch leaves
    ``torch.backends.cuda.matmul.allow_tf32`` off by default (since 1.12) and so does the HF Trainer
    (``tf32=None``); ``--tf32`` switches fp32 matmuls to the TF32 tensor-core peak."""
    return "tf32" if compute_dtype == "fp32" and tf32 else compute_dtype


@quantity("FLOP/s", json_key="time.peak_flops_per_gpu")
def peak_flops_per_gpu(gpu_spec, matmul_dtype):
    """Dense peak FLOP/s of one GPU at the matmul dtype (hardware ruleset ``peak_tflops``). A GPU without
    tensor cores for that dtype runs it at a slower rate: bf16 without a bf16 entry (T4, V100) falls back
    to fp32, tf32 to fp32, fp16 to bf16 (``roofline.PEAK_FALLBACK``). None without a GPU."""
    if gpu_spec is None:
        return None
    return roofline.peak_flops(gpu_spec.peak_tflops, matmul_dtype) or None


QUANTITIES = (flops_param_count, attention_flops_per_token, flops_per_token, train_flops, matmul_dtype, peak_flops_per_gpu)
