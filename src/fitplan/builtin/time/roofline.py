"""The roofline: what one micro-step's kernels cost on a GPU (pure functions, no quantities).

Each kernel of the step trace's work records (:class:`fitplan.trace.op_work.OpWork`) takes

    ``max(FLOPs / (peak FLOP/s at its dtype × e_kind), bytes / (HBM bandwidth × e_memory))``

seconds on the GPU, where ``e_kind`` is the achievable fraction of the peak for its class (``gemm``,
``attention``) and ``e_memory`` the achievable fraction of the memory bandwidth (every other class is
memory-bound). The efficiency factors are fitted per GPU generation from published fine-tuning runs
(``[[time_efficiency]]``, ``bench/time_loo.py``). A small GEMM (a LoRA adapter, a micro-batch of a few
hundred tokens) thus becomes bandwidth-bound by itself.

The host launches every kernel: eager PyTorch spends ``host_seconds_per_kernel`` of CPU time per op
(Python, the dispatcher, autograd's bookkeeping, ``cudaLaunchKernel``), ``torch.compile`` once per fused
kernel. The GPU runs asynchronously, so the host's time and the GPU's overlap (:func:`overlap`): a step of
many tiny kernels is host-bound ("overhead-bound", He 2022, "Making Deep Learning Go Brrrr From First
Principles").
"""

from __future__ import annotations

from attrs import frozen

from fitplan.trace.op_work import OpWork

_GEMM_KINDS = ("gemm", "attention")
PEAK_FALLBACK = {"bf16": ("bf16", "fp32"), "fp16": ("fp16", "bf16", "fp32"), "fp32": ("fp32",), "tf32": ("tf32", "fp32")}
"""The hardware ruleset's ``peak_tflops`` keys for a dtype, in order: a GPU without tensor cores for a dtype
runs it at the next rate (bf16 on a T4/V100 at the fp32 rate, tf32 at fp32, fp16 at bf16)."""
_HARDWARE_NAME = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "fp32": "fp32", "fp16": "fp16", "tf32": "tf32"}


@frozen
class Efficiency:
    """Achievable fractions of the peaks, for one GPU generation, and the host's time per kernel launch."""

    gemm: float
    attention: float
    memory: float
    host_seconds_per_kernel: float
    host_seconds_per_fetch: float = 0.0
    """Host time of one DeepSpeed ZeRO-3 parameter fetch (a module hook's gather, bookkeeping and wait)."""
    rule: str = ""


@frozen
class Term:
    """A record priced at the peaks: ``flop_seconds`` at 100 % of the FLOP peak, ``byte_seconds`` at 100 % of
    the bandwidth, ``kernels`` launched (all × the record's count)."""

    kind: str
    phase: str
    flop_seconds: float
    byte_seconds: float
    kernels: float


def peak_flops(peak_tflops: dict[str, float], dtype: str) -> float:
    """Peak FLOP/s of a GPU for a dtype (the trace's ``f32``, ``f16``, ``bf16`` or the ruleset's ``fp32``,
    ``tf32``, ``bf16``, ``fp16``), with the :data:`PEAK_FALLBACK`; 0 if none."""
    for key in PEAK_FALLBACK[_HARDWARE_NAME.get(dtype, "fp32")]:
        if key in peak_tflops:
            return peak_tflops[key] * 1e12
    return 0.0


def terms(work: tuple[OpWork, ...], peak_tflops: dict[str, float], bandwidth_gbps: float, *, compiled: bool,
          tf32: bool, split: int = 1) -> tuple[Term, ...]:
    """The records of one micro-step priced at the peaks. ``compiled`` keeps the ``torch.compile`` form of
    elementwise runs; ``tf32`` runs fp32 GEMMs on TF32 tensor cores; ``split`` divides each kernel's work
    (tensor parallelism splits every layer's GEMMs and, with sequence parallelism, its elementwise work)."""
    skip = "eager" if compiled else "compiled"
    bw = bandwidth_gbps * 1e9
    out = []
    for r in work:
        if r.mode == skip:
            continue
        fs = 0.0
        if r.flops:
            dtype = "tf32" if tf32 and r.dtype == "f32" else r.dtype
            peak = peak_flops(peak_tflops, dtype)
            fs = r.count * r.flops / split / peak if peak else 0.0
        out.append(Term(r.kind, r.phase, fs, r.count * r.bytes / split / bw, float(r.count)))
    return tuple(out)


def kernel_seconds(term: Term, eff: Efficiency) -> float:
    """GPU seconds of a priced record: the slower of its FLOPs and its bytes at the achievable rates."""
    e = eff.gemm if term.kind == "gemm" else eff.attention if term.kind == "attention" else None
    compute = term.flop_seconds / e if e else 0.0
    return max(compute, term.byte_seconds / eff.memory)


def price(ts: tuple[Term, ...], eff: Efficiency, fetches_per_pass: int = 0) -> dict[str, float]:
    """GPU seconds of one micro-step by kernel class (``gemm``, ``attention``, ``elementwise``, ``dequant``,
    ``embedding``) and by phase (``forward``, ``recompute``, ``backward``), the GPU total, the host's launch
    time and the micro-step: ``Σ over phases of √(GPU² + host²)`` (:func:`overlap`).
    ``fetches_per_pass``: DeepSpeed ZeRO-3 parameter fetches in each pass (host work of its module hooks,
    ``host_seconds_per_fetch`` each, overlapping the GPU like kernel launches)."""
    out: dict[str, float] = {}
    host_phase: dict[str, float] = {}
    gpu = host = 0.0
    for t in ts:
        s = kernel_seconds(t, eff)
        out[t.kind] = out.get(t.kind, 0.0) + s
        out[t.phase] = out.get(t.phase, 0.0) + s
        h = t.kernels * eff.host_seconds_per_kernel
        host_phase[t.phase] = host_phase.get(t.phase, 0.0) + h
        gpu += s
        host += h
    out["gpu"] = gpu
    fetch = fetches_per_pass * eff.host_seconds_per_fetch
    out["host"] = host + fetch * len(host_phase)
    out["micro_step"] = sum(overlap(out[p], h + fetch) for p, h in host_phase.items())
    return out


def overlap(gpu: float, host: float) -> float:
    """One phase's time from its GPU time and its host time. The host runs ahead of the GPU (the launch queue
    absorbs the difference) and the phases follow each other (the backward starts when the forward's loss
    exists). Within a phase, stretches of large GPU-bound kernels alternate with stretches of small
    host-bound ones, so the two overlap only in part: between ``max(gpu, host)`` (perfect overlap) and
    ``gpu + host`` (none). fitplan takes the root of the sum of squares, which is within 3 % of the larger when
    one is 4 × the other and 41 % above it when they are equal; ``max`` misses the published runs that are
    neither clearly host- nor GPU-bound (docs/time-and-cost.md: leave-one-out worst error 89 % with ``max``,
    38 % with this)."""
    return (gpu * gpu + host * host) ** 0.5


def memory_seconds(nbytes: float, bandwidth_gbps: float, eff: Efficiency) -> float:
    """A memory-bound pass over ``nbytes`` (optimizer update, gradient accumulation, clipping)."""
    return nbytes / (bandwidth_gbps * 1e9 * eff.memory)
