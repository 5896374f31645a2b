"""One optimizer step's compute on one GPU: the roofline over the step trace, the optimizer update, the
per-step work of the training loop.

``compute = k × micro-step + gradient accumulation + gradient clipping + optimizer update`` (k micro-steps
of ``b × s`` tokens per optimizer step, per GPU):

* **micro-step**: the roofline (:mod:`fitplan.builtin.time.roofline`) over the step trace's kernels
  (``StepTrace.work``: forward, backward, and the second forward of checkpointed layers), at the
  efficiency factors fitted for the GPU's generation (``[[time_efficiency]]``); ``max(GPU, host)``;
* **gradient accumulation**: after the first micro-step, autograd's ``AccumulateGrad`` adds each new
  gradient into ``.grad`` in place: the gradient read twice and written once (``3 × gradient bytes``);
* **FSDP2's copy-out**: after each all-gather, FSDP2 copies the flat gathered buffer into every parameter's own
  unsharded tensor on the compute stream (``fsdp_copy_out_bytes``); FSDP1 gathers into its flat buffer in place,
  but its backward concatenates each unit's parameter gradients into the flat gradient (``fsdp_grad_cat_bytes``);
* **gradient clipping**: the HF Trainer clips at ``max_grad_norm = 1.0`` by default
  (``torch.nn.utils.clip_grad_norm_``, foreach): one pass reads every gradient for the norm, a second
  scales them in place (``3 × gradient bytes``);
* **optimizer update**: what the optimizer reads and writes (``OptimizerSpec.update_bytes``: foreach AdamW
  makes seven passes over its states) on what this rank's optimizer steps (``rank_optimizer_update``: its
  ZeRO partition or FSDP shard, as the stack lays it out), at the memory efficiency; with fp32 master weights, the 16-bit gradients are upcast and the updated weights copied back
  down (``(2 + 4) + (4 + 2)`` bytes per element).

``--mfu`` or a measured ``[[mfu_calibration]]`` replaces all of it by ``FLOPs / (peak × MFU)``.
"""

from __future__ import annotations

from fitplan.builtin.time import roofline
from fitplan.engine.declarations import quantity

CLIP_PASSES = 3
"""``clip_grad_norm_``: the norm reads every gradient once, the scaling reads and writes them."""
ACCUMULATE_PASSES = 3
"""``AccumulateGrad`` into an existing ``.grad``: reads both gradients, writes one."""
MASTER_COPY_BYTES = (2 + 4) + (4 + 2)
"""Per element with fp32 master weights: the 16-bit gradient upcast (read 2, write 4) and the updated fp32
weight copied into the 16-bit one (read 4, write 2)."""

CPU_OPTIMIZER_GBPS = 50.0
"""Bytes per second (GB/s) the CPU update of ``--offload-optimizer`` streams through host memory (DeepSpeed's
vectorised CPU Adam). An assumption, not a measurement: a fraction of a two-socket server's 200-400 GB/s of DRAM
bandwidth, which the update shares with data loading. ZeRO-Offload runs it between two steps (its one-step delayed
update is off by default), so it is not hidden behind the GPU's work."""

_CACHE: dict[tuple, tuple] = {}
"""Priced micro-steps by (trace, GPU, efficiency, switches); each value keeps its trace alive so its id
stays unique (a graph evaluation then costs a dict lookup, as the trace itself does)."""


def _efficiency(gpu_spec, rulesets):
    model = rulesets.time_model
    effs = rulesets.time_efficiencies
    if model is None or not effs:
        return None
    e = effs.get(gpu_spec.generation)
    if e is not None:
        return roofline.Efficiency(e.gemm, e.attention, e.memory, model.host_seconds_per_kernel,
                                   model.host_seconds_per_zero3_fetch,
                                   f"fitted on {e.runs} published run(s) on {e.generation} GPUs")
    total = sum(max(x.runs, 1) for x in effs.values())
    mean = {k: sum(getattr(x, k) * max(x.runs, 1) for x in effs.values()) / total for k in ("gemm", "attention", "memory")}
    gen = gpu_spec.generation or "unknown"
    return roofline.Efficiency(mean["gemm"], mean["attention"], mean["memory"], model.host_seconds_per_kernel,
                               model.host_seconds_per_zero3_fetch, f"no published run on {gen} GPUs: the run-weighted mean of the fitted generations "
                               f"({', '.join(sorted(effs))})")


@quantity("factors", type="object")
def kernel_efficiency(gpu_spec, rulesets):
    """The achievable fractions of the GPU's peaks (GEMM FLOP/s, attention FLOP/s, memory bandwidth) and the
    host's time per kernel launch: ``[[time_efficiency]]`` for the GPU's ``generation`` (fitted on published
    fine-tuning runs by ``bench/time_loo.py``), else the run-weighted mean of the fitted generations. None
    without a GPU or without fitted rows."""
    if gpu_spec is None:
        return None
    return rulesets.memo(("time_efficiency", gpu_spec.id), lambda: _efficiency(gpu_spec, rulesets))


@quantity("s", type="object")
def micro_step_time(step_trace, arch, gpu_spec, kernel_efficiency, torch_compile, tf32, tensor_parallel, flops_per_token,
                    per_device_train_batch_size, realized_seq_length, matmul_dtype, zero3_fetches_per_pass):
    """One micro-step (forward, backward, recomputation) on one GPU, by kernel class and phase, in seconds:
    the roofline over the step trace's kernels (``torch.compile``: fused elementwise runs; tensor
    parallelism: every kernel's work / t), ``gpu``, ``host`` (kernel launches, ZeRO-3's fetches) and
    ``micro_step`` (each phase the slower of its GPU and host times). A ``--params`` model is timed from its
    count (its typical shape, if any, serves memory only): its FLOPs at the GEMM efficiency. None without a GPU."""
    if gpu_spec is None or kernel_efficiency is None:
        return None
    eff = kernel_efficiency
    if step_trace is None or arch.count_only:
        peak = roofline.peak_flops(gpu_spec.peak_tflops, matmul_dtype)
        s = flops_per_token * per_device_train_batch_size * realized_seq_length / tensor_parallel / (peak * eff.gemm)
        return {"gemm": s, "gpu": s, "host": 0.0, "micro_step": s}
    key = (id(step_trace), gpu_spec.id, eff, bool(torch_compile), bool(tf32), tensor_parallel, zero3_fetches_per_pass)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        ts = roofline.terms(step_trace.work, gpu_spec.peak_tflops, gpu_spec.bandwidth_gbps, compiled=bool(torch_compile),
                            tf32=bool(tf32), split=tensor_parallel)
        hit = _CACHE[key] = (step_trace, roofline.price(ts, eff, zero3_fetches_per_pass))
    return hit[1]


@quantity("fetches")
def zero3_fetches_per_pass(zero_stage, arch):
    """DeepSpeed ZeRO-3 gathers every module's partitioned parameters in a hook before its forward, again before
    its backward, and before its recomputed forward with checkpointing (``stage3.py``: ``pre_sub_module_forward``
    / ``pre_sub_module_backward``; ``partitioned_param_coordinator.fetch_sub_module``): one fetch per parameter
    tensor per pass, even on one GPU. 0 for other stages and for FSDP (one gather per wrapped layer)."""
    if zero_stage != 3 or arch.is_bare:
        return 0
    return sum(g.count for g in arch.param_groups())


@quantity("bytes")
def optimizer_step_bytes(optimizer_spec, rank_optimizer_update, master_weight_dtype_bytes, offload_optimizer):
    """Bytes the optimizer update reads and writes on one GPU: the optimizer's own count
    (``OptimizerSpec.update_bytes``: foreach AdamW, seven passes over its states) over what this rank's optimizer
    steps (``rank_optimizer_update``, builtin/sharding/update.py: DeepSpeed's flat fp32 partitions, FSDP's and
    PyTorch ZeRO's shards, ÷ tensor parallelism), plus, with fp32 master weights, the gradient upcast and the
    copy back to 16-bit (12 B per element). With ``--offload-optimizer`` the same bytes move through the CPU's
    memory instead (``optimizer_step_seconds``)."""
    u = rank_optimizer_update
    nbytes = sum(optimizer_spec.update_bytes(c) for c in u.calls)
    if master_weight_dtype_bytes:
        nbytes += u.numel * MASTER_COPY_BYTES
    return nbytes / u.split


@quantity("kernels")
def optimizer_step_kernels(optimizer_spec, rank_optimizer_update, offload_optimizer):
    """Kernels the optimizer update launches, summed over its ``optimizer.step()`` calls
    (``OptimizerSpec.update_kernels``: a few per foreach op and chunk, seven per tensor for single-tensor AdamW):
    DeepSpeed steps one flat partition per group, so few large launches; the other stacks step every tensor."""
    if offload_optimizer:
        return 0.0
    return float(sum(optimizer_spec.update_kernels(c) for c in rank_optimizer_update.calls))


@quantity("s")
def optimizer_step_seconds(optimizer_step_bytes, optimizer_step_kernels, offload_optimizer, gpu_spec,
                           kernel_efficiency):
    """The optimizer update on one GPU: its bytes at the memory efficiency, overlapped with its kernel launches
    on the host (``roofline.overlap``); with ``--offload-optimizer``, its bytes through the CPU's memory at
    ``CPU_OPTIMIZER_GBPS`` (an assumption). None without a GPU."""
    if gpu_spec is None or kernel_efficiency is None:
        return None
    if offload_optimizer:
        return optimizer_step_bytes / (CPU_OPTIMIZER_GBPS * 1e9)
    gpu = roofline.memory_seconds(optimizer_step_bytes, gpu_spec.bandwidth_gbps, kernel_efficiency)
    return roofline.overlap(gpu, optimizer_step_kernels * kernel_efficiency.host_seconds_per_kernel)


@quantity("bytes")
def gradient_accumulation_bytes(gradient_accumulation_steps, gradient_bytes):
    """Accumulating gradients over micro-steps: ``(k − 1) × 3 × gradient bytes`` (``AccumulateGrad`` adds in place
    into ``.grad`` after the first micro-step: both read, one written)."""
    return (gradient_accumulation_steps - 1) * ACCUMULATE_PASSES * gradient_bytes


@quantity("bytes")
def grad_clip_bytes(gradient_bytes):
    """Gradient clipping once per step (the HF Trainer's default ``max_grad_norm = 1.0``, foreach
    ``clip_grad_norm_``): the norm reads every gradient, the scaling reads and writes them: ``3 × gradient bytes``."""
    return CLIP_PASSES * gradient_bytes


FSDP2_KINDS = ("hf_fsdp2", "fsdp_zero2", "fsdp_zero3")
"""Sharding kinds that run PyTorch's FSDP2 (``fully_shard``): the HF Trainer's ``fsdp_version: 2`` and the
torch-native stack's ZeRO-2/3 layouts (builtin/sharding/common.py)."""
COPY_OUT_PASSES = 2
"""FSDP2's copy-out reads the gathered buffer and writes each parameter's unsharded tensor: 2 × gathered bytes."""


@quantity("bytes")
def fsdp_copy_out_bytes(comm_volumes, sharding_kind):
    """FSDP2's all-gather copy-out per optimizer step: after every all-gather the compute stream waits for it and
    ``foreach_all_gather_copy_out`` (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, called
    from ``FSDPParamGroup.wait_for_unshard`` on the current stream) runs ``split_with_sizes_copy`` from the flat
    all-gather output into every parameter's unsharded tensor: the whole gathered tensor read and written once
    (``COPY_OUT_PASSES``), for every gather ``comm_volumes`` counts (``all_gather``: k × passes × P). Serial with
    the compute, memory-bound. FSDP1 all-gathers straight into its padded flat parameter, whose views the
    parameters are (no copy); 0 for every other stack."""
    if sharding_kind not in FSDP2_KINDS or not comm_volumes:
        return 0.0
    return COPY_OUT_PASSES * comm_volumes["all_gather"]


@quantity("bytes")
def fsdp_grad_cat_bytes(sharding_kind, trainable_param_count, fsdp_rank, tensor_parallel, gradient_accumulation_steps):
    """FSDP1's gradient concatenation per optimizer step: FSDP1 runs the forward on views of the unsharded flat
    parameter (``FlatParamHandle._use_unsharded_views``: ``torch.split`` then ``.view``, torch 2.13
    torch/distributed/fsdp/_flat_param.py; the same in torch 1.13), so autograd builds the flat gradient through
    ``SplitWithSizesBackward``, an ``aten::cat`` of the parameters' gradients (read once, written once:
    ``COPY_OUT_PASSES``) in every micro-step's backward, on the compute stream, at the gathered dtype. Trainable
    flat parameters only: a frozen one does not require grad (peft's FSDP wrap policy puts adapters in units of
    their own). 0 for every other stack."""
    if sharding_kind != "hf_fsdp1" or fsdp_rank is None:
        return 0.0
    grads = trainable_param_count * fsdp_rank["gather_b"] / tensor_parallel
    return gradient_accumulation_steps * COPY_OUT_PASSES * grads


@quantity("s")
def gradient_accumulation_seconds(gradient_accumulation_bytes, gpu_spec, kernel_efficiency):
    """Gradient accumulation's bytes at the memory efficiency. None without a GPU."""
    if gpu_spec is None or kernel_efficiency is None:
        return None
    return roofline.memory_seconds(gradient_accumulation_bytes, gpu_spec.bandwidth_gbps, kernel_efficiency)


@quantity("s")
def grad_clip_seconds(grad_clip_bytes, gpu_spec, kernel_efficiency):
    """Gradient clipping's bytes at the memory efficiency. None without a GPU."""
    if gpu_spec is None or kernel_efficiency is None:
        return None
    return roofline.memory_seconds(grad_clip_bytes, gpu_spec.bandwidth_gbps, kernel_efficiency)


@quantity("s", json_key="time.compute_seconds_per_step")
def compute_seconds_per_step(micro_step_time, gradient_accumulation_steps, gradient_accumulation_bytes, grad_clip_bytes,
                             fsdp_copy_out_bytes, fsdp_grad_cat_bytes, optimizer_step_seconds, gpu_spec,
                             kernel_efficiency, flops_per_token, per_device_train_batch_size, max_seq_length,
                             tensor_parallel, matmul_dtype, assumed_mfu):
    """Compute time of one optimizer step on one GPU: ``k × micro-step + accumulation + clipping + FSDP's copies
    + optimizer update`` (the module doc: the accumulation's, clipping's and FSDP's copies' bytes at the memory
    efficiency, as ``gradient_accumulation_seconds`` and ``grad_clip_seconds``); with ``--mfu`` or a measured MFU,
    ``FLOPs per token × b·s·k / t / (peak × MFU)``. None without a GPU."""
    if gpu_spec is None:
        return None
    if assumed_mfu:
        peak = roofline.peak_flops(gpu_spec.peak_tflops, matmul_dtype)
        tokens = per_device_train_batch_size * max_seq_length * gradient_accumulation_steps
        return flops_per_token * tokens / tensor_parallel / (peak * assumed_mfu) if peak else None
    if micro_step_time is None:
        return None
    fsdp = fsdp_copy_out_bytes + fsdp_grad_cat_bytes
    passes = roofline.memory_seconds(gradient_accumulation_bytes + grad_clip_bytes + fsdp, gpu_spec.bandwidth_gbps,
                                     kernel_efficiency)
    return gradient_accumulation_steps * micro_step_time["micro_step"] + passes + optimizer_step_seconds


QUANTITIES = (kernel_efficiency, zero3_fetches_per_pass, micro_step_time, optimizer_step_bytes, optimizer_step_kernels,
              optimizer_step_seconds, gradient_accumulation_bytes, grad_clip_bytes, fsdp_copy_out_bytes,
              fsdp_grad_cat_bytes, gradient_accumulation_seconds, grad_clip_seconds, compute_seconds_per_step)
