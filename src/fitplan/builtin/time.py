"""Training time: tokens, FLOPs per token, throughput, communication, seconds.

``train_seconds = train_tokens / train_tokens_per_second``, where the throughput comes, in order, from

1. ``--tokens-per-second`` (a measured throughput of the whole run);
2. ``--throughput-source NAME``: a row of the ``[[throughput]]`` ruleset set NAME (e.g. the seed
   chapter's table) for the GPU and the nearest model size, scaled linearly to the number of GPUs;
3. the FLOPs model: one optimizer step takes ``compute + exposed communication`` seconds, with
   ``compute = FLOPs per GPU / (peak FLOP/s × MFU)``. The MFU is ``--mfu``, else a ``[[mfu_calibration]]``
   row measured on this GPU, else the default fitted from the published ``[[mfu]]`` rows
   (docs/time-and-cost.md gives the fit and its leave-one-out error).

Quantities are None (not errors) when the dataset, or the GPU the FLOPs model needs, is missing.
"""

from __future__ import annotations

import functools
import math
import statistics

from fitplan.engine.declarations import quantity
from fitplan.errors import FitplanError
from fitplan.pluginmgr.hookspecs import hookimpl

# --------------------------------------------------------------------------- named constants

COMM_OVERLAP_FRACTION = 0.5
"""Share of a step's compute time that communication can hide behind.

Gradient buckets are reduced (DDP, ZeRO-1/2) while backward goes on, and ZeRO-3/FSDP prefetch the next
unit's parameters during forward and backward, so most communication runs concurrently with compute.
But backward is only 2/3 of the FLOPs, the first bucket is ready only after the last layers' backward,
the last bucket and the optimizer-step all-gather wait for all of it, and NCCL kernels take SMs and
memory bandwidth from the matmuls they overlap. Half of the compute time is the middle of "none" (0)
and "all of backward" (2/3): communication shorter than that is hidden, the excess is exposed."""

NVLINK_DIRECTION_FACTOR = 0.5
"""The hardware ruleset quotes NVLink / Infinity Fabric bandwidth bidirectionally (A100 600 GB/s); a ring
collective sends in one direction at a time, so it sees half. PCIe figures are already per direction."""

NCCL_EFFICIENCY = 0.8
"""Bus bandwidth NCCL reaches as a fraction of the link rate (nccl-tests all_reduce_perf: about 230-240 GB/s
on 8×A100 NVLink3 = 0.8 × 300 GB/s per direction; about 40 GB/s per 400 Gb/s InfiniBand rail)."""

PCIE_HOST_GBPS = 25.0
"""GB/s of pinned host <-> GPU copies for CPU offload: PCIe 4.0 x16 is 32 GB/s per direction, copies reach ~25."""

THROUGHPUT_SIZE_TOLERANCE = 1.3
"""A ``[[throughput]]`` row applies to models within this factor of its parameter count (7B row: 5.4B-9.1B)."""

MFU_DEFAULT_MODEL = "global_median"
"""Which fit of the ``[[mfu]]`` rows gives the default MFU (``global_median``, ``gpu_median`` or
``log_linear``): the one with the lowest leave-one-out error (``bench/mfu_loo.py``)."""

_EMBEDDINGS = ("embed_tokens", "embed_positions")

# --------------------------------------------------------------------------- tokens


@quantity("tokens", json_key="time.dataset_tokens")
def dataset_tokens(num_examples, tokens_per_example, total_tokens):
    """Real (unpadded) tokens in one pass over the dataset: ``total_tokens``, or ``num_examples ×
    tokens_per_example`` (the seed: 10,000 × 512 = 5,120,000). None without a dataset."""
    if total_tokens is not None:
        if num_examples is not None and tokens_per_example is not None:
            product = num_examples * tokens_per_example
            if abs(product - total_tokens) > 0.005 * total_tokens:
                raise FitplanError(
                    f"Dataset.total_tokens ({total_tokens:,}) disagrees with num_examples × tokens_per_example "
                    f"({num_examples:,} × {tokens_per_example:g} = {product:,.0f})", field="total_tokens", value=total_tokens,
                    suggestion="give two of --num-examples, --tokens-per-example and --total-tokens")
        return total_tokens
    if num_examples is None and tokens_per_example is None:
        return None
    if num_examples is None or tokens_per_example is None:
        given, missing = (("--num-examples", "--tokens-per-example") if tokens_per_example is None
                          else ("--tokens-per-example", "--num-examples"))
        raise FitplanError(f"{given} needs {missing} (or --total-tokens) to count the dataset's tokens",
                           field=missing.lstrip("-").replace("-", "_"), suggestion=f"add {missing} N")
    return num_examples * tokens_per_example


@quantity("tokens")
def epoch_tokens(dataset_tokens, num_examples, padding, max_seq_length):
    """Tokens the GPUs process per epoch. ``padding="pack"`` (default): the dataset's tokens, concatenated
    and cut into ``max_seq_length`` sequences. ``padding="pad"``: every example is padded (or truncated)
    to ``max_seq_length``, so it costs ``num_examples × max_seq_length`` whatever its length."""
    if dataset_tokens is None:
        return None
    if padding == "pad":
        if num_examples is None:
            raise FitplanError("--padding pad needs --num-examples: every example is padded to --max-seq-length",
                               field="num_examples", suggestion="add --num-examples N, or use --padding pack")
        return num_examples * max_seq_length
    return dataset_tokens


@quantity("tokens", json_key="time.tokens", short="tokens", label="training tokens")
def train_tokens(epoch_tokens, num_train_epochs):
    """Tokens processed by the whole run: tokens per epoch × ``num_train_epochs``
    (the seed: 5,120,000 × 3 = 15,360,000)."""
    return None if epoch_tokens is None else epoch_tokens * num_train_epochs


@quantity("tokens", json_key="time.padding_tokens")
def padding_tokens(epoch_tokens, dataset_tokens, num_train_epochs):
    """Pad tokens processed (and paid for) over the run: ``(epoch − real tokens) × epochs`` when padding
    to ``max_seq_length`` with a mean length below it; 0 when packing. A mean length, not the length
    distribution, is known: examples longer than ``max_seq_length`` are truncated (``truncated_tokens``)."""
    if epoch_tokens is None:
        return None
    return max(0.0, epoch_tokens - dataset_tokens) * num_train_epochs


@quantity("tokens", json_key="time.truncated_tokens")
def truncated_tokens(epoch_tokens, dataset_tokens, num_train_epochs):
    """Tokens cut off by padding/truncating to ``max_seq_length`` when the mean example is longer (0 when packing)."""
    if epoch_tokens is None:
        return None
    return max(0.0, dataset_tokens - epoch_tokens) * num_train_epochs


# --------------------------------------------------------------------------- FLOPs


@functools.lru_cache(maxsize=256)
def _matmul_params(arch) -> int:
    if arch.count_only:
        return arch.param_count
    emb = sum(g.total for g in arch.param_groups() if g.module in _EMBEDDINGS)
    n = arch.active_param_count - emb
    if arch.tie_word_embeddings:
        n += arch.vocab_size * arch.hidden_size  # the LM head multiplies by the tied embedding matrix
    return n


@quantity("params")
def flops_param_count(arch):
    """N in "6·N FLOPs per token": the parameters that do one multiply-add per token. Total parameters
    minus the input embeddings (a lookup, not a matmul; a tied LM head is counted once), and for MoE only
    the active ones (``arch.active_param_count``: ``num_experts_per_tok`` experts per token), as torchtitan's
    ``get_num_flop_per_token`` counts. A bare ``--params`` count is used as is."""
    return _matmul_params(arch)


@quantity("FLOP/token")
def attention_flops_per_token(arch, max_seq_length):
    """Attention score and value matmuls, forward + backward: ``12·L·(a·d_head)·s`` per token
    (PaLM, Chowdhery et al. 2022, appendix B; nanoGPT ``estimate_mfu``; causal masking not discounted, as
    those sources do). 0 for a bare ``--params`` model: without layers and width there is no attention term."""
    if arch.count_only:
        return 0
    return 12 * arch.num_hidden_layers * arch.q_dim * max_seq_length


@quantity("FLOP/token", json_key="time.flops_per_token")
def flops_per_token(method, gradient_checkpointing, flops_param_count, adapter_param_count, attention_flops_per_token):
    """Training FLOPs per processed token.

    * full fine-tuning: ``6·N + 12·L·h·s`` (forward 2N, backward 4N: Kaplan et al. 2020; attention: PaLM
      appendix B);
    * gradient checkpointing (full recomputation) runs the forward twice: ``8·N + 16·L·h·s`` (Narayanan et
      al. 2021);
    * LoRA / QLoRA: the frozen base needs no weight gradients, only input gradients: forward 2N + backward
      2N, plus the adapters' full ``6·N_adapter``: ``4·N + 6·N_adapter + 12·L·h·s`` (+ one more forward,
      ``2·N + 2·N_adapter + 4·L·h·s``, with checkpointing). QLoRA's dequantisation costs time, not FLOPs.

    N is ``flops_param_count`` (active parameters for MoE)."""
    n, a, att = flops_param_count, adapter_param_count, attention_flops_per_token
    if method == "full":
        total = 6 * n + att
        extra = 2 * n + att / 3
    else:
        total = 4 * n + 6 * a + att
        extra = 2 * n + 2 * a + att / 3
    return total + (extra if gradient_checkpointing else 0)


@quantity("FLOP", json_key="time.flops", short="flops")
def train_flops(flops_per_token, train_tokens):
    """FLOPs of the whole run: FLOPs per token × tokens processed."""
    return None if train_tokens is None else flops_per_token * train_tokens


# --------------------------------------------------------------------------- peak and MFU

_PEAK_FALLBACK = {"bf16": ("bf16", "fp32"), "fp16": ("fp16", "bf16"), "tf32": ("tf32", "fp32"), "fp32": ("fp32",)}


@quantity("dtype", json_key="time.matmul_dtype", type="text")
def matmul_dtype(compute_dtype, tf32):
    """The dtype whose peak applies. fp32 training runs full-fp32 matmuls: PyTorch leaves
    ``torch.backends.cuda.matmul.allow_tf32`` off by default (since 1.12) and so does the HF Trainer
    (``tf32=None``); ``--tf32`` switches fp32 matmuls to the TF32 tensor-core peak."""
    return "tf32" if compute_dtype == "fp32" and tf32 else compute_dtype


@quantity("FLOP/s", json_key="time.peak_flops_per_gpu")
def peak_flops_per_gpu(gpu_spec, matmul_dtype):
    """Dense peak FLOP/s of one GPU at the matmul dtype (hardware ruleset ``peak_tflops``). A GPU without
    tensor cores for that dtype runs it at a slower rate: bf16 without a bf16 entry (T4, V100) falls back
    to fp32, tf32 to fp32, fp16 to bf16. None without a GPU."""
    if gpu_spec is None:
        return None
    for dtype in _PEAK_FALLBACK[matmul_dtype]:
        if dtype in gpu_spec.peak_tflops:
            return gpu_spec.peak_tflops[dtype] * 1e12
    return None


def fit_mfu(rows, gpu: str | None, model: str = MFU_DEFAULT_MODEL, param_count: float | None = None) -> tuple[float, str]:
    """The default MFU from published ``[[mfu]]`` rows, and a sentence saying how it was fitted.

    * ``global_median``: the median of every row;
    * ``gpu_median``: the median of the rows measured on ``gpu``; the global median when there are none;
    * ``log_linear``: least squares ``mfu = a + b·log10(param_count)`` over every row.
    """
    rows = list(rows)
    if not rows:
        raise FitplanError("no [[mfu]] rows in the rulesets: no default MFU", field="mfu",
                           suggestion="pass --mfu 0.4 or --tokens-per-second N, or add rulesets/mfu rows")
    values = [r.mfu for r in rows]
    if model == "global_median":
        return statistics.median(values), f"median of all {len(rows)} published [[mfu]] rows"
    if model == "gpu_median":
        same = [r.mfu for r in rows if r.gpu == gpu]
        if same:
            return statistics.median(same), f"median of the {len(same)} published [[mfu]] row(s) on {gpu}"
        return statistics.median(values), f"median of all {len(rows)} published [[mfu]] rows (none on {gpu})"
    if model == "log_linear":
        xs = [math.log10(r.param_count) for r in rows]
        mx, my = statistics.fmean(xs), statistics.fmean(values)
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, values)) / sxx if sxx else 0.0
        a = my - b * mx
        x = math.log10(param_count) if param_count else mx
        return a + b * x, f"least squares mfu = {a:.3f} + {b:.3f}·log10(params) over {len(rows)} [[mfu]] rows"
    raise ValueError(f"unknown MFU model {model!r}")


def _default_mfu(rulesets, gpu_id, param_count):
    key = ("mfu_default", gpu_id, MFU_DEFAULT_MODEL, param_count if MFU_DEFAULT_MODEL == "log_linear" else None)
    return rulesets.memo(key, lambda: fit_mfu(rulesets.mfu_rows.values(), gpu_id, MFU_DEFAULT_MODEL, param_count))


@quantity("fraction")
def mfu_default(gpu_spec, rulesets, param_count):
    """The default MFU for this GPU, fitted from the published ``[[mfu]]`` rows (DOMAIN.md §4:
    llm-foundry, torchtitan, the Llama 2 model card, torchtune): see ``mfu_default_rule`` for the fit and
    docs/time-and-cost.md for its leave-one-out error. None without a GPU."""
    if gpu_spec is None:
        return None
    return _default_mfu(rulesets, gpu_spec.id, param_count)[0]


@quantity("text", type="text")
def mfu_default_rule(gpu_spec, rulesets, param_count):
    """How ``mfu_default`` was fitted (which rows), for ``explain``."""
    if gpu_spec is None:
        return None
    return _default_mfu(rulesets, gpu_spec.id, param_count)[1]


def _calibration(rulesets, gpu_id, model, method):
    def find():
        best = None
        for (gpu, m, meth), cal in rulesets.mfu_calibrations.items():
            if gpu != gpu_id:
                try:  # the row may name the GPU by an alias ("H100")
                    gpu = rulesets.gpu(gpu).id
                except FitplanError:
                    continue
            if gpu != gpu_id or (m and m != model) or (meth and meth != method):
                continue
            score = bool(m) + bool(meth)
            if best is None or score > best[0]:
                best = (score, cal)
        return None if best is None else best[1]

    return rulesets.memo(("mfu_calibration", gpu_id, model, method), find)


@quantity("fraction")
def mfu_calibrated(gpu_spec, rulesets, model, method):
    """An MFU measured on this GPU (``[[mfu_calibration]]``, written by ``fitplan validate --calibrate-out``):
    the row that also names this model and method wins over one that names only the GPU. None when none applies."""
    if gpu_spec is None:
        return None
    cal = _calibration(rulesets, gpu_spec.id, model or "", method)
    return None if cal is None else cal.mfu


@quantity("fraction", json_key="time.assumed_mfu")
def assumed_mfu(mfu, mfu_calibrated, mfu_default):
    """The MFU the FLOPs model uses: ``--mfu``, else the GPU's calibration, else the fitted default."""
    if mfu is not None:
        return mfu
    return mfu_calibrated if mfu_calibrated is not None else mfu_default


# --------------------------------------------------------------------------- one optimizer step


@quantity("tokens")
def tokens_per_step(per_device_train_batch_size, max_seq_length, gradient_accumulation_steps, data_parallel_degree):
    """Tokens per optimizer step, all GPUs: ``b × s × gradient_accumulation_steps × data-parallel degree``."""
    return per_device_train_batch_size * max_seq_length * gradient_accumulation_steps * data_parallel_degree


@quantity("s")
def compute_seconds_per_step(flops_per_token, per_device_train_batch_size, max_seq_length, gradient_accumulation_steps,
                             tensor_parallel, peak_flops_per_gpu, assumed_mfu):
    """Compute time of one optimizer step on one GPU: ``FLOPs per token × b·s·k / t / (peak × MFU)``
    (t = tensor-parallel degree, which splits each replica's FLOPs). None without a GPU peak."""
    if not peak_flops_per_gpu or not assumed_mfu:
        return None
    tokens = per_device_train_batch_size * max_seq_length * gradient_accumulation_steps
    return flops_per_token * tokens / tensor_parallel / (peak_flops_per_gpu * assumed_mfu)


@quantity("bytes")
def comm_bytes_per_step(shard_stage, shard_degree, data_parallel_degree, fsdp, num_nodes, param_count, weight_dtype_bytes,
                        grad_bytes_unsharded, trainable_param_count, trainable_dtype_bytes, gradient_accumulation_steps,
                        tensor_parallel, arch, per_device_train_batch_size, max_seq_length, activation_dtype_bytes):
    """Bytes each GPU sends per optimizer step in collectives, ``{"intra": ..., "inter": ...}``.

    With n data-parallel ranks, f = (n−1)/n, G the gradient bytes and P the parameter bytes of one replica,
    k micro-steps per step (ring algorithms, NCCL):

    * DDP (stage 0): one all-reduce of gradients per step, ``2f·G`` (HF accumulates under ``no_sync``);
    * ZeRO-1: reduce-scatter of gradients + all-gather of updated parameters, ``f·G + f·G``;
    * ZeRO-2 / FSDP shard_grad_op: gradients are reduce-scattered every micro-step, ``k·f·G + f·G``;
    * ZeRO-3 / FSDP full_shard: parameters all-gathered in forward and again in backward, gradients
      reduce-scattered, every micro-step: ``k·(2f·P + f·G)`` (1.5× DDP's volume when P = G);
    * FSDP hybrid_shard: that within a node, plus an all-reduce of each GPU's gradient shard across nodes;
    * tensor parallelism (degree t): 4 all-reduces of ``b·s·h`` activations per layer per micro-step (Megatron).

    Traffic crosses nodes ("inter") when ``num_nodes > 1``, except hybrid_shard's intra-node part."""
    n = data_parallel_degree
    P = param_count * weight_dtype_bytes / tensor_parallel
    G = grad_bytes_unsharded / tensor_parallel
    T = trainable_param_count * trainable_dtype_bytes / tensor_parallel
    k = gradient_accumulation_steps
    intra = inter = 0.0
    if n > 1:
        if fsdp == "hybrid_shard" and num_nodes > 1:
            g = shard_degree
            fg = (g - 1) / g
            intra += k * (2 * fg * P + fg * G)
            m = max(1, n // g)
            inter += 2 * (m - 1) / m * G / g
        else:
            f = (n - 1) / n
            if shard_stage == 0:
                vol = 2 * f * G
            elif shard_stage == 1:
                vol = f * G + f * T
            elif shard_stage == 2:
                vol = k * f * G + f * T
            else:
                vol = k * (2 * f * P + f * G)
            if num_nodes > 1:
                inter += vol
            else:
                intra += vol
    if tensor_parallel > 1 and not arch.count_only:
        ft = (tensor_parallel - 1) / tensor_parallel
        act = per_device_train_batch_size * max_seq_length * arch.hidden_size * activation_dtype_bytes
        intra += k * arch.num_hidden_layers * 4 * 2 * ft * act
    return {"intra": intra, "inter": inter}


def _intra_bandwidth(gpu_spec) -> float:
    factor = NVLINK_DIRECTION_FACTOR if not gpu_spec.interconnect.startswith("pcie") else 1.0
    return gpu_spec.interconnect_gbps * 1e9 * factor * NCCL_EFFICIENCY


@quantity("s")
def comm_seconds_per_step(comm_bytes_per_step, gpu_spec):
    """Collective time per step: intra-node bytes at the hardware ruleset's ``interconnect_gbps`` (NVLink
    figures halved: a ring uses one direction) and inter-node bytes at ``inter_node_gbps``, both × the
    NCCL efficiency (0.8). None without a GPU."""
    if gpu_spec is None:
        return None
    t = 0.0
    if comm_bytes_per_step["intra"]:
        t += comm_bytes_per_step["intra"] / _intra_bandwidth(gpu_spec)
    if comm_bytes_per_step["inter"]:
        t += comm_bytes_per_step["inter"] / (gpu_spec.inter_node_gbps * 1e9 * NCCL_EFFICIENCY)
    return t


@quantity("s")
def offload_seconds_per_step(offload_optimizer, offload_params, shard_stage, shard_degree, grad_bytes_unsharded,
                             trainable_param_count, weight_dtype_bytes, param_count, gradient_accumulation_steps,
                             tensor_parallel):
    """CPU offload's PCIe copies per step (DeepSpeed ZeRO-Offload) at 25 GB/s: each GPU's gradient shard
    goes down and its updated parameters come back up; with parameter offload (stage 3) every micro-step
    also fetches the parameter shard for forward and for backward. The CPU optimizer's own compute time
    is not modelled."""
    div = (shard_degree if shard_stage >= 1 else 1) * tensor_parallel
    b = 0.0
    if offload_optimizer:
        b += grad_bytes_unsharded / div + trainable_param_count * weight_dtype_bytes / div
    if offload_params and shard_stage >= 3:
        b += gradient_accumulation_steps * 2 * param_count * weight_dtype_bytes / (shard_degree * tensor_parallel)
    return b / (PCIE_HOST_GBPS * 1e9)


@quantity("s", json_key="time.step_seconds")
def step_seconds(compute_seconds_per_step, comm_seconds_per_step, offload_seconds_per_step):
    """One optimizer step: ``compute + max(0, communication + offload − 0.5 × compute)``: transfers
    overlap with up to half of the compute (``COMM_OVERLAP_FRACTION``, reasoning in the module)."""
    if compute_seconds_per_step is None:
        return None
    transfers = (comm_seconds_per_step or 0.0) + offload_seconds_per_step
    return compute_seconds_per_step + max(0.0, transfers - COMM_OVERLAP_FRACTION * compute_seconds_per_step)


# --------------------------------------------------------------------------- throughput and time


def _throughput_row(rulesets, set_name, gpu_id, param_count):
    def find():
        rows = [r for r in rulesets.throughput_rows.values() if r.set == set_name]
        if not rows:
            sets = sorted({r.set for r in rulesets.throughput_rows.values()})
            from fitplan.errors import unknown

            raise unknown("throughput source", set_name, sets, field="--throughput-source")
        fits = [r for r in rows if r.gpu == gpu_id
                and abs(math.log(param_count / r.param_count)) <= math.log(THROUGHPUT_SIZE_TOLERANCE)]
        if not fits:
            have = "; ".join(f"{r.model or f'{r.param_count / 1e9:g}B'} on {r.num_gpus}× {r.gpu}" for r in rows)
            raise FitplanError(
                f"throughput source {set_name!r} has no row for a {param_count / 1e9:.3g}B model on {gpu_id}",
                field="--throughput-source", value=set_name,
                suggestion=f"{set_name} has: {have}; or pass --tokens-per-second N or --mfu F")
        return min(fits, key=lambda r: abs(math.log(param_count / r.param_count)))

    return rulesets.memo(("throughput", set_name, gpu_id, param_count), find)


@quantity("tokens/s")
def measured_tokens_per_second(throughput_source, rulesets, gpu_spec, param_count, world_size):
    """Throughput of the ``--throughput-source`` row for this GPU and the nearest model size (within a
    factor 1.3), scaled linearly from the row's GPU count to this run's (an assumption: real scaling is
    sub-linear). None without ``--throughput-source`` or without a GPU."""
    if throughput_source is None or gpu_spec is None:
        return None
    row = _throughput_row(rulesets, throughput_source, gpu_spec.id, param_count)
    return row.tokens_per_second * world_size / row.num_gpus


@quantity("text", json_key="time.throughput_basis", type="text")
def throughput_basis(tokens_per_second, measured_tokens_per_second, throughput_source, step_seconds, assumed_mfu, mfu,
                     mfu_calibrated):
    """Where the throughput comes from: given, a ``[[throughput]]`` table, or the FLOPs model (and its MFU)."""
    if tokens_per_second is not None:
        return "given (--tokens-per-second)"
    if measured_tokens_per_second is not None:
        return f"measured: table {throughput_source!r} of the throughput rulesets"
    if step_seconds is not None:
        origin = "--mfu" if mfu is not None else "calibrated" if mfu_calibrated is not None else "published default"
        return f"FLOPs model at an assumed MFU of {100 * assumed_mfu:.1f} % ({origin})"
    return None


@quantity("tokens/s", json_key="time.tokens_per_second", short="throughput")
def train_tokens_per_second(tokens_per_second, measured_tokens_per_second, tokens_per_step, step_seconds):
    """Training throughput of the whole run: ``--tokens-per-second``, else the ``--throughput-source`` row,
    else tokens per step / step seconds (the FLOPs model). None when none applies (no GPU)."""
    if tokens_per_second is not None:
        return float(tokens_per_second)
    if measured_tokens_per_second is not None:
        return measured_tokens_per_second
    if step_seconds:
        return tokens_per_step / step_seconds
    return None


@quantity("s", json_key="time.seconds", short="time", role="seconds", label="training time")
def train_seconds(train_tokens, train_tokens_per_second):
    """Wall-clock training time: tokens processed / tokens per second (the seed: 15,360,000 / 1,000 =
    15,360 s ≈ 4.3 h). Steps are not rounded up to whole steps. None without a dataset or a throughput."""
    if train_tokens is None or not train_tokens_per_second:
        return None
    return train_tokens / train_tokens_per_second


@quantity("fraction", json_key="time.mfu", short="mfu")
def train_mfu(train_tokens_per_second, flops_per_token, world_size, peak_flops_per_gpu):
    """The MFU the throughput amounts to: ``tokens/s × FLOPs per token / (GPUs × peak)``. Below the assumed
    MFU when communication is exposed; implied by a given or measured throughput. None without a GPU."""
    if not train_tokens_per_second or not peak_flops_per_gpu:
        return None
    return train_tokens_per_second * flops_per_token / (world_size * peak_flops_per_gpu)


@quantity("fraction", json_key="time.communication_share")
def communication_share(tokens_per_second, measured_tokens_per_second, step_seconds, compute_seconds_per_step):
    """Share of the step spent in exposed (not overlapped) communication and offload copies: ``(step −
    compute) / step``. None when the throughput is given or measured (it already includes communication)."""
    if tokens_per_second is not None or measured_tokens_per_second is not None or not step_seconds:
        return None
    return (step_seconds - compute_seconds_per_step) / step_seconds


QUANTITIES = (
    dataset_tokens, epoch_tokens, train_tokens, padding_tokens, truncated_tokens, flops_param_count,
    attention_flops_per_token, flops_per_token, train_flops, matmul_dtype, peak_flops_per_gpu, mfu_default,
    mfu_default_rule, mfu_calibrated, assumed_mfu, tokens_per_step, compute_seconds_per_step, comm_bytes_per_step,
    comm_seconds_per_step, offload_seconds_per_step, step_seconds, measured_tokens_per_second, throughput_basis,
    train_tokens_per_second, train_seconds, train_mfu, communication_share,
)


@hookimpl
def fitplan_register_quantities(register):
    for q in QUANTITIES:
        register(q)
