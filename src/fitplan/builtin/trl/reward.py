"""TRL 1.16's reward model (``RewardTrainer``, trl/trainer/reward_trainer.py): the step and its score head.

``RewardTrainer`` trains ``AutoModelForSequenceClassification`` with ``num_labels=1``: transformers'
``GenericForSequenceClassification`` (transformers/modeling_layers.py), the bare decoder and ``score =
nn.Linear(hidden, 1, bias=False)`` instead of the LM head (the parameters: arch/archfile.py ``SCORE_HEAD``;
under LoRA peft's ``SEQ_CLS`` task trains ``score`` whole: ``estimation.with_reward_head``). Per micro-batch of
``b`` pairs of ``s`` tokens (``compute_loss``):

1. the batch (``DataCollatorForPreference`` in reward_trainer.py): the ``b`` chosen then the ``b`` rejected
   sequences, right-padded, ``input_ids`` and ``attention_mask``, int64 ``2b × s`` each;
2. one forward over ``2b`` sequences: ``score`` on every position, ``(2b, s, 1)`` in the compute dtype (no
   ``(2b, s, V)`` logits), pooled at the last non-pad token; ``torch.chunk`` splits chosen from rejected, the
   loss is ``-logsigmoid(chosen - rejected).mean()`` (+ ``center_rewards_coefficient`` · the mean square):
   scalars and ``b``-sized tensors;
3. the backward and the optimizer step, as SFT's. No reference model.

The phases are SFT's over ``2b`` sequences. :mod:`.score_head` emits ``score`` as a Linear call site (the GEMM
saves the final norm's output: with its gradient, the head's bytes that scale with the hidden size) and the
pooling and loss as one op over ``2b`` elements; the pooling's ``2b·s`` int32 mask and indices are not counted
(``8·2b·s`` bytes at most, beside the ``2b·s × h`` hidden states).
"""

from __future__ import annotations

from fitplan.builtin.activations import trace_for
from fitplan.engine.declarations import reducer
from fitplan.pluginmgr.hookspecs import hookimpl

HEAD = "reward"
"""The step trace's loss head for the reward model (trace/loss_heads.py, :mod:`.score_head`)."""


def _is_reward(trainer) -> bool:
    return trainer == "reward"


@reducer("step_trace_without_checkpointing", when=lambda trainer: _is_reward(trainer))
def reward_trace(value, arch, per_device_train_batch_size, realized_seq_length, trace_setup, attn_implementation,
                 method, lora_r, lora_target_modules, lora_dropout, device, framework, lora_modules_to_save):
    """The reward model's step over ``2·b`` sequences (chosen then rejected, one batch) with the score head."""
    if value is None:
        return None
    precision, adapter, quant, linear_input = trace_setup
    return trace_for(arch, 2 * per_device_train_batch_size, realized_seq_length, precision, attn_implementation, False,
                     method, lora_r, lora_target_modules, lora_dropout, device, framework, adapter, quant, linear_input,
                     HEAD, lora_modules_to_save)


@reducer("step_trace", when=lambda trainer: _is_reward(trainer))
def reward_trace_checkpointed(value, gradient_checkpointing, arch, per_device_train_batch_size, realized_seq_length,
                              trace_setup, attn_implementation, method, lora_r, lora_target_modules, lora_dropout,
                              device, framework, lora_modules_to_save):
    """The reward model's step as configured (:func:`reward_trace`, with checkpointing when on)."""
    if value is None:
        return None
    precision, adapter, quant, linear_input = trace_setup
    return trace_for(arch, 2 * per_device_train_batch_size, realized_seq_length, precision, attn_implementation,
                     bool(gradient_checkpointing), method, lora_r, lora_target_modules, lora_dropout, device, framework,
                     adapter, quant, linear_input, HEAD, lora_modules_to_save)


@reducer("batch_bytes", when=lambda trainer: _is_reward(trainer))
def reward_batch(value, arch, per_device_train_batch_size, realized_seq_length, device, framework):
    """``DataCollatorForPreference`` (reward_trainer.py ``torch_call``): ``input_ids`` and ``attention_mask``,
    int64 ``2b × s`` each (no labels)."""
    if arch.is_bare:
        return value
    n = 8 * 2 * per_device_train_batch_size * realized_seq_length
    if device == "cuda" and n:
        block = framework.allocator_block_bytes
        n = -(-n // block) * block
    return 2 * n


@reducer("flops_per_token", when=lambda trainer: _is_reward(trainer))
def reward_flops_per_token(value):
    """FLOPs per token of an example (a pair): the training FLOPs of both sequences (the score head's
    ``2·h`` per token is in the parameter count)."""
    return 2 * value


@hookimpl
def fitplan_register_reducers(register):
    for r in (reward_trace, reward_trace_checkpointed, reward_batch, reward_flops_per_token):
        register(r)
