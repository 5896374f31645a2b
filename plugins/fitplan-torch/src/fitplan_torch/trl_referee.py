"""The referee for TRL 1.16's preference trainers: TRL's own ``DPOTrainer``, ``KTOTrainer`` and ``RewardTrainer``
on the CPU, measured phase by phase.

A tiny model with random weights, a word-level tokenizer over its vocabulary (``<unk>``, ``<eos>``, ``<pad>``, ``t3`` ... ``t{V-1}``) and a
dataset of ``b`` pairs per step whose chosen and rejected completions have one length, so that the collated
batch is exactly ``(2b, prompt + completion)``. ``trainer.train()`` runs two optimizer steps; the second (the
steady state: the optimizer states exist) is measured by a live-storage counter (:class:`.measure.LiveBytes`)
with phase marks: ``forward`` (the policy's forward and the loss), ``reference_forward`` (a forward called
with grad disabled: the reference model's, or the policy's with its adapters disabled), ``backward``
(``accelerator.backward``), ``optimizer_step`` (``on_pre_optimizer_step`` to ``on_optimizer_step``).
Tracked from the step's start: the policy's and the reference model's parameters and buffers, the optimizer
states, and the batch (when ``training_step`` receives it).
"""

from __future__ import annotations

from typing import Any

from . import _deps
from .measure import LiveBytes, optimizer_state_tensors


def _tokenizer(vocab: int):
    transformers = _deps.transformers()
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, "<eos>": 1, "<pad>": 2, **{f"t{i}": i for i in range(3, vocab)}}
    tk = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>",
                                                unk_token="<unk>")


def _pairs(n: int, prompt: int, completion: int, vocab: int, unpaired: bool = False):
    """``n`` preference pairs of ``prompt`` + ``completion`` tokens (the completion ends with EOS); unpaired
    (KTO): one completion each and a bool label, alternately desirable and undesirable."""
    torch = _deps.torch()
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)

    def words(k: int) -> str:
        return " ".join(f"t{int(i)}" for i in torch.randint(3, vocab, (k,), generator=g))

    if unpaired:
        return Dataset.from_list([{"prompt": words(prompt), "completion": " " + words(completion - 1) + " <eos>",
                                   "label": i % 2 == 0} for i in range(n)])
    return Dataset.from_list([{"prompt": words(prompt), "chosen": " " + words(completion - 1) + " <eos>",
                               "rejected": " " + words(completion - 1) + " <eos>"} for _ in range(n)])


class _Phases:
    """The counter of the measured step, and the phase marks (module doc)."""

    def __init__(self) -> None:
        self.counter = None
        self.steps: list[dict[str, int]] = []
        self.trainer = None

    def begin(self) -> None:
        t = self.trainer
        tensors = [*t.model.parameters(), *t.model.buffers(), *optimizer_state_tensors(t.optimizer)]
        if getattr(t, "ref_model", None) is not None:
            tensors += [*t.ref_model.parameters(), *t.ref_model.buffers()]
        self.counter = LiveBytes()
        self.counter.track(tensors)
        self.counter.set_phase("setup")
        self.counter.reset_peak()
        self.counter.__enter__()

    def mark(self, phase: str) -> None:
        if self.counter is not None:
            self.counter.set_phase(phase)

    def end(self) -> None:
        c, self.counter = self.counter, None
        if c is not None:
            c.__exit__(None, None, None)
            peaks = dict(c.phase_peaks)
            peaks.pop("setup", None)
            self.steps.append(peaks)


def _callback(phases: _Phases):
    transformers = _deps.transformers()

    class PhaseMarks(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            phases.begin()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            phases.mark("optimizer_step")

        def on_optimizer_step(self, args, state, control, **kwargs):
            phases.mark("zero_grad")

        def on_step_end(self, args, state, control, **kwargs):
            phases.end()

    return PhaseMarks()


def _instrument(trainer, phases: _Phases) -> None:
    """Forward hooks (grad enabled: the policy's forward; disabled: the reference forward), the batch tracked
    when ``training_step`` receives it, ``backward`` marked in ``accelerator.backward``."""
    torch = _deps.torch()

    def pre(module, args, kwargs):
        phases.mark("forward" if torch.is_grad_enabled() else "reference_forward")

    def post(module, args, kwargs, out):
        phases.mark("forward")

    models = [trainer.model] + ([trainer.ref_model] if getattr(trainer, "ref_model", None) is not None else [])
    for m in models:
        m.register_forward_pre_hook(pre, with_kwargs=True)
        m.register_forward_hook(post, with_kwargs=True)
    step, backward = trainer.training_step, trainer.accelerator.backward

    def training_step(model, inputs, *args, **kwargs):
        if phases.counter is not None:
            phases.counter.track([v for v in inputs.values() if isinstance(v, torch.Tensor)])
            phases.mark("forward")
        return step(model, inputs, *args, **kwargs)

    def marked_backward(loss, **kwargs):
        phases.mark("backward")
        return backward(loss, **kwargs)

    trainer.training_step = training_step
    trainer.accelerator.backward = marked_backward


def _model(config: dict[str, Any], auto_class: str, **overrides: Any):
    """``(cfg, model)``: a model of ``config`` (a config.json as a dict) built by ``transformers.<auto_class>``
    with random weights (seed 0) in the config's ``torch_dtype``; ``overrides`` set on the config first."""
    torch = _deps.torch()
    transformers = _deps.transformers()
    cfg = transformers.AutoConfig.for_model(**config)
    for name, value in overrides.items():
        setattr(cfg, name, value)
    torch.manual_seed(0)
    return cfg, getattr(transformers, auto_class).from_config(cfg, dtype=_dtype(config))


def _dtype(config: dict[str, Any]):
    return getattr(_deps.torch(), str(config.get("torch_dtype", "float32")).removeprefix("torch."))


def _lora(method: str, lora_r: int, lora_target_modules: tuple[str, ...], task_type: str):
    """peft's ``LoraConfig`` for ``method="lora"`` (alpha ``2r``, no dropout), else None."""
    if method != "lora":
        return None
    import peft

    return peft.LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules=list(lora_target_modules),
                           lora_dropout=0.0, task_type=task_type)


def _args(batch: int, optim: str, bf16: bool, gradient_checkpointing: bool) -> dict[str, Any]:
    """The training arguments every referee run shares: two optimizer steps on the CPU, no clipping, saving,
    logging or workers."""
    return dict(output_dir="/tmp/fitplan-trl-referee", per_device_train_batch_size=batch, max_steps=2,
                use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True, max_grad_norm=0.0, optim=optim,
                logging_steps=100, bf16=bf16, gradient_checkpointing=gradient_checkpointing, dataloader_num_workers=0)


def _second_step_peaks(trainer_class, **kwargs: Any) -> dict[str, int]:
    """Build ``trainer_class(**kwargs)`` with the phase marks, train, and return the second step's phase peaks."""
    phases = _Phases()
    run = trainer_class(**kwargs, callbacks=[_callback(phases)])
    phases.trainer = run
    _instrument(run, phases)
    run.train()
    return phases.steps[-1]


def measure_dpo(config: dict[str, Any], *, trainer: str = "dpo", method: str = "full", batch: int = 1, prompt: int = 4,
                completion: int = 12, bf16: bool = False, gradient_checkpointing: bool = False,
                lora_r: int = 8, lora_target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
                precompute_ref_log_probs: bool = False, beta: float = 0.1,
                optim: str = "adamw_torch_fused") -> dict[str, int]:
    """Phase peaks (live bytes) of the second optimizer step of TRL's ``DPOTrainer`` (``trainer="kto"``:
    ``KTOTrainer``, whose no-grad KL forwards count as ``reference_forward``) on the CPU (module doc).
    ``config``: a model's config.json as a dict (weights loaded in its ``torch_dtype``); the reference model
    for full fine-tuning is a second model of the same config and dtype (what ``create_model_from_path`` loads)."""
    transformers = _deps.transformers()
    import trl

    cfg, model = _model(config, "AutoModelForCausalLM")
    ref = None
    if method == "full" and not precompute_ref_log_probs:
        ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=_dtype(config))
    config_class, trainer_class = (trl.KTOConfig, trl.KTOTrainer) if trainer == "kto" else (trl.DPOConfig, trl.DPOTrainer)
    args = config_class(**_args(batch, optim, bf16, gradient_checkpointing),
                        precompute_ref_log_probs=precompute_ref_log_probs, beta=beta)
    return _second_step_peaks(trainer_class, model=model, ref_model=ref, args=args,
                              processing_class=_tokenizer(cfg.vocab_size),
                              train_dataset=_pairs(2 * batch, prompt, completion, cfg.vocab_size, unpaired=trainer == "kto"),
                              peft_config=_lora(method, lora_r, lora_target_modules, "CAUSAL_LM"))


def measure_reward(config: dict[str, Any], *, method: str = "full", batch: int = 1, prompt: int = 4,
                   completion: int = 12, bf16: bool = False, gradient_checkpointing: bool = False, lora_r: int = 8,
                   lora_target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
                   optim: str = "adamw_torch_fused") -> dict[str, int]:
    """Phase peaks (live bytes) of the second optimizer step of TRL's ``RewardTrainer`` on the CPU (module doc):
    ``AutoModelForSequenceClassification`` with ``num_labels=1`` (what ``RewardTrainer`` loads), in the config's
    ``torch_dtype``; LoRA with peft's ``SEQ_CLS`` task (which trains ``score`` whole). No reference forward:
    the phases are ``forward``, ``backward`` and ``optimizer_step``."""
    import trl

    cfg, model = _model(config, "AutoModelForSequenceClassification", num_labels=1)
    args = trl.RewardConfig(**_args(batch, optim, bf16, gradient_checkpointing))
    return _second_step_peaks(trl.RewardTrainer, model=model, args=args, processing_class=_tokenizer(cfg.vocab_size),
                              train_dataset=_pairs(2 * batch, prompt, completion, cfg.vocab_size),
                              peft_config=_lora(method, lora_r, lora_target_modules, "SEQ_CLS"))


def measure_orpo(config: dict[str, Any], *, trainer: str = "orpo", method: str = "full", batch: int = 1, prompt: int = 4,
                 completion: int = 12, bf16: bool = False, gradient_checkpointing: bool = False, lora_r: int = 8,
                 lora_target_modules: tuple[str, ...] = ("q_proj", "v_proj"), optim: str = "adamw_torch_fused",
                 **trl_fields: Any) -> dict[str, int]:
    """Phase peaks (live bytes) of the second optimizer step of TRL's ``trl.experimental.orpo.ORPOTrainer``
    (``trainer="cpo"``: ``trl.experimental.cpo.CPOTrainer``, ``trl_fields`` such as ``loss_type`` and
    ``cpo_alpha`` passed to its config) on the CPU (module doc). No reference model: the phases are ``forward``,
    ``backward`` and ``optimizer_step``. ``config``: a model's config.json as a dict (weights in its
    ``torch_dtype``)."""
    if trainer == "cpo":
        from trl.experimental.cpo import CPOConfig as config_class, CPOTrainer as trainer_class
    else:
        from trl.experimental.orpo import ORPOConfig as config_class, ORPOTrainer as trainer_class

    cfg, model = _model(config, "AutoModelForCausalLM")
    args = config_class(**_args(batch, optim, bf16, gradient_checkpointing), max_length=prompt + completion, **trl_fields)
    return _second_step_peaks(trainer_class, model=model, args=args, processing_class=_tokenizer(cfg.vocab_size),
                              train_dataset=_pairs(2 * batch, prompt, completion, cfg.vocab_size),
                              peft_config=_lora(method, lora_r, lora_target_modules, "CAUSAL_LM"))
