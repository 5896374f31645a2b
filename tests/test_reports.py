"""Rendered reports, snapshot-tested (syrupy; review every snapshot update as a diff): recommendation
reports in JSON, Markdown, the terminal and HTML on several scenarios, and the estimate reports' advice.
Reports are deterministic: rendering twice gives the same bytes. The HTML report is also opened in
headless Chromium (skipped when it is not installed, except in CI: .ci/run installs it and requires it)."""

from __future__ import annotations

import json
import subprocess
from io import StringIO

import pytest

import fitplan
from fitplan.output.plan_text import rejection_text
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


@pytest.mark.parametrize("fmt", list(RENDERERS))
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_recommend_report(results, snapshot, name, fmt):
    text = RENDERERS[fmt](results[name])
    assert text == RENDERERS[fmt](results[name])  # deterministic
    assert text == snapshot


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
