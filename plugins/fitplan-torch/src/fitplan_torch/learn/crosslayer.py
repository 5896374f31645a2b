"""A layer's argument that an earlier layer made: which layer, as an expression of the layer index ``i``.

Some models pass a layer more than the previous layer's hidden state and the context every layer gets:

* HYV4's layers return ``(hidden_states, topk_indices)`` and the next layer routes with the previous one's top-k
  (``prev_topk_indices``, transformers 5.24 models/hy_v4/modeling_hy_v4.py ``HYV4Model.forward``): a state carried
  from layer ``i - 1``;
* Gemma-3n's last ``num_kv_shared_layers`` layers read the keys and values that the last earlier layer of their
  kind stored in ``shared_kv_states`` (models/gemma3n/modeling_gemma3n.py ``Gemma3nTextAttention.forward``,
  ``store_full_length_kv``): layer ``last_index(layer_types, layer_types[i], num_hidden_layers -
  num_kv_shared_layers)``.

:mod:`.segments` makes such a tensor one more argument of the reading layer; :func:`maker_args` states, per layer
kind and argument, the maker as ``["layer", expr, "t<k>"]`` (the maker's ``k``-th tensor; ``expr`` over ``i`` and
the config's fields), checked on every reading layer of the recording. The replay binds that tensor, so its storage
lives from its maker to its last reader (:mod:`fitplan.trace.learned_graph`).
"""

from __future__ import annotations

from typing import Any

COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def candidates(env: dict[str, Any], nlayers: int) -> list[str]:
    """Rules for the maker layer, simplest first: the previous layers, then the last earlier layer of the reader's
    kind by a per-layer list of strings, before the reader, before the layer count, or before the count less an
    integer field (Gemma-3n's shared layers read from the last non-shared layer of their kind)."""
    out = ["i - 1", "i - 2"]
    count = next((k for k in COUNT_KEYS if env.get(k) == nlayers), None)
    ends = ["i"]
    if count is not None:
        ends.append(count)
        ends += [f"{count} - {p}" for p, v in sorted(env.items())
                 if type(v) is int and 0 < v < nlayers and p != count]
    lists = [f for f, v in sorted(env.items()) if isinstance(v, list) and len(v) >= nlayers
             and len(set(map(str, v))) >= 2 and all(isinstance(x, str) for x in v)]
    out += [f"last_index({f}, {f}[i], {end})" for f in lists for end in ends]
    return out


def maker_rule(env: dict[str, Any], nlayers: int, pairs: list[tuple[int, int]]) -> str | None:
    """The first of :func:`candidates` that gives maker ``m`` for reader ``i`` for every ``(i, m)`` of ``pairs``."""
    from fitplan.api import compile_expr

    for expr in candidates(env, nlayers):
        f = compile_expr(expr)
        try:
            if all(f({**env, "i": i}) == m for i, m in pairs):
                return expr
        except Exception:  # noqa: BLE001 - a rule over a field this config leaves empty
            continue
    return None


def maker_args(reads: dict[tuple[str, int], list[tuple[int, int, int]]], env: dict[str, Any],
               nlayers: int) -> dict[tuple[str, int], list[str]]:
    """``(kind, argument) -> ["layer", expr, "t<k>"]`` for each ``(reader, maker, k)`` list of ``reads``.

    :raises LearnError: no rule places the maker, or the readers of one kind read different tensors of it."""
    from .derive import LearnError

    out = {}
    for (kind, a), seen in reads.items():
        ks = {k for _, _, k in seen}
        rule = maker_rule(env, nlayers, [(i, m) for i, m, _ in seen])
        if rule is None or len(ks) > 1:
            shown = ", ".join(f"layer {i} reads layer {m}'s" for i, m, _ in seen[:4])
            who = "the epilogue" if kind.startswith(" ") else f"layers of kind {kind}"
            raise LearnError(f"{who} read a tensor an earlier layer made ({shown}) by no rule "
                             "over the layer index the learner knows (the previous layer, the last earlier layer "
                             "of its kind): a state carried between layers that a learned file cannot express yet")
        out[(kind, a)] = ["layer", rule, f"t{ks.pop()}"]
    return out


def per_layer_slice(cut, tid: int, j: int) -> list[Any] | None:
    """``["select", "P<k>", d]`` where layer ``j``'s argument ``tid`` is prologue tensor ``P<k>`` indexed at ``j`` on
    dimension ``d``, a view the model's loop takes between the layers (an op of no segment): Gemma-4's per-layer
    inputs, made once in the prologue as ``[b, s, num_hidden_layers, hidden_size_per_layer_input]`` and passed as
    ``per_layer_inputs[:, :, i, :]`` (transformers 5.24 models/gemma4/modeling_gemma4.py ``Gemma4TextModel.forward``).
    The index is read from the view's storage offset (the recorder keeps no index scalar). None: another tensor."""
    rec = cut.rec
    t = rec.tensors[tid]
    op = rec.ops[t["op"]] if isinstance(t.get("op"), int) and t["op"] < len(rec.ops) else None
    if op is None or op["name"] != "select.int" or cut.op_seg.get(t["op"]) is not None:
        return None
    src = dict(op["args"]).get("self")
    where = cut.owner_seg.get(src) if isinstance(src, int) else None
    d = op["scalars"].get("dim")
    if where is None or where[0] != 0 or not isinstance(d, int):
        return None
    base = rec.tensors[src]
    d %= len(base["shape"])
    stride = base["stride"][d]
    if stride <= 0 or (t["offset"] - base["offset"]) != j * stride or base["shape"][d] <= j:
        return None
    return ["select", f"P{where[1]}", d]


def _scaled(expr: Any, v0: int, v1: int, n0: int, n1: int, count: str) -> Any:
    """``expr`` (a dimension fitted at ``n0`` layers, ``v0`` there) as a multiple of the layer count, where the
    dimension is ``v1`` at ``n1`` layers, exactly in proportion; else ``expr`` unchanged."""
    if v0 == v1 or v1 * n0 != v0 * n1 or count in str(expr):
        return expr
    if str(expr).isdigit() and int(expr) % n0 == 0:
        return count if int(expr) == n0 else f"{int(expr) // n0} * {count}"
    return f"({expr}) * {count} // {n0}"


def count_scaled(res: dict[str, Any], pro: dict[str, Any], precision: str, attn: str, nlayers: int) -> dict[str, Any]:
    """The prologue (and the parameter table, in place) with the dimensions that scale with the layer count written
    over it. The learner's probes hold the layer count (it sets how many layer segments there are), so a size made
    of it is fitted as a number; a per-layer slice proves there is one: Gemma-4 and Gemma-3n build their per-layer
    inputs as ``[b, s, num_hidden_layers, hidden_size_per_layer_input]`` from ``embed_tokens_per_layer`` and
    ``per_layer_model_projection``, ``num_hidden_layers * hidden_size_per_layer_input`` wide (transformers 5.24
    models/gemma4/modeling_gemma4.py ``Gemma4TextModel.get_per_layer_inputs`` / ``project_per_layer_inputs``).
    Probe 0 recorded again at one layer more: each prologue tensor (the same ops) and parameter whose dimension
    grew in exact proportion gets ``(expr) * count // n``. None of it where the prologue's ops differ there."""
    from .derive import run
    from .patterns import with_layers
    from .segments import Cut

    p0 = res["probes"][0]
    count = next((k for k in COUNT_KEYS if p0.cfg.get(k) == nlayers), None)
    if count is None:
        return pro
    n1 = nlayers + 1
    rec0 = res["rec"]
    try:
        rec1 = run(with_layers(p0.cfg, n1), precision, attn, p0.b, p0.s)
        cut1 = Cut(rec1, {})
    except Exception:  # noqa: BLE001 - no config or cut at one layer more: the sizes stay as fitted (the held-out
        return pro  # check at another layer count then says where they do not hold)
    seg0, seg1 = res["cut"].segments[0], cut1.segments[0]
    if [o[0] for o in seg0["ops"]] != [o[0] for o in seg1["ops"]] or len(seg0["tensors"]) != len(seg1["tensors"]):
        return pro
    tensors = []
    for t, a, b in zip(pro["t"], seg0["tensors"], seg1["tensors"]):
        dims = [_scaled(e, x, y, nlayers, n1, count) for e, x, y in zip(t[0], a[0], b[0])] \
            if len(a[0]) == len(b[0]) == len(t[0]) else t[0]
        tensors.append([dims, *t[1:]])
    for name, (dims, dtype) in list(res["params"].items()):
        a, b = rec0.params.get(name), rec1.params.get(name)
        if a is None or b is None:
            continue
        sa, sb = rec0.tensors[a]["shape"], rec1.tensors[b]["shape"]
        if len(sa) == len(sb) == len(dims):
            res["params"][name] = ([_scaled(e, x, y, nlayers, n1, count) for e, x, y in zip(dims, sa, sb)], dtype)
    return {**pro, "t": tensors}
