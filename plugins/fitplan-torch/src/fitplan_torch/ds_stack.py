"""DeepSpeed ZeRO 0-3 on the CPU, measured per rank from the engine's own tensors (deepspeed 0.19.8).

How the run is set up, as the HF Trainer drives DeepSpeed (transformers 5.24, accelerate 1.16):

* ``DS_ACCELERATOR=cpu`` and the gloo process group this rank already joined (``deepspeed.init_distributed``
  finds it initialised and only wraps it: deepspeed/comm/comm.py:878-880);
* the model is built in fp32 and ``deepspeed.initialize`` casts its parameters to bf16 when the ds_config
  enables ``bf16`` (runtime/engine.py:2080-2088), as it does for a model the Trainer loads in fp32;
* the optimizer is the scenario's torch optimizer over the Trainer's two parameter groups (weight decay /
  no weight decay: transformers/trainer.py:1273-1286, 1408-1418), a *client* optimizer as the Trainer passes
  it when the ds_config has no ``optimizer`` section. With ``offload_optimizer`` accelerate would swap a torch
  AdamW for ``DeepSpeedCPUAdam`` (accelerate/accelerator.py:2337-2345), whose C++ extension takes minutes to
  JIT-build; the referee keeps the torch optimizer and sets ``zero_force_ds_cpu_optimizer: false``
  (runtime/engine.py:2342-2346). The GPU-side bytes do not depend on which CPU optimizer steps the
  offloaded partition; its host-side states and temporaries do (docs/validation.md);
* a step is ``loss = engine(**batch).loss``, ``engine.backward(loss)``, ``engine.step()`` (what accelerate's
  ``DeepSpeedEngineWrapper.backward`` runs); :data:`STACK_STEPS` steps are measured, the first (which creates the
  optimizer states) included, and the highest step's peak is reported.

Categories come from the engine's tensors by attribute (:func:`engine_tensors`), the step peak from the
live-storage counter over the measured step, with every tensor alive before it registered (the counter's
baseline is everything the Python garbage collector can reach).
"""

from __future__ import annotations

import gc
import os
import re
import time
from typing import Any

from . import _deps

NO_DECAY = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
"""transformers/trainer.py:1416 ``forbidden_name_patterns`` (plus ``nn.LayerNorm`` modules, 1417)."""

REFEREE_KEYS = {"zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
                "steps_per_print": 10**9, "wall_clock_breakdown": False}
"""ds_config keys the referee adds: a client torch optimizer under offload (see the module doc), no logging."""


def hf_param_groups(model) -> list[dict[str, Any]]:
    """The HF Trainer's optimizer groups: decayed parameters first, then the others (empty groups dropped,
    as DeepSpeed drops them: runtime/engine.py:2348)."""
    torch = _deps.torch()
    pats = [re.compile(p) for p in NO_DECAY]
    norm_params = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters(recurse=False)}
    decay, other = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        nd = id(p) in norm_params or any(r.search(name.lower()) for r in pats)
        (other if nd else decay).append(p)
    groups = [{"params": decay, "weight_decay": 0.0}, {"params": other, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _tensors(obj, *names) -> list[Any]:
    """Every tensor under the attributes ``names`` of ``obj`` (lists, dicts and objects with ``.buffer``)."""
    torch = _deps.torch()
    out: list[Any] = []

    def walk(v, depth=0):
        if depth > 4 or v is None:
            return
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x, depth + 1)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x, depth + 1)
        elif hasattr(v, "buffer"):
            walk(v.buffer, depth + 1)

    for n in names:
        walk(getattr(obj, n, None))
    return out


def engine_tensors(engine) -> dict[str, list[Any]]:
    """The engine's tensors by category: ``parameters`` (16-bit or fp32 model weights as the engine holds
    them), ``master_weights`` (fp32 partitions), ``gradients`` (the gradient partition or the module's
    ``.grad``), ``comm_buffers`` (IPG buckets), ``offload_buffers`` (host staging buffers)."""
    o = engine.optimizer
    mod = engine.module
    kind = type(o).__name__
    out: dict[str, list[Any]] = {}
    if kind == "DeepSpeedZeroOptimizer":
        # frozen parameters (a LoRA base) are not in the optimizer's flat groups: the module keeps them whole
        out["parameters"] = _tensors(o, "bit16_groups_flat") + [p.data for p in mod.parameters() if not p.requires_grad]
        out["master_weights"] = _tensors(o, "single_partition_of_fp32_groups")
        out["gradients"] = ([p.grad for p in o.single_partition_of_fp32_groups if p.grad is not None] if o.cpu_offload
                            else _tensors(o, "averaged_gradients"))
        out["comm_buffers"] = _tensors(o, "ipg_buckets", "temp_grad_buffer_for_gpu_offload")
        out["offload_buffers"] = _tensors(o, "param_buffer_of_bit16_for_cpu_offload_groups", "temp_grad_buffer_for_cpu_offload")
    elif kind == "DeepSpeedZeroOptimizer_Stage3":
        persistent = [p for p in mod.parameters() if getattr(p, "ds_persist", False) and p.data.numel()]
        frozen = [p.ds_tensor for p in mod.parameters() if not p.requires_grad and getattr(p, "ds_tensor", None) is not None]
        out["parameters"] = _tensors(o, "fp16_partitioned_groups_flat") + [p.data for p in persistent] + frozen
        out["master_weights"] = _tensors(o, "fp32_partitioned_groups_flat")
        out["gradients"] = _tensors(o, "grad_partitions_flat_buffer") + [
            p.grad for p in o.fp32_partitioned_groups_flat if p.grad is not None]  # offload: the fp32 gradient too
        out["comm_buffers"] = _tensors(o, "ipg_buckets")
    else:  # ZeRO-0: the client optimizer, or FP16_UnfusedOptimizer (bf16)
        out["parameters"] = list(mod.parameters())
        out["master_weights"] = _tensors(o, "fp32_groups") if hasattr(o, "fp32_groups") else []
        out["gradients"] = [p.grad for p in mod.parameters() if p.grad is not None]
    return out


def base_optimizer(engine):
    """The torch optimizer that holds the states (the wrapper's ``optimizer``, or the client itself)."""
    o = engine.optimizer
    inner = getattr(o, "optimizer", None)
    return inner if inner is not None and hasattr(inner, "state") else o


def build_engine(rc, device: str):
    """Model, engine and batch for this rank (``rc.ds_config`` is the config fitplan modelled)."""
    torch = _deps.torch()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    deepspeed = _deps.need("deepspeed")
    from .build import build_model, import_dotted, make_batch, vocab_size_of

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    model = build_model(rc.config, precision="32-true", attn_implementation=rc.attn_implementation, method=rc.method,
                        lora=rc.lora, gradient_checkpointing=rc.gradient_checkpointing, device=device, seed=rc.seed)
    cls = import_dotted(rc.optimizer.torch_class)
    kwargs = dict(rc.optimizer.torch_kwargs)
    optimizer = cls(hf_param_groups(model), lr=1e-5, **kwargs)
    cfg = {**rc.ds_config, **REFEREE_KEYS}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg)
    vocab = int(getattr(engine.module.get_input_embeddings().weight, "ds_shape", (0,))[0]) or vocab_size_of(engine.module)
    batch = make_batch(vocab, rc.batch, rc.seq, device=device,
                       seed=rc.seed + torch.distributed.get_rank())
    return engine, batch


def _step(engine, batch, counter=None, marks: dict | None = None) -> None:
    mark = counter.set_phase if counter is not None else (lambda p: None)
    mark("forward")
    before = counter.current if counter is not None else 0
    loss = engine(**batch).loss
    if counter is not None and marks is not None:
        marks["retained"] = counter.current - before - loss.numel() * loss.element_size()
        marks["gathered"] = _gathered_bytes(engine)
        marks["retained"] -= marks["gathered"]
    mark("backward")
    engine.backward(loss)
    if marks is not None:
        marks["gradients"] = _storage_bytes(engine_tensors(engine)["gradients"])
        marks["module_grads"] = _storage_bytes(p.grad for p in engine.module.parameters() if p.grad is not None)
    del loss
    mark("optimizer_step")
    engine.step()
    mark("end")


def _gathered_bytes(engine) -> int:
    """ZeRO-3: full parameters gathered and not persistent when the forward ends (parameter memory, not
    activations)."""
    total = 0
    for p in engine.module.parameters():
        if hasattr(p, "ds_tensor") and not getattr(p, "ds_persist", False) and p.data.numel():
            total += p.data.untyped_storage().nbytes()
    return total


def _storage_bytes(tensors) -> int:
    from .measure import storage_bytes

    return storage_bytes(t for t in tensors if t is not None)


def all_live_tensors() -> list[Any]:
    """Every tensor the garbage collector reaches that has memory (DeepSpeed keeps ``meta`` tensors of the
    parameters' shapes: storages with a size and no memory)."""
    torch = _deps.torch()
    out = []
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and not o.is_meta:
                out.append(o)
        except Exception:  # noqa: BLE001, S112 - objects that refuse isinstance
            continue
    return out


STACK_STEPS = 4
"""Optimizer steps measured (the first included): the first creates the optimizer states, the later ones show what
DeepSpeed keeps between steps and that the peak repeats."""


def measure_deepspeed(rc, steps: int = 1) -> dict[str, Any]:
    """Run :data:`STACK_STEPS` optimizer steps (at least) on this rank (the process group is initialised): the
    categories are the last step's, the peak the highest step's (``peak_step`` says which, 1 = the first)."""
    torch = _deps.torch()
    from .measure import LiveBytes, storage_bytes

    device = "cpu"
    engine, batch = build_engine(rc, device)
    engine.train()
    m: dict[str, Any] = {}
    highest: dict[str, Any] = {}
    step_peaks: list[int] = []
    for _ in range(max(steps + 1, STACK_STEPS)):
        torch.distributed.barrier()
        gc.collect()
        counter = LiveBytes()
        counter.track(all_live_tensors())
        counter.set_phase("setup")
        counter.reset_peak()
        start = counter.current
        marks: dict[str, int] = {}
        t0 = time.perf_counter()
        with counter:
            _step(engine, batch, counter, marks)
        dt = time.perf_counter() - t0
        cats = engine_tensors(engine)
        peaks = dict(counter.phase_peaks)
        peaks.pop("setup", None)
        peaks.pop("end", None)
        states = [v for s in base_optimizer(engine).state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        m = {
            "parameters": storage_bytes(cats["parameters"]),
            "master_weights": storage_bytes(cats.get("master_weights", [])),
            "gradients": marks.get("gradients", 0),
            "module_grads": marks.get("module_grads", 0),
            "optimizer_states": storage_bytes(states),
            "comm_buffers": storage_bytes(cats.get("comm_buffers", [])),
            "offload_buffers": storage_bytes(cats.get("offload_buffers", [])),
            "buffers": storage_bytes(engine.module.buffers()),
            "inputs": storage_bytes(batch.values()),
            "retained": marks.get("retained", 0),
            "gathered_params": marks.get("gathered", 0),
            "peak": counter.peak, "peak_phase": counter.peak_phase, "phase_peaks": peaks, "start": start,
            "step_seconds": dt, "wrapper": type(engine.optimizer).__name__,
        }
        step_peaks.append(counter.peak)
        if not highest or counter.peak > highest["peak"]:
            highest = {k: m[k] for k in ("peak", "peak_phase", "phase_peaks")}
    m.update(highest, step_peaks=step_peaks, peak_step=step_peaks.index(highest["peak"]) + 1)
    return m
