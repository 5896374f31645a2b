"""GRPO and RLOO's step as TRL 1.16 runs it: the phases of a generation round and their peaks.

One round (trl/trainer/grpo_trainer.py ``_prepare_inputs``: every ``steps_per_generation`` micro-steps) is, per
training process:

1. ``generation``: the completions of ``generation_batch_size / processes`` sequences, with transformers'
   ``generate`` (builtin/trl/generation.py; ZeRO-3 gathers every parameter first) or vLLM (builtin/trl/vllm.py:
   colocated, its reserve on the GPU; served, on GPUs of its own). The optimizer step has freed the
   gradients (``zero_grad(set_to_none=True)``): weights, master weights, optimizer states, buffers stay.
2. ``scoring``: under ``no_grad``, per micro-batch of ``per_device_train_batch_size`` sequences
   (``_get_per_token_logps_and_entropies(batch_size=...)``), the old policy's log-probabilities (when
   generation and optimizer steps are misaligned, with vLLM's importance sampling, always for RLOO) and the
   reference's (``beta != 0``): a second model (``ref_model``, resident for the whole run) or, with LoRA, the
   policy with its adapter disabled (``use_adapter``). The forward uses TRL's fused LM head
   (trl/trainer/utils.py ``add_fused_lm_head``, ``model(..., fused_lm_head=True)``: trl/kernels/
   chunked_logprob.py ``ChunkedLogProbFunction``, tiles of ``4096 × 32768`` logits, never the whole logits).
   Not run with the defaults (``beta = 0``, aligned steps, no vLLM): no phase then.
3. ``forward``, ``backward``, ``optimizer_step``: the training step over ``prompt + completion`` tokens
   (fitplan's step trace at ``max_seq_length = prompt_length + max_completion_length``), the round's buffered
   batch (its ids and masks) alive beside it.

The peak is the highest phase (builtin/peak.py): the training process's own bytes. The breakdown keeps the
step's rows (so that other trainers' reports are unchanged): the generation's KV cache is in ``activations``,
the reference copy in ``weights`` (every phase); the report's ``trl`` section names both. A colocated vLLM's
reserve is taken from the GPU's usable memory instead (``vllm_colocated_reserve``; with sleep mode,
``vllm_sleep_headroom`` checks the generation phase beside it).
"""

from __future__ import annotations

from fitplan.trace.fused_head import TOKEN_CHUNK as TRL_TOKEN_CHUNK, VOCAB_CHUNK as TRL_VOCAB_CHUNK
from fitplan.builtin.trl import generation, vllm
from fitplan.engine.declarations import quantity, reducer
from fitplan.inputs import trl_online
from fitplan.pluginmgr.hookspecs import hookimpl

RESIDENT = ("weights", "master_weights", "optimizer_states", "comm_buffers", "other")


@quantity("settings", type="object")
def online_settings(trainer, num_generations, max_completion_length, prompt_length, generation_batch_size,
                    steps_per_generation, beta, use_vllm, vllm_mode, vllm_tensor_parallel_size, method,
                    per_device_train_batch_size, gradient_accumulation_steps, num_gpus, num_nodes):
    """GRPO/RLOO's round as TRL 1.16 resolves it (inputs/trl_online.py: ``generation_batch_size``,
    ``steps_per_generation``, the process's share, whether old and reference log-probabilities are scored),
    None for the other trainers. A quantity, not an input, so that a search varying the batch or the GPUs
    re-derives it."""
    if trainer not in trl_online.ONLINE:
        return None
    gpus = trl_online.training_gpus(num_gpus, trainer, use_vllm, vllm_mode, vllm_tensor_parallel_size)
    return trl_online.resolve(
        trainer=trainer, num_generations=num_generations, max_completion_length=max_completion_length,
        prompt_length=prompt_length, generation_batch_size=generation_batch_size,
        steps_per_generation=steps_per_generation, beta=beta, use_vllm=use_vllm, method=method,
        per_device_train_batch_size=per_device_train_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps, processes=gpus * num_nodes)


@quantity("bytes")
def ref_model_bytes(online_settings, arch, weight_dtype_bytes, stack_name, zero_stage, world_size):
    """The reference model TRL loads when ``beta != 0`` and the policy is fully fine-tuned
    (grpo_trainer.py: ``create_model_from_path`` with the policy's ``model_init_kwargs``, so the load dtype):
    ``N × e``, sharded over the ranks under ZeRO-3 (``prepare_deepspeed``). 0 otherwise (LoRA disables the
    adapter instead; beta 0 loads none)."""
    o = online_settings
    if o is None or o.reference != "copy" or arch.is_bare:
        return 0
    full = arch.param_count * weight_dtype_bytes
    return int(full // world_size if stack_name == "deepspeed" and zero_stage == 3 else full)


@quantity("bytes")
def round_batch_bytes(online_settings):
    """The round's buffered batch on the device (``_buffered_inputs``): prompt and completion ids and masks,
    int64, ``16 · B · (P + C)`` for the process's ``B`` sequences; the per-token log-probabilities and
    advantages (fp32, ``B · C``) beside them."""
    o = online_settings
    if o is None:
        return 0
    b, p, c = o.local_generation_batch, o.prompt_length, o.max_completion_length
    return generation.ids_bytes(b, p, c) + 4 * b * c * (1 + int(o.old_logps) + int(o.reference != "none"))


@quantity("bytes")
def generation_gathered_bytes(online_settings, use_vllm, arch, weight_dtype_bytes, weight_bytes, stack_name,
                              zero_stage):
    """ZeRO-3: ``unwrap_model_for_generation(gather_deepspeed3_params=True)`` gathers the whole model for
    ``generate``: the full weights less the rank's shard. 0 otherwise (FSDP's ``summon_full_params(recurse=False)``
    gathers the root module only: not counted)."""
    if online_settings is None or use_vllm or stack_name != "deepspeed" or zero_stage != 3 or arch.is_bare:
        return 0
    return max(0, int(arch.param_count * weight_dtype_bytes) - int(weight_bytes))


@quantity("bytes", type="object")
def scoring_rows(online_settings, arch, per_device_train_batch_size, weight_dtype_bytes, activation_dtype_bytes,
                 device):
    """What the scoring forward adds at its peak (module doc, 2.), None when none runs: one layer's transients
    over ``b·(P+C)`` tokens (as the prefill's, builtin/trl/generation.py) and the fused head's buffers: the
    final hidden state, its shifted copy (``N = b·(P+C−1)`` rows), the ``min(N, 4096) × 32768`` tile buffer in
    the compute dtype (32768 columns whatever the vocabulary) and seven fp32 per-token statistics; without
    Triton (the CPU) three fp32 ``min(N, 4096) × min(V, 32768)`` tiles of the fold on top (builtin/trl/
    fused_head.py)."""
    o = online_settings
    if o is None or (not o.old_logps and o.reference == "none") or arch.is_bare:
        return None
    b, s = per_device_train_batch_size, o.sequence_length
    n = b * (s - 1)
    layer = generation.prefill_transient_bytes(arch, b, s, weight_dtype_bytes)
    rows = min(n, TRL_TOKEN_CHUNK)
    head = (b * s + n) * arch.hidden_size * activation_dtype_bytes + rows * TRL_VOCAB_CHUNK * activation_dtype_bytes \
        + 7 * 4 * n
    if device != "cuda":
        head += 3 * 4 * rows * min(arch.vocab_size, TRL_VOCAB_CHUNK)
    return {"temporaries": max(layer, head)}


def _resident(rows: dict[str, int]) -> dict[str, int]:
    return {k: rows.get(k, 0) for k in RESIDENT}


def _with(rows: dict[str, int], **extra: int) -> dict[str, int]:
    out = dict(rows)
    for k, v in extra.items():
        if v:
            out[k] = out.get(k, 0) + int(v)
    return out


def _generation_phase(base, online_settings, generation_rows, use_vllm, gathered, ref, batch):
    """The generation phase's rows (module doc, 1.)."""
    rows = _with(base, weights=ref, other=batch)
    if use_vllm:  # vLLM generates in its own memory: its reserve (usable_bytes, below)
        return rows
    gen = generation_rows or {}
    return _with(rows, gathered_params=gathered, activations=gen.get("kv_cache", 0),
                 temporaries=gen.get("temporaries", 0))


@reducer("phase_rows", when=lambda online_settings: online_settings is not None)
def online_phases(phase_rows, online_settings, use_vllm, generation_rows, scoring_rows, ref_model_bytes,
                  round_batch_bytes, generation_gathered_bytes):
    """GRPO/RLOO: the training step's phases with the round's batch and the reference copy added, and the
    ``generation`` and ``scoring`` phases in front (module doc). The training process's bytes only: a colocated
    vLLM's reserve is taken from the usable memory (:func:`vllm_colocated_reserve`)."""
    out = {}
    base = _resident(phase_rows["optimizer_step"])
    out["generation"] = _generation_phase(base, online_settings, generation_rows, use_vllm,
                                          generation_gathered_bytes, ref_model_bytes, round_batch_bytes)
    if scoring_rows is not None:
        out["scoring"] = _with(base, weights=ref_model_bytes, other=round_batch_bytes,
                               temporaries=scoring_rows["temporaries"])
    for phase, rows in phase_rows.items():
        out[phase] = _with(rows, weights=ref_model_bytes, other=round_batch_bytes)
    return out


@reducer("usable_bytes", when=lambda vllm_memory: vllm_memory is not None and vllm_memory["mode"] == "colocate"
         and not vllm_memory["sleep"])
def vllm_colocated_reserve(usable_bytes, vllm_memory):
    """A colocated vLLM holds ``gpu_memory_utilization × total`` of each training GPU for the whole run
    (builtin/trl/vllm.py): the training process has the rest. (A reserve depends on the GPU, so it is taken from
    the usable memory, not added to the phases; the recommender sets the usable memory per GPU itself and does
    not see it.) With sleep mode the reserve is on the GPU in the generation phase only: ``vllm_sleep_headroom``."""
    return usable_bytes - vllm_memory["reserve_bytes"]


@quantity("bytes")
def vllm_sleep_headroom(vllm_memory, phase_bytes, framework_overhead_bytes, usable_bytes):
    """Colocated vLLM with sleep mode: what is left of the usable memory in the generation phase, when vLLM is
    awake beside the training process: ``usable − (generation phase + overhead + reserve)`` (negative: the
    generation phase does not fit, whatever the training phases do). None otherwise."""
    if vllm_memory is None or not vllm_memory["sleep"] or usable_bytes is None:
        return None
    return usable_bytes - (phase_bytes["generation"] + framework_overhead_bytes + vllm_memory["reserve_bytes"])


@reducer("world_size", when=lambda trainer, use_vllm, vllm_mode: trainer in trl_online.ONLINE and use_vllm
         and vllm_mode == "server")
def vllm_server_gpus(world_size, trainer, use_vllm, vllm_mode, vllm_tensor_parallel_size, num_gpus, num_nodes):
    """``vllm_mode = "server"``: the server's GPUs do not train (inputs/trl_online.py ``training_gpus``)."""
    return trl_online.training_gpus(num_gpus, trainer, use_vllm, vllm_mode, vllm_tensor_parallel_size) * num_nodes


@reducer("assumed_defaults", when=lambda online_settings, assumptions: online_settings is not None
         and assumptions != "seed")
def online_defaults(assumed_defaults, online_settings, trainer, num_generations, max_completion_length, beta,
                    steps_per_generation, generation_batch_size, gradient_checkpointing, loss_implementation):
    """GRPO/RLOO: the TRL defaults the round took (inputs/trl_online.py), the loss head TRL scores with, and
    fitplan's prompt length."""
    o, name = online_settings, trainer.upper()
    out = list(assumed_defaults)
    if loss_implementation == "trl_grpo":
        out.append("loss TRL's fused log-prob head (add_fused_lm_head: no full logits)")
    if num_generations is None:
        out.append(f"num_generations {o.num_generations} ({name}Config default)")
    if max_completion_length is None:
        out.append(f"max_completion_length {o.max_completion_length} ({name}Config default)")
    if beta is None:
        out.append(f"beta {o.beta:g} ({name}Config default)")
    if steps_per_generation is None and generation_batch_size is None:
        out.append(f"steps_per_generation = gradient_accumulation_steps ({o.steps_per_generation}, {name}Config)")
    if not gradient_checkpointing:
        out.append(f"gradient_checkpointing off as stated or left out ({name}Config's own default is on: pass "
                   "--gradient-checkpointing to match it)")
    if not o.prompt_length_given:
        out.append(f"prompt_length {o.prompt_length} (fitplan's assumption: TRL does not truncate prompts; "
                   "give --prompt-length)")
    return out


QUANTITIES = (online_settings, ref_model_bytes, round_batch_bytes, generation_gathered_bytes, scoring_rows, vllm_sleep_headroom)
REDUCERS = (online_phases, vllm_colocated_reserve, vllm_server_gpus)
"""``online_defaults`` is registered by builtin/defaults.py (blocking that plugin removes its target)."""


@quantity("USD", type="object")
def online_round_cost(online_round_seconds, provider, gpu_spec, num_gpus, num_nodes, rulesets):
    """A GRPO/RLOO round's price when no provider is named: every GPU of the run (``num_gpus × num_nodes``, a vLLM
    server's included) for the round's seconds (``online_round_seconds["total"]``) at the cheapest bundled
    on-demand price per GPU-hour for this GPU (:func:`fitplan.rulesets.pricing.gpu_offers`, USD offers first):
    ``per_hour = GPUs × price``, ``per_round = total × per_hour / 3600``. What it answers: what a round, and an
    hour of rounds, costs at the least one can pay on demand, before choosing a provider (with ``--provider``
    the run is priced by its instances instead: None here; it reads no cost quantity, so that blocking the cost
    plugin leaves it). None without a round time or an offer."""
    if provider is not None or online_round_seconds is None or gpu_spec is None:
        return None
    total = online_round_seconds.get("total")
    from fitplan.rulesets.pricing import gpu_offers

    offers = gpu_offers(rulesets, gpu_spec.id)
    if total is None or not offers:
        return None
    cheapest, price = next((o for o in offers if o[0].currency == "USD"), offers[0])
    gpus = num_gpus * num_nodes
    per_hour = gpus * price
    return {"per_round": total * per_hour / 3600, "per_hour": per_hour, "currency": cheapest.currency,
            "provider": cheapest.id, "per_gpu_hour": price, "gpus": gpus}


@hookimpl
def fitplan_register_quantities(register):
    for q in (*generation.QUANTITIES, *vllm.QUANTITIES, *QUANTITIES, online_round_cost):
        register(q)


@hookimpl
def fitplan_register_reducers(register):
    for r in REDUCERS:
        register(r)
