"""Activations: the tensors saved for backward, per GPU.

Default model (``activation_bytes``), per decoder layer, with E bytes per activation element,
b micro-batch, s sequence, h hidden, I intermediate, a heads, q/kv the query and key/value widths:

* Llama-style blocks (RMSNorm, rotary, gated MLP), counted from what HF's implementation saves:
  ``8·s·b·h`` (two RMSNorms, fp32 upcast) ``+ E·s·b·(5h + q + 2kv)`` (norm outputs, q/k/v, attention
  output, residual inputs) ``+ 4E·s·b·I`` (SwiGLU's four I-sized tensors) ``+ 8·s·b`` (rsqrt
  statistics) + the attention core: eager keeps the fp32 softmax ``4·a·s²·b`` (+ its 16-bit copy
  ``2·a·s²·b`` when E = 2); SDPA / FlashAttention keep a fp32 logsumexp per head, ``4·a·b·s``.
  (DOMAIN.md §9, measured with torch 2.13 / transformers 5.)
* GPT-style blocks (LayerNorm, GELU MLP, dropout): Korthikanti et al. 2022, ``s·b·h·(34 + 5·a·s/h)``
  for E = 2, scaled by E/2, with the ``5·a·s²·b`` score/softmax/dropout term replaced by ``4·a·b·s``
  under memory-efficient attention.

Mixture-of-experts layers route each token to k experts: the MLP term counts k experts' tensors.
Outside the layers: the embedding output (``E·s·b·h``) and the logits (``logits_bytes``).
The Korthikanti formula is always available as ``activation_bytes_korthikanti`` for comparison.
"""

from __future__ import annotations

from ..declarations import quantity, reducer
from ..hookspecs import hookimpl


def _attention_core(arch, b, s, E, attn):
    a = arch.num_attention_heads
    if attn == "eager":
        return 4 * a * s * s * b + (2 * a * s * s * b if E == 2 else 0)
    return 4 * a * b * s


@quantity("bytes")
def activation_bytes_per_layer(arch, per_device_train_batch_size, max_seq_length, activation_dtype_bytes, attn_implementation):
    """Bytes saved for backward by one decoder layer (see the module doc for the formula)."""
    b, s, E, h = per_device_train_batch_size, max_seq_length, activation_dtype_bytes, arch.hidden_size
    if arch.family == "bare":
        return 0
    if arch.family in ("llama", "phi3"):
        I = arch.intermediate_size
        mlp = 4 * E * s * b * I
        if arch.is_moe:
            Im = arch.moe_intermediate_size or I
            mlp = 4 * E * s * b * Im * arch.num_experts_per_tok + 4 * s * b * arch.num_experts
            if arch.shared_expert_intermediate_size:
                mlp += 4 * E * s * b * arch.shared_expert_intermediate_size
        return (8 * s * b * h + E * s * b * (5 * h + arch.q_dim + 2 * arch.kv_dim) + mlp + 8 * s * b
                + _attention_core(arch, b, s, E, attn_implementation))
    per = s * b * h * 34 * E / 2
    if attn_implementation == "eager":
        per += 5 * arch.num_attention_heads * s * s * b * E / 2
    else:
        per += 4 * arch.num_attention_heads * b * s
    return int(per)


@quantity("bytes")
def activation_bytes_korthikanti(arch, per_device_train_batch_size, max_seq_length, attn_implementation):
    """Korthikanti et al. 2022 (GPT block, 16-bit): ``L·s·b·h·(34 + 5·a·s/h)``; memory-efficient attention
    drops the ``5·a·s²·b`` term. A named approximation, shown by ``explain`` for comparison."""
    b, s, h, a = per_device_train_batch_size, max_seq_length, arch.hidden_size, arch.num_attention_heads
    if arch.family == "bare":
        return 0
    per = 34 * s * b * h + (5 * a * s * s * b if attn_implementation == "eager" else 0)
    return arch.num_hidden_layers * per


@quantity("bytes", category="memory")
def activation_bytes(arch, activation_bytes_per_layer, per_device_train_batch_size, max_seq_length, activation_dtype_bytes):
    """Saved activations of all layers plus the embedding output: ``L × per-layer + E·s·b·h``."""
    emb = activation_dtype_bytes * per_device_train_batch_size * max_seq_length * arch.hidden_size
    return arch.num_hidden_layers * activation_bytes_per_layer + (emb if arch.family != "bare" else 0)


@reducer("activation_bytes", when=lambda gradient_checkpointing: gradient_checkpointing)
def gradient_checkpointing(value, arch, activation_bytes_per_layer, per_device_train_batch_size, max_seq_length, activation_dtype_bytes):
    """Full recomputation (Chen et al. 2016; HF ``gradient_checkpointing_enable``, non-reentrant): keep
    each layer's input ``E·s·b·h``, plus one layer's full activations while it is recomputed in backward."""
    kept = arch.num_hidden_layers * activation_dtype_bytes * per_device_train_batch_size * max_seq_length * arch.hidden_size
    emb = activation_dtype_bytes * per_device_train_batch_size * max_seq_length * arch.hidden_size
    return kept + activation_bytes_per_layer + emb


@reducer("activation_bytes", when=lambda tensor_parallel: tensor_parallel > 1, after=("gradient_checkpointing",))
def tensor_parallel_activations(value, tensor_parallel):
    """Tensor parallelism with sequence parallelism splits saved activations across the t ranks
    (Korthikanti et al. 2022: ``(s·b·h/t)·(34 + 5·a·s/h)``)."""
    return value // tensor_parallel


@quantity("bytes", category="memory")
def logits_bytes(arch, per_device_train_batch_size, max_seq_length, activation_dtype_bytes):
    """Logits and loss: the LM head output ``E·b·s·V`` plus its fp32 upcast for cross entropy ``4·b·s·V``
    (in fp32 training, the log-softmax output takes the second slot)."""
    if arch.family == "bare":
        return 0
    return per_device_train_batch_size * max_seq_length * arch.vocab_size * (activation_dtype_bytes + 4)


@quantity("bytes")
def loss_backward_temp_bytes(arch, per_device_train_batch_size, max_seq_length):
    """At the start of backward the loss gradient holds two fp32 ``b·s·V`` tensors."""
    if arch.family == "bare":
        return 0
    return 2 * 4 * per_device_train_batch_size * max_seq_length * arch.vocab_size


@quantity("bytes", category="memory")
def autocast_weight_copy_bytes(arch, precision, method):
    """Autocast (``*-mixed``) casts each Linear weight to 16-bit for the matmul and keeps the copy for
    backward: 2 B per matrix parameter inside the layers and the LM head (DOMAIN.md §9)."""
    if not precision.endswith("-mixed") or arch.family == "bare":
        return 0
    n = sum(g.total for g in arch.param_groups() if g.is_matrix and g.module not in ("embed_tokens", "embed_positions"))
    if arch.tie_word_embeddings:
        n += arch.vocab_size * arch.hidden_size
    return 2 * n


@hookimpl
def fitplan_register_quantities(register):
    for q in (activation_bytes_per_layer, activation_bytes_korthikanti, activation_bytes, logits_bytes,
              loss_backward_temp_bytes, autocast_weight_copy_bytes):
        register(q)


@hookimpl
def fitplan_register_reducers(register):
    register(gradient_checkpointing)
    register(tensor_parallel_activations)
