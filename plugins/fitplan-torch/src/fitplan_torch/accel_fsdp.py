"""accelerate's FSDP1 / FSDP2 on the CPU, as the HF Trainer sets them up (accelerate 1.16, transformers 5.24).

How the run is set up:

* the plugin's arguments are the Trainer's own: ``TrainingArguments(fsdp=MODE, fsdp_config={"version": 1|2,
  "activation_checkpointing": ...}, bf16=..., use_cpu=True).fsdp_plugin_args`` (training_args.py:2788-2883) and
  ``FullyShardedDataParallelPlugin(**those)`` (trainer.py:852-856). One change: FSDP1's ``sync_module_states``
  (the Trainer's default True) is False, because FSDP1 refuses it without an accelerator
  (accelerate/utils/dataclasses.py:1872-1880); every rank builds the same seeded weights anyway.
* on the CPU accelerate never selects FSDP: ``AcceleratorState`` turns a plugin into ``DistributedType.FSDP``
  only for multi-accelerator types (accelerate/state.py:946-977), so the Trainer silently runs DDP. The referee
  therefore switches both shared state dicts (``PartialState`` and ``AcceleratorState``: state.py:878-880
  re-copies the first into the second) to FSDP with the plugin, sets the plugin's mixed precision as
  ``AcceleratorState`` would (state.py:975-976), and uses an index-less ``cpu`` device (FSDP1 compares
  ``device_id`` with ``torch.device(torch.cpu.current_device())``: torch/distributed/fsdp/_init_utils.py:1075-1106).
  From there ``Accelerator.prepare`` runs the code the Trainer runs on GPUs: ``prepare_model`` (FSDP1, with its
  autocast wrapper around ``forward``: accelerator.py:1791-1801, 1891-1960) or ``_prepare_fsdp2``
  (fsdp_utils.py:740-935).
* the order is the Trainer's (trainer.py:1717-1768): FSDP1 prepares the model first, then creates the optimizer
  over the wrapped parameters (for a peft model after ``update_fsdp_plugin_peft``, which wraps every trainable
  LoRA Linear as its own unit: transformers/distributed/fsdp.py:267-287, peft/utils/other.py:1271-1308); FSDP2
  creates the optimizer first and prepares both (accelerate swaps in the DTensor shards: accelerator.py:1683-1733).
  The optimizer is the scenario's torch optimizer over the Trainer's two parameter groups.
* the model is built in fp32 for ``32-true`` / ``bf16-mixed`` and in bf16 for ``bf16-true``; with mixed precision
  accelerate upcasts trainable parameters to fp32 before sharding (fsdp_utils.py:801-811; FSDP1:
  accelerator.py:1975-2010). Activation checkpointing is the FSDP plugin's (``fsdp_config``), not HF's.
* one step: ``loss = model(**batch).loss``, ``loss.backward()`` (what ``Accelerator.backward`` does under FSDP),
  ``optimizer.step()``, ``zero_grad(set_to_none=True)``; no autocast of the referee's own (FSDP1 has
  accelerate's; FSDP2 none: the Trainer's ``autocast_smart_context_manager`` is a null context, trainer.py:2231-2236).
  Gradient clipping (``max_grad_norm``) is not run: it adds a few scalars.

Categories come from the wrapped model's own tensors (the local shards, their ``.grad``, the optimizer's states);
the step peak from the live-storage counter entered before the model is built (it sees FSDP's all-gather
buffers, also those FSDP2 frees with ``storage.resize_``).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from typing import Any

from . import _deps


def trainer_fsdp_args(rc) -> tuple[dict[str, Any], str]:
    """The plugin's keyword arguments and the mixed precision, as ``TrainingArguments`` computes them."""
    transformers = _deps.transformers()
    version = 1 if rc.stack == "fsdp1" else 2
    mode = rc.fsdp or "full_shard"
    cfg: dict[str, Any] = {"version": version}
    if rc.gradient_checkpointing:
        cfg["activation_checkpointing"] = True
    if version == 1 and not rc.use_orig_params:
        cfg["use_orig_params"] = False
    if version == 1 and rc.fsdp1_strategy:  # what accelerate launch exports; the plugin reads it (trainer_fsdp doc)
        os.environ["FSDP_SHARDING_STRATEGY"] = rc.fsdp1_strategy.upper()
    with tempfile.TemporaryDirectory(prefix="fitplan-ta-") as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = transformers.TrainingArguments(output_dir=out, fsdp=mode, fsdp_config=cfg, use_cpu=True, report_to=[],
                                              bf16=rc.precision == "bf16-mixed")
    kwargs = dict(args.fsdp_plugin_args)
    if version == 1:
        kwargs["sync_module_states"] = False  # refused without an accelerator (module doc)
    return kwargs, str(args.mixed_precision or "no")


def fsdp_accelerator(plugin_kwargs: dict[str, Any], mixed_precision: str):
    """An ``Accelerator`` whose state says FSDP with the plugin (module doc)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # else accelerate resets the thread count on MULTI_CPU
    accelerate = _deps.need("accelerate")
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**plugin_kwargs)
    acc = accelerate.Accelerator(mixed_precision=mixed_precision, cpu=True)
    switch_to_fsdp(acc, plugin, mixed_precision)
    return acc


def switch_to_fsdp(acc, plugin, mixed_precision: str) -> None:
    """Make ``acc``'s shared state say FSDP with ``plugin`` and an index-less ``cpu`` device, and set the plugin's
    mixed precision as ``AcceleratorState`` would on GPUs (module doc)."""
    torch = _deps.torch()
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    for state in (PartialState._shared_state, acc.state.__dict__):
        state["distributed_type"] = DistributedType.FSDP
        state["device"] = torch.device("cpu")
    acc.state.fsdp_plugin = plugin
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)


def _model_dtype_precision(precision: str) -> str:
    """The precision the model is built in: fp32 weights unless the scenario trains 16-bit weights."""
    return precision if precision in ("bf16-true", "16-true") else "32-true"


def prepare(rc, device: str = "cpu"):
    """Build, wrap and create the optimizer as the Trainer does; returns (model, optimizer, plugin arguments,
    vocabulary size: read before wrapping, as FSDP1's original parameters are views of this rank's shard)."""
    from .build import build_model, import_dotted, vocab_size_of
    from .ds_stack import hf_param_groups

    kwargs, mp = trainer_fsdp_args(rc)
    acc = fsdp_accelerator(kwargs, mp)
    model = build_model(rc.config, precision=_model_dtype_precision(rc.precision), attn_implementation=rc.attn_implementation,
                        method=rc.method, lora=rc.lora, gradient_checkpointing=False, device=device, seed=rc.seed)
    vocab = vocab_size_of(model)
    cls = import_dotted(rc.optimizer.torch_class)

    def optimizer(m):
        return cls(hf_param_groups(m), lr=1e-5, **dict(rc.optimizer.torch_kwargs))

    if kwargs["fsdp_version"] == 1:
        if rc.method != "full":
            from transformers.distributed.fsdp import update_fsdp_plugin_peft

            update_fsdp_plugin_peft(model, acc)
        model = acc.prepare(model)
        opt = acc.prepare(optimizer(model))
    else:
        model, opt = acc.prepare(model, optimizer(model))
    return model, opt, kwargs, vocab


def _fsdp1_handles(model) -> list[Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle for m in FSDP.fsdp_modules(model) if getattr(m, "_handle", None) is not None]


def stale_flat_grads(model) -> int:
    """FSDP1 with ``use_orig_params=True``: bytes of the sharded flat gradients that ``zero_grad(set_to_none=True)``
    leaves behind (it clears the original parameters' ``.grad`` views only); the root's pre-forward frees them
    (torch/distributed/fsdp/_runtime_utils.py:594, _flat_param.py:2447-2471). They are alive before the forward and
    gone after it, so the forward's retained bytes (after − before) are short by them: added back. 0 under FSDP2."""
    from .measure import storage_bytes

    return storage_bytes(h.flat_param.grad for h in _fsdp1_handles(model) if h.flat_param.grad is not None)


def fsdp1_gathered(model) -> int:
    """FSDP1: bytes of the unsharded flat buffers (``_full_param_padded``) allocated now; the original parameters
    are views of this rank's shard outside a unit's forward, so ``parameters()`` does not show them."""
    from .measure import storage_bytes

    return storage_bytes(getattr(h.flat_param, "_full_param_padded", None) for h in _fsdp1_handles(model))


STACK_STEPS = 4
"""Optimizer steps the referee runs at least (the first included): step 2 is the first with what the Trainer leaves
between steps (FSDP1's stale flat gradients, the optimizer's states); steps 3 and 4 show that the peak repeats."""


def measure_accelerate_fsdp(rc, steps: int = 1) -> dict[str, Any]:
    """Build under the live-storage counter, then run :data:`STACK_STEPS` optimizer steps (at least) on this rank:
    the peak is the highest step's (``peak_step`` says which)."""
    import torch.distributed as dist

    from .build import make_batch
    from .measure import LiveBytes
    from .step import measure_step

    counter = LiveBytes()
    with counter:
        model, opt, plugin_kwargs, vocab = prepare(rc)
        batch = make_batch(vocab, rc.batch, rc.seq, device="cpu", seed=rc.seed + dist.get_rank())
        # no autocast of the referee's own: FSDP1's forward carries accelerate's, FSDP2 runs on bf16 gathers
        v1 = plugin_kwargs["fsdp_version"] == 1
        m = measure_step(model, opt, batch, precision="none", device_type="cpu", steps=max(steps, STACK_STEPS - 1),
                         memtracker=False,
                         counter=counter, barrier=dist.barrier, accumulation=rc.accumulation,
                         gathered_fn=(lambda: fsdp1_gathered(model)) if v1 else None)
    out = m.asdict()
    stale = stale_flat_grads(model) if v1 else 0
    out["retained"] += stale
    out["stale_flat_grads"] = stale
    out["wrapper"] = type(model).__name__
    out["plugin"] = {k: str(v) for k, v in plugin_kwargs.items()}
    return out
