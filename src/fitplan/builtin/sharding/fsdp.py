"""FSDP as the HF Trainer runs it through accelerate 1.16 (``--fsdp MODE``; ``--stack fsdp1`` for FSDP1).

* **Mixed precision.** With HF ``bf16=True`` (``--precision bf16-mixed``) accelerate sets the plugin's
  ``MixedPrecision``/``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)`` (accelerate/state.py:975-976,
  utils/dataclasses.py:1981-2011) and upcasts every trainable parameter to fp32 before sharding
  (utils/fsdp_utils.py:801-811; FSDP1: accelerator.py:1975-2010): shards, their gradients and the optimizer's
  states are fp32 at rest; parameters are gathered, and gradients produced and reduce-scattered, in bf16. The
  layers therefore run on bf16 weights: no autocast copies of fp32 weights exist (FSDP2 is not wrapped in
  autocast at all; FSDP1's autocast wrapper, accelerator.py:1791-1801, finds the gathered weights already in
  bf16), and activations are those of a bf16 model (the step trace of ``bf16-true``).
* **FSDP2** (``fully_shard``, fsdp_utils.py:740-935): every parameter split on dim 0, rank 0 storing
  ``ceil(d0/N)`` rows (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:290-330); units: each decoder layer,
  the input embedding (its own unit, 884-885), the final norm and LM head (one unit kept gathered after the
  forward, 887-898). ``shard_grad_op`` is ``reshard_after_forward=False`` (training_args.py:2859-2862).
* **FSDP1** (``FullyShardedDataParallel``, flat parameters): one unit per decoder layer plus the root (embeddings,
  final norm, LM head, kept gathered after the forward); with ``use_orig_params=True`` (the Trainer's default)
  each parameter starts at a multiple of 16 bytes of the compute dtype (_flat_param.py:566, 609-719) and the
  flat parameter is padded to a multiple of N (759-776): rank 0 keeps ``U/N`` elements of each unit, the
  optimizer states of the parameters that have elements there (views of the shard). FSDP1 runs FULL_SHARD
  unless ``FSDP_SHARDING_STRATEGY`` (the scenario's ``fsdp_sharding_strategy``) says otherwise (``inputs/stacks.py``).
* **CPU offload** (``--fsdp "full_shard offload"``): shards, gradients and the optimizer step live in (pinned)
  CPU memory; the GPU keeps what is gathered.
"""

from __future__ import annotations

import math

from fitplan.builtin.sharding.params import ceil_div, ordered
from fitplan.builtin.sharding.torch_native import _chunk, torch_gathered
from fitplan.engine.declarations import quantity, reducer
from fitplan.inputs.optimizer import OptimizerContext
from fitplan.inputs.precision import DTYPE_BYTES, PRESETS


def _hf(sharding_kind):
    return sharding_kind.startswith("hf_fsdp")


def dtypes(precision: str, method: str) -> tuple[float, float, float]:
    """(bytes at rest of frozen weights, of trainable weights, gathered): mixed precision keeps trainable shards
    in fp32 and gathers in the compute dtype; otherwise everything stays in the weights' dtype (LoRA: fp32)."""
    p = PRESETS[precision]
    frozen = p.weight_bytes
    trainable = 4 if (p.autocast or method != "full") else p.weight_bytes
    gather = DTYPE_BYTES[p.compute_dtype] if p.autocast else p.weight_bytes
    return frozen, trainable, gather


def fsdp1_units(params, n: int, align: int) -> list[list[tuple[int, int, bool]]]:
    """FSDP1 flat units: per unit, each parameter's (start, numel, trainable) in the aligned flat parameter,
    whose length (padded to a multiple of N) is the last entry's ``(U, 0, False)``. Units: each decoder layer, the
    root (the rest) and, for a peft model, every LoRA Linear on its own: the Trainer replaces the wrap policy with
    peft's, which also wraps each leaf module whose weight trains (``update_fsdp_plugin_peft``,
    transformers/distributed/fsdp.py:267-287; peft/utils/other.py:1294-1307)."""
    units: dict[str, list] = {}
    for i, p in enumerate(params):
        key = f"layer.{p.layer}" if p.layer >= 0 else "root"
        if "/lora." in p.module:
            key = f"adapter.{i}"
        units.setdefault(key, []).append(p)
    out = []
    for plist in units.values():
        cur, entries = 0, []
        for p in plist:
            cur = ceil_div(cur, align) * align
            entries.append((cur, p.numel, p.trainable))
            cur += p.numel
        entries.append((ceil_div(cur, n) * n, 0, False))
        out.append(entries)
    return out


@quantity("layout", type="object")
def fsdp_rank(sharding_kind, stack_name, arch, method, trainable_tensors, precision, shard_degree, tensor_parallel,
              device, optimizer_state_dtype_bytes):
    """Rank 0's FSDP tensors: ``weights``, ``gradients`` (fp32 shards under mixed precision), the optimizer
    context over what rank 0 holds, and the gather dtype (module doc). None under another stack."""
    if not _hf(sharding_kind):
        return None
    frozen_b, train_b, gather_b = dtypes(precision, method)
    n = shard_degree
    if arch.is_bare:
        per = ceil_div(arch.param_count, n * tensor_parallel)
        ctx = OptimizerContext((((per,), 1),), 4 if train_b == 4 else optimizer_state_dtype_bytes, train_b, device)
        return {"weights": per * train_b, "gradients": per * train_b, "ctx": ctx, "gather_b": gather_b, "train_b": train_b}
    params = ordered(arch, method, trainable_tensors, frozen_b, train_b, tensor_parallel)
    state_b = 4 if train_b == 4 else optimizer_state_dtype_bytes
    if stack_name == "fsdp2":
        weights = sum(math.prod(_chunk(p.shape, n)) * (train_b if p.trainable else frozen_b) for p in params)
        tensors = tuple((_chunk(p.shape, n), 1) for p in params if p.trainable)
        grads = sum(math.prod(s) for s, _ in tensors) * train_b
    else:
        align = max(1, 16 // int(gather_b))
        weights = grads = 0
        tensors_l: list = []
        for unit in fsdp1_units(params, n, align):
            shard = unit[-1][0] // n
            b = train_b if any(t for _, _, t in unit[:-1]) else frozen_b
            weights += shard * b
            if any(t for _, _, t in unit[:-1]):
                grads += shard * train_b
            tensors_l += [((min(s + k, shard) - s,), 1) for s, k, t in unit[:-1] if t and s < shard]
        tensors = tuple(tensors_l)
    ctx = OptimizerContext(tensors, state_b, train_b, device)
    return {"weights": int(weights), "gradients": int(grads), "ctx": ctx, "gather_b": gather_b, "train_b": train_b}


def _fsdp_weights(value, fsdp_rank, method, shard_degree):
    """FSDP shards at rest (fp32 under mixed precision): FSDP2 ``ceil(d0/N)`` rows of every parameter, FSDP1
    ``U/N`` elements of every flat unit. (QLoRA under FSDP: the 4-bit base, sharded evenly.)"""
    if method == "qlora":
        return ceil_div(value, shard_degree)
    return fsdp_rank["weights"]


fsdp_weights = reducer("weight_bytes", when=_hf, name="fsdp", after=("tensor_parallel", "qlora"))(_fsdp_weights)


@reducer("gradient_bytes", when=_hf, name="fsdp", after=("tensor_parallel",))
def fsdp_grads(value, fsdp_rank):
    """Sharded gradients, in the trainable shards' dtype (fp32 under mixed precision: reduce-scattered in bf16
    and cast: _fsdp_collectives.py:696)."""
    return fsdp_rank["gradients"]


@reducer("optimizer_state_bytes", when=_hf, name="fsdp", after=("tensor_parallel",))
def fsdp_states(value, fsdp_rank, optimizer_spec):
    """The optimizer's states for what rank 0 holds (fp32 shards under mixed precision)."""
    return int(optimizer_spec.state_bytes(fsdp_rank["ctx"]))


@reducer("optimizer_step_temp_bytes", when=_hf, name="fsdp", after=("tensor_parallel",))
def fsdp_step_temp(value, fsdp_rank, optimizer_spec):
    """The optimizer's step temporaries over rank 0's shards."""
    return int(optimizer_spec.step_temp_bytes(fsdp_rank["ctx"]))


def _units(arch, method, trainable_tensors, stack_name, n, g):
    """Gathered bytes (``N ×`` rank 0's padded piece, in the gather dtype ``g``) of accelerate's units: ``layer``
    (one decoder layer, LoRA adapters included), ``embed`` (the input embedding's own unit, FSDP2 untied only:
    fsdp_utils.py:884-885), ``kept`` (never resharded after the forward: FSDP2's tail unit [final norm, LM head]
    (887-898) and the root's leftovers; FSDP1's root unit), and ``layer_grads`` (one layer's trainable gradients,
    unsharded, in ``g``)."""
    from fitplan.builtin.sharding.torch_native import _param_shapes

    L = max(1, arch.num_hidden_layers)
    out = {"layer": 0.0, "embed": 0.0, "kept": 0.0, "layer_grads": 0.0}
    own_embed = stack_name == "fsdp2" and not arch.tie_word_embeddings
    for k, (shape, count, _nb, in_layer) in enumerate(_param_shapes(arch, method, trainable_tensors, g, g)):
        full = n * math.prod(_chunk(shape, n)) * count * g if stack_name == "fsdp2" else math.prod(shape) * count * g
        if in_layer:
            out["layer"] += full / L
        elif k == 0 and own_embed:
            out["embed"] += full
        else:
            out["kept"] += full
    if method == "full":
        out["layer_grads"] = sum(gr.total for gr in arch.param_groups() if gr.layer) * g / L
    else:
        out["layer_grads"] = sum(math.prod(shape) * c for shape, c in trainable_tensors) * g / L
    return out


def fsdp_terms(sharding_kind, stack_name, effective_fsdp, arch, method, trainable_tensors, fsdp_rank, shard_degree,
               tensor_parallel) -> dict:
    """Gathered parameters in the step timeline, by accelerate's units (:func:`_units`), in the gather dtype:

    * ``forward`` (the forward's end: the loss is computed inside the root module's forward): the kept unit's
      parameters and, FSDP2, its flat all-gather output, which the root frees only in its post-forward
      (torch/distributed/fsdp/_fully_shard/_fsdp_state.py:333-342; the output of the previous all-gather is kept
      until the next copy-out in the forward, _fsdp_param_group.py:417-489); shard_grad_op also every layer and
      the embedding;
    * ``forward_spike`` (the last layer's forward): the kept unit (FSDP1's root) or nothing yet (FSDP2's tail
      is gathered after it), the layer and its flat output (FSDP2), shard_grad_op the earlier layers;
    * ``backward`` (the loss gradient, where the backward's activations are largest): the kept unit only, as
      measured (fitplan-torch, 2 gloo ranks); shard_grad_op every layer and the embedding;
    * ``backward_in_layer`` (full_shard): the layer, the next unit's prefetched flat output (FSDP2's implicit
      backward prefetch; FSDP1 under the Trainer's ``NO_PREFETCH`` none), FSDP1's root, and the layer's
      unsharded 16-bit gradients beyond what the sharded timeline counts.

    FSDP1 gathers straight into its padded flat buffer (no copy-out). FSDP1 ``SHARD_GRAD_OP`` (what
    ``FSDP_SHARDING_STRATEGY`` selects) keeps every unit's flat buffer from its forward until its post-backward
    frees it (torch/distributed/fsdp/_runtime_utils.py ``_should_free_in_backward``; no free after the forward: it is
    not in ``RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES``): the root and every layer from the last layer's forward on."""
    g = fsdp_rank["gather_b"]
    n = shard_degree
    if arch.is_bare:
        return torch_gathered("fsdp_zero2" if effective_fsdp == "shard_grad_op" else "fsdp_zero3", arch, method,
                              trainable_tensors, g, g, n, tensor_parallel, copy_out=stack_name == "fsdp2")
    u = _units(arch, method, trainable_tensors, stack_name, n, g)
    v2 = stack_name == "fsdp2"
    L = max(1, arch.num_hidden_layers)
    flat = u["layer"] if v2 else 0.0
    kept_fwd = u["kept"] * (2 if v2 else 1)
    if effective_fsdp == "shard_grad_op":
        everything = u["embed"] + L * u["layer"]
        out = {"forward": kept_fwd + everything, "forward_spike": everything + flat + (0 if v2 else u["kept"]),
               "backward": u["kept"] + everything, "backward_in_layer": 0}
    else:
        kept_bwd = u["kept"]
        prefetched = max(u["layer"], u["embed"]) if v2 else 0.0
        extra_grads = max(0.0, 1 - fsdp_rank["train_b"] / (n * g)) * u["layer_grads"]
        out = {"forward": kept_fwd, "forward_spike": (0 if v2 else u["kept"]) + u["layer"] + flat,
               "backward": kept_bwd,
               "backward_in_layer": (0 if v2 else kept_bwd) + u["layer"] + prefetched + extra_grads}
    return {k: _ceil(v, tensor_parallel) for k, v in out.items()}


def _ceil(v, t):
    return -(-int(math.ceil(v)) // int(t))


QUANTITIES = (fsdp_rank,)
REDUCERS = (fsdp_weights, fsdp_grads, fsdp_states, fsdp_step_temp)
