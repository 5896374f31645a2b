"""Model architectures from Hugging Face ``config.json`` fields, with exact parameter tensors.

fitplan reads ``config.json`` itself (no transformers). What a ``model_type`` means — which config
fields it reads and how (aliases such as ``n_embd``, the config class's defaults, derived values such
as ``head_dim = hidden_size // num_attention_heads``, its validity checks), which parameter tensors it
has and what one training step does — comes from the model type's learned architecture file
(``rulesets/architectures/<model_type>.json``, written by ``fitplan learn-architecture`` from the
model's own transformers code; docs/architectures.md). Nothing here depends on a particular model type.

A :class:`ModelSpec` carries the symbols the file defines (``symbols``) and the handful of standard
fields the rest of fitplan reads (hidden size, layers, heads, vocabulary, experts), and lists the
model's parameter tensors (:meth:`ModelSpec.param_groups`), from which parameter counts, LoRA targets,
Adafactor's factored states and per-tensor optimizer scalars all follow.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from fitplan.errors import FitplanError


@frozen
class ParamGroup:
    """``count`` identical parameter tensors of ``shape`` belonging to ``module``.

    ``module`` is the tensor's role as the rest of fitplan reads it (``embed_tokens``, ``embed_positions``,
    ``lm_head``, ``norm``, ``router``, ``experts.<name>``, or a Linear's short name such as ``q_proj``);
    ``path`` is the full module name (``model.layers.{i}.self_attn.q_proj``), which LoRA targets match.
    ``layer`` is true for tensors repeated in every decoder layer (counted once per layer).
    """

    name: str
    shape: tuple[int, ...]
    module: str
    count: int = 1
    layer: bool = False
    path: str = ""
    linear: tuple[int, int] | None = None
    """(in_features, out_features) when the tensor is an ``nn.Linear`` / ``Conv1D`` weight."""
    custom_linear: bool = False
    """The weight of a subclass of ``nn.Linear`` with its own forward (Falcon's ``FalconLinear``): peft adapts
    it, bitsandbytes does not quantize it (transformers' ``replace_with_bnb_linear`` takes ``type(m) is
    nn.Linear`` only)."""
    fp32: bool = False
    """The model keeps this tensor in fp32 whatever dtype it is built in (DeepSeek's router weight, created
    with ``dtype=torch.float32`` and listed in ``_keep_in_fp32_modules_strict``): the learned file's dtype
    ``f32`` from its 16-bit recording. Its gradient and its torch optimizer states are fp32 too."""
    frozen: bool = False
    """Created with ``requires_grad=False`` (the learned file's ``frozen``: AfMoE's ``expert_bias``): a weight that
    no method trains, so without gradient or optimizer states."""
    no_grad: bool = False
    """Trainable, but the training step never reads it (the learned file's ``no_grad``: the cross-attention of a
    causal LM taken from an encoder-decoder family, run without encoder states): autograd leaves its ``.grad``
    None, and torch's optimizers skip a parameter whose grad is None (torch/optim/adam.py ``Adam._init_group``,
    which AdamW inherits, adamw.py: only ``p.grad is not None`` gets a state), so it has no gradient and no
    optimizer states. DeepSpeed ZeRO still holds both in its flat partitions (stage_1_and_2.py
    ``set_none_gradients_to_zero``): its layout (builtin/sharding/params.py ``ordered``) counts every tensor."""

    @property
    def trained(self) -> bool:
        """Does the step give this tensor a gradient (and so the optimizer a state for it)?"""
        return not (self.frozen or self.no_grad)

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
    """The architecture of a model: its learned file's symbols, and the standard fields fitplan reads."""

    name: str
    model_type: str
    family: str
    """``learned`` (a learned architecture file), ``approximate`` (a parameter count with a typical shape)
    or ``bare`` (a parameter count alone)."""
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    symbols: tuple[tuple[str, Any], ...] = ()
    """The learned file's symbols, read from config.json (hashable: lists become tuples)."""
    attn_implementations: tuple[str, ...] = ()
    """The attention kernels the model's transformers code supports (its learned file); empty: any."""
    source: str = ""
    bare_param_count: int | None = None
    """Set for ``--params 7B``: a count with no shapes (the seed's view of a model)."""
    checkpoint_dtype: str | None = None
    """The dtype the config states (``dtype``, or ``torch_dtype`` before transformers 4.56) as fitplan's short
    name (``bf16``), or None when it states none (``from_pretrained(dtype="auto")`` then loads the weights' own
    dtype, which fitplan assumes is float32: :func:`config_dtype`)."""
    assumed: tuple[str, ...] = ()
    """What the learned file assumes about a switch this config sets otherwise (its ``assumed``: layerdrop 0, every
    layer runs), one sentence each, said with the estimate."""
    routing: str | None = None
    """The routing the learned file's experts are sized by (``"balanced"``: the learner fixed the routers while
    recording experts that loop over the rows each received, JetMoE's), or None where the sizes do not depend on
    it (transformers 5's ``grouped_mm`` experts) or the model has no experts."""
    kept_graphs: tuple[str, ...] = ()
    """Module attributes (``Class.attribute``) where the model keeps a tensor with autograd history past its forward
    (the learned file's ``kept_graphs``): checkpointing is refused for them (builtin/activations.py ``step_trace``)."""
    unverified: str | None = None
    """The learned file, when it was written with ``fitplan learn-architecture --no-verify`` (its ``verified`` is
    false): no fresh torch run checked it, so the figures it gives are not known exactly (builtin/confidence.py)."""

    @property
    def is_bare(self) -> bool:
        """Known only by a parameter count (``--params 7B --assumptions seed``): no shapes, so no activations
        or logits (``--params`` alone gets a typical shape, family ``approximate``)."""
        return self.family == "bare"

    @property
    def learned_positions(self) -> bool:
        """A learned position table (GPT-2's ``wpe``): the learned file lists a parameter of role ``positions``,
        so no row exists beyond ``max_position_embeddings``."""
        return not self.count_only and any(g.module == "embed_positions" for g in self.param_groups())

    @property
    def count_only(self) -> bool:
        """The user gave only a parameter count (``--params``): bare, or with a typical shape for memory
        (family ``approximate``). The time model uses the count as is (6·N, no attention term)."""
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
    def fp32_param_count(self) -> int:
        """Parameters the model keeps in fp32 even when built in a 16-bit dtype (:attr:`ParamGroup.fp32`)."""
        return 0 if self.bare_param_count is not None else _fp32_param_count(self)

    @property
    def frozen_fp32_param_count(self) -> int:
        """The fp32-kept parameters that no method trains (:attr:`ParamGroup.frozen`): no fp32 gradient."""
        if self.bare_param_count is not None:
            return 0
        return sum(g.total for g in self.param_groups() if g.fp32 and not g.trained)

    @property
    def no_grad_params(self) -> tuple[int, tuple[str, ...]]:
        """The parameters the step leaves without a gradient (:attr:`ParamGroup.no_grad`): how many, and the
        modules that hold them (``model.decoder.layers.{i}.encoder_attn.*``)."""
        if self.count_only:
            return 0, ()
        groups = self.param_groups()
        idle = [g for g in groups if g.no_grad]
        used = [g.name for g in groups if not g.no_grad]
        return sum(g.total for g in idle), tuple(dict.fromkeys(_module_pattern(g.name, used) for g in idle))

    @property
    def active_param_count(self) -> int:
        """Parameters used per token (MoE: only ``num_experts_per_tok`` experts)."""
        if not self.is_moe:
            return self.param_count
        expert = sum(g.total for g in self.param_groups() if g.module.startswith("experts."))
        per_expert = expert // self.num_experts
        return self.param_count - expert + per_expert * self.num_experts_per_tok


def _module_pattern(name: str, used: list[str]) -> str:
    """The outermost module that holds parameter ``name`` and none of the ``used`` ones, as a pattern
    (``model.decoder.layers.{i}.encoder_attn.*``); ``name`` itself when every module above it holds a used one."""
    parts = name.split(".")
    for k in range(1, len(parts)):
        prefix = ".".join(parts[:k])
        if parts[k - 1] != "{i}" and not any(u.startswith(prefix + ".") for u in used):
            return prefix + ".*"
    return name


@functools.lru_cache(maxsize=256)
def _param_count(spec: ModelSpec) -> int:
    return sum(g.total for g in spec.param_groups())


@functools.lru_cache(maxsize=256)
def _fp32_param_count(spec: ModelSpec) -> int:
    return sum(g.total for g in spec.param_groups() if g.fp32)


def clear_caches() -> None:
    """Forget the parameter groups and counts computed so far (the architecture files behind them changed)."""
    for cached in (_param_count, _fp32_param_count, _param_groups):
        cached.cache_clear()


@functools.lru_cache(maxsize=256)
def _param_groups(spec: ModelSpec) -> tuple[ParamGroup, ...]:
    if spec.bare_param_count is not None:
        return (ParamGroup("params", (spec.bare_param_count,), "params"),)
    from fitplan.arch.archfile import load

    af = load(spec.model_type)
    env = dict(spec.symbols)
    groups: dict[tuple[str, tuple[int, ...]], list[Any]] = {}
    frozen = set(af.data.get("frozen") or ())
    idle = idle_params(af, env)
    for name, shape, role, per_layer, layer, entry in af.param_list(env):
        template = entry[0]
        key = (template, shape)
        if key in groups:
            groups[key][2] += 1
            continue
        linear = None
        mark = entry[6] if len(entry) > 6 else None
        if role.startswith("linear:"):
            linear = (shape[0], shape[1]) if mark == "conv1d" else (shape[1], shape[0])
        groups[key] = [template, shape, 1, per_layer, _module(role, template), template.rsplit(".", 1)[0], linear,
                       mark == "custom", len(entry) > 5 and entry[5] == "f32", template in frozen, template in idle]
    return tuple(ParamGroup(t, shape, module, count, per_layer, path, linear, custom, fp32, fz, ng)
                 for t, shape, count, per_layer, module, path, linear, custom, fp32, fz, ng in groups.values())


def idle_params(af, env: dict[str, Any]) -> set[str]:
    """The file's ``no_grad`` names at this config: a parameter tied to another here is one tensor with it, which
    gets a gradient if either is read (BigBird's ``cls.predictions.bias``, unread apart from the head's
    ``decoder.bias``, is that bias itself when ``tie_word_embeddings`` holds)."""
    idle = set(af.data.get("no_grad") or ())
    for name, target in af.tie(env).items():
        if (name in idle) != (target in idle):
            idle -= {name, target}
    return idle


def sequence_classifier(spec: ModelSpec) -> ModelSpec:
    """``spec`` as ``AutoModelForSequenceClassification`` with ``num_labels=1`` loads it (TRL's reward model):
    the learned file's parameters with ``score`` in place of the LM head (arch/archfile.py ``SCORE_HEAD``)."""
    from fitplan.arch.archfile import SCORE_HEAD

    return attrs.evolve(spec, symbols=tuple(spec.symbols) + ((SCORE_HEAD, True),))


def _module(role: str, name: str) -> str:
    kind, _, short = role.partition(":")
    if kind == "linear":
        return short or name.rsplit(".", 2)[-2]
    if kind == "experts":
        return "experts." + (short or name.rsplit(".", 1)[-1])
    return {"embedding": "embed_tokens", "positions": "embed_positions", "output": "lm_head"}.get(kind, kind)


# --------------------------------------------------------------------------- reading config.json


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
_POSITIVE = ("hidden_size", "n_embd", "num_hidden_layers", "n_layer", "num_attention_heads", "n_head", "vocab_size")
"""Sizes no config class accepts as 0: a model has width, depth, heads and a vocabulary."""
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
        if v < 1 and key in _POSITIVE:
            raise FitplanError(f"{key} must be a positive integer, got {v}", file=file, field=f"$.{key}", value=v)
        if v < 0:
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


DECODER_CONFIG_KEYS = ("decoder", "generator", "text_config")
"""Where a composite config keeps its text-output part: the names ``PreTrainedConfig.get_text_config(decoder=True)``
searches (transformers/configuration_utils.py, 5.24): a multimodal type's ``text_config``, MusicGen's ``decoder``
(the config ``MusicgenForCausalLM`` takes, ``MusicgenDecoderConfig``)."""


def decoder_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The part of a composite ``config.json`` its causal LM is built from: with no ``hidden_size`` of its own and
    exactly one of :data:`DECODER_CONFIG_KEYS` set to an object (transformers refuses more than one as ambiguous),
    that object under its own ``model_type`` (the outer one where it names none); any other config as given."""
    found = [k for k in DECODER_CONFIG_KEYS if isinstance(cfg.get(k), dict)]
    if "hidden_size" in cfg or len(found) != 1:
        return dict(cfg)
    inner = cfg[found[0]]
    return {**inner, "model_type": inner.get("model_type") or cfg.get("model_type")}


def spec_from_config(cfg: dict[str, Any], *, name: str | None = None, file: str | None = None, source: str = "") -> ModelSpec:
    """Build a :class:`ModelSpec` from the fields of an HF ``config.json``, through the learned
    architecture file of its ``model_type``.

    :raises FitplanError: naming the file and field when a required field is missing or invalid, or when
        no learned file describes the ``model_type`` (with the command that learns it).
    """
    from fitplan.arch.archfile import load, unknown_model_type

    if not isinstance(cfg, dict):
        raise FitplanError("a model config must be a JSON object / TOML table", file=file, value=type(cfg).__name__)
    c = decoder_config(cfg)
    model_type = c.get("model_type")
    check_config_types(c, file)
    if model_type is not None and not isinstance(model_type, str):
        raise FitplanError(f"model_type must be a string, got {model_type!r}", file=file, field="$.model_type", value=model_type)
    if not model_type:
        raise FitplanError("required field missing: model_type", file=file, field="$.model_type",
                           suggestion="an HF config.json names its architecture, e.g. the model_type of its family")
    try:
        af = load(model_type)
    except FitplanError as e:
        if "unknown model_type" in e.message:
            raise unknown_model_type(model_type, file=file) from None
        raise
    env = af.symbols(c, file=file)
    af.check_flags(env, file)  # a switch value no learned combination states (would count no parameter)
    std = {}
    for key, expr in af.spec_map.items():
        from fitplan.arch.archexpr import compile_expr

        std[key] = compile_expr(expr)(env) if isinstance(expr, str) else expr
    _check_routing(std, af.spec_map, file)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "vocab_size"):
        if not isinstance(std.get(key), int) or isinstance(std.get(key), bool):  # null in config.json, as transformers refuses
            field = af.spec_map.get(key)
            field = field if isinstance(field, str) and field.isidentifier() else key
            raise FitplanError(f"{field} must be an integer, got {std.get(key)!r}", file=file, field=f"$.{field}",
                               value=std.get(key))
    spec = ModelSpec(
        name=name or c.get("_name_or_path") or model_type,
        model_type=model_type,
        family="learned",
        hidden_size=int(std["hidden_size"]),
        num_hidden_layers=int(std["num_hidden_layers"]),
        num_attention_heads=int(std["num_attention_heads"]),
        num_key_value_heads=int(std.get("num_key_value_heads") or std["num_attention_heads"]),
        head_dim=int(std["head_dim"]),
        intermediate_size=int(std.get("intermediate_size") or 0),
        vocab_size=int(std["vocab_size"]),
        max_position_embeddings=int(std.get("max_position_embeddings") or _field(c, af, "max_position_embeddings") or 2048),
        tie_word_embeddings=bool(std.get("tie_word_embeddings", False)),
        num_experts=int(std.get("num_experts") or 0),
        num_experts_per_tok=int(std.get("num_experts_per_tok") or 0) if std.get("num_experts") else 0,
        moe_intermediate_size=int(std.get("moe_intermediate_size") or 0),
        symbols=tuple(sorted((k, _hashable(v)) for k, v in env.items())),
        attn_implementations=tuple(af.data.get("attn_implementations") or ()),
        source=source,
        checkpoint_dtype=config_dtype(c, file),
        unverified=str(af.path) if af.data.get("verified") is False else None,
        assumed=assumed_statements(af, c),
        routing=((af.data.get("assumed") or {}).get("routing") or {}).get("value"),
        kept_graphs=_kept_graphs(af),
    )
    _check_size(spec, file)
    return spec


def _kept_graphs(af) -> tuple[str, ...]:
    """The learned file's ``kept_graphs``: a list of ``Class.attribute`` strings (absent: none)."""
    v = af.data.get("kept_graphs") or []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise FitplanError("kept_graphs must be a list of module attribute names (Class.attribute)",
                           file=str(af.path), field="$.kept_graphs", value=v)
    return tuple(v)


def _check_size(spec: ModelSpec, file: str | None) -> None:
    """The parameter count a config gives is bounded as ``--params`` is (``units.MAX_COUNT``, 10^15), whatever
    channel the config comes from (a file, a ruleset's inline config, an upload, the Hub)."""
    from fitplan.units import MAX_COUNT

    if spec.param_count > MAX_COUNT:
        raise FitplanError(f"the config gives {spec.param_count:.3g} parameters, at most {MAX_COUNT:.0e} (the bound of "
                           "--params)", file=file, field="$.hidden_size", value=spec.hidden_size,
                           suggestion="check hidden_size, intermediate_size and num_hidden_layers")


def assumed_statements(af, c: dict[str, Any]) -> tuple[str, ...]:
    """One sentence per field of the file's ``assumed`` that the config states at another value (a config that
    states none, or the assumed value, is what was learned), and one per assumption no config field states
    (``"always": true``: the balanced routing the learner fixed for experts sized by it), said every time."""
    out = []
    for name, a in (af.data.get("assumed") or {}).items():
        if a.get("always"):
            out.append(f"{af.model_type}'s learned file assumes {name} = {a.get('value')!r}: {a.get('why', '')}")
            continue
        v = c.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v != a.get("value"):
            out.append(f"{name} = {v!r}: the figures assume {name} = {a.get('value')!r}, {a.get('why', '')}")
    return tuple(out)


def config_dtype(c: dict[str, Any], file: str | None) -> str | None:
    """The checkpoint dtype a config.json states: ``dtype`` (transformers >= 4.56 writes it) or ``torch_dtype``
    (older configs; transformers 5.24 ``PretrainedConfig`` reads both), as ``fp32``/``bf16``/``fp16``; None when
    absent or ``"auto"``. transformers 5.24 ``modeling_utils.py`` (``_get_dtype``) then takes the dtype of the
    checkpoint's first floating tensor, which a config alone does not say: fitplan assumes float32 and says so."""
    from fitplan.inputs.precision import dtype_code

    for key in ("dtype", "torch_dtype"):
        v = c.get(key)
        if v is None or v == "auto":
            continue
        try:
            return dtype_code(v, what=key)
        except FitplanError as e:
            raise FitplanError(e.message, file=file, field=f"$.{key}", value=v, suggestion=e.suggestion) from None
    return None


def _field(c: dict[str, Any], af: Any, name: str) -> Any:
    """A config field the learned graph does not use (so not among the file's symbols), read under its name
    or an alias of the config class's ``attribute_map`` (GPT-2's ``n_positions``)."""
    if c.get(name) is not None:
        return c[name]
    return next((c[a] for a, canon in af.config.get("aliases", {}).items() if canon == name and c.get(a) is not None),
                None)


def _check_routing(std: dict[str, Any], names: dict[str, Any], file: str | None) -> None:
    """A router cannot pick more experts per token than there are (torch.topk refuses it at the first step)."""
    k, n = std.get("num_experts_per_tok") or 0, std.get("num_experts") or 0
    if n and k > n:
        field = names.get("num_experts_per_tok")
        raise FitplanError(f"num_experts_per_tok ({k}) exceeds the number of experts ({n})", file=file,
                           field=f"$.{field if isinstance(field, str) and field.isidentifier() else 'num_experts_per_tok'}",
                           value=k)


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def load_config_json(path: str | Path) -> ModelSpec:
    """Read an HF ``config.json`` from disk."""
    from fitplan.inputs.files import read_json

    p = Path(path)
    try:
        data = read_json(p, special_floats=True)  # as transformers reads it (inputs/files.py)
    except FitplanError as e:
        if e.message == "file not found":
            e.suggestion = "pass a catalog name (fitplan models list) or a path to config.json"
        raise
    name = p.parent.name if p.name == "config.json" else p.stem
    return spec_from_config(data, name=name, file=str(p), source=str(p))


def bare_spec(count: int) -> ModelSpec:
    """A model known only by its parameter count (``--params 7B``, with ``--assumptions seed``)."""
    return ModelSpec(
        name=f"{count / 1e9:g}B params", model_type="bare", family="bare", hidden_size=1, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, head_dim=1, intermediate_size=1, vocab_size=1, bare_param_count=count,
    )


def spec_to_dict(spec: ModelSpec) -> dict[str, Any]:
    d = attrs.asdict(spec)
    d["symbols"] = {k: v for k, v in spec.symbols}
    return d


