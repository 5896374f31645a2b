"""Regimes that a size's arithmetic opens: a head count that is a power of two, or not.

ALiBi builds one slope per head from the power of two nearest the head count, and takes other ops when the count
is no power of two (transformers 5.24 modeling_bloom.py ``_get_alibi_slopes``: ``full``, ``arange``, ``pow`` and
``cat`` for the remaining heads; modeling_mpt.py ``build_mpt_alibi_tensor``: the strided halves of the slopes
concatenated and sliced). A probe changes sizes within the recorded ops only, so the learner knew one of the two
graphs, and the check at held-out sizes (a head count scaled by 5/2) ran the other.

:func:`power_of_two_heads` records the model once at 8 heads and once at 12; where the ops differ, it returns the
switch ``[heads a power of two, heads not]`` (:class:`.derive.Regime` states, under the learned file's conditions
``pow2_floor(h) == h`` and ``!=``: src/fitplan/arch/archexpr.py). The other regime's sizes are fitted with the
power-of-two forms of :mod:`.fit`.
"""

from __future__ import annotations

import re
from typing import Any

POW2, OTHER = 8, 12
"""The head counts the detection records (12: the smallest count above 8 that no power of two is and that the
GQA regime already uses)."""


def is_pow2(n: Any) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


def _kv_field(base: dict[str, Any]) -> str | None:
    return next((k for k in base if re.search(r"(key_value_heads|kv_heads|n_head_kv)$", k)
                 and isinstance(base[k], int) and not isinstance(base[k], bool)), None)


def with_heads(cfg: dict[str, Any], heads: str, hidden: str, kv: str | None, n: int) -> dict[str, Any]:
    """``cfg`` with ``n`` heads: key/value heads kept in their relation (as many as the heads, or one, or a
    divisor of ``n``), the hidden size widened to a multiple of ``16·n`` (heads of even width, as the probes keep
    them: :func:`.derive.typical`)."""
    out = {**cfg, heads: n}
    if kv and isinstance(cfg.get(kv), int):
        if cfg[kv] == cfg.get(heads):
            out[kv] = n
        elif cfg[kv] != 1 and n % cfg[kv]:
            out[kv] = next(g for g in (4, 2, 1) if n % g == 0)
    if isinstance(out.get(hidden), int) and out[hidden] % (16 * n):
        out[hidden] = 16 * n * -(-out[hidden] // (16 * n))
    return out


def power_of_two_heads(base: dict[str, Any], cls, variant: tuple[str, str], log) -> list[Any] | None:
    """The switch ``[power of two, not]`` over the head count where the two record different ops (module doc);
    None where they record the same, or the model runs at neither count."""
    from .configrules import attribute_map
    from .derive import Regime, run, signature

    amap = attribute_map(cls)
    heads = amap.get("num_attention_heads", "num_attention_heads")
    hidden = amap.get("hidden_size", "hidden_size")
    if not isinstance(base.get(heads), int) or isinstance(base.get(heads), bool):
        return None
    kv = _kv_field(base)
    try:
        sigs = [signature(run(with_heads(base, heads, hidden, kv, n), *variant, 2, 16)) for n in (POW2, OTHER)]
    except Exception:  # noqa: BLE001 - a head count this model cannot take: no such regime learned
        return None
    if sigs[0] == sigs[1]:
        return None
    log(f"  {heads}: a power of two and not record different ops (ALiBi's slopes): learned as two regimes")

    def setup_to(n_of):
        return lambda cfg, b, s: with_heads(cfg, heads, hidden, kv, n_of(cfg[heads]))

    return [Regime("heads-pow2", f"pow2_floor({heads}) == {heads}",
                   setup_to(lambda n: POW2 if not is_pow2(n) else n),
                   valid=lambda cfg, b, s: is_pow2(cfg[heads])),
            Regime("heads-other", f"pow2_floor({heads}) != {heads}",
                   setup_to(lambda n: OTHER if is_pow2(n) else n),
                   valid=lambda cfg, b, s: not is_pow2(cfg[heads]))]
