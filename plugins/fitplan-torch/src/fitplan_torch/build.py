"""Building the scenario's model, optimizer and batch in PyTorch (random weights, nothing downloaded).

* the model: ``AutoConfig.for_model(**config.json)`` + ``AutoModelForCausalLM.from_config(config,
  dtype=..., attn_implementation=...)``. transformers 5 builds in the config's ``torch_dtype`` unless
  told otherwise, so the dtype is always passed.
* precision presets (fitplan.inputs.precision): the weights in the preset's weight dtype (optimizer states
  follow the parameter dtype), ``torch.autocast`` in its compute dtype for the autocast presets.
  ``*-master`` (DeepSpeed-style fp32 master weights) has no plain-PyTorch equivalent: refused.
* method: full; LoRA through peft's ``LoraConfig``; QLoRA through bitsandbytes (:mod:`.qlora`: CUDA or its CPU
  backend; not under FakeTensorMode).
* gradient checkpointing: HF's ``gradient_checkpointing_enable(use_reentrant=False)``.
* the optimizer: the scenario optimizer's ``torch_class`` and ``torch_kwargs`` (what CUDA would use),
  so a third-party optimizer plugin is validated with its own implementation.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from typing import Any

from fitplan.api import FitplanError

from . import _deps

def param_dtype(precision: str):
    """The torch dtype the preset's weights are loaded in (fitplan.inputs.precision's table)."""
    from fitplan.api import HF_WORD, PRESETS

    torch = _deps.torch()
    p = PRESETS[precision]
    if p.master:
        raise FitplanError(
            f"precision {precision!r} cannot be validated in plain PyTorch: fp32 master weights with 16-bit "
            "weights are what DeepSpeed / Megatron optimizers do, not torch.optim",
            field="precision", value=precision,
            suggestion="validate bf16-true (same weights, gradients) or bf16-mixed (torch AMP) instead")
    return getattr(torch, HF_WORD[p.weight_dtype])


def autocast(precision: str, device_type: str):
    """``torch.autocast`` in the compute dtype for the autocast presets (``*-mixed``, ``*-autocast*``: what
    accelerate's ``mixed_precision`` wraps the forward in), else a null context."""
    from fitplan.api import HF_WORD, PRESETS

    torch = _deps.torch()
    p = PRESETS.get(precision)  # "none": the caller autocasts itself (accelerate's own mixed precision)
    if p is None or not p.autocast:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=getattr(torch, HF_WORD[p.compute_dtype]))


def hf_config(cfg: dict[str, Any], attn_implementation: str):
    transformers = _deps.transformers()
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    try:
        config = transformers.AutoConfig.for_model(**cfg)
    except (ValueError, KeyError, TypeError) as e:
        raise FitplanError(f"transformers cannot build a config from this model: {e}", field="model",
                           value=cfg.get("model_type"),
                           suggestion="give a config.json whose model_type transformers knows") from None
    config.use_cache = False
    return config


def build_model(cfg: dict[str, Any], *, precision: str, attn_implementation: str, method: str,
                lora: dict[str, Any] | None = None, gradient_checkpointing: bool = False, device: str = "cpu",
                fake: bool = False, seed: int = 0):
    """The scenario's model with random weights, in training mode.

    Under FakeTensorMode (``fake=True``; the caller has entered the mode) parameters have shapes and
    dtypes but no memory.
    """
    torch = _deps.torch()
    transformers = _deps.transformers()
    dtype = param_dtype(precision)
    lcfg = lora or {}
    if method == "qlora" and fake:
        raise FitplanError("QLoRA needs bitsandbytes' kernels: it cannot run under FakeTensorMode",
                           field="method", value="qlora", suggestion="use --mode cpu (small models) or --mode cuda")
    config = hf_config(cfg, attn_implementation)
    if attn_implementation == "flash_attention_2" and device != "cuda":
        raise FitplanError("flash_attention_2 runs on CUDA only", field="attn_implementation", value=attn_implementation,
                           suggestion="validate with --attn-implementation sdpa (the same memory model) or on a GPU")
    torch.manual_seed(seed)
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": attn_implementation}
    try:
        if method == "qlora":
            from .qlora import load_4bit, prepare

            compute = lcfg.get("bnb_4bit_compute_dtype") or {"32-true": "fp32"}.get(precision, "bf16" if "bf16" in precision else "fp16")
            model = load_4bit(config, dtype=dtype, compute=compute, double_quant=lcfg.get("bnb_4bit_use_double_quant", True),
                              device=device, seed=seed)
            model = prepare(model, lcfg.get("kbit_preparation", "peft"), gradient_checkpointing)
        else:
            with torch.device(device) if not fake else fake_safe_module_to():
                model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    except FitplanError:
        raise
    except (ValueError, ImportError, NotImplementedError, KeyError, TypeError, AttributeError) as e:
        raise FitplanError(f"transformers cannot build {cfg.get('model_type')!r} with {attn_implementation}: "
                           f"{type(e).__name__}: {e}",
                           field="model", value=cfg.get("model_type")) from None
    if fake:
        cast_floating_(model, dtype)  # from_config honours dtype, but be certain (model.to fails under fake)
    if gradient_checkpointing:
        enable_checkpointing(model)
    if method in ("lora", "qlora"):
        peft = _deps.peft()
        lcfg = lora or {}
        from fitplan.api import peft_target_modules

        # one rule for what the targets mean (fitplan.trace.lora_targets): "all-linear" and a regular
        # expression go to peft as the string (a list ["all-linear"] would look for a module of that name)
        # (none named: peft's own default for the model type, as a script's LoraConfig() gets)
        targets = tuple(lcfg.get("lora_target_modules") or ())
        lc = peft.LoraConfig(r=lcfg.get("lora_r", 8), lora_alpha=lcfg.get("lora_alpha", 16),
                             target_modules=peft_target_modules(targets) if targets else None,
                             lora_dropout=lcfg.get("lora_dropout", 0.0), task_type="CAUSAL_LM",
                             modules_to_save=list(lcfg.get("lora_modules_to_save") or ()) or None)
        try:
            with fake_safe_module_to() if fake else contextlib.nullcontext(), warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=FutureWarning)  # peft reads a deprecated transformers flag
                model = peft.get_peft_model(model, lc)
        except ValueError as e:
            raise FitplanError(f"peft cannot apply LoRA: {e}", field="lora_target_modules",
                               value=",".join(lcfg.get("lora_target_modules") or ())) from None
        if method == "qlora":
            from .qlora import after_lora

            after_lora(model, lcfg.get("kbit_preparation", "peft"))
    model.train()
    return model


def enable_checkpointing(model) -> None:
    """HF full recomputation, non-reentrant (transformers 5.24 renamed ``gradient_checkpointing_enable`` to
    ``activation_checkpointing_enable``; both are accepted)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.24
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def cast_floating_(module, dtype=None, device=None) -> None:
    """Move/cast parameters and buffers in place of ``module.to(...)``, which fails under FakeTensorMode in
    torch 2.13 (it swaps tensors, and fake tensors carry weak references). Only floating-point tensors
    change dtype; tied parameters stay tied (one new Parameter per original); RoPE's ``inv_freq`` stays fp32."""
    torch = _deps.torch()
    memo: dict[int, Any] = {}

    def convert(t):
        want_dtype = dtype if dtype is not None and t.is_floating_point() else t.dtype
        want_device = torch.device(device) if device is not None else t.device
        if t.dtype == want_dtype and t.device == want_device:
            return None
        return t.detach().to(device=want_device, dtype=want_dtype)

    for mod in module.modules():
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            new = memo.get(id(p))
            if new is None:
                with torch.no_grad():
                    data = convert(p)
                if data is None:
                    continue
                new = memo[id(p)] = torch.nn.Parameter(data, requires_grad=p.requires_grad)
            mod._parameters[name] = new
        for name, b in list(mod._buffers.items()):
            if b is None or "inv_freq" in name:
                continue
            data = convert(b)
            if data is not None:
                mod._buffers[name] = data


@contextlib.contextmanager
def fake_safe_module_to():
    """Inside: ``nn.Module.to`` is :func:`cast_floating_` (peft moves each adapter to its base layer's
    device and dtype with ``.to``, which FakeTensorMode cannot do)."""
    torch = _deps.torch()
    orig = torch.nn.Module.to

    def to(self, *args, **kwargs):
        device, dtype, _non_blocking, _fmt = torch._C._nn._parse_to(*args, **kwargs)
        cast_floating_(self, dtype, device)
        return self

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = orig


def import_dotted(path: str):
    mod, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise FitplanError(f"cannot import the optimizer class {path!r}: {e}", field="optim", value=path,
                           suggestion="install the package that provides it") from None


def build_optimizer(spec, params, *, device: str, lr: float = 1e-5, model=None):
    """The optimizer fitplan modelled: ``spec.torch_class(params, **spec.torch_kwargs)``.

    ``torch_kwargs`` name the implementation CUDA would pick (e.g. ``foreach=True``); on the CPU and
    under FakeTensorMode the same implementation is forced, so the temporaries are CUDA's. A bitsandbytes
    8-bit optimizer gets what the HF Trainer adds (transformers 5.24 trainer.py, ``create_optimizer``): every
    ``nn.Embedding`` of ``model`` optimized with 32-bit states (``register_module_override``, read at the first
    step).
    """
    if not spec.torch_class:
        raise FitplanError(f"optimizer {spec.name!r} declares no torch implementation (torch_class)", field="optim",
                           value=spec.name, suggestion="its plugin should set OptimizerSpec.torch_class")
    if spec.torch_class.startswith("bitsandbytes."):
        _deps.need("bitsandbytes")  # 0.50's CPU backend runs the 8-bit optimizers; paged ones fall back to unpaged
    cls = import_dotted(spec.torch_class)
    kwargs = {"lr": lr, **dict(spec.torch_kwargs)}
    optimizer = cls(params, **kwargs)
    if model is not None and spec.torch_class.startswith("bitsandbytes.") and kwargs.get("optim_bits") == 8:
        import bitsandbytes

        manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
        for module in model.modules():
            if isinstance(module, _deps.torch().nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
    return optimizer


def make_batch(vocab_size: int, batch: int, seq: int, *, device: str, seed: int = 0):
    """Random token ids and labels (no padding, no attention mask: every token counts)."""
    torch = _deps.torch()
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, seq), generator=g).to(device)
    return {"input_ids": ids, "labels": ids.clone()}


@contextlib.contextmanager
def real_path_under_fake():
    """Make transformers take the path a real run takes while tensors are fake.

    * transformers treats FakeTensors as tracing (``is_tracing(tensor)``) and then builds a (b, 1, s, s)
      causal mask and repeats k/v for grouped-query attention, which a real run does not: inside this
      context ``is_fake_tensor`` answers False.
    * ``find_packed_sequence_indices`` asks ``(mask[:, -1] == 0).all()``, a data-dependent question a
      fake tensor cannot answer; the batches built here are never packed, so the real answer is None.
      The same temporaries are allocated before answering.
    * ``aten._grouped_mm``'s meta kernel (torch 2.13 ``_meta_registrations.py`` ``_meta_grouped_mm_common``)
      demands bf16 inputs, the condition of the CUDA kernel's fast path only: the real kernels run any other
      dtype through ``_grouped_mm_fallback``, a loop of ``mm`` into the output (``aten/src/ATen/native/cuda/
      GroupedBlas.cpp`` ``_grouped_mm_cuda``: ``use_fast_path = ... && a_b_and_out_are_bf16``, else the
      fallback; the CPU kernel is the fallback). transformers 5.24 casts the MoE experts' input to the
      weights' dtype (``integrations/moe.py`` ``_grouped_mm``), fp32 under ``*-mixed``: inside this context
      the meta kernel gives such inputs the output the fallback allocates.
    """
    iu = importlib.import_module("transformers.utils.import_utils")
    mu = importlib.import_module("transformers.masking_utils")
    orig_fake, orig_packed = iu.is_fake_tensor, getattr(mu, "find_packed_sequence_indices", None)

    def find_packed_sequence_indices(position_ids):
        if orig_fake(position_ids):
            torch = _deps.torch()
            first = position_ids[:, :1] - 1
            (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
            return None
        return orig_packed(position_ids)

    iu.is_fake_tensor = lambda x: False
    if orig_packed is not None:
        mu.find_packed_sequence_indices = find_packed_sequence_indices
    grouped = _grouped_mm_meta_for_every_dtype()
    try:
        yield
    finally:
        iu.is_fake_tensor = orig_fake
        if orig_packed is not None:
            mu.find_packed_sequence_indices = orig_packed
        if grouped is not None:
            grouped._destroy()  # the original meta kernel is back


def _grouped_mm_meta_for_every_dtype():
    """A Meta kernel for ``aten._grouped_mm`` that accepts what the real kernels accept (see
    :func:`real_path_under_fake`); the library registration to destroy afterwards, or None."""
    torch = _deps.torch()
    mr = importlib.import_module("torch._meta_registrations")
    if not hasattr(torch.ops.aten, "_grouped_mm") or not hasattr(mr, "meta_grouped_mm"):
        return None
    bf16_only = mr.meta_grouped_mm

    def meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        if mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16:
            return bf16_only(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)
        torch._check(mat_a.dtype == mat_b.dtype, lambda: f"expected one dtype, got {mat_a.dtype} and {mat_b.dtype}")
        return mr._create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_grouped_mm", meta, "Meta", allow_override=True)
    return lib


def vocab_size_of(model) -> int:
    """The token ids a batch may hold: rows of the input embedding and of the output head, whichever is fewer
    (CPM-Ant's input embedding adds ``prompt_types * prompt_length`` prompt rows to the ``vocab_size`` rows of its
    ``lm_head``: transformers/models/cpmant/modeling_cpmant.py, 5.24; a label past the head's rows fails the loss)."""
    rows = int(model.get_input_embeddings().weight.shape[0])
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return min(rows, int(weight.shape[0])) if weight is not None and weight.dim() == 2 else rows
