"""What `fitplan recommend` varies by default, and what it checks before calling a plan runnable.

By default only what leaves the trained model the same is searched (hardware, provider and instance, batch split,
checkpointing, sharding and offload, attention kernel): method, optimizer and precision stay the scenario's,
and `--vary` shows each value's plans side by side. On demand unless spot is asked for. A plan whose CPU offload
needs more host RAM than its instance states does not fit; instances that state no network are never combined.
Every test states `optim` and `precision` (their defaults move with the pinned stack).
"""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fitplan
from fitplan.inputs import scenario as sc
from fitplan.inputs.precision import hf_precision
from fitplan.search import recommend as rec
from fitplan.search.plans import plan_scenario
from fitplan.search.space import SearchSpace, precision_twins

from conftest import run_cli

JOB = ("--model", "llama-3.1-8b", "--num-examples", "100000", "--tokens-per-example", "1024", "--num-train-epochs", "3",
       "--objective", "cost")
HF_BF16 = {"bf16-mixed", "bf16-master"}
"""The HF Trainer's ``bf16=True`` over fp32 weights: autocast without DeepSpeed, DeepSpeed's bf16 optimizer (fp32
master weights) under it (fitplan.inputs.precision.hf_precision): one training semantics."""


@pytest.fixture(scope="module")
def ctx():
    from fitplan.context import get_context
    from fitplan.pluginmgr.registry import make_registry

    return get_context((), make_registry(entry_points=False, blocked=()))


def _json(*args: str) -> dict:
    proc = run_cli("recommend", *args, "--format", "json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _host_ram_ok(est) -> bool:
    """Each rank's offload bytes × the ranks on one instance ≤ the instance's stated RAM (GiB), when stated."""
    choice = est.role("instance")
    if choice is None or choice.instance.host_memory_gib is None:
        return True
    n = est.values["num_gpus"]
    need = est.values["cpu_offload_bytes"] // n * min(n, choice.instance.gpus)
    return need <= choice.instance.host_memory_gib * 2**30


def _network_stated(est) -> bool:
    choice = est.role("instance")
    return choice is None or choice.count == 1 or choice.instance.network_gbps is not None


# --------------------------------------------------------------------------- the user's job


def test_the_job_keeps_full_fine_tuning_its_optimizer_and_precision_on_demand():
    data = _json(*JOB, "--optim", "adamw_torch", "--precision", "bf16-mixed", "--top", "5")
    assert "sides" not in data and data["plans"]
    for p in data["plans"] + data["pareto_front"]:
        assert p["plan"]["method"] == "full" and p["plan"]["optim"] == "adamw_torch"
        assert p["plan"]["precision"] in HF_BF16
        # bf16-master only under DeepSpeed (a ZeRO stage or offload), bf16-mixed only without
        deepspeed = p["plan"]["zero_stage"] > 0 or p["plan"]["offload_optimizer"] or p["plan"]["offload_params"]
        assert (p["plan"]["precision"] == "bf16-master") == deepspeed
        assert p["market"] == "on_demand" and p["cost_usd"] == p["cost"]["on_demand_usd"]
        assert p["memory"]["fits"] is True


def test_the_job_without_optim_or_precision_keeps_the_scenarios_defaults():
    """The scenario's own defaults (read from the scenario class, not from the search) are kept: the default
    optimizer, and the precision the HF words give on Llama-3.1-8B's bf16 checkpoint without a flag (trained in
    bf16 as loaded; under DeepSpeed, ZeRO's fp32 partitions of the bf16 weights: bf16-master)."""
    default = sc.flatten(fitplan.scenario_from_dict({}))
    data = _json(*JOB, "--top", "3")
    assert data["plans"]
    for p in data["plans"]:
        assert p["plan"]["method"] == default["method"] == "full"
        assert p["plan"]["optim"] == default["optim"]
        deepspeed = p["plan"]["zero_stage"] > 0 or p["plan"]["offload_optimizer"] or p["plan"]["offload_params"]
        assert p["plan"]["precision"] == hf_precision(None, "bf16", deepspeed=deepspeed)
        assert p["market"] == "on_demand"


def test_vary_method_shows_full_lora_and_qlora_side_by_side():
    data = _json(*JOB, "--optim", "adamw_torch", "--precision", "bf16-mixed", "--vary", "method", "--top", "2")
    assert data["vary"] == ["method"] and data["plans"] == [] and data["pareto_front"] == []
    sides = {s["values"]["method"]: s for s in data["sides"]}
    assert set(sides) == {"full", "lora", "qlora"}
    for method, side in sides.items():
        assert side["plans"], method
        assert side["best"] == side["plans"][0]
        costs = [p["cost_usd"] for p in side["plans"]]
        assert costs == sorted(costs)  # ranked within the side only
        for p in side["plans"] + side["pareto_front"]:
            assert p["plan"]["method"] == method and p["plan"]["optim"] == "adamw_torch"
            assert p["plan"]["precision"] in HF_BF16 and p["market"] == "on_demand"


def test_every_report_shows_the_sides_side_by_side(ctx):
    from fitplan.output import recommend_html, recommend_report
    from fitplan.output.formats import RenderOptions

    base = fitplan.scenario_from_dict({"model": "qwen2.5-0.5b", "num_examples": 2000, "tokens_per_example": 512,
                                       "optim": "adamw_torch", "precision": "bf16-mixed"})
    space = SearchSpace(methods=("full", "lora", "qlora"), gpus=("a100-80gb",), providers=("aws", "lambda"))
    res = rec.search(base, ctx, space=space, objective="cost", top=2,
                     fixed={"model", "num_examples", "tokens_per_example", "optim", "precision"})
    rec.attach_estimates(res, ctx)
    assert [s.values for s in res.sides] == [{"method": "full"}, {"method": "lora"}, {"method": "qlora"}]
    costs = {s.values["method"]: s.plans[0].cost_usd for s in res.sides}
    md = recommend_report.to_markdown(res)
    summary = f"full ${costs['full']:,.2f} · lora ${costs['lora']:,.2f} · qlora ${costs['qlora']:,.2f}"
    assert "## Side by side" in md and summary in md
    for m in ("full", "lora", "qlora"):
        assert f"## Ranked plans: method {m}" in md
    assert "## Ranked plans\n" not in md  # no ranking mixing the methods
    html = recommend_html.render(res)
    assert "<h2>Side by side</h2>" in html and summary in html and "Ranked plans: method qlora" in html
    text = recommend_report.to_terminal(res, RenderOptions(width=250))
    assert "Side by side" in text and summary in text and "Ranked plans: method lora" in text


# --------------------------------------------------------------------------- user errors


def test_vary_an_unknown_dimension_names_the_valid_ones():
    proc = run_cli("recommend", "--model", "llama-2-7b", "--objective", "gpus", "--vary", "method,colour")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'colour'" in proc.stderr and "--vary" in proc.stderr
    for name in ("method", "optim", "precision"):
        assert name in proc.stderr.split("'colour'")[1]


def test_vary_a_field_the_user_fixed_is_refused():
    proc = run_cli("recommend", "--model", "llama-2-7b", "--objective", "gpus", "--method", "lora", "--vary", "method")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "fixes method" in proc.stderr


def test_emit_with_vary_is_refused(tmp_path):
    proc = run_cli("recommend", "--model", "qwen2.5-0.5b", "--objective", "gpus", "--gpus", "a100-80gb", "--vary",
                   "method", "--optim", "adamw_torch", "--precision", "bf16-mixed", "--emit", "scenario", str(tmp_path))
    assert proc.returncode == 2 and "--emit writes one plan" in proc.stderr and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- host RAM and the network

RULESET = """
[[gpu]]
id = "ramgpu"
name = "RAM test GPU"
memory_bytes = 200_000_000_000
usable_bytes = 200_000_000_000
bandwidth_gbps = 1000
interconnect_gbps = 100
gpus_per_node = 8
peak_tflops = {{ fp32 = 50, bf16 = 500 }}
source = "test fixture"

[[provider]]
id = "ramcloud"
name = "RAM cloud"
billing = "second"
minimum_seconds = 0
source = "test fixture"

[[instance]]
provider = "ramcloud"
id = "one"
gpu = "ramgpu"
gpus = 1
on_demand_per_hour = 1.0
source = "test fixture"
{one}

[[instance]]
provider = "ramcloud"
id = "two"
gpu = "ramgpu"
gpus = 2
on_demand_per_hour = 2.5
source = "test fixture"
"""
OFFLOAD_JOB = dict(params="1B", gpu="ramgpu", provider="ramcloud", method="full", optim="adamw_torch",
                   precision="32-true", zero_stage=3, offload_optimizer=True, offload_params=True, total_tokens=1_000_000)
ONE_GPU = SearchSpace(gpus=("ramgpu",), gpu_counts=(1,), num_nodes=(1,), attn_implementations=("sdpa",),
                      checkpointing=(False,), effective_batch_size=1)


def _search(tmp_path, one: str, job: dict, space: SearchSpace):
    from fitplan.context import get_context

    d = tmp_path / f"rules{len(list(tmp_path.iterdir()))}"  # a folder per ruleset: contexts are cached per folder
    d.mkdir()
    (d / "ram.toml").write_text(RULESET.format(one=one))
    ctx = get_context((str(d),))
    res = rec.search(fitplan.scenario_from_dict(job), ctx, space=space, objective="cost", fixed=set(job))
    rec.attach_estimates(res, ctx)
    return res


def test_an_instance_with_less_host_ram_than_the_offload_needs_does_not_fit(tmp_path):
    # ZeRO-3 offloading the optimizer keeps Adam's two fp32 states per parameter on the host (DeepSpeedCPUAdam:
    # deepspeed/ops/adam/cpu_adam.py, exp_avg and exp_avg_sq): at least 8 B × 1e9 = 8e9 bytes for 1B parameters,
    # more than 4 GiB (4.29e9 bytes) and far less than 4096 GiB.
    small = _search(tmp_path, "host_memory_gib = 4", OFFLOAD_JOB, ONE_GPU)
    assert small.plans == [] and small.stats.candidates == 1
    assert small.stats.too_big == small.stats.too_big_host_ram == 1
    big = _search(tmp_path, "host_memory_gib = 4096", OFFLOAD_JOB, ONE_GPU)
    assert len(big.plans) == 1 and big.stats.too_big_host_ram == 0 and not big.plans[0].notes
    assert big.plans[0].estimate.values["cpu_offload_bytes"] >= 8 * 10**9


def test_an_offload_plan_on_an_instance_without_stated_host_ram_is_not_proposed(tmp_path):
    # nobody could check the CPU offload's host memory before launching it: not a plan an expert would sign
    res = _search(tmp_path, "", OFFLOAD_JOB, ONE_GPU)
    assert res.plans == [] and res.stats.host_ram_unstated == 1
    assert any("states no host RAM" in n and "not proposed" in n for n in res.stats.notes)
    plain = _search(tmp_path, "", {**OFFLOAD_JOB, "zero_stage": 0, "offload_optimizer": False, "offload_params": False},
                    ONE_GPU)
    assert plain.plans and not plain.plans[0].notes and plain.stats.host_ram_unstated == 0  # no offload: nothing to check


TWO_GPUS = attrs.evolve(ONE_GPU, gpu_counts=(2,), effective_batch_size=2, zero_stages=(0,), offload_optimizer=(False,),
                        settings=(("offload_params", (False,)),))


def test_instances_that_state_no_network_are_never_combined(tmp_path):
    # two GPUs: one "two" instance, or two "one" instances talking over the network
    job = {k: v for k, v in OFFLOAD_JOB.items() if k not in ("zero_stage", "offload_optimizer", "offload_params")}
    res = _search(tmp_path, "", job, TWO_GPUS)
    assert res.stats.candidates == 1 and res.plans
    assert all(p.estimate.role("instance").instance.id == "two" for p in res.plans)
    assert any("ramcloud/one" in n and "no network" in n for n in res.stats.notes)
    networked = _search(tmp_path, "network_gbps = 12.5", job, TWO_GPUS)
    assert networked.stats.candidates == 2  # both shapes priced once the network is stated
    assert not any("no network" in n for n in networked.stats.notes)


# --------------------------------------------------------------------------- random small jobs

MODELS = ("qwen2.5-0.5b", "smollm2-360m", "llama-3.2-1b")
GPUS = ("a10g", "l4", "rtx-4090", "a100-80gb", "h100-sxm")
RESULT_FIELDS = ("method", "optim", "lora_r", "lora_alpha", "lora_target_modules", "max_seq_length")


@st.composite
def small_jobs(draw):
    job = {"model": draw(st.sampled_from(MODELS)), "num_examples": draw(st.integers(500, 20_000)),
           "tokens_per_example": draw(st.sampled_from((256, 512))),
           "method": draw(st.sampled_from(sc.METHODS)), "optim": draw(st.sampled_from(("adamw_torch", "adamw_8bit",
                                                                                       "adafactor"))),
           "precision": draw(st.sampled_from(("bf16-mixed", "bf16-master", "bf16-true", "32-true")))}
    zero = draw(st.sampled_from((None, 0, 2, 3)))
    if zero is not None:
        job["zero_stage"] = zero
    space = SearchSpace(gpus=tuple(draw(st.lists(st.sampled_from(GPUS), min_size=1, max_size=2, unique=True))),
                        max_gpus=draw(st.sampled_from((1, 2, 8, 16))), num_nodes=(1, 2),
                        effective_batch_size=draw(st.sampled_from((4, 8, 16))),
                        markets=draw(st.sampled_from((("on_demand",), ("on_demand", "spot")))))
    return job, space


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
@given(small_jobs())
def test_plans_fit_the_host_use_stated_networks_and_keep_what_the_user_fixed(ctx, case):
    job, space = case
    base = fitplan.scenario_from_dict(job)
    res = rec.search(base, ctx, space=space, objective="cost", top=3, fixed=set(job))
    rec.attach_estimates(res, ctx)
    given_ = sc.flatten(base)
    for plan in res.all_plans():
        assert _host_ram_ok(plan.estimate), plan.label
        assert _network_stated(plan.estimate), plan.label
        if space.markets == ("on_demand",):
            assert plan.market == "on_demand"
    if not res.plans:
        return
    first = sc.flatten(plan_scenario(res.base, res.plans[0]))
    for field in set(job) | set(RESULT_FIELDS):
        if field == "precision":  # the same training semantics: the preset, or its twin under DeepSpeed
            assert first[field] in precision_twins(given_[field]), field
        else:
            assert first[field] == given_[field], field
    dp = first["num_gpus"] * first["num_nodes"] // first["tensor_parallel"]
    assert first["per_device_train_batch_size"] * first["gradient_accumulation_steps"] * dp == space.effective_batch_size


def test_bf16_flag_on_a_bf16_checkpoint_keeps_its_weights():
    """TrainingArguments(bf16=True) over Llama-3.2-1B's bf16 checkpoint (from_pretrained dtype="auto") is bf16
    autocast over bf16 weights (hf_precision: bf16-autocast), or DeepSpeed's bf16 optimizer (bf16-master) under
    DeepSpeed: the recommender keeps that, never bf16-mixed (fp32 weights), with the flag alone or with
    --dtype bfloat16 stated too."""
    for extra in ((), ("--dtype", "bfloat16")):
        out = _json("--model", "llama-3.2-1b", "--bf16", *extra, "--num-examples", "1000", "--tokens-per-example",
                    "512", "--top", "5")
        precisions = {p["plan"]["precision"] for p in out["plans"] + out["pareto_front"]}
        assert precisions and precisions <= {"bf16-autocast", "bf16-master"}, precisions
