"""Writing a plan as a SkyPilot task YAML (``sky launch`` / ``sky jobs launch``): the resources the plan rents,
its nodes, and a ``run:`` that starts the training with the emitted accelerate (and DeepSpeed) files.

The task follows SkyPilot's task schema (``sky/utils/schemas.py``, ``get_task_schema``; SkyPilot 0.14.1):

* ``resources``: ``accelerators`` as ``NAME:COUNT`` (SkyPilot's accelerator names: the inverse of
  :data:`fitplan.rulesets.skypilot.ACCELERATOR_GPU`), ``cloud`` for the providers SkyPilot drives,
  ``region`` where the plan's instance names one SkyPilot knows, ``instance_type`` where the provider's instance ids are
  SkyPilot's catalog names (AWS, GCP: the pricing rulesets take them from SkyPilot's catalog), ``use_spot``,
  and ``disk_size`` (GB);
* ``num_nodes``: the instances rented (a SkyPilot node is one instance, with all its GPUs); ``workdir: .`` (the
  folder holding the emitted files and the training script is synced to every node); ``envs``; ``run``:
  ``accelerate launch`` on every node with the plan's process count, ranked by SkyPilot's ``SKYPILOT_NODE_RANK``
  among ``SKYPILOT_NUM_NODES``, the first of ``SKYPILOT_NODE_IPS`` as the main process (sky/skylet/constants.py).

A spot plan priced with the interruption model (:mod:`fitplan.builtin.spot_risk`) checkpoints every
``save_steps`` optimizer steps (the TrainingArguments JSON carries it; the task's header says it), into a bucket
mounted at ``/checkpoints`` so that a recovered job resumes from it.
"""

from __future__ import annotations

import hashlib
import math
import re
import types
from typing import Any

from fitplan.errors import FitplanError
from fitplan.inputs import scenario as sc
from fitplan.rulesets.skypilot import ACCELERATOR_GPU

SKY_CLOUDS = {"aws": "aws", "gcp": "gcp", "lambda": "lambda", "runpod": "runpod", "nebius": "nebius"}
"""fitplan provider ids -> SkyPilot cloud names (sky/clouds/: aws.py, gcp.py, lambda_cloud.py, runpod.py,
nebius.py). Other providers (CoreWeave, Hyperstack, the seed's reference table) are not SkyPilot clouds: the
task then names no cloud and a note says so."""
SKY_INSTANCE_TYPES = frozenset({"aws", "gcp"})
"""Providers whose instance ids in the pricing rulesets are SkyPilot's catalog instance types (the rulesets cite
``catalogs/v8/<cloud>/vms.csv``); the others' ids are fitplan's own labels, so no ``instance_type`` is written."""
SKY_REGIONS = frozenset({"aws", "gcp", "nebius"})
"""Providers whose instances' ``region`` in the pricing rulesets is a region name SkyPilot uses (AWS, GCP: from
SkyPilot's catalog; Nebius: its own region ids, ``eu-north1``); the others' are fitplan's labels (``any``,
``secure``, ``north-america``), so no ``region`` is written."""
SKY_DEFAULT_DISK_GB = 256
"""SkyPilot's default ``disk_size`` (sky/resources.py ``DEFAULT_DISK_SIZE_GB``)."""
DOWNLOAD_BYTES_PER_PARAM = 4
"""The model download, bounded above by a float32 checkpoint (4 bytes per parameter; 16-bit ones are half)."""
SAVE_TOTAL_LIMIT = 2
"""Checkpoints kept on a spot run (TrainingArguments ``save_total_limit``): the disk holds one more while a new
one is written, before the oldest is deleted."""
CHECKPOINT_MOUNT = "/checkpoints"
STACK_PINS = ("transformers==5.24.0", "accelerate==1.16.0", "deepspeed==0.19.8", "peft==0.21.2")
"""The training stack whose allocations fitplan models (the Makefile's TEST_EXTRAS and STACK_EXTRAS), installed by
the task's ``setup:``; torch is left to the image (its CUDA build)."""


def sky_accelerator(gpu: str) -> str | None:
    """SkyPilot's accelerator name for a fitplan GPU id (the first name mapping to it), or None."""
    for name, gid in ACCELERATOR_GPU.items():
        if gid == gpu:
            return name
    return None


def save_steps(est, market: str | None) -> int | None:
    """The checkpoint interval of the spot model in optimizer steps: τ / step time, rounded, at least 1; None
    unless the plan runs on spot and its provider's interruption rate prices it (``cost.spot_risk``)."""
    if market != "spot" or est is None:
        return None
    from fitplan.output.estimate_report import sections_json

    data = sections_json(est)
    tau = ((data.get("cost") or {}).get("spot_risk") or {}).get("checkpoint_interval_seconds")
    step = est.role("step")
    if tau is None or not step:
        return None
    return max(1, round(tau / step))


def disk_gb(est, spot: bool) -> int:
    """``disk_size`` in GB: the model download (≤ 4 bytes per parameter) plus the checkpoints the disk holds at
    once (``save_total_limit`` + 1 on spot, one otherwise), at least SkyPilot's default 256 GB."""
    names = est.registry.names
    view = types.SimpleNamespace(values=est.values, market=None)
    ckpt = names["checkpoint_bytes_resumable"].get(view) if "checkpoint_bytes_resumable" in names else None
    params = _param_count(est)
    need = DOWNLOAD_BYTES_PER_PARAM * params + (ckpt or 0) * ((SAVE_TOTAL_LIMIT + 1) if spot else 1)
    return max(SKY_DEFAULT_DISK_GB, math.ceil(need / 1e9))


def _param_count(est) -> int:
    return int(est.role("params") or 0)


def _bucket(s: sc.Scenario) -> str:
    """A bucket name derived from the plan (deterministic, lower case, at most 63 characters)."""
    return "fitplan-ckpt-" + hashlib.sha256(repr(sorted(sc.flatten(s).items())).encode()).hexdigest()[:12]


def _resources(s: sc.Scenario, est, market: str | None, notes: list[str]) -> dict[str, Any]:
    hw = s.hardware
    if hw.gpu is None:
        raise FitplanError("a SkyPilot task rents the plan's GPUs: the scenario names none", field="--gpu",
                           suggestion="add --gpu ID, or let `fitplan recommend --emit skypilot DIR` choose it")
    res: dict[str, Any] = {}
    choice = est.role("instance") if est is not None else None
    provider = choice.provider.id if choice is not None else s.cost.provider
    cloud = SKY_CLOUDS.get(provider or "")
    if cloud:
        res["cloud"] = cloud
    elif provider:
        notes.append(f"provider {provider} is not a SkyPilot cloud: the task names no cloud (SkyPilot picks one "
                     "that has the accelerators); set resources.cloud to a cloud you use")
    if choice is not None and cloud:
        if choice.instance.region and provider in SKY_REGIONS:
            res["region"] = choice.instance.region
        if provider in SKY_INSTANCE_TYPES:
            res["instance_type"] = choice.instance.id
    accelerator = sky_accelerator(hw.gpu)
    if accelerator is None:
        accelerator = hw.gpu.upper()
        notes.append(f"GPU {hw.gpu} has no SkyPilot accelerator name in fitplan's table: the task says "
                     f"{accelerator}; check `sky show-gpus`")
    per_node = choice.instance.gpus if choice is not None else hw.num_gpus  # SkyPilot rents whole instances
    res["accelerators"] = f"{accelerator}:{per_node}"
    res["use_spot"] = market == "spot"
    res["disk_size"] = disk_gb(est, market == "spot") if est is not None else SKY_DEFAULT_DISK_GB
    return res


RUN = """\
set -e
{link}MAIN_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
accelerate launch --config_file {accelerate} \\
  --num_machines $SKYPILOT_NUM_NODES --machine_rank $SKYPILOT_NODE_RANK \\
  --num_processes {world} \\
  --main_process_ip $MAIN_IP --main_process_port 29500 \\
  $TRAIN_SCRIPT {training_args}
"""
LINK = ('mkdir -p {mount}/outputs && rm -rf outputs && ln -s {mount}/outputs outputs  '
        '# checkpoints outlive a preempted node\n')


def skypilot_task(s: sc.Scenario, est, market: str | None, files: dict[str, str]) -> tuple[str, list[str]]:
    """The SkyPilot task YAML of a plan, and notes on what the user supplies (the training script).

    :param est: the plan's estimate (instance, step time, spot interval), or None (resources from the scenario).
    :param market: ``spot`` or ``on_demand`` (None: on demand).
    :param files: the emitted file names by kind (``accelerate``, ``training-args``).
    """
    from fitplan.output.yaml_text import to_yaml

    notes: list[str] = []
    spot = market == "spot"
    steps = save_steps(est, market)
    name = re.sub(r"[^a-z0-9]+", "-", (s.model.model or s.model.params or "plan").lower()).strip("-")
    choice = est.role("instance") if est is not None else None
    nodes = choice.count if choice is not None else s.hardware.num_nodes  # a SkyPilot node is one instance
    world = s.hardware.num_gpus * s.hardware.num_nodes
    if choice is not None and choice.gpus_paid > world:
        notes.append(f"the plan uses {world} of the {choice.gpus_paid} GPUs its {nodes} instance(s) have: "
                     f"accelerate starts {world} processes")
    task: dict[str, Any] = {"name": f"fitplan-{name}"[:63],
                            "resources": _resources(s, est, market, notes), "num_nodes": nodes,
                            "workdir": ".", "envs": {"TRAIN_SCRIPT": "train.py"}}
    if spot:
        task["envs"]["CHECKPOINT_BUCKET"] = _bucket(s)
        task["file_mounts"] = {CHECKPOINT_MOUNT: {"name": "${CHECKPOINT_BUCKET}", "mode": "MOUNT"}}
        notes.append("spot: launch with `sky jobs launch` so that SkyPilot recovers the job after a preemption; "
                     "your script resumes from the last checkpoint in outputs/ "
                     "(transformers.trainer_utils.get_last_checkpoint); bucket names are global: pass "
                     "--env CHECKPOINT_BUCKET=NAME if the derived one is taken")
    task["setup"] = "pip install " + " ".join(STACK_PINS)
    task["run"] = RUN.format(link=LINK.format(mount=CHECKPOINT_MOUNT) if spot else "", world=world,
                             accelerate=files["accelerate"], training_args=files["training-args"])
    notes.append("SkyPilot task: put your training script (it reads the TrainingArguments JSON given as its "
                 "argument, e.g. HfArgumentParser(TrainingArguments).parse_json_file) next to the emitted files "
                 "as train.py, or pass --env TRAIN_SCRIPT=yours.py")
    return _header(s, est, market, steps) + to_yaml(task), notes


def _header(s: sc.Scenario, est, market: str | None, steps: int | None) -> str:
    lines = ["# SkyPilot task written by fitplan: `sky launch -c fitplan THIS_FILE` (spot: `sky jobs launch`),",
             "# run from the folder holding it, the other emitted files and your training script."]
    if market == "spot":
        if steps is None:
            lines.append("# spot: unpriced for risk (no interruption rate or checkpoint bandwidth stated): no "
                         "checkpoint interval; set save_steps yourself.")
        else:
            lines.append(f"# spot: checkpoint every {steps} optimizer steps (save_steps in the TrainingArguments "
                         "JSON): the interval of fitplan's interruption model.")
    return "\n".join(lines) + "\n"
