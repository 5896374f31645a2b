"""`fitplan rulesets import-skypilot`: SkyPilot catalog CSV -> pricing ruleset.

The fixtures in tests/data/skypilot/ follow SkyPilot's vms.csv format (AWS column order; GCP column order with
separate VM and GPU rows). Expected prices are computed by hand from the fixture rows.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "skypilot"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "fitplan", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def imported(tmp_path, name, *extra):
    out = tmp_path / f"{name}.toml"
    p = cli("rulesets", "import-skypilot", str(DATA / f"{name}_vms.csv"), "--out", str(out), *extra)
    assert p.returncode == 0, p.stderr
    return p, tomllib.loads(out.read_text(encoding="utf-8")), out


def by_key(data):
    return {(i["id"], i["region"]): i for i in data["instance"]}


def test_aws_catalog(tmp_path):
    p, data, _ = imported(tmp_path, "aws")
    assert data["provider"] == [{
        "id": "aws", "name": "aws", "billing": "second", "minimum_seconds": 60, "currency": "USD", "spot_overhead": 0.1,
        "source": data["provider"][0]["source"]}]
    inst = by_key(data)
    assert set(inst) == {("g5.xlarge", "us-east-1"), ("g5.12xlarge", "us-east-1"), ("p4d.24xlarge", "us-east-1"),
                         ("p5.48xlarge", "us-east-1"), ("p5.48xlarge", "us-west-2")}
    g5 = inst[("g5.xlarge", "us-east-1")]
    # two availability zones: same price 1.006, spot the lower of 0.43 and 0.41
    assert (g5["gpu"], g5["gpus"], g5["on_demand_per_hour"], g5["spot_per_hour"]) == ("a10g", 1, 1.006, 0.41)
    assert inst[("g5.12xlarge", "us-east-1")]["gpus"] == 4
    p4d = inst[("p4d.24xlarge", "us-east-1")]
    assert (p4d["gpu"], p4d["gpus"], p4d["on_demand_per_hour"]) == ("a100-40gb", 8, 21.96)
    assert "spot_per_hour" not in p4d  # empty SpotPrice: no spot
    assert inst[("p5.48xlarge", "us-west-2")]["gpu"] == "h100-sxm"
    # CPU-only m5.large is not an instance; Inferentia2 and Trainium are reported, not silently dropped
    assert "Inferentia2 (1 row)" in p.stderr and "Trainium (1 row)" in p.stderr


def test_gcp_catalog_adds_vm_and_gpu_rows(tmp_path):
    p, data, _ = imported(tmp_path, "gcp")
    inst = by_key(data)
    assert set(inst) == {("a2-highgpu-1g", "us-central1"), ("a2-highgpu-8g", "us-central1")}
    one = inst[("a2-highgpu-1g", "us-central1")]
    # VM 0.73948 + 1 × A100 2.933908 = 3.673388; spot 0.36975 + 1.434 = 1.80375
    assert one["gpu"] == "a100-40gb" and one["gpus"] == 1
    assert one["on_demand_per_hour"] == pytest.approx(3.673388)
    assert one["spot_per_hour"] == pytest.approx(1.80375)
    eight = inst[("a2-highgpu-8g", "us-central1")]
    # VM 5.91582 + 8 × 2.933908 = 29.387084; spot 2.958 + 8 × 1.434 = 14.43
    assert eight["gpus"] == 8
    assert eight["on_demand_per_hour"] == pytest.approx(29.387084)
    assert eight["spot_per_hour"] == pytest.approx(14.43)
    assert data["provider"][0]["minimum_seconds"] == 60
    # europe-west4 has a VM row but no A100 row: reported; TPU rows: unknown accelerator; T4 rows: not attachable here
    assert "europe-west4" in p.stderr and "tpu-v5p-8 (1 row)" in p.stderr and "T4 GPU rows" in p.stderr


def test_malformed_rows_all_reported_nothing_written(tmp_path):
    out = tmp_path / "out.toml"
    out.write_text("# keep me\n", encoding="utf-8")
    p = cli("rulesets", "import-skypilot", str(DATA / "malformed.csv"), "--provider", "aws", "--out", str(out))
    assert p.returncode == 2
    err = p.stderr
    assert "4 malformed row(s); nothing written" in err
    assert "malformed.csv:3: Price is not a number: 'abc'" in err
    assert "malformed.csv:4: 8 fields, expected 10" in err
    assert "malformed.csv:5: AcceleratorCount is not a number: 'two'" in err
    assert "malformed.csv:6: Region is empty" in err
    assert ":2:" not in err  # the good row
    assert "Traceback" not in err
    assert out.read_text(encoding="utf-8") == "# keep me\n"
    assert [f.name for f in tmp_path.iterdir()] == ["out.toml"]  # no temporary left behind


def test_missing_header_column(tmp_path):
    bad = tmp_path / "x_vms.csv"
    bad.write_text("InstanceType,Price,Region\np5.48xlarge,55.04,us-east-1\n", encoding="utf-8")
    p = cli("rulesets", "import-skypilot", str(bad), "--out", str(tmp_path / "o.toml"))
    assert p.returncode == 2
    assert "header lacks column(s) AcceleratorName, AcceleratorCount, SpotPrice" in p.stderr
    assert not (tmp_path / "o.toml").exists()


def test_provider_needed_when_the_name_does_not_tell(tmp_path):
    p = cli("rulesets", "import-skypilot", str(DATA / "malformed.csv"), "--out", str(tmp_path / "o.toml"))
    assert p.returncode == 2 and "--provider" in p.stderr


def test_map_option(tmp_path):
    _, data, _ = imported(tmp_path, "aws", "--map", "Inferentia2=l4", "--date", "2025-11")
    inf = by_key(data)[("inf2.xlarge", "us-east-1")]
    assert (inf["gpu"], inf["date"]) == ("l4", "2025-11")


def test_round_trip_check_and_price(tmp_path):
    d = tmp_path / "prices"
    d.mkdir()
    out = d / "skyaws.toml"
    p = cli("rulesets", "import-skypilot", str(DATA / "aws_vms.csv"), "--provider", "skyaws", "--out", str(out))
    assert p.returncode == 0, p.stderr
    check = cli("rulesets", "check", str(out))
    assert check.returncode == 0, check.stderr
    # 8 × H100 for 3,600 s (3,600,000 tokens at 1,000 tokens/s): one p5.48xlarge, 55.04 USD; both regions cost the
    # same, the tie goes to the first region by name (us-east-1), whose spot price is 10.20 (+10 % time: 11.22)
    e = cli("estimate", "--params", "7B", "--gpu", "h100-sxm", "--num-gpus", "8", "--provider", "skyaws",
            "--total-tokens", "3600000", "--tokens-per-second", "1000", "--ruleset-dir", str(d), "--format", "json")
    assert e.returncode == 0, e.stderr
    import json

    cost = json.loads(e.stdout)["cost"]
    assert (cost["instance"], cost["region"], cost["instance_count"]) == ("p5.48xlarge", "us-east-1", 1)
    assert cost["on_demand_usd"] == pytest.approx(55.04)
    assert cost["spot_usd"] == pytest.approx(10.20 * 1.1)
