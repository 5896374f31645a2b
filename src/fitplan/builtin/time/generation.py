"""GRPO/RLOO's time: a round's generation (prefill + decode), scoring forwards and training, and the run's total.

Per round (one ``generation_batch_size``, every training process in parallel on its ``B`` sequences; builtin/
trl/grpo.py), with ``N`` the active parameters, ``W`` the weights' bytes, ``P``/``C`` prompt and completion:

* prefill (compute-bound): ``2·N·B·P`` FLOPs at the GEMM efficiency of the GPU's generation
  (``[[time_efficiency]]``);
* decode (memory-bound): ``C − 1`` steps, each reading the weights and the KV cache (``W + B·L·2·kv·n̄·e`` at the
  mean cache length ``n̄ = P + C/2``) at the fitted memory efficiency, or computing ``2·N·B`` FLOPs, whichever
  is slower (the batch amortises the weight read); transformers' eager ``generate`` also launches every
  kernel from the host each step (``(12·L + 10)`` kernels at ``host_seconds_per_kernel``, combined with the
  GPU time as the step model does, ``roofline.overlap``); vLLM's CUDA graphs do not. A vLLM server generates
  for every process at once on its ``tp`` GPUs (weights and cache split ``tp`` ways); when its KV blocks hold
  fewer sequences than the round, it decodes in waves;
* scoring: ``2·N·B·(P + C)`` per forward (old and/or reference log-probabilities);
* training: the round's tokens (``generation_batch_size × (P + C)``) at the training throughput of the step
  model (builtin/time/throughput.py).

The run: ``num_examples`` prompts × ``num_generations`` × ``(P + C)`` tokens per epoch are trained on
(``train_tokens``), in ``rounds = train_tokens / (generation_batch_size × (P + C))``; ``train_seconds`` adds
each round's generation and scoring to the training time. Not modelled: vLLM's weight sync after each optimizer
step, reward functions, early-stopping completions (every completion is taken at ``max_completion_length``).
"""

from __future__ import annotations

import math

from fitplan.builtin.time import roofline
from fitplan.engine.declarations import quantity, reducer

KERNELS_PER_LAYER = 12
"""Kernels one decoder layer launches per decode step in eager PyTorch (norms, four projections or three
fused, rotary, SDPA, the MLP's three GEMMs and activation, residual adds); plus 10 for the embedding, the final
norm, the LM head and sampling."""


def _decode_step(arch, batch: int, length: float, weights: float, e: float, gpu_spec, eff, tp: int,
                 host: bool) -> float:
    """One decode step's seconds for ``batch`` sequences at cache length ``length`` (module doc)."""
    kv = batch * arch.num_hidden_layers * 2 * arch.kv_dim * length * e / tp
    mem = (weights / tp + kv) / (gpu_spec.bandwidth_gbps * 1e9 * eff.memory)
    peak = roofline.peak_flops(gpu_spec.peak_tflops, "bf16" if e <= 2 else "fp32")
    flops = 2 * arch.active_param_count * batch / tp / (peak * eff.gemm)
    gpu = max(mem, flops)
    if not host:
        return gpu
    return roofline.overlap(gpu, (KERNELS_PER_LAYER * arch.num_hidden_layers + 10) * eff.host_seconds_per_kernel)


def _generation(o, arch, gpu_spec, eff, e: float, vllm_memory) -> dict[str, float]:
    """Prefill and decode seconds of one round (module doc)."""
    p, c = o.prompt_length, o.max_completion_length
    tp, batch, waves, host = 1, o.local_generation_batch, 1, vllm_memory is None
    if vllm_memory is not None:
        tp = vllm_memory["tensor_parallel_size"]
        batch = o.generation_batch_size if vllm_memory["mode"] == "server" else batch * tp
        fit = max(1, vllm_memory["sequences_at_once"])
        waves = math.ceil(batch / fit)
        batch = min(batch, fit)
    peak = roofline.peak_flops(gpu_spec.peak_tflops, "bf16" if e <= 2 else "fp32")
    prefill = 2 * arch.active_param_count * batch * p / tp / (peak * eff.gemm) * waves
    weights = arch.param_count * e
    decode = (c - 1) * _decode_step(arch, batch, p + c / 2, weights, e, gpu_spec, eff, tp, host) * waves
    return {"prefill": prefill, "decode": decode}


@quantity("s", type="object")
def online_round_seconds(online_settings, arch, gpu_spec, kernel_efficiency, weight_dtype_bytes, vllm_memory,
                         train_tokens_per_second):
    """One GRPO/RLOO round's seconds (module doc): ``prefill``, ``decode``, ``generation`` (their sum),
    ``scoring``, ``training`` and ``total``. None without a GPU, the fitted efficiencies or an architecture."""
    o, eff = online_settings, kernel_efficiency
    if o is None or gpu_spec is None or eff is None or arch.is_bare:
        return None
    e = 2 if vllm_memory is not None else weight_dtype_bytes
    gen = _generation(o, arch, gpu_spec, eff, e, vllm_memory)
    peak = roofline.peak_flops(gpu_spec.peak_tflops, "bf16" if weight_dtype_bytes <= 2 else "fp32")
    passes = int(o.old_logps) + int(o.reference != "none")
    scoring = passes * 2 * arch.active_param_count * o.local_generation_batch * o.sequence_length / (peak * eff.gemm)
    tokens = o.generation_batch_size * o.sequence_length
    training = tokens / train_tokens_per_second if train_tokens_per_second else None
    out = {**gen, "generation": gen["prefill"] + gen["decode"], "scoring": scoring, "training": training}
    out["total"] = None if training is None else out["generation"] + scoring + training
    return out


@reducer("train_tokens", when=lambda online_settings, num_examples: online_settings is not None
         and num_examples is not None)
def online_train_tokens(train_tokens, online_settings, num_examples, num_train_epochs):
    """GRPO/RLOO: ``num_examples`` prompts, each completed ``num_generations`` times per epoch, every sequence
    ``prompt_length + max_completion_length`` tokens (``tokens_per_example`` and the dataset's padding play no
    part)."""
    o = online_settings
    return num_examples * o.num_generations * o.sequence_length * num_train_epochs


@quantity("rounds")
def online_rounds(online_settings, train_tokens):
    """Generation rounds of the run: ``train_tokens / (generation_batch_size × (P + C))``."""
    if online_settings is None or train_tokens is None:
        return None
    return train_tokens / (online_settings.generation_batch_size * online_settings.sequence_length)


@reducer("train_seconds", when=lambda online_settings: online_settings is not None)
def online_train_seconds(train_seconds, online_rounds, online_round_seconds):
    """GRPO/RLOO: the training time plus every round's generation and scoring (module doc)."""
    if train_seconds is None or online_rounds is None or online_round_seconds is None:
        return train_seconds
    return train_seconds + online_rounds * (online_round_seconds["generation"] + online_round_seconds["scoring"])


QUANTITIES = (online_round_seconds, online_rounds)
REDUCERS = (online_train_tokens, online_train_seconds)
