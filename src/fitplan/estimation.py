"""From a scenario to an :class:`Estimate`: resolve the inputs, evaluate the compiled graph, keep provenance.

``Estimate`` keeps every value and where it came from: the quantity's plugin and doc, its
dependencies' values, which reducers applied, and the ruleset file behind each resolved input.
"""

from __future__ import annotations

from typing import Any

import attrs

from fitplan.errors import FitplanError
from fitplan.inputs import architecture
from fitplan.inputs import scenario as sc
from fitplan.inputs.typical import typical_spec
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
    text = m.model
    if text.endswith(".json") or "/" in text and not text.startswith(("meta-llama/", "mistralai/")):
        from pathlib import Path

        if Path(text).is_dir():
            text = str(Path(text) / "config.json")
        if text.endswith(".json"):
            return architecture.load_config_json(text)
    entry = rules.model_entry(text)
    return architecture.spec_from_config(entry.config, name=entry.id, file=rules.origin.get(f"model:{entry.id}"), source=entry.source)


def scenario_warnings(s: sc.Scenario, arch: architecture.ModelSpec) -> list[str]:
    out = []
    if arch.family == "approximate":
        out.append(f"--params gives no architecture: activations, logits and the step peak are for a typical shape "
                   f"({arch.name.split('(approximate: ', 1)[-1].rstrip(')')}, {arch.num_hidden_layers} layers, "
                   f"vocabulary {arch.vocab_size}) and are approximate; pass --model CONFIG.json for the real shape")
    world = s.hardware.num_gpus * s.hardware.num_nodes
    p = s.parallel
    if (p.zero_stage or p.fsdp) and world // p.tensor_parallel <= 1:
        out.append(f"--zero {p.zero_stage or p.fsdp} changes nothing on a single GPU: sharding needs --num-gpus > 1")
    if p.zero_stage and p.fsdp:
        out.append("both --zero and --fsdp given: the larger sharding stage is used")
    if p.offload_params and max(p.zero_stage, 3 if p.fsdp in ("full_shard", "hybrid_shard") else 0) < 3:
        out.append("--offload-params only applies with ZeRO stage 3 / FSDP full_shard: ignored")
    if s.model.method == "full" and s.lora != sc.Lora():
        out.append("LoRA options given with --method full: they are ignored (use --method lora or qlora)")
    if s.training.max_seq_length > arch.max_position_embeddings and not arch.is_bare and arch.family != "approximate":
        out.append(f"--max-seq-length {s.training.max_seq_length} exceeds the model's max_position_embeddings "
                   f"({arch.max_position_embeddings})")
    return out


def check_scenario(s: sc.Scenario, arch: architecture.ModelSpec) -> None:
    """Errors that need the architecture to detect."""
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
    world = s.hardware.num_gpus * s.hardware.num_nodes
    if world % s.parallel.tensor_parallel:
        raise FitplanError(f"tensor_parallel ({s.parallel.tensor_parallel}) must divide the number of GPUs ({world})",
                           field="tensor_parallel", value=s.parallel.tensor_parallel)


def build_inputs(s: sc.Scenario, registry: Registry, rules: Rulesets, arch: architecture.ModelSpec | None = None) -> dict[str, Any]:
    arch = arch or resolve_arch(s, rules)
    check_scenario(s, arch)
    flat = sc.flatten(s)
    flat.update(
        arch=arch,
        gpu_spec=rules.gpu(s.hardware.gpu) if s.hardware.gpu else None,
        optimizer_spec=registry.resolve_optimizer(s.training.optim),
        framework=rules.framework,
        rulesets=rules,
    )
    return flat


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
    """Evaluate the compiled graph for ``s``."""
    compiled = registry.compiled()
    inputs = build_inputs(s, registry, rules, arch)
    values, applied = compiled.evaluate(inputs)
    return Estimate(s, values, applied, registry, rules, scenario_warnings(s, inputs["arch"]))


def hf_config_for(s: sc.Scenario, rules: Rulesets) -> dict[str, Any]:
    """The HF ``config.json`` fields behind the scenario's model (catalog entry or file), for plugins
    that build the real model (``transformers.AutoConfig.for_model(**config)``)."""
    import json
    from pathlib import Path

    text = s.model.model
    if not text:
        raise FitplanError("this needs a model architecture, not a bare --params count", field="model",
                           suggestion="pass --model NAME or --model path/to/config.json")
    p = Path(text)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" and p.exists():
        from fitplan.inputs.files import read_json

        return read_json(p, field="--model")
    return dict(rules.model_entry(text).config)
