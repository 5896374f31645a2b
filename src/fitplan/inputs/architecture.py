"""Model architectures from Hugging Face ``config.json`` fields, with exact parameter tensors.

fitplan reads ``config.json`` itself (no transformers). A :class:`ModelSpec` normalises the
field names that differ between families (``n_embd`` vs ``hidden_size``) and lists the model's
parameter tensors (:meth:`ModelSpec.param_groups`), from which parameter counts, LoRA targets,
Adafactor's factored states and per-tensor optimizer scalars all follow.

Families (``family``) and the HF ``model_type`` values they cover:

- ``llama``: llama, mistral, qwen2, gemma, gemma2, mixtral, qwen2_moe, qwen3, olmo and other
  RMSNorm / rotary / gated-MLP decoders (GQA via ``num_key_value_heads``, MoE via ``num_local_experts``).
  qwen3 adds a per-head RMSNorm on q and k (``q_norm``, ``k_norm``: ``head_dim`` weights each);
  olmo's LayerNorms are non-parametric (no norm weights at all).
- ``phi3``: fused ``qkv_proj`` and ``gate_up_proj``.
- ``gpt2``: learned positions, LayerNorm with bias, GELU MLP, Conv1D with biases, tied embeddings.
- ``gpt_neox``: rotary, LayerNorm with bias, fused ``query_key_value`` with bias, untied ``embed_out``.
- ``falcon``: fused ``query_key_value`` with multi-query or grouped kv, LayerNorm, GELU MLP. One
  LayerNorm per layer for the parallel attention/MLP block (falcon-7b), two for sequential blocks
  (``parallel_attn: false``, falcon-rw) and for ``new_decoder_architecture`` (``ln_attn``, ``ln_mlp``)
  unless ``num_ln_in_parallel_attn`` is 1.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from fitplan.errors import FitplanError

FAMILIES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "gemma": "llama",
    "gemma2": "llama",
    "mixtral": "llama",
    "qwen2_moe": "llama",
    "olmo": "llama",
    "phi3": "phi3",
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
    "falcon": "falcon",
}


@frozen
class ParamGroup:
    """``count`` identical parameter tensors of ``shape`` belonging to ``module`` (e.g. ``q_proj``).

    ``layer`` is true for tensors repeated in every decoder layer (counted once per layer).
    """

    name: str
    shape: tuple[int, ...]
    module: str
    count: int = 1
    layer: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def total(self) -> int:
        return self.numel * self.count

    @property
    def is_matrix(self) -> bool:
        return len(self.shape) >= 2


@frozen
class ModelSpec:
    """The architecture fields of an HF config that memory, time and cost depend on."""

    name: str
    model_type: str
    family: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norm: str = "rmsnorm"  # rmsnorm | layernorm | none (non-parametric, e.g. OLMo)
    norms_per_layer: int = 2
    qk_norm: bool = False
    """A per-head norm on queries and keys (qwen3): ``head_dim`` weights each, per layer."""
    hidden_act: str = "silu"
    gated_mlp: bool = True
    learned_positions: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    embedding_dropout: float = 0.0
    """Dropout on the embedding output (GPT-2 ``embd_pdrop``, GPT-NeoX ``hidden_dropout``)."""
    partial_rotary_factor: float = 1.0
    """Share of ``head_dim`` that rotary embeddings rotate (GPT-NeoX ``rotary_pct``, Phi ``partial_rotary_factor``)."""
    parallel_residual: bool = False
    """``x + attn(ln1(x)) + mlp(ln2(x))`` (GPT-NeoX ``use_parallel_residual``, Falcon ``parallel_attn``)."""
    source: str = ""
    bare_param_count: int | None = None
    """Set for ``--params 7B``: a count with no shapes (the seed's view of a model)."""

    @property
    def is_bare(self) -> bool:
        """Known only by a parameter count (``--params 7B``): no shapes, so no activations or logits."""
        return self.bare_param_count is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    def param_groups(self) -> tuple[ParamGroup, ...]:
        return _param_groups(self)

    @property
    def param_count(self) -> int:
        if self.bare_param_count is not None:
            return self.bare_param_count
        return _param_count(self)

    @property
    def active_param_count(self) -> int:
        """Parameters used per token (MoE: only ``num_experts_per_tok`` experts)."""
        if not self.is_moe:
            return self.param_count
        expert = sum(g.total for g in self.param_groups() if g.module.startswith("experts."))
        per_expert = expert // self.num_experts
        return self.param_count - expert + per_expert * self.num_experts_per_tok


@functools.lru_cache(maxsize=256)
def _param_count(spec: ModelSpec) -> int:
    return sum(g.total for g in spec.param_groups())


@functools.lru_cache(maxsize=256)
def _param_groups(spec: ModelSpec) -> tuple[ParamGroup, ...]:
    if spec.bare_param_count is not None:
        return (ParamGroup("params", (spec.bare_param_count,), "params"),)
    h, L, V = spec.hidden_size, spec.num_hidden_layers, spec.vocab_size
    g: list[ParamGroup] = []

    def layer(name: str, shape: tuple[int, ...], module: str, count: int = 1) -> None:
        g.append(ParamGroup(name, shape, module, count * L, True))

    def norm(name: str, module: str, per_layer: bool = True) -> None:
        if spec.norm == "none":
            return
        shapes = [("weight", (h,))] + ([("bias", (h,))] if spec.norm == "layernorm" else [])
        for suffix, shape in shapes:
            if per_layer:
                layer(f"{name}.{suffix}", shape, module)
            else:
                g.append(ParamGroup(f"{name}.{suffix}", shape, module))

    def linear(name: str, out: int, inp: int, module: str, bias: bool, count: int = 1) -> None:
        layer(f"{name}.weight", (out, inp), module, count)
        if bias:
            layer(f"{name}.bias", (out,), module, count)

    fam = spec.family
    g.append(ParamGroup("embed_tokens.weight", (V, h), "embed_tokens"))
    if spec.learned_positions:
        g.append(ParamGroup("embed_positions.weight", (spec.max_position_embeddings, h), "embed_positions"))
    q, kv = spec.q_dim, spec.kv_dim
    if fam == "llama":
        linear("self_attn.q_proj", q, h, "q_proj", spec.qkv_bias)
        linear("self_attn.k_proj", kv, h, "k_proj", spec.qkv_bias)
        linear("self_attn.v_proj", kv, h, "v_proj", spec.qkv_bias)
        linear("self_attn.o_proj", h, q, "o_proj", spec.o_bias)
        if spec.qk_norm:
            layer("self_attn.q_norm.weight", (spec.head_dim,), "norm")
            layer("self_attn.k_norm.weight", (spec.head_dim,), "norm")
    elif fam == "phi3":
        linear("self_attn.qkv_proj", q + 2 * kv, h, "qkv_proj", spec.qkv_bias)
        linear("self_attn.o_proj", h, q, "o_proj", spec.o_bias)
    elif fam == "gpt2":  # HF GPT2Attention: Conv1D c_attn and c_proj
        linear("attn.c_attn", q + 2 * kv, h, "c_attn", spec.qkv_bias)
        linear("attn.c_proj", h, q, "c_proj", spec.o_bias)
    elif fam in ("gpt_neox", "falcon"):
        linear("attn.query_key_value", q + 2 * kv, h, "query_key_value", spec.qkv_bias)
        linear("attn.dense", h, q, "dense", spec.o_bias)
    else:  # pragma: no cover - guarded by FAMILIES
        raise FitplanError(f"unsupported architecture family {fam!r}", field="model_type", value=spec.model_type)

    I = spec.intermediate_size
    if spec.is_moe:
        E, Im = spec.num_experts, spec.moe_intermediate_size or I
        layer("mlp.gate.weight", (E, h), "router")
        # transformers 5 stores the experts fused, as two 3-D parameters per layer (MixtralExperts,
        # Qwen2MoeExperts): gate_up_proj (E, 2I, h) and down_proj (E, h, I).
        layer("mlp.experts.gate_up_proj", (E, 2 * Im, h), "experts.gate_up_proj")
        layer("mlp.experts.down_proj", (E, h, Im), "experts.down_proj")
        if spec.shared_expert_intermediate_size:
            Is = spec.shared_expert_intermediate_size
            linear("mlp.shared_expert.gate_proj", Is, h, "shared_expert.gate_proj", False)
            linear("mlp.shared_expert.up_proj", Is, h, "shared_expert.up_proj", False)
            linear("mlp.shared_expert.down_proj", h, Is, "shared_expert.down_proj", False)
            layer("mlp.shared_expert_gate.weight", (1, h), "shared_expert_gate")
    elif fam == "phi3":
        linear("mlp.gate_up_proj", 2 * I, h, "gate_up_proj", spec.mlp_bias)
        linear("mlp.down_proj", h, I, "down_proj", spec.mlp_bias)
    elif spec.gated_mlp:
        linear("mlp.gate_proj", I, h, "gate_proj", spec.mlp_bias)
        linear("mlp.up_proj", I, h, "up_proj", spec.mlp_bias)
        linear("mlp.down_proj", h, I, "down_proj", spec.mlp_bias)
    else:
        up, down = ("c_fc", "c_proj") if fam == "gpt2" else ("dense_h_to_4h", "dense_4h_to_h")
        linear(f"mlp.{up}", I, h, up, spec.mlp_bias)
        linear(f"mlp.{down}", h, I, down, spec.mlp_bias)
    for i in range(spec.norms_per_layer):
        norm(f"norm{i}", "norm")
    norm("final_norm", "norm", per_layer=False)
    if not spec.tie_word_embeddings:
        g.append(ParamGroup("lm_head.weight", (V, h), "lm_head"))
    return tuple(g)


# --------------------------------------------------------------------------- reading config.json

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_ALIASES = {  # HF's attribute_map for families that use other names
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
    "n_inner": "intermediate_size",
    "num_kv_heads": "num_key_value_heads",
    "n_head_kv": "num_key_value_heads",
}


CONFIG_INTS: dict[str, int] = {
    "hidden_size": 2**20, "n_embd": 2**20, "num_hidden_layers": 100_000, "n_layer": 100_000,
    "num_attention_heads": 100_000, "n_head": 100_000, "num_key_value_heads": 100_000, "num_kv_heads": 100_000,
    "n_head_kv": 100_000, "head_dim": 2**16, "intermediate_size": 2**24, "n_inner": 2**24, "ffn_hidden_size": 2**24,
    "vocab_size": 2**28, "max_position_embeddings": 2**30, "n_positions": 2**30, "num_local_experts": 100_000,
    "num_experts": 100_000, "num_experts_per_tok": 100_000, "moe_intermediate_size": 2**24,
    "shared_expert_intermediate_size": 2**24,
}
"""Integer config fields and their largest sensible value (transformers 5 declares them ``int`` in its strict
config dataclasses: a string, a float, a boolean or null there is refused, as transformers refuses it)."""
CONFIG_FRACTIONS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                    "partial_rotary_factor", "rotary_pct")
"""Config fields that are probabilities or shares: numbers in [0, 1]."""
CONFIG_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_parallel_residual", "parallel_attn",
                "new_decoder_architecture", "multi_query", "bias")


def check_config_types(c: dict[str, Any], file: str | None) -> None:
    """The config's fields have the types and ranges transformers' config classes accept (an integer where
    ``int``, a number in [0, 1] for dropouts, a boolean for flags), else a FitplanError naming the field."""
    for key, limit in CONFIG_INTS.items():
        v = c.get(key)
        if v is None or key not in c:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise FitplanError(f"{key} must be an integer, got {v!r:.40}", file=file, field=f"$.{key}", value=v)
        if v > limit:
            raise FitplanError(f"{key} must be at most {limit:,}, got {v:,}", file=file, field=f"$.{key}", value=v)
        if v < 0 and key not in _REQUIRED:
            raise FitplanError(f"{key} must be >= 0, got {v}", file=file, field=f"$.{key}", value=v)
        if v == 0 and key in ("num_key_value_heads", "num_kv_heads", "n_head_kv", "head_dim"):
            raise FitplanError(f"{key} must be >= 1, got 0 (attention needs at least one head of one dimension)",
                               file=file, field=f"$.{key}", value=v)
    for key in CONFIG_FRACTIONS:
        v = c.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1):
            raise FitplanError(f"{key} must be a number between 0 and 1, got {v!r:.40}", file=file, field=f"$.{key}",
                               value=v)
    for key in CONFIG_BOOLS:
        v = c.get(key)
        if v is not None and not isinstance(v, bool):
            raise FitplanError(f"{key} must be true or false, got {v!r:.40}", file=file, field=f"$.{key}", value=v)


def spec_from_config(cfg: dict[str, Any], *, name: str | None = None, file: str | None = None, source: str = "") -> ModelSpec:
    """Build a :class:`ModelSpec` from the fields of an HF ``config.json``.

    :raises FitplanError: naming the file and field when a required field is missing or invalid.
    """
    if not isinstance(cfg, dict):
        raise FitplanError("a model config must be a JSON object / TOML table", file=file, value=type(cfg).__name__)
    c = dict(cfg)
    if isinstance(c.get("text_config"), dict) and "hidden_size" not in c:
        c = {**c["text_config"], "model_type": c["text_config"].get("model_type", c.get("model_type"))}
    check_config_types(c, file)
    for old, new in _ALIASES.items():
        if old in c and new not in c and c[old] is not None:
            c[new] = c[old]
    model_type = c.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise FitplanError(f"model_type must be a string, got {model_type!r}", file=file, field="$.model_type", value=model_type)
    if not model_type:
        raise FitplanError("required field missing: model_type", file=file, field="$.model_type",
                           suggestion="an HF config.json names its architecture, e.g. \"llama\"")
    family = FAMILIES.get(model_type)
    if family is None:
        from fitplan.errors import unknown

        raise unknown("model_type", model_type, FAMILIES, file=file, field="$.model_type")
    for key in _REQUIRED:
        v = c.get(key)
        if v is None:
            raise FitplanError(f"required field missing: {key}", file=file, field=f"$.{key}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FitplanError(f"{key} must be a positive integer, got {v!r}", file=file, field=f"$.{key}", value=v)
    h, heads = c["hidden_size"], c["num_attention_heads"]
    if not c.get("head_dim") and h % heads:
        raise FitplanError(f"hidden_size ({h}) is not a multiple of num_attention_heads ({heads})", file=file,
                           field="$.hidden_size", value=h, suggestion="transformers refuses this config too")
    experts = c.get("num_local_experts") or c.get("num_experts") or 0
    if c.get("num_experts_per_tok") and experts and c["num_experts_per_tok"] > experts:
        raise FitplanError(f"num_experts_per_tok ({c['num_experts_per_tok']}) exceeds the number of experts ({experts})",
                           file=file, field="$.num_experts_per_tok", value=c["num_experts_per_tok"])
    kv_heads = c.get("num_key_value_heads") or heads
    if c.get("multi_query") and not c.get("new_decoder_architecture"):
        kv_heads = 1
    head_dim = c.get("head_dim") or h // heads
    for key, v in (("num_key_value_heads", kv_heads), ("head_dim", head_dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FitplanError(f"{key} must be a positive integer, got {v!r}", file=file, field=f"$.{key}", value=v)
    if heads % kv_heads:
        raise FitplanError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})",
            file=file, field="$.num_key_value_heads", value=kv_heads,
        )
    kw: dict[str, Any] = dict(
        name=name or c.get("_name_or_path") or model_type,
        model_type=model_type,
        family=family,
        hidden_size=h,
        num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=c["vocab_size"],
        max_position_embeddings=c.get("max_position_embeddings") or 2048,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        source=source,
    )
    act = c.get("hidden_act") or c.get("activation_function") or c.get("hidden_activation") or "silu"
    kw["hidden_act"] = act
    if family == "llama":
        bias = bool(c.get("attention_bias", False))
        kw.update(qkv_bias=bias or model_type in ("qwen2", "qwen2_moe"), o_bias=bias, mlp_bias=bool(c.get("mlp_bias", False)))
        kw["norms_per_layer"] = 4 if model_type == "gemma2" else 2
        if model_type == "qwen3":
            kw["qk_norm"] = True
        if model_type == "olmo":  # OlmoLayerNorm: layer_norm without weight or bias
            kw["norm"] = "none"
        if model_type in ("gemma", "gemma2"):
            kw["tie_word_embeddings"] = bool(c.get("tie_word_embeddings", True))
        if model_type == "qwen2_moe":
            kw.update(num_experts=c.get("num_experts", 0), moe_intermediate_size=c.get("moe_intermediate_size", 0),
                      shared_expert_intermediate_size=c.get("shared_expert_intermediate_size", 0))
        elif c.get("num_local_experts"):
            kw.update(num_experts=c["num_local_experts"])
        kw["num_experts_per_tok"] = c.get("num_experts_per_tok", 0) if kw.get("num_experts") else 0
        kw["attention_dropout"] = float(c.get("attention_dropout", 0.0) or 0.0)
    elif family == "phi3":
        kw.update(attention_dropout=float(c.get("attention_dropout", 0.0) or 0.0),
                  hidden_dropout=float(c.get("resid_pdrop", 0.0) or 0.0),
                  partial_rotary_factor=float(_rope(c).get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)) or 1.0))
    elif family == "gpt2":
        kw.update(norm="layernorm", gated_mlp=False, learned_positions=True, qkv_bias=True, o_bias=True, mlp_bias=True,
                  tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
                  attention_dropout=float(c.get("attn_pdrop", 0.1)), hidden_dropout=float(c.get("resid_pdrop", 0.1)),
                  embedding_dropout=float(c.get("embd_pdrop", 0.1)))
        kw.setdefault("max_position_embeddings", c.get("n_positions", 1024))
    elif family == "gpt_neox":
        kw.update(norm="layernorm", gated_mlp=False, qkv_bias=bool(c.get("attention_bias", True)), o_bias=bool(c.get("attention_bias", True)),
                  mlp_bias=True, attention_dropout=float(c.get("attention_dropout", 0.0) or 0.0),
                  hidden_dropout=float(c.get("hidden_dropout", 0.0) or 0.0),
                  embedding_dropout=float(c.get("hidden_dropout", 0.0) or 0.0),
                  partial_rotary_factor=float(_rope(c).get("partial_rotary_factor", c.get("rotary_pct", 0.25))),
                  parallel_residual=bool(c.get("use_parallel_residual", True)))
    elif family == "falcon":
        kw.update(norm="layernorm", gated_mlp=False, qkv_bias=bool(c.get("bias", False)), o_bias=bool(c.get("bias", False)),
                  mlp_bias=bool(c.get("bias", False)), tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
                  attention_dropout=float(c.get("attention_dropout", 0.0) or 0.0),
                  hidden_dropout=float(c.get("hidden_dropout", 0.0) or 0.0))
        # HF FalconDecoderLayer: a sequential block has input + post-attention LayerNorms; a parallel
        # block has ln_attn + ln_mlp when num_ln_in_parallel_attn is 2 (the default for the new decoder
        # architecture), else a single input_layernorm.
        n_ln = c.get("num_ln_in_parallel_attn") or (2 if c.get("new_decoder_architecture") else 1)
        kw["norms_per_layer"] = 2 if not c.get("parallel_attn", True) else n_ln
        kw["parallel_residual"] = bool(c.get("parallel_attn", True))
    inter = c.get("intermediate_size") or c.get("ffn_hidden_size")
    if family in ("gpt2", "gpt_neox", "falcon") and not inter:
        inter = 4 * h
    if not inter or isinstance(inter, bool) or not isinstance(inter, int) or inter < 1:
        raise FitplanError(f"intermediate_size must be a positive integer, got {inter!r}", file=file, field="$.intermediate_size", value=inter)
    kw["intermediate_size"] = inter
    return ModelSpec(**kw)


def _rope(c: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 ``rope_parameters`` (or the older ``rope_scaling``), as a dict."""
    r = c.get("rope_parameters") or c.get("rope_scaling") or {}
    return r if isinstance(r, dict) else {}


def load_config_json(path: str | Path) -> ModelSpec:
    """Read an HF ``config.json`` from disk."""
    from fitplan.inputs.files import read_json

    p = Path(path)
    try:
        data = read_json(p)
    except FitplanError as e:
        if e.message == "file not found":
            e.suggestion = "pass a catalog name (fitplan models list) or a path to config.json"
        raise
    name = p.parent.name if p.name == "config.json" else p.stem
    return spec_from_config(data, name=name, file=str(p), source=str(p))


def bare_spec(count: int) -> ModelSpec:
    """A model known only by its parameter count (``--params 7B``)."""
    return ModelSpec(
        name=f"{count / 1e9:g}B params", model_type="bare", family="bare", hidden_size=1, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, head_dim=1, intermediate_size=1, vocab_size=1, bare_param_count=count,
    )


def spec_to_dict(spec: ModelSpec) -> dict[str, Any]:
    return attrs.asdict(spec)
