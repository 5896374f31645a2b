"""Running the shrunk config once, and repairing what only the model (not its config class) needs.

A config class checks some relations between its fields; the model code relies on more. CodeGen's and GPT-J's
``rotary_dim`` (64 by default) must not exceed the head width (``n_embd // n_head``: 16 once shrunk), Whisper's
``decoder_attention_heads`` (6) must divide ``d_model`` (64 once shrunk); neither class says so. So the shrunk
config is run once (one bf16 training step, b=2, s=16, on random weights: a few seconds) and, when the model
raises:

* a field the model reads is unset (``None``: DeepSeek-V2's ``num_experts_per_tok``, a class default no published
  config keeps): refused naming the field and its value, with the model line that fails; the config must state it;
* otherwise the numbers in the error name the fields to repair: a field whose value the message quotes (``got
  embed_dim: 64 and num_heads: 6``; ``tensor a (16) must match tensor b (64)``) is set to a smaller tiny width
  (64, 32, ... 2) or, if shrinking made it, put back at its given size, until the model runs (at most
  :data:`MAX_TRIES` runs); a repair that only changes the error is kept and the next error read;
* when nothing runs, refused with the model's error and the line it came from.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from fitplan.api import FitplanError

TINY = (128, 64, 32, 16, 8, 4, 2)
"""The widths a quoted field is tried at, largest first (a field is only ever made smaller)."""
MAX_TRIES = 24
"""Runs spent on repairs (each builds and steps the tiny model once)."""
MAX_ROUNDS = 6
"""Errors read one after another (Whisper: the decoder's heads, then the encoder's)."""
MODEL_WIDTHS = ("hidden_size", "n_embd", "d_model")
"""Never put back at their given size by a repair (the model would no longer be tiny)."""
NOT_A_WIDTH = ("_token_id", "layers", "_layer", "max_position_embeddings", "n_positions", "vocab_size",
               "num_labels", "seed")


def run_error(cfg: dict[str, Any], precision: str = "16") -> BaseException | None:
    """The exception one training step of ``cfg`` raises (SDPA, or eager where the model has none), or None;
    ``precision``: the learner's precision class (``16``: bf16 weights; ``mixed``: fp32 weights under autocast)."""
    from .derive import batch_for, build

    try:
        try:
            model, config = build(cfg, precision, "sdpa")
        except ValueError as e:
            if "attention implementation" not in str(e) and "sdpa" not in str(e).lower():
                raise
            model, config = build(cfg, precision, "eager")
        out = model(**batch_for(config, 2, 16))
        out.loss.backward()
    except Exception as e:  # noqa: BLE001 - whatever the model raises is the finding
        return e
    return None


def runnable(cfg: dict[str, Any], out: dict[str, Any], err: BaseException | None, log=lambda msg: None
             ) -> dict[str, Any]:
    """``out`` (the shrunk ``cfg``) if it runs, else repaired so that it does (module doc); ``err``: what its
    run raised (:func:`run_error`), None when it ran.

    :raises FitplanError: naming the unset field, or the fields the error quotes, with the model's error."""
    if err is None:
        return out
    tries, first = 0, err
    repaired: list[str] = []
    for _ in range(MAX_ROUNDS):
        if err is None:
            return out
        _refuse_unset(cfg, out, err)
        _refuse_missing(cfg, out, err)
        _refuse_missing_key(out, err)
        if _runs_mixed_only(out, err, log):
            return out
        fixed, err2, tries = _repair(cfg, out, err, tries, repaired)
        if fixed is None:
            break
        log(f"  shrink: {fixed[1]} (the model needs it: {_short(err)})")
        out, err = fixed[0], err2
        repaired.append(fixed[1].split()[0])
    if err is None:
        return out
    from .verify import failing_line

    _refuse_label_layout(cfg, err)
    _refuse_fixed_length(cfg, first)
    quoted = sorted(_quoted_fields(out, err)) or sorted(config_names_read(err, line_only=True))
    raise FitplanError(f"the shrunk config does not run, and no repair made it run: {failing_line(err)}",
                       field=", ".join(quoted) or "model_type", value=cfg.get("model_type"),
                       suggestion="--no-shrink learns it at its own size")


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"


def _resolved(cfg: dict[str, Any]) -> dict[str, Any]:
    from .derive import hf_config

    return hf_config(cfg).to_dict()


# --------------------------------------------------------------------------- an unset field


def _model_frame(e: BaseException):
    """The last traceback frame in transformers' model code (``transformers/models``), or None."""
    tb, last = e.__traceback__, None
    while tb is not None:
        if "/transformers/models/" in tb.tb_frame.f_code.co_filename:
            last = tb
        tb = tb.tb_next
    return last


def config_names_read(e: BaseException, line_only: bool = False) -> set[str]:
    """The config fields the failing model code reads: on the failing line, ``config.X`` and ``self.a`` where the
    module's ``__init__`` set ``self.a = config.X`` (DeepSeek-V2's ``k=self.top_k``, set from
    ``config.num_experts_per_tok``); when none of those (and not ``line_only``), every ``config.X`` of the failing
    function and of the module's class."""
    import linecache

    tb = _model_frame(e)
    if tb is None:
        return set()
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
    sources = []
    for obj in (tb.tb_frame.f_code, type(tb.tb_frame.f_locals.get("self", None))):
        try:
            sources.append(inspect.getsource(obj))
        except (OSError, TypeError):
            continue
    attrs = {a: x for src in sources for a, x in re.findall(r"self\.(\w+)\s*=\s*" + _READ, src)}
    attrs.update({a: x for src in sources for a, _, x in re.findall(r"self\.(\w+)\s*=\s*" + _GETATTR, src)})
    on_line = _reads(line) | {attrs[a] for a in re.findall(r"self\.(\w+)", line) if a in attrs}
    if on_line or line_only:
        return on_line
    return {m for src in sources for m in _reads(src)}


_READ = r"(?:self\.)?config\.(\w+)"
_GETATTR = r"getattr\((?:self\.)?config,\s*(['\"])(\w+)\1"
"""``config.X`` and ``getattr(config, "X", ...)`` (HunYuan's ``self.head_dim = getattr(config, "head_dim", ...)``)."""


def _reads(src: str) -> set[str]:
    return set(re.findall(_READ, src)) | {x for _, x in re.findall(_GETATTR, src)}


_MISSING = object()


def read_values(out: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """``{field: value}`` of the names the model code reads, through the config object (an alias of the class's
    ``attribute_map``, Dots1's ``num_local_experts`` for ``n_routed_experts``, is named by its field)."""
    from .derive import hf_config

    from .shrink import sub_config_keys

    c = hf_config(out)
    amap = getattr(c, "attribute_map", {}) or {}
    subs = {k: getattr(c, k, None) for k in sorted(sub_config_keys(out))}
    out_values = {}
    for k in sorted(n for n in names if not n.startswith("_")):  # not the class's own state (_attn_implementation)
        v = getattr(c, k, _MISSING)
        if v is not _MISSING:
            out_values[amap.get(k, k)] = v
            continue
        for sub, obj in subs.items():  # a nested config's field (DBRX's attn_config.clip_qkv)
            v = getattr(obj, k, _MISSING)
            if v is not _MISSING:
                out_values[f"{sub}.{k}"] = v
                break
    return out_values


def _refuse_unset(cfg: dict[str, Any], out: dict[str, Any], e: BaseException) -> None:
    """:raises FitplanError: the error is about ``None`` and the failing code reads a field that is None."""
    if "None" not in str(e) and not isinstance(e, TypeError):  # torch.empty(None, 2) says "takes 1 argument"
        return
    unset = sorted(k for k, v in read_values(out, config_names_read(e, line_only=True)).items() if v is None)
    unset = unset or sorted(k for k, v in read_values(out, config_names_read(e)).items() if v is None)
    if not unset:
        return
    from .verify import failing_line

    raise FitplanError(f"{', '.join(unset)} {'is' if len(unset) == 1 else 'are'} None, which the model cannot run: "
                       f"{failing_line(e)}",
                       field=", ".join(unset), value=None,
                       suggestion=f"state {unset[0]} in the config (a published config of this type does)")


def _refuse_missing(cfg: dict[str, Any], out: dict[str, Any], e: BaseException) -> None:
    """:raises FitplanError: the model reads a field that its config class (or one of its nested configs) has no
    default for, so that no config object has it unless the config states it (DBRX reads
    ``attn_config.rope_theta``, which ``DbrxAttentionConfig`` does not declare in transformers 5.24:
    models/dbrx/modeling_dbrx.py, configuration_dbrx.py; a published DBRX config states it)."""
    m = re.fullmatch(r"'(\w+)' object has no attribute '(\w+)'", str(e).strip())
    if not isinstance(e, AttributeError) or m is None:
        return
    from .derive import hf_config
    from .shrink import sub_config_keys

    c = hf_config(out)
    owners = {type(c).__name__: ""}
    owners.update({type(getattr(c, k, None)).__name__: f"{k}." for k in sub_config_keys(out)})
    if m.group(1) not in owners:
        return
    from .verify import failing_line

    name = owners[m.group(1)] + m.group(2)
    raise FitplanError(f"{name} is not set and {m.group(1)} has no default for it, which the model reads: "
                       f"{failing_line(e)}", field=name, value=None,
                       suggestion=f"state {name} in the config (a published config of this type does)")


def _refuse_label_layout(cfg: dict[str, Any], e: BaseException) -> None:
    """:raises FitplanError: no repair made the step run and its loss compares logits and labels of different batch
    sizes (torch's ``cross_entropy``: "Expected input batch_size (X) to match target batch_size (Y)"): the model
    takes its tokens in another layout than ``b`` rows of ``s`` ids with ``labels = input_ids``, the batch every
    recording and every estimate of fitplan assumes. MusicGen's causal LM reads ``input_ids`` as
    ``(batch * num_codebooks, seq)`` and ``labels`` as ``(batch, seq, num_codebooks)`` (models/musicgen/
    modeling_musicgen.py ``MusicgenForCausalLM.forward``, 5.24). Fewer logit rows than label rows is another
    construct: the loss leaves out positions kept for inputs other than token ids, which a text-only batch has not
    (GIT's loss slices ``logits[:, num_image_tokens:-1]``, ``num_image_tokens = (image_size / patch_size)**2 + 1``,
    at least 1, with or without pixel values: models/git/modeling_git.py ``GitForCausalLM.forward``, 5.24)."""
    m = re.search(r"Expected input batch_size \((\d+)\) to match target batch_size \((\d+)\)", str(e))
    if not isinstance(e, ValueError) or m is None:
        return
    from .verify import failing_line

    if int(m.group(1)) < int(m.group(2)):
        raise FitplanError(f"the model's loss leaves out positions it keeps for inputs other than token ids (a batch "
                           f"of 2 sequences of 16 tokens gives {m.group(1)} logit rows against {m.group(2)} label "
                           f"rows), so a text-only batch, which fitplan's estimates assume, does not train it: "
                           f"{failing_line(e)}", field="labels", value=cfg.get("model_type"),
                           suggestion="a causal LM that trains only with image (or other non-token) inputs is not "
                           "supported yet")
    raise FitplanError(f"the model's loss takes labels in another layout than its input_ids (a batch of 2 sequences "
                       f"of 16 tokens gives {m.group(1)} logit rows against {m.group(2)} label rows), so a batch of "
                       f"token ids with labels = input_ids, which fitplan's estimates assume, does not train it: "
                       f"{failing_line(e)}", field="labels", value=cfg.get("model_type"),
                       suggestion="a model whose tokens come in several streams per position is not supported yet")


def _refuse_fixed_length(cfg: dict[str, Any], e: BaseException) -> None:
    """:raises FitplanError: no repair made the step run, and the model's first error was its own check of the
    sequence length (a ``ValueError`` naming it): the model trains only at sequence lengths its config fixes, while
    fitplan's estimates and the learner's probes vary ``s``. Reformer's axial position embeddings train only at
    ``prod(axial_pos_shape)`` tokens, and its chunked attention at multiples of its chunk lengths
    (models/reformer/modeling_reformer.py ``AxialPositionEmbeddings.forward``, ``ReformerModel.forward``, 5.24).
    Only the message changes (the step was refused anyway): it names the fields the model's message names."""
    if not isinstance(e, ValueError) or not re.search(r"sequence[ _]length", str(e), re.IGNORECASE):
        return
    from .verify import failing_line

    named = list(dict.fromkeys(re.findall(r"config\.(\w+)", str(e))))
    raise FitplanError(f"the model trains only at sequence lengths its config fixes, and fitplan's estimates vary the "
                       f"sequence length: {failing_line(e)}", field=", ".join(named) or "model_type",
                       value=cfg.get("model_type"), suggestion="a model that trains at one sequence length only "
                       "is not supported yet")


def kept_dtypes(model) -> dict[str, Any]:
    """Parameter name -> dtype, for the floating parameters of a model built in bfloat16 that keep another dtype
    and that its ``_keep_in_fp32_modules`` lists do not name. XLNet creates its attention weights as
    ``torch.FloatTensor`` (models/xlnet/modeling_xlnet.py ``XLNetRelativeAttention.__init__``): float32 whatever
    default dtype ``from_config`` sets, and ``from_pretrained`` keeps a parameter's own dtype where it differs from
    the one asked for (core_model_loading.py, 5.24)."""
    import torch

    keep = [*(getattr(model, "_keep_in_fp32_modules", None) or []),
            *(getattr(model, "_keep_in_fp32_modules_strict", None) or [])]
    return {n: p.dtype for n, p in model.named_parameters()
            if p.is_floating_point() and p.dtype != torch.bfloat16 and not any(k in n for k in keep)}


def fails_on_kept_dtypes(cfg: dict[str, Any], e: BaseException | None) -> dict[str, Any]:
    """The kept parameters (:func:`kept_dtypes`) of ``cfg`` built in bfloat16, where its bf16 step failed with
    ``e``, a dtype mismatch: bf16 hidden states meet those float32 weights (XLNet's einsum), so bf16-true
    training fails in transformers itself; empty where that is not the failure."""
    if not isinstance(e, RuntimeError) or not re.search(r"scalar type|dtype", str(e)):
        return {}
    from .derive import build

    try:
        model, _ = build(cfg, "16", "eager")
    except Exception:  # noqa: BLE001 - it does not build: not this construct
        return {}
    return kept_dtypes(model)


def kept_line(odd: dict[str, Any], e: BaseException) -> str:
    """How the learner names the construct of :func:`fails_on_kept_dtypes` (its parameters and failing line)."""
    from .verify import failing_line

    names = ", ".join(list(odd)[:3]) + (f" and {len(odd) - 3} more" if len(odd) > 3 else "")
    dtypes = ", ".join(sorted({str(d).removeprefix("torch.") for d in odd.values()}))
    return (f"the model keeps {len(odd)} parameter(s) in {dtypes} when built in bfloat16 ({names}), and its "
            f"bf16-true training step fails on them: {failing_line(e)}")


def bf16_failure(base: dict[str, Any], model) -> str:
    """Why the 16-bit step of ``base`` fails, where ``model`` (built in bfloat16) keeps float32 parameters the
    step fails on (:func:`fails_on_kept_dtypes`); '' where it keeps none or runs. bf16-true fails in transformers
    itself and 32-true replays the same graph, so the learner leaves the class out (``learner._supported``)."""
    if not kept_dtypes(model):
        return ""
    err = run_error(base, "16")
    odd = fails_on_kept_dtypes(base, err)
    return kept_line(odd, err) if odd else ""


def _runs_mixed_only(out: dict[str, Any], e: BaseException, log) -> bool:
    """True where ``out``'s bf16 step fails on parameters it keeps in float32 (:func:`fails_on_kept_dtypes`) and
    its bf16-mixed step runs: autocast casts both operands of the failing op (``einsum``, on autocast's
    lower-precision list, torch/csrc/autocast_mode.cpp) to bf16, so the learner learns that precision class and
    leaves the 16-bit one out (:func:`.learner._supported`).

    :raises FitplanError: the construct named, where the bf16-mixed step fails too."""
    odd = fails_on_kept_dtypes(out, e)
    if not odd:
        return False
    said = kept_line(odd, e)
    mixed = run_error(out, "mixed")
    if mixed is None:
        log(f"  shrink: {said}; it runs in bf16-mixed, which is learned")
        return True
    raise FitplanError(f"{said}; its bf16-mixed step fails too: {_short(mixed)}", field="dtype", value="bfloat16",
                       suggestion="transformers cannot train this model in bf16-true or bf16-mixed")


def _refuse_missing_key(out: dict[str, Any], e: BaseException) -> None:
    """:raises FitplanError: the failing line looks a key up in a dict field of the config that has no such entry
    (CohereCompassTextConfig leaves ``rope_parameters`` empty by default, and its rotary embedding reads
    ``config.rope_parameters[layer_type]`` for every layer type: models/cohere_compass/configuration_cohere_compass.py
    ``convert_rope_params_to_dict``, modeling_cohere_compass.py:80, 5.24)."""
    if not isinstance(e, KeyError) or not e.args or not isinstance(e.args[0], str):
        return
    key = e.args[0]
    dicts = [k for k, v in read_values(out, config_names_read(e, line_only=True)).items()
             if isinstance(v, dict) and key not in v]
    if not dicts:
        return
    from .verify import failing_line

    name = f"{dicts[0]}[{key!r}]"
    raise FitplanError(f"{dicts[0]} has no entry {key!r}, which the model reads: {failing_line(e)}",
                       field=name, value=None,
                       suggestion=f"state {name} in the config (a published config of this type does)")


# --------------------------------------------------------------------------- a relation the model needs


def _quoted_fields(out: dict[str, Any], e: BaseException) -> dict[str, int]:
    """Integer fields of the resolved config whose value the error message quotes (not 0 or 1), also those of its
    nested configs (:func:`nested_ints`)."""
    message = re.sub(r"(?<=\d)x(?=\d)", " ", str(e))  # torch's matmul quotes shapes as "34x64 and 2048x128"
    numbers = {int(x) for x in re.findall(r"(?<![\w.])\d+(?![\w.])", message)} - {0, 1}
    resolved = _resolved(out)
    fields = {**{k: v for k, v in resolved.items() if type(v) is int}, **nested_ints(out, resolved)}
    return {k: v for k, v in fields.items() if v in numbers and not any(x in k for x in NOT_A_WIDTH)}


def nested_ints(out: dict[str, Any], resolved: dict[str, Any]) -> dict[str, int]:
    """``{"<sub>.<field>": value}``: the integer fields of the nested configs (the class's ``sub_configs``) that
    ``out`` states. A width of one nested config can be tied to one of another that the model alone checks: BLT's
    local decoder projects the global transformer's output with ``nn.Linear(decoder_config.hidden_size_global,
    ...)`` (models/blt/modeling_blt.py ``BltLocalDecoder``, 5.24), so ``global_config.hidden_size`` shrunk to 64
    meets ``hidden_size_global`` at its 2048 ("mat1 and mat2 shapes cannot be multiplied (34x64 and 2048x128)")."""
    from .shrink import sub_config_keys

    subs = [k for k in sorted(sub_config_keys(out))
            if isinstance(out.get(k), dict) and isinstance(resolved.get(k), dict)]
    return {f"{sub}.{k}": v for sub in subs for k, v in resolved[sub].items()
            if type(v) is int and k in out[sub]}


def _get(cfg: dict[str, Any], name: str) -> Any:
    """The value of ``name`` in ``cfg``, a nested config's field as ``<sub>.<field>``; None where not stated."""
    sub, _, k = name.rpartition(".")
    d = cfg.get(sub) if sub else cfg
    return d.get(k) if isinstance(d, dict) else None


def _with(cfg: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """``cfg`` with ``name`` (``<sub>.<field>`` inside a nested config) set to ``value``; ``cfg`` is left as it is."""
    sub, _, k = name.rpartition(".")
    if not sub:
        return {**cfg, k: value}
    return {**cfg, sub: {**cfg[sub], k: value}}


def _candidates(cfg: dict[str, Any], out: dict[str, Any], e: BaseException, repaired: list[str]):
    """``(trial config, what)`` pairs for the fields to repair: those the failing line reads first (Kimi-Linear's
    ``topk(..., k=self.top_k)`` over fewer experts than ``num_experts_per_token``: "selected index k out of
    range" quotes no number), then those whose value the error quotes. A field shrinking did not touch (the
    relation is its) is tried at the tiny widths below its value; a field shrinking made is put back at its
    given size (Marian's ``vocab_size``: the logits keep ``decoder_vocab_size``). A field an earlier round
    repaired with a progress (the error changed) is tried again, smaller (BailingHybrid: 8 expert groups over 4
    experts fail in a ``view``; 4 groups then fail in ``topk(2)`` over each group's one expert; 2 run)."""
    read = read_values(out, config_names_read(e, line_only=True) | set(repaired))
    fields = {k: v for k, v in read.items() if type(v) is int and not any(x in k for x in NOT_A_WIDTH[:3])}
    strong = set(fields)
    fields.update({k: v for k, v in _quoted_fields(out, e).items() if k not in fields})
    fields = {k: v for k, v in fields.items() if "." not in k or isinstance(out.get(k.rpartition(".")[0]), dict)}
    touched = {k for k in fields if k not in repaired and _get(cfg, k) is not None and _get(out, k) is not None
               and _get(cfg, k) != _get(out, k)}
    for k, value in fields.items():
        if k not in touched:
            yield from ((_with(out, k, v), f"{k} = {v}", k in strong) for v in TINY if v < value)
    for k in fields:  # never the model width itself: a 4096-wide model is no repair of a tiny one
        if k in touched and type(_get(cfg, k)) is int and k.rpartition(".")[2] not in MODEL_WIDTHS:
            yield _with(out, k, _get(cfg, k)), f"{k} kept at {_get(cfg, k)}", k in strong


def _repair(cfg: dict[str, Any], out: dict[str, Any], e: BaseException, tries: int, repaired: list[str]):
    """The first candidate that runs, else the first whose error differs (progress: of a field the failing line
    reads, before any quoted field is tried); ``((config, what) or None, its error, runs spent)``."""
    from .derive import hf_config

    progress = None
    for trial, what, strong in _candidates(cfg, out, e, repaired):
        if tries >= MAX_TRIES or (progress is not None and progress[2] and not strong):
            break  # the fields the failing line reads came first: their progress before any other field
        try:
            hf_config(trial)
        except Exception:  # noqa: BLE001 - the class rejects it
            continue
        tries += 1
        err = run_error(trial)
        if err is None:
            return (trial, what), None, tries
        if progress is None and _short(err) != _short(e):
            progress = ((trial, what), err, strong)
    if progress is not None:
        return progress[0], progress[1], tries
    return None, e, tries
