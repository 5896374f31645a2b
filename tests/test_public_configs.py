"""Public DeepSpeed configs and accelerate config YAMLs (tests/data/public_configs/, sources in its README) read
as DeepSpeed 0.19.8 and accelerate 1.16 read them; and each refusal those libraries make, as exit 2.

Every expected field is derived by hand from the file and the library's documented behaviour: ``"stage": 3`` and
``offload_param.device cpu`` -> ``zero_stage`` 3, ``offload_params`` True; a size key keeps its number ("auto"
stays "auto"); ``bf16.enabled`` true (or "auto" with TrainingArguments bf16) -> DeepSpeed's bf16 optimizer,
``bf16-master``; an ``optimizer`` section of type AdamW -> FusedAdam, modelled as ``adamw_torch_fused``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fitplan
from fitplan.errors import FitplanError
from fitplan.inputs.accelerate_config import accelerate_fields
from fitplan.inputs.importers import deepspeed_fields
from tests.conftest import run_cli, run_in_process

DATA = Path(__file__).parent / "data" / "public_configs"
TINY = "tests/data/configs/tiny-llama/config.json"

Z3_SIZES = {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto"}

DS_CASES = {
    # file: (TrainingArguments bf16, fp16), expected fields, the keys named as not modelled
    "hf_ds_config_zero2.json": ((False, True), {
        "stack": "deepspeed", "zero_stage": 2, "offload_optimizer": True, "offload_params": False,
        "reduce_bucket_size": "200000000", "overlap_comm": True, "precision": "16-master", "optim": "adamw_torch_fused"}, []),
    "hf_ds_config_zero3.json": ((False, True), {
        "stack": "deepspeed", "zero_stage": 3, "offload_optimizer": True, "offload_params": True, "overlap_comm": True,
        "sub_group_size": "100000000000000", **Z3_SIZES, "stage3_max_live_parameters": "1000000000",
        "stage3_max_reuse_distance": "1000000000", "precision": "16-master", "optim": "adamw_torch_fused"}, []),
    "lf_ds_z0_config.json": ((True, False), {
        "stack": "deepspeed", "zero_stage": 0, "offload_optimizer": False, "offload_params": False,
        "reduce_bucket_size": "500000000", "overlap_comm": False, "precision": "bf16-master"},
        ["zero_optimization.round_robin_gradients=true"]),
    "lf_ds_z2_config.json": ((True, False), {
        "stack": "deepspeed", "zero_stage": 2, "offload_optimizer": False, "offload_params": False,
        "reduce_bucket_size": "500000000", "overlap_comm": True, "precision": "bf16-master"},
        ["zero_optimization.round_robin_gradients=true"]),
    "lf_ds_z2_offload_config.json": ((True, False), {
        "stack": "deepspeed", "zero_stage": 2, "offload_optimizer": True, "offload_params": False,
        "reduce_bucket_size": "500000000", "overlap_comm": True, "precision": "bf16-master"},
        ["zero_optimization.round_robin_gradients=true"]),
    "lf_ds_z3_config.json": ((True, False), {
        "stack": "deepspeed", "zero_stage": 3, "offload_optimizer": False, "offload_params": False, "overlap_comm": True,
        "sub_group_size": "1000000000", **Z3_SIZES, "stage3_max_live_parameters": "1000000000",
        "stage3_max_reuse_distance": "1000000000", "precision": "bf16-master"}, []),
    "lf_ds_z3_offload_config.json": ((True, False), {
        "stack": "deepspeed", "zero_stage": 3, "offload_optimizer": True, "offload_params": True, "overlap_comm": False,
        "sub_group_size": "1000000000", **Z3_SIZES, "stage3_max_live_parameters": "1000000000",
        "stage3_max_reuse_distance": "1000000000", "precision": "bf16-master"}, []),
    "axolotl_zero1.json": ((True, False), {
        "stack": "deepspeed", "zero_stage": 1, "offload_optimizer": False, "offload_params": False, "overlap_comm": True,
        "precision": "bf16-master"}, []),
    "axolotl_zero2.json": ((True, False), {
        "stack": "deepspeed", "zero_stage": 2, "offload_optimizer": True, "offload_params": False, "overlap_comm": True,
        "precision": "bf16-master"}, []),
    "axolotl_zero3_bf16.json": ((True, False), {
        "stack": "deepspeed", "zero_stage": 3, "offload_optimizer": False, "offload_params": False, "overlap_comm": True,
        "sub_group_size": "0", **Z3_SIZES, "stage3_max_live_parameters": "0", "stage3_max_reuse_distance": "0",
        "precision": "bf16-master"}, []),
    "axolotl_zero3_bf16_cpuoffload_all.json": ((True, False), {
        "stack": "deepspeed", "zero_stage": 3, "offload_optimizer": True, "offload_params": True, "overlap_comm": True,
        "sub_group_size": "0", **Z3_SIZES, "stage3_max_live_parameters": "0", "stage3_max_reuse_distance": "0",
        "precision": "bf16-master"}, ["zero_force_ds_cpu_optimizer=false"]),
}


def _not_modelled(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "not modelled" in w]


@pytest.mark.parametrize("name", sorted(DS_CASES))
def test_public_ds_config_fields(name):
    (bf16, fp16), expected, named = DS_CASES[name]
    warnings: list[str] = []
    assert deepspeed_fields(DATA / name, bf16=bf16, fp16=fp16, warnings=warnings) == expected
    # every key of the file is read (above), or changes neither memory nor time, or is named here
    listed = _not_modelled(warnings)
    for key in named:
        assert len(listed) == 1 and key in listed[0], warnings
    if not named:
        assert listed == [], warnings
    # no key was read as an unknown one
    assert not any("reads no top-level key" in w for w in warnings), warnings


def test_public_ds_config_count():
    assert len(DS_CASES) >= 10 and {p.name for p in DATA.glob("*.json")} == set(DS_CASES)


def test_reuse_distance_and_sub_group_zero_stay_zero():
    # axolotl's zero3_bf16.json sets both to 0 (DeepSpeed: Field(ge=0), zero/config.py:182, 251): the estimate's
    # ds_config must say 0, not DeepSpeed's 1e9 default
    proc = run_cli("estimate", "--model", TINY, "--num-gpus", "2", "--deepspeed", str(DATA / "axolotl_zero3_bf16.json"),
                   "--bf16", "--optim", "adamw_torch", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    ds = json.loads(proc.stdout)["parallel"]["ds_config"]
    assert ds["stage3_max_reuse_distance"] == 0 and ds["sub_group_size"] == 0 and ds["stage3_max_live_parameters"] == 0


# --------------------------------------------------------------------------- the CPUAdam swap under offload

def _host(optim, offload=True, **kw):
    return fitplan.estimate(model=TINY, precision="bf16-master", num_gpus=2, stack="deepspeed", zero_stage=2,
                            offload_optimizer=offload, optim=optim, device="cpu", max_seq_length=64, **kw)


def test_offload_runs_cpu_adam_whatever_the_optimizer():
    # Tiny Llama (h 64, I 176, 2 layers, vocab 1000, untied): embedding and head 2 × 64,000, per layer 4·64² +
    # 3·64·176 + 2·64 = 50,304, final norm 64: Ψ = 228,672, both optimizer groups (norms: 320) multiples of 4, so
    # ZeRO-2 on 2 ranks keeps Ψ/2 = 114,336 fp32 master elements on the host (4 B each); DeepSpeedCPUAdam keeps
    # exp_avg and exp_avg_sq in fp32 per element (deepspeed/ops/adam/cpu_adam.py, fp32_optimizer_states=True):
    # 8 B each, whatever optim the user named
    part = 2 * 64_000 + 2 * (4 * 64 * 64 + 3 * 64 * 176 + 2 * 64) + 64
    assert part == 228_672
    master, states = part // 2 * 4, part // 2 * 8
    for optim in ("sgd", "adamw_8bit", "adafactor", "adamw_torch"):
        host = _host(optim).values["offload_host_bytes"]
        assert host["master_weights"] == master and host["optimizer_states"] == states, optim
        assert host["step_temp"] == 0
    # torch Adagrad becomes DeepSpeedCPUAdagrad: one fp32 state (accelerate/utils/deepspeed.py:64-81)
    assert _host("adagrad").values["offload_host_bytes"]["optimizer_states"] == part // 2 * 4
    # without offload SGD keeps its own (smaller) states on the GPU: the swap is offload's alone
    assert _host("sgd", offload=False).values["optimizer_state_bytes"] < states


def test_offload_swap_is_named():
    warnings = _host("sgd").warnings
    assert any("'sgd'" in w and "DeepSpeedCPUAdam" in w for w in warnings), warnings
    assert not any("DeepSpeedCPUAdam" in w for w in _host("adamw_torch").warnings)


# --------------------------------------------------------------------------- refusals, exit 2

def _refused(tmp_path, text, *extra, name="ds.json", flag="--deepspeed"):
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    proc = run_in_process("estimate", "--model", TINY, "--num-gpus", "2", "--optim", "adamw_torch", flag, str(f), *extra)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    err = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "Traceback" not in err and str(f) in err
    return err


def test_bf16_as_a_bool_is_refused(tmp_path):
    # DeepSpeedBF16Config(**True): a TypeError in deepspeed/runtime/precision_config.py get_bfloat16_config
    err = _refused(tmp_path, '{"zero_optimization": {"stage": 2}, "bf16": true}')
    assert "$.bf16" in err and "must be an object" in err


def test_deprecated_cpu_offload(tmp_path):
    # zero/config.py:209-220: cpu_offload true -> offload_optimizer {"device": "cpu"}, with DeepSpeed's warning
    warnings: list[str] = []
    f = tmp_path / "old.json"
    f.write_text('{"zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true}}')
    out = deepspeed_fields(f, bf16=True, fp16=False, warnings=warnings)
    assert out["offload_optimizer"] is True and out["offload_params"] is True
    assert any("cpu_offload is deprecated use offload_optimizer" in w for w in warnings)
    assert any("cpu_offload_param is deprecated use offload_param" in w for w in warnings)
    # beside its replacement: DeepSpeed's assertion
    err = _refused(tmp_path, '{"zero_optimization": {"stage": 2, "cpu_offload": false, "offload_optimizer": {"device": "cpu"}}}')
    assert "$.zero_optimization.cpu_offload" in err and "together" in err


def test_train_batch_size_must_match(tmp_path):
    # _batch_assertion: 16 != 2 * 1 * 2
    err = _refused(tmp_path, '{"zero_optimization": {"stage": 2}, "train_batch_size": 16, '
                             '"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}')
    assert "$.train_batch_size" in err and "16 != 2 * 1 * 2" in err
    f = tmp_path / "ok.json"
    f.write_text('{"zero_optimization": {"stage": 2}, "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, '
                 '"gradient_accumulation_steps": 2}')
    ok = run_cli("estimate", "--model", TINY, "--num-gpus", "2", "--optim", "adamw_torch", "--deepspeed", str(f))
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("text, field", [
    ('{"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5e8}}', "$.zero_optimization.reduce_bucket_sise"),
    ('{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin": true}}}',
     "$.zero_optimization.offload_param.pin"),
    ('{"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}}', "$.zero_optimization.reduce_bucket_size"),
    ('{"zero_optimization": {"stage": 3, "stage3_max_reuse_distance": -1}}', "$.zero_optimization.stage3_max_reuse_distance"),
    ('{"zero_optimization": {"stage": 4}}', "$.zero_optimization.stage"),
    ('{"zero_optimization": {"stage": 2}, "amp": {"enabled": true}}', "$.amp"),
    ('{"zero_optimization": {"stage": 2}, "bf16": {"enabled": true, "master_weights": true}}', "$.bf16.master_weights"),
])
def test_keys_deepspeed_rejects(tmp_path, text, field):
    assert field in _refused(tmp_path, text)


def test_unmodelled_and_unknown_keys_are_named(tmp_path):
    f = tmp_path / "ds.json"
    f.write_text('{"zero_optimization": {"stage": 3, "zero_quantized_weights": true, "zero_hpz_partition_size": 8}, '
                 '"bf16": {"enabled": true}, "communication_data_type": "fp32", "train_micro_batch_sise": 2}')
    warnings: list[str] = []
    deepspeed_fields(f, bf16=True, fp16=False, warnings=warnings)
    (listed,) = _not_modelled(warnings)
    for key in ("zero_optimization.zero_quantized_weights=true", "zero_optimization.zero_hpz_partition_size=8",
                "communication_data_type=fp32"):
        assert key in listed
    assert any("train_micro_batch_sise (did you mean 'train_micro_batch_size_per_gpu'?)" in w for w in warnings)


# --------------------------------------------------------------------------- accelerate config YAML

ACC_CASES = {
    # FSDP without fsdp_version: FSDP1 (launch's --fsdp_version default "1"); FULL_SHARD; bf16 autocast
    "accelerate_fsdp.yaml": {"num_gpus": 2, "num_nodes": 1, "stack": "fsdp1", "fsdp": "full_shard",
                             "offload_params": False, "offload_optimizer": False, "bf16": True},
    "accelerate_multi_gpu.yaml": {"num_gpus": 2, "num_nodes": 1, "bf16": True},
    # num_processes is the total: 8 over 2 machines = 4 per node; no mixed_precision -> "no"
    "accelerate_multi_node.yaml": {"num_gpus": 4, "num_nodes": 2},
    # NO without num_processes: process_config sets 1 (mixed_precision is TrainingArguments' flag, over the load dtype)
    "accelerate_single_gpu.yaml": {"num_gpus": 1, "num_nodes": 1, "bf16": True},
    "lf_fsdp_config.yaml": {"num_gpus": 2, "num_nodes": 1, "stack": "fsdp1", "fsdp": "full_shard",
                            "offload_params": True, "offload_optimizer": True, "bf16": True},
    # FSDP2: fsdp_reshard_after_forward true = full_shard
    "lf_fsdp2_config.yaml": {"num_gpus": 2, "num_nodes": 1, "stack": "fsdp2", "fsdp": "full_shard",
                             "offload_params": False, "offload_optimizer": False, "bf16": True},
}


@pytest.mark.parametrize("name", sorted(ACC_CASES))
def test_public_accelerate_yaml(name):
    warnings: list[str] = []
    assert accelerate_fields(DATA / name, warnings) == ACC_CASES[name]
    assert warnings == []  # every key set in these files is read or changes neither memory nor time


def test_accelerate_yaml_on_the_command_line():
    proc = run_cli("estimate", "--model", TINY, "--optim", "adamw_torch", "--accelerate-config",
                   str(DATA / "lf_fsdp2_config.yaml"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)["scenario"]
    assert (s["parallel"]["stack"], s["parallel"]["fsdp"], s["hardware"]["num_gpus"], s["training"]["precision"]) == \
        ("fsdp2", "full_shard", 2, "bf16-mixed")


def test_accelerate_deepspeed_keys(tmp_path):
    # DeepSpeedPlugin without a config file (utils/dataclasses.py:1131-1221): stage default 2, offload devices
    # default none, mixed_precision bf16 enables DeepSpeed's bf16 optimizer
    f = tmp_path / "ds.yaml"
    f.write_text("distributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_processes: 4\ndeepspeed_config:\n"
                 "  zero_stage: 3\n  offload_optimizer_device: cpu\n  offload_param_device: none\n"
                 "  gradient_accumulation_steps: 4\n  zero3_init_flag: true\n")
    assert accelerate_fields(f, []) == {"num_gpus": 4, "num_nodes": 1, "stack": "deepspeed", "zero_stage": 3,
                                        "bf16": True, "offload_optimizer": True, "offload_params": False,
                                        "gradient_accumulation_steps": 4}  # bf16 under DeepSpeed: bf16-master
    f.write_text("distributed_type: DEEPSPEED\nnum_processes: 2\n")
    assert accelerate_fields(f, [])["zero_stage"] == 2


def test_accelerate_deepspeed_config_file_is_read_relative_to_the_yaml(tmp_path):
    (tmp_path / "z3.json").write_text((DATA / "lf_ds_z3_offload_config.json").read_text())
    f = tmp_path / "acc.yaml"
    f.write_text("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  deepspeed_config_file: z3.json\n")
    out = accelerate_fields(f, [])
    assert (out["zero_stage"], out["offload_optimizer"], out["offload_params"], out["num_gpus"]) == (3, True, True, 2)


@pytest.mark.parametrize("text, field", [
    ("distributed_type: FSDP\nnum_processes: 2\nfsdp: true\n", "$.fsdp"),  # ClusterConfig: unknown keys
    ("mixed_precision: bf16\n", "$.distributed_type"),  # process_config: distributed_type required
    ("distributed_type: MULTI_TPU\n", "$.distributed_type"),
    ("distributed_type: MULTI_GPU\nmixed_precision: fp32\n", "$.mixed_precision"),
    ("distributed_type: MULTI_GPU\nnum_processes: 6\nnum_machines: 4\n", "$.num_processes"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: FULL_SHARD\n",
     "$.fsdp_config.fsdp_reshard_after_forward"),  # FSDP2 str_to_bool
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: 7\n", "$.fsdp_config.fsdp_sharding_strategy"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 3\n",
     "$.deepspeed_config.zero_stage"),  # _deepspeed_config_checks
    ("distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n",
     "$.mixed_precision"),
    ("distributed_type: [FSDP\n", "--accelerate-config"),  # not YAML
])
def test_accelerate_refusals(tmp_path, text, field):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    err = _refused(tmp_path, text, name="acc.yaml", flag="--accelerate-config")
    assert field in err, err


def test_accelerate_fsdp_numeric_strategy(tmp_path):
    # FSDP1 accepts the numeric form: 2 = SHARD_GRAD_OP (FSDP_SHARDING_STRATEGY index + 1), which accelerate launch
    # exports and FSDP1 runs (accelerate/utils/dataclasses.py:1719-1728): the scenario's fsdp_sharding_strategy
    f = tmp_path / "f.yaml"
    f.write_text("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: 2\n"
                 "  fsdp_activation_checkpointing: true\n  fsdp_forward_prefetch: true\n")
    warnings: list[str] = []
    out = accelerate_fields(f, warnings)
    assert (out["stack"], out["fsdp"], out["gradient_checkpointing"]) == ("fsdp1", "shard_grad_op", True)
    assert out["fsdp_sharding_strategy"] == "shard_grad_op"
    assert not any("SHARD_GRAD_OP" in w for w in warnings)
    assert any("fsdp_config.fsdp_forward_prefetch=True" in w and "not modelled" in w for w in warnings)


def test_accelerate_template_with_missing_ds_file():
    # accelerate's deepspeed.yaml names a JSON of accelerate's repository (not copied): the error names it
    with pytest.raises(FitplanError) as e:
        accelerate_fields(DATA / "accelerate_deepspeed.yaml", [])
    assert "zero_stage1_config.json" in e.value.render()


@pytest.mark.parametrize("kw, expected", [
    (dict(fsdp="shard_grad_op", precision="bf16-mixed", num_gpus=4), ("fsdp2", "shard_grad_op", False, 4, 1)),
    (dict(fsdp="full_shard", stack="fsdp1", precision="bf16-mixed", num_gpus=8, num_nodes=2, offload_params=True,
          offload_optimizer=True), ("fsdp1", "full_shard", True, 8, 2)),
    (dict(zero_stage=3, precision="bf16-master", num_gpus=8, offload_optimizer=True), ("deepspeed", None, True, 8, 1)),
])
def test_accelerate_export_reads_back(tmp_path, kw, expected):
    # fitplan's own `--emit accelerate` YAML (output/exports.py) read back gives the plan's stack again
    from fitplan.inputs.scenario import Scenario
    from fitplan.output import exports

    s = Scenario().replace(**kw)
    (tmp_path / "ds_config.json").write_text(json.dumps(exports.deepspeed_config(s)) if expected[0] == "deepspeed" else "{}")
    f = tmp_path / "accelerate_config.yaml"
    f.write_text(exports.accelerate_config(s))
    out = accelerate_fields(f, [])
    assert (out["stack"], out.get("fsdp"), out["offload_optimizer"], out["num_gpus"], out["num_nodes"]) == expected
    # mixed_precision bf16 is TrainingArguments' bf16 flag; over fp32 weights it is bf16-mixed (DeepSpeed's config
    # file states its own bf16 optimizer: bf16-master)
    from fitplan.inputs.precision import hf_precision

    got = out.get("precision") or hf_precision("bf16" if out.get("bf16") else None, "fp32",
                                               deepspeed=out["stack"] == "deepspeed")
    assert got == kw["precision"]


def test_train_batch_size_inside_training_args(tmp_path):
    # the same assertion when the ds_config comes inline through TrainingArguments' deepspeed key: 32 != 4 * 2 * 2
    f = tmp_path / "args.json"
    f.write_text(json.dumps({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "bf16": True,
                             "deepspeed": {"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"},
                                           "train_batch_size": 32}}))
    err = _refused(tmp_path, f.read_text(), name="args.json", flag="--training-args")
    assert "$.deepspeed.train_batch_size" in err and "32 != 4 * 2 * 2" in err
