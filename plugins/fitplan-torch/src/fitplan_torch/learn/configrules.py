"""How to read a model type's symbols from a ``config.json``, learned from its transformers config class.

fitplan's core has no transformers, so the file must say what the config class does: which keys are
aliases of which (``attribute_map``: GPT-2's ``n_embd`` is ``hidden_size``), the class defaults, the
values ``__post_init__`` derives when a field is absent or ``None`` (``head_dim = hidden_size //
num_attention_heads``, ``num_key_value_heads = num_attention_heads``), and the checks its validation
applies (``hidden_size`` a multiple of ``num_attention_heads``). Defaults come from the class itself;
derived values are fitted over the same probes as the shapes (:mod:`.fit`); checks are kept when the
class rejects a config that violates them.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

from .fit import FitError, Fitter

STD = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings",
       "num_key_value_heads", "head_dim", "intermediate_size", "tie_word_embeddings")
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
SSM_HEADS = ("num_heads", "mamba_num_heads", "mamba_n_heads")
"""The heads an attention-free model has, which the core reads as its ``num_attention_heads`` (an integer: tensor
parallelism splits them): Mamba2Config has ``num_heads`` and leaves ``num_attention_heads`` None
(transformers/models/mamba2/configuration_mamba2.py); the memory check's estimate refused the learned file."""
CANDIDATE_CHECKS = (
    ("{h} % {a} == 0", "{h}", "hidden size must be a multiple of the number of attention heads"),
    ("{a} % {g} == 0", "{g}", "the number of attention heads must be a multiple of the number of key/value heads"),
)


def config_class(model_type: str):
    import transformers

    return type(transformers.AutoConfig.for_model(model_type))


def resolve(cfg: dict[str, Any]) -> dict[str, Any]:
    from .derive import hf_config

    return hf_config(cfg).to_dict()


def attribute_map(cls) -> dict[str, str]:
    return dict(getattr(cls, "attribute_map", {}) or {})


def causal_field(cls, std: str) -> str:
    """The config field the causal LM of ``cls`` reads for the standard name ``std``: its alias
    (:func:`alias_of`), but the decoder's twin where the alias names an encoder field that has one (``encoder``
    replaced by ``decoder`` in its name). An encoder-decoder family's causal LM is its decoder alone
    (transformers 5.24 models/bart/modeling_bart.py ``BartForCausalLM``: ``is_encoder_decoder = False``, a
    ``BartDecoderWrapper``), whose layers read ``decoder_layers``, ``decoder_attention_heads`` and
    ``decoder_ffn_dim``, while BartConfig's ``attribute_map`` sends ``num_attention_heads`` and
    ``num_hidden_layers`` to the encoder's (configuration_bart.py; BigBird-Pegasus and Blenderbot-Small alike;
    ProphetNet's ``num_encoder_attention_heads`` and ``num_encoder_layers``, whose decoder layers read
    ``num_decoder_layers``: modeling_prophetnet.py ``ProphetNetDecoder``). A file that read the encoder's had no
    heads (``num_attention_heads`` None in every estimate) and counted the encoder's layers."""
    actual = alias_of(cls, std)
    if "encoder" in actual:
        twin = actual.replace("encoder", "decoder", 1)
        if twin in class_defaults(cls):
            return twin
    return actual


def alias_of(cls, std: str) -> str:
    """The field the config class reads for ``std``: its ``attribute_map`` entry, or the field that a property
    named ``std`` returns (ProphetNetConfig's ``num_hidden_layers`` is a property returning
    ``num_encoder_layers``, whose setter raises: configuration_prophetnet.py, 5.24), or ``std`` itself."""
    amap = attribute_map(cls)
    if std in amap:
        return amap[std]
    if isinstance(getattr(cls, std, None), property):
        return _property_field(cls, std) or std
    return std


@functools.cache
def _property_field(cls, std: str) -> str | None:
    """The integer field whose value the property ``std`` of ``cls`` returns, found by setting each integer field
    equal to it at the defaults one higher and seeing the property follow; None if none does."""
    try:
        v = getattr(cls(), std)
    except Exception:  # noqa: BLE001 - the class's defaults do not build or the property raises: no field
        return None
    if type(v) is not int:
        return None
    for f, d in class_defaults(cls).items():
        if f == std or type(d) is not int or d != v:
            continue
        try:
            if getattr(cls(**{f: v + 1}), std) == v + 1:
                return f
        except Exception:  # noqa: BLE001 - the class rejects the changed field: not this one
            continue
    return None


def class_defaults(cls) -> dict[str, Any]:
    """The config class's own field defaults (None where ``__post_init__`` derives the value)."""
    import dataclasses

    if dataclasses.is_dataclass(cls):
        return {f.name: (f.default if f.default is not dataclasses.MISSING else None) for f in dataclasses.fields(cls)}
    import inspect

    return {k: (p.default if p.default is not inspect.Parameter.empty else None)
            for k, p in inspect.signature(cls.__init__).parameters.items()}


SCALAR_KINDS = ("str", "int")
"""The kinds a field may take together (``"str|int"``): Exaone4Config's ``sliding_window_pattern: str | int |
None`` (``"LLLG"`` or ``4``). A number that may also be a float stays ``float`` (the core accepts an int there)."""


def replaced(cls, field: str) -> bool:
    """Whether ``field``'s class default is a string the class replaces by a number (``"auto"``), unlike a string
    it keeps (``hidden_act = "gelu"``)."""
    d = class_defaults(cls).get(field)
    if not isinstance(d, str):
        return False
    try:
        v = getattr(cls(), field, d)
    except Exception:  # noqa: BLE001 - the class's own defaults do not build: no evidence
        return False
    return v is not None and not isinstance(v, str)


def sentinels(resolved: dict[str, Any], cls) -> dict[str, str]:
    """Fields whose class default is a string the class replaces by a width it derives (BambaConfig:
    ``mamba_d_head = "auto"`` becomes ``mamba_expand * hidden_size // mamba_n_heads``,
    transformers/models/bamba/configuration_bamba.py; Mamba's ``time_step_rank``), where ``resolved`` states
    exactly the derived value: ``{field: the string}``. The learner records them as the string, so that the class
    derives them again at every probe size (stated, they would hold the widths they derive from fixed: BambaConfig
    rejects a hidden size that no longer matches its stated head width)."""
    out = {}
    for f, d in class_defaults(cls).items():
        v = resolved.get(f)
        if not replaced(cls, f) or isinstance(v, str) or v is None:
            continue
        try:
            again = resolve({**resolved, f: d}).get(f)
        except Exception:  # noqa: BLE001 - the class rejects the string here: keep the value
            continue
        if again == v:
            out[f] = d
    return out


def annotated_kind(cls, field: str) -> str | None:
    """``"str|int"`` when the config class's annotation of ``field`` admits both a string and an integer
    (transformers 5.24 configuration_exaone4.py: ``sliding_window_pattern: str | int | None = 4``), else None
    (the kind of the value is used)."""
    import dataclasses

    if not dataclasses.is_dataclass(cls):
        return None
    f = next((x for x in dataclasses.fields(cls) if x.name == field), None)
    if f is None:
        return None
    names = set(re.findall(r"[A-Za-z_]+", f.type if isinstance(f.type, str) else str(f.type)))
    kinds = [k for k in SCALAR_KINDS if k in names]
    return "|".join(kinds) if len(kinds) > 1 and "bool" not in names and "float" not in names else None


def nested_sources(cls, field: str, key: str) -> list[list[str]]:
    """Where the config class reads a value it keeps inside a dict field: the dict itself, the older
    ``rope_scaling`` dict, a top-level key of the same name, and legacy keys its ``__post_init__`` pops
    (GPT-NeoX's ``rotary_pct``), each checked by building a config with it set."""
    import inspect
    import re

    out = [[field, key], ["rope_scaling", key], [key]]
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        src = ""
    for cand in sorted(set(re.findall(r"""kwargs\.(?:pop|get)\(\s*["'](\w+)["']""", src))):
        if cand == key:
            continue
        try:
            got = (resolve({"model_type": cls.model_type, cand: 0.123}).get(field) or {}).get(key)
        except Exception:  # noqa: BLE001
            continue
        if got == 0.123:
            out.append([cand])
    return out


def learn_config(model_type: str, fields: list[str], probes, log, nested: dict[str, tuple[str, str]] | None = None
                 ) -> dict[str, Any]:
    """The ``config`` section of the file for the symbols ``fields`` (their order is kept)."""
    cls = config_class(model_type)
    defaults = class_defaults(cls)
    nested = nested or {}
    resolved_default = cls().to_dict()
    amap = attribute_map(cls)
    out_fields: dict[str, Any] = {}
    base = probes[0].cfg
    sizes = _sizes(probes)
    for f in fields:
        if f.startswith("_") and f not in defaults:
            # a value the class reads from kwargs in __post_init__ (Gemma 3: ``self._sliding_window_pattern =
            # kwargs.get("sliding_window_pattern", 6)``): read from the public key, then the private one
            dflt = getattr(cls(), f, None)
            out_fields[f] = {"type": "int" if isinstance(dflt, int) else "any", "default": dflt, "from": [[f[1:]], [f]]}
            continue
        if f in nested and len(nested[f]) == 3:  # one factor in each layer type's dict: read from them in turn
            field, key = nested[f][0], nested[f][-1]
            dflt = next((x.get(key) for x in (resolved_default.get(field) or {}).values() if isinstance(x, dict)), None)
            out_fields[f] = {"type": "float", "default": dflt, "from": [[field, t, key] for t in base.get(field, {})]}
            continue
        if f in nested:
            field, key = nested[f]
            dflt = (resolved_default.get(field) or {}).get(key)
            if isinstance(dflt, float) or not isinstance(base.get(field, {}).get(key), int):
                out_fields[f] = {"type": "float", "default": dflt, "from": nested_sources(cls, field, key)}
            else:  # a size of a nested config object (DBRX's attn_config.kv_n_heads): read from there only
                out_fields[f] = {"type": "int", "default": dflt, "from": [[field, key]], **({"size": True} if f in sizes else {})}
            continue
        v = base.get(f, defaults.get(f))
        kind = ("bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float" if isinstance(v, float)
                else "list" if isinstance(v, (list, tuple)) else "str" if isinstance(v, str) else "any")
        kind = annotated_kind(cls, f) or kind
        spec: dict[str, Any] = {"type": kind, "default": defaults.get(f)}
        by_layers = _layer_count_default(cls, f, kind, amap) if spec["default"] is not None else None
        if by_layers:
            log(f"    {f}: the class replaces its default {spec['default']!r} by {by_layers}")
            spec = {"type": kind, "default": None, "derive": by_layers}
        auto = base.get(f) == spec["default"] and replaced(cls, f)  # see sentinels()
        if auto:
            spec["rewrite"] = {spec["default"]: None}  # the core then derives it, as the class does
        if (spec["default"] is None or auto) and "derive" not in spec:
            derived, used = [], []
            for p in probes:
                try:
                    derived.append(resolve({k: x for k, x in p.cfg.items() if k != f}).get(f))
                    used.append(p)
                except Exception:  # noqa: BLE001 - the class rejects this probe without the field
                    continue
            if derived and all(isinstance(d, int) and not isinstance(d, bool) for d in derived):
                sub = probes_single(used)
                fitter = Fitter([p.env for p in used], {k: i for k, i in sub.items() if k != f})
                try:
                    spec["derive"] = fitter.fit(derived)
                except FitError as e:
                    same = _same_as(f, fields, used, derived) or _class_derivation(base, f, fields)
                    if same:
                        spec["derive"] = same
                    else:
                        log(f"    cannot express how {f} is derived: {e}")
        if spec["default"] is None and "derive" not in spec and base.get(f) is None:
            spec.update(_list_length(base, f, fields))
        if kind == "int" and f in sizes:
            spec["size"] = True
        out_fields[f] = spec
    out_fields = _derived_last({**_read_by_derivations(out_fields, defaults, sizes), **out_fields})
    aliases = {std: actual for std, actual in amap.items() if actual in out_fields}
    checks = []
    h, a, g = (causal_field(cls, x) for x in ("hidden_size", "num_attention_heads", "num_key_value_heads"))
    for expr, field, msg in CANDIDATE_CHECKS:
        names = {"h": h, "a": a, "g": g}
        e = expr.format(**names)
        if any(n not in out_fields for n in _names(e)):
            continue
        if _rejects(base, e, names):
            checks.append([e, field.format(**names), msg])
    return {"class": cls.__name__, "aliases": aliases, "fields": out_fields, "checks": checks}


def _derived_last(out_fields: dict[str, Any]) -> dict[str, Any]:
    """The fields in an order where a derived field comes after every field it reads, also through a chain (the
    core reads them in order and derives each from those already read: src/fitplan/arch/archfile.py
    ``ArchFile.symbols``): a field is placed after what its derivation names, depth first, each in its first
    place otherwise. A single pass that moved each derived field after its own dependencies broke a chain:
    ``a = lin``, ``lin = short`` gave ``a, short, lin``, and ``a`` was derived before ``lin`` existed ("cannot
    derive a (lin): 'lin'")."""
    order: list[str] = []
    seen: set[str] = set()

    def place(f: str) -> None:
        if f in seen:
            return  # placed, or a cycle (left in its first place)
        seen.add(f)
        for d in _names(out_fields[f].get("derive") or ""):
            if d in out_fields:
                place(d)
        order.append(f)

    for f in out_fields:
        place(f)
    return {f: out_fields[f] for f in order}


def _read_by_derivations(out_fields: dict[str, Any], defaults: dict[str, Any], sizes) -> dict[str, Any]:
    """The fields a derivation reads that the model itself does not (ModernBERT-decoder's ``sliding_window =
    local_attention // 2``, transformers/models/modernbert_decoder/configuration_modernbert_decoder.py): each
    becomes a field with the class's default, so that a config which states it, or leaves it to the default,
    derives the same value the class does."""
    out: dict[str, Any] = {}
    for spec in out_fields.values():
        for name in _names(spec.get("derive") or ""):
            if name in out_fields or name in out or name not in defaults:
                continue
            v = defaults[name]
            kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float" if isinstance(v, float) else "any"
            out[name] = {"type": kind, "default": v, **({"size": True} if kind == "int" and name in sizes else {})}
    return out


def _layer_count_default(cls, field: str, kind: str, amap: dict[str, str]) -> str | None:
    """``num_hidden_layers + c`` when the config class replaces ``field``'s own default by the layer count plus a
    constant (Ernie4_5_MoeConfig: ``moe_layer_end_index = num_hidden_layers - 1 if moe_layer_end_index == -1``,
    transformers/models/ernie4_5_moe/configuration_ernie4_5_moe.py), checked at three layer counts; else None. A
    config that leaves the field out then reads it as the class does."""
    n_layers = causal_field(cls, "num_hidden_layers")  # Bart's causal LM: decoder_layers (amap sends encoder_)
    if kind != "int" or field == n_layers:
        return None
    offsets = set()
    for n in (3, 5, 8):
        try:
            got = resolve({"model_type": cls.model_type, n_layers: n}).get(field)
        except Exception:  # noqa: BLE001 - the class rejects the count: no such rule
            return None
        if not isinstance(got, int) or isinstance(got, bool) or got == class_defaults(cls).get(field):
            return None
        offsets.add(got - n)
    if len(offsets) != 1:
        return None
    c = offsets.pop()
    return n_layers if c == 0 else f"{n_layers} {'+' if c > 0 else '-'} {abs(c)}"


def _list_length(cfg: dict[str, Any], field: str, fields: list[str]) -> dict[str, str]:
    """``{"derive": "len(L)"}`` when the config class derives ``field`` as the length of the file's list field
    ``L``, checked at ``L``'s own length and at twice it; else ``{}``. NemotronHConfig's ``num_hidden_layers`` is a
    property, ``len(self.layers_block_type)``, that ignores a stated value and is None in ``to_dict``
    (transformers/models/nemotron_h/configuration_nemotron_h.py): a file that read the config's value counted
    None layers."""
    from .derive import hf_config

    for lst in [g for g in fields if g != field and isinstance(cfg.get(g), list) and cfg[g]]:
        try:
            ok = all(getattr(hf_config({**cfg, lst: v}), field, None) == len(v) for v in (cfg[lst], cfg[lst] * 2))
        except Exception:  # noqa: BLE001 - the class rejects the longer list: no evidence
            continue
        if ok:
            return {"derive": f"len({lst})"}
    return {}


def _class_derivation(cfg: dict[str, Any], field: str, fields: list[str]) -> str | None:
    """How the config class derives ``field`` (left unset) from the integer fields of ``fields``, fitted on configs
    the class itself resolves, no model run: ``cfg``, one config per field with that field alone doubled or
    tripled (where the class accepts it) and two with them all changed by unequal factors; None where no expression
    fits. OLMo-Hybrid's ``linear_key_head_dim = int(0.75 * hidden_size / linear_num_key_heads)``
    (models/olmo_hybrid/configuration_olmo_hybrid.py ``__post_init__``, 5.24): the learner's own probes change
    ``linear_num_key_heads`` only with the value heads, so no probe of its own names it as a dependency."""
    def derived(c: dict[str, Any]) -> int | None:
        try:
            v = resolve({k: x for k, x in c.items() if k != field}).get(field)
        except Exception:  # noqa: BLE001 - the class rejects this config
            return None
        return v if type(v) is int else None

    sizes = [k for k in fields if k != field and type(cfg.get(k)) is int and k not in ("b", "s")]
    envs, values, single = [cfg], [derived(cfg)], {}
    if values[0] is None:
        return None
    for k in sizes:
        for m in (2, 3):
            c = {**cfg, k: cfg[k] * m}
            if (d := derived(c)) is not None:
                single[k] = len(envs)
                envs.append(c)
                values.append(d)
                break
    for shift in (0, 1):  # joint configs: every field changed, by 2 or 3 in turn
        c = {**cfg, **{k: cfg[k] * (2 + (i + shift) % 2) for i, k in enumerate(single)}}
        if (d := derived(c)) is not None:
            envs.append(c)
            values.append(d)
    try:
        return Fitter(envs, single).fit(values)
    except FitError:
        return None


def _same_as(field: str, fields: list[str], probes, derived: list[int]) -> str | None:
    """Another field of the file whose value the class copies into ``field`` in every probe, when that value varies
    over the probes but with no single variable of its own (Zamba2Config: ``num_key_value_heads =
    num_attention_heads`` when None, transformers/models/zamba2/configuration_zamba2.py, where the heads change
    only together with other sizes); else None."""
    if len(set(derived)) < 2:
        return None
    resolved = [resolve(p.cfg) for p in probes]
    for g in fields:
        if g != field and all(r.get(g) == d for r, d in zip(resolved, derived)) and _copies(probes[0].cfg, field, g):
            return g
    return None


def _copies(cfg: dict[str, Any], field: str, g: str) -> bool:
    """Whether the class sets an absent ``field`` to ``g``'s value (not a coincidence of the probes): ``g`` set to
    other values, ``field`` left out, each value the class accepts comes back as ``field``."""
    v = cfg.get(g)
    if not isinstance(v, int) or isinstance(v, bool):
        return False
    seen = False
    for alt in (v * 2, v + 2, v * 3, max(v // 2, 1)):
        try:
            got = resolve({**{k: x for k, x in cfg.items() if k != field}, g: alt}).get(field)
        except Exception:  # noqa: BLE001 - the class rejects this value: no evidence either way
            continue
        if got != alt:
            return False
        seen = True
    return seen


def probes_single(probes) -> dict[str, int]:
    """Each variable's own probe: the one where only it changed (with the fields that follow it, such as
    DeepSeek's ``head_dim`` with ``qk_rope_head_dim``: :data:`.derive.FOLLOWERS`)."""
    from .derive import FOLLOWERS

    single = {}
    base = probes[0].env
    for i, p in enumerate(probes[1:], 1):
        changed = [k for k in base if p.env.get(k) != base.get(k) and k not in FOLLOWERS]
        if len(changed) == 1 and changed[0] not in single:
            single[changed[0]] = i
    return single


def _sizes(probes) -> set[str]:
    return {k for k, v in probes[0].env.items() if isinstance(v, int) and not isinstance(v, bool) and k not in ("b", "s")}


def _names(expr: str) -> list[str]:
    import re

    return [n for n in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", expr)]


def _rejects(base: dict[str, Any], expr: str, names: dict[str, str]) -> bool:
    """Does the config class reject a config that violates ``expr``?"""
    c = copy.deepcopy(base)
    if "%" in expr:
        num, den = [x.strip() for x in expr.split("==")[0].split("%")]
        c[num] = c[num] + 1 if c[den] > 1 else c[num]
        if c[den] <= 1:
            return False
    try:
        resolve(c)
    except Exception:  # noqa: BLE001 - rejected, as wanted
        return True
    return False


def spec_map(resolved: dict[str, Any], cls, fields: dict[str, Any], held: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """ModelSpec's standard fields as expressions over the file's symbols. A field the learning held (``held``:
    a constant of its sizes, no symbol; CodeGen's ``n_embd`` and ``n_head`` once ``rotary_dim`` is repaired) is
    written as its held value, so that no expression reads a name the file does not define."""
    held = held or {}

    def name(std: str) -> str | None:
        actual = causal_field(cls, std)
        if actual in fields:
            return actual
        v = held.get(actual)
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else None

    out: dict[str, Any] = {}
    for std in STD:
        n = name(std)
        if n is not None:
            out[std] = n
    if resolved.get(causal_field(cls, "num_attention_heads")) is None:  # no attention (Mamba-2): its SSM heads
        out.pop("num_attention_heads", None)
        ssm = next((n for n in map(name, SSM_HEADS) if n is not None), None)
        # no heads of any kind (MambaConfig, FalconMambaConfig: transformers 5.24 configuration_mamba.py has no head
        # field): one, as wide as the hidden size, so that the core's integer fields hold; the learned graph, not
        # these fields, gives the memory and the work
        out["num_attention_heads"] = ssm if ssm is not None else "1"
    heads = out.get("num_attention_heads")
    hidden = out.get("hidden_size")
    out.setdefault("num_key_value_heads", heads)
    if "head_dim" not in out and hidden and heads:
        out["head_dim"] = f"{hidden}//{heads}"
    inter = out.get("intermediate_size")
    if inter is None or (inter.isidentifier() and resolved.get(inter) is None):
        for alt in ("n_inner", "ffn_hidden_size", "intermediate_size", "decoder_ffn_dim"):  # Bart: causal_field
            if alt in fields and resolved.get(alt):
                out["intermediate_size"] = alt
                break
        else:
            if hidden is not None:  # else no width to derive it from: the core names the missing field
                out["intermediate_size"] = f"4*{hidden}"
    for e in EXPERTS:
        if e in fields and resolved.get(e):
            out["num_experts"] = e
            break
    if "num_experts_per_tok" in fields:
        out["num_experts_per_tok"] = "num_experts_per_tok"
    if "moe_intermediate_size" in fields:
        out["moe_intermediate_size"] = "moe_intermediate_size"
    layers = out.get("num_hidden_layers")
    if layers and layers.isidentifier() and resolved.get(layers) is None:
        from .derive import LearnError

        # LongcatFlashConfig's num_hidden_layers is a property, 2 * num_layers (each decoder layer holds two
        # attention sublayers), stated in no config.json: the file would have no layer count
        raise LearnError(f"the layer count: {cls.__name__}.{layers} has no value in the config (a property that "
                         "follows no single field); the file cannot count its layers")
    return out
