"""Routing as a learned file assumes it: experts whose sizes depend on which tokens the router sends them.

transformers 5's ``grouped_mm`` experts size every tensor by the k·T (token, expert) rows, whatever the router
picks, so the bundled MoE types learn without an assumption. Older MoE code loops over the experts with the
rows each one received: JetMoE's ``JetMoeTopKGating`` (modeling_jetmoe.py) counts them (``expert_size =
gates.long().sum(0).tolist()``) and ``JetMoeParallelExperts`` splits its input by those counts, one ``F.linear``
per expert. Those sizes depend on the data, so no expression over the config fits them.

The learner declares the routing instead: while it records, each router (an ``nn.Linear`` whose outputs are the
config's experts) scores token t's experts so that its j-th choice is expert ``(t·k + j) mod E``: every expert
receives k·T/E rows, rounded up for the first experts when E does not divide k·T (balanced routing, what fitplan's
FLOPs already assume, ``moe_routing``), and the file states it under ``assumed``. A loop over the experts is folded
into one repeated block (:mod:`.fold`), expert 0's, whose rows fit ``ceil_div(k·b·s, E)`` (:mod:`.fit`): the
core repeats it E times, at most E - 1 rows more than k·T. The total rows, k·T, are the routing's own, so the
saved activations summed over experts are what any routing saves; what balanced routing sets is each expert's
transient, from k·T/E rows (balanced) up to T (every token on one expert).

A router that is no ``nn.Linear`` is fixed by what it returns instead (:func:`index_routers`): DeepSeek-V4's
``DeepseekV4TopKRouter`` holds a raw ``weight`` and its ``DeepseekV4HashRouter`` looks the experts up in a
``tid2eid[input_ids]`` buffer; LongCat-Flash's ``LongcatFlashTopkRouter`` scores ``n_routed_experts +
zero_expert_num`` choices with ``F.linear`` on its ``classifier``'s weight (its forward never calls the module).
Each returns ``(logits, weights, indices)``, the top-k expert indices a ``(tokens, k)`` integer tensor (transformers
5.24 modeling_deepseek_v4.py, modeling_longcat_flash.py); the learner overwrites them with the balanced choices
``(t·k + j) mod E`` over the config's E experts. LongCat-Flash's extra choices, its identity ("zero") experts
(``LongcatFlashExperts``: ``expert_idx >= num_routed_experts`` returns its rows unchanged), then receive no row:
a choice of one costs a copy of its rows where an expert's costs its MLP, so the file counts an upper bound.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from .configrules import EXPERTS

TOP_K = ("num_experts_per_tok", "moe_top_k", "moe_topk", "top_k")
"""Config fields that hold the number of experts each token is routed to."""

ROUTING_WHY = ("each expert receives k·b·s/E (token, expert) rows, rounded up (balanced routing; the learner fixed "
               "the router's choices while recording), so the per-expert transients are the balanced ones; the "
               "saved activations, summed over the experts, do not depend on the routing; a router with choices "
               "besides the experts (identity 'zero' experts) is counted as sending every row to an expert, an "
               "upper bound")
"""What a file whose experts are sized by the routing assumes (docs/architectures.md, "What the learner assumes")."""

FORCED: dict[str, str] = {}
"""While a type is learned: the config fields of its expert count and top-k when its routers are fixed, else
empty (the file's ``assumed`` says so); ``"by": "indices"`` where the routers were fixed by the indices they
return (:func:`index_routers`)."""


def sizes_the_step(segments: dict[str, Any]) -> bool:
    """Whether the fixed routing sets sizes in the learned file: always for ``nn.Linear`` routers (JetMoE counts
    rows with ``.tolist()``), and for routers fixed by their indices where a segment runs an op whose size the data
    sets (:data:`.limits.DATA_DEPENDENT`, the experts-hit loop's ``nonzero``). transformers 5's ``grouped_mm``
    experts (Mixtral's, DeepSeek-V3's: ``@use_experts_implementation``, integrations/moe.py) size every tensor by
    the k·T rows whatever the router picks: their files state no routing."""
    from .limits import DATA_DEPENDENT

    if FORCED.get("by") != "indices":
        return bool(FORCED)
    return any(op[0] in DATA_DEPENDENT for seg in segments.values() for op in seg.get("ops", ()))


def _field(cfg: dict[str, Any], names: tuple[str, ...]) -> tuple[str, int] | None:
    from .derive import get_var

    for k in names:
        v = get_var(cfg, k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k, v
    return None


def fields(cfg: dict[str, Any]) -> tuple[str, str] | None:
    """The names of the config's expert count and top-k (top-level fields, or sizes of a nested config the learner
    varies: DBRX's ``ffn_config["moe_num_experts"]``, :data:`.derive.NESTED`), or None."""
    e, k = _field(cfg, EXPERTS + ("moe_num_experts",)), _field(cfg, TOP_K)
    return (e[0], k[0]) if e and k and k[1] <= e[1] else None


ROUTER_NAMES = ("router", "gate", "gating", "switch")
"""A router's module path holds one of these as a part (JetMoE's and DBRX's ``router.layer``, Mixtral-style
``mlp.gate``; ``gate_proj`` is an MLP's, not a router)."""


def routers(model, n_experts: int) -> list:
    """The model's ``nn.Linear`` modules with one output per expert whose path names a router (JetMoE's
    ``router.layer``): a width equal to the expert count by chance (a tiny model's 4-wide projection) is not."""
    import torch

    def named(path: str) -> bool:
        return any(part in ROUTER_NAMES or part.endswith("router") for part in path.split("."))

    return [m for path, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m.out_features == n_experts and named(path)]


def index_routers(model, n_experts: int) -> list:
    """Router modules that are no ``nn.Linear`` (a path part names a router, see :func:`routers`) and score at least
    ``n_experts`` choices: a 2-D weight of their own, or of a child ``nn.Linear``, with as many rows (DeepSeek-V4's
    routers, LongCat-Flash's ``classifier`` over experts and zero experts). What they return is fixed by
    :func:`balanced` where it holds the top-k indices."""
    import torch

    def named(path: str) -> bool:
        return any(part in ROUTER_NAMES or part.endswith("router") for part in path.split("."))

    def scores(m) -> bool:
        ws = [p for n, p in m.named_parameters() if n.count(".") <= 1 and n.endswith("weight")]
        return any(w.dim() == 2 and w.shape[0] >= n_experts for w in ws)

    return [m for path, m in model.named_modules()
            if path and not isinstance(m, torch.nn.Linear) and named(path) and scores(m)]


def _balanced_indices(idx, n_experts: int, k: int):
    """``idx``'s shape (tokens, k) with token t's j-th choice expert ``(t·k + j) mod E``."""
    import torch

    rows = idx.numel() // k
    t = torch.arange(rows, device=idx.device).unsqueeze(1) * k + torch.arange(k, device=idx.device)
    return (t % n_experts).to(idx.dtype).view(idx.shape)


def _balanced_scores(out, n_experts: int, k: int):
    """Scores of ``out``'s shape whose top k for token t are experts (t·k + j) mod E, j = 0..k-1, in that order."""
    import torch

    rows = out.numel() // n_experts
    scores = torch.full((rows, n_experts), -30.0, dtype=out.dtype, device=out.device)
    t = torch.arange(rows, device=out.device)
    for j in range(k):
        scores[t, (t * k + j) % n_experts] = float(k - j)
    return scores.view(out.shape)


@contextlib.contextmanager
def balanced(model, cfg: dict[str, Any]):
    """Fix every router's choices to balanced routing while the model runs (see the module doc); yields whether
    any router was found. The scores are written into the router's output in place, with no dispatch mode active
    and no autograd, so the recording sees the router's own ops only."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    from .derive import get_var

    names = fields(cfg)
    found = routers(model, get_var(cfg, names[0])) if names else []
    by_index = [] if found or not names else index_routers(model, get_var(cfg, names[0]))
    if not found and not by_index:
        yield False
        return
    n_experts, k = get_var(cfg, names[0]), get_var(cfg, names[1])

    def hook(module, args, out):
        if isinstance(out, torch.Tensor) and out.shape[-1] == n_experts:
            with _disable_current_modes(), torch.no_grad():
                out.detach().copy_(_balanced_scores(out, n_experts, k))
        return None

    def index_hook(module, args, out):
        for t in out if isinstance(out, tuple) else ():
            if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dim() == 2 and t.shape[-1] == k:
                with _disable_current_modes(), torch.no_grad():
                    # through ``.data``: no version bump, the router's own ``gather`` saved these indices
                    t.data.copy_(_balanced_indices(t, n_experts, k))
        return None

    handles = [m.register_forward_hook(hook) for m in found] + [m.register_forward_hook(index_hook) for m in by_index]
    try:
        yield True
    finally:
        for h in handles:
            h.remove()


def divisor_probe(base: dict[str, Any], variables: list[str], name: str, b: int, s: int, attempt, env_of,
                  fixed) -> tuple | None:
    """A probe for ``name``, a count that must divide the expert count (expert groups: DeepSeek-V3's router views
    its ``n_routed_experts`` scores as ``(n_group, n_routed_experts // n_group)`` and takes the top 2 of each group,
    modeling_deepseek_v3.py ``DeepseekV3TopkRouter``), where no value of ``name`` alone runs with the same ops: the
    experts scale with it, ``E = name' · (E / name)``, the experts per group kept. ``(cfg, env, recording)`` or None.
    The expert count keeps its own probe; the fitter (:mod:`.fit`) reads a size that changes here and in the
    experts' probe as the experts' alone when that fits."""
    from .derive import alternatives, get_var, put_var

    experts = next((e for e in EXPERTS + ("moe_num_experts",) if e in variables and e != name), None)
    g, e = get_var(base, name), get_var(base, experts) if experts else None
    if not (isinstance(g, int) and isinstance(e, int) and g > 0 and e % g == 0 and e > g):
        return None
    env0 = env_of(base, b, s)
    for alt in alternatives(name, g):
        cfg = copy.deepcopy(base)
        put_var(cfg, name, alt)
        put_var(cfg, experts, alt * (e // g))
        rec, used = attempt(cfg, b, s)
        if rec is None:
            continue
        env = env_of(used, b, s)
        if {k for k in env if env[k] != env0[k]} - set(fixed) == {name, experts}:
            DIVISORS[name] = experts
            return used, env, rec
    return None


DIVISORS: dict[str, str] = {}
"""``count -> expert count`` for the counts :func:`divisor_probe` probed in the current learning (cleared with
``relations.PRODUCTS``)."""


def keep_divisors(cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` (a joint probe: every variable changed at once) with each expert count of :data:`DIVISORS` raised to
    the next multiple of its group count, at least as many experts per group as ``base`` has (the router takes the
    top 2 of each group)."""
    from .derive import get_var, put_var

    for name, experts in DIVISORS.items():
        g, e, g0, e0 = (get_var(c, k) for c in (cfg, base) for k in (name, experts))
        if all(isinstance(v, int) and v > 0 for v in (g, e, g0, e0)) and e0 % g0 == 0:
            put_var(cfg, experts, g * max(e0 // g0, -(-e // g)))
    return cfg


def refuse_held_experts(held: dict[str, Any]) -> None:
    """Refuse a model whose expert count, with the routers fixed to balanced routing, cannot change without changing
    the recorded ops: its experts run in a Python loop the learner does not fold into one repeated block (DBRX's
    ``for expert_idx in expert_hit``, each expert's rows taken with ``torch.where`` and added back with
    ``index_add_``, transformers 5.24 modeling_dbrx.py ``DbrxExperts.forward``). Each expert's rows then differ by
    its index under balanced routing (expert j: ``ceil_div(k·b·s - j, E)``), so no file with the count held would
    reproduce a run (:mod:`.fold` folds a split whose blocks a list op gathers, not blocks that accumulate in place)."""
    from .derive import LearnError

    name = FORCED.get("experts")
    if name in held:
        raise LearnError(f"the expert count {name} = {held[name]} cannot vary without changing the recorded ops: the "
                         "experts run in a Python loop (one block per expert hit, adding its rows back in place) that "
                         "the learner does not fold into one repeated block yet")
