"""From a scenario to an :class:`Estimate`: resolve the inputs, evaluate the compiled graph, keep provenance.

``Estimate`` keeps every value and where it came from: the quantity's plugin and doc, its
dependencies' values, which reducers applied, and the ruleset file behind each resolved input.
"""

from __future__ import annotations

from typing import Any

import attrs

from fitplan.errors import FitplanError
from fitplan.arch import architecture
from fitplan.inputs import scenario as sc
from fitplan.arch.typical import typical_spec
from fitplan.pluginmgr.registry import Registry
from fitplan.rulesets.loader import Rulesets
from fitplan.units import parse_count


def resolve_arch(s: sc.Scenario, rules: Rulesets) -> architecture.ModelSpec:
    m = s.model
    if m.model and m.params:
        raise FitplanError("give either --model or --params, not both", field="model", value=f"{m.model} / {m.params}")
    if m.params:
        count = parse_count(m.params)
        if m.assumptions == "seed":  # the seed chapter's view: a count, no shapes, no activations
            return architecture.bare_spec(count)
        return typical_spec(count, rules)
    if not m.model:
        raise FitplanError("no model given", field="model",
                           suggestion="pass --model NAME (see `fitplan models list`), --model path/to/config.json, or --params 7B")
    kind, where = model_source(m.model, rules)
    if kind == "catalog":
        return rules.preset_spec(where)
    spec = architecture.load_config_json(where)
    if kind == "hub":
        spec = attrs.evolve(spec, name=m.model, source=f"Hugging Face Hub {m.model} ({where})")
    return spec


def model_source(text: str, rules: Rulesets) -> tuple[str, Any]:
    """Where ``--model TEXT`` comes from, in this order: a local ``config.json`` (or a folder holding one);
    a catalog name or alias (``fitplan models list``); a Hub id ``ORG/NAME[@revision]``, whose
    ``config.json`` is read from the local Hugging Face cache or downloaded (:mod:`fitplan.inputs.hub`).
    Returns ``("file", path)``, ``("catalog", ModelEntry)`` or ``("hub", path)``.

    :raises FitplanError: an unknown name (with the catalog's suggestions), or a Hub id that is not cached
        while offline / cannot be downloaded.
    """
    from pathlib import Path

    from fitplan.inputs import hub

    p = Path(text)
    if p.is_dir():
        return "file", str(p / "config.json")
    if text.endswith(".json"):
        return "file", text
    try:
        return "catalog", rules.model_entry(text)
    except FitplanError:
        if not hub.is_repo_id(text):
            raise
    repo, revision = hub.split_revision(text)
    return "hub", str(hub.fetch_file(repo, "config.json", revision))


def scenario_warnings(s: sc.Scenario, arch: architecture.ModelSpec, gpu: Any = None) -> list[str]:
    out = []
    if arch.family == "approximate":
        out.append(f"--params gives no architecture: activations, logits and the step peak are for a typical shape "
                   f"({arch.name.split('(approximate: ', 1)[-1].rstrip(')')}, {arch.num_hidden_layers} layers, "
                   f"vocabulary {arch.vocab_size}) and are approximate; pass --model CONFIG.json for the real shape")
    out += list(arch.assumed)
    idle, where = arch.no_grad_params
    if idle:
        out.append(f"{idle} parameters receive no gradient in this step: {', '.join(where)} (the loss does not "
                   "depend on them): no gradient and no optimizer state counted for them, nor for LoRA adapters on "
                   "them (DeepSpeed ZeRO keeps zeros for them in its partitions)")
    if arch.unverified:
        out.append(f"{arch.model_type}'s learned file {arch.unverified} was written with `fitplan learn-architecture "
                   "--no-verify`: no fresh torch run checked it, so its weights, gradients, activations and the peak "
                   "are approximate, not exact (re-learn it without --no-verify to check it)")
    attn = s.training.attn_implementation
    if arch.attn_implementations and attn not in arch.attn_implementations:
        out.append(f"{arch.name} has no {attn} attention in its transformers code: it runs "
                   f"{arch.attn_implementations[0]} attention, as transformers chooses when none is given "
                   f"(and refuses when {attn} is asked for explicitly)")
    world = s.hardware.num_gpus * s.hardware.num_nodes
    p = s.parallel
    if (p.zero_stage or p.fsdp) and world // p.tensor_parallel <= 1:
        out.append(f"--zero {p.zero_stage or p.fsdp} changes nothing on a single GPU: sharding needs --num-gpus > 1")
    if p.zero_stage and p.fsdp:
        out.append("both --zero and --fsdp given: the larger sharding stage is used")
    if p.offload_params and max(p.zero_stage, 3 if p.fsdp in ("full_shard", "hybrid_shard") else 0) < 3:
        out.append("--offload-params only applies with ZeRO stage 3 / FSDP full_shard: ignored")
    out += ds_offload_optimizer_warnings(s)
    lora = s.lora  # peft's default targets (with_default_targets) are no option the user gave
    if lora.lora_target_modules and lora.lora_target_modules == peft_default_targets(arch):
        lora = attrs.evolve(lora, lora_target_modules=None)
    if s.model.method == "full" and lora != sc.Lora():
        out.append("LoRA options given with --method full: they are ignored (use --method lora or qlora)")
    if s.training.max_seq_length > arch.max_position_embeddings and not arch.is_bare and arch.family != "approximate":
        what = ("its learned position table has no row beyond it: the embedding lookup raises IndexError (use "
                f"--max-seq-length {arch.max_position_embeddings} or less)" if arch.learned_positions else
                "rotary positions run past it without an error (transformers does not check it), but the model was "
                "not trained there")
        out.append(f"--max-seq-length {s.training.max_seq_length} exceeds {arch.name}'s max_position_embeddings "
                   f"({arch.max_position_embeddings}): {what}")
    return out + load_dtype_warnings(s, arch) + precision_warnings(s, gpu)


def load_dtype_warnings(s: sc.Scenario, arch: architecture.ModelSpec) -> list[str]:
    """A config that states no dtype, when the load dtype decides the precision: transformers 5.24 then loads the
    dtype of the checkpoint's weights, which fitplan cannot see (it assumes float32)."""
    from fitplan.inputs.precision import hf_precision

    if s.training.dtype != "auto" or arch.checkpoint_dtype is not None or arch.family != "learned":
        return []
    try:
        decided = hf_precision("bf16" if s.training.bf16 else "fp16" if s.training.fp16 else None, "fp32")
    except FitplanError:
        return []
    if s.training.precision not in (None, decided):
        return []
    return [f"{arch.name}: its config states no dtype, so from_pretrained(dtype=\"auto\") loads the weights' own dtype, "
            "which a config does not say: fitplan assumes float32; pass --dtype bfloat16 (or float16) if the checkpoint "
            "is 16-bit"]


def ds_offload_optimizer_warnings(s: sc.Scenario) -> list[str]:
    """Under DeepSpeed optimizer offload the optimizer is a DeepSpeed CPU optimizer, whatever ``optim`` says
    (``inputs.stacks.ds_cpu_optimizer``): named when it differs from the user's."""
    from fitplan.inputs import stacks

    p, hw = s.parallel, s.hardware
    dp = max(1, hw.num_gpus * hw.num_nodes // p.tensor_parallel)
    stack = stacks.resolve(p.stack, p.zero_stage, p.fsdp, p.offload_optimizer, p.offload_params, s.training.precision, dp)
    optim = s.training.optim
    if stack != "deepspeed" or not p.offload_optimizer or optim in stacks.DS_CPU_ADAM_NAMES:
        return []
    name, states = stacks.ds_cpu_optimizer(optim)
    return [f"optim {optim!r} under DeepSpeed optimizer offload: accelerate replaces it by {name} "
            f"(map_pytorch_optim_to_deepspeed; zero_force_ds_cpu_optimizer defaults to true), so the host RAM holds "
            f"{name}'s {states} fp32 state{'s' if states > 1 else ''} per trainable element, not {optim}'s"]


def precision_warnings(s: sc.Scenario, gpu: Any = None) -> list[str]:
    """What the HF Trainer would do with the precision that the user may not expect (docs/memory-model.md,
    "Precision as the HF Trainer decides it")."""
    from fitplan.inputs.precision import PRESETS

    p = PRESETS[s.training.precision]
    out = []
    if p.compute_dtype == "bf16" and gpu is not None and "bf16" not in gpu.peak_tflops:
        out.append(f"bf16 on {gpu.name}: it has no bf16 tensor cores (compute capability < 8.0). The HF Trainer's check "
                   "(torch.cuda.is_bf16_supported(), which accepts emulation) lets it run, emulated: fitplan prices its "
                   "matmuls at the fp32 peak; fp16 (--fp16) uses the tensor cores")
    if p.autocast and p.compute_dtype == "fp16" and s.hardware.device == "cpu":
        out.append("fp16 autocast on the CPU: accelerate skips fp16 mixed precision on the CPU (no autocast, no "
                   "GradScaler), so the HF Trainer would run this step in fp32")
    if s.model.method == "qlora":
        cd = s.lora.bnb_4bit_compute_dtype
        if cd not in (None, p.compute_dtype) and p.compute_dtype != "fp16":
            out.append(f"bnb_4bit_compute_dtype={cd} is not what runs: bitsandbytes' Linear4bit computes in its input's "
                       f"dtype when that is fp32 or bf16 (nn/modules.py set_compute_type): {p.compute_dtype} under "
                       f"--precision {p.name}")
        elif cd is None and p.compute_dtype == "fp32":
            out.append("QLoRA without bf16/fp16: the HF Trainer computes the 4-bit layers in fp32 (bnb_4bit_compute_dtype "
                       "defaults to float32 and Linear4bit follows the fp32 activations); TRL's SFTConfig defaults to "
                       "bf16=True: pass --bf16 for that")
    return out


def check_optimizer(s: sc.Scenario, spec: Any, world: int) -> None:
    """The optimizer's run-dependent refusal (``OptimizerSpec.check``): a CUDA-only optimizer on the CPU, a
    layer-wise one with gradient accumulation, ..."""
    if spec is None or spec.check is None:
        return
    from fitplan.inputs.optimizer import OptimizerRun
    from fitplan.inputs.precision import PRESETS

    p = PRESETS[s.training.precision]
    run = OptimizerRun(device=s.hardware.device, world_size=world,
                       gradient_accumulation_steps=s.training.gradient_accumulation_steps,
                       grad_dtype=p.weight_dtype if s.model.method == "full" else "fp32", compute_dtype=p.compute_dtype,
                       method=s.model.method, target_modules=tuple(s.training.optim_target_modules))
    reason = spec.check(run)
    if reason:
        raise FitplanError(f"optim {s.training.optim!r} is not estimated for this run: {reason}", field="optim",
                           value=s.training.optim)


MODELLED_TRAINERS = ("sft", "dpo", "kto", "orpo", "cpo", "reward", "grpo", "rloo")
"""The TRL trainers whose step the memory and time model computes (docs/trl.md); the others are refused."""


def check_scenario(s: sc.Scenario, arch: architecture.ModelSpec, optimizer: Any = None) -> None:
    """Errors that need the architecture (or the optimizer) to detect."""
    if s.model.method != "full":
        if arch.is_bare or arch.family == "approximate":
            raise FitplanError("LoRA/QLoRA needs the model's architecture", field="method", value=s.model.method,
                               suggestion="use --model NAME or a config.json instead of --params")
        if s.lora.lora_r > arch.hidden_size:
            raise FitplanError(f"Lora.lora_r ({s.lora.lora_r}) exceeds the hidden size of {arch.name} ({arch.hidden_size})",
                               field="lora_r", value=s.lora.lora_r, suggestion=f"use a rank <= {arch.hidden_size}")
    if s.parallel.tensor_parallel > 1 and not arch.is_bare and arch.num_attention_heads % s.parallel.tensor_parallel:
        raise FitplanError(f"tensor_parallel ({s.parallel.tensor_parallel}) must divide num_attention_heads ({arch.num_attention_heads})",
                           field="tensor_parallel", value=s.parallel.tensor_parallel)
    if s.trl.trainer not in MODELLED_TRAINERS:
        raise FitplanError(f"Trl.trainer {s.trl.trainer!r}: this trainer's step is not modelled yet", field="trainer",
                           value=s.trl.trainer, suggestion="modelled: " + ", ".join(MODELLED_TRAINERS))
    world = s.hardware.num_gpus * s.hardware.num_nodes
    from fitplan.inputs import stacks
    from fitplan.inputs.precision import PRESETS

    stack = stacks.resolve(s.parallel.stack, s.parallel.zero_stage, s.parallel.fsdp, s.parallel.offload_optimizer,
                           s.parallel.offload_params, s.training.precision if s.training.precision in PRESETS else None,
                           max(1, world // s.parallel.tensor_parallel))
    stacks.check_ds_only(stack, {n: getattr(s.parallel, n) for n in stacks.DS_ONLY_FIELDS})
    online_settings(s)  # TRL's GRPO/RLOO config checks
    if s.trl.trainer == "cpo":
        from fitplan.inputs.trl_checks import check_cpo

        check_cpo(s.trl.loss_type)  # CPOTrainer's own refusals
    check_optimizer(s, optimizer, world)
    if world % s.parallel.tensor_parallel:
        raise FitplanError(f"tensor_parallel ({s.parallel.tensor_parallel}) must divide the number of GPUs ({world})",
                           field="tensor_parallel", value=s.parallel.tensor_parallel)


def peft_default_targets(arch: architecture.ModelSpec) -> tuple[str, ...] | None:
    """What peft 0.21's ``LoraConfig()`` adapts on this model when no ``target_modules`` is given: its mapping
    per model type (``peft/utils/constants.py``; ``LoraModel._prepare_adapter_config``,
    ``peft/tuners/lora/model.py``), or None when peft has none (it raises "Please specify `target_modules`")."""
    if arch.is_bare:
        return None
    from fitplan.arch.archfile import peft_table

    found = peft_table()["lora_default_targets"].get(arch.model_type)
    return None if found is None else tuple(found)


def with_default_targets(s: sc.Scenario, arch: architecture.ModelSpec) -> sc.Scenario:
    """``s`` with LoRA's target modules as peft chooses them when the scenario names none (see
    :func:`peft_default_targets`); a LoRA scenario on a model type peft has no default for is an error, as in peft."""
    if s.lora.lora_target_modules is not None or arch.is_bare:
        return s
    found = peft_default_targets(arch)
    if found is None:
        if s.model.method in ("lora", "qlora"):
            raise FitplanError(f"peft 0.21 has no default LoRA target modules for model type {arch.model_type!r} "
                               "(LoraConfig without target_modules raises 'Please specify `target_modules`')",
                               field="lora_target_modules", value="",
                               suggestion="name them with --lora-target-modules: all-linear, or some of this model's "
                                          "modules: " + ", ".join(sorted({g.path.rsplit(".", 1)[-1] for g in
                                                                         arch.param_groups() if g.linear is not None})))
        return s
    return attrs.evolve(s, lora=attrs.evolve(s.lora, lora_target_modules=found))


def loaded_dtype(s: sc.Scenario, arch: architecture.ModelSpec) -> str:
    """What ``from_pretrained`` loads the weights in (``fp32``/``bf16``/``fp16``): ``--dtype``, or with ``auto``
    (transformers 5.24's default) the dtype the model's config states, float32 when it states none or when the
    model is a bare parameter count."""
    from fitplan.inputs.precision import dtype_code

    if s.training.dtype != "auto":
        return dtype_code(s.training.dtype)
    if arch.family != "learned":  # --params: no config, so no dtype (a typical shape's template says nothing)
        return "fp32"
    return arch.checkpoint_dtype or "fp32"


def with_precision(s: sc.Scenario, arch: architecture.ModelSpec) -> sc.Scenario:
    """``s`` with its precision preset decided: the one the user named, else what the HF words select on the
    loaded weights (:func:`fitplan.inputs.precision.hf_precision`: TrainingArguments' ``bf16``/``fp16`` over
    :func:`loaded_dtype`, or DeepSpeed's optimizer when DeepSpeed runs); ``--assumptions seed`` is fp32.

    :raises FitplanError: a named preset whose weights contradict an explicit ``--dtype``; fp16 autocast over
        fp16 weights (torch's GradScaler refuses it)."""
    from fitplan.inputs import stacks
    from fitplan.inputs.precision import HF_WORD, PRESETS

    t = s.training
    if t.precision is not None:
        p = PRESETS[t.precision]
        if t.dtype != "auto" and not p.master and HF_WORD[p.weight_dtype] != t.dtype:
            raise FitplanError(f"--precision {t.precision} holds {HF_WORD[p.weight_dtype]} weights but --dtype is "
                               f"{t.dtype}", field="dtype", value=t.dtype,
                               suggestion="give one of them: --precision (Lightning's presets) or the HF words "
                                          "(--dtype with --bf16/--fp16)")
        return s
    p, hw = s.parallel, s.hardware
    dp = max(1, hw.num_gpus * hw.num_nodes // p.tensor_parallel)
    deepspeed = stacks.resolve(p.stack, p.zero_stage, p.fsdp, p.offload_optimizer, p.offload_params, None, dp) == "deepspeed"
    return s.replace(precision=hf_preset(s, arch, deepspeed=deepspeed))


def hf_preset(s: sc.Scenario, arch: architecture.ModelSpec, *, deepspeed: bool = False) -> str:
    """The preset the HF words of ``s`` select (its ``bf16``/``fp16`` flag over :func:`loaded_dtype`), with or
    without DeepSpeed; ``--assumptions seed``: fp32."""
    from fitplan.inputs.precision import hf_precision

    if s.model.assumptions == "seed":
        return "32-true"
    t = s.training
    flag = "bf16" if t.bf16 else "fp16" if t.fp16 else None
    return hf_precision(flag, loaded_dtype(s, arch), deepspeed=deepspeed)


def online_settings(s: sc.Scenario) -> Any:
    """GRPO/RLOO's generation round as TRL resolves it (:mod:`fitplan.inputs.trl_online`), None for the other
    trainers; raises TRL's config errors."""
    from fitplan.inputs import trl_online

    t, tr, hw = s.trl, s.training, s.hardware
    if t.trainer not in trl_online.ONLINE:
        return None
    gpus = trl_online.training_gpus(hw.num_gpus, t.trainer, t.use_vllm, t.vllm_mode, t.vllm_tensor_parallel_size)
    return trl_online.resolve(
        trainer=t.trainer, num_generations=t.num_generations, max_completion_length=t.max_completion_length,
        prompt_length=t.prompt_length, generation_batch_size=t.generation_batch_size,
        steps_per_generation=t.steps_per_generation, beta=t.beta, use_vllm=t.use_vllm, method=s.model.method,
        per_device_train_batch_size=tr.per_device_train_batch_size,
        gradient_accumulation_steps=tr.gradient_accumulation_steps, processes=gpus * hw.num_nodes)


def with_online_sequence(s: sc.Scenario) -> sc.Scenario:
    """GRPO/RLOO: the training step's sequence is prompt + completion (``max_seq_length`` plays no part in
    TRL's online trainers), the loss head is TRL's fused log-probability head (``loss_implementation =
    "trl_grpo"``, trace/fused_head.py) and a dataset of ``num_examples`` prompts holds ``prompt_length`` tokens each unless
    stated; other trainers unchanged."""
    o = online_settings(s)
    if o is None:
        return s
    d = s.dataset
    if d.num_examples is not None and d.tokens_per_example is None and d.total_tokens is None:
        s = s.replace(tokens_per_example=o.prompt_length)
    if s.training.loss_implementation == "hf":  # GRPO/RLOO always score through TRL's fused head
        s = s.replace(loss_implementation="trl_grpo")
    return s.replace(max_seq_length=o.sequence_length)


def resolve_defaults(s: sc.Scenario, arch: architecture.ModelSpec) -> sc.Scenario:
    """``s`` with what the pinned stack decides when the user says nothing: peft's default LoRA targets
    (:func:`with_default_targets`), the precision preset (:func:`with_precision`) and GRPO/RLOO's training
    sequence (:func:`with_online_sequence`)."""
    return with_reward_head(with_online_sequence(with_precision(with_default_targets(s, arch), arch)))


def with_reward_head(s: sc.Scenario) -> sc.Scenario:
    """TRL's reward model under LoRA: peft's ``PeftModelForSequenceClassification.__init__`` (peft/peft_model.py)
    appends ``classifier`` and ``score`` to ``modules_to_save``; the model has a ``score`` (no ``classifier``), so
    ``score`` trains whole as a copy beside the adapters. Other trainers, and full fine-tuning, unchanged."""
    if s.trl.trainer != "reward" or s.model.method == "full" or "score" in s.lora.lora_modules_to_save:
        return s
    return s.replace(lora_modules_to_save=(*s.lora.lora_modules_to_save, "score"))


def trainer_arch(s: sc.Scenario, arch: architecture.ModelSpec) -> architecture.ModelSpec:
    """The model the trainer trains: for TRL's reward model the sequence classifier
    (:func:`~fitplan.arch.architecture.sequence_classifier`); a bare parameter count cannot say which
    parameters are the LM head's, so it is refused."""
    if s.trl.trainer != "reward":
        return arch
    if arch.is_bare or arch.family == "approximate":
        raise FitplanError("trainer 'reward' needs the model's architecture: the reward model replaces the LM head by "
                           "a score head", field="trainer", value="reward",
                           suggestion="use --model NAME or a config.json instead of --params")
    from fitplan.arch.archfile import sequence_classifiers

    if arch.model_type not in sequence_classifiers():
        raise FitplanError(f"trainer 'reward' on model_type {arch.model_type!r}: its sequence classifier is not "
                           "transformers' GenericForSequenceClassification (or it has none), which is what fitplan models",
                           field="trainer", value="reward", suggestion="modelled: " + ", ".join(sequence_classifiers()))
    return architecture.sequence_classifier(arch)


def build_inputs(s: sc.Scenario, registry: Registry, rules: Rulesets, arch: architecture.ModelSpec | None = None) -> dict[str, Any]:
    arch = arch or resolve_arch(s, rules)
    s = resolve_defaults(s, arch)
    arch = trainer_arch(s, arch)
    optimizer = registry.resolve_optimizer(s.training.optim)
    check_scenario(s, arch, optimizer)
    flat = sc.flatten(s)
    flat.update(
        arch=arch,
        gpu_spec=rules.gpu(s.hardware.gpu) if s.hardware.gpu else None,
        optimizer_spec=optimizer,
        framework=rules.framework,
        rulesets=rules,
    )
    flat.update(dataset_inputs(s, rules))
    return flat


def dataset_inputs(s: sc.Scenario, rules: Rulesets) -> dict[str, Any]:
    """``dataset_summary``: the token lengths of ``--dataset`` (read by :mod:`fitplan.data` only when one is
    given), and then the dataset's examples and tokens as ``num_examples`` and ``total_tokens``."""
    if not s.dataset.dataset_path:
        return {"dataset_summary": None}
    from fitplan.data.resolve import scenario_inputs

    return scenario_inputs(s, rules)


@attrs.define
class Estimate:
    """Every quantity's value for one scenario, with provenance."""

    scenario: sc.Scenario
    values: dict[str, Any]
    applied: dict[str, bool]
    registry: Registry
    rulesets: Rulesets
    warnings: list[str] = attrs.Factory(list)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            from fitplan.errors import unknown

            raise unknown("quantity", name, self.registry.compiled().quantities) from None

    @property
    def arch(self) -> architecture.ModelSpec:
        return self.values["arch"]

    def memory_bytes(self) -> dict[str, int]:
        """Per-GPU bytes of each memory component, keyed as in the JSON report's ``memory.per_gpu_bytes``."""
        prefix = "memory.per_gpu_bytes."
        return {q.json_key[len(prefix):]: int(self.values[name]) for name, q in self.registry.compiled().quantities.items()
                if q.json_key.startswith(prefix) and name in self.values}

    def role(self, role: str) -> Any:
        """The value of the quantity holding ``role`` (:data:`fitplan.engine.declarations.ROLES`), or None."""
        name = self.registry.compiled().role(role)
        return None if name is None else self.values.get(name)

    def provenance(self, name: str) -> dict[str, Any]:
        """Where ``name``'s value came from: rule, plugin, inputs, ruleset file."""
        graph = self.registry.compiled()
        node = graph.nodes.get(name)
        if node is None:
            self[name]  # raises with a suggestion
        out: dict[str, Any] = {"name": name, "value": self.values.get(name), "kind": node.kind, "unit": node.unit,
                               "plugin": node.plugin, "doc": node.doc.split("\n\n")[0] if node.doc else "",
                               "deps": list(node.deps)}
        if node.kind == "reducer":
            out["applied"] = self.applied.get(name, False)
        if node.kind == "input":
            origin = self._input_origin(name)
            if origin:
                out["ruleset"] = origin
        return out

    def _input_origin(self, name: str) -> str | None:
        v = self.values.get(name)
        if name == "gpu_spec" and v is not None:
            return self.rulesets.origin.get(f"gpu:{v.id}")
        if name == "arch":
            return v.source or self.rulesets.origin.get(f"model:{v.name}")
        if name == "framework":
            return self.rulesets.origin.get("framework", "built-in defaults")
        if name == "optimizer_spec":
            return f"plugin {v.plugin}: {v.source}"
        return None


def evaluate(s: sc.Scenario, registry: Registry, rules: Rulesets, *, arch: architecture.ModelSpec | None = None) -> Estimate:
    """Evaluate the compiled graph for ``s`` (with peft's default LoRA targets when it names none)."""
    compiled = registry.compiled()
    arch = arch or resolve_arch(s, rules)
    s = resolve_defaults(s, arch)
    inputs = build_inputs(s, registry, rules, arch)
    values, applied = compiled.evaluate(inputs)
    warnings = scenario_warnings(s, inputs["arch"], inputs["gpu_spec"])
    spec = inputs["optimizer_spec"]
    if not spec.hf and not spec.plugin.startswith("fitplan.builtin."):
        warnings.append(f"optim {spec.name!r} comes from plugin {spec.plugin!r}: it is not an HF TrainingArguments.optim "
                        "name (the HF Trainer does not build it)")
    return Estimate(s, values, applied, registry, rules, warnings)


def hf_config_for(s: sc.Scenario, rules: Rulesets) -> dict[str, Any]:
    """The HF ``config.json`` fields behind the scenario's model (catalog entry or file), for plugins
    that build the real model (``transformers.AutoConfig.for_model(**config)``)."""
    from pathlib import Path

    text = s.model.model
    if not text:
        raise FitplanError("this needs a model architecture, not a bare --params count", field="model",
                           suggestion="pass --model NAME or --model path/to/config.json")
    kind, where = model_source(text, rules)
    if kind == "catalog":
        return dict(where.config)
    from fitplan.inputs.files import read_json

    return read_json(Path(where), field="--model", special_floats=True)
