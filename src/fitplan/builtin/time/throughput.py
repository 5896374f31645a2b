"""Throughput and training time: a given or measured throughput, else tokens per step / step seconds; the
likely range; the MFU it amounts to; the shares of the step.

``train_seconds = train_tokens / train_tokens_per_second``, the throughput coming, in order, from

1. ``--tokens-per-second`` (a measured throughput of the whole run);
2. ``--throughput-source NAME``: a ``[[throughput]]`` row of set NAME (e.g. the seed chapter's table) for
   the GPU and the nearest model size, scaled linearly to the number of GPUs;
3. the step model (:mod:`fitplan.builtin.time.step`, :mod:`fitplan.builtin.time.comm`): tokens per optimizer
   step / seconds per step.

With the step model, time and cost carry a likely range: the time × the ``[time_model]`` band (the 10th and
90th percentiles of the leave-one-out errors on published fine-tuning runs, ``bench/time_loo.py``).
"""

from __future__ import annotations

import math

from fitplan.engine.declarations import quantity
from fitplan.errors import FitplanError

THROUGHPUT_SIZE_TOLERANCE = 1.3
"""A ``[[throughput]]`` row applies to models within this factor of its parameter count (7B row: 5.4B-9.1B)."""

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


@quantity("tokens")
def tokens_per_step(per_device_train_batch_size, realized_seq_length, gradient_accumulation_steps, data_parallel_degree):
    """Tokens per optimizer step, all GPUs: ``b × s × gradient_accumulation_steps × data-parallel degree``, with
    ``s`` the realized sequence length (``max_seq_length`` without ``--dataset``): the step the trace prices."""
    return per_device_train_batch_size * realized_seq_length * gradient_accumulation_steps * data_parallel_degree


@quantity("text", json_key="time.throughput_basis", type="text")
def throughput_basis(tokens_per_second, measured_tokens_per_second, throughput_source, step_seconds, assumed_mfu, mfu,
                     step_time_calibration, kernel_efficiency):
    """Where the throughput comes from: given, a ``[[throughput]]`` table, a stated or measured MFU, or the
    roofline over the step trace (and whether a ``fitplan calibrate`` measurement scales it)."""
    if tokens_per_second is not None:
        return "given (--tokens-per-second)"
    if measured_tokens_per_second is not None:
        return f"measured: table {throughput_source!r} of the throughput rulesets"
    if step_seconds is None:
        return None
    if assumed_mfu:
        origin = "--mfu" if mfu is not None else "measured on this GPU, [[mfu_calibration]]"
        text = f"FLOPs at an MFU of {100 * assumed_mfu:.1f} % ({origin})"
    else:
        text = f"roofline over the step's kernels ({kernel_efficiency.rule})"
    if step_time_calibration is not None:
        text += f"; × {step_time_calibration.scale:.3f} calibrated on your run ({step_time_calibration.source or 'fitplan calibrate'})"
    return text


@quantity("tokens/s", json_key="time.tokens_per_second", short="throughput")
def train_tokens_per_second(tokens_per_second, measured_tokens_per_second, tokens_per_step, step_seconds):
    """Training throughput of the whole run: ``--tokens-per-second``, else the ``--throughput-source`` row,
    else tokens per step / step seconds. None when none applies (no GPU)."""
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


@quantity("factors", type="object")
def time_band(tokens_per_second, measured_tokens_per_second, assumed_mfu, step_seconds, rulesets, gpu_spec,
              step_time_calibration):
    """The likely range of the modelled time as factors ``(low, high, basis)`` on it: the ``[time_model]`` band,
    the 10th and 90th percentiles of measured / predicted time over the published runs, each predicted with the
    efficiency factors fitted without it (leave-one-out, ``bench/time_loo.py``). It says what it knows: on a GPU
    generation no published run was fitted on, widened by how far the fitted generations' GEMM efficiencies lie
    from the run-weighted mean the estimate uses (``generation_spread``); after ``fitplan calibrate`` on a run on
    this GPU, the narrower band calibration leaves on the published runs (one run's ratio applied to another on the
    same GPU type from the same source). None when the throughput is given, measured or priced at a stated MFU (no model error to show)
    or there is no step model."""
    model = rulesets.time_model
    if tokens_per_second is not None or measured_tokens_per_second is not None or assumed_mfu or step_seconds is None \
            or model is None:
        return None
    if step_time_calibration is not None and model.calibrated_band_low > 0:
        return (model.calibrated_band_low, model.calibrated_band_high,
                f"calibrated on your run: the {model.band_percentiles[0]:g}th and {model.band_percentiles[1]:g}th "
                f"percentiles of measured / predicted time over {model.calibrated_pairs} ordered pairs of published runs "
                "on one GPU type from one source, each predicted with the other's calibration")
    basis = (f"the {model.band_percentiles[0]:g}th and {model.band_percentiles[1]:g}th percentiles of measured / "
             f"predicted time over {model.runs} published fine-tuning runs, each predicted without itself")
    spread = generation_spread(rulesets, gpu_spec)
    if spread is None:
        return (model.band_low, model.band_high, basis)
    return (model.band_low * spread[0], model.band_high * spread[1],
            basis + f"; widened × {spread[0]:.2f} / × {spread[1]:.2f}: no published run on {gpu_spec.generation or 'this'} "
                    "GPUs, whose efficiency is the fitted generations' mean, and they differ by that much")


def generation_spread(rulesets, gpu_spec) -> tuple[float, float] | None:
    """For a GPU whose generation has no fitted ``[[time_efficiency]]`` row (its GEMM efficiency is the run-weighted
    mean m of the fitted ones, builtin/time/step.py): time scales as 1 / efficiency, so the fitted generations'
    extremes put its time between ``m / max`` and ``m / min`` of the mean's (with ``min(1, ·)`` and ``max(1, ·)``).
    None when the generation was fitted, without a GPU or without fitted rows."""
    effs = rulesets.time_efficiencies
    if gpu_spec is None or not effs or gpu_spec.generation in effs:
        return None
    total = sum(max(x.runs, 1) for x in effs.values())
    mean = sum(x.gemm * max(x.runs, 1) for x in effs.values()) / total
    gemms = [x.gemm for x in effs.values()]
    return (min(1.0, mean / max(gemms)), max(1.0, mean / min(gemms)))


@quantity("s", json_key="time.seconds_low", role="seconds.low", label="training time, likely low")
def train_seconds_low(train_seconds, time_band):
    """The low end of the likely training time: ``train_seconds × band low`` (None without a band)."""
    return None if train_seconds is None or time_band is None else train_seconds * time_band[0]


@quantity("s", json_key="time.seconds_high", role="seconds.high", label="training time, likely high")
def train_seconds_high(train_seconds, time_band):
    """The high end of the likely training time: ``train_seconds × band high`` (None without a band)."""
    return None if train_seconds is None or time_band is None else train_seconds * time_band[1]


@quantity("fraction", json_key="time.mfu", short="mfu")
def train_mfu(train_tokens_per_second, flops_per_token, world_size, peak_flops_per_gpu):
    """The MFU the throughput amounts to: ``tokens/s × FLOPs per token / (GPUs × peak)`` (what published runs
    report). None without a GPU."""
    if not train_tokens_per_second or not peak_flops_per_gpu:
        return None
    return train_tokens_per_second * flops_per_token / (world_size * peak_flops_per_gpu)


@quantity("fraction", json_key="time.communication_share")
def communication_share(tokens_per_second, measured_tokens_per_second, step_seconds, compute_seconds_per_step,
                        step_time_calibration):
    """Share of the step spent in exposed (not overlapped) communication and offload copies: ``(step −
    compute) / step``. None when the throughput is given or measured (it already includes communication)."""
    if tokens_per_second is not None or measured_tokens_per_second is not None or not step_seconds:
        return None
    scale = step_time_calibration.scale if step_time_calibration is not None else 1.0
    return max(0.0, (step_seconds - compute_seconds_per_step * scale) / step_seconds)


@quantity("fraction", json_key="time.optimizer_share", short="optimizer_share", label="optimizer step share")
def optimizer_step_share(optimizer_step_seconds, grad_clip_seconds, step_seconds, step_time_calibration, assumed_mfu):
    """Share of one optimizer step spent in the optimizer update and gradient clipping: ``(update + clipping)
    × calibration / step``. The update reads and writes every state of every trainable parameter once per
    step, whatever the batch: with few tokens per step it dominates. None without a step model."""
    if not step_seconds or optimizer_step_seconds is None or assumed_mfu:
        return None
    scale = step_time_calibration.scale if step_time_calibration is not None else 1.0
    return (optimizer_step_seconds + grad_clip_seconds) * scale / step_seconds


QUANTITIES = (measured_tokens_per_second, tokens_per_step, throughput_basis, train_tokens_per_second, train_seconds,
              time_band, train_seconds_low, train_seconds_high, train_mfu, communication_share, optimizer_step_share)
