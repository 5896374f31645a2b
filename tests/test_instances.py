"""Instances and topology: GPUs per instance, the link inside, the network between, and what is paid for.

Expected numbers are derived by hand in the comments from the fixture rulesets written here and the ring
formulas of docs/time-and-cost.md (an all-reduce moves 2·(n−1)/n of the gradients per GPU; NCCL efficiency
0.8; NVLink figures halved for a ring).
"""

from __future__ import annotations

import pytest

import fitplan
from fitplan.builtin.report import idle_line, network_line

FIXTURE = """
[[gpu]]
id = "netgpu"
name = "Net GPU"
memory_bytes = 100_000_000_000
usable_bytes = 100_000_000_000
bandwidth_gbps = 1000
interconnect = "nvlink-test"
interconnect_gbps = 500      # a ring sees 500 × 0.5 × 0.8 = 200 GB/s
inter_node_gbps = 20
gpus_per_node = 8
peak_tflops = { fp32 = 10, bf16 = 100 }
source = "test fixture"

[[provider]]
id = "cloud"
name = "Cloud"
billing = "second"
minimum_seconds = 0
source = "test fixture"

[[instance]]
provider = "cloud"
id = "one"
gpu = "netgpu"
gpus = 1
on_demand_per_hour = 2.0
network_gbps = 1.25          # a 10 Gbit/s VM
source = "test"

[[instance]]
provider = "cloud"
id = "eight"
gpu = "netgpu"
gpus = 8
on_demand_per_hour = 16.0    # the same price per GPU as "one"
source = "test"
"""


def est(rdir, **kw):
    return fitplan.estimate(ruleset_dirs=[rdir], params="1B", gpu="netgpu", provider="cloud", precision="bf16-true",
                            total_tokens=1_000_000, **kw)


def test_eight_one_gpu_vms_talk_over_their_network(rdir):
    # DDP, 8 GPUs, bf16 gradients G = 2e9 B: the all-reduce moves 2 × 7/8 × 2e9 = 3.5e9 B per GPU, all of it
    # between instances; each VM has 1.25 GB/s for its one GPU: 3.5e9 / (1.25e9 × 0.8) = 3.5 s per step
    e = est(rdir, num_gpus=8, instance="one")
    assert e["topology"]["instances"] == 8 and e["topology"]["intra"] == "none"
    assert e["comm_bytes_per_step"] == {"intra": 0, "inter": pytest.approx(3.5e9)}
    assert e["comm_seconds_per_step"] == pytest.approx(3.5)
    line = network_line(e.values)
    assert line is not None and "8 instances" in line and "1.25 GB/s per GPU" in line


def test_eight_gpus_in_one_instance_talk_over_nvlink(rdir):
    # the same 3.5e9 B inside one instance at 200 GB/s: 0.0175 s, nothing on the network
    e = est(rdir, num_gpus=8, instance="eight")
    assert e["comm_bytes_per_step"] == {"intra": pytest.approx(3.5e9), "inter": 0}
    assert e["comm_seconds_per_step"] == pytest.approx(0.0175)
    assert network_line(e.values) is None


def test_at_one_price_the_shape_that_holds_the_job_wins(rdir):
    # 8 × one = 16.00/h = 1 × eight, 8 GPUs paid either way: one instance (NVLink) rather than eight VMs
    plan = est(rdir, num_gpus=8)["instance_choice"]
    assert (plan.instance.id, plan.count) == ("eight", 1)


def test_gpus_paid_but_unused_are_stated(rdir):
    # 4 GPUs on an 8-GPU instance: 8 paid, 4 idle, said in the output
    e = est(rdir, num_gpus=4, instance="eight")
    assert e["instance_choice"].gpus_paid == 8
    assert idle_line(e["instance_choice"], e["world_size"]).startswith("8 GPUs paid, 4 used: 4 idle")
    assert idle_line(est(rdir, num_gpus=8, instance="eight")["instance_choice"], 8) is None


def test_an_instance_without_a_network_figure_says_the_assumption(rdir):
    e = est(rdir, num_gpus=2, num_nodes=2, instance="eight")
    assert e["topology"]["network_gbps"] == 20  # the GPU ruleset's inter_node_gbps
    assert "an assumption" in e["topology"]["source"]
