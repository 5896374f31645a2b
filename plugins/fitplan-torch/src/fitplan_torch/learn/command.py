"""``fitplan learn-architecture CONFIG``: learn a model type from its transformers implementation."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from fitplan.api import FitplanError


def _read_config(path: str) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    from fitplan.api import read_json

    # the input boundary (a regular file, bounded, no lone surrogate), reading Infinity as transformers does
    data = read_json(p, field="CONFIG", special_floats=True)
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise FitplanError("a config.json must name its model_type", file=str(p), field="$.model_type",
                           value=data.get("model_type") if isinstance(data, dict) else None)
    _check_takes_labels(data["model_type"], p)
    data = text_config(data)
    _check_known(data["model_type"], p)
    return data


def _check_takes_labels(model_type: str, p: Path) -> None:
    """The causal LM ``AutoModelForCausalLM`` builds for ``model_type`` computes a loss from ``labels`` (the
    training step every estimate counts). Gemma4AssistantForCausalLM and Gemma4UnifiedAssistantForCausalLM take no
    ``labels`` and return no loss: drafters for speculative decoding, run on the target model's ``inputs_embeds``
    and ``shared_kv_states``, whose ``input_ids`` are "not actually used" (models/gemma4_assistant/
    modeling_gemma4_assistant.py ``forward``, 5.24); over the 196 causal-LM types, only these two.
    :raises FitplanError: naming the class and the inputs its forward takes."""
    import inspect

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None:
        return
    params = inspect.signature(cls.forward).parameters
    if "labels" in params:
        return
    takes = [k for k, v in params.items() if k != "self" and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)]
    raise FitplanError(f"{model_type}'s causal LM {name} takes no labels and returns no loss (its forward takes "
                       f"{', '.join(takes)}): there is no training step of token ids with labels to learn",
                       file=str(p), field="$.model_type", value=model_type,
                       suggestion="a model that trains only on another model's states (a speculative-decoding "
                       "drafter) is not supported")


def text_config(data: dict) -> dict:
    """The part of a composite config its causal LM is built from (:func:`fitplan.api.decoder_config`: a
    multimodal type's ``text_config``, MusicGen's ``decoder``), as fitplan's estimates read it
    (fitplan/arch/architecture.py ``spec_from_config``); any other config as given. A text type that
    ``AutoModelForCausalLM`` lists only under the outer type (emu3's ``emu3_text_model``, musicgen's
    ``musicgen_decoder``) is built as that type's causal LM (:func:`.derive.register_text_model`)."""
    from fitplan.api import decoder_config

    return decoder_config(data)


def _check_known(model_type: str, p: Path) -> None:
    """transformers knows ``model_type`` (``AutoConfig.for_model`` looks it up in ``CONFIG_MAPPING`` and raises
    a ValueError listing every name otherwise: transformers/models/auto/configuration_auto.py, 5.24).
    :raises FitplanError: naming the file and the closest known names."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        from fitplan.api import did_you_mean

        raise FitplanError(f"transformers has no model_type {model_type!r:.80}: nothing to learn from", file=str(p),
                           field="$.model_type", value=model_type[:80],
                           suggestion=did_you_mean(model_type, list(CONFIG_MAPPING.keys()))
                           or "a model_type of the installed transformers (its auto classes list them)")


def shrink(cfg: dict, log=lambda msg: None) -> dict:
    """A tiny config of the same model type that its config class accepts (:mod:`.shrink`)."""
    from .shrink import shrink as _shrink

    return _shrink(cfg, log)


KERNEL_CACHE = "64"
"""Entries each of torch's two oneDNN kernel caches keeps during a learning (both default to 1024)."""


def bound_kernel_caches() -> None:
    """Bound the CPU kernel caches a learning fills, unless the environment sets them. A bf16 matmul or
    convolution on CPU runs through oneDNN, which compiles a kernel per shape and keeps it: in oneDNN's primitive
    cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, 1024 by default, oneDNN's primitive-cache documentation) and in
    ideep's cache in front of it (``LRU_CACHE_CAPACITY``, 1024 by default; pytorch/pytorch issues 27971 and 32037:
    resident memory grows with every new input shape). A learning records hundreds of configs, each at other
    widths: Lara-Mini's 64-wide model grew ~30 MB resident with every new width or sequence length (~20 MB of it
    ideep's, the rest oneDNN's), flat with both at 64 and no slower (10 recordings: 8.8 CPU s against 10.5). Both
    are read when the first kernel is made, so setting them here, before any model runs, takes effect. A recording
    repeats its shapes within one step (the warm-up step, then the recorded one: record.py), which 64 entries still
    hold; numerics and the tensors the recorder sees do not depend on the cache."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, KERNEL_CACHE)


def register(cli: click.Group) -> None:
    @cli.command("learn-architecture")
    @click.argument("config", type=click.Path())
    @click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
                  help="write <model_type>.json and <model_type>.graphs.json here (default: the user cache with "
                       "--install, else the current directory)")
    @click.option("--install", is_flag=True, help="write into the user cache (~/.cache/fitplan/architectures), "
                  "where fitplan finds it for every later estimate")
    @click.option("--no-shrink", is_flag=True, help="learn at the config's own sizes (slow for real models)")
    @click.option("--verify/--no-verify", default=True, help="check the file against fresh torch runs at held-out "
                  "sizes before writing it (default on)")
    @click.option("--tolerance", type=float, default=0.01, show_default=True,
                  help="largest relative error of saved activations and the step peak the check accepts")
    @click.option("--quiet", is_flag=True)
    def learn_architecture(config: str, out_dir: str | None, install: bool, no_shrink: bool, verify: bool,
                           tolerance: float, quiet: bool) -> None:
        """Learn CONFIG's model_type from its transformers implementation (random weights, tiny sizes, CPU)
        and write the learned architecture file fitplan's estimates use (docs/architectures.md)."""
        bound_kernel_caches()
        from .learner import learn_and_check

        def log(msg: str) -> None:
            if not quiet:
                click.echo(msg, err=True)

        try:
            cfg = _read_config(config)
            if not no_shrink:
                cfg = shrink(cfg, log)
            if install:
                from fitplan.api import arch_dirs

                target = Path(out_dir) if out_dir else arch_dirs()[-1]
            else:
                target = Path(out_dir or ".")
            written = learn_and_check(cfg, target, verify=verify, tolerance=tolerance, log=log)
        except FitplanError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        for p in written:
            click.echo(str(p))
