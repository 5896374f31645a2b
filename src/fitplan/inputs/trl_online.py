"""GRPO and RLOO's generation settings as TRL 1.16 resolves them, and the config checks TRL makes.

TRL's ``GRPOConfig.__post_init__`` / ``RLOOConfig.__post_init__`` (trl/trainer/grpo_config.py, rloo_config.py)
derive the generation round from the training batch: when neither ``generation_batch_size`` nor
``steps_per_generation`` is given, ``steps_per_generation = gradient_accumulation_steps`` and
``generation_batch_size = per_device_train_batch_size × processes × steps_per_generation``; given one, the other
follows; given both, TRL refuses. The generation batch must hold whole prompt groups (``num_generations``
divides it) and ``num_generations >= 2``. Their defaults: ``num_generations`` 8 (GRPO) / 2 (RLOO),
``max_completion_length`` 512, ``beta`` 0.0 (GRPO) / 0.05 (RLOO). ``prompt_length`` is fitplan's (TRL 1.16
does not truncate prompts): :data:`PROMPT_LENGTH` when not given, stated in the report's assumed defaults.

With ``vllm_mode = "server"`` ``trl vllm-serve`` runs on GPUs of its own: fitplan gives it
``vllm_tensor_parallel_size`` GPUs of the node and trains on the rest (:func:`training_gpus`).
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from fitplan.errors import FitplanError

ONLINE = ("grpo", "rloo")
"""The trainers that generate their completions (GRPOTrainer, RLOOTrainer)."""
TRL_DEFAULTS = {"grpo": {"num_generations": 8, "beta": 0.0}, "rloo": {"num_generations": 2, "beta": 0.05}}
"""``num_generations`` and ``beta`` defaults (grpo_config.py, rloo_config.py ``field(default=...)``)."""
MAX_COMPLETION_LENGTH = 512
"""``max_completion_length``'s default in both configs."""
PROMPT_LENGTH = 256
"""fitplan's assumed prompt length (tokens) when ``prompt_length`` is not given: a math or instruction prompt
with a short system prompt (GSM8K-style prompts in Qwen's chat template are 100-250 tokens)."""


@frozen
class OnlineSettings:
    """One GRPO/RLOO run's generation round, as TRL resolves it."""

    trainer: str
    num_generations: int
    max_completion_length: int
    prompt_length: int
    steps_per_generation: int
    generation_batch_size: int
    """Sequences generated per round, all training processes."""
    local_generation_batch: int
    """Sequences one training process generates and scores per round (``generation_batch_size / processes``)."""
    beta: float
    old_logps: bool
    """Whether the scoring pass computes the old policy's log-probabilities (module doc of builtin/trl/grpo.py)."""
    reference: str
    """``none`` (beta 0), ``adapter`` (LoRA: peft's adapter disabled) or ``copy`` (a second model)."""
    prompt_length_given: bool
    processes: int

    @property
    def sequence_length(self) -> int:
        """Prompt + completion: the training and scoring forward's sequence length (worst case, every
        completion at ``max_completion_length``)."""
        return self.prompt_length + self.max_completion_length


def _err(msg: str, field: str, value: Any, suggestion: str | None = None) -> FitplanError:
    return FitplanError(f"Trl.{field}: {msg} (TRL 1.16's check)", field=field, value=value, suggestion=suggestion)


def training_gpus(num_gpus: int, trainer: str, use_vllm: bool, vllm_mode: str, vllm_tensor_parallel_size: int) -> int:
    """GPUs per node that train: all of them, less the vLLM server's ``vllm_tensor_parallel_size`` in server mode."""
    if trainer in ONLINE and use_vllm and vllm_mode == "server":
        left = num_gpus - vllm_tensor_parallel_size
        if left < 1:
            raise _err(f"vllm_mode 'server' takes {vllm_tensor_parallel_size} GPU(s) for vLLM, leaving none of the "
                       f"{num_gpus} to train", "vllm_tensor_parallel_size", vllm_tensor_parallel_size,
                       "give --num-gpus at least vllm_tensor_parallel_size + 1, or use --vllm-mode colocate")
        return left
    return num_gpus


def _rounds(b: int, processes: int, gas: int, gen_batch: int | None, steps: int | None) -> tuple[int, int]:
    """``(steps_per_generation, generation_batch_size)`` as ``__post_init__`` derives them."""
    global_batch = b * processes
    if gen_batch is None and steps is None:
        return gas, global_batch * gas
    if gen_batch is not None and steps is None:
        if gen_batch % global_batch:
            raise _err(f"generation_batch_size ({gen_batch}) must be divisible by the global batch size "
                       f"({global_batch}) = per_device_train_batch_size {b} × {processes} process(es)",
                       "generation_batch_size", gen_batch)
        return gen_batch // global_batch, gen_batch
    if gen_batch is None:
        return steps, global_batch * steps
    raise _err("'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time",
               "generation_batch_size", gen_batch, "give one of them")


def resolve(*, trainer: str, num_generations: int | None, max_completion_length: int | None,
            prompt_length: int | None, generation_batch_size: int | None, steps_per_generation: int | None,
            beta: float | None, use_vllm: bool, method: str, per_device_train_batch_size: int,
            gradient_accumulation_steps: int, processes: int) -> OnlineSettings | None:
    """The round of a GRPO/RLOO run (None for the other trainers); raises TRL's errors as :class:`FitplanError`."""
    if trainer not in ONLINE:
        return None
    d = TRL_DEFAULTS[trainer]
    g = d["num_generations"] if num_generations is None else num_generations
    steps, gen_batch = _rounds(per_device_train_batch_size, processes, gradient_accumulation_steps,
                               generation_batch_size, steps_per_generation)
    if gen_batch % g:
        raise _err(f"generation_batch_size ({gen_batch}) must be divisible by num_generations ({g})",
                   "num_generations", g, "pick num_generations dividing per_device_train_batch_size × processes × "
                   "steps_per_generation")
    if g < 2:
        raise _err(f"{trainer.upper()} requires at least 2 generations per prompt to calculate the advantages; "
                   f"got {g}", "num_generations", g)
    b = d["beta"] if beta is None else float(beta)
    # grpo_trainer.py _generate_and_score_completions: old log-probs when generation and optimizer steps are
    # misaligned, or with vLLM (vllm_importance_sampling_correction, default True); rloo_trainer.py: always
    old = trainer == "rloo" or gradient_accumulation_steps % steps != 0 or use_vllm
    reference = "none" if b == 0.0 else "adapter" if method != "full" else "copy"
    return OnlineSettings(trainer, g, max_completion_length or MAX_COMPLETION_LENGTH,
                          prompt_length or PROMPT_LENGTH, steps, gen_batch, gen_batch // processes, b, old,
                          reference, prompt_length is not None, processes)
