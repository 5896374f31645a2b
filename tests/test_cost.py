"""Cost: instance choice, billing granularity, spot overhead, runs, currency; the seed's examples.

Expected amounts are derived by hand in the comments (price × billed hours), from the fixture rulesets
written here or from the seed chapter's price table (rulesets/pricing/seed.toml).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fitplan
from fitplan.errors import FitplanError

ROOT = Path(__file__).resolve().parents[1]

FIXTURE = """
[[gpu]]
id = "testgpu"
name = "Test GPU"
memory_bytes = 100_000_000_000
usable_bytes = 100_000_000_000
bandwidth_gbps = 1000
peak_tflops = { fp32 = 10, bf16 = 100 }
source = "test fixture"

[[gpu]]
id = "othergpu"
name = "Other GPU"
memory_bytes = 100_000_000_000
usable_bytes = 100_000_000_000
bandwidth_gbps = 1000
peak_tflops = { fp32 = 10, bf16 = 100 }
source = "test fixture"

[[provider]]
id = "acme"
name = "Acme Cloud"
billing = "minute"
minimum_seconds = 120
spot_overhead = 0.25
source = "test fixture"

[[provider]]
id = "hourly"
name = "Hourly Cloud"
billing = "hour"
minimum_seconds = 0
spot_overhead = 0.0
source = "test fixture"

[[instance]]
provider = "acme"
id = "a1"
gpu = "testgpu"
gpus = 1
on_demand_per_hour = 2.0
spot_per_hour = 0.5
region = "r1"
source = "test"

[[instance]]
provider = "acme"
id = "a4"
gpu = "testgpu"
gpus = 4
on_demand_per_hour = 6.0
region = "r1"
source = "test"

[[instance]]
provider = "acme"
id = "a4"
gpu = "testgpu"
gpus = 4
on_demand_per_hour = 7.0
spot_per_hour = 2.0
region = "r2"
source = "test"

[[instance]]
provider = "acme"
id = "a8"
gpu = "testgpu"
gpus = 8
on_demand_per_hour = 14.0
region = "r1"
source = "test"

[[instance]]
provider = "acme"
id = "o1"
gpu = "othergpu"
gpus = 1
on_demand_per_hour = 1.0
region = "r1"
source = "test"

[[instance]]
provider = "hourly"
id = "h1"
gpu = "testgpu"
gpus = 1
on_demand_per_hour = 3.0
spot_per_hour = 1.0
region = "x"
source = "test"
"""


def est(rdir=None, **kw):
    return fitplan.estimate(ruleset_dirs=[rdir] if rdir else [], **kw)


def run(rdir, seconds, **kw):
    """A run of exactly `seconds` seconds: `seconds` tokens at 1 token/s."""
    return est(rdir, params="1B", gpu="testgpu", provider="acme", total_tokens=seconds, tokens_per_second=1, **kw)


# --------------------------------------------------------------------------- the seed chapter


def test_seed_four_hours_cost_16_and_4_80():
    # "4 heures sur A100-40GB: 4 × $4.00 = $16 (à la demande), 4 × $1.20 = $4.80 (spot)":
    # 14,400,000 tokens at 1,000 tokens/s = 14,400 s = 4 h
    e = est(params="7B", gpu="a100-40gb", provider="seed", total_tokens=14_400_000, tokens_per_second=1000)
    assert e["train_seconds"] == pytest.approx(4 * 3600)
    assert e["on_demand_cost_usd"] == pytest.approx(16.00)
    assert e["spot_cost_usd"] == pytest.approx(4.80)
    assert e["cost_currency"] == "USD"


def test_seed_five_runs_cost_80_and_24():
    # "Avec expérimentation (5 exécutions): $80 (à la demande) ou $24 (spot)"
    e = est(params="7B", gpu="a100-40gb", provider="seed", total_tokens=14_400_000, tokens_per_second=1000, runs=5)
    assert e["on_demand_cost_usd"] == pytest.approx(80.00)
    assert e["spot_cost_usd"] == pytest.approx(24.00)
    assert e["gpu_hours"] == pytest.approx(20)


def test_seed_time_example_priced_without_rounding_down():
    # the time example's 15,360 s (4.267 h) at the seed's per-second billing: 15,360 / 3,600 × 4.00 = 17.0667
    # and × 1.20 = 5.12 (the chapter rounds the time down to "4 heures")
    e = est(model="llama-2-7b", gpu="a100-40gb", provider="seed", num_examples=10_000, tokens_per_example=512,
            num_train_epochs=3, throughput_source="seed")
    assert e["train_seconds"] == pytest.approx(15_360)
    assert e["on_demand_cost_usd"] == pytest.approx(15_360 / 3600 * 4.00)
    assert e["spot_cost_usd"] == pytest.approx(5.12)


# --------------------------------------------------------------------------- instance choice


@pytest.mark.parametrize("gpus, instance, count", [
    (1, "a1", 1),   # a1 2.00 < a4 6.00 < a8 14.00
    (3, "a1", 3),   # a1 × 3 = 6.00 ties a4 6.00: fewer GPUs paid (3 < 4)
    (4, "a4", 1),   # a4 6.00 < a1 × 4 = 8.00
    (5, "a1", 5),   # a1 × 5 = 10.00 < a4 × 2 = 12.00 < a8 14.00
    (7, "a4", 2),   # a4 × 2 = 12.00 < a1 × 7 = 14.00 = a8 14.00
    (16, "a4", 4),  # a4 × 4 = 24.00 < a8 × 2 = 28.00 < a1 × 16 = 32.00
])
def test_cheapest_whole_instances(rdir, gpus, instance, count):
    plan = run(rdir, 3600, num_gpus=gpus)["instance_choice"]
    assert (plan.instance.id, plan.count, plan.instance.region) == (instance, count, "r1")


def test_pay_for_whole_instances(rdir):
    # 7 GPUs for one hour on 2 × a4 (r1, 6.00/h each): 12.00; 8 GPUs paid; GPU-hours used: 7
    e = run(rdir, 3600, num_gpus=7)
    assert e["on_demand_cost_usd"] == pytest.approx(12.0)
    assert e["instance_choice"].gpus_paid == 8
    assert e["gpu_hours"] == pytest.approx(7)


def test_nodes_are_rented_separately(rdir):
    # 2 nodes × 2 GPUs: per node ceil(2 / 1) a1 = 2 × 2.00, or one a4 at 6.00 -> 2 nodes × 2 a1 = 4 × 2.00 = 8.00/h
    e = run(rdir, 3600, num_gpus=2, num_nodes=2)
    assert (e["instance_choice"].instance.id, e["instance_choice"].count) == ("a1", 4)
    assert e["on_demand_cost_usd"] == pytest.approx(8.0)


def test_forced_instance_and_region(rdir):
    e = run(rdir, 3600, num_gpus=2, instance="a8")
    assert (e["instance_choice"].instance.id, e["instance_choice"].count) == ("a8", 1)
    assert e["on_demand_cost_usd"] == pytest.approx(14.0)
    e = run(rdir, 3600, num_gpus=4, region="r2")
    assert (e["instance_choice"].instance.id, e["instance_choice"].instance.region) == ("a4", "r2")
    assert e["on_demand_cost_usd"] == pytest.approx(7.0)
    assert e["spot_cost_usd"] == pytest.approx(2.0 * 1.25)  # spot time +25 %: 75 minutes at 2.00/h


def test_instance_errors(rdir):
    with pytest.raises(FitplanError, match="unknown instance of provider 'acme' 'a9'"):
        run(rdir, 3600, instance="a9")
    with pytest.raises(FitplanError, match="instance acme/o1 has 1 × othergpu, not testgpu"):
        run(rdir, 3600, instance="o1")
    with pytest.raises(FitplanError, match="unknown region"):
        run(rdir, 3600, region="r9")


def test_provider_without_the_gpu_lists_what_it_offers(rdir):
    with pytest.raises(FitplanError) as info:
        est(rdir, params="1B", gpu="testgpu", provider="seed", total_tokens=100, tokens_per_second=1)
    assert "provider 'seed' has no instance with GPU 'testgpu'" in info.value.message
    assert info.value.suggestion == "it offers: a100-40gb, a100-80gb, a10g, h100-sxm, t4"
    with pytest.raises(FitplanError, match="unknown provider 'acmee'"):
        est(rdir, params="1B", gpu="testgpu", provider="acmee", total_tokens=100, tokens_per_second=1)


# --------------------------------------------------------------------------- billing


def test_minute_billing_and_spot_overhead(rdir):
    # 15,360 s = 256 minutes exactly: 15,360 / 3,600 × 2.00 = 8.5333; spot: 15,360 × 1.25 = 19,200 s = 320 min,
    # 19,200 / 3,600 × 0.50 = 2.6667
    e = run(rdir, 15_360)
    assert e["billed_seconds_on_demand"] == 15_360
    assert e["on_demand_cost_usd"] == pytest.approx(15_360 / 3600 * 2.0)
    assert e["billed_seconds_spot"] == 19_200
    assert e["spot_cost_usd"] == pytest.approx(19_200 / 3600 * 0.5)
    # 61 s rounds up to 2 minutes; 10 s is lifted to the 120 s minimum
    assert run(rdir, 121)["billed_seconds_on_demand"] == 180
    assert run(rdir, 10)["billed_seconds_on_demand"] == 120
    assert run(rdir, 10)["on_demand_cost_usd"] == pytest.approx(120 / 3600 * 2.0)


def test_hourly_billing_rounds_up(rdir):
    # 15,360 s is 4.27 h: billed 5 h × 3.00 = 15.00 on demand, 5 h × 1.00 = 5.00 spot (no overhead)
    e = est(rdir, params="1B", gpu="testgpu", provider="hourly", total_tokens=15_360, tokens_per_second=1)
    assert e["on_demand_cost_usd"] == pytest.approx(15.0)
    assert e["spot_cost_usd"] == pytest.approx(5.0)
    # exactly 4 h is 4 h, not 5
    assert est(rdir, params="1B", gpu="testgpu", provider="hourly", total_tokens=14_400,
               tokens_per_second=1)["on_demand_cost_usd"] == pytest.approx(12.0)


def test_no_spot_price_gives_null(rdir):
    e = run(rdir, 3600, num_gpus=4)  # a4 in r1 has no spot price
    assert e["on_demand_cost_usd"] == pytest.approx(6.0)
    assert e["spot_cost_usd"] is None


def test_runs_multiply(rdir):
    one, five = run(rdir, 3600), run(rdir, 3600, runs=5)
    assert five["on_demand_cost_usd"] == pytest.approx(5 * one["on_demand_cost_usd"]) == pytest.approx(10.0)
    assert five["gpu_hours"] == pytest.approx(5)


def test_nulls_without_provider_or_gpu(rdir):
    e = est(rdir, params="1B", gpu="testgpu", total_tokens=3600, tokens_per_second=1)
    assert e["gpu_hours"] == pytest.approx(1)
    assert e["on_demand_cost_usd"] is None and e["spot_cost_usd"] is None and e["cost_currency"] is None
    e = est(rdir, params="1B", provider="acme", total_tokens=3600, tokens_per_second=1)
    assert e["instance_choice"] is None and e["on_demand_cost_usd"] is None


# --------------------------------------------------------------------------- reports


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "fitplan", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


SEED_ARGS = ("--params", "7B", "--gpu", "a100-40gb", "--provider", "seed", "--total-tokens", "14400000",
             "--tokens-per-second", "1000", "--runs", "5")


def test_json_cost_section():
    p = _cli("estimate", *SEED_ARGS, "--format", "json")
    assert p.returncode == 0, p.stderr
    c = json.loads(p.stdout)["cost"]
    assert c["on_demand_usd"] == pytest.approx(80.0) and c["spot_usd"] == pytest.approx(24.0)
    assert c["on_demand_usd_per_run"] == pytest.approx(16.0) and c["spot_usd_per_run"] == pytest.approx(4.8)
    assert (c["provider"], c["instance"], c["currency"], c["runs"]) == ("seed", "a100-40gb", "USD", 5)
    assert c["gpu_hours"] == pytest.approx(20)


def test_table_and_markdown_state_the_currency():
    for fmt in ("table", "markdown"):
        p = _cli("estimate", *SEED_ARGS, "--format", fmt)
        assert p.returncode == 0, p.stderr
        assert "80.00 USD on demand, 24.00 USD spot for 5 runs" in p.stdout
        assert "4.00 h (14,400 s)" in p.stdout


def test_cli_error_for_provider_without_gpu():
    p = _cli("estimate", "--params", "7B", "--gpu", "b200", "--provider", "seed", "--total-tokens", "1000",
             "--tokens-per-second", "10")
    assert p.returncode == 2
    assert "provider 'seed' has no instance with GPU 'b200'" in p.stderr and "it offers:" in p.stderr
    assert "Traceback" not in p.stderr


def test_explain_cost():
    p = _cli("explain", "cost", *SEED_ARGS, "--format", "json", "--depth", "3")
    assert p.returncode == 0, p.stderr
    tree = json.loads(p.stdout)["tree"]
    assert tree["name"] == "on_demand_cost_usd"
    children = {c["name"] for c in tree["children"]}
    assert children == {"billed_seconds_on_demand", "instance_choice", "runs"}


def test_done_when_command():
    p = _cli("estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--num-gpus", "8", "--bf16",
             "--zero", "2", "--num-examples", "10000", "--tokens-per-example", "512", "--num-train-epochs", "3",
             "--provider", "aws", "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    for key in ("tokens", "flops", "seconds", "tokens_per_second", "mfu", "communication_share"):
        assert d["time"][key] is not None, key
    for key in ("gpu_hours", "on_demand_usd", "provider", "instance", "currency"):
        assert d["cost"][key] is not None, key
    assert "spot_usd" in d["cost"]
    assert d["time"]["tokens"] == 15_360_000
