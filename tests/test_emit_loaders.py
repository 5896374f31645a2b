"""``--emit``: every emitted file loaded by the library that reads it, and every loaded value equal to the plan's.

* accelerate 1.16: ``load_config_from_file`` (accelerate/commands/config/config_args.py), then the launcher's own
  check of the config with the flags of the SkyPilot task's ``run:`` (accelerate/commands/launch.py
  ``_validate_launch_command``);
* DeepSpeed 0.19.8: ``DeepSpeedConfig`` (deepspeed/runtime/config.py) at the plan's world size (its batch
  assertion: train batch = micro-batch × accumulation × world size);
* transformers 5.24: ``TrainingArguments(**json)``, whose ``__post_init__`` matches the DeepSpeed file against
  the arguments (transformers/integrations/deepspeed.py ``trainer_config_process``: ``mismatches``);
* SkyPilot: ``sky.Task.from_yaml`` where ``sky`` imports (here or in the interpreter named by
  ``FITPLAN_SKYPILOT_PYTHON``), with SkyPilot's AWS catalog seeded from ``tests/data/skypilot/aws_vms.csv`` so
  that it validates the instance, accelerators and region offline; skipped otherwise.

Expected values come from the flags of the plan (its scenario), not from fitplan's output. Every test states
``optim`` and ``precision``. No GPU is needed: the CPU machine stands in for the plan's world with two patches
(DeepSpeed's and the Trainer's world size, and the Trainer's "this machine has bf16" check).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
NODES, GPUS, MICRO, ACCUM = 2, 8, 2, 4
WORLD = NODES * GPUS
FLAGS = ["--model", "llama-2-7b", "--num-examples", "20000", "--tokens-per-example", "512", "--gpus", "h100-sxm",
         "--providers", "aws", "--num-gpus", str(GPUS), "--num-nodes", str(NODES), "--zero", "3",
         "--offload-optimizer", "--no-offload-params", "--precision", "bf16-master", "--optim", "adamw_torch",
         "--gradient-checkpointing", "--per-device-train-batch-size", str(MICRO), "--gradient-accumulation-steps",
         str(ACCUM), "--effective-batch-size", str(MICRO * ACCUM * WORLD), "--attn-implementation", "sdpa",
         "--markets", "spot"]
"""A 2 × 8 H100 DeepSpeed ZeRO-3 plan with optimizer offload on AWS spot: everything fixed, so the search only
confirms it fits and prices it."""


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("emit")
    proc = run_cli("recommend", *FLAGS, "--format", "json", "--top", "1", "--emit", "all", str(d))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["plans"][0]
    assert plan["market"] == "spot"
    return d, plan


def _p5_region() -> str:
    """The region of aws/p5.48xlarge in the bundled pricing ruleset (the plan's 8-H100 instance)."""
    data = tomllib.loads((ROOT / "rulesets" / "pricing" / "aws.toml").read_text(encoding="utf-8"))
    (row,) = [i for i in data["instance"] if i["id"] == "p5.48xlarge"]
    return row["region"]


def test_accelerate_loads_the_config_and_launches_it_with_the_task_flags(emitted, monkeypatch):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    d, _ = emitted
    monkeypatch.chdir(d)
    cfg = load_config_from_file("accelerate_config.yaml")
    assert isinstance(cfg, ClusterConfig)
    assert cfg.distributed_type.value == "DEEPSPEED"
    assert (cfg.num_machines, cfg.num_processes) == (NODES, WORLD)
    assert cfg.deepspeed_config["deepspeed_config_file"] == "ds_config.json"
    assert cfg.deepspeed_config["zero3_init_flag"] is True  # ZeRO-3: the model is built sharded
    # the SkyPilot task's own run line, as node 1 of 2 runs it
    args = launch_command_parser().parse_args(launch_flags(d / "sky_task.yaml", node_rank=1))
    args, defaults, _ = _validate_launch_command(args)
    assert args.use_deepspeed and args.deepspeed_config_file == "ds_config.json"
    assert (args.num_machines, args.machine_rank, args.num_processes) == (NODES, 1, WORLD)
    assert (args.training_script, args.training_script_args) == ("train.py", ["training_args.json"])


def launch_flags(task: Path, node_rank: int) -> list[str]:
    """The arguments of ``accelerate launch`` in the task's ``run:`` (YAML read by PyYAML, as SkyPilot reads it),
    with SkyPilot's variables as node ``node_rank`` of the task's nodes sees them."""
    import shlex

    import yaml

    data = yaml.safe_load(task.read_text(encoding="utf-8"))
    run = data["run"].replace("\\\n", " ")
    (line,) = [x for x in run.splitlines() if x.strip().startswith("accelerate launch")]
    env = {"SKYPILOT_NUM_NODES": str(data["num_nodes"]), "SKYPILOT_NODE_RANK": str(node_rank), "MAIN_IP": "10.0.0.1",
           "TRAIN_SCRIPT": data["envs"]["TRAIN_SCRIPT"]}
    for k, v in env.items():
        line = line.replace("$" + k, v)
    assert "$" not in line, line
    return shlex.split(line)[2:]


def test_deepspeed_config_loads_at_the_plan_world_size(emitted, monkeypatch):
    import deepspeed.runtime.config as dsc

    d, _ = emitted
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dsc.dist, "get_world_size", lambda *a, **k: WORLD)
    cfg = dsc.DeepSpeedConfig(str(d / "ds_config.json"))
    assert cfg.world_size == WORLD
    assert (cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (MICRO, ACCUM)
    assert cfg.train_batch_size == MICRO * ACCUM * WORLD  # DeepSpeed's own assertion passed too
    assert cfg.zero_optimization_stage == 3
    assert cfg.zero_config.offload_optimizer.device == "cpu"
    assert cfg.zero_config.offload_param is None  # --no-offload-params
    assert cfg.bfloat16_config.enabled and not cfg.float16_config.enabled  # bf16-master: DeepSpeed's bf16 optimizer


def _training_args(path: Path, monkeypatch, world: int):
    """``TrainingArguments(**json)`` as on one rank of ``world``, on this CPU machine."""
    import transformers.training_args as ta

    monkeypatch.chdir(path.parent)
    monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda *a, **k: True)  # an H100 has bf16
    monkeypatch.setattr(ta.TrainingArguments, "world_size", property(lambda self: world))
    return ta.TrainingArguments(**json.loads(path.read_text(encoding="utf-8")))


def test_training_arguments_load_and_match_the_deepspeed_file(emitted, monkeypatch):
    d, _ = emitted
    args = _training_args(d / "training_args.json", monkeypatch, WORLD)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (MICRO, ACCUM)
    assert args.optim.value == "adamw_torch"
    assert args.bf16 and not args.fp16
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True
    assert args.deepspeed == "ds_config.json"
    assert args.hf_deepspeed_config.mismatches == []  # batch, accumulation, train batch and bf16 agree


def _sky_python() -> str | None:
    import importlib.util

    if importlib.util.find_spec("sky") is not None:
        return sys.executable
    return os.environ.get("FITPLAN_SKYPILOT_PYTHON") or None


SKY_LOAD = """
import json, sys
import sky
from sky import catalog
task = sky.Task.from_yaml(sys.argv[1])
(r,) = list(task.resources)
cloud = str(r.cloud).lower()
catalog.validate_region_zone(r.region, None, clouds=cloud)  # raises on a region the catalog lacks
print(json.dumps({"num_nodes": task.num_nodes, "cloud": str(r.cloud), "region": r.region,
                  "catalog_accelerators": catalog.get_accelerators_from_instance_type(r.instance_type, clouds=cloud),
                  "instance_type": r.instance_type, "accelerators": r.accelerators, "use_spot": r.use_spot,
                  "disk_size": r.disk_size, "envs": task.envs, "file_mounts": task.storage_mounts and
                  {k: v.name for k, v in task.storage_mounts.items()}, "run": task.run}))
"""


def sky_load(task: Path, home: Path) -> dict:
    """SkyPilot's task loader on ``task``, offline: SkyPilot reads its AWS catalog from ``home`` (seeded from
    the fixture; a fresh file is not fetched again: sky/catalog/common.py ``read_catalog``)."""
    python = _sky_python()
    if python is None:
        pytest.skip("SkyPilot is not installed (pip install skypilot in another venv and set FITPLAN_SKYPILOT_PYTHON)")
    catalog = home / ".sky" / "catalogs" / "v8" / "aws"
    catalog.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "tests" / "data" / "skypilot" / "aws_vms.csv", catalog / "vms.csv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([python, "-c", SKY_LOAD, str(task)], capture_output=True, text=True, timeout=180,
                          env={**env, "HOME": str(home)}, cwd=task.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_skypilot_loads_the_task(emitted, tmp_path):
    d, _ = emitted
    task = sky_load(d / "sky_task.yaml", tmp_path / "home")
    assert task["num_nodes"] == NODES
    assert (task["cloud"], task["instance_type"], task["region"]) == ("AWS", "p5.48xlarge", _p5_region())
    assert task["accelerators"] == {"H100": GPUS}  # SkyPilot's name of the 80 GB SXM H100 (fixture catalog) ...
    assert task["catalog_accelerators"] == task["accelerators"]  # ... which its catalog gives the instance
    assert task["use_spot"] is True
    # the model download (≤ 4 B/param) and three checkpoints (2 kept + 1 written) of bf16 weights, fp32 master
    # weights and Adam's two fp32 states (2 + 4 + 8 = 14 B per parameter), in GB, at least SkyPilot's 256
    params = 6_738_415_616  # Llama-2-7B (its config.json: rulesets/models/llama.toml)
    assert task["disk_size"] == max(256, math.ceil((4 * params + 3 * 14 * params) / 1e9))
    bucket = task["envs"]["CHECKPOINT_BUCKET"]
    assert task["file_mounts"] == {"/checkpoints": bucket}  # the env var substituted by SkyPilot
    assert "accelerate launch --config_file accelerate_config.yaml" in task["run"]


@pytest.mark.parametrize(("old", "new"), [("use_spot: true", "use_spot: maybe"), ("num_nodes:", "num_nodez:"),
                                          ("region: us-east-1", "region: us-east-9")])
def test_skypilot_rejects_a_broken_task(emitted, tmp_path, old, new):
    """The loader checks the schema and (through the catalog) the region: the test above can fail."""
    d, _ = emitted
    bad = tmp_path / "bad.yaml"
    text = (d / "sky_task.yaml").read_text(encoding="utf-8")
    assert old in text
    bad.write_text(text.replace(old, new), encoding="utf-8")
    with pytest.raises(AssertionError):
        sky_load(bad, tmp_path / "home")


# --------------------------------------------------------------------------- the spot model's save_steps

SPOT_RULES = """
[[provider]]
id = "spotco"
name = "spotco"
billing = "second"
minimum_seconds = 0
spot_interruptions_per_hour = 0.5
source = "test fixture"

[[instance]]
provider = "spotco"
id = "eight"
gpu = "h100-sxm"
gpus = 8
on_demand_per_hour = 24.0
spot_per_hour = 8.0
checkpoint_gbps = 1.0
source = "test fixture"
"""


def test_spot_plan_checkpoints_every_save_steps_of_the_interruption_model(tmp_path, monkeypatch):
    """1B parameters in fp32 with torch AdamW: a checkpoint of 4 + 8 = 12 bytes per parameter, 12e9 bytes, written
    at 1 GB/s: C = 12 s; λ = 0.5/h: M = 7200 s; τ = √(2 C M) = 415.69 s (tests/test_spot_risk.py). save_steps is
    τ over the plan's step time, rounded."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "spot.toml").write_text(SPOT_RULES, encoding="utf-8")
    d = tmp_path / "out"
    proc = run_cli("recommend", "--ruleset-dir", str(rules), "--params", "1B", "--method", "full", "--optim",
                   "adamw_torch", "--precision", "32-true", "--total-tokens", "10000000", "--gpus", "h100-sxm",
                   "--providers", "spotco", "--num-gpus", "8", "--zero", "0", "--no-offload-optimizer",
                   "--no-offload-params", "--no-gradient-checkpointing", "--per-device-train-batch-size", "1",
                   "--effective-batch-size", "8", "--markets", "spot", "--format", "json", "--top", "1",
                   "--emit", "all", str(d))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["plans"][0]
    tau = math.sqrt(2 * 12.0 * 7200.0)
    steps = max(1, round(tau / plan["time"]["step_seconds"]))
    args = _training_args(d / "training_args.json", monkeypatch, 8)
    assert (args.save_strategy.value, args.save_steps, args.save_total_limit) == ("steps", steps, 2)
    assert args.optim.value == "adamw_torch" and not args.bf16 and not args.fp16  # 32-true
    assert f"checkpoint every {steps} optimizer steps" in (d / "sky_task.yaml").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- plans without DeepSpeed

STACKS = {
    # name: scenario, then what accelerate's launcher and the Trainer must make of it (from the scenario's words:
    # FSDP2's reshard_after_forward is true for full_shard; FSDP1 names the strategy)
    "ddp-lora": ({"method": "lora", "num_gpus": 4}, {"use_fsdp": False}),
    "fsdp2-full": ({"fsdp": "full_shard", "stack": "fsdp2", "num_gpus": 8},
                   {"use_fsdp": True, "FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "true",
                    "FSDP_OFFLOAD_PARAMS": "false"}),
    "fsdp2-grad-op": ({"fsdp": "shard_grad_op", "stack": "fsdp2", "num_gpus": 8},
                      {"use_fsdp": True, "FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "false",
                       "FSDP_OFFLOAD_PARAMS": "false"}),
    # FSDP1 runs accelerate's FSDP_SHARDING_STRATEGY, whatever the Trainer's fsdp word says (accelerator.py: the
    # plugin's sharding_strategy goes ahead of reshard_after_forward): the plan states it
    "fsdp1-offload": ({"fsdp": "shard_grad_op", "stack": "fsdp1", "fsdp_sharding_strategy": "shard_grad_op",
                       "offload_params": True, "offload_optimizer": True, "num_gpus": 8},
                      {"use_fsdp": True, "FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP",
                       "FSDP_OFFLOAD_PARAMS": "true"}),
}


@pytest.mark.parametrize("name", list(STACKS))
def test_accelerate_and_trainer_read_the_same_stack(name, tmp_path, monkeypatch):
    """accelerate's launcher (the environment it gives each process: accelerate/utils/launch.py
    ``prepare_multi_gpu_env``) and the Trainer (``fsdp_plugin_args``) both read the plan's stack."""
    import fitplan
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    from fitplan.output import exports

    scenario, expect = STACKS[name]
    s = fitplan.scenario_from_dict({"model": "llama-2-7b", "optim": "adamw_torch", "precision": "bf16-mixed",
                                    "gradient_checkpointing": True, "per_device_train_batch_size": 2, **scenario})
    exports.emit("all", s, tmp_path)
    assert not (tmp_path / "ds_config.json").exists() and not (tmp_path / "sky_task.yaml").exists()  # no estimate
    monkeypatch.chdir(tmp_path)
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(
        ["--config_file", "accelerate_config.yaml", "train.py", "training_args.json"]))
    assert (args.num_processes, args.mixed_precision) == (scenario["num_gpus"], "bf16")  # bf16-mixed: autocast
    assert bool(args.use_fsdp) == expect["use_fsdp"] and not args.use_deepspeed
    env = prepare_multi_gpu_env(args)
    assert {k: env[k] for k in expect if k.startswith("FSDP_")} == {k: v for k, v in expect.items() if k != "use_fsdp"}
    ta = _training_args(tmp_path / "training_args.json", monkeypatch, scenario["num_gpus"])
    assert ta.bf16 and ta.per_device_train_batch_size == 2 and ta.optim.value == "adamw_torch"
    assert ta.activation_checkpointing is True
    if not expect["use_fsdp"]:
        assert ta.fsdp_plugin_args is None
        return
    plugin = ta.fsdp_plugin_args
    assert plugin["fsdp_version"] == int(expect["FSDP_VERSION"])
    assert plugin.get("cpu_offload", False) == (expect["FSDP_OFFLOAD_PARAMS"] == "true")
    if plugin["fsdp_version"] == 2:
        assert plugin["reshard_after_forward"] == (expect["FSDP_RESHARD_AFTER_FORWARD"] == "true")
    else:
        assert plugin["reshard_after_forward"] == expect["FSDP_SHARDING_STRATEGY"].lower()
