"""Learned architecture files: what fitplan knows about a Hugging Face ``model_type``, as data.

One JSON file per ``model_type`` (``rulesets/architectures/<model_type>.json``, or the user's
``$FITPLAN_ARCH_DIR`` / ``architectures`` in fitplan's cache directory, which win), written by
``fitplan learn-architecture`` (fitplan-torch) from the model's own implementation; the format is in
docs/architectures.md. This module reads one: how to turn a ``config.json`` into the symbols the file
uses (field defaults, aliases, derived values, validity checks, as the transformers config class applies
them), the parameter tensors, the layer pattern and the recorded step graphs, every size an expression
(:mod:`.archexpr`). Files are parsed on first use and cached; only the file of the ``model_type`` in use
is read.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

from fitplan.errors import FitplanError
from fitplan.arch import learned_repeat
from fitplan.arch.archexpr import ExprError, compile_expr
from fitplan.arch.archformat import FORMAT, REFORMAT, decode_graphs, decode_header
BYTES: dict[str, int] = {"f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "bool": 1, "u8": 1, "i8": 1, "f64": 8, "i16": 2, "c64": 8}
"""Bytes per element of each dtype code the learned files use."""
REPEAT = learned_repeat.H
FLOAT = ("f32", "bf16", "f16", "f64", "c64")
"""The dtypes autograd differentiates: floating and complex (``isDifferentiableType``,
torch/csrc/autograd/variable.h, torch 2.13). Complex counts: Llama-4's and DeepSeek-V2's rotary embedding
multiplies ``view_as_complex`` views, and q and k keep requiring grad through them."""
BUNDLED = Path(__file__).resolve().parents[1] / "_rulesets" / "architectures"
if not BUNDLED.is_dir():
    BUNDLED = Path(__file__).resolve().parents[3] / "rulesets" / "architectures"


class NotLearned(FitplanError):
    """A config that the architecture files in force do not describe: a ``model_type`` no file learned, or a
    switch combination its file did not learn (:meth:`ArchFile.check_flags`). A fact about the installed files,
    not a mistake in the config: a ruleset's model preset that meets it is unavailable on its own, and the rest
    of its directory loads (:mod:`fitplan.rulesets.loader`)."""


def user_dirs() -> list[Path]:
    """Directories searched before the bundled files: ``$FITPLAN_ARCH_DIR`` (``os.pathsep``-separated),
    then ``architectures`` in fitplan's cache directory (:func:`fitplan.diskcache.root`: ``$FITPLAN_CACHE_DIR``,
    else ``~/.cache/fitplan`` with ``$XDG_CACHE_HOME`` respected, ``%LOCALAPPDATA%`` on Windows,
    ``~/Library/Caches`` on macOS), where ``fitplan learn-architecture --install`` writes."""
    from fitplan.diskcache import root

    out = [Path(p) for p in os.environ.get("FITPLAN_ARCH_DIR", "").split(os.pathsep) if p]
    out.append(root() / "architectures")
    return out


def find(model_type: str) -> Path | None:
    """The first regular file ``<model_type>.json`` of :func:`user_dirs` then the bundled folder (a folder
    that cannot be read counts as empty)."""
    for d in (*user_dirs(), BUNDLED):
        p = d / f"{model_type}.json"
        try:
            if p.is_file():
                return p
        except OSError:
            continue
    return None


def read_json(path: Path) -> Any:
    """A learned file's JSON, read through the input boundary (a regular file of at most 64 MiB: a FIFO or a
    device planted in the cache folder is refused, never read). :raises ValueError: unreadable or malformed."""
    from fitplan.inputs.files import read_bytes

    try:
        return json.loads(read_bytes(path))
    except FitplanError as e:
        raise ValueError(e.message) from None


SHARED_TABLES = ("autograd", "peft", "sequence_classifiers", "liger")
"""Files beside the architecture files that are no model type: PyTorch's save rules, peft's default targets,
transformers' generic sequence classifiers, Liger-Kernel's patches."""


def known_model_types() -> list[str]:
    names = set()
    for d in (*user_dirs(), BUNDLED):
        try:
            names.update(p.stem for p in d.glob("*.json") if "." not in p.stem and p.stem not in SHARED_TABLES)
        except OSError:
            continue
    return sorted(names)


def data_file(name: str) -> Path:
    """A shared table next to the bundled architectures (``autograd.json``, ``peft.json``)."""
    return BUNDLED / name


@functools.lru_cache(maxsize=1)
def sequence_classifiers() -> tuple[str, ...]:
    """The model types whose ``AutoModelForSequenceClassification`` class in transformers 5.24 is a
    ``GenericForSequenceClassification`` (the shared table ``sequence_classifiers.json``, with its source):
    :data:`SCORE_HEAD` describes these."""
    path = data_file("sequence_classifiers.json")
    try:
        return tuple(json.loads(path.read_text(encoding="utf-8"))["model_types"])
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise FitplanError(f"cannot read the sequence-classifier table: {e}", file=str(path)) from None


@functools.lru_cache(maxsize=1)
def peft_table() -> dict[str, Any]:
    """peft's default LoRA target modules per model type (generated from peft by fitplan-torch)."""
    path = data_file("peft.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise FitplanError(f"cannot read peft's table: {e}", file=str(path)) from None


SCORE_HEAD = "fitplan_score_head"
"""The symbol that makes a learned file describe ``AutoModelForSequenceClassification`` with ``num_labels=1``
(TRL's reward model, builtin/trl/reward.py): transformers' ``GenericForSequenceClassification``
(transformers/modeling_layers.py) keeps the bare decoder and adds ``score = nn.Linear(hidden, 1, bias=False)``;
there is no LM head (a tied one never was a tensor of its own)."""
SCORE = ["score.weight", ["1", "hidden_size"], "linear:score", None, None, "bf16"]
"""The ``score`` Linear's weight entry (the checkpoint's dtype, as every 16-bit parameter)."""


@functools.lru_cache(maxsize=64)
def load(model_type: str) -> "ArchFile":
    path = find(model_type)
    if path is None:
        raise unknown_model_type(model_type)
    return ArchFile(path)


def unknown_model_type(model_type: str, *, file: str | None = None) -> FitplanError:
    """The error for a ``model_type`` no file describes: which command learns it."""
    from fitplan.errors import did_you_mean

    near = did_you_mean(model_type, known_model_types())
    have_torch = _plugin_installed()
    how = (f"learn it from its transformers implementation: fitplan learn-architecture {file or 'CONFIG.json'} --install"
           if have_torch else
           "install the fitplan-torch plugin with torch and transformers (docs/validation.md), then run "
           f"fitplan learn-architecture {file or 'CONFIG.json'} --install")
    msg = f"unknown model_type {model_type!r}: fitplan has no learned architecture file for it"
    if near:
        msg += f" ({near})"
    return NotLearned(msg, file=file, field="$.model_type", value=model_type, suggestion=how)


def _plugin_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("fitplan_torch") is not None


def check_format(data: Any, path: Path) -> None:
    """:raises FitplanError: ``data`` (a learned file's JSON) is not a format-:data:`FORMAT` file; format 1 (positional
    rows) names the command that rewrites it."""
    got = data.get("format") if isinstance(data, dict) else None
    if got == FORMAT:
        return
    if got == 1:
        raise FitplanError(f"format 1 (positional rows), which this fitplan no longer reads: rewrite it as format "
                           f"{FORMAT} with `{REFORMAT} {path}`", file=str(path), field="$.format", value=1)
    raise FitplanError(f"architecture file format {got!r} is not {FORMAT}", file=str(path), field="$.format",
                       value=got, suggestion="re-learn it with this fitplan: fitplan learn-architecture")


class ArchFile:
    """A parsed learned architecture file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = read_json(path)
        except (ValueError, RecursionError) as e:
            raise FitplanError(f"cannot read the architecture file: {e}", file=str(path)) from None
        check_format(data, path)
        data = decode_header(data, str(path))
        self.data = data
        self.model_type: str = data["model_type"]
        self.learned: dict[str, Any] = data.get("learned", {})
        self.config: dict[str, Any] = data["config"]
        self.spec_map: dict[str, Any] = data["spec"]
        self.params: list[list[Any]] = data["params"]
        self.buffers: list[list[Any]] = data.get("buffers", [])
        self.layers: dict[str, Any] = data["layers"]
        self.lora: dict[str, Any] = data.get("lora", {})
        self.output_module: str | None = data.get("output_module")
        self.layer_sites: list[str] = data.get("layer_sites", [])
        self.param_index: dict[str, list[list[Any]]] = {}
        for p in self.params:  # a name may have one shape per switch combination (Falcon's fused qkv)
            self.param_index.setdefault(p[0], []).append(p)
        self.buffer_index = {b[0]: b for b in self.buffers}
        self.repeats: dict[str, str] = data.get("repeats", {})
        """Parameter template -> how many there are (a repeated block's ``norms.{h}.weight``: ``num_attention_heads``)."""
        self._graphs: dict[str, Any] | None = None

    @property
    def graphs(self) -> dict[str, Any]:
        """The recorded step graphs (``<model_type>.graphs.json`` beside the file), read on first use: the
        config rules and parameters above are all that reading a config.json or listing models needs."""
        if self._graphs is None:
            gpath = self.path.with_name(self.path.stem + ".graphs.json")
            try:
                graphs = read_json(gpath)
            except (ValueError, RecursionError) as e:
                raise FitplanError(f"cannot read the architecture's step graphs: {e}", file=str(gpath)) from None
            check_format(graphs, gpath)
            self._graphs = decode_graphs(graphs, str(gpath))
        return self._graphs

    @property
    def variants(self) -> list[dict[str, Any]]:
        return self.graphs["variants"]

    @property
    def segments(self) -> dict[str, Any]:
        return self.graphs["segments"]

    # ------------------------------------------------------------------ config.json -> symbols
    def symbols(self, cfg: dict[str, Any], file: str | None = None) -> dict[str, Any]:
        """Read the file's symbols from a ``config.json`` dict the way the config class would: aliases
        (``attribute_map``), defaults, derived values (``head_dim = hidden_size // num_attention_heads``)
        and its validity checks. Errors name the file, the field and the value."""
        c = dict(cfg)
        for alias, canon in self.config.get("aliases", {}).items():
            if alias in c and c.get(canon) is None and c[alias] is not None:
                c[canon] = c[alias]
        env: dict[str, Any] = {}
        later: list[tuple[str, dict[str, Any]]] = []
        for name, spec in self.config["fields"].items():
            if "from" in spec:  # a value the config class keeps inside a dict field, or under older names
                v = None
                for path in spec["from"]:
                    x: Any = c
                    for k in path:
                        x = x.get(k) if isinstance(x, dict) else None
                    if x is not None:
                        v = x
                        break
                if v is None:
                    v = spec.get("default")
            else:
                v = c.get(name, spec.get("default"))
            if isinstance(v, str) and v in spec.get("rewrite", {}):  # the config class replaces this value
                v = spec["rewrite"][v]
            if v is None and spec.get("derive") is not None:
                try:
                    v = compile_expr(spec["derive"])(env)
                except (ExprError, TypeError, ZeroDivisionError, KeyError, IndexError) as e:
                    raise FitplanError(f"cannot derive {name} ({spec['derive']}): {e}", file=file, field=f"$.{name}") from None
            kind = spec.get("type", "any")
            if spec.get("when") is not None and v is None:
                later.append((name, spec))  # a size only some switches use: required if they are on
            elif v is not None or spec.get("size"):
                v = _check_type(name, v, kind, bool(spec.get("size")), file)
            env[name] = v
        for name, spec in later:
            if compile_expr(spec["when"])(env):
                _check_type(name, None, spec.get("type", "any"), True, file)
        for expr, field, msg in self.config.get("checks", []):
            try:
                ok = compile_expr(expr)(env)
            except (ExprError, TypeError, ZeroDivisionError, KeyError, IndexError):
                ok = False
            if not ok:
                raise FitplanError(f"{msg} ({expr})", file=file, field=f"$.{field}", value=env.get(field))
        held = self.data.get("held") or {}
        stated = {name: env.get(name, c.get(name)) for name in held}  # held values are constants, not symbols
        off = [name for name, value in held.items() if stated[name] is not None and stated[name] != value]
        if off:
            served = ", ".join(f"{name} = {value!r}" for name, value in held.items())
            raise FitplanError(f"the learned {self.model_type} file serves only {served}; this config has "
                               + ", ".join(f"{name} = {stated[name]!r}" for name in off)
                               + " (the learner could not vary these alone: its sizes hold them as constants)",
                               file=file, field=f"$.{off[0]}", value=stated[off[0]],
                               suggestion="learn this config: fitplan learn-architecture CONFIG --install")
        return env

    # ------------------------------------------------------------------ parameters
    def n_layers(self, env: dict[str, Any]) -> int:
        return int(compile_expr(self.spec_map["num_hidden_layers"])(env))

    def entries(self, env: dict[str, Any]) -> list[list[Any]]:
        """The parameter entries of the model ``env`` describes: the file's, or with :data:`SCORE_HEAD` set the
        sequence classifier's (no output module, a ``score`` Linear ``hidden -> 1``)."""
        if not env.get(SCORE_HEAD):
            return self.params
        return [p for p in self.params if p[2] != "output"] + [self.score_entry()]

    def score_entry(self) -> list[Any]:
        """``score.weight``: ``(1, hidden)``, the hidden size as the LM head's (else the input embedding's) entry
        spells it, in its dtype code."""
        head = next((p for p in self.params if p[2] == "output"), None) or \
            next(p for p in self.params if p[2] == "embedding")
        return [SCORE[0], ["1", head[1][1]], *SCORE[2:5], head[5] if len(head) > 5 else SCORE[5]]

    def param_list(self, env: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str, bool, int | None, list[Any]]]:
        """``(name, shape, role, per_layer, layer, entry)`` of every parameter tensor (tied ones once)."""
        out = []
        L = self.n_layers(env)
        kinds = self.layer_kinds(env)
        for entry in self.entries(env):
            name, dims, role, where, cond = entry[:5]
            if cond is not None and not compile_expr(cond)(env):
                continue
            names = self.repeated(name, env)
            if where is None:
                shape = tuple(int(compile_expr(d)(env)) for d in dims)
                out.extend((nm, shape, role, False, None, entry) for nm in names)
                continue
            same = None if any(_uses_layer(d) for d in dims) else tuple(int(compile_expr(d)(env)) for d in dims)
            for i in range(L):
                if kinds[i] not in where:
                    continue
                shape = same if same is not None else tuple(int(compile_expr(d)(env | {"i": i})) for d in dims)
                out.extend((nm.replace("{i}", str(i)), shape, role, True, i, entry) for nm in names)
        return out

    def repeated(self, name: str, env: dict[str, Any]) -> list[str]:
        """The names of a parameter entry: ``name`` itself, or for a parameter of a repeated block
        (``norms.{h}.weight``, :mod:`.learned_repeat`) one per repetition, as many as the file's ``repeats``
        expression for it says (``num_attention_heads``)."""
        expr = self.repeats.get(name)
        if expr is None:
            return [name]
        return [name.replace(REPEAT, str(h)) for h in range(int(compile_expr(expr)(env)))]

    def _flag_names(self) -> set[str]:
        import re

        when = re.sub(r"'[^']*'|\"[^\"]*\"", "", (self.data.get("flags") or {}).get("when") or "")
        return {n for n in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", when) if n not in ("and", "or", "not", "is", "None")}

    def check_flags(self, env: dict[str, Any], file: str | None = None) -> None:
        """:raises FitplanError: the config's switches (``env``) are not a combination this file learned (its
        ``flags.when``), naming ``file`` (the user's config; default this learned file) and the categorical switch
        whose value no learned combination states (``hidden_act: None``), else ``model``."""
        import re

        when = (self.data.get("flags") or {}).get("when")
        if not when or compile_expr(when)(env):
            return
        names = sorted(self._flag_names())
        odd = next((n for n in names if (vals := re.findall(rf"\b{n} == '([^']*)'", when)) and env.get(n) not in vals),
                   None)
        shown = ", ".join(f"{k}={env.get(k)!r}" for k in names)
        raise NotLearned(f"{self.model_type}: this config's switches ({shown}) are not among those learned ({when})",
                           file=file or str(self.path), field=f"$.{odd}" if odd else "model",
                           value=env.get(odd) if odd else None,
                           suggestion="learn them from this config: fitplan learn-architecture CONFIG --install")

    def param_entry(self, name: str, env: dict[str, Any]) -> list[Any] | None:
        """The parameter entry of ``name`` whose switch condition holds for ``env``."""
        if env.get(SCORE_HEAD):
            if name == SCORE[0]:
                return self.score_entry()
            if any(p[2] == "output" for p in self.param_index.get(name, ())):
                return None
        rows = [p for p in self.param_index.get(learned_repeat.template(name, self.param_index), ())
                if p[4] is None or compile_expr(p[4])(env)]
        if len(rows) > 1 and "i" in env:  # one row per shape, by layer kind (Kimi-Linear's o_proj): the layer's own
            kind = self.layer_kinds(env)[env["i"]]
            return next((p for p in rows if p[3] is not None and kind in p[3]), rows[0])
        return rows[0] if rows else None

    def tie(self, env: dict[str, Any]) -> dict[str, str]:
        """Parameter names that are the same tensor as another in this config (tied embeddings)."""
        out = {}
        for name, target, cond in self.data.get("tied", []):
            if cond is None or compile_expr(cond)(env):
                out[name] = target
        return out

    def layer_kinds(self, env: dict[str, Any]) -> list[str]:
        L = self.n_layers(env)
        expr = self.layers.get("kind")
        kinds = self.layers["kinds"]
        if not expr:
            return [kinds[0]] * L
        f = compile_expr(expr)
        out = []
        for i in range(L):
            k = self._layer_kind(f, expr, env, i)
            if k not in kinds:
                raise FitplanError(f"layer {i} is of kind {k!r}, which {self.path.name} has no graph for",
                                   file=str(self.path), field="$.layers.kind", value=k,
                                   suggestion="re-learn the architecture from a config with this layer kind")
            out.append(k)
        return out

    def _layer_kind(self, f, expr: str, env: dict[str, Any], i: int) -> str:
        """Layer ``i``'s kind; a config the expression cannot place (Exaone4Config derives ``layer_types`` only
        from an integer ``sliding_window_pattern``: ``"LLLG"`` needs ``layer_types`` stated, as the class's
        ``(i + 1) % sliding_window_pattern`` fails without it) is refused naming the fields the expression reads."""
        try:
            return f({**env, "i": i})
        except (ExprError, TypeError, ZeroDivisionError, KeyError, IndexError) as e:
            import re

            names = sorted({n for n in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", re.sub(r"'[^']*'|\"[^\"]*\"", "", expr))
                            if n in env and n != "i"})
            shown = ", ".join(f"{n} = {env[n]!r}" for n in names)
            names = [n for n in names if env[n] is not None] + [n for n in names if env[n] is None]  # the stated first
            raise FitplanError(f"cannot tell the kind of layer {i} from {shown} ({type(e).__name__}: {e}): "
                               f"the {self.config.get('class', 'config')} class cannot either",
                               field=f"$.{names[0]}" if names else "$.layer_types",
                               value=env.get(names[0]) if names else None,
                               suggestion="state layer_types (one entry per layer) or an integer pattern") from None

    def variant(self, precision: str, attn: str, env: dict[str, Any]) -> dict[str, Any]:
        """The recorded graphs for a precision class (``16``, ``mixed``, ``32``) and attention kernel whose
        regime condition (e.g. ``s > sliding_window``) holds."""
        self.check_flags(env)
        impls = self.data.get("attn_implementations")
        if impls and attn == "sdpa" and "sdpa" not in impls:
            attn = impls[0]  # transformers' default for a model without SDPA (the estimate warns)
        if impls and attn not in impls:
            raise FitplanError(f"{self.model_type} has no {attn!r} attention in transformers "
                               f"{self.learned.get('transformers', '?')} (it supports {', '.join(impls)})",
                               field="attn_implementation", value=attn,
                               suggestion=f"use --attn-implementation {impls[0]}")
        for v in self.variants:
            if v["precision"] != precision or v["attn"] != attn:
                continue
            when = v.get("when")
            if when is None or compile_expr(when)(env):
                return v
        if not any(v["precision"] == precision for v in self.variants):  # the learner left it out: the model
            # fails in it (DBRX's experts under autocast, see docs/architectures.md "The learner")
            from fitplan.inputs.precision import PRESETS

            replay = ", ".join(n for n, p in PRESETS.items() if p.graph_class == precision)  # XLNet: 32-true too
            raise FitplanError(f"{self.model_type} does not run in precision class {precision!r}: its learned file "
                               f"has no graph for it (the model failed there when it was learned), and the presets "
                               f"{replay} replay that graph", file=str(self.path),
                               field="precision", value=precision, suggestion="use another precision")
        whens = [v.get("when") for v in self.variants if v["precision"] == precision and v["attn"] == attn]
        if whens:  # graphs of this class exist, for other regimes (MiMo-V2-Flash: the learner ran no GQA one; a
            # chunked mixer learned below one chunk holds for ``s <= chunk_size`` only, fitplan_torch.learn.seqbound)
            names = sorted({n for w in whens for n in re.findall(r"[A-Za-z_][A-Za-z_0-9]*",
                                                                  re.sub(r"'[^']*'|\"[^\"]*\"", "", str(w)))
                            if n in env and n not in ("and", "or", "not", "is", "None")})
            shown = ", ".join(f"{n}={env[n]!r}" for n in names)
            raise FitplanError(f"{self.model_type}: no learned graph for precision class {precision!r} with {attn!r} "
                               f"attention applies to this config ({shown}; the learned ones hold where "
                               f"{' or '.join(str(w) for w in whens)})", file=str(self.path), field="model",
                               suggestion="a config (and sequence length) in one of those regimes is estimated, or "
                                          "re-learn the architecture where this one is")
        raise FitplanError(f"{self.model_type}: no learned graph for precision class {precision!r} with "
                           f"{attn!r} attention", file=str(self.path), field="attn_implementation", value=attn,
                           suggestion="re-learn the architecture (fitplan learn-architecture) with this setting")


_KIND_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "list": "a list"}


def _check_type(name: str, v: Any, kind: str, size: bool, file: str | None) -> Any:
    if "|" in kind and not size:  # the config class takes several kinds (Exaone4Config: ``str | int``)
        kinds = kind.split("|")
        if isinstance(v, str) and "str" in kinds:
            return v
        whole = isinstance(v, int) or isinstance(v, float) and v.is_integer()
        if "int" in kinds and not isinstance(v, bool) and whole:
            return int(v)
        raise FitplanError(f"{name} must be {' or '.join(_KIND_WORDS.get(k, k) for k in kinds)}, got {v!r}",
                           file=file, field=f"$.{name}", value=v)
    if size:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            if isinstance(v, float) and v.is_integer() and v >= 1:
                return int(v)
            what = "missing" if v is None else f"{v!r}"
            raise FitplanError(f"{name} must be a positive integer, got {what}", file=file, field=f"$.{name}", value=v)
        return v
    if kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise FitplanError(f"{name} must be an integer, got {v!r}", file=file, field=f"$.{name}", value=v)
    if kind == "float" and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise FitplanError(f"{name} must be a number, got {v!r}", file=file, field=f"$.{name}", value=v)
    if kind == "bool" and not isinstance(v, bool):
        raise FitplanError(f"{name} must be true or false, got {v!r}", file=file, field=f"$.{name}", value=v)
    if kind == "list" and not isinstance(v, (list, tuple)):
        raise FitplanError(f"{name} must be a list, got {v!r}", file=file, field=f"$.{name}", value=v)
    if isinstance(v, list):
        return tuple(v)
    return v


@functools.lru_cache(maxsize=4)
def autograd_table() -> dict[str, Any]:
    """PyTorch's save rules per aten op (generated from derivatives.yaml by fitplan-torch)."""
    path = data_file("autograd.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))["ops"]
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise FitplanError(f"cannot read the autograd rules table: {e}", file=str(path)) from None


@functools.lru_cache(maxsize=4096)
def _uses_layer(expr: Any) -> bool:
    """Whether a dimension expression reads the layer index ``i`` (else its value is the same in every layer and
    is computed once: a 100,000-layer config is read in a fraction of a second)."""
    import re

    return isinstance(expr, str) and re.search(r"\bi\b", expr) is not None
