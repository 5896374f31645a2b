"""Llama-shaped models of any depth: the capacity table's models (search/capacity.py) and the typical shape
that ``--params N`` alone is given.

A Llama-shaped model of depth L has hidden size 128·L, ``intermediate_size`` 8/3 of it rounded up to 256,
128-wide heads, full multi-head attention, a 32,000-token vocabulary and untied embeddings: L = 32 is
Llama-2-7B exactly, L = 40 is Llama-2-13B. The config starts from the catalog's Llama-2-7B entry, so its
other fields (norm epsilon, rotary base) are that model's.
"""

from __future__ import annotations

from typing import Any

import attrs

from fitplan.arch.architecture import ModelSpec, spec_from_config

REFERENCE = "llama-2-7b"
"""The catalog model whose architecture the Llama-shaped models scale (its config, depth and width changed)."""

CATALOG_LADDER = ("llama-3.2-1b", "llama-3.2-3b", "llama-2-7b", "llama-3.1-8b", "llama-2-13b", "qwen2.5-32b",
                  "llama-2-70b", "qwen2.5-72b", "llama-3.1-405b")
"""The catalog models the capacity table tries, smallest first (search/capacity.py; its report names them)."""


def llama_config(layers: int, rules) -> dict[str, Any]:
    """The Llama-shaped config of depth ``layers`` (module doc), from the catalog of ``rules`` (the loaded
    rulesets: the caller passes them, so that this layer reads no context)."""
    base = dict(rules.models[REFERENCE].config)
    h = 128 * layers
    inter = -(-(8 * h // 3) // 256) * 256
    return {**base, "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": layers, "num_key_value_heads": layers, "vocab_size": 32000,
            "max_position_embeddings": 4096, "tie_word_embeddings": False}


def llama_spec(layers: int, rules) -> ModelSpec:
    return spec_from_config(llama_config(layers, rules), name=f"llama-shaped-L{layers}")


def typical_spec(count: int, rules) -> ModelSpec:
    """``--params N`` alone: the model states from N exactly, activations, logits and the step timeline from
    a typical shape (the Llama-shaped model whose parameter count is nearest to N), family ``approximate``
    (the estimate warns). A config.json (``--model path``) gives the exact shape."""
    lo, hi = 1, 160  # the parameter count grows with depth: bisect, then take the nearer neighbour
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if llama_spec(mid, rules).param_count <= count:
            lo = mid
        else:
            hi = mid
    shape = min((llama_spec(lo, rules), llama_spec(hi, rules)), key=lambda a: abs(a.param_count - count))
    return attrs.evolve(shape, name=f"{count / 1e9:g}B params (approximate: {shape.name}, hidden {shape.hidden_size})",
                        family="approximate", bare_param_count=count)
