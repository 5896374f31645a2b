"""Exports (DeepSpeed JSON, accelerate YAML, TrainingArguments JSON, scenario TOML), the TrainingArguments
importer, and round trips: a plan written out and read back gives the same estimate."""

from __future__ import annotations

import json
import shlex

import pytest

import fitplan
from fitplan.inputs.precision import HF_WORD, PRESETS
from fitplan.output import exports
from fitplan.errors import FitplanError
from fitplan.inputs.importers import training_args_fields

from conftest import run_cli

KNOWN = ["adamw_torch", "adamw_torch_fused", "adamw_8bit", "adafactor", "sgd"]


def scenario(**kw):
    return fitplan.scenario_from_dict({"model": "llama-2-7b", **kw})


def test_deepspeed_config_by_hand():
    s = scenario(precision="bf16-master", zero_stage=3, offload_optimizer=True, offload_params=True,
                 per_device_train_batch_size=2, gradient_accumulation_steps=4, num_gpus=8)
    assert exports.deepspeed_config(s) == {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "train_batch_size": 64,
        "bf16": {"enabled": True},
        "fp16": {"enabled": False, "loss_scale": 0, "initial_scale_power": 16},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
            "contiguous_gradients": True,  # bucket keys only when the plan sets them (absent: DeepSpeed's defaults)
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }


def test_deepspeed_needs_a_deepspeed_plan():
    with pytest.raises(FitplanError, match="this plan does not use DeepSpeed") as e:
        exports.deepspeed_config(scenario(precision="bf16-mixed"))
    assert e.value.suggestion == "emit training-args (and accelerate) instead"


def test_yaml_writer_by_hand():
    assert exports.to_yaml({"a": 1, "b": {"c": True, "d": "FULL_SHARD", "e": "x y"}, "f": None}) == (
        'a: 1\nb:\n  c: true\n  d: FULL_SHARD\n  e: "x y"\nf: null\n')


def test_accelerate_config_for_deepspeed_and_ddp():
    ds = exports.accelerate_config(scenario(precision="bf16-master", zero_stage=3, num_gpus=8))
    assert ds == ("compute_environment: LOCAL_MACHINE\ndebug: false\ndeepspeed_config:\n"
                  "  deepspeed_config_file: ds_config.json\n  zero3_init_flag: true\ndistributed_type: DEEPSPEED\n"
                  "machine_rank: 0\nmain_training_function: main\nnum_machines: 1\nnum_processes: 8\n"
                  "rdzv_backend: static\nsame_network: true\nuse_cpu: false\n")
    ddp = exports.accelerate_config(scenario(precision="bf16-mixed", num_gpus=4, num_nodes=2))
    assert "distributed_type: MULTI_GPU\nmixed_precision: bf16\n" in ddp
    assert "num_machines: 2\nnum_processes: 8\n" in ddp
    # YAML 1.1 reads a bare NO or no as false: they are quoted, as accelerate writes them
    assert 'distributed_type: "NO"\nmixed_precision: "no"\n' in exports.accelerate_config(scenario())


def test_accelerate_config_fsdp1_writes_the_strategy_that_was_modelled(tmp_path):
    # FSDP1 runs FSDP_SHARDING_STRATEGY (accelerate launch exports the config's fsdp_sharding_strategy), not the
    # Trainer's fsdp mode (accelerate/utils/dataclasses.py:1719-1728): the written config names what fitplan modelled
    from fitplan.inputs.accelerate_config import accelerate_fields

    trainer_only = exports.accelerate_config(scenario(precision="bf16-mixed", num_gpus=2, stack="fsdp1",
                                                      fsdp="shard_grad_op"))
    assert "  fsdp_sharding_strategy: FULL_SHARD\n" in trainer_only
    env = exports.accelerate_config(scenario(precision="bf16-mixed", num_gpus=2, stack="fsdp1", fsdp="shard_grad_op",
                                             fsdp_sharding_strategy="shard_grad_op"))
    assert "  fsdp_sharding_strategy: SHARD_GRAD_OP\n" in env
    f = tmp_path / "accelerate.yaml"
    f.write_text(env)
    back = accelerate_fields(f, [])
    assert (back["stack"], back["fsdp"], back["fsdp_sharding_strategy"]) == ("fsdp1", "shard_grad_op", "shard_grad_op")


def test_training_args_and_their_notes():
    args, notes = exports.training_args(scenario(method="qlora", precision="bf16-true", optim="sgd_momentum",
                                                 gradient_checkpointing=True, num_train_epochs=3))
    assert args == {"output_dir": "outputs", "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1,
                    "activation_checkpointing": True, "optim": "sgd_momentum", "bf16": False, "fp16": False,
                    "num_train_epochs": 3.0}  # transformers 5.24's name (gradient_checkpointing: deprecated alias)
    text = "\n".join(notes)
    assert "optim 'sgd_momentum' is not a TrainingArguments optimizer name" in text
    assert "load the model with from_pretrained(..., dtype=torch.bfloat16)" in text  # transformers 5 names it dtype
    assert "loaded in 4-bit NF4" in text



def test_an_8bit_lora_run_is_told_to_load_its_base_in_8bit_not_nf4():
    # load_in_8bit (transformers' BitsAndBytesConfig(load_in_8bit=True), bitsandbytes Linear8bitLt): the note names
    # the 8-bit loading, never NF4 (it said "4-bit NF4" for every qlora scenario)
    s = scenario(method="qlora", precision="bf16-true", optim="adamw_torch_fused", load_in_8bit=True)
    text = "\n".join(exports.training_args(s)[1])
    assert "BitsAndBytesConfig(load_in_8bit=True)" in text and "NF4" not in text

# --------------------------------------------------------------------------- importing TrainingArguments


def write(tmp_path, data, name="args.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_training_args_import(tmp_path):
    p = write(tmp_path, {"output_dir": "o", "learning_rate": 2e-5, "per_device_train_batch_size": 4,
                         "gradient_accumulation_steps": 8, "gradient_checkpointing": True, "optim": "adamw_8bit",
                         "bf16": True, "num_train_epochs": 2, "max_steps": 500, "per_device_train_batchsize": 3})
    fields, warnings = training_args_fields(p, KNOWN)
    assert fields == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 8, "gradient_checkpointing": True,
                      "optim": "adamw_8bit", "num_train_epochs": 2.0, "bf16": True}  # the preset: bf16 over the load dtype
    assert any("max_steps (500) is not modelled" in w for w in warnings)
    assert any("key 'per_device_train_batchsize' is ignored (did you mean 'per_device_train_batch_size'?)" in w
               for w in warnings)
    assert not any("learning_rate" in w for w in warnings)


def test_training_args_with_deepspeed_and_fsdp(tmp_path):
    write(tmp_path, {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": "auto"},
                     "train_micro_batch_size_per_gpu": "auto"}, "ds.json")
    p = write(tmp_path, {"bf16": True, "deepspeed": "ds.json", "per_device_train_batch_size": 2})
    fields, _ = training_args_fields(p, KNOWN)
    assert fields == {"per_device_train_batch_size": 2, "bf16": True, "precision": "bf16-master", "zero_stage": 2, "stack": "deepspeed",
                      "offload_optimizer": True, "offload_params": False}
    inline = write(tmp_path, {"fp16": True, "deepspeed": {"zero_optimization": {"stage": 3}, "fp16": {"enabled": "auto"}}})
    assert training_args_fields(inline, KNOWN)[0]["precision"] == "16-master"
    fsdp = write(tmp_path, {"fsdp": "full_shard offload auto_wrap"})
    assert training_args_fields(fsdp, KNOWN)[0] == {"fsdp": "full_shard", "offload_params": True, "offload_optimizer": True,
                                                    "stack": "fsdp2"}  # the Trainer's default fsdp_config version


@pytest.mark.parametrize(("data", "message"), [
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size must be a positive integer, got 0 @ $.per_device_train_batch_size"),
    ({"bf16": True, "fp16": True}, "bf16 and fp16 are both true @ $.fp16 (choose one"),
    ({"optim": "adamw_8bitt"}, "optim 'adamw_8bitt' is not an optimizer fitplan knows @ $.optim (did you mean 'adamw_8bit'"),
    ({"gradient_checkpointing": "yes"}, "gradient_checkpointing must be true or false, got 'yes'"),
    ({"num_train_epochs": -1}, "num_train_epochs must be a number > 0, got -1"),
    ({"fsdp": "auto_wrapp"}, "Unknown `fsdp` option: auto_wrapp"),  # transformers training_args.py:2938
    ({"deepspeed": 3}, "deepspeed must be a path or an object, got int"),
])
def test_training_args_bad_values(tmp_path, data, message):
    p = write(tmp_path, data)
    with pytest.raises(FitplanError) as e:
        training_args_fields(p, KNOWN)
    assert e.value.render().startswith(f"{p}: {message}")


def test_training_args_errors_on_the_command_line(tmp_path):
    p = write(tmp_path, {"per_device_train_batch_size": "four"})
    proc = run_cli("estimate", "--model", "llama-2-7b", "--training-args", str(p))
    assert proc.returncode == 2
    assert f"{p}: per_device_train_batch_size must be a positive integer, got 'four'" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- round trips


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Two recommended plans: one DeepSpeed (ZeRO), one plain HF (DDP)."""
    out = {}
    for name, extra in (("deepspeed", ["--zero", "3", "--precision", "bf16-master", "--gpu", "a100-40gb",
                                       "--num-gpus", "8"]),
                        # bf16-mixed pairs with bf16-master under ZeRO (the HF bf16 flag): --zero 0 keeps plain HF
                        ("hf", ["--precision", "bf16-mixed", "--gpu", "a100-80gb", "--method", "lora", "--zero", "0"])):
        d = tmp_path_factory.mktemp(name)
        proc = run_cli("recommend", "--model", "llama-2-7b", "--num-examples", "20000", "--tokens-per-example", "512",
                       "--providers", "aws,lambda,seed", *extra, "--format", "json", "--top", "1", "--emit", "all", str(d))
        assert proc.returncode == 0, proc.stderr
        out[name] = (json.loads(proc.stdout)["plans"][0], d)
    return out


def _estimate_json(*args):
    proc = run_cli("estimate", *args, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _same(plan, est):
    assert est["memory"] == plan["memory"]
    assert est["time"] == plan["time"]
    assert est["cost"] == plan["cost"]


@pytest.mark.parametrize("name", ["deepspeed", "hf"])
def test_scenario_toml_round_trip(plans, name):
    plan, d = plans[name]
    _same(plan, _estimate_json(str(d / "fitplan-plan.toml")))


@pytest.mark.parametrize("name", ["deepspeed", "hf"])
def test_training_args_and_deepspeed_round_trip(plans, name):
    """The HF files carry batch, accumulation, checkpointing, optimizer, bf16/fp16, epochs and the DeepSpeed
    config; the rest (model, method, dataset, hardware, attention, the load dtype) are flags."""
    plan, d = plans[name]
    assert (d / "training_args.json").is_file() and (d / "accelerate_config.yaml").is_file()
    assert (d / "ds_config.json").is_file() == (name == "deepspeed")
    p = plan["plan"]
    flags = ["--model", "llama-2-7b", "--num-examples", "20000", "--tokens-per-example", "512",
             "--method", p["method"], "--gpu", p["gpu"], "--num-gpus", str(p["num_gpus"]),
             "--num-nodes", str(p["num_nodes"]), "--provider", p["provider"],
             "--attn-implementation", p["attn_implementation"]]
    preset = PRESETS[p["precision"]]
    if not preset.master:  # the load dtype travels as a note (from_pretrained's dtype), read back with --dtype
        flags += ["--dtype", HF_WORD[preset.weight_dtype]]
    _same(plan, _estimate_json(*flags, "--training-args", str(d / "training_args.json")))


def test_command_line_reproduces_the_plan(plans):
    plan, _ = plans["deepspeed"]
    _same(plan, _estimate_json(*shlex.split(plan["command"])[2:]))


def test_emit_deepspeed_for_a_plan_without_deepspeed(tmp_path):
    proc = run_cli("recommend", "--model", "llama-2-7b", "--gpus", "a100-80gb", "--providers", "lambda", "--method", "lora",
                   "--precision", "bf16-true", "--objective", "gpus", "--emit", "deepspeed", str(tmp_path))
    assert proc.returncode == 2
    assert "this plan does not use DeepSpeed" in proc.stderr


def test_emit_kinds_of_the_command_are_the_exporters():
    from fitplan.cli.emit_files import EMIT_KINDS

    assert EMIT_KINDS == (*exports.KINDS, "all")


@pytest.mark.parametrize(("parallel", "expect"), [
    ({"fsdp": "full_shard", "stack": "fsdp2"}, {"version": 2, "reshard_after_forward": True, "cpu_offload": False}),
    ({"fsdp": "shard_grad_op", "stack": "fsdp2", "offload_params": True, "offload_optimizer": True},
     {"version": 2, "reshard_after_forward": False, "cpu_offload": True}),
    ({"fsdp": "hybrid_shard", "stack": "fsdp1"}, {"version": 1, "reshard_after_forward": "hybrid_shard",
                                                   "cpu_offload": False}),
])
def test_fsdp_training_args_are_written_as_fsdp_true_and_read_back(tmp_path, parallel, expect):
    """transformers 5.24 deprecates ``fsdp="full_shard offload"`` for ``fsdp=True`` with ``fsdp_config``
    (training_args.py ``_apply_legacy_fsdp_to_config``: FSDP2's reshard_after_forward is a bool, FSDP1's the
    strategy's name); the importer reads the new form back to the same fields."""
    s = scenario(precision="bf16-mixed", optim="adamw_torch", num_gpus=8, **parallel)
    args, _ = exports.training_args(s)
    assert args["fsdp"] is True
    assert args["fsdp_config"] == {**expect, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}
    fields, _ = training_args_fields(write(tmp_path, args), KNOWN + ["adamw_torch"])
    offload = parallel.get("offload_params", False)
    assert (fields["fsdp"], fields["stack"], fields.get("offload_params", False)) == (
        parallel["fsdp"], parallel["stack"], offload)


def test_yaml_writer_writes_several_lines_as_a_literal_block():
    assert exports.to_yaml({"run": "set -e\necho a  # b\n", "setup": "one line"}) == (
        'run: |\n  set -e\n  echo a  # b\nsetup: "one line"\n')


def test_skypilot_needs_the_estimate():
    with pytest.raises(FitplanError, match="a SkyPilot task needs the plan's estimate"):
        exports.render_exports("skypilot", scenario(precision="bf16-mixed", optim="adamw_torch"))


def test_estimate_emits_through_the_same_writer(tmp_path):
    """``fitplan estimate --emit skypilot DIR``: the task and the files it names (DeepSpeed's for a ZeRO plan),
    on demand; the accelerators are what SkyPilot's catalog says p5.48xlarge (the plan's 8-H100 AWS instance) has."""
    import csv
    from pathlib import Path

    rows = csv.DictReader((Path(__file__).parent / "data" / "skypilot" / "aws_vms.csv").open(encoding="utf-8"))
    (name, count), = {(r["AcceleratorName"], int(float(r["AcceleratorCount"]))) for r in rows
                      if r["InstanceType"] == "p5.48xlarge"}
    d = tmp_path / "out"
    flags = ["estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--num-gpus", "8", "--provider", "aws",
             "--zero", "3", "--precision", "bf16-master", "--optim", "adamw_torch", "--num-examples", "1000",
             "--tokens-per-example", "512", "--emit", "skypilot", str(d)]
    proc = run_cli(*flags)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in d.iterdir()) == ["accelerate_config.yaml", "ds_config.json", "sky_task.yaml",
                                                     "training_args.json"]
    task = (d / "sky_task.yaml").read_text(encoding="utf-8")
    assert f'accelerators: "{name}:{count}"' in task and "use_spot: false" in task
    assert "instance_type: p5.48xlarge" in task and "num_nodes: 1" in task
    again = run_cli(*flags)
    assert again.returncode == 2 and "the folder already holds files" in again.stderr
    assert "Traceback" not in again.stderr


def test_skypilot_rents_whole_instances_and_starts_the_plan_processes():
    """4 of a p5.48xlarge's 8 H100s (aws.toml: gpus = 8): SkyPilot rents the whole instance (accelerators H100:8,
    one node), accelerate starts 4 processes, and a note says 4 of 8 GPUs are used."""
    est = fitplan.estimate(model="llama-2-7b", gpu="h100-sxm", num_gpus=4, provider="aws", num_examples=1000,
                           tokens_per_example=512, precision="bf16-mixed", optim="adamw_torch")
    files, notes = exports.render_exports("skypilot", est.scenario, est, "on_demand")
    task = dict(files)["sky_task.yaml"]
    assert 'accelerators: "H100:8"' in task and "num_nodes: 1" in task and "--num_processes 4 " in task
    assert "the plan uses 4 of the 8 GPUs its 1 instance(s) have" in " ".join(notes)


def test_the_skypilot_setup_installs_the_stack_fitplan_models():
    """The task's pins are the versions installed here, which the memory model and these tests were checked on."""
    from importlib.metadata import version

    from fitplan.output.skypilot_task import STACK_PINS

    assert {p.split("==")[0]: p.split("==")[1] for p in STACK_PINS} == {
        n: version(n) for n in ("transformers", "accelerate", "deepspeed", "peft")}


def test_activation_checkpointing_is_read_and_wins_over_its_alias(tmp_path):
    """transformers 5.24 uses the alias ``gradient_checkpointing`` only when ``activation_checkpointing`` is unset
    (training_args.py ``__post_init__``)."""
    both = write(tmp_path, {"activation_checkpointing": True, "gradient_checkpointing": False})
    assert training_args_fields(both, KNOWN)[0] == {"gradient_checkpointing": True}
    alias = write(tmp_path, {"gradient_checkpointing": True}, "alias.json")
    assert training_args_fields(alias, KNOWN)[0] == {"gradient_checkpointing": True}
