"""accelerate's FSDP1 / FSDP2 driven by the real HF ``Trainer`` on the CPU (transformers 5.24, accelerate 1.16).

:mod:`.accel_fsdp` calls ``Accelerator.prepare`` and runs a bare step; this module runs ``Trainer.train()`` itself
for :data:`TRAINER_STEPS` optimizer steps, so what the Trainer does between and around the steps is measured too:
``model.zero_grad()`` instead of the optimizer's (trainer.py:1954; under FSDP1 with ``use_orig_params=True``
``Module.zero_grad`` reaches the original parameters only, so each unit's sharded ``flat_param.grad`` stays alive
until the next root pre-forward frees it: torch/distributed/fsdp/_runtime_utils.py:594, 1563-1600), gradient
clipping at ``max_grad_norm`` (1.0 by default: ``accelerator.clip_grad_norm_``, trainer.py:2781-2787), the
learning-rate scheduler, the data collator's batches and the loss bookkeeping (``_tr_loss``).

FSDP2's gradient reduce-scatter runs with NCCL's memory, not gloo's (:func:`.gloo_settle.reduce_scatter_like_nccl`:
gloo clones the whole reduce-scatter input, NCCL does not); FSDP1 keeps gloo's.

The only changes to the Trainer are the ones a CPU run needs, and instruments:

* ``create_accelerator_and_postprocess`` runs the Trainer's own, then switches accelerate's state to FSDP as
  :func:`.accel_fsdp.switch_to_fsdp` does (accelerate maps FSDP to DDP without accelerators: state.py:946-977)
  and sets ``is_fsdp_enabled`` (trainer.py:875), which the Trainer reads when it wraps the model and creates the
  optimizer (FSDP1: the model first, trainer.py:1717-1768). FSDP1's ``sync_module_states`` is False (refused
  without an accelerator: accelerate/utils/dataclasses.py:1872-1880).
* ``compute_loss`` (the Trainer's, wrapped) marks the forward and measures what it leaves alive; ``_clip_grad_norm``
  marks clipping and reads the gradients; a callback marks the optimizer step and ``zero_grad`` and records each
  step's peak from the live-storage counter entered before the model is built.
* the optimizer is the scenario's torch optimizer through ``optimizer_cls_and_kwargs`` (the Trainer builds its two
  parameter groups over the wrapped parameters), ``learning_rate`` 1e-5, weight decay 0; the batches are random ids
  (labels = ids) through the Trainer's default collator and distributed sampler.

FSDP1's sharding strategy: ``FSDP_SHARDING_STRATEGY`` (what ``accelerate config`` / ``accelerate launch`` write) is
set from ``rc.fsdp1_strategy`` when given; otherwise FSDP1 runs FULL_SHARD whatever ``fsdp=`` says, as the plugin
reads the variable before the Trainer's ``reshard_after_forward`` (dataclasses.py:1719-1728, accelerator.py:1919).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from typing import Any

from . import _deps

TRAINER_STEPS = 4
"""Optimizer steps run through ``Trainer.train()`` (at least): the first builds the optimizer states, the second is
the first with what the Trainer leaves between steps, the third and fourth show that the peak repeats."""


def training_arguments(rc, out_dir: str, steps: int):
    """``TrainingArguments`` for the scenario: ``fsdp`` / ``fsdp_config`` as :func:`.accel_fsdp.trainer_fsdp_args`
    passes them, ``max_steps`` steps of ``rc.batch`` sequences, nothing logged or saved."""
    transformers = _deps.transformers()
    cfg: dict[str, Any] = {"version": 1 if rc.stack == "fsdp1" else 2}
    if rc.gradient_checkpointing:
        cfg["activation_checkpointing"] = True
    if rc.stack == "fsdp1" and not rc.use_orig_params:
        cfg["use_orig_params"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = transformers.TrainingArguments(
            output_dir=out_dir, fsdp=rc.fsdp or "full_shard", fsdp_config=cfg, use_cpu=True, report_to=[],
            bf16=rc.precision == "bf16-mixed", per_device_train_batch_size=rc.batch, max_steps=steps,
            gradient_accumulation_steps=rc.accumulation, learning_rate=1e-5, weight_decay=0.0, save_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=rc.seed)
    if cfg["version"] == 1:
        args.fsdp_plugin_args["sync_module_states"] = False  # refused without an accelerator (module doc)
    return args


class _Dataset:
    """``n`` random sequences of ``seq`` ids (labels = ids), as dicts the default collator stacks."""

    def __init__(self, vocab: int, n: int, seq: int, seed: int) -> None:
        torch = _deps.torch()
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def host_batches_counted(counter, record: dict[str, Any], get_batch_samples, *args):
    """``Trainer.get_batch_samples(*args)`` with its batches counted as host memory, not as the step's: a GPU
    run keeps the collated and prefetched batches on the host and copies the current one to the device
    (accelerate/data_loader.py:566-590), so only the batches handed to the step are counted (in
    ``record["host_batches"]``) and then tracked as live. Shared by the FSDP and DeepSpeed Trainer drivers."""
    before = counter.live_ids()
    out = get_batch_samples(*args)
    batches = [t for b in out[0] for t in b.values()] + [out[1]]
    record["host_batches"] = record.get("host_batches", 0) + counter.forget_new(before, batches)
    counter.track(batches)
    return out


def begin_step(counter, record: dict[str, Any]) -> None:
    """At a step's start, once every rank is there: the phase ``setup``, the peak reset, the live bytes kept as
    the step's start. Shared by the FSDP and DeepSpeed Trainer drivers."""
    _deps.torch().distributed.barrier()
    counter.set_phase("setup")
    counter.reset_peak()
    record["start"] = counter.current


def end_step(counter, record: dict[str, Any]) -> None:
    """At a step's end: its peak, the peak's phase and each phase's peak (``setup`` left out), appended to
    ``record["steps"]``."""
    phases = {k: v for k, v in counter.phase_peaks.items() if k != "setup"}
    record["steps"].append({"peak": counter.peak, "peak_phase": counter.peak_phase, "phase_peaks": phases,
                            "start": record["start"]})


def _trainer_class(counter, record: dict[str, Any], plugin_mp: dict[str, Any]):
    """The Trainer with the CPU switch and the instruments (module doc)."""
    transformers = _deps.transformers()
    from .accel_fsdp import fsdp1_gathered, switch_to_fsdp
    from .measure import storage_bytes

    class MeasuredTrainer(transformers.Trainer):
        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            from accelerate.utils import FullyShardedDataParallelPlugin

            plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
            switch_to_fsdp(self.accelerator, plugin, str(self.args.mixed_precision or "no"))
            plugin_mp["plugin"] = plugin
            self.is_fsdp_enabled = True

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            return host_batches_counted(counter, record, super().get_batch_samples, epoch_iterator, num_batches, device)

        def compute_loss(self, model, inputs, *args, **kwargs):
            counter.set_phase("forward")
            before = counter.current
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            gathered = fsdp1_gathered(model) if record["v1"] else _new_param_bytes(model, record)
            record["retained"] = counter.current - before - loss.numel() * loss.element_size() - gathered
            record["gathered_params"] = gathered
            counter.set_phase("backward")
            return loss

        def _clip_grad_norm(self, model):
            record["gradients"] = _gradient_bytes(model, record["v1"])
            counter.set_phase("clip_grad_norm")
            return super()._clip_grad_norm(model)

    class StepCallback(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            begin_step(counter, record)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            counter.set_phase("optimizer_step")

        def on_optimizer_step(self, args, state, control, **kwargs):
            counter.set_phase("zero_grad")

        def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
            end_step(counter, record)
            record["stale_flat_grads"] = _stale_flat_grads(model) if record["v1"] else 0
            record["optimizer_states"] = storage_bytes(_state_tensors(optimizer))
            counter.set_phase("between_steps")

    return MeasuredTrainer, StepCallback


def _new_param_bytes(model, record) -> int:
    """FSDP2: bytes of parameter storages that did not exist when the model was wrapped (the gathered units)."""
    from .measure import storages

    known = record.setdefault("sharded_storages", None)
    now = storages(model.parameters())
    if known is None:
        return 0
    return sum(st.nbytes() for k, st in now.items() if k not in known)


def _gradient_bytes(model, v1: bool) -> int:
    """The sharded gradients before clipping: FSDP1's flat gradients (the original parameters' ``.grad`` are views
    of them), FSDP2's DTensor shards."""
    from .accel_fsdp import _fsdp1_handles
    from .measure import storage_bytes

    if v1:
        return storage_bytes(h.flat_param.grad for h in _fsdp1_handles(model) if h.flat_param.grad is not None)
    return storage_bytes(p.grad for p in model.parameters() if p.grad is not None)


def _stale_flat_grads(model) -> int:
    from .accel_fsdp import stale_flat_grads

    return stale_flat_grads(model)


def _state_tensors(optimizer) -> list[Any]:
    from .measure import optimizer_state_tensors

    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    return optimizer_state_tensors(inner)


def measure_trainer_fsdp(rc, steps: int = 1) -> dict[str, Any]:
    """Build under the live-storage counter and run ``Trainer.train()`` on this rank; the peak is the highest
    step's (``peak_step``, 1 = the first), the categories are read after the last step."""
    import torch.distributed as dist

    from .accel_fsdp import _model_dtype_precision
    from .build import build_model, import_dotted
    from .measure import LiveBytes, storage_bytes, storages

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # else accelerate resets the thread count on MULTI_CPU
    if rc.stack == "fsdp1" and rc.fsdp1_strategy:
        os.environ["FSDP_SHARDING_STRATEGY"] = rc.fsdp1_strategy.upper()
    if rc.stack == "fsdp2":
        from .gloo_settle import reduce_scatter_like_nccl

        reduce_scatter_like_nccl()  # gloo's reduce-scatter clones its input, NCCL's does not (issue #31)
    n = max(steps + 1, TRAINER_STEPS)
    record: dict[str, Any] = {"steps": [], "v1": rc.stack == "fsdp1"}
    plugin_mp: dict[str, Any] = {}
    vocab = vocab_size_of_config(rc)
    data = _Dataset(vocab, n * rc.batch * rc.accumulation * dist.get_world_size(), rc.seq, rc.seed)  # host data
    counter = LiveBytes()
    with counter, tempfile.TemporaryDirectory(prefix="fitplan-trainer-") as out_dir:
        model = build_model(rc.config, precision=_model_dtype_precision(rc.precision),
                            attn_implementation=rc.attn_implementation, method=rc.method, lora=rc.lora,
                            gradient_checkpointing=False, device="cpu", seed=rc.seed)
        trainer_cls, callback_cls = _trainer_class(counter, record, plugin_mp)
        cls = import_dotted(rc.optimizer.torch_class)
        trainer = trainer_cls(model=model, args=training_arguments(rc, out_dir, n), train_dataset=data,
                              callbacks=[callback_cls()],
                              optimizer_cls_and_kwargs=(cls, {"lr": 1e-5, **dict(rc.optimizer.torch_kwargs)}))
        orig_prepare = trainer.accelerator.prepare

        def prepare(*objs, **kw):  # FSDP2's shards are known once wrapped: new storages later are gathers
            out = orig_prepare(*objs, **kw)
            record["sharded_storages"] = set(storages(trainer.accelerator._models[0].parameters())) \
                if trainer.accelerator._models else None
            return out

        trainer.accelerator.prepare = prepare
        trainer.train()
        wrapped = trainer.model_wrapped
        params = storage_bytes(wrapped.parameters()) if not record["v1"] else _fsdp1_param_bytes(wrapped)
    steps_ = record["steps"]
    peaks = [s["peak"] for s in steps_]
    best = steps_[peaks.index(max(peaks))]
    plugin = plugin_mp.get("plugin")
    return {
        "parameters": params, "buffers": storage_bytes(wrapped.buffers()), "gradients": record.get("gradients", 0),
        "optimizer_states": record.get("optimizer_states", 0), "inputs": 2 * rc.batch * rc.seq * 8,
        "saved_tensors": 0, "retained": record.get("retained", 0) + record.get("stale_flat_grads", 0),
        "gathered_params": record.get("gathered_params", 0), "stale_flat_grads": record.get("stale_flat_grads", 0),
        "peak": best["peak"], "peak_phase": best["peak_phase"], "phase_peaks": best["phase_peaks"],
        "start": best["start"], "step_peaks": peaks, "peak_step": peaks.index(best["peak"]) + 1, "step_seconds": 0.0,
        "wrapper": type(wrapped).__name__, "driver": "trainer", "host_batch_bytes": record.get("host_batches", 0),
        "sharding_strategy": str(getattr(plugin, "sharding_strategy", None) or getattr(plugin, "reshard_after_forward", "")),
    }


def vocab_size_of_config(rc) -> int:
    """The vocabulary size from the model's config (the dataset is built before the model)."""
    from .build import hf_config

    return int(hf_config(rc.config, rc.attn_implementation).get_text_config().vocab_size)


def _fsdp1_param_bytes(model) -> int:
    """FSDP1: this rank's flat shards (``use_orig_params=True`` parameters are views of them)."""
    from .accel_fsdp import _fsdp1_handles
    from .measure import storage_bytes

    return storage_bytes(h.flat_param for h in _fsdp1_handles(model))
