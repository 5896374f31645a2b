"""Policies and the condition language: operators, unknown values, errors with locations and suggestions,
name checks, the example policy, and rejections that name their rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitplan.rulesets.conditions import Namespace, compile_condition, names_in
from fitplan.errors import FitplanError
from fitplan.rules.policy import PolicySet, load_policy_files
from fitplan.rulesets.schema import PolicyRule

from conftest import ROOT, run_cli, run_in_process, run_json_in_process

EXAMPLE = ROOT / "rulesets" / "examples" / "policy-example.toml"


def vocab():
    from fitplan.pluginmgr.registry import default_registry
    from fitplan.rulesets.conditions import vocabulary

    return vocabulary(default_registry())


def ns(**values) -> Namespace:
    market = values.pop("market", None)
    return Namespace(values, market, None, vocab())


@pytest.mark.parametrize(("cond", "values", "expected"), [
    ({"gt": {"x": 3}}, {"x": 4}, True),
    ({"gt": {"x": 3}}, {"x": 3}, False),
    ({"ge": {"x": 3}}, {"x": 3}, True),
    ({"lt": {"x": 3}}, {"x": 2.5}, True),
    ({"le": {"x": 3}}, {"x": 3.5}, False),
    ({"eq": {"method": "lora"}}, {"method": "lora"}, True),
    ({"ne": {"method": "lora"}}, {"method": "full"}, True),
    ({"in": {"provider": ["aws", "gcp"]}}, {"provider": "gcp"}, True),
    ({"not_in": {"provider": ["aws", "gcp"]}}, {"provider": "lambda"}, True),
    ({"not_in": {"provider": ["aws", "gcp"]}}, {"provider": "aws"}, False),
    ({"all": [{"gt": {"x": 1}}, {"lt": {"x": 5}}]}, {"x": 3}, True),
    ({"all": [{"gt": {"x": 1}}, {"lt": {"x": 5}}]}, {"x": 7}, False),
    ({"any": [{"gt": {"x": 10}}, {"eq": {"y": True}}]}, {"x": 3, "y": True}, True),
    ({"not": {"eq": {"y": True}}}, {"y": False}, True),
    ({"lt": {"x": 5, "y": 2}}, {"x": 1, "y": 3}, False),  # several names in one table: all of them
])
def test_operators(cond, values, expected):
    assert compile_condition(cond).test(ns(**values)) is expected


def test_unknown_values_make_comparisons_false():
    # no price, no GPU: a budget rule does not fire, and neither does its negation's comparison
    assert compile_condition({"gt": {"cost_usd": 10}}).test(ns()) is False
    assert compile_condition({"not_in": {"provider": ["aws"]}}).test(ns(provider=None)) is False
    assert compile_condition({"not": {"gt": {"cost_usd": 10}}}).test(ns()) is True


def test_derived_names():
    values = {"train_seconds": 7200.0, "on_demand_cost_usd": 40.0, "spot_cost_usd": 10.0,
              "headroom_bytes": 8e9, "usable_bytes": 80e9}
    spot = Namespace(values, "spot", None, vocab())
    assert compile_condition({"eq": {"train_hours": 2.0}}).test(spot)
    assert compile_condition({"eq": {"cost_usd": 10.0}}).test(spot)
    assert compile_condition({"eq": {"cost_usd": 40.0}}).test(Namespace(values, "on_demand", None, vocab()))
    assert compile_condition({"eq": {"headroom_fraction": 0.1}}).test(spot)
    assert compile_condition({"eq": {"spot_saving_fraction": 0.75}}).test(spot)
    assert compile_condition({"eq": {"time.seconds": 7200.0}}).test(spot)  # the JSON report's dotted key


@pytest.mark.parametrize(("cond", "message"), [
    ({"gtt": {"x": 1}}, "unknown operator 'gtt' (did you mean 'gt'?) @ condition.gtt"),
    ({}, "a condition is a table with exactly one operator key, got an empty table"),
    ({"gt": {"x": 1}, "lt": {"x": 5}}, "a condition is a table with exactly one operator key, got a table with 2 keys (gt, lt)"),
    ({"all": []}, "'all' takes a non-empty list of conditions, got [] @ condition.all"),
    ({"in": {"provider": "aws"}}, "'in' needs a list of values for 'provider', got 'aws' @ condition.in.provider"),
    ({"gt": {"method": "full"}}, "'gt' compares 'method' with a number, got 'full' @ condition.gt.method"),
    ({"any": [{"eq": {"x": 1}}, {"nott": {"eq": {"x": 1}}}]}, "unknown operator 'nott' (did you mean 'not' or 'not_in'?) @ condition.any[1].nott"),
])
def test_malformed_conditions(cond, message):
    with pytest.raises(FitplanError) as e:
        compile_condition(cond)
    assert e.value.render().startswith(message)


def test_type_mismatch_at_evaluation_names_the_comparison():
    with pytest.raises(FitplanError, match="cannot compare method = 'full' with 3 using 'gt'"):
        compile_condition({"gt": {"method": 3}}).test(ns(method="full"))


def test_names_in_lists_locations():
    cond = {"all": [{"gt": {"cost_usd": 1}}, {"not": {"in": {"gpu": ["t4"]}}}]}
    assert names_in(cond) == [("cost_usd", "condition.all[0].gt.cost_usd"), ("gpu", "condition.all[1].not.in.gpu")]


def test_unknown_names_get_a_suggestion(registry_context):
    rule = PolicyRule(id="r", description="d", condition={"gt": {"peak_byte": 1}})
    with pytest.raises(FitplanError) as e:
        PolicySet([rule], registry_context.registry)
    assert e.value.details == ["policy 'r': unknown name 'peak_byte' (did you mean 'peak_bytes' or 'share_peak_bytes' or 'phase_bytes'?) @ condition.gt.peak_byte"]


def test_penalise_needs_a_penalty():
    with pytest.raises(FitplanError, match="a penalise rule needs penalty > 0"):
        PolicyRule(id="r", description="d", condition={"gt": {"x": 1}}, action="penalise")
    with pytest.raises(FitplanError, match="action must be one of forbid, penalise, got 'penalize'"):
        PolicyRule(id="r", description="d", condition={"gt": {"x": 1}}, action="penalize")


def test_check_reports_every_rule_that_fires_and_the_penalty(registry_context):
    rules = [PolicyRule(id="budget", description="b", condition={"gt": {"cost_usd": 100}}),
             PolicyRule(id="multi", description="m", action="penalise", penalty=0.25, condition={"gt": {"num_nodes": 1}}),
             PolicyRule(id="slow", description="s", action="penalise", penalty=0.5, condition={"gt": {"train_hours": 1}})]
    ps = PolicySet(rules, registry_context.registry)
    fired, factor = ps.check(Namespace({"on_demand_cost_usd": 150.0, "num_nodes": 2, "train_seconds": 7200.0}, "on_demand",
                                       None, ps.vocabulary))
    assert [v.rule for v in fired] == ["budget", "multi", "slow"]
    assert factor == pytest.approx(1.25 * 1.5)
    assert fired[0].reason == "cost_usd = 150 > 100"


def test_example_policy_file_is_valid_and_not_auto_loaded(registry_context):
    rules, origin = load_policy_files([EXAMPLE])
    assert [r.id for r in rules] == ["approved-providers", "approved-gpus", "spot-short-runs-only", "budget", "deadline",
                                     "min-headroom", "methods", "prefer-single-node"]
    assert set(origin.values()) == {str(EXAMPLE)}
    PolicySet(rules, registry_context.registry)  # every name is known
    assert registry_context.rulesets.policies == {}  # rulesets/examples is skipped in the bundled directory


def test_policy_file_errors(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('[[policy]]\nid = "x"\ndescription = "d"\ncondition = { gtt = { cost_usd = 1 } }\n')
    proc = run_cli("rulesets", "check", str(bad))
    assert proc.returncode == 2
    assert "unknown operator 'gtt' (did you mean 'gt'?) @ $.policy[0].condition.gtt" in proc.stderr
    empty = tmp_path / "e.toml"
    empty.write_text('[[gpu]]\nid = "g"\nname = "G"\nmemory_bytes = 1\nusable_bytes = 1\npeak_tflops = {}\n'
                     'bandwidth_gbps = 1\nsource = "s"\n')
    with pytest.raises(FitplanError, match="no \\[\\[policy\\]\\] rules in this file"):
        load_policy_files([empty])


def test_rulesets_check_reports_unknown_names(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[[policy]]\nid = "x"\ndescription = "d"\ncondition = { gt = { train_hour = 1 } }\n')
    proc = run_in_process("rulesets", "check", str(f))
    assert proc.returncode == 2
    # the closest names first (difflib): train_hours, then others of the vocabulary
    assert f"{f}: policy 'x': unknown name 'train_hour' (did you mean 'train_hours' or " in proc.stderr
    assert "?) @ condition.gt.train_hour" in proc.stderr


def test_recommend_names_the_rule_behind_each_rejection(tmp_path):
    # spot only under 1 hour, and a budget: llama-2-7b LoRA on one GPU takes hours (hand check: 102.4M tokens)
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[policy]]\nid = "no-long-spot"\ndescription = "spot only under 1 h"\naction = "forbid"\n'
        'condition = { all = [ { eq = { market = "spot" } }, { ge = { train_hours = 1 } } ] }\n'
        '[[policy]]\nid = "budget"\ndescription = "at most $40"\naction = "forbid"\ncondition = { gt = { cost_usd = 40 } }\n')
    proc = run_in_process("recommend", "--model", "llama-2-7b", "--num-examples", "50000", "--tokens-per-example", "1024",
                   "--num-train-epochs", "2", "--method", "lora", "--gpus", "a100-80gb,h100-sxm", "--providers", "aws,seed",
                   "--policy", str(policy), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {p["id"] for p in data["policies"]} == {"no-long-spot", "budget"}
    for plan in data["plans"]:
        assert plan["cost_usd"] <= 40
        assert not (plan["market"] == "spot" and plan["train_seconds"] >= 3600)
    assert data["rejected"], "some plan must be rejected"
    for plan in data["rejected"]:
        rules = {r["rule"] for r in plan["rejected_by"]}
        assert rules <= {"no-long-spot", "budget"} and rules
        if "no-long-spot" in rules:
            assert plan["market"] == "spot" and plan["train_seconds"] >= 3600
        if "budget" in rules:
            assert plan["cost_usd"] > 40
        assert all(r["reason"] for r in plan["rejected_by"])
    counts = data["search"]["rejected_by"]
    assert sum(counts.values()) == data["search"]["rejected"] > 0


def test_policy_from_a_ruleset_dir(tmp_path):
    (tmp_path / "org.toml").write_text(
        '[[policy]]\nid = "no-qlora"\ndescription = "no 4-bit"\naction = "forbid"\ncondition = { eq = { method = "qlora" } }\n')
    proc = run_in_process("recommend", "--model", "llama-2-7b", "--gpus", "a100-80gb", "--providers", "aws", "--objective", "gpus",
                   "--vary", "method", "--ruleset-dir", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [p["id"] for p in data["policies"]] == ["no-qlora"]
    sides = {s["values"]["method"]: s for s in data["sides"]}
    assert sides["full"]["plans"] and sides["lora"]["plans"] and not sides["qlora"]["plans"]
    assert all(p["plan"]["method"] == "qlora" for p in sides["qlora"]["rejected"])
    assert data["search"]["rejected_by"]["no-qlora"] > 0


def test_missing_policy_file_is_a_user_error():
    proc = run_in_process("recommend", "--model", "llama-2-7b", "--policy", "nope.toml")
    assert proc.returncode == 2
    assert "nope.toml: policy file not found @ --policy" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def registry_context():
    from fitplan.context import get_context
    from fitplan.pluginmgr.registry import make_registry

    return get_context((), make_registry(entry_points=False, blocked=()))


def test_example_path_exists():
    assert Path(EXAMPLE).is_file()


def test_estimate_checks_a_scenario_against_policies():
    # 8 × H100 on AWS p5: 500,000 × 1,024 tokens of llama-2-13b LoRA take hours; spot is forbidden from 2 h
    args = ("estimate", "--model", "llama-2-13b", "--method", "lora", "--precision", "bf16-true", "--gpu", "h100-sxm",
            "--num-gpus", "8", "--provider", "aws", "--num-examples", "500000", "--tokens-per-example", "1024",
            "--policy", str(EXAMPLE))
    proc = run_in_process(*args, "--format", "json")
    data = json.loads(proc.stdout)
    hours = data["time"]["seconds"] / 3600
    fired = {(v["rule"], v["market"]) for v in data["policy"]}
    on_demand_forbidden = any(m == "on_demand" for _, m in fired)  # spot only forbidden: on demand still allowed
    assert proc.returncode == (3 if on_demand_forbidden and any(m == "spot" for _, m in fired) else 0), proc.stderr
    assert (("spot-short-runs-only", "spot") in fired) == (hours >= 2)
    assert ("spot-short-runs-only", "on_demand") not in fired
    assert (("budget", "on_demand") in fired) == (data["cost"]["on_demand_usd"] > 100)
    table = run_in_process(*args)
    assert "policy spot-short-runs-only (forbid, spot)" in table.stdout or hours < 2
    plain = run_json_in_process("estimate", "--model", "llama-2-7b")
    assert "policy" not in plain  # no policy in force: no section


def test_report_says_when_policies_reject_every_fitting_plan(tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[[policy]]\nid = "nothing"\ndescription = "forbid all"\ncondition = { ge = { world_size = 1 } }\n')
    proc = run_in_process("recommend", "--model", "llama-2-7b", "--gpus", "h100-sxm", "--providers", "aws", "--method", "lora",
                   "--num-examples", "1000", "--tokens-per-example", "512", "--policy", str(policy), "--format", "markdown")
    assert proc.returncode == 0, proc.stderr
    assert "_No plan is allowed: " in proc.stdout and "the policies reject every one of them" in proc.stdout
    assert "nothing: world_size = " in proc.stdout


def _policy(tmp_path, body):
    f = tmp_path / "p.toml"
    f.write_text(body)
    return str(f)


PRICED = ("estimate", "--model", "llama-2-7b", "--method", "lora", "--gpu", "a100-80gb", "--provider", "aws",
          "--num-examples", "1000", "--tokens-per-example", "512")


def test_estimate_exit_status_3_when_the_policy_forbids_the_scenario(tmp_path):
    """docs/policies.md: exit 3 when forbid rules fire in every market the scenario is priced in; the report
    is still written (stdout), the rules named on stderr; 2 stays for bad input."""
    p = _policy(tmp_path, '[[policy]]\nid = "no-aws"\ndescription = "d"\ncondition = { eq = { provider = "aws" } }\n')
    proc = run_in_process(*PRICED, "--policy", p, "--format", "json")
    assert proc.returncode == 3
    assert {v["rule"] for v in json.loads(proc.stdout)["policy"]} == {"no-aws"}
    assert "forbidden by no-aws" in proc.stderr and "Traceback" not in proc.stderr
    unpriced = run_in_process("estimate", "--model", "llama-2-7b", "--policy", _policy(
        tmp_path, '[[policy]]\nid = "no-full"\ndescription = "d"\ncondition = { eq = { method = "full" } }\n'))
    assert unpriced.returncode == 3


def test_estimate_exit_status_0_when_a_market_remains_or_only_penalties(tmp_path):
    spot_only = _policy(tmp_path, '[[policy]]\nid = "no-spot"\ndescription = "d"\ncondition = { eq = { market = "spot" } }\n'
                                  '[[policy]]\nid = "pricey"\ndescription = "d"\naction = "penalise"\npenalty = 1\n'
                                  'condition = { eq = { provider = "aws" } }\n')
    proc = run_in_process("estimate", "--model", "llama-2-13b", "--method", "lora", "--gpu", "h100-sxm", "--num-gpus", "8",
                   "--provider", "aws", "--num-examples", "1000", "--tokens-per-example", "512",
                   "--policy", spot_only, "--format", "json")  # p5: priced on demand and spot
    assert proc.returncode == 0, proc.stderr
    fired = {(v["rule"], v["market"]) for v in json.loads(proc.stdout)["policy"]}
    assert fired == {("no-spot", "spot"), ("pricey", "spot"), ("pricey", "on_demand")}


def test_rulesets_check_reports_schema_and_name_errors_of_every_file_at_once(tmp_path):
    bad_schema = tmp_path / "a.toml"
    bad_schema.write_text('[[gpu]]\nid = "x"\nname = "X"\nmemory_bytes = -1\nusable_bytes = 1\npeak_tflops = {bf16 = 1}\n'
                          'bandwidth_gbps = 1\nsource = "s"\n')
    bad_name = tmp_path / "b.toml"
    bad_name.write_text('[[policy]]\nid = "x"\ndescription = "d"\ncondition = { gt = { train_hour = 1 } }\n')
    proc = run_in_process("rulesets", "check", str(bad_schema), str(bad_name))
    assert proc.returncode == 2
    assert f"{bad_schema}: GPU.memory_bytes must be > 0, got -1 @ $.gpu[0].memory_bytes" in proc.stderr
    assert f"{bad_name}: policy 'x': unknown name 'train_hour'" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "2 error(s)"
