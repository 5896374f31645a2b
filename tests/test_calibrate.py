"""``fitplan calibrate``: reading run logs (HF Trainer, torchtune, litgpt) and the calibration's effect on the next
estimate. Expected values come from the logs' own numbers, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fitplan
from fitplan.errors import FitplanError
from fitplan.inputs.runlogs import read_run_log

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tests/data/calibration/qwen3-14b-lora-7gpu"
RUN = ("--model", str(EXAMPLE / "config.json"), "--method", "lora", "--lora-r", "8", "--lora-target-modules",
       "all-linear", "--precision", "bf16-true", "--gpu", "a100-80gb", "--num-gpus", "7",
       "--per-device-train-batch-size", "2", "--gradient-accumulation-steps", "8", "--max-seq-length", "287",
       "--gradient-checkpointing")
# the example's own figures: 24,689,312 input tokens in 5,980.6912 s on 7 GPUs
MEASURED_PER_GPU = 24_689_312 / 5_980.6912 / 7


def _scenario() -> dict:
    return dict(model=str(EXAMPLE / "config.json"), method="lora", lora_r=8, lora_target_modules=["all-linear"],
                precision="bf16-true", gpu="a100-80gb", num_gpus=7, per_device_train_batch_size=2,
                gradient_accumulation_steps=8, max_seq_length=287, gradient_checkpointing=True, total_tokens=24_689_312)


def test_example_trainer_state_calibrates_the_next_estimate(cli, tmp_path):
    out = tmp_path / "cal" / "qwen3.toml"
    out.parent.mkdir()
    before = fitplan.estimate(**_scenario())
    p = cli("calibrate", str(EXAMPLE / "trainer_state.json"), *RUN, "--out", str(out), "--date", "2026-01-01")
    assert p.returncode == 0, p.stderr
    assert "scale" in p.stdout and str(out) in p.stdout
    text = out.read_text()
    assert "[[time_calibration]]" in text and 'gpu = "a100-80gb"' in text and 'method = "lora"' in text
    row = fitplan.estimate(ruleset_dirs=[str(out.parent)], **_scenario())["step_time_calibration"]
    assert row.measured_tokens_per_second_per_gpu == pytest.approx(MEASURED_PER_GPU)
    predicted = before["train_tokens_per_second"] / 7
    assert row.predicted_tokens_per_second_per_gpu == pytest.approx(predicted)
    assert row.scale == pytest.approx(predicted / MEASURED_PER_GPU)
    # the next estimate of the same run gives the measured throughput, and the run's own time, and says why
    after = fitplan.estimate(ruleset_dirs=[str(out.parent)], **_scenario())
    assert after["train_tokens_per_second"] / 7 == pytest.approx(MEASURED_PER_GPU)
    assert after["train_seconds"] == pytest.approx(5_980.6912)
    assert "calibrated on your run" in after["throughput_basis"]
    # another GPU is not affected
    other = dict(_scenario(), gpu="h100-sxm")
    assert fitplan.estimate(ruleset_dirs=[str(out.parent)], **other)["step_time_calibration"] is None
    # calibrating again with the first calibration loaded measures against the uncalibrated model
    again = tmp_path / "again.toml"
    p = cli("calibrate", str(EXAMPLE / "trainer_state.json"), *RUN, "--out", str(again), "--ruleset-dir", str(out.parent))
    assert p.returncode == 0, p.stderr
    assert f"scale = {row.scale!r}" in again.read_text()


def test_trainer_state_without_token_counts_uses_steps(tmp_path):
    # 100 optimizer steps in 250 s: 2.5 s per step
    state = {"global_step": 100, "train_batch_size": 4,
             "log_history": [{"loss": 1.0, "step": 50}, {"step": 100, "train_runtime": 250.0, "train_loss": 1.0}]}
    f = tmp_path / "trainer_state.json"
    f.write_text(json.dumps(state))
    m = read_run_log(f)
    assert m.seconds_per_step == 2.5 and m.tokens_per_second is None and m.per_device_batch == 4
    results = tmp_path / "train_results.json"
    results.write_text(json.dumps({"train_runtime": 250.0, "train_steps_per_second": 0.4, "epoch": 1.0}))
    assert read_run_log(results).seconds_per_step == 2.5


def test_torchtune_log_median_after_the_first_step(tmp_path):
    # the DiskLogger's lines (torchtune 0.6 recipes: 'Step {step} | name:value ...')
    log = tmp_path / "log_1700000000.txt"
    log.write_text("Step 1 | loss:2.1 lr:2e-05 tokens_per_second_per_gpu:500.0 peak_memory_active:20.1 \n"
                   "Step 2 | loss:2.0 lr:2e-05 tokens_per_second_per_gpu:2400.0 peak_memory_active:20.1 \n"
                   "Step 3 | loss:1.9 lr:2e-05 tokens_per_second_per_gpu:2500.0 peak_memory_active:20.1 \n"
                   "Step 4 | loss:1.8 lr:2e-05 tokens_per_second_per_gpu:2450.0 peak_memory_active:20.1 \n")
    m = read_run_log(log)
    assert m.kind == "torchtune" and m.tokens_per_second_per_gpu == 2450.0  # median of 2,400, 2,500, 2,450


def test_litgpt_metrics_csv_last_throughput(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("device/batches_per_sec,device/items_per_sec,iter,loss,step\n"
                   "1.0,2048.0,50,1.2,6\n,,60,1.1,7\n1.1,2252.8,100,1.0,12\n")
    m = read_run_log(csv)
    assert m.kind == "litgpt" and m.tokens_per_second_per_gpu == 2252.8


@pytest.mark.parametrize(("content", "name", "message"), [
    ("{not json", "trainer_state.json", "malformed JSON"),
    ('{"log_history": [{"loss": 1.0, "step": 5}]}', "trainer_state.json", "no final training entry"),
    ('{"train_runtime": 100.0}', "train_results.json", "without train_steps_per_second"),
    ('{"log_history": [{"step": 10, "train_runtime": -1}]}', "trainer_state.json", "train_runtime must be a number > 0"),
    ("no steps here\n", "log.txt", "not a torchtune DiskLogger log"),
    ("a,b\n1,2\n", "metrics.csv", "not a litgpt metrics.csv"),
    ("Step 1 | loss:1.0 tokens_per_second_per_gpu:fast\n", "log.txt", "not a number"),
    ('{"log_history": [{"step": 10, "train_runtime": NaN}]}', "trainer_state.json", "malformed JSON"),
])
def test_bad_run_logs_name_the_file(tmp_path, content, name, message):
    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(FitplanError, match=message) as info:
        read_run_log(f)
    assert info.value.file == str(f)


def test_calibrate_bad_input_exits_2(cli_in_process, tmp_path):
    cli = cli_in_process  # what the command says and returns: in process
    log = str(EXAMPLE / "trainer_state.json")
    p = cli("calibrate", log, *RUN, "--out", str(tmp_path / "cal.txt"))
    assert p.returncode == 2 and "must end in .toml" in p.stderr and "Traceback" not in p.stderr
    p = cli("calibrate", log, *[a if a != "2" else "4" for a in RUN], "--out", str(tmp_path / "cal.toml"))
    assert p.returncode == 2 and "train_batch_size (2)" in p.stderr
    p = cli("calibrate", log, "--model", str(EXAMPLE / "config.json"), "--out", str(tmp_path / "cal.toml"))
    assert p.returncode == 2 and "needs the GPU" in p.stderr
    p = cli("calibrate", log, *RUN, "--tokens-per-second", "1000", "--out", str(tmp_path / "cal.toml"))
    assert p.returncode == 2 and "drop --tokens-per-second" in p.stderr
    p = cli("calibrate", str(tmp_path / "missing.json"), *RUN, "--out", str(tmp_path / "cal.toml"))
    assert p.returncode == 2 and "file not found" in p.stderr and "missing.json" in p.stderr
    assert not (tmp_path / "cal.toml").exists()
