"""What the recommender may choose, and the options it enumerates from it.

The search space (:class:`SearchSpace`) narrowed by the fields the user fixed; the hardware options
respecting instance shapes (a node is at most the largest instance the provider rents with that GPU, and
several nodes are whole such instances); micro-batch × accumulation for the effective batch; the ZeRO and
offload combinations a precision allows; the precisions and kernels a GPU runs.
"""

from __future__ import annotations

from typing import Any

import attrs

from fitplan.errors import FitplanError
from fitplan.inputs import scenario as sc
from fitplan.inputs.precision import PRESETS

OBJECTIVES = ("cost", "time", "gpus")
MARKETS = ("on_demand", "spot")
ATTN_PREFERENCE = ("sdpa", "flash_attention_2", "eager")
GPU_COUNTS = (1, 2, 4, 8)
SEARCH_PRECISIONS = ("bf16-mixed", "bf16-true", "bf16-master", "16-mixed", "16-true", "16-master", "32-true")
"""The precisions searched, in order of preference (16-bit first)."""


@attrs.frozen
class SearchSpace:
    """What the recommender may choose. ``None`` for gpus / providers / optimizers: every one known."""

    methods: tuple[str, ...] = sc.METHODS
    precisions: tuple[str, ...] = SEARCH_PRECISIONS
    optimizers: tuple[str, ...] | None = None
    checkpointing: tuple[bool, ...] = (False, True)
    attn_implementations: tuple[str, ...] = ATTN_PREFERENCE
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    offload_optimizer: tuple[bool, ...] = (False, True)
    offload_params: tuple[bool, ...] = (False, True)
    gpus: tuple[str, ...] | None = None
    providers: tuple[str, ...] | None = None
    gpu_counts: tuple[int, ...] = GPU_COUNTS
    num_nodes: tuple[int, ...] = (1, 2)
    max_gpus: int = 16
    effective_batch_size: int = 16
    micro_batch_size: int | None = None
    accumulation_steps: int | None = None
    markets: tuple[str, ...] = MARKETS


def narrowed(space: SearchSpace, flat: dict[str, Any], fixed: set[str], rules: Any) -> SearchSpace:
    """``space`` with the fields the user fixed (``fixed``, values in ``flat``) reduced to their value."""
    changes: dict[str, Any] = {}
    for name, attr in (("zero_stage", "zero_stages"), ("offload_optimizer", "offload_optimizer"),
                       ("offload_params", "offload_params"), ("provider", "providers"), ("num_gpus", "gpu_counts"),
                       ("num_nodes", "num_nodes")):
        if name in fixed:
            changes[attr] = (flat[name],)
    if "gpu" in fixed:
        changes["gpus"] = (rules.gpu(flat["gpu"]).id,)
    if "per_device_train_batch_size" in fixed:
        changes["micro_batch_size"] = flat["per_device_train_batch_size"]
    if "gradient_accumulation_steps" in fixed:
        changes["accumulation_steps"] = flat["gradient_accumulation_steps"]
    return attrs.evolve(space, **changes) if changes else space


def parse_headroom(text: str | float) -> tuple[float, int]:
    """``--headroom``: a fraction of usable memory (``0.1``, ``10%``) or bytes (``2GB``, ``1.5GiB``).
    Returns ``(fraction, bytes)``; one of them is 0."""
    s = str(text).strip()
    try:
        if len(s) > 40:
            raise ValueError(s)
        if s.endswith("%"):
            f = float(s[:-1]) / 100
        elif s.lower().endswith(("gib", "gb")):
            gib = s.lower().endswith("gib")
            unit = 2**30 if gib else 1e9
            amount = float(s[:-3] if gib else s[:-2])
            if not 0 <= amount <= 2**44 / unit:  # NaN and infinity too
                raise FitplanError(f"headroom must be between 0 and 16 TiB, got {text!r}", field="--headroom", value=text)
            return 0.0, int(amount * unit)
        else:
            f = float(s)
    except ValueError:
        raise FitplanError(f"cannot read headroom {text!r:.40}", field="--headroom", value=s[:40],
                           suggestion="a fraction of usable memory (0.1 or 10%) or an amount (2GB, 1.5GiB)") from None
    if not 0 <= f < 1:
        raise FitplanError(f"headroom fraction must be in [0, 1), got {f:g}", field="--headroom", value=text,
                           suggestion="0.05 keeps 5 % of the GPU free")
    return f, 0


def hardware_options(rules, space: SearchSpace, fixed: dict[str, Any], needs_price: bool) -> dict[tuple[int, int], list[tuple[Any, list[tuple[str | None, tuple[str, ...]]]]]]:
    """(GPUs per node, nodes) -> [(GPU, [(provider, markets with a price)])], respecting instance shapes."""
    from fitplan.rulesets.pricing import choose_instance, instances_for

    gpu_ids = space.gpus if space.gpus is not None else tuple(sorted({i.gpu for i in rules.instances.values()}))
    out: dict[tuple[int, int], list] = {}
    for gid in gpu_ids:
        g = rules.gpu(gid)
        providers = sorted({p for (p, _, _), i in rules.instances.items() if i.gpu == g.id})
        if space.providers is not None:
            providers = [p for p in providers if p in space.providers]
        else:  # reference tables (the seed chapter's prices) are compared only when named
            providers = [p for p in providers if not rules.provider(p).reference]
        shapes: list[tuple[str | None, int]] = [(p, max(i.gpus for i in instances_for(rules, p, g.id))) for p in providers]
        if not shapes and space.gpus is not None and not needs_price:
            shapes = [(None, g.gpus_per_node)]  # a GPU named by the user without a price: time and memory only
        for p, largest in shapes:
            for n in space.gpu_counts:
                if n > min(largest, g.gpus_per_node):
                    continue
                for m in space.num_nodes:
                    if m > 1 and n != largest or n * m > space.max_gpus:
                        continue
                    markets: tuple[str, ...] = ()
                    if p is not None:
                        try:
                            inst = choose_instance(rules, p, g.id, n, m, fixed.get("instance"), fixed.get("region"))
                        except FitplanError:
                            continue  # --instance / --region name another GPU's shape
                        markets = tuple(mk for mk in space.markets if mk == "on_demand" or inst.spot_per_hour is not None)
                        if not markets:
                            continue
                    entry = out.setdefault((n, m), [])
                    for eg, plist in entry:
                        if eg is g:
                            plist.append((p, markets))
                            break
                    else:
                        entry.append((g, [(p, markets)]))
    return out


def batch_options(space: SearchSpace, dp: int) -> list[tuple[int, int]]:
    """(micro-batch, accumulation) pairs with ``b·k·dp = effective batch``: k > 1 ones by ascending b, then k = 1."""
    b_fixed, k_fixed = space.micro_batch_size, space.accumulation_steps
    if b_fixed is not None and k_fixed is not None:
        return [(b_fixed, k_fixed)]
    E = space.effective_batch_size
    if E % dp:
        return []
    per = E // dp
    if b_fixed is not None:
        return [(b_fixed, per // b_fixed)] if per % b_fixed == 0 else []
    if k_fixed is not None:
        return [(per // k_fixed, k_fixed)] if per % k_fixed == 0 else []
    divisors = [b for b in range(1, per + 1) if per % b == 0]
    return [(b, per // b) for b in divisors if per // b > 1] + [(per, 1)]


def shard_options(space: SearchSpace, dp: int, precision: str, fsdp: str | None) -> list[tuple[int, bool, bool]]:
    if fsdp:
        return [(0, False, False)] if 0 in space.zero_stages and False in space.offload_optimizer else []
    if dp == 1:
        combos = [(0, False, False), (2, True, False), (3, True, True)]
    else:
        combos = [(0, False, False), (1, False, False), (2, False, False), (3, False, False),
                  (1, True, False), (2, True, False), (3, True, False), (3, True, True), (3, False, True)]
    out = []
    for z, oo, op in combos:
        if z not in space.zero_stages or oo not in space.offload_optimizer or op not in space.offload_params:
            continue
        deepspeed = z >= 1 or oo or op
        if deepspeed and not PRESETS[precision].deepspeed:
            continue
        out.append((z, oo, op))
    return out


def gpu_allows(g, precision: str, attn: str) -> bool:
    """Whether GPU ``g`` runs ``precision`` with kernel ``attn`` (and the combination is worth searching)."""
    bf16 = "bf16" in g.peak_tflops
    compute = PRESETS[precision].compute_dtype
    if compute == "bf16" and not bf16:
        return False
    if compute == "fp16" and bf16:
        return False  # on a bf16 GPU an fp16 preset equals its bf16 twin in memory, time and cost
    if attn == "flash_attention_2" and (not bf16 or compute == "fp32"):
        return False
    return True


