"""DeepSpeed ZeRO driven by the real HF ``Trainer`` on the CPU (transformers 5.24, accelerate 1.16, deepspeed 0.19.8).

:mod:`.ds_stack` calls ``deepspeed.initialize`` itself; this module runs ``Trainer.train()`` with
``TrainingArguments(deepspeed=<ds_config>)`` for :data:`TRAINER_STEPS` optimizer steps, so what the HF integration
does is measured too:

* ``HfTrainerDeepSpeedConfig.trainer_config_process`` / ``trainer_config_finalize``
  (transformers/integrations/deepspeed.py) fill the config's ``"auto"`` values: micro-batch, accumulation,
  ``gradient_clipping`` (``max_grad_norm``, 1.0), ``bf16.enabled``, and from the model's ``hidden_size``
  ``reduce_bucket_size`` (hidden²), ``stage3_prefetch_bucket_size`` (0.9·hidden²) and
  ``stage3_param_persistence_threshold`` (10·hidden);
* the optimizer: without an ``optimizer`` section the Trainer's own (``TrainingArguments.optim``, over its two
  weight-decay groups: trainer.py ``create_optimizer``) is DeepSpeed's *client* optimizer
  (integrations/deepspeed.py ``deepspeed_optim_sched``); accelerate's ``_prepare_deepspeed`` then calls
  ``deepspeed.initialize`` (accelerate/accelerator.py);
* a step is ``accelerator.backward(loss)``, which under DeepSpeed runs ``engine.backward`` and ``engine.step``
  (accelerate/utils/deepspeed.py ``DeepSpeedEngineWrapper.backward``; the engine clips: ``gradient_clipping``);
  the Trainer's clipping then only reads the engine's norm (accelerate/accelerator.py ``clip_grad_norm_``), its
  ``optimizer.step()`` is a no-op (``DeepSpeedOptimizerWrapper.step``) and ``model.zero_grad()`` is the engine's
  (``.grad`` set to None: deepspeed/runtime/engine.py ``zero_grad``).

Changes a CPU run needs (:func:`cpu_deepspeed_state`): ``DS_ACCELERATOR=cpu``, DeepSpeed's communication wrapped
around the gloo group this rank already joined (``deepspeed.init_distributed`` finds it initialised:
deepspeed/comm/comm.py), and accelerate's shared state made up front: without an accelerator ``PartialState``'s
DeepSpeed branch finds no backend and falls back to one process (accelerate/state.py ``_prepare_backend``), so the
referee builds the gloo ``MULTI_CPU`` state (right ranks and world size), marks it ``DEEPSPEED`` and lets the
Trainer reuse it (``accelerator_config={"use_configured_state": True}``, training_args.py ``_setup_devices``);
``TrainingArguments`` refuses ``bf16`` without a bf16 GPU unless ``use_cpu`` (training_args.py:1776-1779), which
would turn DeepSpeed off, so its ``is_torch_bf16_gpu_available`` check is answered yes.
``zero_force_ds_cpu_optimizer`` is set false under ``offload_optimizer`` unless the config says otherwise, as in
:mod:`.ds_stack` (``DeepSpeedCPUAdam``'s C++ extension takes minutes to JIT-build).

The live-storage counter runs from before the model is built and skips ``meta`` storages (ZeRO-1/2 keep a meta copy
of every parameter: runtime/zero/stage_1_and_2.py:485, a size without memory). ``FITPLAN_SNAPSHOT=1`` in the
environment adds ``snapshots``: per step, what was alive at its peak (:func:`snapshot_summary`).
"""

from __future__ import annotations

import copy
import os
import tempfile
import warnings
from typing import Any

from . import _deps

TRAINER_STEPS = 4
"""Optimizer steps run through ``Trainer.train()`` (at least): as :data:`.trainer_fsdp.TRAINER_STEPS`."""


def trainer_ds_config(rc) -> dict[str, Any]:
    """The ds_config handed to ``TrainingArguments``: the user's (``rc.ds_config_raw``, "auto" values left for the
    Trainer to fill) or the one fitplan modelled, with logging off and the CPU optimizer swap off under offload."""
    cfg = copy.deepcopy(rc.ds_config_raw or rc.ds_config)
    cfg.setdefault("steps_per_print", 10**9)
    cfg["wall_clock_breakdown"] = False
    if (cfg.get("zero_optimization") or {}).get("offload_optimizer", {}).get("device") in ("cpu", "nvme"):
        cfg.setdefault("zero_force_ds_cpu_optimizer", False)
    return cfg


def cpu_deepspeed_state() -> None:
    """accelerate's shared state for DeepSpeed on gloo ranks without an accelerator (module doc)."""
    import transformers.training_args as ta
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    PartialState(cpu=True, backend="gloo")  # the process group exists: reused
    PartialState._shared_state["distributed_type"] = DistributedType.DEEPSPEED
    ta.is_torch_bf16_gpu_available = lambda: True  # the bf16 check only (module doc)


def training_arguments(rc, out_dir: str, steps: int):
    """``TrainingArguments`` for the scenario with ``deepspeed=`` :func:`trainer_ds_config`."""
    transformers = _deps.transformers()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.TrainingArguments(
            output_dir=out_dir, deepspeed=trainer_ds_config(rc), report_to=[], optim=rc.optimizer.name,
            bf16=rc.precision.startswith("bf16"), per_device_train_batch_size=rc.batch, max_steps=steps,
            gradient_accumulation_steps=rc.accumulation, gradient_checkpointing=rc.gradient_checkpointing,
            learning_rate=1e-5, weight_decay=0.0, save_strategy="no", logging_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0, seed=rc.seed, accelerator_config={"use_configured_state": True})


def _trainer_class(counter, record: dict[str, Any]):
    """The Trainer with the instruments: phases, each step's peak, the categories after the last step."""
    transformers = _deps.transformers()
    from .trainer_fsdp import begin_step, end_step, host_batches_counted

    class MeasuredTrainer(transformers.Trainer):
        def get_batch_samples(self, epoch_iterator, num_batches, device):
            return host_batches_counted(counter, record, super().get_batch_samples, epoch_iterator, num_batches, device)

        def compute_loss(self, model, inputs, *args, **kwargs):
            _instrument_engine(model, counter, record)
            counter.set_phase("forward")
            before = counter.current
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            from .ds_stack import _gathered_bytes

            record["gathered_params"] = _gathered_bytes(model)  # ZeRO-3: parameter memory, not activations
            record["retained"] = (counter.current - before - loss.numel() * loss.element_size()
                                  - record["gathered_params"])
            counter.set_phase("backward")
            return loss

    class StepCallback(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            begin_step(counter, record)

        def on_step_end(self, args, state, control, **kwargs):
            if counter.peak_snapshot:
                record.setdefault("snapshots", []).append(snapshot_summary(counter.peak_snapshot))
            end_step(counter, record)
            counter.set_phase("between_steps")

    return MeasuredTrainer, StepCallback


def snapshot_summary(snapshot: list[tuple[int, str, str]], top: int = 40) -> list[list[Any]]:
    """What was alive at a step's peak (``FITPLAN_SNAPSHOT=1``), grouped: [total bytes, bytes each, count, creating
    operator, phase it was created in], largest first."""
    groups: dict[tuple[str, str, int], int] = {}
    for nbytes, op, phase in snapshot:
        groups[(op, phase, nbytes)] = groups.get((op, phase, nbytes), 0) + 1
    return sorted(([b * c, b, c, op, ph] for (op, ph, b), c in groups.items()), reverse=True)[:top]


def _instrument_engine(engine, counter, record: dict[str, Any]) -> None:
    """Mark the engine's optimizer step (run inside ``accelerator.backward``) and read the gradients before it."""
    if getattr(engine, "_fitplan_marked", False):
        return
    from .ds_stack import engine_tensors
    from .measure import storage_bytes

    step = engine.step

    def marked_step(*a, **kw):
        record["gradients"] = storage_bytes(t for t in engine_tensors(engine)["gradients"] if t is not None)
        counter.set_phase("optimizer_step")
        out = step(*a, **kw)
        counter.set_phase("end")
        return out

    engine.step = marked_step
    engine._fitplan_marked = True


def measure_trainer_deepspeed(rc, steps: int = 1) -> dict[str, Any]:
    """Build under the live-storage counter and run ``Trainer.train()`` with DeepSpeed on this rank; the peak is the
    highest step's (``peak_step``, 1 = the first), the categories are read after the last step."""
    import torch.distributed as dist

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    deepspeed = _deps.need("deepspeed")
    from .build import build_model
    from .ds_stack import base_optimizer, engine_tensors
    from .measure import LiveBytes, storage_bytes
    from .trainer_fsdp import _Dataset, vocab_size_of_config

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)  # wraps the gloo group (module doc)
    cpu_deepspeed_state()
    n = max(steps + 1, TRAINER_STEPS)
    record: dict[str, Any] = {"steps": []}
    vocab = vocab_size_of_config(rc)
    data = _Dataset(vocab, n * rc.batch * rc.accumulation * dist.get_world_size(), rc.seq, rc.seed)
    counter = LiveBytes(snapshot=bool(os.environ.get("FITPLAN_SNAPSHOT")))
    counter.skip_meta = True  # ZeRO-1/2 keep meta copies of every parameter (stage_1_and_2.py:485): no memory
    with counter, tempfile.TemporaryDirectory(prefix="fitplan-trainer-ds-") as out_dir:
        args = training_arguments(rc, out_dir, n)
        model = build_model(rc.config, precision="32-true", attn_implementation=rc.attn_implementation, method=rc.method,
                            lora=rc.lora, gradient_checkpointing=False, device="cpu", seed=rc.seed)
        trainer_cls, callback_cls = _trainer_class(counter, record)
        trainer = trainer_cls(model=model, args=args, train_dataset=data, callbacks=[callback_cls()])
        trainer.train()
        engine = trainer.model_wrapped
        cats = engine_tensors(engine)
        states = base_optimizer(engine).state.values()
        state_tensors = [v for s in states for v in s.values() if hasattr(v, "untyped_storage")]
        resolved = trainer.accelerator.state.deepspeed_plugin.deepspeed_config
    steps_ = record["steps"]
    peaks = [s["peak"] for s in steps_]
    best = steps_[peaks.index(max(peaks))]
    zero = resolved.get("zero_optimization", {})
    return {
        "parameters": storage_bytes(cats["parameters"]), "master_weights": storage_bytes(cats.get("master_weights", [])),
        "gradients": record.get("gradients", 0), "optimizer_states": storage_bytes(state_tensors),
        "comm_buffers": storage_bytes(cats.get("comm_buffers", [])), "buffers": storage_bytes(engine.module.buffers()),
        "inputs": 2 * rc.batch * rc.seq * 8, "retained": record.get("retained", 0),
        "gathered_params": record.get("gathered_params", 0),
        "peak": best["peak"], "peak_phase": best["peak_phase"], "phase_peaks": best["phase_peaks"],
        "start": best["start"], "step_peaks": peaks, "peak_step": peaks.index(best["peak"]) + 1, "step_seconds": 0.0,
        "wrapper": type(engine.optimizer).__name__, "driver": "trainer", "host_batch_bytes": record.get("host_batches", 0),
        "optimizer_class": type(base_optimizer(engine)).__name__,
        "resolved_ds_config": {k: zero.get(k) for k in ("reduce_bucket_size", "stage3_prefetch_bucket_size",
                                                        "stage3_param_persistence_threshold") if k in zero},
        "gradient_clipping": resolved.get("gradient_clipping"), "snapshots": record.get("snapshots", []),
    }
