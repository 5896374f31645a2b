"""Rendered reports, snapshot-tested (syrupy; review every snapshot update as a diff): recommendation
reports in JSON, Markdown, the terminal and HTML rendered from hand-built results (a model change does not
churn them), the live searches' reports checked for what they must say, and the estimate reports' advice.
Reports are deterministic: rendering twice gives the same bytes. The HTML report is also opened in
headless Chromium (skipped when it is not installed, except in CI: .ci/run installs it and requires it)."""

from __future__ import annotations

import json
import subprocess
from io import StringIO

import pytest

import fitplan
from fitplan.output.plan_text import rejection_text
from fitplan.rules.policy import Verdict
from fitplan.search import recommend as rec
from fitplan.search.space import SearchSpace
from fitplan.output import recommend_report as report
from fitplan.output import recommend_html as report_html

from conftest import ROOT

EXAMPLE_POLICY = ROOT / "rulesets" / "examples" / "policy-example.toml"
DATASET = {"num_examples": 20000, "tokens_per_example": 512}
SCENARIOS = {
    "lora-7b-cost": ({"model": "llama-2-7b", **DATASET},
                     dict(gpus=("a100-80gb", "h100-sxm"), providers=("aws", "lambda", "runpod"), methods=("lora", "qlora")),
                     "cost", None, 5),
    "policy-13b-cost": ({"model": "llama-2-13b", **DATASET, "num_train_epochs": 2},
                        dict(gpus=("a100-80gb", "h100-sxm", "rtx-4090"), providers=("aws", "lambda", "runpod", "seed"),
                             markets=("on_demand", "spot")),  # spot asked for: the example policy has a spot rule
                        "cost", EXAMPLE_POLICY, 5),
    "time-8b": ({"model": "llama-3.1-8b", **DATASET, "method": "full"},
                dict(gpus=("h100-sxm", "b200"), providers=("lambda", "aws")), "time", None, 4),
    "gpus-no-dataset": ({"model": "qwen2.5-1.5b"},
                        dict(gpus=("a10g", "l4", "t4"), providers=("aws", "runpod", "seed")), "gpus", None, 3),
}


@pytest.fixture(scope="module")
def ctx():
    from fitplan.context import get_context
    from fitplan.pluginmgr.registry import make_registry

    return get_context((), make_registry(entry_points=False, blocked=()))


@pytest.fixture(scope="module")
def results(ctx):
    from fitplan.rules.policy import policy_set

    out = {}
    for name, (data, space, objective, policy, top) in SCENARIOS.items():
        base = fitplan.scenario_from_dict(data)
        policies = policy_set(ctx.rulesets, ctx.registry, [policy] if policy else [])
        res = rec.search(base, ctx, space=SearchSpace(**space), objective=objective, policies=policies, top=top,
                         fixed=set(data))
        rec.attach_estimates(res, ctx)
        out[name] = res
    return out


def terminal(result) -> str:
    from rich.console import Console

    buf = StringIO()
    report.print_result(result, Console(file=buf, width=200, highlight=False, color_system=None))
    return buf.getvalue()


RENDERERS = {
    "json": lambda r: json.dumps(report.to_json(r), indent=2, default=str),
    "markdown": report.to_markdown,
    "terminal": terminal,
    "html": report_html.render,
}


# Hand-built results: the renderers' snapshots depend on the renderers only, not on the memory, time or price
# models (a model change does not churn them). Plans without an estimate: the estimate's own sections are the
# estimate report's (tested there); the live searches above are checked for what a snapshot cannot say.
HAND_BASE = {"model": "llama-2-7b", "num_examples": 20000, "tokens_per_example": 512}
HAND_FIELDS = dict(num_nodes=1, num_gpus=1, gpu="a100-80gb", method="lora", precision="bf16-mixed", optim="adamw_torch",
                   per_device_train_batch_size=4, gradient_accumulation_steps=2, gradient_checkpointing=True,
                   zero_stage=0, offload_optimizer=False, offload_params=False, attn_implementation="sdpa", stack=None,
                   provider="lambda", instance="gpu_1x_a100_sxm4")
FORBID = Verdict("no-consumer-gpus", "forbid", "consumer GPUs are not allowed", "gpu == rtx-4090")
PENALISE = Verdict("prefer-on-demand", "penalise", "spot is interrupted", "market == spot", 1.25)


def hand_plan(rank: int | None, order: int, *, market: str = "on_demand", gb: float = 40.0, hours: float = 2.0,
              usd: float = 4.5, penalties=(), rejected_by=(), notes=(), equivalents: int = 0, **fields):
    from fitplan.search.plans import Plan

    f = {**HAND_FIELDS, **fields}
    return Plan(fields=f, market=market, device_total_bytes=int(gb * 1e9), usable_bytes=80_000_000_000,
                train_seconds=hours * 3600, cost_usd=usd, on_demand_cost_usd=usd if market == "on_demand" else 2 * usd,
                spot_cost_usd=usd if market == "spot" else None, world_size=f["num_gpus"] * f["num_nodes"], score=usd,
                order=order, rank=rank, penalties=list(penalties), rejected_by=list(rejected_by), notes=list(notes),
                equivalents=equivalents)


def hand_result(*, vary: bool = False):
    """Two ranked plans (one penalised, on spot, sharded over 8 GPUs), the front, one plan rejected by a policy
    (with a note); with ``vary``, the same split into a LoRA and a QLoRA side."""
    from fitplan.search.plans import Result, Side, Stats

    p1 = hand_plan(1, 0, equivalents=3)
    p2 = hand_plan(2, 1, market="spot", gb=61.25, hours=0.5, usd=9.0, gpu="h100-sxm", num_gpus=8, zero_stage=2,
                   provider="aws", instance="p5.48xlarge", penalties=[PENALISE])
    p3 = hand_plan(None, 2, gb=22.5, hours=6.0, usd=3.25, gpu="rtx-4090", method="qlora", provider="runpod",
                   instance="1x-rtx-4090", rejected_by=[FORBID], notes=["runpod 1x-rtx-4090 states no host RAM"])
    stats = Stats(candidates=120, too_big=40, pruned_monotone=5, rejected=1, allowed=74, memory_evaluations=60,
                  time_evaluations=30, seconds=1.5, rejected_by={"no-consumer-gpus": 1})
    policies = [{"id": "no-consumer-gpus", "action": "forbid", "description": "consumer GPUs are not allowed",
                 "file": "policy.toml"},
                {"id": "prefer-on-demand", "action": "penalise", "description": "spot is interrupted", "penalty": 1.25,
                 "file": "policy.toml"}]
    space = SearchSpace(gpus=("a100-80gb", "h100-sxm", "rtx-4090"), providers=("lambda", "aws", "runpod"),
                        methods=("lora", "qlora"))
    common = dict(objective="cost", stats=stats, space=space, base=fitplan.scenario_from_dict(HAND_BASE),
                  headroom="0.05", policies=policies, model={"name": "llama-2-7b", "params": 6_738_415_616})
    if not vary:
        return Result(plans=[p1, p2], pareto=[p2, p1], rejected=[p3], **common)
    sides = [Side(values={"method": "lora"}, plans=[p1, p2], pareto=[p2, p1], rejected=[]),
             Side(values={"method": "qlora"}, plans=[], pareto=[], rejected=[p3])]
    return Result(plans=[], pareto=[], rejected=[], vary=("method",), sides=sides, **common)


@pytest.mark.parametrize("fmt", list(RENDERERS))
@pytest.mark.parametrize("vary", [False, True], ids=["ranked", "vary"])
def test_recommend_renderers_on_a_hand_built_result(snapshot, fmt, vary):
    result = hand_result(vary=vary)
    text = RENDERERS[fmt](result)
    assert text == RENDERERS[fmt](hand_result(vary=vary))  # deterministic
    assert "rtx-4090" in text and "no-consumer-gpus" in text  # the rejected plan and its rule are shown
    assert text == snapshot


def test_live_reports_render_deterministically_in_every_format(results):
    for name, result in results.items():
        for fmt, render in RENDERERS.items():
            text = render(result)
            assert text == render(result), (name, fmt)
            assert "fitplan estimate --model" in text, (name, fmt)  # each report says how to reproduce its plans


def test_policy_report_names_the_rule_behind_each_rejection(results):
    r = results["policy-13b-cost"]
    assert r.rejected
    for p in r.rejected:
        assert p.rejected_by and all(v.action == "forbid" for v in p.rejected_by)
    md = report.to_markdown(r)
    assert "## Rejected by policy" in md
    for p in r.rejected:
        assert rejection_text(p) in md


def test_html_is_self_contained(results):
    html = report_html.render(results["policy-13b-cost"])
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in html
    assert html.count("<svg") == 2


@pytest.fixture(scope="module")
def estimate_cases(ctx):
    from fitplan.estimation import evaluate

    cases = {
        "fp32-7b": {"model": "llama-2-7b", "gpu": "a100-80gb", "per_device_train_batch_size": 4},
        "ddp-13b-priced": {"model": "llama-2-13b", "gpu": "h100-sxm", "num_gpus": 8, "precision": "bf16-mixed",
                           "provider": "aws", **DATASET},
    }
    return {k: evaluate(fitplan.scenario_from_dict(v), ctx.registry, ctx.rulesets) for k, v in cases.items()}


@pytest.mark.parametrize("name", ["fp32-7b", "ddp-13b-priced"])
def test_estimate_advice(estimate_cases, snapshot, name):
    from fitplan.assess import assess
    from fitplan.output import estimate_report as render

    a = assess(estimate_cases[name])
    assert {"advice": render.to_json(a)["advice"], "markdown": render.to_markdown(a)} == snapshot


def test_html_renders_in_headless_chromium(results, tmp_path):
    """Skipped without Chromium, except under .ci/run (FITPLAN_REQUIRE_BROWSER=1), where it fails."""
    import importlib.util

    from conftest import chromium_path

    browser = chromium_path()

    spec = importlib.util.spec_from_file_location("html_screenshot", ROOT / "bench" / "html_screenshot.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # the flags are documented there
    html = tmp_path / "report.html"
    html.write_text(report_html.render(results["policy-13b-cost"]), encoding="utf-8")
    png = tmp_path / "report.png"
    subprocess.run([browser, *bench.FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
                    "--window-size=1280,2000", html.as_uri()], check=True, capture_output=True, timeout=120)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000


def test_rendering_evaluates_nothing(results, estimate_cases, monkeypatch):
    """Renderers are pure functions of what they render: the search and the assess step evaluated everything."""
    from fitplan.assess import assess
    from fitplan.engine.graph import CompiledGraph
    from fitplan.engine.staging import StagedGraph
    from fitplan.output import estimate_report
    from fitplan.output.formats import RenderOptions
    from fitplan.pluginmgr.registry import make_registry

    assessments = [assess(e) for e in estimate_cases.values()]
    calls = []
    monkeypatch.setattr(CompiledGraph, "evaluate", lambda self, inputs: calls.append("evaluate"))
    monkeypatch.setattr(StagedGraph, "run", lambda self, v, level: calls.append("run"))
    reg = make_registry(entry_points=False, blocked=())
    for result in results.values():
        for name in reg.format_names("recommend"):
            assert reg.format("recommend", name).render("recommend", result, RenderOptions())
    for a in assessments:
        for name in reg.format_names("estimate"):
            assert reg.format("estimate", name).render("estimate", a, RenderOptions())
        assert estimate_report.to_json(a)["advice"] == [x.to_dict() for x in a.advice]
    assert calls == []
