"""LoRA and QLoRA reducers.

LoRA (Hu et al. 2021; peft): each adapted Linear of shape (out, in) gets A (r, in) and B (out, r);
only those are trainable.

QLoRA as transformers 5.24 and bitsandbytes 0.50.2 build it (Dettmers et al. 2023):

* **What is quantized.** ``replace_with_bnb_linear`` swaps modules whose type *is* ``nn.Linear`` (or GPT-2's
  ``Conv1D``) (transformers/integrations/bitsandbytes.py:189), except the output embeddings, tied weights and
  the last module (quantizers/base.py:39-63): the decoder layers' Linear weights. Embeddings, norms, biases,
  MoE routers (a ``nn.Parameter``, not a Linear) and the **fused 3-D MoE experts** of transformers 5
  (``MixtralExperts.gate_up_proj``/``down_proj``, models/mixtral/modeling_mixtral.py:57-66) stay in the load
  dtype.
* **Storage per 4-bit weight of n elements** (bitsandbytes functional.py:884-965, blocksize 64, nf4 and fp4
  alike): ``ceil(n/2)`` packed bytes, the 16-entry fp32 code (64 B), and per block of 64 an absmax: fp32
  without double quantization; with it (``bnb_4bit_use_double_quant``) a uint8 absmax plus an fp32 absmax per
  256 blocks, the 256-entry fp32 code of the second level (1,024 B) and the fp32 offset (4 B), one set per
  ``Linear4bit``.
* **After loading** (``kbit_preparation``, a stated assumption): peft's ``prepare_model_for_kbit_training``
  casts every non-quantized fp16/bf16 parameter to fp32 (peft/utils/other.py:204-209) — the MoE experts
  included, which is where most of an MoE QLoRA run's memory goes; TRL's SFTTrainer does not, and casts the
  adapters to bf16 (trl/trainer/sft_trainer.py:908-911); ``none`` is ``get_peft_model`` alone (fp32 adapters).
"""

from __future__ import annotations

import math

from fitplan.engine.declarations import quantity, reducer
from fitplan.errors import FitplanError
from fitplan.inputs.settings import Setting
from fitplan.pluginmgr.hookspecs import hookimpl

NF4_BLOCK = 64
DOUBLE_QUANT_BLOCK = 256

LOAD_IN_8BIT = Setting(
    "load_in_8bit", "lora", type="bool", default=False, after="bnb_4bit_use_double_quant",
    help="With --method qlora: the base Linears in LLM.int8 (bitsandbytes Linear8bitLt) instead of NF4.")
"""The one declaration of ``load_in_8bit`` (a field of ``[lora]``): with ``method = "qlora"``, the base Linears in
LLM.int8 (transformers' ``BitsAndBytesConfig(load_in_8bit=True)``, bitsandbytes ``Linear8bitLt``) instead of NF4:
axolotl's and LLaMA-Factory's 8-bit LoRA. Where it applies: :func:`qlora` (the weights), ``trace/int8.py`` and
``trace/kernels.py`` (the step), ``builtin/activations.py`` ``trace_setup`` (which refuses it without QLoRA)."""


def adapter_tensors(arch, lora_r, lora_target_modules, idle: bool = False):
    """The LoRA A and B tensors peft 0.21 creates for ``lora_target_modules`` on ``arch``
    (:mod:`.lora_targets`): A (r, in) and B (out, r) per targeted ``nn.Linear`` / ``Conv1D``; for MoE
    models whose experts peft maps to parameter targets (the learned file's ``lora.parameter_targets``),
    ``lora.ParamWrapper`` factors A (r·E, in) and B (out, r·E) per expert stack (r doubled for the fused
    ``gate_up_proj``) and A (r, in), B (out, r) for a 2-D router weight. Those on a Linear the step never runs
    (``ParamGroup.no_grad``: peft wraps it all the same, tuners/tuners_utils.py ``inject_adapter`` matches names)
    or whose forward the step never calls (the learned file's ``lora.uncalled_linears``: Mamba's ``dt_proj``, read
    as a weight by the reference scan) get no gradient: ``idle`` returns them alone, otherwise they are left out."""
    from fitplan.trace.lora_targets import ALL_LINEAR, lora_site_matches, parameter_targets, unmatched_targets

    targets = tuple(lora_target_modules or ())
    groups = arch.param_groups()
    trained: dict[tuple[int, ...], int] = {}
    unused: dict[tuple[int, ...], int] = {}
    out = unused if idle else trained
    linear = [g for g in groups if g.linear is not None]
    from fitplan.arch.archfile import load
    from fitplan.arch.architecture import idle_params

    af = load(arch.model_type)
    no_grad = idle_params(af, dict(arch.symbols))
    uncalled = set(af.lora.get("uncalled_linears", ()))  # a Linear the step never calls: its adapters never run

    def path_template(name: str) -> str:
        return name.rsplit(".", 1)[0]

    names: list[str] = []
    # every concrete Linear weight, in the layers whose kind has it (a shared expert in the MoE layers only)
    for name, shape, role, _, _, entry in af.param_list(dict(arch.symbols)):
        if not role.startswith("linear:"):
            continue
        path = name.rsplit(".", 1)[0]
        names.append(path)
        if lora_site_matches(path, targets, af):
            in_f, out_f = (shape[0], shape[1]) if len(entry) > 6 and entry[6] == "conv1d" else (shape[1], shape[0])
            into = unused if entry[0] in no_grad or path_template(entry[0]) in uncalled else trained
            for shape_ in ((lora_r, in_f), (out_f, lora_r)):
                into[shape_] = into.get(shape_, 0) + 1
    for path, shapes in head_and_embedding_adapters(af, dict(arch.symbols), targets, lora_r):
        names.append(path)
        for shape_ in shapes:
            trained[shape_] = trained.get(shape_, 0) + 1
    param_targets = parameter_targets(af, targets)
    for g in groups:
        leaf = g.name.rsplit(".", 1)[-1]
        key = next((t for t in param_targets if g.name.endswith("." + t)), None)
        if key is None:
            continue
        mult = param_targets[key]
        if len(g.shape) >= 3:
            e, out_f, in_f = g.shape[0], g.shape[-2], g.shape[-1]
            shapes = ((lora_r * mult * e, in_f), (out_f, lora_r * mult * e))
        else:
            out_f, in_f = g.shape[0], g.shape[-1]
            shapes = ((lora_r * mult, in_f), (out_f, lora_r * mult))
        names.append(g.name)
        del leaf
        into = unused if g.no_grad else trained
        for shape in shapes:
            into[shape] = into.get(shape, 0) + g.count
    _refuse_non_tensor_linears(af, targets, arch)
    missing = unmatched_targets(targets, names + list(_converted_names(af)))
    if missing or not (trained or unused):
        extra = {n.rsplit(".", 2)[-2] for n, _, role, per_layer, _, _ in af.param_list(dict(arch.symbols))
                 if role == "embedding" and not per_layer}  # peft wraps embeddings and the head by name too
        extra |= {af.output_module} if af.output_module else set()
        modules = sorted({g.path.rsplit(".", 1)[-1] for g in linear} | set(_converted_names(af)) | extra)
        raise FitplanError(
            f"LoRA target module(s) {', '.join(missing) or ', '.join(targets)} not found in {arch.name}",
            field="lora_target_modules", value=",".join(targets),
            suggestion="modules of this model: " + ", ".join(modules) + f", or {ALL_LINEAR}",
        )
    return tuple(out.items())


def head_and_embedding_adapters(af, env, targets: tuple[str, ...], r: int):
    """``(module, (A shape, B shape))`` for the LM head and the input embeddings when the targets name them
    (peft 0.21 ``tuners/lora/model.py`` ``_create_new_module``): the output ``nn.Linear`` (``lm_head``: never
    under ``all-linear``) gets a ``lora.Linear``, A (r, hidden) and B (vocab, r), whether or not its weight is
    tied to the embedding's; an ``nn.Embedding`` gets a ``lora.Embedding`` (``tuners/lora/layer.py``
    ``Embedding.update_layer``: ``lora_embedding_A`` (r, num_embeddings), ``lora_embedding_B``
    (embedding_dim, r))."""
    from fitplan.trace.lora_targets import embedding_matches, lora_site_matches

    shapes = {name: shape for name, shape, _, per_layer, _, _ in af.param_list(env) if not per_layer}
    out = []
    for name, shape, role, per_layer, _, _ in af.param_list(env):
        if role == "embedding" and not per_layer and embedding_matches(name.rsplit(".", 1)[0], targets):
            num, dim = shape
            out.append((name.rsplit(".", 1)[0], ((r, num), (dim, r))))
    head = af.output_module
    if head and lora_site_matches(head, targets, af):
        weight = shapes.get(head + ".weight")
        if weight is None:  # tied: the head reads the embedding's weight
            tied = next((t[1] for t in af.data.get("tied", ()) if t[0] == head + ".weight"), None)
            weight = shapes.get(tied)
        if weight is not None:
            vocab, hidden = weight
            out.append((head, ((r, hidden), (vocab, r))))
    return out


def _refuse_non_tensor_linears(af, targets: tuple[str, ...], arch) -> None:
    """peft 0.21 adapts every ``nn.Linear`` the targets select, subclasses included; one whose forward returns a
    tuple (the learned file's ``lora.non_tensor_linears``: Llama-4's router) makes ``lora.Linear.forward`` raise
    ``AttributeError: 'tuple' object has no attribute 'dtype'`` (peft/tuners/lora/layer.py, ``result.dtype``):
    the run cannot start, so the estimate refuses it."""
    from fitplan.trace.lora_targets import lora_site_matches

    bad = [m for m in af.lora.get("non_tensor_linears", ())
           if any(lora_site_matches(m.replace("{i}", str(i)), targets, af) for i in range(af.n_layers(dict(arch.symbols))))]
    if bad:
        leaf = sorted({m.rsplit(".", 1)[-1] for m in bad})
        ok = sorted({m.rsplit(".", 1)[-1] for m in af.layer_sites} - set(leaf))
        raise FitplanError(
            f"LoRA targets {','.join(targets)} select {', '.join(bad)}, an nn.Linear whose forward returns a tuple: "
            f"peft 0.21 wraps it and its LoRA forward fails (peft/tuners/lora/layer.py: 'tuple' object has no "
            f"attribute 'dtype')", field="lora_target_modules", value=",".join(targets),
            suggestion=f"name the modules to adapt without {', '.join(leaf)}: --lora-target-modules {','.join(ok)}")


def _converted_names(af) -> list[str]:
    return list(af.lora.get("parameter_targets", {}))




@reducer("trainable_tensors", when=lambda method: method in ("lora", "qlora"))
def lora(value, arch, lora_r, lora_target_modules, lora_modules_to_save, method, weight_dtype_bytes,
         trainable_dtype_bytes, kbit_preparation, zero_stage, fsdp):
    """Only the adapters train: A (r × in) and B (out × r) per targeted Linear (peft LoraConfig), and the copies
    of the ``modules_to_save`` (:func:`saved_module_tensors`)."""
    out = dict(adapter_tensors(arch, lora_r, lora_target_modules))
    if lora_modules_to_save:
        copy_bytes = 4 if method == "qlora" and kbit_preparation == "peft" else weight_dtype_bytes
        for shape in saved_module_tensors(arch, tuple(lora_target_modules or ()), tuple(lora_modules_to_save),
                                          copy_bytes, trainable_dtype_bytes, zero_stage, fsdp):
            out[shape] = out.get(shape, 0) + 1
    return tuple(out.items())


def saved_module_tensors(arch, targets: tuple[str, ...], names: tuple[str, ...], copy_bytes: float,
                         adapter_bytes: float, zero_stage: int, fsdp) -> list[tuple[int, ...]]:
    """The parameter shapes of peft's ``modules_to_save`` copies (``utils/other.py`` ``_set_trainable``: a module
    whose full name ends with a listed name is wrapped in a ``ModulesToSaveWrapper`` holding the frozen original and
    a trainable ``deepcopy``, in the original's dtype: peft's ``cast_adapter_dtype`` upcasts only the LoRA layers'
    parameters, tuners_utils.py). Modelled for modules outside the decoder layers whose weight is not tied, with
    the copy in the adapters' dtype (one trainable dtype), without ZeRO-3 or FSDP; anything else is refused."""
    from fitplan.arch.archfile import load

    af = load(arch.model_type)
    env = dict(arch.symbols)
    ties = af.tie(env)
    tied = set(ties) | set(ties.values())
    for m in names:
        if any(t.rsplit(".", 1)[0].endswith(m) for t in tied):
            raise FitplanError(f"lora_modules_to_save {m!r} is a module whose weight is tied to another: not modelled",
                               field="lora_modules_to_save", value=",".join(names))
    out, found = [], set()
    for name, shape, _, per_layer, _, _ in af.param_list(env):
        module = name.rsplit(".", 1)[0]
        hit = [m for m in names if module.endswith(m)]
        if not hit:
            continue
        found.update(hit)
        why = ("a module inside the decoder layers" if per_layer else
               "a module LoRA also adapts" if any(module == t or module.endswith("." + t) for t in targets) else None)
        if why is None and copy_bytes != adapter_bytes:
            why = (f"a copy in {copy_bytes:g}-byte weights beside {adapter_bytes:g}-byte adapters (fitplan prices one "
                   "trainable dtype: set autocast_adapter_dtype = false, or use fp32 weights)")
        if why is None and (zero_stage == 3 or fsdp):
            why = "a trained module under ZeRO-3 or FSDP (not checked against a referee)"
        if why:
            raise FitplanError(f"lora_modules_to_save {hit[0]!r} is {why}: not modelled", field="lora_modules_to_save",
                               value=",".join(names))
        out.append(shape)
    missing = [n for n in names if n not in found]
    if missing:
        raise FitplanError(f"lora_modules_to_save {', '.join(missing)} names no module of {arch.name}",
                           field="lora_modules_to_save", value=",".join(names),
                           suggestion="e.g. embed_tokens or lm_head (peft matches the end of the module's name)")
    return out


CODE_BYTES = 16 * 4
"""The 4-bit code table (``get_4bit_type``, functional.py:936): 16 fp32 values, one per ``Linear4bit``."""
DOUBLE_QUANT_CONSTANTS = 256 * 4 + 4
"""Double quantization: the 8-bit dynamic code (256 fp32, one copy per layer) and the fp32 offset (functional.py:938-951)."""


def quantized_groups(arch):
    """The parameter groups bitsandbytes stores in 4 bits: the weights of the ``nn.Linear`` / ``Conv1D`` call
    sites inside the decoder layers, as the learned file records them (not a router that is a bare
    ``nn.Parameter``, not the fused 3-D experts, not a subclass of ``nn.Linear`` with its own forward)."""
    return [g for g in arch.param_groups() if g.layer and g.linear is not None and not g.custom_linear]


def quantized_param_count(arch) -> int:
    """Parameters QLoRA stores in 4 bits."""
    return sum(g.total for g in quantized_groups(arch))


def nf4_bytes(n: int, double_quant: bool) -> float:
    """One 4-bit weight of ``n`` elements as bitsandbytes stores it (module doc), constants included."""
    blocks = -(-n // NF4_BLOCK)
    if double_quant:
        return -(-n // 2) + blocks + -(-blocks // DOUBLE_QUANT_BLOCK) * 4 + CODE_BYTES + DOUBLE_QUANT_CONSTANTS
    return -(-n // 2) + blocks * 4 + CODE_BYTES


def kbit_base_bytes(weight_dtype_bytes: float, kbit_preparation: str) -> float:
    """Bytes per non-quantized base parameter after the script's preparation (module doc)."""
    return 4 if kbit_preparation == "peft" else weight_dtype_bytes


@reducer("weight_bytes", when=lambda method, assumptions: method == "qlora" and assumptions != "seed")
def qlora(value, arch, param_count, weight_dtype_bytes, adapter_param_count, trainable_dtype_bytes,
          bnb_4bit_use_double_quant, kbit_preparation, fp32_param_count, load_in_8bit):
    """The decoder layers' Linear weights in 4 bits with their constants; every other base parameter in the
    load dtype (fp32 for those the model keeps in fp32), or fp32 after ``prepare_model_for_kbit_training``
    (``kbit_preparation = "peft"``); the adapters in their own dtype. ``load_in_8bit``: LLM.int8 instead of NF4,
    one byte per element and one fp32 scale per output row (bitsandbytes 0.50.2 ``Int8Params``: ``CB`` and
    ``SCB`` from ``int8_vectorwise_quant``, nn/modules.py)."""
    groups = quantized_groups(arch)
    q = sum(g.total for g in groups)
    if load_in_8bit:
        packed = sum((g.numel + 4 * g.shape[0]) * g.count for g in groups)
    else:
        packed = sum(nf4_bytes(g.numel, bnb_4bit_use_double_quant) * g.count for g in groups)
    per = kbit_base_bytes(weight_dtype_bytes, kbit_preparation)
    base = (param_count - q) * per + fp32_param_count * max(0, 4 - per)
    return int(base + packed + adapter_param_count * trainable_dtype_bytes)


@quantity("params")
def idle_adapter_param_count(method, arch, lora_r, lora_target_modules):
    """LoRA parameters on Linears the step never runs (:func:`adapter_tensors` ``idle``): peft creates them, so
    they are weights, but they get no gradient and no optimizer state; 0 for full fine-tuning."""
    if method == "full" or arch.count_only or not (arch.no_grad_params[0] or _uncalled_linears(arch)):
        return 0
    return sum(math.prod(shape) * n for shape, n in adapter_tensors(arch, lora_r, lora_target_modules, idle=True))


def _uncalled_linears(arch) -> bool:
    """Whether the learned file names Linears the step never calls (``lora.uncalled_linears``)."""
    from fitplan.arch.archfile import load

    return bool(load(arch.model_type).lora.get("uncalled_linears"))


@quantity("params")
def qlora_unquantized_param_count(method, arch, param_count):
    """Base parameters a QLoRA run leaves unquantized (bitsandbytes replaces ``nn.Linear`` only): embeddings,
    norms, routers, the LM head and the fused 3-D MoE experts; 0 without QLoRA."""
    if method != "qlora":
        return 0
    return param_count - quantized_param_count(arch)


@quantity("bytes")
def qlora_unquantized_bytes(qlora_unquantized_param_count, weight_dtype_bytes, kbit_preparation, fp32_param_count):
    """Their bytes in the dtype the script leaves them (fp32 after ``prepare_model_for_kbit_training``, and for
    the tensors the model keeps in fp32)."""
    per = kbit_base_bytes(weight_dtype_bytes, kbit_preparation)
    kept = fp32_param_count if qlora_unquantized_param_count else 0
    return int(qlora_unquantized_param_count * per + kept * max(0, 4 - per))


def qlora_line(values, arch, kbit_preparation: str, bits: int = 4) -> str | None:
    """The report's line for QLoRA: what bitsandbytes quantized and what it left (and in which dtype)."""
    kept = values.get("qlora_unquantized_param_count") or 0
    if not kept:
        return None
    q = quantized_param_count(arch)
    experts = sum(g.total for g in arch.param_groups() if g.layer and len(g.shape) == 3)
    dtype = {"peft": "fp32 (prepare_model_for_kbit_training)", "trl": "the load dtype (TRL: no k-bit preparation)",
             "none": "the load dtype"}[kbit_preparation]
    custom = sum(g.total for g in arch.param_groups() if g.layer and g.custom_linear)
    what = f"{experts / 1e9:.2f}B in fused MoE experts, " if experts else ""
    if custom:  # transformers 5.24 replaces modules whose type is nn.Linear (integrations/bitsandbytes.py:189)
        what += f"{custom / 1e9:.2f}B in subclasses of nn.Linear, "
    return (f"bitsandbytes quantized {q / 1e9:.2f}B Linear parameters to {bits} bits; {kept / 1e9:.2f}B stay unquantized "
            f"({what}embeddings, norms, head) in {dtype}: {values['qlora_unquantized_bytes'] / 1e9:.2f} GB")


@hookimpl
def fitplan_register_quantities(register):
    register(idle_adapter_param_count)
    register(qlora_unquantized_param_count)
    register(qlora_unquantized_bytes)


@hookimpl
def fitplan_register_reducers(register):
    register(lora)
    register(qlora)


@hookimpl
def fitplan_register_settings(register):
    register(LOAD_IN_8BIT)
