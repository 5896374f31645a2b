"""Bad input: a fitplan error naming file, field and value, a suggestion where one exists, exit 2, no traceback."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli


@pytest.fixture
def cli(cli_in_process):
    """In this process (tests/conftest.py ``cli_in_process``): these tests check what a command says and returns;
    the first test below runs the real command line in a subprocess as the smoke test."""
    return cli_in_process


def assert_clean_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)


def test_unknown_model_suggests():
    assert_clean_error(run_cli("estimate", "--model", "llama-2-7"), "unknown model 'llama-2-7'", "did you mean", "llama-2-7b")


def test_unknown_gpu_suggests(cli):
    assert_clean_error(cli("estimate", "--params", "7B", "--gpu", "a100-80g"), "unknown GPU 'a100-80g'", "a100-80gb")


def test_unknown_optimizer_suggests(cli):
    assert_clean_error(cli("estimate", "--params", "7B", "--optim", "adamw_torh"), "unknown optimizer 'adamw_torh'", "adamw_torch")


@pytest.mark.parametrize("args,needle", [
    (("--params", "0"), "at least 1"),
    (("--params", "-7B"), "cannot read '-7B'"),
    (("--params", "7B", "--per-device-train-batch-size", "0"), "Training.per_device_train_batch_size must be an integer >= 1, got 0"),
    (("--params", "7B", "--max-seq-length", "-5"), "Training.max_seq_length must be an integer >= 1, got -5"),
    (("--params", "7B", "--num-gpus", "0"), "Hardware.num_gpus must be an integer >= 1, got 0"),
    (("--params", "7B", "--precision", "bf16"), "Training.precision must be one of"),
    (("--params", "7B", "--zero", "4"), "Parallel.zero_stage must be one of"),
])
def test_impossible_numbers(cli, args, needle):
    assert_clean_error(cli("estimate", *args), needle)


def test_lora_rank_above_hidden(cli):
    assert_clean_error(cli("estimate", "--model", "llama-2-7b", "--method", "lora", "--lora-r", "8192"),
                       "Lora.lora_r (8192) exceeds the hidden size of llama-2-7b (4096)", "use a rank <= 4096")


def test_lora_unknown_target_lists_modules(cli):
    assert_clean_error(cli("estimate", "--model", "llama-2-7b", "--method", "lora", "--lora-target-modules", "c_attn"),
                       "c_attn", "q_proj")


def test_lora_on_a_linear_returning_a_tuple_is_refused(cli):
    # Llama-4's router is an nn.Linear whose forward returns (scores, logits): peft 0.21's all-linear wraps it and
    # lora.Linear.forward fails on result.dtype (measured: AttributeError, peft/tuners/lora/layer.py)
    for targets in ("all-linear", "q_proj,router"):
        assert_clean_error(cli("estimate", "--model", "llama-4-scout-17b-16e", "--method", "lora", "--lora-target-modules",
                               targets), "model.layers.{i}.feed_forward.router", "'tuple' object has no attribute",
                           "--lora-target-modules down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj")
    assert cli("estimate", "--model", "llama-4-scout-17b-16e", "--method", "lora", "--lora-target-modules",
               "q_proj,v_proj").returncode == 0


def test_malformed_scenario_toml(cli, tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[training\nper_device_train_batch_size = 2\n")
    assert_clean_error(cli("estimate", str(f)), str(f), "malformed TOML")


def test_scenario_file_unknown_key(cli, tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[model]\nparams = "7B"\n[training]\nbatch_size = 2\n')
    assert_clean_error(cli("estimate", str(f)), str(f), "unknown key 'batch_size'", "$.training")


def test_config_json_missing_field(cli, tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}))
    assert_clean_error(cli("estimate", "--model", str(f)), str(f), "required field missing: model_type", "$.model_type")


def test_config_json_missing_size_takes_the_config_class_default(tmp_path):
    # transformers 5.24 LlamaConfig: num_hidden_layers defaults to 32 (configuration_llama.py); fitplan reads
    # config.json as the config class does (the learned file keeps the class's defaults)
    import fitplan

    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
                             "intermediate_size": 128}))
    assert fitplan.estimate(model=str(f)).arch.num_hidden_layers == 32


def test_config_json_bad_value(cli, tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "llama", "hidden_size": -64, "num_hidden_layers": 2, "num_attention_heads": 4,
                             "vocab_size": 100, "intermediate_size": 128}))
    assert_clean_error(cli("estimate", "--model", str(f)), "hidden_size must be a positive integer, got -64")


def test_config_json_unknown_architecture(cli, tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "lama", "hidden_size": 64}))
    assert_clean_error(cli("estimate", "--model", str(f)), "unknown model_type 'lama'", "llama")


def test_malformed_config_json(cli, tmp_path):
    f = tmp_path / "config.json"
    f.write_text("{not json")
    assert_clean_error(cli("estimate", "--model", str(f)), str(f), "malformed JSON")


def test_zero_on_one_gpu_warns(cli):
    proc = cli("estimate", "--params", "7B", "--zero", "2", "--format", "json")
    assert proc.returncode == 0
    warnings = json.loads(proc.stdout)["warnings"]
    assert any("changes nothing on a single GPU" in w for w in warnings)


def test_model_and_params_both(cli):
    assert_clean_error(cli("estimate", "--model", "llama-2-7b", "--params", "7B"), "either --model or --params")


def test_no_model(cli):
    assert_clean_error(cli("estimate"), "no model given", "--params 7B")


def test_malformed_ruleset_dir(cli, tmp_path):
    (tmp_path / "gpus.toml").write_text('[[gpu]]\nid = "x"\nname = "X"\nmemory_bytes = -1\n')
    proc = cli("estimate", "--params", "7B", "--ruleset-dir", str(tmp_path))
    assert_clean_error(proc, str(tmp_path / "gpus.toml"), "$.gpu")


def test_rulesets_check_reports_every_error(cli, tmp_path):
    a = tmp_path / "a.toml"
    a.write_text('[[gpu]]\nid = "x"\nname = "X"\nmemory_bytes = -1\nusable_bytes = 1\npeak_tflops = {bf16 = 1}\n'
                 'bandwidth_gbps = 1\nsource = "s"\n\n[[provider]]\nid = "p"\nname = "P"\nsource = "s"\nbiling = "hour"\n')
    b = tmp_path / "b.toml"
    b.write_text("[[instance]\n")
    c = tmp_path / "c.toml"
    c.write_text('[[modle]]\nid = "m"\n')
    proc = cli("rulesets", "check", str(a), str(b), str(c))
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert f"{a}: GPU.memory_bytes must be > 0, got -1 @ $.gpu[0].memory_bytes" in lines
    assert f"{a}: unknown key 'biling' (did you mean 'billing'?) @ $.provider[0]" in lines
    assert any(ln.startswith(f"{b}: malformed TOML") for ln in lines)
    assert any(ln.startswith(f"{c}: unknown key 'modle'") and "'model'" in ln for ln in lines)
    assert lines[-1] == "4 error(s)"


def test_rulesets_check_bundled_ok(cli):
    proc = cli("rulesets", "check", "rulesets")
    assert proc.returncode == 0, proc.stderr


def test_nothing_overwritten_on_error(cli, tmp_path):
    out = tmp_path / "graph"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = cli("graph", "--out", str(out))
    assert proc.returncode == 0
    assert (out / "keep.txt").read_text() == "mine"
