"""``fitplan recommend`` and ``GET /api/recommend``: the search space of the command's options, the search with
its estimates attached, and the ``--max`` report."""

from __future__ import annotations

from typing import Any

from fitplan.errors import FitplanError


def _csv(text: str | None, option: str, valid: tuple[str, ...] | None = None, what: str | None = None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise FitplanError(f"{option} needs at least one value", field=option, value=text)
    if valid is not None:
        from fitplan.errors import unknown

        for x in items:
            if x not in valid:
                raise unknown(what or option.lstrip("-").rstrip("s") + " in " + option, x, valid, field=option)
    return items

def search_space(opts: dict[str, Any], ctx, fixed: frozenset[str] | set[str] = frozenset()) -> Any:
    """The search space of the command's options: ``--vary`` opens the result-changing dimensions (every value),
    ``--methods`` / ``--precisions`` / ``--optims`` open theirs with the values listed; the rest is as given."""
    from fitplan.inputs import scenario as sc
    from fitplan.inputs.precision import PRECISIONS
    from fitplan.search.recommend import searchable_optimizers
    from fitplan.search.space import MARKETS, SEARCH_PRECISIONS, VARY_DIMENSIONS, SearchSpace

    rules, reg = ctx.rulesets, ctx.registry
    kw: dict[str, Any] = {}
    vary = set(_csv(opts.get("vary"), "--vary", tuple(VARY_DIMENSIONS), what="dimension in --vary") or ())
    lists = {"method": _csv(opts.get("methods"), "--methods", sc.METHODS),
             "precision": _csv(opts.get("precisions"), "--precisions", PRECISIONS),
             "optim": _csv(opts.get("optims"), "--optims")}
    if lists["optim"]:
        lists["optim"] = tuple(dict.fromkeys(reg.resolve_optimizer(o).name for o in lists["optim"]))
    every = {"method": sc.METHODS, "precision": SEARCH_PRECISIONS, "optim": searchable_optimizers(reg)}
    for dim, attr in VARY_DIMENSIONS.items():
        if dim not in vary and not lists[dim]:
            continue
        if dim in fixed:
            flag = "--" + dim
            raise FitplanError(f"the scenario fixes {dim}, and --vary {dim} (or --{attr}) would search it",
                               field=f"--vary {dim}", suggestion=f"drop {flag} (or the scenario file's {dim}) to compare "
                               f"its values side by side, or drop --vary {dim}")
        kw[attr] = lists[dim] or every[dim]
    gpus = _csv(opts["gpus"], "--gpus")
    if gpus:
        kw["gpus"] = tuple(rules.gpu(g).id for g in gpus)
    providers = _csv(opts["providers"], "--providers")
    if providers:
        kw["providers"] = tuple(rules.provider(p).id for p in providers)
    markets = _csv(opts["markets"], "--markets", MARKETS)
    if markets:
        kw["markets"] = markets
    for name, limit in (("effective_batch_size", 65_536), ("max_gpus", 4096), ("max_nodes", 512)):
        v, flag = opts[name], f"--{name.replace('_', '-')}"
        if v < 1:
            raise FitplanError(f"{flag} must be >= 1, got {v}", field=flag, value=v)
        if v > limit:
            raise FitplanError(f"{flag} must be at most {limit:,}, got {v:,}", field=flag, value=v,
                               suggestion="the search enumerates every split of the batch and every GPU count")
    kw["effective_batch_size"] = opts["effective_batch_size"]
    kw["max_gpus"] = opts["max_gpus"]
    kw["num_nodes"] = tuple(range(1, opts["max_nodes"] + 1))
    return SearchSpace(**kw)

def find_plans(built, ctx, opts: dict[str, Any], policy_files=(), progress=None):
    """Search the plans of ``built`` (:class:`~fitplan.inputs.sources.FromOptions`) with the search options
    ``opts`` (this command's, by parameter name) and attach their estimates: the report's
    :class:`~fitplan.search.plans.Result`."""
    from fitplan.rules.policy import policy_set
    from fitplan.search import recommend as rec

    space = search_space(opts, ctx, built.fixed)
    policies = policy_set(ctx.rulesets, ctx.registry, policy_files)
    result = rec.search(built.scenario, ctx, space=space, objective=opts["objective"], headroom=opts["headroom"],
                        policies=policies, top=opts["top"], fixed=built.fixed, progress=progress)
    rec.attach_estimates(result, ctx)
    return result

LARGEST = {"micro-batch": ("per_device_train_batch_size", 1 << 16), "seq-length": ("max_seq_length", 1 << 22)}
"""``--max WHAT``: the scenario field searched and the largest value probed."""

def largest_report(base, ctx, what: str, headroom: str | float, arch=None, check=None) -> dict[str, Any]:
    """``--max WHAT``'s report: the largest micro-batch or sequence length that fits ``base``'s GPU (``check``:
    :func:`fitplan.search.capacity.largest_fitting`'s)."""
    from fitplan.search.capacity import largest_fitting

    field, upper = LARGEST[what]
    return largest_fitting(base, field, ctx, headroom=headroom, upper=upper, arch=arch, check=check)
