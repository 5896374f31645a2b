"""Reverse questions: the largest micro-batch or sequence length that fits a GPU, and the seed chapter's
GPU tables ("Modèle Max (FT Complet) / (Efficace)") regenerated from first principles.

Both are searches over a quantity that memory does not decrease in (micro-batch, sequence length, model
depth), so an exponential then binary search finds the boundary exactly; each probe is an ordinary
estimate, so the answer is what ``fitplan estimate`` says at and just past it.

The capacity table's method (docs/recommend.md, "capacity"):

* models are **Llama-shaped** and indexed by depth L: hidden size 128·L, ``intermediate_size`` = 8/3 of
  it rounded up to 256, 128-wide heads, full multi-head attention, a 32,000-token vocabulary, untied
  embeddings (L = 32 is Llama-2-7B exactly, L = 40 is Llama-2-13B exactly). Parameters ≈ 196,608·L³.
  Memory grows with L, so the largest L that fits is found by binary search;
* **full fine-tuning** is the HF Trainer's ``bf16=True`` (autocast, fp32 weights), torch AdamW,
  gradient checkpointing, micro-batch 1 × sequence 512, SDPA attention; on several GPUs, DeepSpeed
  ZeRO-3 with its bf16 optimizer (fp32 master weights and states: the ``bf16-master`` preset);
* **efficient fine-tuning** is QLoRA: NF4 base weights with double quantisation, loaded in bf16 (fp16 on GPUs
  without bf16) and prepared by peft's ``prepare_model_for_kbit_training`` (the other parameters in fp32),
  LoRA r = 16 on every linear layer, torch AdamW, checkpointing, micro-batch 1 × 512; on several GPUs,
  PyTorch-native FSDP2 full sharding (``--stack torch --zero 3``). A LoRA column (same, without 4-bit
  weights) is shown for comparison;
* "fits" means ``device_total_bytes`` (peak + CUDA context + allocator reserve) ≤ the GPU's usable memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from fitplan.inputs import scenario as sc
from fitplan.errors import FitplanError
from fitplan.output.capacity import size_text

MAX_PROBE = 1 << 20


def _fits(est, headroom_fraction: float, headroom_bytes: int) -> bool:
    u = est.role("usable")
    return est.role("device_total") <= u - max(int(u * headroom_fraction), headroom_bytes)


REVERSE_LABELS = {"per_device_train_batch_size": "micro-batch", "max_seq_length": "seq-length"}


def largest_fitting(base: sc.Scenario, field: str, ctx, *, headroom: str | float = "0.05", upper: int = MAX_PROBE,
                    arch=None, check: Callable[[], None] | None = None) -> dict[str, Any]:
    """The largest value of ``field`` (an integer scenario field memory does not decrease in) that fits
    ``base``'s GPU with the required headroom. ``check`` is called before each probe is evaluated (it may raise
    to stop the search: ``fitplan serve`` stops one a newer page view has made useless).

    :returns: ``{"field", "largest", "device_total_bytes" (at the largest), "next_device_total_bytes" (at
        largest + 1), "limit_bytes", "usable", "gpu"}``; ``largest`` is 0 when even 1 does not fit.
    :raises FitplanError: without ``--gpu``.
    """
    from fitplan.estimation import evaluate
    from fitplan.search.space import parse_headroom

    if base.hardware.gpu is None:
        label = REVERSE_LABELS.get(field, field.replace("_", "-"))
        raise FitplanError(f"--max {label} needs a GPU to fit", field="--gpu",
                           suggestion="add --gpu NAME, e.g. --gpu a100-80gb (GPU ids: rulesets/hardware/*.toml)")
    frac, hb = parse_headroom(headroom)
    cache: dict[int, Any] = {}

    def est(x: int):
        if x not in cache:
            if check is not None:
                check()
            cache[x] = evaluate(base.replace(**{field: x}), ctx.registry, ctx.rulesets, arch=arch)
        return cache[x]

    lo, hi = 0, 1
    while hi <= upper and _fits(est(hi), frac, hb):
        lo, hi = hi, hi * 2
    hi = min(hi, upper + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(est(mid), frac, hb):
            lo = mid
        else:
            hi = mid
    probe = est(max(lo, 1))
    u = probe.role("usable")
    return {
        "field": field,
        "what": REVERSE_LABELS.get(field, field.replace("_", "-")),
        "largest": lo,
        "device_total": est(lo).role("device_total") if lo else None,
        "next_value": lo + 1 if lo + 1 <= upper else None,
        "next_device_total_bytes": est(lo + 1).role("device_total") if lo + 1 <= upper else None,
        "usable": u,
        "limit_bytes": u - max(int(u * frac), hb),
        "gpu": probe.values["gpu_spec"].id,
        "headroom": str(headroom),
    }


# --------------------------------------------------------------------------- Llama-shaped models


from fitplan.arch.typical import CATALOG_LADDER, REFERENCE, llama_config, llama_spec  # noqa: E402,F401 - the capacity table's models


@attrs.frozen
class Setup:
    """A fine-tuning setup for the capacity table."""

    id: str
    label: str
    fields: dict[str, Any]
    multi_gpu_fields: dict[str, Any] = attrs.Factory(dict)


FULL = Setup("full", "full FT: bf16=True (autocast), AdamW, checkpointing, 1 × 512",
             {"method": "full", "precision": "bf16-mixed", "optim": "adamw_torch", "gradient_checkpointing": True},
             {"precision": "bf16-master", "zero_stage": 3})
QLORA = Setup("qlora", "efficient: QLoRA NF4, LoRA r=16 all-linear, bf16, AdamW, checkpointing, 1 × 512",
              {"method": "qlora", "precision": "bf16-true", "optim": "adamw_torch", "gradient_checkpointing": True,
               "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ("all-linear",)},
              {"zero_stage": 3, "stack": "torch"})
LORA = Setup("lora", "LoRA r=16 all-linear, bf16 weights, AdamW, checkpointing, 1 × 512",
             {"method": "lora", "precision": "bf16-true", "optim": "adamw_torch", "gradient_checkpointing": True,
              "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ("all-linear",)},
             {"zero_stage": 3, "stack": "torch"})
SEED_FULL = Setup("seed_full", "full FT under the seed's assumptions (12 B/param, × 0.7 with checkpointing)",
                  {"method": "full", "precision": "bf16-mixed", "optim": "adamw_torch", "gradient_checkpointing": True,
                   "assumptions": "seed"},
                  {"precision": "bf16-master", "zero_stage": 3})
SETUPS = (FULL, QLORA, LORA, SEED_FULL)
COMMON = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "max_seq_length": 512,
          "attn_implementation": "sdpa"}

SEED_SINGLE = (
    ("rtx-3090", "24 GB", "1B", "3B"),
    ("rtx-4090", "24 GB", "1B", "3B"),
    ("a100-40gb", "40 GB", "3B", "7B"),
    ("a100-80gb", "80 GB", "7B", "13B"),
    ("h100-sxm", "80 GB", "7B", "13B"),
)
"""The seed's "Entraînement sur un Seul GPU" table: GPU, VRAM, max model full FT, max model efficient."""
SEED_MULTI = (
    ("a100-40gb", 2, "80 GB", "7-13B"),
    ("a100-80gb", 4, "320 GB", "30-40B"),
    ("h100-sxm", 8, "640 GB", "70B"),
)
"""The seed's "Entraînement Multi-GPU" table: GPU, count, combined VRAM, max model efficient."""
MAX_LAYERS = 160


def _setup_scenario(setup: Setup, gpu, num_gpus: int) -> sc.Scenario:
    fields = {**COMMON, **setup.fields, "gpu": gpu.id, "num_gpus": num_gpus}
    if num_gpus > 1:
        fields.update(setup.multi_gpu_fields)
    if "bf16" not in gpu.peak_tflops and fields["precision"].startswith("bf16"):
        fields["precision"] = fields["precision"].replace("bf16", "16")
    return sc.Scenario().replace(model="llama-shaped", **fields)


def largest_model(setup: Setup, gpu, num_gpus: int, ctx) -> dict[str, Any]:
    """The deepest Llama-shaped model (and its size) that fits ``num_gpus`` × ``gpu`` under ``setup``."""
    from fitplan.estimation import evaluate

    base = _setup_scenario(setup, gpu, num_gpus)
    cache: dict[int, Any] = {}

    def est(layers: int):
        if layers not in cache:
            cache[layers] = evaluate(base, ctx.registry, ctx.rulesets, arch=llama_spec(layers, ctx.rulesets))
        return cache[layers]

    def fits(layers: int) -> bool:
        return bool(est(layers).role("fit"))

    lo, hi = 0, MAX_LAYERS + 1
    if fits(MAX_LAYERS):
        lo = MAX_LAYERS
    else:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
    out: dict[str, Any] = {"layers": lo, "params": llama_spec(lo, ctx.rulesets).param_count if lo else 0,
                           "at_limit": lo == MAX_LAYERS}
    if lo:
        e = est(lo)
        out.update({"device_total": e.role("device_total"), "usable": e.role("usable")})
    return out


def largest_catalog_model(setup: Setup, gpu, num_gpus: int, ctx, family: Sequence[str]) -> str | None:
    """The largest of ``family`` (catalog model ids, smallest first) that fits, or None."""
    from fitplan.estimation import evaluate

    best = None
    for mid in family:
        s = _setup_scenario(setup, gpu, num_gpus).replace(model=mid)
        try:
            if evaluate(s, ctx.registry, ctx.rulesets).role("fit"):
                best = mid
        except FitplanError:
            continue
    return best


def capacity_table(ctx, gpus: Sequence[str] | None = None) -> dict[str, Any]:
    """Rows for the seed's single-GPU and multi-GPU tables, with fitplan's answers beside the seed's."""
    rules = ctx.rulesets
    single_ids = list(gpus) if gpus else [g for g, *_ in SEED_SINGLE]
    seed_single = {g: (vram, full, eff) for g, vram, full, eff in SEED_SINGLE}
    single = []
    for gid in single_ids:
        g = rules.gpu(gid)
        row: dict[str, Any] = {"gpu": g.id, "name": g.name, "num_gpus": 1, "usable": g.usable_bytes}
        if g.id in seed_single:
            vram, full, eff = seed_single[g.id]
            row["seed"] = {"vram": vram, "full": full, "efficient": eff}
        for setup in SETUPS:
            row[setup.id] = largest_model(setup, g, 1, ctx)
        row["catalog"] = {s.id: largest_catalog_model(s, g, 1, ctx, CATALOG_LADDER) for s in (FULL, QLORA)}
        single.append(row)
    multi = []
    for gid, n, vram, eff in SEED_MULTI:
        g = rules.gpu(gid)
        row = {"gpu": g.id, "name": g.name, "num_gpus": n, "usable": g.usable_bytes * n,
               "seed": {"vram": vram, "efficient": eff}}
        for setup in SETUPS:
            row[setup.id] = largest_model(setup, g, n, ctx)
        row["catalog"] = {s.id: largest_catalog_model(s, g, n, ctx, CATALOG_LADDER) for s in (FULL, QLORA)}
        multi.append(row)
    return {"method": {s.id: s.label for s in SETUPS}, "single_gpu": single, "multi_gpu": multi,
            "notes": capacity_notes(single, multi)}


def capacity_notes(single: list[dict[str, Any]], multi: list[dict[str, Any]]) -> list[str]:
    """Why fitplan's answers differ from the seed's, with the numbers of this table."""
    notes = []
    a80 = next((r for r in single if r["gpu"] == "a100-80gb"), None)
    if a80 is not None:
        notes.append(
            f"Full fine-tuning: the seed counts 12 B/param (bf16 weights and gradients, fp32 AdamW states, no master "
            f"copy) and takes checkpointing as −30 % of that. Under those assumptions fitplan finds "
            f"{size_text(a80['seed_full'])} on an A100-80GB: the seed's 7B is the largest common size below it. With "
            f"the HF Trainer's bf16=True the weights and gradients stay fp32 (4 + 4 + 8 B/param), autocast keeps a "
            f"16-bit copy of the weights (+2 B/param) and torch's foreach AdamW a state-sized temporary during the "
            f"step, so {size_text(a80['full'])} is the realistic answer (8-bit AdamW or pure bf16 would fit more).")
        notes.append(
            f"Efficient fine-tuning: the seed's column is conservative. QLoRA stores the base weights in 4 bits "
            f"(≈0.52 B/param with the block constants) and trains only the adapters, so "
            f"{size_text(a80['qlora'])} fits on an A100-80GB at micro-batch 1 × 512; LoRA on 16-bit weights "
            f"(2 B/param) gives {size_text(a80['lora'])}. The seed's 13B leaves room for longer sequences and "
            f"larger batches than this setup.")
    if multi:
        notes.append(
            "Multi-GPU: ZeRO-3 shards weights, gradients and states across the GPUs, so the combined VRAM is what "
            "counts, minus each GPU's CUDA context and the all-gathered live layers; "
            + "; ".join(f"{r['num_gpus']}× {r['gpu']}: QLoRA {size_text(r['qlora'])}, full {size_text(r['full'])}"
                        for r in multi) + ".")
    notes.append("Sizes are Llama-shaped models (hidden 128·L, MHA, 32k vocabulary) at the largest depth L that fits; "
                 "GQA models (Llama 3, Mistral) of the same size need less activation memory.")
    return notes
