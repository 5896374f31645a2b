"""One process, one device: build the scenario's model and measure a step (real or under FakeTensorMode)."""

from __future__ import annotations

import contextlib
from typing import Any

from . import _deps
from .build import build_model, build_optimizer, make_batch, real_path_under_fake, vocab_size_of
from .estimation_bridge import RunConfig
from .step import measure_step


@contextlib.contextmanager
def fake_mode():
    """FakeTensorMode with transformers on its real (non-tracing) path."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, real_path_under_fake():
        yield mode


def build_all(rc: RunConfig, fake=None):
    model = build_model(rc.config, precision=rc.precision, attn_implementation=rc.attn_implementation, method=rc.method,
                        lora=rc.lora, gradient_checkpointing=rc.gradient_checkpointing, device=rc.device, fake=rc.fake,
                        seed=rc.seed)
    if rc.activation_offloading == "trl_sync":
        from .offload import SyncOffload

        model._fitplan_offload = SyncOffload(model)  # kept with the model (its hooks refer to it)
    # named, so optimizers that treat embeddings and the LM head differently (Muon, GaLore, Adam-mini) can tell
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if rc.optimizer_in_bwd:
        from .in_backward import InBackwardOptimizer

        optimizer = InBackwardOptimizer(named, lambda one: build_optimizer(rc.optimizer, one, device=rc.device,
                                                                           model=model))
    else:
        optimizer = build_optimizer(rc.optimizer, named, device=rc.device, model=model)
    batch = make_batch(vocab_size_of(model), rc.batch, rc.seq, device=rc.device, seed=rc.seed)
    if fake is not None:
        batch = {k: fake.from_tensor(v) for k, v in batch.items()}
    return model, optimizer, batch


def device_name(rc: RunConfig) -> str:
    torch = _deps.torch()
    if rc.device == "cuda":
        return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})"
    return "cpu (FakeTensorMode)" if rc.fake else "cpu"


def run_single(rc: RunConfig, *, steps: int = 1) -> dict[str, Any]:
    torch = _deps.torch()
    notes: list[str] = []
    with fake_mode() if rc.fake else contextlib.nullcontext() as fake:
        model, optimizer, batch = build_all(rc, fake)
        m = measure_step(model, optimizer, batch, precision=rc.precision, device_type=rc.device, steps=steps,
                         memtracker=rc.memtracker and not rc.fake, accumulation=rc.accumulation,
                         loss_implementation=rc.loss_implementation)
    out: dict[str, Any] = {"measurement": m.asdict(), "device": device_name(rc), "notes": notes}
    if rc.device == "cuda":
        from .calibrate import measure_cuda_overhead

        out["cuda_calibration"] = measure_cuda_overhead(m)
    del model, optimizer, batch
    if rc.device == "cuda":
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    return out
