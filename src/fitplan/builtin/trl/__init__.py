"""TRL 1.16's trainers (docs/trl.md): what each one adds to the HF Trainer's step.

* :mod:`.fused_head`: TRL's fused LM head (``add_fused_lm_head``, trl/trainer/utils.py, and its
  ``ChunkedLogProbFunction``, trl/kernels/chunked_logprob.py) in the step trace, replacing the model's own
  logits and loss (no torch);
* :mod:`.preference`: the plugin for the preference trainers (DPO): the chosen and rejected sequences in
  one batch, the reference model and its no-grad forward as a phase of its own;
* :mod:`.reward` (with :mod:`.score_head`): the reward model (``RewardTrainer``): the sequence classifier's
  ``score`` head in place of the LM head, chosen and rejected in one batch, no reference model;
* :mod:`.grpo` (with :mod:`.generation`, :mod:`.vllm`, :mod:`.report`): the online trainers (GRPO, RLOO): a
  generation round's phases (generation with transformers or vLLM, scoring, training), vLLM's reserve.
"""
