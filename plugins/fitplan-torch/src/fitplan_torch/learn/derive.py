"""From recordings to a learned architecture file (docs/architectures.md).

For each recorded variant (precision class ``16`` or ``mixed`` × attention ``sdpa`` or ``eager``) and
regime (grouped-query vs multi-head attention, a sliding window shorter than the sequence, a one-row
batch), the model is recorded at a base size and at probes where one variable changes at a time, plus
joint probes; every probe must produce the same ops. Shapes become expressions (:mod:`.fit`), segments
are deduplicated by content, and the file is assembled with the config rules (:mod:`.configrules`),
the parameter list and the backward behaviour seen in a run with real saves.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from typing import Any

from . import crosslayer, learner, looptail, relations, routing, seqbound
from .autograd_rules import function_temporaries
from .constchunk import fit_count
from .fit import FitError, Fitter
from .fold import fold
from .limits import data_dependent_note
from .record import (FUNCTION_OP, Recent, Recording, align_backward, config_key, decoder_layers, is_linear_site,
                     linear_types, record)
from .segments import Cut
from .seqloop import fold_loops, unfolded_loop_note
from .slicesizes import sliced_size

DISTINCT_P = (0.11, 0.13, 0.17, 0.19, 0.23, 0.29, 0.31, 0.37, 0.41, 0.43)
VARIANTS = (("16", "sdpa"), ("16", "eager"), ("mixed", "sdpa"), ("mixed", "eager"))
DTYPE_OF = {"16": "bfloat16", "mixed": "float32", "32": "float32"}
NOT_SIZES = re.compile(r"(_token_id|token_ids|^num_hidden_layers$|^n_layer$|_layers$|^max_window_layers$|seed|"
                       r"^first_k_dense_replace$|_step$|_freq$|_interval$|_pattern$|_layer_period$|_layer_offset$|^sliding_window$|"
                       r"^attention_chunk_size$|"
                       r"^num_labels$|^chunk_size_feed_forward$|^pretraining_tp$|^max_position_embeddings$)")


class LearnError(RuntimeError):
    pass


# --------------------------------------------------------------------------- building and recording


def hf_config(cfg: dict[str, Any]):
    import transformers

    c = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if not k.startswith("_")})
    c.use_cache = False
    register_text_model(type(c))
    return c


@functools.cache
def register_text_model(config_class) -> None:
    """Make ``AutoModelForCausalLM`` take a multimodal type's text config that its mapping lists only under the
    outer type (emu3's ``emu3_text_model``, mllama's ``mllama_text_model``): for the outer config, ``from_config``
    builds the outer type's causal-LM class on ``config.get_text_config()`` when that class's ``config_class`` is
    the text config class (transformers/models/auto/auto_factory.py ``from_config``, 5.24); registered the same
    (``register``) so the learner and the referee build that class from the text config alone."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config_class in MODEL_FOR_CAUSAL_LM_MAPPING:
        return
    module = model_type_to_module_name(config_class.model_type)
    for outer in [t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if model_type_to_module_name(t) == module]:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[CONFIG_MAPPING[outer]]
        if getattr(model_class, "config_class", None) is config_class:
            AutoModelForCausalLM.register(config_class, model_class, exist_ok=True)
            return


def build(cfg: dict[str, Any], precision: str, attn: str):
    import torch
    import transformers

    if torch.get_num_threads() != 1:
        # tiny models gain nothing from threads, and on a shared machine OpenMP's spinning threads make
        # every recording several times slower
        torch.set_num_threads(1)

    config = hf_config(cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, DTYPE_OF[precision]),
                                                          attn_implementation=attn)
    model.train()
    return model, config


def batch_for(config, b: int, s: int):
    import torch

    vocab = int(getattr(config, "vocab_size"))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (b, s), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


RECENT = Recent(24)
"""The last forward-only recordings (:class:`.record.Recent`): one regime's signature, base probe and shared
segments are one recording."""


def run(cfg: dict[str, Any], precision: str, attn: str, b: int, s: int, *, backward: bool = False) -> Recording:
    key = None if backward else (config_key(cfg), precision, attn, b, s, config_key(routing.FORCED))
    if key is not None and (seen := RECENT.get(key)) is not None:
        return seen
    rec = _run(cfg, precision, attn, b, s, backward=backward)
    if key is not None:
        RECENT.put(key, rec)
    return rec


def _run(cfg: dict[str, Any], precision: str, attn: str, b: int, s: int, *, backward: bool) -> Recording:
    import torch

    model, config = build(cfg, precision, attn)
    batch = batch_for(config, b, s)
    ac = torch.bfloat16 if precision == "mixed" else None
    with routing.balanced(model, config.to_dict()):  # the declared routing, where experts are sized by it
        rec = record(model, batch, autocast_dtype=ac)
        if backward:
            recb = record(model, batch, autocast_dtype=ac, lifetimes=False, backward=True)
            rec.backward = align_backward(rec, recb)
            rec.accumulate = recb.accumulate
            rec.no_grad = recb.no_grad
    rec.meta = _meta(model, config, rec.sites)
    # a loop over heads (StableLM's per-head LayerNorm) and a loop over the sequence (Mamba's reference scan): one
    # repeated block each
    return fold_loops(fold(rec, rec.meta))


def _meta(model, config, sites) -> dict[str, Any]:
    """What the recording cannot see by itself: parameter roles, the output module, tied keys."""
    import torch

    from .ties import tied_keys

    names = {m: n for n, m in model.named_modules()}
    exact = linear_types()
    site_modules = {s["module"] for s in sites}  # subclasses of nn.Linear count when their forward returns a tensor
    roles: dict[str, str] = {}
    emb_in = model.get_input_embeddings()
    emb_out = model.get_output_embeddings()
    for mod_name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{pname}" if mod_name else pname
            if mod is emb_in:
                role = "embedding"
            elif mod is emb_out and pname == "weight":
                role = "output"
            elif is_linear_site(mod) and pname == "weight" and (type(mod) in exact or mod_name in site_modules):
                role = "linear:" + mod_name.rsplit(".", 1)[-1]
            elif p.dim() >= 3:
                role = "experts:" + pname
            elif isinstance(mod, torch.nn.Embedding):
                role = "positions"
            elif "router" in type(mod).__name__.lower() or ("gate" in mod_name.rsplit(".", 1)[-1] and p.dim() == 2):
                role = "router"
            elif p.dim() == 1:
                role = "norm" if "norm" in type(mod).__name__.lower() or "norm" in mod_name else "bias"
            else:
                role = "other"
            roles[full] = role
    conv1d = {f"{n}.weight" for m, n in names.items() if type(m).__name__ == "Conv1D"}
    custom = {f"{s['module']}.weight" for s in sites if s["custom"]}
    return {"roles": roles, "conv1d": conv1d, "custom": custom, "output_module": names.get(emb_out),
            "input_module": names.get(emb_in), "n_layers": len(decoder_layers(model)),
            "model_class": type(model).__name__, "config_class": type(config).__name__,
            "frozen": {n for n, p in model.named_parameters() if not p.requires_grad},  # afmoe's expert_bias
            "tied_keys": tied_keys(model)}  # BERT's decoder bias, besides the LM head (.ties)


# --------------------------------------------------------------------------- probes


def size_variables(resolved: dict[str, Any]) -> list[str]:
    out = []
    for k, v in resolved.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or NOT_SIZES.search(k):
            continue
        out.append(k)
    return out


NESTED: dict[str, tuple[str, ...]] = {}
"""Values the config keeps inside a dict field, varied like top-level fields and named by their key (set by
:func:`nested_variables`): float factors (``rope_parameters["partial_rotary_factor"]``), the same factor in each
layer type's dict (``(field, "*", key)``: MiMo-V2-Flash's ``rope_parameters[layer_type]["partial_rotary_factor"]``)
and the sizes of a nested config object (DBRX's ``attn_config["kv_n_heads"]``)."""


def nested_variables(resolved: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Float factors in (0, 1] inside any dict field, and integer sizes inside a field the config class keeps as a
    config object of its own (its ``sub_configs``: DbrxConfig's ``attn_config`` with ``kv_n_heads``, ``ffn_config``
    with ``ffn_hidden_size``, ``moe_num_experts``, ``moe_top_k``; transformers 5.24 configuration_dbrx.py), which
    the model reads as sizes (modeling_dbrx.py: ``Wqkv`` is ``d_model + 2·kv_n_heads·head_dim`` wide). A key that
    is also a top-level field or alias (``ffn_config["hidden_size"]``, the top level's ``attribute_map`` name of
    ``d_model``), or a size in two nested configs, is left out: its name would be ambiguous."""
    from .shrink import _attribute_map, sub_config_keys

    subs = sub_config_keys(resolved)
    taken = set(resolved) | set(_attribute_map(resolved))
    out: dict[str, tuple[str, ...]] = {}
    twice: set[str] = set()
    for k, v in resolved.items():
        if not isinstance(v, dict):
            continue
        for kk, vv in _per_type_factors(v).items():
            if kk not in taken:
                twice.update({kk} & set(out))
                out.setdefault(kk, (k, "*", kk))
        for kk, vv in v.items():
            factor = isinstance(vv, float) and 0 < vv <= 1
            size = k in subs and size_variables({kk: vv}) == [kk]
            if not (factor or size) or kk in taken:
                continue
            if kk in out:
                twice.add(kk)
            out.setdefault(kk, (k, kk))
    return {kk: where for kk, where in out.items() if kk not in twice}


def _per_type_factors(d: dict[str, Any]) -> dict[str, float]:
    """The float factors in (0, 1] that every entry of a dict of dicts (one per layer type) states, with one value
    (MiMo-V2-Flash's ``partial_rotary_factor`` 0.334 for full and sliding attention, configuration_mimo_v2_flash.py,
    read per layer type by modeling_mimo_v2_flash.py ``compute_default_rope_parameters``)."""
    entries = list(d.values())
    if not entries or not all(isinstance(x, dict) for x in entries):
        return {}
    out = {}
    for kk, vv in entries[0].items():
        if isinstance(vv, float) and 0 < vv <= 1 and all(x.get(kk) == vv for x in entries):
            out[kk] = vv
    return out


def get_var(cfg: dict[str, Any], name: str) -> Any:
    if name in NESTED:
        where = NESTED[name]
        d = cfg.get(where[0]) or {}
        if len(where) == 3:  # the same factor in each layer type's dict: the first one's
            d = next((x for x in d.values() if isinstance(x, dict)), {}) if isinstance(d, dict) else {}
        return d.get(where[-1]) if isinstance(d, dict) else None
    return cfg.get(name)


def put_var(cfg: dict[str, Any], name: str, value: Any) -> None:
    if name in NESTED:
        where = NESTED[name]
        field, key = where[0], where[-1]
        if len(where) == 3:  # every layer type's dict alike
            cfg[field] = {t: {**x, key: value} if isinstance(x, dict) else x for t, x in (cfg.get(field) or {}).items()}
        else:
            cfg[field] = {**(cfg.get(field) or {}), key: value}
    else:
        cfg[name] = value


def alternatives(name: str, v):
    if isinstance(v, float):
        return [x for x in (v * 2, v / 2, 0.75, 0.5, 1.0) if 0 < x <= 1 and x != v]
    cands = [v * 3 // 2, v * 2, v + 2, v + 4, v * 3, v - 1, v + 1, v // 2]
    out = []
    for c in cands:
        if c >= 1 and c != v and c not in out:
            out.append(c)
    return out


def derived_by_config(cfg: dict[str, Any], name: str, val) -> bool:
    """Whether the config class ignores ``name`` as written and sets it from other fields (DeepseekV3Config's
    ``head_dim = qk_rope_head_dim``): no alternative value survives into the resolved config. Such a field is
    not a size the file must hold (a config.json stating another value is still served)."""
    seen = False
    for alt in alternatives(name, val):
        c = copy.deepcopy(cfg)
        put_var(c, name, alt)
        try:
            resolved = get_var(hf_config(c).to_dict(), name)
        except Exception:  # noqa: BLE001 - the config class refuses this value: no evidence either way
            continue
        if resolved != val:
            return False
        seen = True
    return seen


FOLLOWERS: dict[str, str] = {}
"""Fields the config class sets from another when absent, found by the probes of the current learning
(``head_dim`` -> ``qk_rope_head_dim`` in DeepSeek-V2/V3): the follower is not a variable and, where the class
keeps a stated value (V3), the file checks that it equals its leader (:func:`follower_checks`)."""


def follows(base: dict[str, Any], k: str, name: str, alt) -> bool:
    """Whether the config class sets ``k`` to ``name``'s value when ``k`` is absent (or overwritten): with
    ``name = alt`` and ``k`` removed, the class resolves ``k`` to ``alt`` (DeepseekV2Config / V3Config:
    ``self.head_dim = self.qk_rope_head_dim``, transformers 5.24)."""
    if name in ("b", "s") or k in ("b", "s"):
        return False
    c = copy.deepcopy(base)
    put_var(c, name, alt)
    if k in NESTED:  # a nested config's field the class overwrites from ``name`` whatever it states (MoshiConfig:
        # ``depth_decoder_config["input_size"] = hidden_size``, models/moshi/configuration_moshi.py ``__post_init__``)
        put_var(c, k, alt + 1)
    else:
        c.pop(k, None)
    try:
        return get_var(hf_config(c).to_dict(), k) == alt
    except Exception:  # noqa: BLE001 - the class refuses the config: no evidence
        return False


def follower_checks(base: dict[str, Any], fields: dict[str, Any]) -> list[list[str]]:
    """``[k == leader, k, message]`` for each follower the config class keeps when a config states it
    (DeepseekV3Config keeps a stated ``head_dim``; its rotary embedding reads it, so the model runs only when it
    equals ``qk_rope_head_dim``): no probe found another value that runs the same ops."""
    out = []
    for k, lead in FOLLOWERS.items():
        if k in fields and lead in fields and not derived_by_config(base, k, get_var(base, k)):
            out.append([f"{k} == {lead}", k, f"{k} must equal {lead} (the config class sets it from {lead}; "
                        "no other value runs the same ops)"])
    return out


def signature(rec: Recording) -> list[Any]:
    return [(o["name"], len(o["outs"]), tuple(len(rec.tensors[t]["shape"]) for t in o["outs"]),
             tuple(rec.tensors[t]["dtype"] for t in o["outs"])) for o in rec.ops]


def typical(cfg: dict[str, Any]) -> bool:
    """Relations every published config keeps (and a probe must, or the model code takes odd paths):
    the hidden size a multiple of the heads, head dimensions even (rotary embeddings rotate pairs)."""
    h = next((cfg[k] for k in ("hidden_size", "n_embd", "d_model") if isinstance(cfg.get(k), int)), None)
    a = next((cfg[k] for k in ("num_attention_heads", "n_head") if isinstance(cfg.get(k), int)), None)
    if h and a and h % a:
        return False
    d = cfg.get("head_dim")
    if isinstance(d, int) and d % 2:
        return False
    if h and a and (h // a) % 2:
        return False
    dd = d if isinstance(d, int) else (h // a if h and a else None)
    f = get_var(cfg, "partial_rotary_factor") if "partial_rotary_factor" in NESTED else cfg.get("partial_rotary_factor")
    if dd and isinstance(f, float) and int(dd * f) % 2:
        return False
    return True


class Probe:
    def __init__(self, cfg: dict[str, Any], b: int, s: int, env: dict[str, Any]) -> None:
        self.cfg, self.b, self.s, self.env = cfg, b, s, env


def _held(base: dict[str, Any], unprobed: list[tuple[str, Any]], followers: dict[str, str], log) -> dict[str, Any]:
    """The variables without a probe of their own that the file must hold at their value: not ``b`` / ``s``,
    not a follower of a probed variable, not a field the config class overwrites whatever a config states."""
    held = {}
    for name, val in unprobed:
        if name in ("b", "s"):
            continue
        if name in followers:
            log(f"    {name} follows {followers[name]} (the config class sets it from it): not a variable")
        elif derived_by_config(base, name, val):
            log(f"    {name} follows from other fields (the config class overwrites it): not a variable")
        else:
            log(f"    {name} held fixed at {val} (no other value keeps the same ops)")
            held[name] = val
    return held


def make_probes(base_cfg: dict[str, Any], variables: list[str], b: int, s: int, regime, ref_sig,
                precision: str, attn: str, log) -> tuple[list[Probe], dict[str, int], list[Recording], dict[str, Any]]:
    """The base probe, one per variable (only it changes), and two joint probes; each must record the same
    ops as the base. Variables that cannot change alone without changing the ops are held fixed: their value
    is a constant in the sizes fitted from these probes (returned, by name, so that the file can refuse
    another value)."""
    held: dict[str, Any] = {}
    probes: list[Probe] = []
    recs: list[Recording] = []
    single: dict[str, int] = {}

    def env_of(cfg, bb, ss):
        resolved = hf_config(cfg).to_dict()
        return {**{k: get_var(resolved, k) for k in variables}, "b": bb, "s": ss}

    def attempt(cfg, bb, ss):
        cfg = regime.couple(cfg)
        if not regime.valid(cfg, bb, ss) or not typical(cfg):
            return None, None
        try:
            rec = run(cfg, precision, attn, bb, ss)
        except Exception as e:  # noqa: BLE001 - an invalid probe config: try another value
            log(f"    probe rejected: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            return None, None
        if signature(rec) != ref_sig:
            return None, None
        return rec, cfg

    base = regime.setup(copy.deepcopy(base_cfg), b, s)
    if not typical(base):
        raise LearnError(f"the base config of regime {regime.name} is not typical (hidden size / heads)")
    rec0 = run(base, precision, attn, b, s)
    if ref_sig is None:
        ref_sig = signature(rec0)
    elif signature(rec0) != ref_sig:
        raise LearnError("the base probe records different ops than the reference"
                         + data_dependent_note({"ops": [[o["name"]] for o in rec0.ops]}))
    env0 = env_of(base, b, s)
    probes.append(Probe(base, b, s, env0))
    recs.append(rec0)
    knobs = [("b", b), ("s", s)] + [(v, get_var(base, v)) for v in variables]
    followers: dict[str, str] = {}  # a field the config class sets from another (head_dim from qk_rope_head_dim)
    unprobed = []
    for name, val in knobs:
        if name in regime.fixed or val is None:
            continue
        for alt in ([b + 1, b + 2] if name == "b" else [s + 4, s + 6, s - 2] if name == "s" else regime.values(name, val, s)):
            # a field equal to it that the config class would set from it (stated in base, so kept as stated by
            # V3): varied together, also where this regime probes only some variables
            same = [k for k in base if k != name and not isinstance(base[k], bool) and base[k] == val]
            for coupled in ((), *([k] for k in same)):
                cfg = copy.deepcopy(base)
                bb, ss = b, s
                if name == "b":
                    bb = alt
                elif name == "s":
                    ss = alt
                else:
                    put_var(cfg, name, alt)
                if coupled and not follows(base, coupled[0], name, alt):
                    continue
                for k in coupled:
                    put_var(cfg, k, alt)
                rec, used = attempt(cfg, bb, ss)
                if rec is None:
                    continue
                env = env_of(used, bb, ss)
                changed = {k for k in env if env[k] != env0[k]}
                extra = changed - {name} - set(regime.fixed)
                if name not in changed or any(not (k in coupled or follows(base, k, name, alt)) for k in extra):
                    continue
                followers.update({k: name for k in extra})
                single[name] = len(probes)
                probes.append(Probe(used, bb, ss, env))
                recs.append(rec)
                break
            if name in single:
                break
        else:
            got = relations.coupled_probe(base, variables, name, b, s, attempt, env_of, regime.fixed)
            if got is not None:
                log(f"    {name} probed with {relations.PRODUCTS} (the model needs the product)")
            else:
                got = routing.divisor_probe(base, variables, name, b, s, attempt, env_of, regime.fixed)
                if got is None:
                    unprobed.append((name, val))
                    continue
                log(f"    {name} probed with the experts scaled by it (it divides the expert count)")
            single[name] = len(probes)
            probes.append(Probe(got[0], b, s, got[1]))
            recs.append(got[2])
    unprobed = [(n, v) for n, v in unprobed if not (n in relations.PRODUCTS and relations.holds(base, n))]
    if any(n == "s" for n, _ in unprobed):  # every size would be fitted at this one length: refused, not written
        raise LearnError(f"the recorded ops change with the sequence length (s = {s}, {s + 4}, {s + 6}, {s - 2} each "
                         "record other ops: a Python loop over the sequence that is no run of identical iterations "
                         "carrying a state, which a learned file cannot express yet"
                         + unfolded_loop_note(run, base, precision, attn, b, s))
    held.update(_held(base, unprobed, followers, log))
    routing.refuse_held_experts(held)
    # joint probes: every variable that could change alone changes at once (with the fields that follow it)
    for mult in (0, 1):
        cfg = copy.deepcopy(base)
        bb, ss = b, s
        for name, val in knobs:
            if name not in single:
                continue
            p = probes[single[name]]
            if name == "b":
                bb = p.b + mult
            elif name == "s":
                ss = p.s + 2 * mult
            else:
                new = get_var(p.cfg, name) if mult == 0 else regime.values(name, get_var(p.cfg, name), ss)[0]
                for k in [name] + [f for f, lead in followers.items() if lead == name]:
                    put_var(cfg, k, new)
        rec, used = attempt(routing.keep_divisors(relations.keep_products(cfg, base), base), bb, ss)
        if rec is not None:
            probes.append(Probe(used, bb, ss, env_of(used, bb, ss)))
            recs.append(rec)
    FOLLOWERS.update(followers)
    return probes, single, recs, held


# --------------------------------------------------------------------------- regimes


class Regime:
    """A condition under which the recorded ops differ (``num_key_value_heads == num_attention_heads``:
    no ``repeat_kv``; ``b == 1``: the shifted labels are a view; ``s > sliding_window``: a mask). ``setup``
    puts the base config in the regime, ``couple`` keeps a probe in it after one variable changed (MHA:
    the key/value heads follow the heads), ``valid`` rejects probes outside it; ``fixed`` variables are
    not varied (``b`` under ``b == 1``); ``alts(name, val, s, default)`` gives a variable's probe values where the
    regime needs its own (a chunk that must keep the sequence padded or not, :mod:`.chunkregimes`), None
    otherwise; ``seq``: the sequence length its probes are recorded at, where not the learner's (several chunks of a
    constant chunk, :mod:`.constchunk`)."""

    def __init__(self, name: str, when: str | None, setup=None, couple=None, valid=None, fixed: tuple[str, ...] = (),
                 alts=None, seq: int | None = None) -> None:
        self.name = name
        self.seq = seq
        self.when = when
        self.setup = setup or (lambda cfg, b, s: cfg)
        self.couple = couple or (lambda cfg: cfg)
        self.valid = valid or (lambda cfg, b, s: True)
        self.fixed = fixed
        self.alts = alts or (lambda name, val, s, default: None)

    def values(self, name: str, val: Any, s: int) -> list[Any]:
        """``name``'s probe values from ``val`` at sequence ``s``: the regime's own, else :func:`alternatives`."""
        default = alternatives(name, val)
        return self.alts(name, val, s, default) or default


# --------------------------------------------------------------------------- symbolic segments


def symbolize(cuts: list[Cut], fitter: Fitter, log, skip: set[int] = frozenset()) -> list[dict[str, Any]]:
    """The segments of ``cuts[0]`` with every dimension (and size-dependent backward temporary) written as
    an expression fitted over all probes (segments in ``skip`` are left without)."""
    base = cuts[0]
    recs = [c.rec for c in cuts]
    out = []
    for n, seg in enumerate(base.segments):
        if n in skip:
            out.append(dict(seg))
            continue
        segs = [c.segments[n] for c in cuts]
        tensors = []
        for k, entry in enumerate(seg["tensors"]):
            dims = []
            for d in range(len(entry[0])):
                vals = [s["tensors"][k][0][d] for s in segs]
                try:
                    dims.append(sliced_size(segs, recs, k, d, fitter, strided=True) or fitter.fit(vals))
                except FitError as e:
                    got = sliced_size(segs, recs, k, d, fitter)
                    if got is not None:
                        dims.append(got)
                        continue
                    raise LearnError(f"segment {seg['kind']} {seg['layer']} tensor t{k} {entry[1]} dim {d} "
                                     f"(op {_creator(seg, k)}): {e}{data_dependent_note(seg)}") from None
            tensors.append([dims, entry[1], entry[2]])
        reps = []
        for j, block in enumerate(seg.get("rep", ())):
            try:
                reps.append(fit_count(fitter, [s["rep"][j]["count"] for s in segs]))
            except (FitError, IndexError, KeyError) as e:
                raise LearnError(f"segment {seg['kind']} {seg['layer']}: the count of repeated block {j} "
                                 f"(op {block['first']}): {e}") from None
        out.append({**seg, "sym_tensors": tensors, **({"sym_rep": reps} if reps else {})})
    return out


def _creator(seg: dict[str, Any], k: int) -> str:
    for op in seg["ops"]:
        if f"t{k}" in op[2]:
            return op[0]
    return "?"


def digest(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- one variant: probes -> segments


def _global_to_local(cut: Cut) -> dict[int, tuple[int, int]]:
    return cut.op_seg


def segment_json(cut: Cut, sym: list[dict[str, Any]], n: int, rec: Recording, backward: dict[int, Any],
                 fitter: Fitter, sites: list[dict[str, Any]], pfields: dict[int, str | None] | None = None) -> dict[str, Any]:
    """Segment ``n`` of a recording as the file stores it (see :mod:`.segments`)."""
    seg = cut.segments[n]
    ssym = sym[n]
    ops = []
    for k, (name, ins, outs, extra, gi) in enumerate(seg["ops"]):
        ex = dict(extra)
        ex.pop("site", None)
        sc = ex.pop("sc", None)
        if ex.get("pseudo") and sc:
            ex["sc"] = sc
            field = (pfields or {}).get(gi)
            if field:
                ex["pf"] = field
        bw = backward.get(gi)
        if bw is not None:
            kinds = _grad_kinds(rec, bw)
            if kinds:
                ex["g"] = kinds
            temp = _function_temporaries(rec, gi, bw) if name == FUNCTION_OP else 0
            if temp:  # what its Python backward holds beside the gradients (autograd_rules.function_temporaries)
                ex["bti"] = temp
        ops.append([name, ins, outs, ex] if ex else [name, ins, outs])
    tensors = [[t[0], t[1], t[2]] for t in ssym["sym_tensors"]]
    out = {"t": tensors, "ops": ops, "args": [a[0] for a in seg["args"]]}
    if seg.get("rep"):  # ops run once per head (fold.py): the core unrolls them (fitplan.arch.learned_repeat)
        out["rep"] = [{"n": n_expr, "first": b["first"], "len": b["len"], "each": b["each"],
                       **({"carry": b["carry"]} if b.get("carry") else {})}
                      for b, n_expr in zip(seg["rep"], ssym["sym_rep"])]
    # Python lifetimes
    die: dict[str, Any] = {}
    local = seg["local"]
    for tid, k in local.items():
        t = rec.tensors[tid]
        st = rec.storages[t["sid"]]
        if st["owner"] != tid:
            continue
        d = st.get("death")
        if st.get("death_phase") == "after" or d is None:
            die[f"t{k}"] = "F"
        elif seg["first"] <= d < seg["end"]:
            die[f"t{k}"] = d - seg["first"]
    for tid, j in seg["argmap"].items():
        st = rec.storages[rec.tensors[tid]["sid"]]
        d = st.get("death")
        if d is not None and st.get("death_phase") == "forward" and seg["first"] <= d < seg["end"]:
            die[f"a{j}"] = d - seg["first"]
    out["die"] = die
    if seg["kind"] == "layer":
        out["out"] = seg["out"]
    seg_sites = []
    for si, site in enumerate(rec.sites):
        if not (seg["first"] <= site["start"] < seg["end"]):
            continue
        start, end = site["start"] - seg["first"], site["end"] - 1 - seg["first"]
        inref = _local_ref(cut, n, site["input"])
        outref = _local_ref(cut, n, site["output"])
        mod = site["module"] if seg["layer"] is None else site["module"].replace(f".{seg['layer']}.", ".{i}.", 1)
        entry = {"module": mod, "start": start, "end": end, "input": inref, "output": outref,
                 "in": sites[si]["in"], "out": sites[si]["out"], "rank": len(rec.tensors[site["input"]]["shape"])}
        if site["bias"]:
            entry["bias"] = True
        if site["conv1d"]:
            entry["conv1d"] = True
        if site.get("custom"):
            entry["custom"] = True
        seg_sites.append(entry)
    if seg_sites:
        out["sites"] = seg_sites
    return out


def _local_ref(cut: Cut, n: int, tid: int) -> str:
    seg = cut.segments[n]
    if tid in seg["local"]:
        return f"t{seg['local'][tid]}"
    if tid in seg["argmap"]:
        return f"a{seg['argmap'][tid]}"
    return cut._ref(tid, n, seg, seg["local"], seg["argmap"])


def _function_temporaries(rec: Recording, gi: int, bw: dict[str, Any]) -> float:
    """A custom autograd Function's (op ``gi``) backward transient per byte of its first input (autograd_rules.py)."""
    first = rec.ops[gi]["args"][0][1][:1]
    return function_temporaries(bw, rec.tensors[first[0]] if first else None)


def _grad_kinds(rec: Recording, bw: dict[str, Any]) -> str | None:
    """Per differentiable edge: ``n`` a new gradient, ``p`` the incoming one passed through, ``-`` none."""
    ins = set(x for x in bw.get("in", []) if x is not None)
    out = []
    for g in bw.get("out", []):
        if g is None:
            out.append("-")
        elif g in ins:
            out.append("p")
        else:
            out.append("n")
    return "".join(out) if out else None


def structure(seg: dict[str, Any]) -> str:
    """A segment's ops and tensors without their sizes: equal structures fit to the same expressions."""
    return digest({"ops": [[o[0], o[1], o[2], {k: v for k, v in o[3].items() if k != "sc"}] for o in seg["ops"]],
                   "t": [[len(t[0]), t[1], t[2]] for t in seg["tensors"]]})


def _names_in(obj) -> set[str]:
    out: set[str] = set()
    if isinstance(obj, str):
        out.update(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", obj))
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            out |= _names_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            out |= _names_in(x)
    return out


def learn_variant(base_cfg: dict[str, Any], variables: list[str], precision: str, attn: str, regime: Regime,
                  b: int, s: int, log, pf: list[str | None] | None = None, refs: list[dict[str, Any]] = ()
                  ) -> dict[str, Any]:
    """Record one variant at every probe, fit, and return its segments (plain dicts) and tables.

    With ``ref`` (the same variant in another regime, already learned), segments whose structure is the
    same there are taken from it, and only the variables that the differing segments' counterparts use
    are probed."""
    log(f"  {precision}/{attn} [{regime.name}]")
    reuse: dict[int, int] = {}
    probe_vars = variables
    ref = None
    # a regime that held a size fixed (partial_rotary_factor at 1.0) fitted its segments at that value only: its
    # expressions cannot serve a regime where the size varies
    refs = [r for r in refs if not (set(r.get("fixed", ())) - set(regime.fixed)) & set(variables)]
    if refs:
        base0 = regime.setup(copy.deepcopy(base_cfg), b, s)
        cut_b = Cut(run(base0, precision, attn, b, s), {})
        mine = [structure(sg) for sg in cut_b.segments]

        def shared(r):
            keys = [structure(sg) for sg in r["cut"].segments]
            return sum(1 for n, k in enumerate(mine) if n < len(keys) and keys[n] == k)

        ref = max(refs, key=shared)
        ref_keys = [structure(sg) for sg in ref["cut"].segments]
        differing = []
        here = _full_env(Probe(base0, b, s, {"b": b, "s": s}))
        for n, sg in enumerate(cut_b.segments):
            if n < len(ref_keys) and structure(sg) == ref_keys[n] and _shapes_hold(ref["sym"][n], sg, here):
                reuse[n] = n
            else:
                differing.append(n)
        if len(cut_b.segments) == len(ref_keys) and differing:
            needed = set()
            for n in differing:
                needed |= _names_in(ref["sym"][n]["sym_tensors"])
            # a variable the reference regime held fixed (partial_rotary_factor at 1.0) appears in none of its
            # expressions but is a size here: probed as well
            needed |= set(ref.get("fixed", ())) - set(regime.fixed)
            probe_vars = [v for v in variables if v in needed]
        elif not differing:
            probe_vars = []
        log(f"    {len(reuse)} segment(s) as in [{ref['regime']}], probing {probe_vars or 'b, s only'}")
    probes, single, recs, held = make_probes(base_cfg, probe_vars, b, s, regime, None, precision, attn, log)
    if ref is not None:
        held = {**ref["held"], **held}
    floats = [k for k, v in probes[0].cfg.items() if isinstance(v, float)] + list(NESTED)
    for p in probes:
        p.env.update({k: get_var(p.cfg, k) for k in floats})
    fitter = Fitter([p.env for p in probes], single, floats)
    cuts = [Cut(r, {}) for r in recs]
    sym = symbolize(cuts, fitter, log, skip=set(reuse))
    for n, m in reuse.items():
        sym[n] = {**sym[n], "sym_tensors": ref["sym"][m]["sym_tensors"],
                  **({"sym_rep": ref["sym"][m]["sym_rep"]} if "sym_rep" in ref["sym"][m] else {})}
    base_rec = run(probes[0].cfg, precision, attn, probes[0].b, probes[0].s, backward=True)
    if signature(base_rec) != signature(recs[0]):
        raise LearnError("a second recording of the base probe differs from the first"
                         + data_dependent_note({"ops": [[o["name"]] for o in base_rec.ops]}))
    cut0 = cuts[0]
    sites = []
    def site_keys(site_list):
        # a call site by module and occurrence: op positions shift when another segment differs
        seen: dict[str, int] = {}
        out = []
        for st in site_list:
            seen[st["module"]] = seen.get(st["module"], 0) + 1
            out.append((st["module"], seen[st["module"]]))
        return out

    ref_sites = {k: i for i, k in enumerate(site_keys(ref["rec"].sites))} if ref is not None else {}
    my_keys = site_keys(recs[0].sites)
    full_envs = [_full_env(p) for p in probes] if ref is not None else []
    for si in range(len(recs[0].sites)):
        j = ref_sites.get(my_keys[si])
        if j is not None and _reproduces(ref["sites"][j], full_envs, [r.sites[si] for r in recs]):
            # the reference regime fitted this site with every size varied; these probes vary only some
            sites.append(ref["sites"][j])
            continue
        try:
            sites.append({"in": fitter.fit([r.sites[si]["in"] for r in recs]),
                          "out": fitter.fit([r.sites[si]["out"] for r in recs])})
        except FitError:
            if j is None:
                raise
            sites.append(ref["sites"][j])
    pseudo_at = [i for i, o in enumerate(recs[0].ops) if o.get("pseudo")]
    if pf is not None and len(pf) != len(pseudo_at):
        raise LearnError(f"{len(pseudo_at)} dropout/attention call sites here, {len(pf)} when every dropout is on")
    fields = dict(zip(pseudo_at, pf or []))
    segs = [segment_json(cut0, sym, n, recs[0], base_rec.backward, fitter, sites, fields)
            for n in range(len(cut0.segments))]
    params: dict[str, Any] = {}
    buffers: dict[str, Any] = {}
    if ref is None:
        for name, tid in recs[0].params.items():
            dims = [fitter.fit([r.tensors[r.params[name]]["shape"][d] for r in recs])
                    for d in range(len(recs[0].tensors[tid]["shape"]))]
            params[name] = (dims, recs[0].tensors[tid]["dtype"])
        for name, tid in recs[0].buffers.items():
            dims = [fitter.fit([r.tensors[r.buffers[name]]["shape"][d] for r in recs])
                    for d in range(len(recs[0].tensors[tid]["shape"]))]
            buffers[name] = (dims, recs[0].tensors[tid]["dtype"])
        repeats = {name: fitter.fit([r.param_repeats[name] for r in recs]) for name in recs[0].param_repeats}
    else:
        params, buffers, repeats = ref["params"], ref["buffers"], ref["repeats"]
    return {"cut": cut0, "rec": recs[0], "segments": segs, "params": params, "buffers": buffers, "sym": sym,
            "repeats": repeats,
            "sites": sites, "meta": base_rec.meta, "probes": probes, "accumulate": base_rec.accumulate,
            "no_grad": base_rec.no_grad,
            "fitter": fitter, "regime": regime.name, "held": held, "fixed": regime.fixed}


# --------------------------------------------------------------------------- the whole file


def _layer_template(name: str, layer_prefix: str) -> tuple[str, int | None]:
    m = re.match(re.escape(layer_prefix) + r"\.(\d+)\.", name)
    if not m:
        return name, None
    return layer_prefix + ".{i}." + name[m.end():], int(m.group(1))


def _every_layer_runs(res: dict[str, Any], nlayers: int) -> None:
    """Refuse a model whose training step skips layers of a kind (MllamaTextModel skips its cross-attention layers
    without image inputs, modeling_mllama.py: ``if is_cross_attention_layer and cross_attention_states is None ...:
    continue``): they record no ops, so the file would have no graph for that kind."""
    built = getattr(hf_config(res["probes"][0].cfg), "num_hidden_layers", None)
    if isinstance(built, int) and nlayers < built:
        raise LearnError(f"the training step runs {nlayers} of the model's {built} layers: a kind of layer the "
                         "step skips (cross-attention without image inputs) records no ops, so the file has no "
                         "graph for it")


def _foreign_argument(cut, cseg: dict[str, Any], j: int, a: int, where) -> str:
    """Why layer ``j``'s argument ``a`` cannot be a file's: made neither by the prologue nor by an earlier layer
    (:mod:`.crosslayer`). Gemma-4's loop slices each layer's per-layer input between the layers
    (``per_layer_inputs[:, :, i, :]``, transformers/models/gemma4/modeling_gemma4.py ``Gemma4TextModel.forward``):
    an op of no segment."""
    name = cseg["args"][a][0] if a < len(cseg["args"]) else str(a)
    made = f"made by segment {where[0]}" if where is not None else "made outside every layer"
    return (f"layer {j} argument {a} ({name}) comes neither from the prologue nor from an earlier layer: "
            f"{made} (a per-layer input the model's loop makes between the layers), which a learned file cannot "
            "express yet (its segments are the prologue, the layers and the epilogue)")


def _layer_refs(cut, cseg: dict[str, Any], j: int, kind: str, reads: dict[tuple[str, int], list]) -> list[Any]:
    """Where each argument of layer ``j`` comes from: ``h`` (the previous layer's hidden state, the first input for
    layer 0), ``P<k>`` (a prologue tensor), a slice of one (:func:`.crosslayer.per_layer_slice`), or None for a
    tensor an earlier layer made, noted in ``reads`` (its maker's rule is fitted once every layer is seen:
    :func:`.crosslayer.maker_args`)."""
    refs: list[Any] = []
    for tid, a in sorted(cseg["argmap"].items(), key=lambda kv: kv[1]):
        where = cut.owner_seg.get(tid)
        if (j == 0 and a == 0) or (j > 0 and tid == cut.segments[j]["out_tid"]):
            refs.append("h")
        elif where is not None and where[0] == 0:
            refs.append(f"P{where[1]}")
        elif where is not None and cut.segments[where[0]]["kind"] == "layer" and where[0] < j + 1:
            reads.setdefault((kind, a), []).append((j, cut.segments[where[0]]["layer"], where[1]))
            refs.append(None)
        else:
            sliced = crosslayer.per_layer_slice(cut, tid, j)
            if sliced is None:
                raise LearnError(_foreign_argument(cut, cseg, j, a, where))
            refs.append(sliced)
    return refs


EPILOGUE = " epilogue"  # the key of the epilogue's reads in :func:`_layer_refs`'s ``reads`` (no layer kind has it)


def _epilogue_refs(cut, nlayers: int, reads: dict[tuple[str, int], list]) -> list[Any]:
    """Where each argument of the epilogue comes from: ``h`` (the last layer's output), or None for a tensor an
    earlier layer made (noted in ``reads`` as read by "layer" ``nlayers``, the epilogue's place in the loop; the maker's
    rule is fitted with the layers' by :func:`.crosslayer.maker_args`). Inkling2's ``final_input`` reads the
    ``block_states`` its block boundary layers made (transformers 5.24 models/inkling2/modeling_inkling2.py
    ``Inkling2TextModel.forward``)."""
    cseg = cut.segments[-1]
    refs: list[Any] = []
    for tid, a in sorted(cseg["argmap"].items(), key=lambda kv: kv[1]):
        where = cut.owner_seg.get(tid)
        if a == 0:
            refs.append("h")
        elif where is not None and cut.segments[where[0]]["kind"] == "layer":
            reads.setdefault((EPILOGUE, a), []).append((nlayers, cut.segments[where[0]]["layer"], where[1]))
            refs.append(None)
        else:
            raise LearnError(f"the epilogue's argument {a} is made neither by the last layer nor by an earlier layer")
    return refs


def variant_entry(res: dict[str, Any], precision: str, attn: str, when: str | None, segments: dict[str, Any],
                  layer_prefix: str, kind_expr: str | None = None) -> dict[str, Any]:
    cut, rec, segs = res["cut"], res["rec"], res["segments"]
    nlayers = len(segs) - 2
    pro, epi = dict(segs[0]), dict(segs[-1])
    # prologue storages released in the epilogue (cos/sin, masks, the embedding output: the base model's locals)
    first_epi = cut.segments[-1]["first"]
    for tid, k in cut.segments[0]["local"].items():
        st = rec.storages[rec.tensors[tid]["sid"]]
        if st["owner"] != tid or st.get("death_phase") != "forward":
            continue
        d = st.get("death")
        if d is not None and d >= first_epi:
            epi.setdefault("die", {})[f"P{k}"] = d - first_epi
        elif d is not None and d >= cut.segments[0]["end"]:
            pass  # released inside a layer: the layer's argument death covers it
    epi["loss"] = _local_ref(cut, len(segs) - 1, rec.loss)
    out_mod = res["meta"]["output_module"]
    for site in epi.get("sites", []):
        if site["module"] == out_mod:
            epi["logits_from"] = site["end"] + 1
    if rec.embed_out is not None:
        pro["embed_out"] = _local_ref(cut, 0, rec.embed_out)
    kinds: dict[str, str] = {}
    kind_of_layer = []
    layer_args: dict[str, list[str]] = {}
    template_by_kind: dict[str, dict[str, Any]] = {}
    reads: dict[tuple[str, int], list[tuple[int, int, int]]] = {}  # (kind, argument) -> (layer, maker, k)
    from fitplan.api import compile_expr

    env = hf_config(res["probes"][0].cfg).to_dict()
    if kind_expr:
        _every_layer_runs(res, nlayers)
    for j in range(nlayers):
        seg = dict(segs[1 + j])
        cseg = cut.segments[1 + j]
        # the decoder loop holds a layer's input until the layer module returns (its tail may drop it later)
        last = looptail.module_last(rec, cseg)
        die = dict(seg.get("die", {}))
        if not isinstance(die.get("a0"), int) or die["a0"] < last:
            die["a0"] = last
        seg["die"] = die
        key = digest({k: v for k, v in seg.items() if k != "die"})
        if kind_expr:
            kind = str(compile_expr(kind_expr)({**env, "i": j}))
            if kinds.setdefault(kind, key) != key:
                raise LearnError(f"layer {j} is of kind {kind!r} by the learned rule but records other ops")
        else:
            kind = kinds.setdefault(key, f"k{len(kinds)}")
        kind_of_layer.append(kind)
        if kind not in template_by_kind or j > 0:
            template_by_kind[kind] = seg
        layer_args[kind] = _layer_refs(cut, cseg, j, kind, reads)
    if any(isinstance(r, list) and r[0] == "select" for refs in layer_args.values() for r in refs):
        pro = crosslayer.count_scaled(res, pro, precision, attn, nlayers)  # the sliced tensor: the layer count wide
    epi_args = _epilogue_refs(cut, nlayers, reads)
    for (kind, a), ref in crosslayer.maker_args(reads, env, nlayers).items():
        if kind == EPILOGUE:
            epi_args[a] = ref
        else:
            layer_args[kind][a] = ref
    first = cut.segments[1]["argmap"]
    first_tid = next(t for t, a in first.items() if a == 0)
    first_input = f"P{cut.owner_seg[first_tid][1]}"
    ids = {}
    for nm, seg in (("prologue", pro), ("epilogue", epi)):
        d = digest(seg)
        segments[d] = seg
        ids[nm] = d
    layer_ids = {}
    for kind, seg in template_by_kind.items():
        d = digest(seg)
        segments[d] = seg
        layer_ids[kind] = d
    when = seqbound.bounded(when, segs)  # a sequence padded to one chunk: the graph holds up to it
    return {"precision": precision, "attn": attn, "when": when, "prologue": ids["prologue"],
            "epilogue": ids["epilogue"], "layers": layer_ids, "layer_args": layer_args, "first_input": first_input,
            "kinds": kind_of_layer, **({"epilogue_args": epi_args} if len(epi_args) > 1 else {})}


SWITCH_SKIP = {"use_cache", "tie_word_embeddings", "return_dict", "output_hidden_states", "output_attentions",
               "is_encoder_decoder", "torchscript", "tie_encoder_decoder", "is_decoder", "add_cross_attention",
               "output_router_logits", "use_return_dict", "_attn_implementation_autoset"}


def _full_env(p: Probe) -> dict[str, Any]:
    """Every config field of a probe as the config class resolves it (not only the varied ones), b and s."""
    resolved = hf_config(p.cfg).to_dict()
    names = set(resolved) | set(NESTED)
    env = {}
    for k in names:
        try:
            env[k] = get_var(resolved, k)
        except Exception:  # noqa: BLE001 - a nested name this config does not have
            pass
    return {**env, **p.env}


def _shapes_hold(ref_sym: dict[str, Any], seg: dict[str, Any], env: dict[str, Any]) -> bool:
    """Whether a segment fitted in another regime gives this regime's recorded shapes at its base config. The same
    ops in the same order (:func:`structure`) can lay a tensor out otherwise at ``b = 1``: ``torch.einsum`` groups
    the dimensions of size 1 apart from the others when it permutes its operands for the product (torch 2.13,
    aten/src/ATen/native/Linear.cpp ``sumproduct_pair``), so ProphetNet's n-gram attention (``einsum("bnhtc,bnhsc->
    bnhts")``, models/prophetnet/modeling_prophetnet.py, 5.24) permutes a query to ``[b, n, h, t, c, 1]`` at
    ``b > 1`` and to ``[n, h, t, c, 1, 1]`` at ``b = 1``. The reference's expressions then do not serve this
    regime: the segment is fitted here."""
    from fitplan.api import compile_expr

    try:
        return all([compile_expr(d)(env) for d in sym[0]] == list(t[0])
                   for sym, t in zip(ref_sym["sym_tensors"], seg["tensors"]))
    except Exception:  # noqa: BLE001 - an expression over a name this config lacks: not shown to hold
        return False


def _reproduces(site: dict[str, str], envs: list[dict[str, Any]], seen: list[dict[str, Any]]) -> bool:
    """Whether a site's fitted in/out features give what every probe recorded."""
    from fitplan.api import compile_expr

    try:
        return all(compile_expr(site[k])(env) == got[k] for env, got in zip(envs, seen) for k in ("in", "out"))
    except Exception:  # noqa: BLE001 - an expression over a field these probes lack
        return False


STRING_SKIP = {"model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path", "name_or_path",
               "architectures", "problem_type", "tokenizer_class", "prefix", "finetuning_task"}


def _string_alternatives(k: str, v: str, cls) -> list[str]:
    """Other values to try for a string field: other activation functions for an activation (a key of
    transformers' ``ACT2FN``), else the config class's default."""
    from transformers.activations import ACT2FN

    from . import configrules

    if v in ACT2FN:
        return [a for a in ("silu", "gelu", "gelu_pytorch_tanh") if a != v][:1]
    default = configrules.class_defaults(cls).get(k)
    return [default] if isinstance(default, str) and default != v else []


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def switch_state(v: Any) -> Any:
    """What a switch's value decides about the graph: the value itself for a true/false or string field,
    only whether it is set for a number (``clip_qkv``: the clamps are recorded whatever the bound)."""
    return (v is not None) if _is_number(v) or v is None else v


def switch_term(k: str, v: Any) -> str:
    """One switch's part of ``flags.when``: ``attention_bias``, ``not mlp_bias``, ``hidden_act == 'silu'``,
    ``clip_qkv is not None`` (a number), ``clip_qkv is None``."""
    if isinstance(v, bool):
        return k if v else f"not {k}"
    if v is None:
        return f"{k} is None"
    if _is_number(v):
        return f"{k} is not None"
    return f"{k} == {v!r}"


def _numeric_switch(k: str, v: Any, cls) -> bool:
    """A number whose config class leaves it unset by default (OLMo's ``clip_qkv``, Gemma's logit
    softcapping): setting it may add ops, so unsetting it is the value to try."""
    from . import configrules

    return _is_number(v) and cls is not None and k in configrules.class_defaults(cls) \
        and configrules.class_defaults(cls)[k] is None


def structural_flags(base: dict[str, Any], variant: tuple[str, str], b: int, s: int, log, cls=None,
                     known: dict[str, Any] | None = None, others: tuple[tuple[str, str], ...] = (),
                     skip: set[str] = frozenset()) -> dict[str, Any]:
    """The config's true/false fields that change the recorded ops (biases, parallel blocks, q/k norms),
    its string fields that do (the activation, DeepSeek's ``topk_method``) and its numbers that do when
    unset (``clip_qkv``; tried under ``variant`` and ``others``: an eager-only softcapping; not a size or a
    regime's field, in ``skip``), with their
    values here; ``known`` numeric switches this config leaves unset are recorded as unset. The file is
    learned for these values (the bundle learns a catalog config's others and merges them, see
    :func:`.files.merge`)."""
    ref = signature(run(base, variant[0], variant[1], b, s))
    refs: dict[tuple[str, str], Any] = {}
    out: dict[str, Any] = {}
    for k, v in base.items():
        if k in SWITCH_SKIP or k in STRING_SKIP or k.startswith("_"):
            continue
        tries = [variant]
        if isinstance(v, bool):
            alts: list[Any] = [not v]
        elif isinstance(v, str) and cls is not None:
            alts = _string_alternatives(k, v, cls)
        elif _numeric_switch(k, v, cls) and k not in skip:
            alts, tries = [None], [variant, *others]
        else:
            continue
        if _differs(base, k, alts, tries, ref, refs, b, s):
            out[k] = v
    for k, v in (known or {}).items():
        if _is_number(v) and base.get(k) is None:
            out[k] = None
    return out


def _names(expr: str | None) -> list[str]:
    return re.findall(r"[A-Za-z_][A-Za-z_0-9]*", expr or "")


def _differs(base, k, alts, tries, ref, refs, b, s) -> bool:
    """Whether giving ``k`` one of ``alts`` changes the recorded ops under one of ``tries``."""
    for i, var in enumerate(tries):
        want = ref if i == 0 else refs.setdefault(var, signature(run(base, var[0], var[1], b, s)))
        for alt in alts:
            try:
                sig = signature(run({**base, k: alt}, var[0], var[1], b, s))
            except Exception:  # noqa: BLE001 - the other value is not allowed: not a switch
                continue
            if sig != want:
                return True
    return False


def flag_condition(flags: dict[str, Any]) -> str | None:
    """The file's ``flags.when``: ``attention_bias and not mlp_bias and hidden_act == 'silu' and clip_qkv
    is not None``."""
    return " and ".join(switch_term(k, v) for k, v in flags.items()) or None


def toggles(base: dict[str, Any], cls) -> list[list[Regime]]:
    """The regime switches that apply to this config, each a list of mutually exclusive states (the first
    is where the others are compared from)."""
    from .configrules import attribute_map

    amap = attribute_map(cls)
    heads = amap.get("num_attention_heads", "num_attention_heads")
    hidden = amap.get("hidden_size", "hidden_size")
    kv = next((k for k in base if re.search(r"(key_value_heads|kv_heads|n_head_kv)$", k)
               and isinstance(base[k], int) and not isinstance(base[k], bool)), None)
    out = []
    if kv and heads in base:
        def widen(cfg, a, g):
            cfg = {**cfg, heads: a, kv: g}
            if hidden in cfg and isinstance(cfg[hidden], int) and cfg[hidden] % (16 * a):
                # a head width divisible by 16 keeps partial rotary dimensions (x 0.25, 0.5, 0.75) even, also
                # when the heads probe doubles the heads
                cfg[hidden] = 16 * a * -(-cfg[hidden] // (16 * a))
            return cfg

        gqa = Regime("gqa", f"{kv} != {heads} and {kv} != 1", lambda cfg, b, s: widen(cfg, 12, 4),
                     valid=lambda cfg, b, s: cfg[kv] not in (1, cfg[heads]) and cfg[heads] % cfg[kv] == 0)
        mha = Regime("mha", f"{kv} == {heads}", lambda cfg, b, s: {**cfg, kv: cfg[heads]},
                     lambda cfg: {**cfg, kv: cfg[heads]}, fixed=(kv,))
        mqa = Regime("mqa", f"{kv} == 1 and {heads} != 1", lambda cfg, b, s: widen(cfg, max(cfg[heads], 2), 1),
                     valid=lambda cfg, b, s: cfg[heads] != 1, fixed=(kv,))
        out.append([gqa, mha, mqa])
    out.append([Regime("b>1", "b != 1", valid=lambda cfg, b, s: b != 1),
                Regime("b1", "b == 1", fixed=("b",))])
    if get_var(base, "partial_rotary_factor") == 1.0:
        out.append(_full_rotary())
    win = next((k for k in ("sliding_window", "attention_chunk_size") if k in base), None)
    if win:
        cond = f"{win} is not None and s > {win}"
        out.append([Regime("no-window", f"not ({cond})", lambda cfg, b, s, win=win: {**cfg, win: 4096},
                           valid=lambda cfg, b, s, win=win: s <= cfg[win], fixed=(win,)),
                    Regime("window", cond, lambda cfg, b, s, win=win: {**cfg, win: 5},
                           valid=lambda cfg, b, s, win=win: s > cfg[win], fixed=(win,))])
    return out


def _full_rotary() -> list[Regime]:
    """Rotating every channel (``partial_rotary_factor == 1.0``) records other ops than rotating a part: the
    models slice ``q[..., :rotary_dim]`` and ``q[..., rotary_dim:]``, and indexing a whole dimension is no op
    (torch 2.13 torch/csrc/autograd/python_variable_indexing.h ``applySlicing``: a slice from 0 to the size with
    step 1 returns the tensor itself), so the rotated half is a ``slice`` only below 1.0 (Phi-3 at 1.0, Phi-4-mini
    at 0.75, transformers 5.24 modeling_phi3.py ``apply_rotary_pos_emb``). Learned as a regime, the factor is a
    symbol below 1.0 instead of a size held at 1.0."""
    f = "partial_rotary_factor"
    return [Regime("rotary-full", f"{f} == 1.0", lambda cfg, b, s: _with(cfg, f, 1.0),
                   valid=lambda cfg, b, s: get_var(cfg, f) == 1.0, fixed=(f,)),
            Regime("rotary-part", f"{f} < 1.0", lambda cfg, b, s: _with(cfg, f, 0.5),
                   valid=lambda cfg, b, s: get_var(cfg, f) < 1.0)]


def _with(cfg: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    put_var(out, name, value)
    return out


def _combine(regs: list[Regime]) -> Regime:
    def setup(cfg, b, s):
        for r in regs:
            cfg = r.setup(cfg, b, s)
        return cfg

    def couple(cfg):
        for r in regs:
            cfg = r.couple(cfg)
        return cfg

    def valid(cfg, b, s):
        return all(r.valid(cfg, b, s) for r in regs)

    def alts(name, val, s, default):
        return next((got for r in regs if (got := r.alts(name, val, s, default)) is not None), None)

    when = " and ".join(f"({r.when})" for r in regs if r.when) or None
    fixed = tuple(x for r in regs for x in r.fixed)
    seq = max((r.seq for r in regs if r.seq), default=None)
    return Regime("+".join(r.name for r in regs) or "base", when, setup, couple, valid, fixed, alts, seq)


learn_full = learner.learn_full
"""The file's content, the per-variant results and regimes (:func:`.learner.learn_full`: record, derive, fold)."""


def learn(config: dict[str, Any], **kw) -> dict[str, Any]:
    """Learn the architecture of ``config``'s ``model_type``; returns the file's content (a dict)."""
    return learn_full(config, **kw)[0]


def _missing_rules(segments: dict[str, Any]) -> dict[str, Any]:
    """Save rules for the ops this file uses that fitplan's shared table (autograd.json) lacks, so a file
    learned for a new architecture is complete on its own."""
    from fitplan.api import autograd_table

    from .autograd_rules import table

    try:
        known = set(autograd_table())
    except Exception:  # noqa: BLE001 - no shared table yet (while regenerating the bundle)
        known = set()
    ops = {op[0] for seg in segments.values() for op in seg["ops"] if not (len(op) > 3 and op[3].get("pseudo"))}
    ops.discard(FUNCTION_OP)  # the core's rule (trace/kernels.py EXTRA_RULES)
    return table(ops - known)


def _non_tensor_linears(modules: list[str], layer_prefix: str) -> dict[str, Any]:
    """``nn.Linear`` subclasses whose forward returns something else than a tensor (Llama-4's router returns
    ``(scores, logits)``): peft 0.21 adapts them like any ``nn.Linear`` (``all-linear`` included) and its
    ``lora.Linear.forward`` then fails (``result.dtype`` on a tuple, peft/tuners/lora/layer.py); the core
    refuses LoRA targets that select them."""
    names = sorted({_layer_template(m, layer_prefix)[0] for m in modules})
    return {"non_tensor_linears": names} if names else {}


def _uncalled_linears(rec: Recording, layer_prefix: str) -> dict[str, Any]:
    """``nn.Linear`` modules whose forward the training step never calls: Mamba's ``dt_proj``, whose weight the
    reference scan reads directly (``self.dt_proj.weight @ time_step.transpose(1, 2)``, transformers 5.24
    modeling_mamba.py ``MambaMixer.slow_forward``). peft 0.21 wraps them all the same (``all-linear`` matches by
    type, tuners/tuners_utils.py ``inject_adapter``), and their adapters, never run, get no gradient: the core
    counts them as weights only."""
    called = {s["module"] for s in rec.sites}
    out_mod = rec.meta.get("output_module")
    names = sorted({_layer_template(n.rsplit(".", 1)[0], layer_prefix)[0] for n, role in rec.meta["roles"].items()
                    if role.startswith("linear:") and n.rsplit(".", 1)[0] not in called and n.rsplit(".", 1)[0] != out_mod})
    return {"uncalled_linears": names} if names else {}


def peft_parameter_targets(model_type: str) -> dict[str, Any]:
    """peft 0.21's v4 -> v5 MoE target conversion for this model type (``utils/transformers_weight_conversion
    .py``): which old module names reach which fused parameters, and how many names share one (the rank
    multiplier)."""
    try:
        from peft.utils import transformers_weight_conversion as T
    except ImportError:
        return {}
    base = T._MODEL_TO_CONVERSION_PATTERN.get(model_type)
    mapping = T._MOE_TARGET_MODULE_MAPPING.get(base) if base else None
    fused = T._MOE_FUSED_TARGETS.get(base, {}) if base else {}
    if not mapping or not fused:
        return {}
    return {"parameter_targets": {old: [new, len(fused.get(new, [])) or 1] for old, new in mapping.items()}}


def _layer_prefix(rec: Recording) -> str:
    names = list(rec.params)
    for n in names:
        m = re.match(r"(.*?)\.0\.", n)
        if m:
            return m.group(1)
    return "model.layers"


def _used_names(segments: dict[str, Any], params, buffers) -> set[str]:
    out: set[str] = set()
    ident = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")

    def scan(x):
        if isinstance(x, str):
            out.update(ident.findall(x))
        elif isinstance(x, (list, tuple)):
            for y in x:
                scan(y)
        elif isinstance(x, dict):
            for y in x.values():
                scan(y)

    for seg in segments.values():
        scan(seg.get("t"))
        for site in seg.get("sites", []):
            scan([site["in"], site["out"]])
        for op in seg["ops"]:
            if len(op) > 3:
                scan(op[3].get("pf"))
    for p in params:
        scan(p[1])
    for bb in buffers:
        scan(bb[1])
    return out
