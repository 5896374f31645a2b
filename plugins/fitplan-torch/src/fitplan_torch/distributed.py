"""Sharded runs, measured per rank.

* DeepSpeed (:mod:`.ds_stack`) and accelerate's FSDP1 / FSDP2 (:mod:`.accel_fsdp`): the engine's own code on
  real gloo ranks.
* ZeRO-1 (``--zero 1``): ``DistributedDataParallel`` + ``torch.distributed.optim.ZeroRedundancyOptimizer``
  (each rank keeps the optimizer states of its share of the parameters; DDP keeps its gradient buckets).
* ZeRO-3 / FSDP ``full_shard`` / ``hybrid_shard`` (one node): FSDP2 ``fully_shard`` on every decoder
  layer and on the root, ``reshard_after_forward=True``.
* ZeRO-2 / FSDP ``shard_grad_op``: FSDP2 with ``reshard_after_forward=False`` (parameters stay gathered
  from forward to backward; at rest and in the optimizer step they are sharded, unlike DeepSpeed ZeRO-2
  whose 16-bit parameters are never sharded).

Ranks are either real (two gloo processes on the CPU, ``torch.multiprocessing`` spawn, a ``file://``
rendezvous in a temporary directory: nothing listens on the network) or simulated: one process, rank 0
of a ``fake`` process group whose collectives do nothing, which gives rank 0's memory for any world size,
also under FakeTensorMode and on a single GPU.

A live-storage counter runs from before the model is built, so DDP buckets and FSDP's all-gather buffers
are seen too.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

import attrs
from fitplan.api import FitplanError

from . import _deps
from .estimation_bridge import OptimizerRef, RunConfig

ACCELERATE_FSDP = ("fsdp1", "fsdp2")
"""Stacks run through accelerate's FSDP plugin (:mod:`.accel_fsdp`) on real gloo ranks."""


def strategy(rc: RunConfig) -> str:
    """``deepspeed_zero{N}`` (DeepSpeed, :mod:`.ds_stack`), ``accelerate_fsdp{1,2}_{mode}`` (:mod:`.accel_fsdp`),
    else ``zero1``, ``fsdp_zero2`` or ``fsdp_zero3``."""
    if rc.stack == "deepspeed":
        return f"deepspeed_zero{rc.zero_stage}"
    if rc.stack in ACCELERATE_FSDP:
        return f"accelerate_{rc.stack}_{rc.fsdp}"
    stage = max(rc.zero_stage, {"full_shard": 3, "hybrid_shard": 3, "shard_grad_op": 2}.get(rc.fsdp or "", 0))
    return {1: "zero1", 2: "fsdp_zero2", 3: "fsdp_zero3"}.get(stage, "ddp")


def _decoder_layers(model) -> list[Any]:
    """The repeated blocks (the largest ModuleList of the model)."""
    torch = _deps.torch()
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        return []
    return list(max(lists, key=len))


def _noop_allreduce(state, bucket):
    """DDP comm hook for the fake process group: the bucket as if all-reduced in place (the default
    hook's memory, without a collective that returns nothing)."""
    torch = _deps.torch()
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


class _EmulatedDDP:
    """What DDP adds to memory, for FakeTensorMode (DDP's reducer needs real storage): its gradient
    buckets, one flat buffer per gradient dtype (``gradient_as_bucket_view=False``, DDP's default, keeps
    the buckets apart from ``.grad``). Gradients are not communicated."""

    def __init__(self, model) -> None:
        torch = _deps.torch()
        sizes: dict[Any, int] = {}
        for p in model.parameters():
            if p.requires_grad:
                sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
        self.buckets = [torch.empty(n, dtype=dt, device=next(model.parameters()).device) for dt, n in sizes.items()]


def shard_model(model, optimizer_ref: OptimizerRef, rc: RunConfig, device: str, mesh=None, fake_pg: bool = False,
                fake_tensors: bool = False):
    """Wrap ``model`` per :func:`strategy`; return (model, optimizer, keep-alive extras). ``mesh``: FSDP2's
    device mesh, created before FakeTensorMode is entered (a mesh cannot be built from fake tensors)."""
    torch = _deps.torch()
    from .build import build_optimizer, import_dotted

    kind = strategy(rc)
    if kind in ("zero1", "ddp") and fake_tensors:
        extras = _EmulatedDDP(model).buckets
        params = [p for p in model.parameters() if p.requires_grad]
        if kind == "ddp":
            return model, build_optimizer(optimizer_ref, params, device=device, model=model), extras
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls = import_dotted(optimizer_ref.torch_class)
        return model, ZeroRedundancyOptimizer(params, optimizer_class=cls, lr=1e-5, **dict(optimizer_ref.torch_kwargs)), extras
    if kind in ("zero1", "ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=None if device == "cpu" else [torch.cuda.current_device()])
        if fake_pg:
            ddp.register_comm_hook(None, _noop_allreduce)
        params = [p for p in ddp.parameters() if p.requires_grad]
        if kind == "ddp":
            return ddp, build_optimizer(optimizer_ref, params, device=device, model=model), []
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls = import_dotted(optimizer_ref.torch_class)
        opt = ZeroRedundancyOptimizer(params, optimizer_class=cls, lr=1e-5, **dict(optimizer_ref.torch_kwargs))
        return ddp, opt, []
    from torch.distributed.fsdp import fully_shard

    reshard = kind == "fsdp_zero3"
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, build_optimizer(optimizer_ref, params, device=device, model=model), []


def _rank_body(rc: RunConfig, steps: int, fake_tensors: bool, fake_pg: bool = False) -> dict[str, Any]:
    """Build, shard and measure on this rank (the process group is initialised)."""
    torch = _deps.torch()
    import torch.distributed as dist

    from .build import build_model, make_batch, vocab_size_of
    from .measure import LiveBytes
    from .single import fake_mode
    from .step import measure_step

    rank = dist.get_rank()
    device = rc.device
    if rc.stack == "deepspeed":
        from .ds_stack import measure_deepspeed
        from .trainer_ds import measure_trainer_deepspeed

        out = (measure_trainer_deepspeed if rc.driver == "trainer" else measure_deepspeed)(rc, steps)
        out.update(rank=rank, strategy=strategy(rc))
        return out
    if rc.stack in ACCELERATE_FSDP:
        from .accel_fsdp import measure_accelerate_fsdp
        from .trainer_fsdp import measure_trainer_fsdp

        out = (measure_trainer_fsdp if rc.driver == "trainer" else measure_accelerate_fsdp)(rc, steps)
        out.update(rank=rank, strategy=strategy(rc))
        return out
    if device == "cuda":
        torch.cuda.set_device(torch.cuda.current_device())
    mesh = None
    if strategy(rc).startswith("fsdp"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device, (dist.get_world_size(),))
    counter = LiveBytes()
    with fake_mode() if fake_tensors else contextlib.nullcontext() as fake, counter:
        model = build_model(rc.config, precision=rc.precision, attn_implementation=rc.attn_implementation, method=rc.method,
                            lora=rc.lora, gradient_checkpointing=rc.gradient_checkpointing, device=device, fake=fake_tensors,
                            seed=rc.seed)
        model, optimizer, extras = shard_model(model, rc.optimizer, rc, device, mesh=mesh, fake_pg=fake_pg,
                                               fake_tensors=fake_tensors)
        batch = make_batch(vocab_size_of(getattr(model, "module", model)), rc.batch, rc.seq, device=device, seed=rc.seed + rank)
        if fake is not None:
            batch = {k: fake.from_tensor(v) for k, v in batch.items()}
        m = measure_step(model, optimizer, batch, precision=rc.precision, device_type=device, steps=steps,
                         memtracker=False, counter=counter, barrier=None if fake_tensors else dist.barrier,
                         accumulation=rc.accumulation)
    del extras
    out = m.asdict()
    out["rank"] = rank
    out["strategy"] = strategy(rc)
    if device == "cuda":
        from .calibrate import measure_cuda_overhead

        out["cuda_calibration"] = measure_cuda_overhead(m)
    return out


def _worker(rank: int, world: int, init_file: str, out_dir: str, rc_dict: dict[str, Any], steps: int) -> None:
    """A spawned gloo rank: writes ``rank{r}.json`` (or ``rank{r}.error``) into ``out_dir``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rc = _rc_from_dict(rc_dict)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from . import gloo_settle

    gloo_settle.settle_collectives()  # a collective's buffers go when the caller drops them (see the module)
    try:
        result = _rank_body(rc, steps, fake_tensors=False)
        partial = os.path.join(out_dir, f"rank{rank}.json.part")
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(result, f)
        os.replace(partial, os.path.join(out_dir, f"rank{rank}.json"))  # complete or absent
        import gc

        gc.collect()  # DDP's reducer and its gloo work objects go before the group does
        dist.barrier()  # no rank tears gloo down while the other still talks to it
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        with open(os.path.join(out_dir, f"rank{rank}.error"), "w", encoding="utf-8") as f:
            f.write(f"{type(e).__name__}: {e}")
        raise
    finally:
        dist.destroy_process_group()


def _rc_to_dict(rc: RunConfig) -> dict[str, Any]:
    return attrs.asdict(rc, recurse=True)


def _rc_from_dict(d: dict[str, Any]) -> RunConfig:
    d = dict(d)
    d["optimizer"] = OptimizerRef(**d["optimizer"])
    return RunConfig(**d)


def run_real_ranks(rc: RunConfig, *, steps: int, world: int) -> list[dict[str, Any]]:
    """``world`` gloo processes on this machine; every rank's measurement, by rank."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="fitplan-gloo-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        results = [os.path.join(tmp, f"rank{r}.json") for r in range(world)]
        try:
            mp.spawn(_worker, args=(world, init_file, tmp, _rc_to_dict(rc), steps), nprocs=world, join=True)
        except Exception as e:  # noqa: BLE001 - a rank's own error is more useful than spawn's
            errors = [open(os.path.join(tmp, f), encoding="utf-8").read() for f in sorted(os.listdir(tmp)) if f.endswith(".error")]
            if errors or not all(os.path.exists(p) for p in results):
                raise FitplanError(f"a gloo rank failed: {errors[0] if errors else e}", field="validate",
                                   suggestion="run the scenario with --mode fake (one process, fake process group)") from None
            # every rank measured and wrote its result; a crash while gloo tears down does not change them
        return [json.load(open(p, encoding="utf-8")) for p in results]


@contextlib.contextmanager
def fake_process_group(world: int):
    """Rank 0 of a ``world``-rank fake process group in this process (collectives do nothing)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise FitplanError("a torch.distributed process group is already initialised in this process", field="validate")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_sharded(rc: RunConfig, *, steps: int, real_ranks: int) -> dict[str, Any]:
    """Per-rank measurement of a sharded scenario; rank 0's is the ``measurement``."""
    world = rc.world_size
    if rc.stack == "deepspeed":  # every rank loads DeepSpeed's shm op behind torch's build lock
        from .ext_lock import check_extension_lock

        check_extension_lock()
    if real_ranks > 1:
        ranks = run_real_ranks(rc, steps=steps, world=world)
        device, how = "cpu", f"{world} gloo ranks"
    else:
        with fake_process_group(world):
            ranks = [_rank_body(rc, steps, fake_tensors=rc.fake, fake_pg=True)]
        device = "cpu (FakeTensorMode)" if rc.fake else ("cuda" if rc.device == "cuda" else "cpu")
        how = f"rank 0 of a {world}-rank fake process group"
    keys = ("rank", "parameters", "master_weights", "gradients", "optimizer_states", "retained", "peak", "peak_phase",
            "peak_step", "step_peaks")
    summary = [{k: r[k] for k in keys if k in r} for r in ranks]
    out: dict[str, Any] = {
        "measurement": ranks[0], "device": f"{device}, {how}", "world_size": world, "rank": 0, "ranks": summary,
        "notes": [f"sharding: {strategy(rc)} ({how})"],
    }
    if rc.fake and strategy(rc) in ("zero1", "ddp"):
        out["notes"].append("DDP cannot run on fake tensors: its gradient buckets are emulated (one flat buffer per dtype)")
    if "cuda_calibration" in ranks[0]:
        out["cuda_calibration"] = ranks[0]["cuda_calibration"]
    return out
