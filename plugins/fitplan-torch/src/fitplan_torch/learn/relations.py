"""A product of two sizes that the model needs equal to a third: probed together, never held.

Some models read one width where another is meant: Helium's output projection is ``Linear(hidden_size,
hidden_size)`` after attention that is ``num_attention_heads * head_dim`` wide (transformers 5.24
modeling_helium.py ``HeliumAttention``), so the model runs only where ``hidden_size == num_attention_heads *
head_dim``. A probe that changes one of the three alone does not run, each is held at the value the learning
recorded (the GQA regime's 12 heads × 16 = 192), and the file refuses every other config, the user's own
included.

Where a variable has no probe of its own, :func:`coupled_probe` tries it as a factor of such a product (a relation
``x == y * z`` among the variables that the base config keeps): ``y`` changes and ``x`` with it. ``x`` is then no
variable of its own: its widths fit as ``y * z`` over the factors' probes, :data:`PRODUCTS` keeps it out of the held
sizes, and the learned file reads it (the spec's ``hidden_size``) and checks the relation (:func:`product_checks`).
"""

from __future__ import annotations

import copy
from typing import Any

PRODUCTS: dict[str, tuple[str, str]] = {}
"""``x -> (y, z)``: the products found by the current learning (cleared with ``derive.FOLLOWERS``)."""


def relations(base: dict[str, Any], variables: list[str], name: str) -> list[tuple[str, str]]:
    """``(x, z)`` for every ``x == name * z`` among ``variables`` in ``base`` (integers, ``x`` neither factor)."""
    from .derive import get_var

    vals = {v: get_var(base, v) for v in variables}
    ints = {v: x for v, x in vals.items() if isinstance(x, int) and not isinstance(x, bool) and x > 1}
    y = ints.get(name)
    if y is None:
        return []
    return [(x, z) for x in ints for z in ints
            if len({x, z, name}) == 3 and ints[x] == y * ints[z]]


def coupled_probe(base: dict[str, Any], variables: list[str], name: str, b: int, s: int, attempt, env_of,
                  fixed) -> tuple | None:
    """A probe where ``name`` changes and a product ``x = name * z`` follows it (module doc): ``(cfg, env,
    recording)`` or None. ``attempt(cfg, b, s)`` records a candidate as ``make_probes`` does."""
    from .derive import alternatives, get_var, put_var

    env0 = env_of(base, b, s)
    known = [(x, z if y == name else y) for x, (y, z) in PRODUCTS.items()
             if name in (y, z) and holds(base, x)]  # another regime's
    for x, z in dict.fromkeys(known + relations(base, variables, name)):
        for alt in alternatives(name, get_var(base, name)):
            cfg = copy.deepcopy(base)
            put_var(cfg, name, alt)
            put_var(cfg, x, alt * get_var(base, z))
            rec, used = attempt(cfg, b, s)
            if rec is None or _runs_apart(cfg, x) or not _holds_again(base, x, name, z):
                continue
            env = env_of(used, b, s)
            changed = {k for k in env if env[k] != env0[k]} - set(fixed)
            if changed - {x} == {name}:  # x is no probe variable where this regime reuses segments
                PRODUCTS.setdefault(x, (name, z))
                return used, env, rec
    return None


def _runs_apart(cfg: dict[str, Any], x: str) -> bool:
    """Whether the model also runs (one bf16 step, any ops) with ``x`` twice the product: then it needs no
    equality, only a bound or a divisibility (CodeGen runs wherever ``n_embd // n_head >= rotary_dim``; at
    equality it only records other ops, a regime), and ``x`` stays a size of its own."""
    from .derive import get_var, put_var
    from .shrink_run import run_error

    apart = copy.deepcopy(cfg)
    put_var(apart, x, 2 * get_var(cfg, x))
    return run_error(apart) is None


def _holds_again(base: dict[str, Any], x: str, y: str, z: str) -> bool:
    """Whether ``x == y * z`` is a relation, not a coincidence of the shrunk widths: the model also runs with
    the other factor ``z`` changed and ``x`` following it (``y`` as in ``base``). Mamba-2 needs ``hidden_size *
    expand == num_heads * head_dim`` (transformers/models/mamba2/modeling_mamba2.py ``Mamba2Mixer``: the
    ``in_proj`` split); shrunk to 64 wide, 8 heads of 16 and 8 groups, ``hidden_size == num_heads * n_groups``
    holds by chance and doubling ``num_heads`` with ``hidden_size`` runs, but doubling ``n_groups`` with it does
    not: taken for a relation, the joint probes kept ``hidden_size`` at ``num_heads * n_groups``."""
    from .derive import alternatives, get_var, put_var
    from .shrink_run import run_error

    for alt in alternatives(z, get_var(base, z))[:3]:
        cfg = copy.deepcopy(base)
        put_var(cfg, z, alt)
        put_var(cfg, x, get_var(base, y) * alt)
        if run_error(cfg) is None:
            return True
    return False


def holds(base: dict[str, Any], x: str) -> bool:
    """Whether product ``x`` of :data:`PRODUCTS` holds in ``base`` (a learning's own products, not a stale one)."""
    from .derive import get_var

    y, z = PRODUCTS[x]
    vals = [get_var(base, k) for k in (x, y, z)]
    return all(isinstance(v, int) for v in vals) and vals[0] == vals[1] * vals[2]


def keep_products(cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with every product of :data:`PRODUCTS` that ``base`` keeps set from its factors (a joint probe
    changes the factors)."""
    from .derive import get_var, put_var

    for x, (y, z) in PRODUCTS.items():
        if holds(base, x) and isinstance(get_var(cfg, y), int) and isinstance(get_var(cfg, z), int):
            put_var(cfg, x, get_var(cfg, y) * get_var(cfg, z))
    return cfg


def product_checks(fields) -> list[list[str]]:
    """``[x == y*z, x, message]`` for each product whose three fields the file reads."""
    return [[f"{x} == {y}*{z}", x, f"{x} must equal {y} * {z} (the model reads one width for the other)"]
            for x, (y, z) in PRODUCTS.items() if {x, y, z} <= set(fields)]
