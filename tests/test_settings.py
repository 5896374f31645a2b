"""Plugin-declared settings (``fitplan/inputs/settings.py``): ``offload_params`` is declared once, by the built-in
offload plugin, and the scenario, the CLI, the search and the exports derive from that declaration.

The expected combinations are written by hand from DeepSpeed's rule: ``offload_param`` is a ZeRO stage-3 option
(deepspeed/runtime/zero/config.py ``offload_param``: "Enable offloading of model parameters to CPU or NVMe. This
frees up GPU memory for larger models or batch sizes. Valid only with stage 3."), and a single GPU shards nothing,
so on one GPU ZeRO-3 is only worth its parameter offload.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import attrs
import pytest

import fitplan
from fitplan.inputs import scenario as sc
from fitplan.inputs import settings

SRC = Path(__file__).resolve().parents[1] / "src" / "fitplan"
DERIVED = ("inputs/scenario.py", "app/options.py", "search/space.py", "search/staged.py", "search/plans.py",
           "search/recommend.py", "output/recommend_report.py", "output/estimate_report.py", "web/api.py",
           "web/params.py", "web/cheapest.py")
"""The modules that list every scenario field or search dimension: they derive the plugin settings."""


def _names_in_code(path: Path) -> set[str]:
    """Identifiers, attributes, keywords and string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            out.update(re.findall(r"\w+", n.value))
        out.update(v for v in (getattr(n, "id", None), getattr(n, "attr", None), getattr(n, "arg", None)) if v)
    return out


def test_offload_params_is_declared_once_by_the_offload_plugin():
    s = settings.declared()["offload_params"]
    assert (s.plugin, s.section, s.type, s.default) == ("fitplan.builtin.sharding", "parallel", "bool", False)
    assert "offload_params" not in {f.name for f in attrs.fields(sc.Parallel)}
    assert [p for p in DERIVED if "offload_params" in _names_in_code(SRC / p)] == []
    declaring = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
                 if re.search(r'Setting\(\s*"offload_params"', p.read_text(encoding="utf-8"))]
    assert declaring == ["builtin/sharding/offload.py"]


def test_offload_params_is_a_field_of_parallel():
    on = fitplan.scenario_from_dict({"parallel": {"zero_stage": 3, "offload_params": True}})
    assert on.parallel.offload_params is True and fitplan.Scenario().parallel.offload_params is False
    assert on == fitplan.Scenario().replace(zero_stage=3, offload_params=True)
    assert fitplan.Scenario().replace(offload_params=False) == fitplan.Scenario()  # a default is not stored
    flat = list(sc.flatten(on))
    assert flat[flat.index("offload_optimizer") + 1] == "offload_params"  # after= places it
    assert (sc.FIELD_SECTION["offload_params"], sc.FIELD_TYPES["offload_params"]) == ("parallel", "bool")
    with pytest.raises(fitplan.FitplanError) as e:
        fitplan.scenario_from_dict({"parallel": {"offload_params": "sometimes"}}, file="plan.toml")
    assert (e.value.message, e.value.file) == ("Parallel.offload_params must be true or false, got 'sometimes'",
                                               "plan.toml")
    with pytest.raises(fitplan.FitplanError) as e:  # where a section keeps its settings is no key of a file
        fitplan.scenario_from_dict({"parallel": {"extra": {"offload_params": True}}})
    assert (e.value.message, e.value.field) == ("unknown key 'extra' in section 'parallel'", "$.parallel.extra")


def test_the_scenario_toml_writes_it_where_the_declaration_puts_it():
    from fitplan.output.exports import scenario_toml

    s = fitplan.Scenario().replace(zero_stage=3, offload_optimizer=True, offload_params=True, precision="bf16-master",
                                   optim="adamw_torch")
    text = scenario_toml(s)
    assert "[parallel]\nzero_stage = 3\noffload_optimizer = true\noffload_params = true\n" in text
    import tomllib

    assert fitplan.scenario_from_dict(tomllib.loads(text)) == s


def test_the_cli_flag_comes_from_the_declaration(cli_in_process):
    proc = cli_in_process("estimate", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--offload-params / --no-offload-params Parameters offloaded to the CPU: DeepSpeed ZeRO-3 offload_param" in text
    assert text.index("--offload-optimizer") < text.index("--offload-params") < text.index("--tensor-parallel")


def _combos(options):
    return [(o["zero_stage"], o["offload_optimizer"], o["offload_params"]) for o in options]


def test_the_shard_options_are_deepspeeds_combinations():
    from fitplan.search.space import SearchSpace, shard_options, simplicity_of

    space = SearchSpace()
    assert _combos(shard_options(space, 1, "32-true", None)) == [(0, False, False), (2, True, False), (3, True, True)]
    many = _combos(shard_options(space, 4, "32-true", None))
    assert sorted(many) == sorted([(0, False, False), (1, False, False), (2, False, False), (3, False, False),
                                   (1, True, False), (2, True, False), (3, True, False), (3, True, True),
                                   (3, False, True)])
    assert [o for o in many if o[2]] == [(3, False, True), (3, True, True)]  # parameter offload: ZeRO-3 only
    assert _combos(shard_options(space, 4, "bf16-mixed", None)) == [(0, False, False)]  # autocast: no DeepSpeed
    assert (0, False, False) not in _combos(shard_options(space, 4, "bf16-master", None))
    assert _combos(shard_options(space, 4, "32-true", "full_shard")) == [(0, False, False)]
    weights = {c: simplicity_of(dict(zip(("zero_stage", "offload_optimizer", "offload_params"), c))) for c in many}
    assert weights[(3, False, False)] == 0 and weights[(3, True, False)] == 1
    assert weights[(3, False, True)] == 2 and weights[(3, True, True)] == 3  # parameter offload weighs 2


def test_a_stated_offload_params_narrows_the_search():
    from fitplan.context import get_context
    from fitplan.search.space import SearchSpace, narrowed, shard_options

    flat = sc.flatten(fitplan.Scenario().replace(offload_params=True))
    space = narrowed(SearchSpace(), flat, {"offload_params"}, get_context().rulesets)
    assert space.settings == (("offload_params", (True,)),)
    assert _combos(shard_options(space, 4, "32-true", None)) == [(3, False, True), (3, True, True)]


def test_a_plan_sets_it_and_says_so():
    from fitplan.output.recommend_report import _sharding
    from fitplan.search.plans import Plan, plan_fields
    from fitplan.search.staged import levels, searched_fields

    fields = plan_fields()
    assert fields[fields.index("offload_optimizer") + 1] == "offload_params"
    assert "offload_params" in levels()[5] and "offload_params" in searched_fields()
    f = dict(gpu="a100-40gb", num_gpus=2, num_nodes=1, method="full", precision="32-true", optim="adamw_torch",
             per_device_train_batch_size=1, gradient_accumulation_steps=8, gradient_checkpointing=False, zero_stage=3,
             offload_optimizer=True, offload_params=True, attn_implementation="sdpa", provider=None)
    plan = Plan(f, "on_demand", 0, 0, None, None, None, None, 2, 0.0, 0)
    assert "DeepSpeed ZeRO-3 · offload optimizer+params" in plan.label
    assert _sharding(plan) == "DeepSpeed ZeRO-3, offload opt., offload params"
    plan.fields.update(offload_optimizer=False)
    assert "ZeRO-3 · offload params" in plan.label
