"""Learn, check, write: what ``fitplan learn-architecture`` runs (and the bundled files were made with).

The learning goes by phase, one function each:

1. :func:`record_model`: the config as the learner records it, the layer pattern, the variants (precision class ×
   attention) the model runs, its regimes' switches and the config switches that change its graph;
2. :func:`derive_variants`: per variant, the regime classes (one recording per combination of regime states, grouped
   by the ops they record) and each class's segments and tables (:func:`.derive.learn_variant`);
3. :func:`fold_variants`: the per-variant results folded into one file's content (variants, shared segments,
   parameters, buffers, the config rules);
4. :func:`verify_learned`: the file against fresh recordings at held-out sizes (and the memory referee);
5. :func:`write_learned`: the file written, with the per-op diff against the one it replaces.

:func:`learn_full` runs the first three (``derive.learn_full`` is this function); :func:`learn_and_check` all five.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fitplan.api import FitplanError, archformat

from . import keptgraph, layercounts, relations, routing
from .limits import LAYERDROP_WHY, SCAN_WHY, dropout_fields


@dataclass
class ModelRecord:
    """What :func:`record_model` found: the base config recorded from and what the derivation needs of it."""

    model_type: str
    cls: Any
    """The transformers config class."""
    base: dict[str, Any]
    """The config the learner records from (distinct tensors for tied weights, token ids inside the vocabulary,
    every layer running, the layer pattern's number of layers)."""
    variables: list[str]
    skipping: list[str]
    """LayerDrop-style fields set to 0 (every layer runs): the file's ``assumed`` entries."""
    kind_expr: str | None
    pattern_held: dict[str, Any]
    """Fields whose other values build layers of a form the file has no graph for (:func:`.patterns.held_fields`)."""
    switches: list[Any]
    """Per regime switch, its states (``derive.toggles``)."""
    distinct: dict[str, float]
    """Dropout field -> the distinct probability it is recorded with (each call site tells which field it reads)."""
    supported: list[tuple[str, str]]
    """The ``(precision class, attention)`` variants the model runs."""
    flags: Any
    flag_when: str | None
    results: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    """``(precision, attention, regime name)`` -> what :func:`.derive.learn_variant` learned (filled by
    :func:`derive_variants`)."""
    specs: list[tuple[str, str, Any]] = field(default_factory=list)
    """``(precision, attention, regime)`` per learned class, in learning order."""


def learn_full(config: dict[str, Any], *, log=print, variants=None, b: int = 2, s: int = 16, regimes: bool = True,
               first_only: bool = False, known: dict[str, Any] | None = None):
    """The learned file's content for ``config``'s ``model_type``, with the per-variant results and regimes (for
    :mod:`.verify`): :func:`record_model`, :func:`derive_variants`, :func:`fold_variants`. ``known``: switches an
    earlier learning of this type found (see :func:`.derive.structural_flags`); ``first_only``: one regime class
    per variant (tests)."""
    from . import derive as D

    rec = record_model(config, log=log, variants=D.VARIANTS if variants is None else variants, b=b, s=s,
                       regimes=regimes, known=known)
    derive_variants(rec, log=log, b=b, s=s, first_only=first_only)
    return fold_variants(rec, log=log), rec.results, rec.specs


# --------------------------------------------------------------------------- 1. record


def record_model(config: dict[str, Any], *, log, variants, b: int, s: int, regimes: bool,
                 known: dict[str, Any] | None) -> ModelRecord:
    """Phase 1: the base config, the layer pattern, the supported variants, the regime switches and the structural
    flags (each found by recording the model)."""
    from . import chunkregimes, configrules, constchunk, patterns, sizeregimes
    from . import derive as D

    model_type = config["model_type"]
    base, skipping = _base_config(config)
    cls = configrules.config_class(model_type)
    layercounts.refuse_nested_layer_counts(base, cls)
    D.NESTED.clear()
    D.FOLLOWERS.clear()
    D.RECENT.clear()
    relations.PRODUCTS.clear()
    routing.DIVISORS.clear()
    D.NESTED.update(D.nested_variables(base))
    variables = D.size_variables(base) + list(D.NESTED)
    log(f"learning {model_type}: variables {variables}")
    pattern = patterns.learn_pattern(base, variables, log)
    kind_expr, held = None, {}
    if pattern is not None:
        held = pattern["held"]
        variables = [v for v in variables if v not in pattern["positions"]]  # layer indices, not sizes
        base = patterns.with_layers(pattern["cfg"], pattern["record_layers"])
        kind_expr = patterns.kind_expression(pattern["rules"])
        log(f"  layer pattern: {pattern['rules']}, recorded with {pattern['record_layers']} layers")
    switches = D.toggles(base, cls) if regimes else []
    drops, _ = dropout_fields(base)
    distinct = {f: D.DISTINCT_P[i] for i, f in enumerate(drops)}
    supported = _supported(base, variants, log)
    pow2 = sizeregimes.power_of_two_heads(base, cls, supported[0], log) if regimes else None
    switches += [pow2] if pow2 else []
    chunk = chunkregimes.padded_chunk(base, variables, supported[0], b, s, log) if regimes else None
    switches += [chunk] if chunk else []
    chunks = constchunk.chunk_switch(base, supported[0], b, s, log) if regimes else None
    switches += [chunks] if chunks else []
    others = tuple(v for v in supported if v[1] != supported[0][1])[:1]
    flags = D.structural_flags(base, supported[0], b, s, log, cls, known, others,
                               skip=set(variables) | {n for sw in switches for r in sw for n in D._names(r.when)})
    flag_when = D.flag_condition(flags)
    if flags:
        log(f"  switches that change the graph, learned as given: {flags}")
    return ModelRecord(model_type, cls, base, variables, skipping, kind_expr, held, switches, distinct, supported, flags,
                       flag_when)


def _base_config(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The config the learner records from, and the LayerDrop-style fields it sets to 0."""
    from . import derive as D

    base = D.hf_config(config).to_dict()
    for k in ("_name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype"):
        base.pop(k, None)
    if "tie_word_embeddings" in base:
        base["tie_word_embeddings"] = False  # record distinct tensors; the file says when they are one
    vocab = base.get("vocab_size")
    for k, v in list(base.items()):  # token ids must lie inside the (small) recorded vocabulary
        if k.endswith("_token_id") and isinstance(v, int) and isinstance(vocab, int) and v >= vocab // 2:
            base[k] = None if k != "pad_token_id" else 0
        elif k.endswith("_token_id") and isinstance(v, list):
            base[k] = None
    from .configrules import config_class, sentinels

    base.update(sentinels(base, config_class(config["model_type"])))  # widths the class derives from "auto"
    from .shrink_lists import derived_layer_widths, pinned_widths

    for k in derived_layer_widths(base, base, base.get("num_hidden_layers")) + pinned_widths(base):
        del base[k]  # a width (list) the class derives: it follows the probed widths (Laguna's heads, XLNet's d_head)
    _, skipping = dropout_fields(base)
    base.update({k: 0.0 for k in skipping})  # every layer runs: a stated assumption of the file (``assumed``)
    return base, skipping


def _supported(base: dict[str, Any], variants, log) -> list[tuple[str, str]]:
    """The variants the model builds in (a kernel it refuses is logged and left out)."""
    from . import derive as D

    supported = []
    routing.FORCED.clear()
    from .shrink_run import bf16_failure

    fails: dict[str, str] = {}
    for precision, attn in variants:
        try:
            model, _ = D.build(base, precision, attn)
        except ValueError as e:
            log(f"  {precision}/{attn}: not supported by this model ({str(e).splitlines()[0][:90]})")
            continue
        if precision == "16" and fails.setdefault(precision, bf16_failure(base, model)):
            log(f"  {precision}/{attn}: left out, the model does not run in it ({fails[precision]})")
            continue
        supported.append((precision, attn))
        _fix_routing(base, model, log)
    if not supported:
        raise D.LearnError(f"the model runs none of the variants {', '.join('/'.join(v) for v in variants)}")
    return supported


def _fix_routing(base: dict[str, Any], model, log) -> None:
    """Where the model's routers pick experts per token (:mod:`.routing`), record them fixed to balanced routing
    (``routing.FORCED``, read by ``derive.run`` and the file's ``assumed``)."""
    from . import derive as D

    names = routing.fields(base)
    linear = bool(names) and bool(routing.routers(model, D.get_var(base, names[0])))
    by_index = bool(names) and not linear and bool(routing.index_routers(model, D.get_var(base, names[0])))
    if (linear or by_index) and not routing.FORCED:
        routing.FORCED.update({"experts": names[0], "top_k": names[1], **({"by": "indices"} if by_index else {})})
        log(f"  routers fixed to balanced routing while recording ({names[1]} of {names[0]} experts per token)")


# --------------------------------------------------------------------------- 2. derive


def derive_variants(rec: ModelRecord, *, log, b: int, s: int, first_only: bool) -> None:
    """Phase 2: for each supported variant, its regime classes and what each class learns (into ``rec.results``
    and ``rec.specs``)."""
    from . import derive as D

    for precision, attn in list(rec.supported):
        try:
            vbase, pf = _dropout_sites(rec, rec.distinct, precision, attn, b, s, log)
        except D.LearnError as e:
            if (precision, attn) == rec.supported[0] or "runs in none of the regimes" not in str(e):
                raise
            # the model's own code fails in this precision class (DBRX's index_add_ of autocast's bf16 expert
            # outputs into an fp32 buffer, modeling_dbrx.py): a run in it fails too, so no graph is learned for it
            log(f"  {precision}/{attn}: left out, the model does not run in it ({str(e).split(': ', 1)[-1]})")
            rec.supported.remove((precision, attn))
            continue
        classes = _regime_classes(rec, vbase, precision, attn, b, s, log)
        log(f"  {precision}/{attn}: {len(classes)} distinct graph(s) over {sum(len(c) for c in classes.values())} regimes")
        learned: list[dict[str, Any]] = []
        for combos in list(classes.values())[:1] if first_only else classes.values():
            reg = _class_regime(rec, combos, len(classes))
            bb = 1 if "b" in reg.fixed else b
            res = D.learn_variant(vbase, rec.variables, precision, attn, reg, bb, reg.seq or s, log, pf, refs=learned)
            learned.append(res)
            res["variables"] = rec.variables
            rec.results[(precision, attn, reg.name)] = res
            rec.specs.append((precision, attn, reg))


def _dropout_sites(rec: ModelRecord, distinct: dict[str, float], precision: str, attn: str, b: int, s: int,
                   log) -> tuple[dict[str, Any], list[str | None]]:
    """The config a variant is learned from, and the dropout field each dropout call site reads: every probability
    distinct and nonzero, so each call site tells which field it reads; SDPA is recorded without dropout (the CPU
    would take the math path, whose output layout CUDA's kernels do not have), its field found from a recording
    with it on."""
    import itertools

    from . import derive as D

    mapped = {**rec.base, **distinct}
    rec_map, last = None, None
    for combo in itertools.product(*rec.switches):
        default = D._combine(list(combo))
        bb = 1 if "b" in default.fixed else b
        try:
            rec_map = D.run(default.setup(mapped, bb, s), precision, attn, bb, s)
            break
        except Exception as e:  # noqa: BLE001 - e.g. DeepSeek-V2's attention needs kv heads == heads
            log(f"    regime {default.name} does not run: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            last = e
    if rec_map is None:
        refused = _refused_dropouts(rec.base, distinct, precision, attn, log)
        if refused:  # learned at the config's value: the model takes no other
            return _dropout_sites(rec, {f: p for f, p in distinct.items() if f not in refused}, precision, attn, b, s,
                                  log)
        from .verify import failing_line

        why = f": {failing_line(last)}" if last is not None else ""
        raise D.LearnError(f"{precision}/{attn}: the model runs in none of the regimes{why}")
    pf = []
    sdpa_fields = set()
    for o in rec_map.ops:
        if o.get("pseudo"):
            pv = o["scalars"].get("p", 0.0)
            found = next((f for f, v in distinct.items() if abs(v - pv) < 1e-9), None)
            pf.append(found)
            if o["pseudo"] == "sdpa" and found:
                sdpa_fields.add(found)
    return {**mapped, **{f: 0.0 for f in sdpa_fields}}, pf


def _refused_dropouts(base: dict[str, Any], distinct: dict[str, float], precision: str, attn: str, log) -> list[str]:
    """The dropout fields whose nonzero probability the model class refuses when it is built (DiffLlama's attention:
    ``ValueError: DiffLlama does not support attention_dropout > 0``, modeling_diffllama.py): recorded at the
    config's value, their call sites have no dropout, as in every config the class accepts."""
    from . import derive as D

    try:
        D.build(base, precision, attn)
    except Exception:  # noqa: BLE001 - the config itself does not build: no field to blame
        return []
    refused = []
    for f, p in distinct.items():
        try:
            D.build({**base, f: p}, precision, attn)
        except Exception as e:  # noqa: BLE001 - the class's own check, whatever it raises
            refused.append(f)
            log(f"    dropout field {f}: the model refuses {p} ({type(e).__name__}: {str(e).splitlines()[0][:100]}); "
                f"recorded at {base.get(f)!r}")
    return refused


def _regime_classes(rec: ModelRecord, vbase: dict[str, Any], precision: str, attn: str, b: int, s: int,
                    log) -> dict[str, list[tuple[Any, ...]]]:
    """Every combination of regime states recorded once (ops only), grouped by the ops they record; each group is
    learned once, from its most general combination (the states are ordered general-first)."""
    import itertools
    import json

    from . import derive as D

    classes: dict[str, list[tuple[Any, ...]]] = {}
    for combo in itertools.product(*rec.switches):
        reg = D._combine(list(combo))
        bb, ss = 1 if "b" in reg.fixed else b, reg.seq or s
        try:
            sig = D.signature(D.run(reg.setup(vbase, bb, ss), precision, attn, bb, ss))
        except Exception as e:  # noqa: BLE001 - a combination this model cannot take
            log(f"    regime {reg.name} not learnable: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            continue
        classes.setdefault(json.dumps(sig), []).append(combo)
    return classes


def _class_regime(rec: ModelRecord, combos: list[tuple[Any, ...]], nclasses: int):
    """The regime a class is learned in: its first combination, holding when any of its combinations does (and the
    structural flags' condition)."""
    from . import derive as D

    reg = D._combine(list(combos[0]))
    if nclasses == 1:
        reg.when = None
    else:
        reg.when = " or ".join("(" + " and ".join(f"({r.when})" for r in combo if r.when) + ")" for combo in combos)
    if rec.flag_when:
        reg.when = f"({rec.flag_when}) and ({reg.when})" if reg.when else rec.flag_when
    return reg


# --------------------------------------------------------------------------- 3. fold


def fold_variants(rec: ModelRecord, *, log) -> dict[str, Any]:
    """Phase 3: the learned file's content (a dict) from every variant's results."""
    import peft
    import torch
    import transformers

    from . import configrules, files, layerkinds, nograd
    from . import derive as D
    from .. import __version__
    from .ties import tied_rows

    results, supported = rec.results, rec.supported
    held = [*results.values(), {"held": rec.pattern_held}]
    ref = next(iter(results.values()))
    meta = ref["meta"]
    layer_prefix = D._layer_prefix(ref["rec"])
    segments: dict[str, Any] = {}
    entries = [D.variant_entry(results[(p, a, r.name)], p, a, r.when, segments, layer_prefix, rec.kind_expr)
               for p, a, r in rec.specs]
    if rec.kind_expr is None and len({tuple(e["kinds"]) for e in entries}) > 1:
        rec.kind_expr = layerkinds.first_layer_rule(rec, entries, log)  # bf16's first layer casts (Mamba)
        if rec.kind_expr:
            entries = [D.variant_entry(results[(p, a, r.name)], p, a, r.when, segments, layer_prefix, rec.kind_expr)
                       for p, a, r in rec.specs]
    kinds = entries[0]["kinds"]
    for e in entries:
        if len(set(e["kinds"])) != len(set(kinds)):
            raise D.LearnError("the layer pattern differs between precisions / attention kernels")
        del e["kinds"]
    kind_names = sorted(set(kinds), key=kinds.index)
    ref16 = next((r for (p, a, _), r in results.items() if p == "16"), ref)  # a mixed-only learning (drift test)
    params, buffers, repeats = _parameters(rec, ref16, meta, kinds, layer_prefix)
    tied = tied_rows(rec.base, params, meta.get("tied_keys"), lambda n: D._layer_template(n, layer_prefix)[0])
    cfg_rules = _config_rules(rec, ref, segments, params, buffers, repeats, entries, log)
    return {
        "format": archformat.FORMAT,
        "model_type": rec.model_type,
        "learned": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
                    "peft": peft.__version__, "fitplan_torch": __version__, "config_class": meta["config_class"],
                    "model_class": meta["model_class"]},
        "config": cfg_rules,
        "spec": configrules.spec_map(rec.base, rec.cls, cfg_rules["fields"],
                                     files.held_sizes(held).get("held")),
        "params": params,
        "tied": tied,
        "buffers": buffers,
        **({"repeats": repeats} if repeats else {}),
        "output_module": meta["output_module"],
        "layers": {"kind": rec.kind_expr, "kinds": kind_names, "prefix": layer_prefix},
        "variants": entries,
        "segments": segments,
        "accumulate_clone": sorted(n for n, how in ref["accumulate"].items() if how == "clone"),
        **_frozen(meta, layer_prefix),
        **nograd.no_grad_rows(ref.get("no_grad", []), list(ref["accumulate"]),
                              lambda n: D._layer_template(n, layer_prefix)[0], {p[0] for p in params}, log),
        "flags": {"values": rec.flags, "when": rec.flag_when},
        **files.held_sizes(held),
        "autograd": D._missing_rules(segments),
        "lora": {**D.peft_parameter_targets(rec.model_type),
                 **D._non_tensor_linears(ref["rec"].non_tensor_sites, layer_prefix),
                 **D._uncalled_linears(ref["rec"], layer_prefix)},
        "attn_implementations": sorted({a for _, a in supported}),
        **keptgraph.rows(ref["rec"].kept_graphs),
        **_assumed(rec.skipping, segments),
    }


def _frozen(meta: dict[str, Any], layer_prefix: str) -> dict[str, Any]:
    """The file's ``frozen``: the parameters the model creates with ``requires_grad=False`` (AfMoE's router
    ``expert_bias``, transformers 5.24 modeling_afmoe.py ``AfmoeTokenChoiceRouter``): weights without a gradient
    or optimizer states, full fine-tuning included."""
    from . import derive as D

    names = sorted({D._layer_template(n, layer_prefix)[0] for n in meta.get("frozen", ())})
    return {"frozen": names} if names else {}


def _assumed(skipping: list[str], segments: dict[str, Any]) -> dict[str, Any]:
    """The file's ``assumed``: layer skipping off (every layer runs), balanced routing where the routers were
    fixed while recording (:mod:`.routing`), and the reference scan where a loop over the sequence was folded
    (:mod:`.seqloop`: a carried repeated block)."""
    out: dict[str, Any] = {k: {"value": 0.0, "why": LAYERDROP_WHY} for k in skipping}
    if any(r.get("carry") for seg in segments.values() for r in seg.get("rep", ())):
        out["scan"] = {"value": "reference", "why": SCAN_WHY, "always": True}
    if routing.sizes_the_step(segments):
        out["routing"] = {"value": "balanced", "why": routing.ROUTING_WHY, "always": True}
    return {"assumed": out} if out else {}


def _parameters(rec: ModelRecord, ref16: dict[str, Any], meta: dict[str, Any], kinds: list[str],
                layer_prefix: str) -> tuple[list[list[Any]], list[list[Any]], dict[str, Any]]:
    """The parameter rows (from the 16-bit recording: its dtypes say which tensors stay fp32), the buffer rows and
    the repeated blocks' counts (``norms.{h}.weight``: how many)."""
    from . import derive as D

    params = []
    seen: dict[Any, list[Any]] = {}  # template, or (template, shape) of a per-layer one -> its row
    for name, (dims, dtype) in ref16["params"].items():
        tmpl, layer = D._layer_template(name, layer_prefix)
        if layer is not None:
            # one row per shape: a name two layer kinds give different shapes (Kimi-Linear's ``self_attn.o_proj``,
            # ``linear_num_heads·linear_head_dim`` wide in its delta-attention layers, ``num_attention_heads·
            # v_head_dim`` in its MLA ones) is two rows, each with the kinds of its layers; a kind keeps its first
            if any(kinds[layer] in row[3] for key, row in seen.items() if isinstance(key, tuple) and key[0] == tmpl):
                continue
            if (tmpl, tuple(dims)) in seen:
                seen[(tmpl, tuple(dims))][3].append(kinds[layer])
                continue
        elif tmpl in seen:
            continue
        role = meta["roles"].get(name, "other")
        where = None if layer is None else [kinds[layer]]
        cond = None
        if role == "output" and "tie_word_embeddings" in rec.base and meta.get("tied_keys") != {}:
            cond = "not tie_word_embeddings"  # counted once when tied; never, where the class ties nothing (.ties)
        entry = [tmpl, dims, role, where, cond, dtype]
        if name in meta["conv1d"]:
            entry.append("conv1d")
        elif name in meta.get("custom", ()):
            entry.append("custom")  # a subclass of nn.Linear: peft adapts it, bitsandbytes does not quantize it
        params.append(entry)
        seen[(tmpl, tuple(dims)) if layer is not None else tmpl] = entry
    for entry in params:
        if entry[3] is not None:
            entry[3] = sorted(set(entry[3]))
    buffers = []
    for name, (dims, dtype) in ref16["buffers"].items():
        tmpl, layer = D._layer_template(name, layer_prefix)
        if any(bb[0] == tmpl for bb in buffers):
            continue
        row = [tmpl, dims, dtype, layer is not None]
        if layer is not None:  # the kinds of the layers that hold it, as for a parameter (MiniMax's decay tables)
            suffix = tmpl.split(".{i}.", 1)[1]
            row.append(sorted({kinds[i] for i in range(len(kinds)) if f"{layer_prefix}.{i}.{suffix}" in ref16["buffers"]}))
        buffers.append(row)
    repeats = {}
    for name, n_expr in ref16["repeats"].items():
        repeats.setdefault(D._layer_template(name, layer_prefix)[0], n_expr)
    return params, buffers, repeats


def _config_rules(rec: ModelRecord, ref: dict[str, Any], segments, params, buffers, repeats, entries,
                  log) -> dict[str, Any]:
    """The config rules (:mod:`.configrules`) over the fields the file's expressions and conditions use."""
    import re

    from . import configrules
    from . import derive as D

    used = D._used_names(segments, params, buffers)
    used.update(D._names_in(list(repeats.values())))
    used.update(rec.flags)
    if rec.kind_expr:
        used.update(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", rec.kind_expr))
    for e in entries:
        if e.get("when"):
            used.update(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", e["when"]))
    base = rec.base
    n_layers = configrules.causal_field(rec.cls, "num_hidden_layers")  # Bart's causal LM: decoder_layers
    fields = [f for f in base if f in used] + [f for f in D.NESTED if f in used] + [n_layers]
    if "tie_word_embeddings" in base:
        fields.append("tie_word_embeddings")
    fields += [k for k, lead in D.FOLLOWERS.items() if lead in fields and not D.derived_by_config(base, k, D.get_var(base, k))]
    fields += [x for x, yz in relations.PRODUCTS.items() if set(yz) <= set(fields)]  # the spec reads it
    fields = list(dict.fromkeys(fields))
    cfg_rules = configrules.learn_config(rec.model_type, fields, ref["probes"], log, dict(D.NESTED))
    checks = D.follower_checks(base, cfg_rules["fields"]) + relations.product_checks(cfg_rules["fields"])
    cfg_rules["checks"] += [c for c in checks if c not in cfg_rules["checks"]]
    return cfg_rules


# --------------------------------------------------------------------------- 4. verify, 5. write


def learn_and_check(cfg: dict[str, Any], target: Path, *, verify: bool = True, tolerance: float = 0.01,
                    log=print, memory: bool = True) -> list[Path]:
    """Learn ``cfg``'s architecture (``derive.learn_full``), verify it unless told not to, and write it."""
    from . import derive
    from .patterns import PatternError

    try:
        data, results, specs = derive.learn_full(cfg, log=log)
    except (derive.LearnError, PatternError) as e:
        raise FitplanError(f"cannot learn {cfg.get('model_type')!r}: {e}", field="model_type",
                           value=cfg.get("model_type")) from None
    derive.RECENT.clear()  # the learning's recordings: verification records other configs
    if verify:
        verify_learned(cfg, data, results, specs, log=log, tolerance=tolerance, memory=memory)
    else:
        data["verified"] = False  # fitplan's figures from it are approximate (builtin/confidence.py)
        log("  not verified (--no-verify): the file is marked so, and estimates with it say so")
    return write_learned(data, target, log=log)


def verify_learned(cfg: dict[str, Any], data: dict[str, Any], results, specs, *, log, tolerance: float,
                   memory: bool) -> None:
    """Phase 4: the learned graph against fresh recordings at held-out sizes, then (when that holds and ``memory``)
    its memory figures against the referee's; marks ``data`` verified, or raises naming what does not reproduce."""
    from . import derive
    from . import verify as V

    problems = V.check_graph(data, results, specs, log)
    derive.RECENT.clear()
    rows: list[dict[str, Any]] = []
    if memory and not problems:
        heldout, b, s = V.heldout(cfg, [], derive.Regime("as given", None), 2, 16)
        mem, rows = V.check_memory(data, heldout, log, tolerance=tolerance)
        problems += mem
    if problems:
        raise FitplanError(f"the learned file for {cfg['model_type']!r} does not reproduce a fresh run, so it "
                           "was not written", details=problems[:20],
                           suggestion="report it with the config; --no-verify writes it anyway, marked unverified "
                                      "(its figures are then approximate, not exact)")
    data["verified"] = {"tolerance": tolerance, "cases": len(rows)}


def write_learned(data: dict[str, Any], target: Path, *, log) -> list[Path]:
    """Phase 5: the file (and its graphs) written into ``target``, logging the per-op diff against the files it
    replaces."""
    from . import files

    return files.write(data, target, log=log)
