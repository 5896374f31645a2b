"""vLLM's allocation when GRPO/RLOO generate with it (``use_vllm = True``), derived from vLLM's source.

TRL 1.16 allows ``vllm>=0.22.0,<=0.31.0`` (its ``vllm`` extra). What vLLM takes on a GPU (vllm/v1/worker/
gpu_worker.py ``Worker.determine_available_memory``): it profiles one forward of dummy inputs
(``profile_run``), then leaves for the KV cache ``total_memory × gpu_memory_utilization − (weights + the
profiled peak activations + non-torch memory)``, and allocates all of it (``initialize_from_config``): vLLM
holds ``gpu_memory_utilization`` of the GPU's total memory, whatever the batch. The blocks
(vllm/v1/core/kv_cache_utils.py ``get_num_blocks``: ``available // page_size // num_layers``) hold
``block_size = 16`` tokens; a layer's page is ``2 × block_size × (num_key_value_heads / tp) × head_dim × e``.

* ``colocate`` (trl/generation/vllm_generation.py: ``LLM(..., gpu_memory_utilization =
  vllm_gpu_memory_utilization, max_num_batched_tokens = 4096)`` in every training process): the reserve
  ``gpu_memory_utilization × total`` is gone from each training GPU for the whole run. With
  ``vllm_enable_sleep_mode`` TRL puts vLLM to sleep at level 2 after building it and after each generation
  (``llm.sleep(level=2)``: weights and KV cache released, the weights re-sent by ``sync_weights`` after
  ``wake_up(tags=["weights"])``, the cache after ``wake_up(tags=["kv_cache"])``): the reserve is on the GPU
  during the generation phase only. What vLLM keeps while asleep (CUDA graphs, NCCL buffers) is not counted.
* ``server`` (``trl vllm-serve``, trl/scripts/vllm_serve.py, ``gpu_memory_utilization`` default 0.9): vLLM runs on
  GPUs of its own (``vllm_tensor_parallel_size`` of them, fitplan's split: inputs/trl_online.py); the training
  GPUs hold no reserve.

The weights: vLLM loads the checkpoint in its 16-bit dtype (``dtype="auto"``: the config's, fp32 checkpoints
served in bf16), split by ``tensor_parallel_size``. The profiled activations: ``max_num_batched_tokens``
(4096) tokens through one layer's widest op (the MLP's gate and up projections and their product,
``3 × 4096 × I × 2`` bytes, MoE: the active experts' width) and the residual stream, plus the sampler's fp32
logits for ``max_num_seqs`` (256) sequences twice (logits and probabilities): an approximation of
``profile_run`` (dummy run + dummy sampler run), stated as such.
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity
from fitplan.inputs import trl_online

BLOCK_SIZE = 16
"""vLLM's default KV block size on CUDA (tokens per block)."""
MAX_NUM_BATCHED_TOKENS = 4096
"""TRL's colocated ``LLM(max_num_batched_tokens=4096)``; vllm-serve's default scheduler budget is larger."""
MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs``."""
SERVER_UTILIZATION = 0.9
"""``trl vllm-serve``'s ``gpu_memory_utilization`` default."""
SERVED_DTYPE_BYTES = 2


def page_bytes(arch, tp: int) -> int:
    """One layer's KV page: ``2 × 16 × (kv heads / tp) × head_dim × 2`` bytes."""
    heads = max(1, arch.num_key_value_heads // tp)
    return 2 * BLOCK_SIZE * heads * arch.head_dim * SERVED_DTYPE_BYTES


def profiled_activation_bytes(arch, tp: int) -> int:
    """The profile run's peak activations (module doc; an approximation)."""
    width = ((arch.moe_intermediate_size or arch.intermediate_size) * arch.num_experts_per_tok if arch.is_moe
             else arch.intermediate_size)
    layer = MAX_NUM_BATCHED_TOKENS * (3 * width // tp + 2 * arch.hidden_size) * SERVED_DTYPE_BYTES
    return int(layer + 2 * MAX_NUM_SEQS * arch.vocab_size * 4)


def kv_blocks(total_bytes: int, utilization: float, weights: int, activations: int, layers: int, page: int) -> int:
    """``get_num_blocks``: ``(total × utilization − weights − activations) // page // layers`` (0 if negative)."""
    available = int(total_bytes * utilization) - weights - activations
    return max(0, available // page // layers)


@quantity("fields", type="object")
def vllm_memory(trainer, prompt_length, max_completion_length, use_vllm, vllm_mode, vllm_gpu_memory_utilization,
                vllm_enable_sleep_mode, vllm_tensor_parallel_size, arch, gpu_spec):
    """vLLM's share of a GPU (module doc): ``reserve_bytes`` (``utilization × total``), its ``weights_bytes``,
    ``activation_bytes`` (profiled, approximate), ``kv_cache_bytes``, ``kv_blocks``, ``kv_tokens`` and how many
    whole prompt + completion sequences they hold at once; ``mode``, ``sleep`` and, in server mode, the
    ``server_gpus``. None without vLLM, without a GPU or without an architecture. (It reads the scenario's
    fields, not the resolved round, so that the usable memory it reduces stays independent of the batch.)"""
    if trainer not in trl_online.ONLINE or not use_vllm or gpu_spec is None or arch.is_bare:
        return None
    sequence = (prompt_length or trl_online.PROMPT_LENGTH) + (max_completion_length or trl_online.MAX_COMPLETION_LENGTH)
    tp = vllm_tensor_parallel_size
    util = vllm_gpu_memory_utilization if vllm_mode == "colocate" else SERVER_UTILIZATION
    total = gpu_spec.usable_bytes  # torch.cuda.mem_get_info()'s total
    weights = arch.param_count * SERVED_DTYPE_BYTES // tp
    acts = profiled_activation_bytes(arch, tp)
    page = page_bytes(arch, tp)
    blocks = kv_blocks(total, util, weights, acts, arch.num_hidden_layers, page)
    reserve = int(total * util)
    return {"mode": vllm_mode, "utilization": util, "sleep": bool(vllm_enable_sleep_mode and vllm_mode == "colocate"),
            "reserve_bytes": reserve, "weights_bytes": weights, "activation_bytes": acts,
            "kv_cache_bytes": blocks * page * arch.num_hidden_layers, "kv_blocks": blocks,
            "kv_tokens": blocks * BLOCK_SIZE, "sequences_at_once": blocks * BLOCK_SIZE // sequence,
            "server_gpus": tp if vllm_mode == "server" else 0, "tensor_parallel_size": tp}


QUANTITIES = (vllm_memory,)
