"""What the recommender may choose, and the options it enumerates from it.

The search space (:class:`SearchSpace`) narrowed by the fields the user fixed; the hardware options
respecting instance shapes (a node is at most the largest instance the provider rents with that GPU, and
several nodes are whole such instances; an instance stating no network is never combined with another);
micro-batch × accumulation for the effective batch; the ZeRO and offload combinations a precision allows
(the HF ``bf16``/``fp16`` flag's pairing: autocast without DeepSpeed, DeepSpeed's 16-bit optimizer under
it); the precisions and kernels a GPU runs.

By default only what leaves the trained model the same is searched; the dimensions that change it
(:data:`VARY_DIMENSIONS`: method, optimizer, precision) keep the scenario's value unless opened
(``SearchSpace.methods`` etc. not None: ``fitplan recommend --vary``), and then the report shows the best
plan of each value side by side, never one ranking mixing them.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from fitplan.errors import FitplanError
from fitplan.inputs import settings
from fitplan.inputs.settings import Setting
from fitplan.inputs.precision import MIXED_FOR_FLAG, PRESETS, deepspeed_twin

OBJECTIVES = ("cost", "time", "gpus")
MARKETS = ("on_demand", "spot")
ATTN_PREFERENCE = ("sdpa", "flash_attention_2", "eager")
GPU_COUNTS = (1, 2, 4, 8)
SEARCH_PRECISIONS = ("bf16-mixed", "bf16-true", "16-mixed", "16-true", "32-true")
"""The precisions ``--vary precision`` searches, in order of preference (16-bit first): one per training
semantics (a ``*-master`` preset is its ``*-mixed`` twin under DeepSpeed: :func:`precision_twins`)."""
VARY_DIMENSIONS = {"method": "methods", "optim": "optimizers", "precision": "precisions"}
"""The dimensions that change the trained model (``--vary``), and the :class:`SearchSpace` field of each."""


@attrs.frozen
class SearchSpace:
    """What the recommender may choose. ``None`` for gpus / providers: every one known. ``None`` for methods /
    precisions / optimizers: the scenario's value (the dimension is not opened); a tuple opens it with these
    values, each ranked on its own (``--vary optim`` lists
    :func:`fitplan.search.recommend.searchable_optimizers`)."""

    methods: tuple[str, ...] | None = None
    precisions: tuple[str, ...] | None = None
    optimizers: tuple[str, ...] | None = None
    checkpointing: tuple[bool, ...] = (False, True)
    attn_implementations: tuple[str, ...] = ATTN_PREFERENCE
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    offload_optimizer: tuple[bool, ...] = (False, True)
    settings: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """``(name, values)`` of plugin settings searched with other values than their declaration's
    (:class:`fitplan.inputs.settings.Search`: parameter offload); the others search the declared values."""
    gpus: tuple[str, ...] | None = None
    providers: tuple[str, ...] | None = None
    gpu_counts: tuple[int, ...] = GPU_COUNTS
    num_nodes: tuple[int, ...] = (1, 2)
    max_gpus: int = 16
    effective_batch_size: int = 16
    micro_batch_size: int | None = None
    accumulation_steps: int | None = None
    markets: tuple[str, ...] = ("on_demand",)
    """On demand unless spot is asked for (``--markets spot`` or ``on_demand,spot``)."""

    def values(self, setting: Setting) -> tuple[Any, ...]:
        """The values the search tries for a plugin setting: this space's, else its declaration's."""
        return dict(self.settings).get(setting.name, setting.search.values if setting.search else (setting.default,))

    @property
    def opened(self) -> tuple[str, ...]:
        """The result-changing dimensions this space opens, in :data:`VARY_DIMENSIONS` order."""
        return tuple(d for d, attr in VARY_DIMENSIONS.items() if getattr(self, attr) is not None)


def semantics(precision: str) -> str:
    """The training semantics of a preset: a ``*-master`` preset (DeepSpeed's 16-bit optimizer: 16-bit weights,
    fp32 master weights) is the same flag's ``*-mixed`` twin elsewhere (fp32 weights, 16-bit autocast: the same
    numbers are kept in fp32); every other preset is itself (``bf16-autocast``, the ``bf16`` flag over a bf16
    checkpoint, keeps its bf16 weights: it is not ``bf16-mixed``)."""
    p = PRESETS[precision]
    return MIXED_FOR_FLAG[p.hf_flag] if p.master else precision


def precision_twins(precision: str) -> tuple[str, ...]:
    """The presets a plan of semantics ``precision`` (:func:`semantics`) runs: the preset and its DeepSpeed twin
    (:func:`fitplan.inputs.precision.deepspeed_twin`: ``bf16-autocast`` and ``bf16-master``; the stack picks one:
    :func:`shard_options`), ``(mixed, master)`` for a ``*-master`` preset, else ``(precision,)``."""
    p = PRESETS[precision]
    if p.master:
        return (MIXED_FOR_FLAG[p.hf_flag], precision)
    twin = deepspeed_twin(precision)
    return (precision, twin) if twin != precision else (precision,)


def narrowed(space: SearchSpace, flat: dict[str, Any], fixed: set[str], rules: Any) -> SearchSpace:
    """``space`` with the fields the user fixed (``fixed``, values in ``flat``) reduced to their value."""
    changes: dict[str, Any] = {}
    for name, attr in (("zero_stage", "zero_stages"), ("offload_optimizer", "offload_optimizer"),
                       ("provider", "providers"), ("num_gpus", "gpu_counts"), ("num_nodes", "num_nodes")):
        if name in fixed:
            changes[attr] = (flat[name],)
    mine = [(s.name, (flat[s.name],)) for s in settings.declared().values() if s.search is not None and s.name in fixed]
    if mine:
        changes["settings"] = tuple({**dict(space.settings), **dict(mine)}.items())
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


Offer = tuple[str | None, str | None, tuple[str, ...], int | None, int]
"""``(provider, instance, markets with a price, host RAM of one instance in bytes or None when the instance
states none, GPUs per instance)``: ``instance`` is the ``--instance`` the plan sets (None: the estimate's own
choice, the cheapest per hour)."""


def hardware_options(rules, space: SearchSpace, fixed: dict[str, Any], needs_price: bool,
                     unnetworked: set[str] | None = None) -> dict[tuple[int, int], list[tuple[Any, list[Offer]]]]:
    """(GPUs per node, nodes) -> [(GPU, [offers])], respecting instance shapes: one offer per provider and
    instance topology (:func:`fitplan.rulesets.pricing.instance_shapes`), so that the job's cost, network
    time included, picks the shape. A shape of several instances whose instance states no ``network_gbps`` is
    left out (its name added to ``unnetworked``): the time between instances would be an assumption."""
    from fitplan.rulesets.pricing import instances_for

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
                    offers = (_offers(rules, space, fixed, p, g.id, n, m, unnetworked) if p is not None
                              else [(None, None, (), None, n)])
                    if not offers:
                        continue
                    entry = out.setdefault((n, m), [])
                    for eg, plist in entry:
                        if eg is g:
                            plist.extend(offers)
                            break
                    else:
                        entry.append((g, list(offers)))
    return out


def _offers(rules, space: SearchSpace, fixed: dict[str, Any], p: str, gid: str, n: int, m: int,
            unnetworked: set[str] | None) -> list[Offer]:
    """Provider ``p``'s offers of ``n`` × ``m`` GPUs ``gid``: one per instance topology, with its priced markets,
    its host RAM and GPUs per instance; none of several instances that state no network."""
    from fitplan.rulesets.pricing import instance_shapes

    try:
        shapes = instance_shapes(rules, p, gid, n, m, fixed.get("instance"), fixed.get("region"))
    except FitplanError:
        return []  # --instance / --region name another GPU's shape
    out: list[Offer] = []
    for inst_id, plan in shapes:
        if plan.count > 1 and plan.instance.network_gbps is None:
            if unnetworked is not None:
                unnetworked.add(f"{p}/{plan.instance.id}")
            continue
        markets = tuple(mk for mk in space.markets if mk == "on_demand" or plan.spot_per_hour is not None)
        if markets:
            ram = plan.instance.host_memory_gib
            out.append((p, inst_id, markets, None if ram is None else int(ram * 2**30), plan.instance.gpus))
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


def shard_options(space: SearchSpace, dp: int, precision: str, fsdp: str | None) -> list[dict[str, Any]]:
    """The ZeRO stage, optimizer offload and shard-level plugin settings (:func:`fitplan.inputs.settings.searched`)
    for ``dp`` data-parallel GPUs, each option a dict of their values. DeepSpeed (any stage or offload; a setting
    whose ``Search.stack`` is ``deepspeed`` at another value than its first) runs fp32 or its 16-bit optimizer
    (``*-master``); a ``*-master`` preset is searched only under DeepSpeed, its ``*-mixed`` twin only without (the
    HF flag's pairing: :func:`semantics`). Under FSDP (``fsdp``) no DeepSpeed option is tried. An option is
    searched only where every setting's ``Search.allowed`` holds (parameter offload: ZeRO-3)."""
    mine = settings.searched("shard")
    first = {s.name: s.search.values[0] for s in mine}
    if fsdp:
        combos = [(0, False)]
    elif dp == 1:
        combos = [(0, False), (2, True), (3, True)]
    else:
        combos = [(0, False), (1, False), (2, False), (3, False), (1, True), (2, True), (3, True)]
    preset = PRESETS[precision]
    out = []
    for z, oo in combos:
        if z not in space.zero_stages or oo not in space.offload_optimizer:
            continue
        tried = [(first[s.name],) if fsdp and s.search.stack == "deepspeed" else space.values(s) for s in mine]
        for values in itertools.product(*tried):
            option = {"zero_stage": z, "offload_optimizer": oo, **dict(zip(first, values))}
            if not all(s.search.allowed({**option, "data_parallel": dp}) for s in mine):
                continue
            deepspeed = z >= 1 or oo or any(s.search.stack == "deepspeed" and option[s.name] != first[s.name] for s in mine)
            if deepspeed and not preset.deepspeed or preset.master and not deepspeed:
                continue
            out.append(option)
    return out


def simplicity_of(option: dict[str, Any]) -> int:
    """How far a shard option is from the simplest: offloading the optimizer counts 1, each plugin setting its
    ``Search.weight`` per step away from its first value (parameter offload: 2)."""
    return option["offload_optimizer"] + sum(s.search.weight * s.search.values.index(option[s.name])
                                             for s in settings.searched("shard"))


def gpu_allows(g, precision: str, attn: str, *, precision_opened: bool = False) -> bool:
    """Whether GPU ``g`` runs ``precision`` with kernel ``attn`` (and the combination is worth searching). An fp16
    preset is skipped on a bf16 GPU only when ``--vary precision`` searches both (there it equals its bf16 twin in
    memory, time and cost); the user's own fp16 training (an fp16 checkpoint, ``--fp16``) runs on every GPU."""
    bf16 = "bf16" in g.peak_tflops
    compute = PRESETS[precision].compute_dtype
    if compute == "bf16" and not bf16:
        return False
    if compute == "fp16" and bf16 and precision_opened:
        return False
    if attn == "flash_attention_2" and (not bf16 or compute == "fp32"):
        return False
    return True


