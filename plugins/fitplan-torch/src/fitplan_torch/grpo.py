"""The GRPO referee: TRL 1.16's ``GRPOTrainer`` on the CPU (``use_vllm=False``), each phase's peak of live bytes.

:func:`measure_grpo` builds a random model from a config dict (KV cache on: ``use_cache=True``, which the SFT
referee turns off), a word-level tokenizer over ``t0 … t{V-2}`` (no special tokens added, so every prompt has
exactly ``prompt_length`` tokens) and a dataset of such prompts, and trains with a constant reward. A
:class:`~fitplan_torch.measure.LiveBytes` counter runs over ``trainer.train()`` and names the phase of each
allocation by wrapping TRL's own methods:

* ``generation``: ``GRPOTrainer._generate_single_turn`` (``unwrapped_model.generate``);
* ``scoring``: ``_get_per_token_logps_and_entropies`` under ``no_grad`` (old and reference log-probabilities);
* ``forward``: the same under grad (``_compute_loss``'s policy forward) and the GRPO loss after it;
* ``backward``: ``accelerator.backward``; ``optimizer_step``: from ``on_pre_optimizer_step`` to ``on_step_end``.

The measured step is the last of ``steps`` (steady state: the optimizer states exist); the peaks before it are
dropped (``on_step_begin``).
"""

from __future__ import annotations

import functools
from typing import Any

from . import _deps

WORD = "t{}"


def _tokenizer(vocab_size: int):
    """A fast word-level tokenizer: ids ``0 … V-2`` are ``t0 …``, ``V-1`` is ``<eos>`` (also the pad)."""
    transformers = _deps.transformers()
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {WORD.format(i): i for i in range(vocab_size - 1)}
    vocab["<eos>"] = vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    fast.padding_side = "left"
    return fast


def _model(cfg: dict[str, Any], dtype, seed: int):
    torch = _deps.torch()
    transformers = _deps.transformers()
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if not k.startswith("_")})
    config.use_cache = True
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.generation_config.eos_token_id = cfg["vocab_size"] - 1
    model.generation_config.pad_token_id = cfg["vocab_size"] - 1
    return model


def _wrap(obj, name: str, before):
    """Replace ``obj.name`` by a wrapper that calls ``before()`` first and restores the phase it returns after."""
    original = getattr(obj, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        restore = before()
        try:
            return original(*args, **kwargs)
        finally:
            if restore:
                restore()

    setattr(obj, name, wrapper)


def _phases(trainer, counter, steps: int):
    """Name the counter's phases from TRL's methods and the Trainer's callbacks (module doc)."""
    torch = _deps.torch()
    transformers = _deps.transformers()

    def enter(phase):
        def before():
            prev = counter.phase
            counter.set_phase(phase)
            return lambda: counter.set_phase(prev if phase != "backward" else "after_backward")
        return before

    def logps():
        prev = counter.phase
        counter.set_phase("scoring" if not torch.is_grad_enabled() else "forward")
        return (lambda: counter.set_phase(prev)) if not torch.is_grad_enabled() else None

    _wrap(trainer, "_generate_single_turn", enter("generation"))
    _wrap(trainer, "_get_per_token_logps_and_entropies", logps)
    _wrap(trainer.accelerator, "backward", enter("backward"))

    class Steps(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            counter.set_phase("setup")
            if state.global_step == steps - 1:
                counter.reset_peak()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            counter.set_phase("optimizer_step")

        def on_step_end(self, args, state, control, **kw):
            counter.set_phase("setup")

    trainer.add_callback(Steps())


def measure_grpo(cfg: dict[str, Any], *, prompt_length: int, max_completion_length: int, num_generations: int,
                 per_device_train_batch_size: int, gradient_accumulation_steps: int = 1, beta: float = 0.0,
                 lora: dict[str, Any] | None = None, gradient_checkpointing: bool = False, steps: int = 2,
                 seed: int = 0, trainer: str = "grpo", bf16: bool = False) -> dict[str, Any]:
    """Train ``steps`` GRPO steps on the CPU in fp32; the last step's peak per phase (``{phase: bytes}``) and
    what the trainer resolved (``generation_batch_size``, ``steps_per_generation``).

    The optimizer is ``torch.optim.AdamW(foreach=True)``, the implementation CUDA picks for ``adamw_torch`` (the
    CPU would pick the per-tensor loop), as the SFT referee does (build.py ``build_optimizer``).
    ``gradient_checkpointing`` is passed explicitly: GRPOConfig's default is True, TrainingArguments' False.
    ``trainer = "rloo"`` runs ``RLOOTrainer`` (the same method names, trl/trainer/rloo_trainer.py); ``bf16``:
    TrainingArguments' bf16 autocast over the fp32 weights (fitplan's ``bf16-mixed``)."""
    torch = _deps.torch()
    from datasets import Dataset
    import trl

    config_cls, trainer_cls = {"grpo": (trl.GRPOConfig, trl.GRPOTrainer), "rloo": (trl.RLOOConfig, trl.RLOOTrainer)}[trainer]

    from .measure import LiveBytes

    tok = _tokenizer(cfg["vocab_size"])
    model = _model(cfg, torch.float32, seed)
    if beta != 0.0 and not lora:  # TRL loads the reference from the policy's path (create_model_from_path)
        import tempfile

        path = tempfile.mkdtemp(prefix="fitplan-grpo-")
        model.save_pretrained(path)
        model = path
    prompts = [" ".join(WORD.format((i * 7 + j) % (cfg["vocab_size"] - 1)) for j in range(prompt_length))
               for i in range(64)]
    peft_config = None
    if lora:
        import peft

        peft_config = peft.LoraConfig(r=lora.get("lora_r", 8), lora_alpha=lora.get("lora_alpha", 16),
                                      target_modules=list(lora["lora_target_modules"]), lora_dropout=0.0,
                                      task_type="CAUSAL_LM")
    args = config_cls(output_dir="/tmp/fitplan-grpo-referee", use_cpu=True, bf16=bf16, fp16=False,
                      per_device_train_batch_size=per_device_train_batch_size,
                      gradient_accumulation_steps=gradient_accumulation_steps, num_generations=num_generations,
                      max_completion_length=max_completion_length, beta=beta, max_steps=steps, optim="adamw_torch",
                      logging_steps=1000, save_strategy="no", report_to=[], seed=seed, dataloader_num_workers=0,
                      disable_tqdm=True, log_completions=False, gradient_checkpointing=gradient_checkpointing, model_init_kwargs={"dtype": torch.float32})
    trainer = trainer_cls(model=model, reward_funcs=lambda completions, **kw: [1.0] * len(completions),
                          args=args, train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tok,
                          peft_config=peft_config)
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate, foreach=True)
    counter = LiveBytes()
    _phases(trainer, counter, steps)
    counter.track([*trainer.model.parameters(), *trainer.model.buffers()])
    if trainer.ref_model is not None:
        counter.track([*trainer.ref_model.parameters(), *trainer.ref_model.buffers()])
    with counter:
        trainer.train()
    peaks = {k: v for k, v in counter.phase_peaks.items() if k not in ("setup", "after_backward")}
    return {"phases": peaks, "generation_batch_size": args.generation_batch_size,
            "steps_per_generation": args.steps_per_generation}
