"""Which tiny value a config field gets from its name where :data:`.shrink.SMALL` does not list the field, and
which field is the layer count.

A config class names a width of a known kind in three other ways, and each left at its size made a shrunk model
far wider than its 64-wide hidden state (each learning passed 4 GB resident):

* **an alias the class declares**: its ``attribute_map`` sends a standard name to its own field
  (LongcatFlashConfig: ``moe_intermediate_size`` -> ``expert_ffn_hidden_size``, 2048; ``num_experts_per_tok`` ->
  ``moe_topk``, 12; transformers/models/longcat_flash/configuration_longcat_flash.py, 5.24): the field gets the
  standard name's tiny value;
* **a width named after its kind, with a prefix or a suffix**: ``<prefix>_<kind>`` or ``<kind>_<suffix>``
  (Inkling's sliding-window attention ``swa_num_attention_heads`` 64, ``swa_num_key_value_heads`` 16,
  ``swa_head_dim`` 128, read by modeling_inkling.py ``InklingAttention`` for its sliding layers; Llama-4's dense
  feed-forward ``intermediate_size_mlp`` 16384, modeling_llama4.py ``Llama4TextDecoderLayer``; Kimi-Linear's and
  Bailing's ``linear_head_dim``; Longcat's ``expert_ffn_hidden_size``; NemotronH's ``mamba_num_heads``);
* **a count of experts or a vocabulary under another name**: Longcat's ``zero_expert_num`` (256 identity experts
  whose rows the expert weight ``gate_up_proj`` holds: ``total_experts = n_routed_experts + zero_expert_num``,
  modeling_longcat_flash.py ``LongcatFlashExperts``: 136 M parameters in a 64-wide model); BLT's
  ``encoder_hash_byte_group_vocab`` (500002 rows per hash embedding, ``nb_functions * len(group sizes)`` of them in
  one table, modeling_blt.py ``BltModel``: the hash is taken modulo it, so any positive value runs).

The layer count cut is the field the causal LM reads (:func:`layer_count_key`), not only the usual names.

A field is only ever made smaller; a relation the smaller value breaks is repaired as every other (by the class, or
by running the model: :mod:`.shrink_run`).
"""

from __future__ import annotations

from typing import Any

KINDS = {"intermediate_size": "intermediate_size", "ffn_dim": "intermediate_size",
         "ffn_hidden_size": "intermediate_size", "num_heads": "num_heads",
         "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
         "head_dim": "head_dim"}
"""Width kinds recognised in a field's name, and the :data:`.shrink.SMALL` entry whose tiny value they get.
``hidden_size`` is not one: a second hidden width (BLT's ``hidden_size_global``) meets the first in the model."""
NOT_COUNTS = {"per", "tok", "token", "group", "groups", "layer", "layers", "interval", "freq", "step", "start",
              "end", "offset", "period", "k", "topk"}
"""Name parts that make an ``expert`` field something other than a count of experts (``num_experts_per_tok``,
``num_expert_group``, ``expert_layer_period``, ``first_k_dense_replace``)."""


def tiny_value(name: str, aliases: dict[str, str], small: dict[str, int]) -> int | None:
    """The tiny value of the field ``name`` by the rules of the module doc, or None (no rule names it).
    ``aliases`` is the class's ``attribute_map`` inverted (field -> standard name); ``small`` is SMALL."""
    if name in small:
        return small[name]
    if aliases.get(name) in small:
        return small[aliases[name]]
    for kind, std in KINDS.items():
        if name.endswith("_" + kind) or name.startswith(kind + "_"):
            return small[std]
    parts = set(name.split("_"))
    if parts & {"expert", "experts"} and parts & {"num", "n"} and not parts & NOT_COUNTS:
        return small["num_experts"]
    if "vocab" in parts:
        return small["vocab_size"]
    return None


def layer_count_key(cfg: dict[str, Any], full: dict[str, Any], usual: tuple[str, ...]) -> str | None:
    """The field holding the causal LM's layer count: the one the class reads for ``num_hidden_layers``
    (:func:`.configrules.causal_field`: Blenderbot's causal LM is its decoder, ``decoder_layers``, 24 by default,
    which none of the ``usual`` names, :data:`.shrink.LAYER_KEYS`, reaches), else the first of them the config states."""
    from .configrules import causal_field, config_class

    try:
        key = causal_field(config_class(cfg["model_type"]), "num_hidden_layers")
    except Exception:  # noqa: BLE001 - an unknown type: the usual names
        key = None
    if key is not None and isinstance(full.get(key), int) and not isinstance(full[key], bool):
        return key
    return next((k for k in usual if isinstance(full.get(k), int)), None)
