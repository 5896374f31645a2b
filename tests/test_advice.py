"""Advice rules: the safe template language, the numbers in the messages (computed from the variant
scenario), and advice in `fitplan estimate` reports."""

from __future__ import annotations

import json

import pytest

import fitplan
from fitplan.rules.advice import AdviceSet
from fitplan.rulesets.templates import _FORMATTER, _Value, render_message, template_names
from fitplan.rulesets.schema import AdviceRule
from fitplan.rulesets.conditions import Namespace
from fitplan.errors import FitplanError

from conftest import run_cli

LLAMA_7B = 6_738_415_616  # published parameter count (meta-llama/Llama-2-7b-hf)
LLAMA_7B_TENSORS = 32 * 9 + 3  # per layer q, k, v, o, gate, up, down + 2 norms; embed, final norm, lm_head


@pytest.mark.parametrize(("template", "message"), [
    ("{peak_bytes.real}", "uses attribute or index access"),
    ("{peak_bytes.__class__}", "uses attribute or index access"),
    ("{names[0]}", "is not a plain name"),
    ("{peak_bytes!r}", "uses a conversion"),
    ("{peak_bytes:{width}}", "has a nested field in its format spec"),
    ("{}", "is not a plain name"),
    ("{0}", "is positional"),
    ("{peak_bytes", "malformed message template"),
])
def test_templates_are_restricted(template, message):
    with pytest.raises(FitplanError, match=message):
        template_names(template)


def test_the_formatter_refuses_attribute_access_even_unchecked():
    with pytest.raises(KeyError):
        _FORMATTER.vformat("{x.__class__}", (), {"x": _Value(1)})
    with pytest.raises(KeyError):
        _FORMATTER.vformat("{y}", (), {"x": _Value(1)})


@pytest.mark.parametrize(("value", "spec", "text"), [
    (31.04e9, "GB", "31.0 GB"),
    (2 ** 31, "GiB", "2.0 GiB"),
    (0.6249, "pct", "62 %"),
    (1234.5, "usd", "$1,234.50"),
    (15_360, "h", "4.3 h"),
    (4 / 3, "x", "1.33×"),
    (None, "GB", "n/a"),
    (7, "", "7"),
    (0.123456, ".2f", "0.12"),
])
def test_value_formats(value, spec, text):
    assert format(_Value(value), spec) == text


def test_prefixed_names():
    from fitplan.pluginmgr.registry import default_registry
    from fitplan.rulesets.conditions import vocabulary

    ns = Namespace({"peak_bytes": 80e9, "activation_bytes": 40e9}, None, {"peak_bytes": 60e9, "activation_bytes": 10e9},
                   vocabulary(default_registry()))
    text = render_message("{share_activation_bytes:pct} {variant_peak_bytes:GB} {delta_peak_bytes:GB} {ratio_peak_bytes:x}", ns)
    assert text == "50 % 60.0 GB 20.0 GB 0.75×"


@pytest.fixture(scope="module")
def ctx():
    from fitplan.context import get_context
    from fitplan.pluginmgr.registry import make_registry

    return get_context((), make_registry(entry_points=False, blocked=()))


def _advice(est):
    from fitplan.rules.advice import advise

    return {a.id: a for a in advise(est)}


def test_checkpointing_advice_carries_the_variant_numbers(ctx):
    s = fitplan.scenario_from_dict({"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-mixed",
                                    "per_device_train_batch_size": 8})
    from fitplan.estimation import evaluate

    est = evaluate(s, ctx.registry, ctx.rulesets)
    ckpt = evaluate(s.replace(gradient_checkpointing=True), ctx.registry, ctx.rulesets)
    a = _advice(est)["gradient-checkpointing"]
    saved = est["peak_bytes"] - ckpt["peak_bytes"]
    assert f"would save {saved / 1e9:,.1f} GB" in a.message
    assert f"activations are {100 * est['activation_bytes'] / est['peak_bytes']:.0f} % of the peak" in a.message
    # one more forward pass: (8N + 16·L·h·s) / (6N + 12·L·h·s) = 4/3 exactly
    assert "for 1.33× the compute per token" in a.message
    assert a.variant == {"gradient_checkpointing": True}
    assert a.checklist == "Activer le checkpointing des gradients"


def test_8bit_optimizer_advice_numbers_by_hand(ctx):
    from fitplan.estimation import evaluate

    s = fitplan.scenario_from_dict({"model": "llama-2-7b", "gpu": "h100-sxm", "precision": "bf16-mixed",
                                    "gradient_checkpointing": True})
    a = _advice(evaluate(s, ctx.registry, ctx.rulesets))["8bit-optimizer"]
    # AdamW with fp32 states: two 4-byte states per parameter + a 4-byte step per tensor
    states = 2 * 4 * LLAMA_7B + 4 * LLAMA_7B_TENSORS
    assert a.message.startswith(f"optimizer states take {states / 1e9:.1f} GB")


def test_accumulation_advice_takes_the_batch_from_the_scenario(ctx):
    from fitplan.estimation import evaluate

    s = fitplan.scenario_from_dict({"model": "llama-2-7b", "gpu": "a100-80gb", "method": "lora", "precision": "bf16-true",
                                    "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2})
    a = _advice(evaluate(s, ctx.registry, ctx.rulesets))["gradient-accumulation"]
    assert a.variant == {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 32}
    assert "micro-batch 1 × 32 accumulation steps" in a.message


def test_no_cost_advice_without_prices(ctx):
    from fitplan.estimation import evaluate

    s = fitplan.scenario_from_dict({"model": "llama-2-7b", "gpu": "a10g", "method": "qlora", "precision": "bf16-true",
                                    "gradient_checkpointing": True})
    assert "spot-instances" not in _advice(evaluate(s, ctx.registry, ctx.rulesets))
    priced = s.replace(provider="aws", num_examples=10000, tokens_per_example=512)
    a = _advice(evaluate(priced, ctx.registry, ctx.rulesets))["spot-instances"]
    v = evaluate(priced, ctx.registry, ctx.rulesets).values
    assert f"${v['spot_cost_usd']:,.2f} instead of ${v['on_demand_cost_usd']:,.2f}" in a.message


def test_custom_rule_with_a_variant_from_a_name(ctx):
    from fitplan.estimation import evaluate

    rule = AdviceRule(id="halve", condition={"gt": {"per_device_train_batch_size": 2}},
                      variant={"gradient_accumulation_steps": {"from": "per_device_train_batch_size"}},
                      message="k = {variant_gradient_accumulation_steps}, peak ratio {ratio_peak_bytes:.3f}")
    aset = AdviceSet([rule], ctx.registry)
    est = evaluate(fitplan.scenario_from_dict({"model": "gpt2", "per_device_train_batch_size": 4}), ctx.registry,
                   ctx.rulesets)
    other = evaluate(est.scenario.replace(gradient_accumulation_steps=4), ctx.registry, ctx.rulesets)
    (a,) = aset.advise(est)
    assert a.message == f"k = 4, peak ratio {other['peak_bytes'] / est['peak_bytes']:.3f}"


def test_unknown_names_in_advice_rules(ctx):
    rule = AdviceRule(id="x", condition={"gt": {"variant_peak_byte": 1}}, message="{delta_activation_byte:GB}")
    with pytest.raises(FitplanError) as e:
        AdviceSet([rule], ctx.registry)
    assert len(e.value.details) == 2
    assert "advice 'x': unknown name 'variant_peak_byte' (did you mean 'variant_peak_bytes'" in e.value.details[0]
    assert "unknown name 'delta_activation_byte' (did you mean 'delta_activation_bytes'" in e.value.details[1]


def test_variant_fields_are_checked():
    with pytest.raises(FitplanError, match="unknown scenario field 'gradient_checkpoint'"):
        AdviceRule(id="x", condition={"gt": {"peak_bytes": 1}}, message="m", variant={"gradient_checkpoint": True})


def test_estimate_reports_show_advice():
    # an fp32 load (Llama-2 publishes float16: --dtype float32 is the fp32 run the mixed-precision advice is for)
    args = ("estimate", "--model", "llama-2-7b", "--dtype", "float32", "--gpu", "a100-80gb", "--per-device-train-batch-size", "4")
    proc = run_cli(*args, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    advice = json.loads(proc.stdout)["advice"]
    ids = [a["id"] for a in advice]
    assert ids == ["mixed-precision", "gradient-checkpointing", "gradient-accumulation", "8bit-optimizer"]
    assert all(a["message"] and a["checklist"] for a in advice)
    md = run_cli(*args, "--format", "markdown").stdout
    assert "- **advice**: activations are" in md
    table = run_cli(*args).stdout
    assert "advice" in table and "gradient checkpointing would save" in table


def test_bundled_checklist_covers_the_seed_checklist(ctx):
    seed_items = {"Activer la précision mixte (bf16/fp16)", "Activer le checkpointing des gradients",
                  "Utiliser l'accumulation des gradients pour des tailles de lot effectives plus grandes",
                  "Envisager des optimiseurs 8 bits", "Utiliser DeepSpeed pour le multi-GPU",
                  "Surveiller la mémoire avec le profilage", "Utiliser des instances spot pour économiser sur les coûts"}
    assert {a.checklist for a in ctx.rulesets.advice.values() if a.checklist} == seed_items  # stacks.toml: no seed item


def test_pure_fp16_training_is_advised_against_on_a_bf16_gpu():
    """Llama-2 publishes a float16 checkpoint: loaded as is (dtype="auto") and trained without a flag, it trains in
    pure fp16 with no loss scaling; bfloat16 holds the same 2 bytes per value, so the advice's peak is unchanged."""
    proc = run_cli("estimate", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["scenario"]["training"]["precision"] == "16-true"
    tip = next(a for a in data["advice"] if a["id"] == "pure-fp16")
    assert tip["variant"] == {"dtype": "bfloat16", "precision": "bf16-true"}
    peak_gb = f"{data['memory']['per_gpu_bytes']['peak'] / 1e9:.1f} GB"
    assert f"keeps the same memory ({peak_gb})" in tip["message"]
    bf16 = json.loads(run_cli("estimate", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--dtype", "bfloat16",
                              "--format", "json").stdout)
    assert "pure-fp16" not in [a["id"] for a in bf16["advice"]]


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_a_variant_is_evaluated_only_when_the_rest_of_its_condition_holds(ctx, monkeypatch, precision):
    """A rule's condition ``all = [...]`` with a part false on the current values (``precision = "32-true"`` for a
    bf16-mixed run; ``headroom_fraction < 0.05`` for a run with room to spare) does not hold whatever the variant
    gives: its variant scenario is not evaluated, and the advice is that of the whole evaluation (each rule's
    variant evaluated, as before). In fp32 the mixed-precision rule's variant is evaluated and fires."""
    import fitplan.estimation as estimation
    from fitplan.rules.advice import advice_set

    s = fitplan.scenario_from_dict({"model": "llama-2-7b", "gpu": "h100-sxm", "precision": precision,
                                    "optim": "adamw_torch", "gradient_checkpointing": True, "method": "lora"})
    est = estimation.evaluate(s, ctx.registry, ctx.rulesets)
    rules = advice_set(ctx.rulesets, ctx.registry)
    room = Namespace(est.values, None, None, rules.vocabulary).get("headroom_fraction")
    assert room > 0.05  # LoRA of a 7B model on an 80 GB GPU: room to spare
    whole = advice_set(ctx.rulesets, ctx.registry)
    whole.compiled = [(r, cond, needs, ()) for r, cond, needs, _ in whole.compiled]  # every variant evaluated
    asked: list = []
    real = estimation.evaluate
    monkeypatch.setattr(estimation, "evaluate", lambda sc, *a, **k: asked.append(sc) or real(sc, *a, **k))
    got = rules.advise(est)
    variants = [(v.training.precision, v.training.per_device_train_batch_size) for v in asked]
    asked.clear()
    assert got == whole.advise(est)
    assert len(asked) >= 4  # the whole evaluation: every rule with a variant whose condition reads it
    if precision == "bf16-mixed":
        assert len(variants) < len(asked)
        assert [v for v in variants if v[0] in ("bf16-true", "16-mixed") or v[1] == 1] == [], variants
    else:
        assert ("bf16-true", 1) in variants and "mixed-precision" in {a.id for a in got}
