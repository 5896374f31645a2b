"""The recorder: one training forward (and optionally its backward) of a Hugging Face model, op by op.

What it sees, and how:

* every aten op that reaches the Python dispatch key (below autograd and autocast): a
  ``TorchDispatchMode``. Each op is recorded with its schema argument names, the tensors it reads and
  returns (shape, dtype, storage: views share their base's storage, in-place ops return their input);
* Python-level call sites whose aten expansion depends on the device (``F.dropout``,
  ``F.scaled_dot_product_attention``): a ``TorchFunctionMode`` records them as one op and hides what
  they expand to (fitplan's kernel table expands them per device, docs/architectures.md);
* what autograd saves: ``saved_tensors_hooks``. In ``lifetimes`` mode the pack hook returns a token
  instead of the tensor, so nothing is kept alive by autograd and the weak references on storages fire
  exactly when the model's Python code lets go (the "Python lifetime" of every storage);
* module structure: forward hooks mark the decoder layers (their arguments: what checkpointing keeps),
  every ``nn.Linear`` / ``Conv1D`` call site (where LoRA inserts its adapters) and the input embedding;
* the backward (``backward=True``, a run with real saves): every autograd node's pre/post hooks and the
  storages allocated and freed while it runs: which input gradients are new tensors and which pass the
  incoming gradient through, and the node's transient bytes. ``AccumulateGrad`` nodes get no hooks (a
  hook would change whether they steal the incoming gradient).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from . import keptgraph

DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64", "int32": "i32", "bool": "bool",
          "uint8": "u8", "int8": "i8", "float64": "f64", "int16": "i16", "complex64": "c64"}
PSEUDO = ("dropout", "sdpa")


def dtype_code(dt) -> str:
    return DTYPES.get(str(dt).replace("torch.", ""), str(dt).replace("torch.", ""))


def op_key(func) -> str:
    """``aten.mul.Tensor`` -> ``mul.Tensor``; ``aten.mm.default`` -> ``mm`` (derivatives.yaml's names)."""
    name = func._schema.name.split("::", 1)[-1]
    ov = func._overloadname
    return name if ov == "default" else f"{name}.{ov}"


def _bounds(func, pos: list, kwargs: dict) -> dict[str, Any]:
    """A slice's ``[start, end, step]`` (``aten::slice.Tensor``) under its own key, which no file or comparison
    reads (a slice's end that follows a size must not make the probes' ops differ): :mod:`.slicesizes` writes the
    slice's length from them."""
    if op_key(func) != "slice.Tensor":
        return {}
    names = [a.name for a in func._schema.arguments]
    vals = {n: (pos[i] if i < len(pos) else kwargs.get(n)) for i, n in enumerate(names)}
    return {"bounds": [vals.get("start"), vals.get("end"), vals.get("step", 1)]}


class Recording:
    """What one recorded forward (and backward) saw. Plain data: lists and dicts of ints and strings."""

    def __init__(self) -> None:
        self.tensors: list[dict[str, Any]] = []  # tid -> {shape, dtype, sid, origin, op}
        self.storages: list[dict[str, Any]] = []  # sid -> {nbytes, owner, death}
        self.ops: list[dict[str, Any]] = []
        self.saves: list[tuple[int, int]] = []  # (tid, op index attributed)
        self.layers: list[dict[str, Any]] = []
        self.sites: list[dict[str, Any]] = []  # Linear / Conv1D call sites
        self.non_tensor_sites: list[str] = []  # Linear modules whose forward returned something else (a tuple)
        self.kept_graphs: list[str] = []  # module attributes holding a tensor with autograd history (keptgraph.py)
        self.embed_out: int | None = None
        self.loss: int | None = None
        self.logits: int | None = None
        self.forward_end = 0
        self.params: dict[str, int] = {}  # param name -> tid (tied names share a tid)
        self.buffers: dict[str, int] = {}
        self.inputs: dict[str, int] = {}
        self.backward: dict[int, dict[str, Any]] = {}  # forward op index -> node behaviour
        self.accumulate: dict[str, str] = {}  # param name -> "steal" | "clone" | "sum"
        self.no_grad: list[str] = []  # trainable parameters whose .grad is still None after the backward
        self.backward_order: list[int] = []


class Recent:
    """The last ``size`` forward recordings, by what they were recorded from (:func:`config_key` of the config,
    precision, attention kernel and batch shape): the learner records the same config several times (a regime
    class's signature, then its base probe, then the segments it shares with another class), and a recording
    of the same model on the same batch is the same (``build`` seeds the weights, ``batch_for`` the ids).
    Recordings are plain data that no consumer changes; a hit returns the same object."""

    def __init__(self, size: int) -> None:
        from collections import OrderedDict

        self.size = size
        self.items: OrderedDict[Any, Recording] = OrderedDict()

    def get(self, key: Any) -> Recording | None:
        rec = self.items.get(key)
        if rec is not None:
            self.items.move_to_end(key)
        return rec

    def put(self, key: Any, rec: Recording) -> None:
        self.items[key] = rec
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)

    def clear(self) -> None:
        self.items.clear()


def config_key(obj: Any) -> Any:
    """A hashable, exact form of a config (nested dicts, lists and tuples apart, ``1`` and ``1.0`` and ``True``
    apart): equal only for configs that build the same model."""
    if isinstance(obj, dict):
        return ("d", tuple(sorted((str(k), config_key(v)) for k, v in obj.items())))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(config_key(x) for x in obj))
    return (type(obj).__name__, repr(obj))


def _flat(x):
    from torch.utils._pytree import tree_flatten

    return tree_flatten(x)[0]


class _IdMap:
    """Objects (tensors, storages) to numbers by identity, holding none of them alive: ``torch.utils.weak
    .WeakIdKeyDictionary``'s contract, with a weak reference made once per object instead of once per look-up
    (the recorder looks up every tensor an op reads or makes: a tenth of a learning's CPU went to those
    references). An entry whose object died no longer matches an object that reuses its ``id``."""

    def __init__(self) -> None:
        self.items: dict[int, tuple[Any, int]] = {}

    def get(self, obj: Any) -> int | None:
        entry = self.items.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None

    def __setitem__(self, obj: Any, value: int) -> None:
        self.items[id(obj)] = (weakref.ref(obj), value)


class _Recorder:
    def __init__(self, model, *, lifetimes: bool) -> None:
        import torch

        self.torch = torch
        self.rec = Recording()
        self.lifetimes = lifetimes
        self.tid = _IdMap()
        self.sid = _IdMap()
        self.suppress = 0
        self.module_stack: list[str] = []
        self.layer_stack: list[int] = []
        self.site_stack: list[int] = []
        self.pending_saves: list[int] = []
        self.in_function = 0  # inside a custom autograd Function's apply (its ops make no autograd node)
        self.prev_outs: list[Any] = []
        self.nodes: dict[Any, int] = {}
        self.keep: list[Any] = []  # strong refs to tensors whose grad_fn we still need (run B)
        self.phase = "forward"
        self.model = model
        self.bwd_live = 0
        self.bwd_cur: dict[str, Any] | None = None
        self.names = {m: n for n, m in model.named_modules()}
        self.finalizers: dict[int, Any] = {}
        self.boxes: list[list[Any]] = []

    def boxed(self, t) -> list[Any]:
        """What the saved-tensor hook stores for ``t``: a list holding it, emptied when the recording ends
        (:func:`_release_model`). Stored bare, a tensor saved by the node that made it (``exp`` saves its result)
        holds that node through its ``grad_fn``, a cycle through autograd's C++ that Python's collector cannot see;
        where the backward does not reach the node (a branch the loss does not read), the node, its saved tensors
        and the hooks (which hold the recorder) stayed alive to the end of the process."""
        box = [t]
        self.boxes.append(box)
        return box

    # ---- identities
    def storage(self, t) -> int:
        st = t.untyped_storage()
        s = self.sid.get(st)
        if s is None:
            s = len(self.rec.storages)
            self.sid[st] = s
            self.rec.storages.append({"nbytes": st.nbytes(), "owner": None, "death": None, "phase": self.phase})
            self.finalizers[s] = weakref.finalize(st, self._dead, s)
            if self.phase == "backward":
                self.bwd_live += st.nbytes()
                cur = self.bwd_cur
                if cur is not None:
                    cur["allocs"].append(s)
                    cur["peak"] = max(cur["peak"], self.bwd_live - cur["start"])
        return s

    def _dead(self, s: int) -> None:
        entry = self.rec.storages[s]
        if self.phase == "backward":
            self.bwd_live -= entry["nbytes"]
            if self.bwd_cur is not None:
                self.bwd_cur["frees"].append(s)
            return
        if entry["death"] is None:
            entry["death"] = len(self.rec.ops) - 1
            entry["death_phase"] = self.phase

    def tensor(self, t, origin: str = "op", op: int | None = None) -> int:
        r = self.tid.get(t)
        if r is None:
            s = self.storage(t)
            r = len(self.rec.tensors)
            self.tid[t] = r
            self.rec.tensors.append({"shape": tuple(int(x) for x in t.shape), "dtype": dtype_code(t.dtype), "sid": s,
                                     "origin": origin, "op": op, "stride": tuple(int(x) for x in t.stride()),
                                     "offset": int(t.storage_offset())})
            if self.rec.storages[s]["owner"] is None:
                self.rec.storages[s]["owner"] = r
        return r

    def context(self) -> dict[str, Any]:
        return {"module": self.module_stack[-1] if self.module_stack else "",
                "layer": self.layer_stack[-1] if self.layer_stack else None,
                "site": self.site_stack[-1] if self.site_stack else None}

    # ---- node mapping (run B): outputs of the previous op now carry their grad_fn
    def map_prev_nodes(self) -> None:
        if not self.prev_outs:
            return
        idx = len(self.rec.ops) - 1
        for t in self.prev_outs:
            fn = t.grad_fn
            if fn is not None and fn not in self.nodes:
                self.nodes[fn] = idx
        self.prev_outs = []


def _dispatch_mode(r: _Recorder):
    from torch.utils._python_dispatch import TorchDispatchMode

    torch = r.torch

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if r.suppress or r.phase != "forward":
                out = func(*args, **kwargs)
                if r.phase == "backward":
                    for t in _flat(out):
                        if isinstance(t, torch.Tensor):
                            r.storage(t)
                return out
            r.map_prev_nodes()
            schema = func._schema
            named: list[tuple[str, Any]] = []
            pos = list(args)
            for i, a in enumerate(schema.arguments):
                if i < len(pos):
                    v = pos[i]
                elif a.name in kwargs:
                    v = kwargs[a.name]
                else:
                    continue
                if isinstance(v, torch.Tensor):
                    named.append((a.name, r.tensor(v, "const")))
                elif isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.Tensor) or x is None for x in v):
                    named.append((a.name, [None if x is None else r.tensor(x, "const") for x in v]))
            idx = len(r.rec.ops)
            out = func(*args, **kwargs)
            outs = []
            for t in _flat(out):
                if isinstance(t, torch.Tensor):
                    outs.append(r.tensor(t, "op", idx))
            scal = {}
            for i, a in enumerate(schema.arguments):
                v = pos[i] if i < len(pos) else kwargs.get(a.name, None)
                if isinstance(v, torch.dtype):
                    scal[a.name] = dtype_code(v)
                elif isinstance(v, (bool, int, float)) and a.name in ("p", "dim", "half_to_float", "exponent", "alpha",
                                                                      "other", "value", "k", "train"):
                    scal[a.name] = v
            r.rec.ops.append({"name": op_key(func), "args": named, "outs": outs, "scalars": scal, **_bounds(func, pos, kwargs),
                              "inplace": bool(schema.arguments and schema.arguments[0].alias_info is not None
                                              and schema.arguments[0].alias_info.is_write),
                              "saves": r.pending_saves, **r.context(),
                              **({"nograd": 1} if r.in_function or not torch.is_grad_enabled() else {})})
            r.pending_saves = []
            if r.keep is not None:
                r.prev_outs = [t for t in _flat(out) if isinstance(t, torch.Tensor)]
            return out

    return Mode()


FUNCTION_OP = "autograd.Function"
"""The op a custom ``torch.autograd.Function`` call is recorded as, after the ops of its forward."""


@contextlib.contextmanager
def _function_boundaries(r: _Recorder):
    """Custom ``torch.autograd.Function`` calls recorded at their boundary. Their forward runs with grad mode off
    (torch/autograd/function.py: ``Function.apply`` -> ``_C._FunctionBase.apply``), so the ops inside make no
    autograd node and save nothing; the Function's node saves what ``ctx.save_for_backward`` keeps (the pack hook
    sees it when apply wraps the outputs). The ops inside are marked ``nograd`` and one op ``autograd.Function``
    follows them: its inputs, its outputs (the inner ops' results) and, as ``fsaves``, what the node saved."""
    torch = r.torch
    Function = torch.autograd.Function
    original = Function.__dict__["apply"]
    inner = original.__func__

    def apply(cls, *args, **kwargs):
        if r.suppress or r.phase != "forward":
            return inner(cls, *args, **kwargs)
        r.map_prev_nodes()
        ins = [r.tensor(a, "const") for a in _flat((args, kwargs)) if isinstance(a, torch.Tensor)]
        saves_before, r.pending_saves = r.pending_saves, []
        r.in_function += 1
        try:
            out = inner(cls, *args, **kwargs)
        finally:
            r.in_function -= 1
        fsaves, r.pending_saves = r.pending_saves, saves_before
        r.prev_outs = []  # the node belongs to the boundary op, not to the last op inside
        idx = len(r.rec.ops)
        outs = [r.tensor(t, "op", idx) for t in _flat(out) if isinstance(t, torch.Tensor)]
        r.rec.ops.append({"name": FUNCTION_OP, "args": [("inputs", ins)], "outs": outs, "scalars": {},
                          "function": cls.__name__, "fsaves": fsaves, "inplace": False, "saves": [], **r.context()})
        if r.keep is not None:
            r.prev_outs = [t for t in _flat(out) if isinstance(t, torch.Tensor)]
        return out

    Function.apply = classmethod(apply)
    try:
        yield
    finally:
        Function.apply = original


def _function_mode(r: _Recorder):
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    torch = r.torch
    sdpa = F.scaled_dot_product_attention
    dropout = F.dropout

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if r.suppress or r.phase != "forward" or func not in (sdpa, dropout):
                return func(*args, **kwargs)
            r.map_prev_nodes()
            if func is dropout:
                x = args[0]
                p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                training = kwargs.get("training", args[2] if len(args) > 2 else True)
                inplace = kwargs.get("inplace", args[3] if len(args) > 3 else False)
                named = [("input", r.tensor(x, "const"))]
                scal = {"p": float(p), "training": bool(training), "inplace": bool(inplace)}
                kind = "dropout"
            else:
                names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
                vals = dict(zip(names, args))
                vals.update(kwargs)
                named = [(n, r.tensor(vals[n], "const")) for n in ("query", "key", "value")]
                if vals.get("attn_mask") is not None:
                    named.append(("attn_mask", r.tensor(vals["attn_mask"], "const")))
                scal = {"p": float(vals.get("dropout_p", 0.0) or 0.0), "is_causal": bool(vals.get("is_causal", False)),
                        "enable_gqa": bool(vals.get("enable_gqa", False)), "has_scale": vals.get("scale") is not None}
                kind = "sdpa"
            idx = len(r.rec.ops)
            saves_before = r.pending_saves
            r.pending_saves = []
            r.suppress += 1
            try:
                out = func(*args, **kwargs)
            finally:
                r.suppress -= 1
            r.pending_saves = saves_before
            outs = [r.tensor(t, "op", idx) for t in _flat(out) if isinstance(t, torch.Tensor)]
            r.rec.ops.append({"name": kind, "pseudo": kind, "args": named, "outs": outs, "scalars": scal,
                              "inplace": False, "saves": r.pending_saves, **r.context()})
            r.pending_saves = []
            if r.keep is not None:
                r.prev_outs = [t for t in _flat(out) if isinstance(t, torch.Tensor)]
            return out

    return Mode()


@contextlib.contextmanager
def _module_hooks(r: _Recorder, model, layers, linear_types, embed):
    from torch.nn.modules import module as modmod

    torch = r.torch
    handles = []

    def gpre(mod, inp):
        r.module_stack.append(r.names.get(mod, "?"))

    def gpost(mod, inp, out):
        if r.module_stack:
            r.module_stack.pop()

    handles.append(modmod.register_module_forward_pre_hook(gpre))
    handles.append(modmod.register_module_forward_hook(gpost))
    layer_index = {m: i for i, m in enumerate(layers)}

    def lpre(mod, args, kwargs):
        if r.phase != "forward":
            return
        r.map_prev_nodes()
        i = layer_index[mod]
        targs = []
        for k, v in [(str(j), a) for j, a in enumerate(args)] + list(kwargs.items()):
            for t in _flat(v):
                if isinstance(t, torch.Tensor):
                    targs.append((k, r.tensor(t, "const")))
        r.rec.layers.append({"index": i, "start": len(r.rec.ops), "args": targs})
        r.layer_stack.append(i)

    def lpost(mod, args, kwargs, out):
        if r.phase != "forward":
            return
        r.layer_stack.pop()
        entry = r.rec.layers[-1]
        entry["end"] = len(r.rec.ops)
        first = next(t for t in _flat(out) if isinstance(t, torch.Tensor))
        entry["out"] = r.tensor(first, "op")

    for m in layers:
        handles.append(m.register_forward_pre_hook(lpre, with_kwargs=True))
        handles.append(m.register_forward_hook(lpost, with_kwargs=True))

    def spre(mod, args):
        if r.phase != "forward" or r.suppress:
            return
        r.map_prev_nodes()
        x = args[0]
        w = getattr(mod, "weight", None)
        b = getattr(mod, "bias", None)
        conv1d = type(mod).__name__ == "Conv1D"
        shape = tuple(int(s) for s in w.shape) if w is not None else ()
        in_f, out_f = (shape[0], shape[1]) if conv1d else (shape[1], shape[0])
        r.rec.sites.append({"module": r.names.get(mod, "?"), "start": len(r.rec.ops), "input": r.tensor(x, "const"),
                            "in": in_f, "out": out_f, "bias": b is not None, "conv1d": conv1d,
                            "custom": type(mod) not in linear_types,
                            "layer": r.layer_stack[-1] if r.layer_stack else None})
        r.site_stack.append(len(r.rec.sites) - 1)

    def spost(mod, args, out):
        if r.phase != "forward" or r.suppress:
            return
        i = r.site_stack.pop()
        if not isinstance(out, torch.Tensor):  # not a Linear peft can adapt (Llama-4's router returns a tuple)
            r.rec.sites[i]["drop"] = True
            return
        r.rec.sites[i]["end"] = len(r.rec.ops)
        r.rec.sites[i]["output"] = r.tensor(out, "op")

    for m in model.modules():
        if is_linear_site(m):
            handles.append(m.register_forward_pre_hook(spre))
            handles.append(m.register_forward_hook(spost))

    def epost(mod, args, out):
        if r.phase == "forward" and r.rec.embed_out is None:
            r.rec.embed_out = r.tensor(out, "op")

    if embed is not None:
        handles.append(embed.register_forward_hook(epost))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def decoder_layers(model):
    """The decoder layers (HF ``model.layers`` / ``transformer.h``): the outermost ``nn.ModuleList`` with
    ``num_hidden_layers`` entries (inner lists, e.g. StableLM's per-head norms, can be longer)."""
    import torch

    lists = [(name.count("."), m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        return []
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    fitting = [x for x in lists if len(x[1]) == n] or lists
    return list(min(fitting, key=lambda x: (x[0], -len(x[1])))[1])


def linear_types():
    import torch

    types: list[type] = [torch.nn.Linear]
    try:
        from transformers.pytorch_utils import Conv1D

        types.append(Conv1D)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


def is_linear_site(mod) -> bool:
    """A Linear / Conv1D module, a candidate call site for peft's adapter (peft 0.21 adapts any ``nn.Linear``
    instance, subclasses with their own ``forward`` included, such as Falcon's ``FalconLinear``). The
    recording keeps the sites whose forward returns a tensor (Llama-4's router subclasses nn.Linear but
    returns a tuple: peft 0.21 fails on it, fitplan does not count it). A subclass is marked ``custom``:
    transformers' ``replace_with_bnb_linear`` quantizes only modules whose type *is* ``nn.Linear`` or
    ``Conv1D`` (integrations/bitsandbytes.py:189), so QLoRA leaves it in 16-bit."""
    return isinstance(mod, linear_types())


def record(model, batch, *, autocast_dtype=None, lifetimes: bool = True, backward: bool = False) -> Recording:
    """Record one forward of ``model`` on ``batch`` (see the module doc). ``lifetimes`` and ``backward``
    exclude each other: the first keeps nothing alive through autograd, the second needs the saves."""
    import torch

    assert not (lifetimes and backward)
    ac = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    with ac:  # warm up: first calls take other paths (lazy caches); the referee measures a later step too
        out = model(**batch)
        if backward:
            out.loss.backward()
        del out
    for p in model.parameters():
        p.grad = None
    r = _Recorder(model, lifetimes=lifetimes)
    r.keep = [] if backward else None
    rec = r.rec
    for name, p in model.named_parameters(remove_duplicate=False):
        tid = r.tensor(p, "param:" + name)
        rec.params[name] = tid
    for name, b in model.named_buffers(remove_duplicate=False):
        rec.buffers[name] = r.tensor(b, "buffer:" + name)
    for k, v in batch.items():
        rec.inputs[k] = r.tensor(v, "input:" + k)

    def pack(t):
        if r.suppress or r.phase != "forward":
            return r.boxed(t) if not lifetimes else None
        tid = r.tensor(t, "const")
        r.pending_saves.append(tid)
        rec.saves.append((tid, len(rec.ops)))
        return None if lifetimes else r.boxed(t)

    def unpack(x):
        return x[0] if x is not None else None

    layers = decoder_layers(model)
    embed = model.get_input_embeddings()
    dmode, fmode = _dispatch_mode(r), _function_mode(r)
    with _module_hooks(r, model, layers, linear_types(), embed):
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack), fmode, dmode, _function_boundaries(r):
            with ac:
                out = model(**batch)
                rec.kept_graphs = keptgraph.attributes_with_history(model)
                loss = out.loss
                rec.loss = r.tensor(loss, "op")
                logits = getattr(out, "logits", None)
                if logits is not None:
                    rec.logits = r.tensor(logits, "op")
                r.map_prev_nodes()
                rec.forward_end = len(rec.ops)
                r.phase = "after"  # what goes from here on (the output, autocast's cache) goes when the forward returns
                del out, logits
            r.phase = "after"
        if backward:
            _record_backward(r, model, loss, dmode)
    del loss
    _release_model(r)
    rec.non_tensor_sites = sorted({site["module"] for site in rec.sites if site.get("drop")})
    rec.sites = [site for site in rec.sites if not site.get("drop")]
    return rec


def _release_model(r: _Recorder) -> None:
    """End the recording's hold on what it recorded: detach every death callback still pending and drop the
    recorder's references to the model and the autograd graph.

    Each callback holds the recorder (``weakref.finalize`` keeps it in a global registry until the storage dies
    or the callback is detached), and the recorder held the model (``r.model``, ``r.names``) and the graph's
    autograd nodes (``r.nodes``, ``r.keep``, ``r.prev_outs``), whose saved tensors hold storages that have
    callbacks: so every recorded model and graph stayed alive to the end of the process. Detaching only the
    model's own storages (parameters, buffers, gradients, tensor attributes) was not enough: the recording
    with the backward keeps the graph's nodes in ``r.nodes`` (Lara-Mini's shrunk model recorded again and again at
    one size grew ~1 MB resident a recording; the larger growth at new sizes is torch's kernel caches:
    command.py). A storage alive here dies after the step; its death is not the recording's (the learner reads a
    death in the ``after`` phase as none: derive.py ``segment_json``), so it stays unrecorded, as it did when it
    never died."""
    for f in r.finalizers.values():
        f.detach()
    r.finalizers.clear()
    r.model = None
    r.names = {}
    r.nodes = {}
    r.keep = None
    r.prev_outs = []
    for box in r.boxes:
        box.clear()
    r.boxes = []


def _record_backward(r: _Recorder, model, loss, dmode) -> None:
    """Run ``loss.backward()`` with hooks on every autograd node; see the module doc."""
    rec = r.rec
    seen = set()
    stack = [loss.grad_fn]
    nodes = []
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        nodes.append(n)
        stack.extend(nx for nx, _ in n.next_functions)
    r.phase = "backward"
    handles = []
    grad_storages: dict[int, Any] = {}

    def pre(node):
        def f(grad_outputs):
            r.bwd_cur = {"op": r.nodes.get(node), "node": node.name(), "start": r.bwd_live, "peak": 0, "allocs": [],
                         "frees": [], "in": [None if g is None else r.storage(g) for g in grad_outputs]}
        return f

    def post(node):
        def f(grad_inputs, grad_outputs):
            entry = r.bwd_cur
            if entry is None:
                return
            entry["out"] = [None if g is None else r.storage(g) for g in grad_inputs]
            entry["new"] = sum(r.rec.storages[s]["nbytes"] for s in set(entry["out"]) - set(entry["in"]) - {None})
            for g in grad_inputs:
                if g is not None:
                    grad_storages[r.storage(g)] = True
            idx = entry["op"]
            if idx is not None:
                rec.backward[idx] = {k: entry[k] for k in ("node", "in", "out", "allocs", "frees", "peak", "new")}
                rec.backward_order.append(idx)
            r.bwd_cur = None
        return f

    for n in nodes:
        if n.name() == "torch::autograd::AccumulateGrad":
            continue
        handles.append(n.register_prehook(pre(n)))
        handles.append(n.register_hook(post(n)))
    with dmode:
        loss.backward()
    for h in handles:
        h.remove()
    r.phase = "after"
    # a parameter no op of the step reads (a decoder's cross-attention run without encoder states) gets no
    # gradient: autograd never reaches its AccumulateGrad node, so .grad stays None (torch/csrc/autograd)
    rec.no_grad = sorted(n for n, p in model.named_parameters() if p.requires_grad and p.grad is None)
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        s = r.sid.get(p.grad.untyped_storage())
        rec.accumulate[name] = "steal" if s is not None and s in grad_storages else "clone"


def align_backward(a: Recording, b: Recording) -> dict[int, dict[str, Any]]:
    """The backward behaviour recorded in ``b`` (a run with real saves), keyed by ``a``'s op indices.

    The two runs execute the same model code, but holding a reference to an op's outputs (to read their
    ``grad_fn``) can make PyTorch insert a ``detach``; ops are matched by name, in order."""
    import difflib

    na = [o["name"] for o in a.ops]
    nb = [o["name"] for o in b.ops]
    mapping: dict[int, int] = {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=na, b=nb, autojunk=False).get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                mapping[j1 + k] = i1 + k
        elif any(n != "detach" for n in nb[j1:j2]) or i2 > i1:
            raise RuntimeError(f"the forward differs between two recordings of the same model: {tag} "
                               f"{na[i1:i2]} / {nb[j1:j2]}")
    out: dict[int, dict[str, Any]] = {}
    for jb, entry in b.backward.items():
        ia = mapping.get(jb)
        if ia is not None:
            out[ia] = entry
    return out
