"""Gloo ranks: a buffer a collective's worker thread lets go of is freed when the collective returns.

``ProcessGroupGloo`` runs each collective on a worker thread, which completes the work's future (releasing the
caller's ``wait()``) and only then drops its own reference to the work (``ProcessGroupGloo::runLoop``,
torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, torch 2.13). When that reference is the last one to a
storage (a temporary the work allocated, or a buffer the caller has already dropped), the storage's Python
object is deallocated on the worker thread, which needs the GIL: a busy main thread holds it for up to the
5 ms switch interval, so the free lands some ops later, sometimes in the next phase. Measured on tiny Llama
with accelerate's FSDP1 and checkpointing (bf16-mixed, 2 ranks): frees of 100,608 and 256,128 bytes (a unit's
unsharded flat size) ran on worker threads, and 5 of 36 rank runs had their peak raised by 21,824 to 195,452
bytes (up to 8 %), in the optimizer step or the backward, by one that came late.

:func:`settle_collectives` makes every blocking collective of ``torch.distributed`` yield the GIL for
:data:`SETTLE_S` after it returns, so the worker's pending free runs then, where the program let go of the
buffer. With it, 0 of 64 rank runs were raised (worker-thread frees still happen, at the collective).
Asynchronous calls (``async_op=True``) are left as they are; none of the stacks measured here issues one on
the CPU.
"""

from __future__ import annotations

import functools
import time
from typing import Any

COLLECTIVES = ("broadcast", "all_reduce", "all_reduce_coalesced", "reduce", "all_gather", "all_gather_single",
               "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced", "gather", "scatter",
               "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base",
               "all_to_all_single", "all_to_all")
"""Every collective of ``torch.distributed.distributed_c10d`` that takes ``async_op`` (torch 2.13: FSDP1 on the
CPU calls ``all_gather`` and ``reduce_scatter_single``, DeepSpeed's torch backend the ``*_tensor`` names)."""
SETTLE_S = 0.005
"""The GIL switch interval (``sys.getswitchinterval()``): the longest a waiting thread waits for it."""


def settle_collectives() -> None:
    """Install the wrappers (in a spawned rank, after ``init_process_group``; idempotent)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COLLECTIVES:
        for module in (dist, c10d):
            fn = getattr(module, name, None)
            if fn is not None and not getattr(fn, "_fitplan_settled", False):
                setattr(module, name, _settled(fn))


def _settled(fn):
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any):
        out = fn(*args, **kwargs)
        if not kwargs.get("async_op"):
            time.sleep(SETTLE_S)  # the GIL to the worker thread, whose last reference may free a buffer
        return out

    call._fitplan_settled = True  # type: ignore[attr-defined]
    return call


def reduce_scatter_like_nccl() -> None:
    """Make gloo's ``reduce_scatter_single`` allocate what NCCL's does: nothing beyond the caller's buffers.

    gloo has no reduce-scatter of its own: ``ProcessGroupGloo::reduce_scatter_tensor_coalesced`` (which
    ``_reduce_scatter_base`` calls; torch/csrc/distributed/c10d/ProcessGroupGloo.cpp) clones the whole input,
    all-reduces the clone and copies this rank's chunk out, so the clone (the size of the unsharded gradients of a
    unit) is alive until the collective returns. ``ProcessGroupNCCL::_reduce_scatter_base`` hands the input and
    output pointers to ``ncclReduceScatter`` (``reduceScatterSingleImpl``, ProcessGroupNCCL.cpp): no copy. FSDP2
    (``DefaultReduceScatter``, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) calls
    ``dist.reduce_scatter_single`` with a ``reduce_scatter_input`` it allocated itself and never reads again, so
    the stand-in all-reduces that buffer in place and copies this rank's chunk into the output: the same result,
    NCCL's memory. Blocking calls on gloo only; anything else goes to torch's function."""
    import torch.distributed as dist

    orig = dist.reduce_scatter_single
    if getattr(orig, "_fitplan_in_place", False):
        return

    @functools.wraps(orig)
    def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if async_op or dist.get_backend(group) != "gloo":
            return orig(output, input, op=op, group=group, async_op=async_op)
        dist.all_reduce(input, op=op, group=group)
        output.copy_(input.view(-1).chunk(dist.get_world_size(group))[dist.get_rank(group)].view_as(output))
        return None

    reduce_scatter_single._fitplan_in_place = True  # type: ignore[attr-defined]
    dist.reduce_scatter_single = reduce_scatter_single
