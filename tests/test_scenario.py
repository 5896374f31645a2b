"""Scenario model: one converter, forbidden extra keys, validators naming Class.field, file + flag precedence."""

from __future__ import annotations

import pytest

import fitplan
from fitplan.errors import FitplanError


def test_extra_key_rejected_with_suggestion():
    with pytest.raises(FitplanError) as e:
        fitplan.scenario_from_dict({"training": {"optm": "sgd"}}, file="s.toml")
    assert e.value.render() == "s.toml: unknown key 'optm' (did you mean 'optim'?) @ $.training"


def test_validator_names_class_field_and_value():
    with pytest.raises(FitplanError) as e:
        fitplan.scenario_from_dict({"per_device_train_batch_size": 0})
    assert "Training.per_device_train_batch_size must be an integer >= 1, got 0" in e.value.render()
    assert "$.training.per_device_train_batch_size" in e.value.render()


def test_every_error_at_once():
    with pytest.raises(FitplanError) as e:
        fitplan.scenario_from_dict({"training": {"per_device_train_batch_size": 0, "precision": "bf17"}, "lora": {"lora_r": "x"}})
    # one error per section: attrs stops at the first failing validator of a class
    assert len(e.value.details) == 2


def test_flat_and_nested_mix_and_lists():
    s = fitplan.scenario_from_dict({"training": {"optim": "sgd"}, "lora_target_modules": ["q_proj", "k_proj"], "lora_r": 4})
    assert s.training.optim == "sgd" and s.lora.lora_target_modules == ("q_proj", "k_proj") and s.lora.lora_r == 4
    assert s.replace(zero_stage=2).parallel.zero_stage == 2


def test_flags_override_file(tmp_path, cli):
    f = tmp_path / "run.toml"
    f.write_text('[model]\nmodel = "llama-2-7b"\n[training]\nper_device_train_batch_size = 8\nprecision = "bf16-true"\n')
    import json

    out = cli("estimate", str(f), "--per-device-train-batch-size", "2", "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["scenario"]["training"]["per_device_train_batch_size"] == 2
    assert data["scenario"]["training"]["precision"] == "bf16-true"


def test_hf_flags_map_to_presets(cli):
    import json

    out = json.loads(cli("estimate", "--params", "1B", "--bf16", "--format", "json").stdout)
    assert out["scenario"]["training"]["precision"] == "bf16-mixed"
    out = json.loads(cli("estimate", "--params", "1B", "--fp16", "--format", "json").stdout)
    assert out["scenario"]["training"]["precision"] == "16-mixed"


def test_deepspeed_json(tmp_path):
    from fitplan.inputs.importers import deepspeed_fields

    f = tmp_path / "ds.json"
    f.write_text('{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": true},'
                 ' "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"}')
    assert deepspeed_fields(f) == {"zero_stage": 3, "stack": "deepspeed", "offload_optimizer": True, "offload_params": False,
                                   "precision": "bf16-master", "per_device_train_batch_size": 4}
    f.write_text('{"zero_optimization": {"stage": 5}}')
    with pytest.raises(FitplanError) as e:
        deepspeed_fields(f)
    assert "$.zero_optimization.stage" in e.value.render() and str(f) in e.value.render()


@pytest.mark.parametrize("changes", [
    {"gpu": "h100-sxm", "provider": None, "instance": None, "region": None},  # the page's scenario on another GPU
    {"provider": "runpod"}, {"gpu": "a10g", "provider": "aws"}, {"optim": "sgd", "precision": None}])
def test_replacing_text_fields_gives_what_structuring_them_again_gives(changes):
    """``Scenario.replace`` sets text fields on their sections directly; the scenario must be the one structuring
    every field again gives (:func:`~fitplan.inputs.scenario.from_flat`, the path every other change takes)."""
    from fitplan.inputs.scenario import flatten, from_flat

    s = fitplan.scenario_from_dict({"model": "llama-2-7b", "optim": "adamw_torch", "precision": "bf16-mixed",
                                    "gpu": "a100-80gb", "provider": "lambda", "region": "us-east-1", "lora_r": 4,
                                    "method": "lora", "lora_target_modules": ["q_proj"], "num_gpus": 2, "zero_stage": 2})
    got = s.replace(**changes)
    assert got.lora is s.lora  # set directly: the sections nothing changed in are kept
    assert got == from_flat({**flatten(s), **changes})
    assert {k: flatten(got)[k] for k in changes} == changes


@pytest.mark.parametrize(("changes", "message"), [
    ({"precision": "bf17"}, "Training.precision must be one of"), ({"method": None}, "method"),
    ({"device": "tpu"}, "device")])
def test_a_replaced_text_field_is_refused_as_structuring_refuses_it(changes, message):
    """A value a validator refuses gets ``from_flat``'s error, naming the field."""
    from fitplan.inputs.scenario import flatten, from_flat

    s = fitplan.scenario_from_dict({"model": "llama-2-7b", "optim": "adamw_torch", "precision": "bf16-true"})
    with pytest.raises(FitplanError) as want:
        from_flat({**flatten(s), **changes})
    with pytest.raises(FitplanError) as got:
        s.replace(**changes)
    assert got.value.render() == want.value.render() and message in got.value.render()
