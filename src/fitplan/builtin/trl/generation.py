"""GRPO/RLOO's generation with transformers' ``generate`` (``use_vllm = False``): the KV cache, the sampling
logits and the prefill's transients of one round, per training process.

TRL 1.16 (trl/trainer/grpo_trainer.py ``_generate_single_turn``) generates the process's whole share of the
round at once: ``unwrapped_model.generate(prompt_ids)`` under ``torch.no_grad()`` inside
``unwrap_model_for_generation`` (ZeRO-3: every parameter gathered first, ``ds3_gather_for_generation = True``),
``B = generation_batch_size / processes`` sequences of ``P`` prompt tokens (left-padded) and at most ``C =
max_completion_length`` new tokens. transformers 5.24 (generation/utils.py ``_sample``):

* the cache is a ``DynamicCache`` (cache_utils.py ``DynamicLayer.update``: ``torch.cat`` of the old keys/values
  and the new token's, per layer): after the prefill it holds ``P`` positions per layer; decode step ``k`` feeds
  token ``k`` and leaves ``P + k``; the last of the ``C − 1`` decode forwards leaves ``n = P + C − 1``. While the
  last layer concatenates its values, the old tensor (``n − 1`` positions) is still alive:
  ``L·2·B·kv·n·e + B·kv·(n − 1)·e`` (``kv = num_key_value_heads × head_dim``, ``e`` the weights' bytes: generate
  runs outside autocast, so the cache has the weights' dtype);
* ``logits_to_keep = 1`` (``_prepare_generation_config``: the model computes the last position's logits only):
  ``B·V`` in the weights' dtype, copied to fp32 (``outputs.logits[:, -1].to(copy=True, dtype=float32)``) while
  the previous step's copy and ``softmax`` output (fp32) are still bound to their variables: ``B·V·(e + 3·4)``
  at sampling; during the forward (the last layer's concatenation) only the previous step's two fp32 tensors;
* the prefill runs the layers over ``B·P`` tokens with a padding mask, so SDPA repeats the key/value heads
  (integrations/sdpa_attention.py ``repeat_kv``: ``2·B·P·q_dim·e``) and the MLP holds its activation, up
  projection and product (``3·B·P·I·e``; MoE, transformers 5's grouped experts: the ``R = B·P·k`` routed rows
  gathered (``R·h``), the fused gate-up projection (``2·R·I``), its activation and the product: ``(4·R·I + R·h)·e``),
  whichever is more; beside them the
  input embeddings, the residual stream, the attention block's sum and the norm's output (``4·B·P·h·e``) and the
  rotary ``cos``/``sin`` (``2·B·P·d_head·4``). Its logits are one position's (no previous step's copies).

The completion and prompt ids (int64, ``B·(P + C)``, with the mask) stay alive through the round. Under
autocast (``bf16-mixed``: fp32 weights) the accelerate-wrapped forward runs in autocast: its weight cache
holds compute-dtype copies of the trainable weights (:func:`autocast_copy_bytes`), the keys are fp32 (the
rotary tables promote them) and the values, logits and activations 16-bit.
A completion that ends early still costs its padding here: every figure assumes every completion reaches ``C``.
"""

from __future__ import annotations

import math

from fitplan.engine.declarations import quantity

SAMPLING_FP32_COPIES = 3
"""fp32 ``B·V`` tensors alive while sampling: the new upcast logits, and the previous step's upcast logits and
probabilities, still bound to ``next_token_logits`` and ``probs`` until reassigned. TRL's generation config
(temperature 1.0, top_p 1.0, top_k 0, no repetition penalty: grpo_config.py defaults) gives ``generate`` no
logits processor, so the scores are the upcast logits themselves."""


def kv_cache_bytes(layers: int, batch: int, kv_dim: int, positions: int, dtype_bytes: float) -> int:
    """Keys and values of ``positions`` tokens for ``batch`` sequences: ``L·2·B·kv·n·e``."""
    return int(layers * 2 * batch * kv_dim * positions * dtype_bytes)


def decode_extra_bytes(batch: int, kv_dim: int, vocab: int, prompt: int, completion: int, dtype_bytes: float) -> int:
    """Beyond the full cache at the last decode step: the last layer's old value tensor with the previous
    step's two fp32 ``B·V`` tensors, or the sampling's tensors, whichever is more (module doc)."""
    old = int(batch * kv_dim * (prompt + completion - 2) * dtype_bytes) + 2 * 4 * batch * vocab
    return max(old, sampling_bytes(batch, vocab, dtype_bytes))


def sampling_bytes(batch: int, vocab: int, dtype_bytes: float) -> int:
    """The last position's logits and the fp32 copies alive while sampling: ``B·V·(e + 3·4)``."""
    return int(batch * vocab * (dtype_bytes + 4 * SAMPLING_FP32_COPIES))


def prefill_transient_bytes(arch, batch: int, prompt: int, dtype_bytes: float) -> int:
    """One layer's largest transients in the prefill, the residual stream and the rotary tables (module doc)."""
    tokens = batch * prompt
    attention = 2 * tokens * arch.q_dim * dtype_bytes
    if arch.is_moe:  # transformers 5's grouped experts: T·k routed rows, gathered, fused gate_up, act, product
        rows = tokens * arch.num_experts_per_tok
        width = arch.moe_intermediate_size or arch.intermediate_size
        mlp = (4 * rows * width + rows * arch.hidden_size) * dtype_bytes
    else:
        mlp = 3 * tokens * arch.intermediate_size * dtype_bytes
    return int(max(attention, mlp) + 4 * tokens * arch.hidden_size * dtype_bytes + 2 * tokens * arch.head_dim * 4)


def ids_bytes(batch: int, prompt: int, completion: int) -> int:
    """Prompt + completion ids and their attention mask, int64: ``2·8·B·(P + C)``."""
    return 16 * batch * (prompt + completion)


def autocast_copy_bytes(arch, method: str, adapter_param_count: int, compute_bytes: float) -> int:
    """Under autocast (fp32 weights, 16-bit compute) ``generate`` runs inside the accelerate-wrapped forward's
    autocast, whose cache keeps a compute-dtype copy of every weight that requires grad for the forward's
    duration: full fine-tuning, every Linear weight and the LM head (tied or not: ``F.linear`` casts it);
    LoRA, the adapters only (the frozen base is cast op by op, never cached)."""
    if method != "full":
        return int(adapter_param_count * compute_bytes)
    linear = sum(math.prod(g.shape) * g.count for g in arch.param_groups() if g.linear is not None)
    return int((linear + arch.vocab_size * arch.hidden_size) * compute_bytes)


@quantity("bytes", type="object")
def generation_rows(online_settings, arch, weight_dtype_bytes, activation_dtype_bytes, method, adapter_param_count,
                    use_vllm):
    """What ``generate`` adds to the resident bytes at its peak, per training process (module doc): ``kv_cache``
    and ``temporaries`` (the sampling logits or the prefill's transients, whichever instant is higher, the
    round's ids and, under autocast, the cached weight copies). None when no transformers generation runs (not
    GRPO/RLOO, or vLLM generates)."""
    o = online_settings
    if o is None or use_vllm or arch.is_bare:
        return None
    e, b, p, c = weight_dtype_bytes, o.local_generation_batch, o.prompt_length, o.max_completion_length
    mixed = activation_dtype_bytes != weight_dtype_bytes
    ec = activation_dtype_bytes if mixed else e
    ids = ids_bytes(b, p, c) + (autocast_copy_bytes(arch, method, adapter_param_count, ec) if mixed else 0)
    # under autocast the keys are fp32 (rotary's fp32 cos/sin promote the 16-bit projection), the values 16-bit
    kv_e = (4 + ec) / 2 if mixed else e
    decode = {"kv_cache": kv_cache_bytes(arch.num_hidden_layers, b, arch.kv_dim, p + c - 1, kv_e),
              "temporaries": decode_extra_bytes(b, arch.kv_dim, arch.vocab_size, p, c, ec) + ids}
    prefill = {"kv_cache": kv_cache_bytes(arch.num_hidden_layers, b, arch.kv_dim, p, kv_e),
               "temporaries": prefill_transient_bytes(arch, b, p, ec) + ids}
    return max(decode, prefill, key=lambda r: sum(r.values()))


QUANTITIES = (generation_rows,)
