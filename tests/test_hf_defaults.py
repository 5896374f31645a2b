"""Defaults are what the pinned stack does when the user says nothing (transformers 5.24, torch 2.13).

* ``from_pretrained`` loads the checkpoint's dtype (``dtype="auto"``: the config's ``dtype``/``torch_dtype``);
* TrainingArguments' ``bf16``/``fp16`` add autocast over the loaded weights (accelerate does not cast them);
* ``TrainingArguments.optim`` defaults to ``adamw_torch_fused`` on torch >= 2.8.

Expected numbers are derived by hand from the parameter count (published: Llama-3.1-8B has 8,030,261,248
parameters in 291 tensors) and torch's AdamW (two states ``zeros_like(param)`` and, for the fused
implementation, a fp32 ``step`` scalar per parameter on its device: torch/optim/adamw.py ``_init_group``), or
measured by the referee (fitplan-torch) on the CPU.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

import fitplan
from fitplan.errors import FitplanError
from fitplan.inputs.precision import dtype_code, hf_precision

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"
LLAMA31_8B = 8_030_261_248
LLAMA31_8B_TENSORS = 32 * 9 + 3  # per layer: q, k, v, o, gate, up, down, two norms; embed, final norm, lm_head


def bf16_config(tmp_path: Path, name: str, dtype: str = "bfloat16") -> Path:
    """A tiny config of ``name`` stating ``dtype`` as its checkpoint dtype (as published configs of 16-bit
    checkpoints do)."""
    cfg = json.loads((CONFIGS / name / "config.json").read_text())
    cfg["torch_dtype"] = dtype
    path = tmp_path / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg))
    return path


# --------------------------------------------------------------------------- the rule, by hand


@pytest.mark.parametrize(("flag", "loaded", "deepspeed", "preset"), [
    (None, "fp32", False, "32-true"),          # no flag, fp32 checkpoint: plain fp32
    (None, "bf16", False, "bf16-true"),        # no flag, bf16 checkpoint: trained in bf16 as loaded
    ("bf16", "fp32", False, "bf16-mixed"),     # autocast over fp32 weights
    ("bf16", "bf16", False, "bf16-autocast"),  # transformers 5.24's default with bf16=True on Llama-3
    ("bf16", "fp16", False, "bf16-autocast-fp16w"),  # Llama-2's fp16 checkpoint with bf16=True
    ("fp16", "fp32", False, "16-mixed"),
    ("bf16", "fp32", True, "bf16-master"),     # DeepSpeed's bf16 optimizer (the engine casts the module)
    (None, "bf16", True, "bf16-master"),       # ZeRO keeps fp32 partitions of 16-bit weights
    (None, "fp32", True, "32-true"),
])
def test_hf_words_select_the_preset(flag, loaded, deepspeed, preset):
    assert hf_precision(flag, loaded, deepspeed=deepspeed) == preset


def test_fp16_autocast_over_fp16_weights_is_refused_as_torch_refuses_it():
    with pytest.raises(FitplanError, match="Attempting to unscale FP16 gradients"):
        hf_precision("fp16", "fp16")


@pytest.mark.parametrize(("word", "code"), [("bfloat16", "bf16"), ("torch.bfloat16", "bf16"), ("bf16", "bf16"),
                                             ("float16", "fp16"), ("torch.float16", "fp16"), ("half", "fp16"),
                                             ("float32", "fp32"), ("float", "fp32"), ("FP32", "fp32")])
def test_every_hf_spelling_of_a_dtype(word, code):
    assert dtype_code(word) == code


# --------------------------------------------------------------------------- estimates


def test_training_args_bf16_on_llama_3_1_8b_is_what_transformers_5_24_runs(tmp_path):
    """Llama-3.1-8B's config states bfloat16: bf16=True gives 2 B/param weights and gradients, fused AdamW states
    in bf16 (4 B/param) plus one 4-byte fp32 step per tensor (on the CPU: no allocator rounding)."""
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"output_dir": "out", "bf16": True}))
    from fitplan.inputs.sources import from_options

    s = from_options({"model": "llama-3.1-8b", "training_args": str(args), "device": "cpu"}).scenario
    est = fitplan.estimate(s)
    assert est.scenario.training.precision == "bf16-autocast"
    assert est.scenario.training.optim == "adamw_torch_fused"
    assert est["param_count"] == LLAMA31_8B
    assert est["weight_bytes"] == 2 * LLAMA31_8B
    assert est["optimizer_state_bytes"] == 2 * 2 * LLAMA31_8B + 4 * LLAMA31_8B_TENSORS
    assert est["gradient_bytes"] == 2 * LLAMA31_8B


def test_an_explicit_load_dtype_changes_the_weights():
    est = fitplan.estimate(model="llama-3.1-8b", bf16=True, dtype="float32", device="cpu")
    assert est.scenario.training.precision == "bf16-mixed"
    assert est["weight_bytes"] == 4 * LLAMA31_8B


def test_a_named_preset_keeps_its_documented_meaning():
    est = fitplan.estimate(model="llama-3.1-8b", precision="bf16-mixed", device="cpu")
    assert est["weight_bytes"] == 4 * LLAMA31_8B  # Lightning's bf16-mixed: fp32 weights


def test_a_named_preset_that_contradicts_the_load_dtype_is_an_error():
    proc = run_cli("estimate", "--model", "llama-3.1-8b", "--precision", "bf16-mixed", "--dtype", "bfloat16")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--precision bf16-mixed holds float32 weights but --dtype is bfloat16" in proc.stderr


def test_fp16_flag_on_an_fp16_checkpoint_exits_2_with_torchs_reason():
    proc = run_cli("estimate", "--model", "llama-2-7b", "--fp16")  # Llama-2's published config states float16
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "Attempting to unscale FP16 gradients" in proc.stderr


@pytest.mark.parametrize("spelling", ["bfloat16", "torch.bfloat16", "bf16"])
def test_bnb_compute_dtype_takes_hf_spellings(spelling):
    proc = run_cli("estimate", "--model", str(CONFIGS / "tiny-llama" / "config.json"), "--method", "qlora", "--bf16",
                   "--bnb-4bit-compute-dtype", spelling, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["scenario"]["lora"]["bnb_4bit_compute_dtype"] == "bf16"


def test_a_bad_dtype_names_the_field_and_the_spellings():
    proc = run_cli("estimate", "--model", "llama-3.1-8b", "--dtype", "int8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "dtype must be float32, bfloat16 or float16" in proc.stderr and "'int8'" in proc.stderr


def test_the_report_names_the_defaults_it_assumed():
    est = fitplan.estimate(model="llama-3.1-8b", bf16=True)
    defaults = est["assumed_defaults"]
    assert defaults[0] == "dtype auto → bfloat16 (config.json) → bf16-autocast"
    assert "optim adamw_torch_fused (HF default)" in defaults
    assert "attention sdpa (HF default)" in defaults
    given = fitplan.estimate(model="llama-3.1-8b", dtype="bfloat16", optim="adamw_torch",
                             attn_implementation="eager")
    assert given["assumed_defaults"] == ["loss ForCausalLMLoss (fp32 logits)"]  # only what nobody chose


def test_a_config_without_a_dtype_is_said_to_be_assumed_float32(tmp_path):
    cfg = json.loads((CONFIGS / "tiny-gpt2" / "config.json").read_text())
    cfg.pop("torch_dtype", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    est = fitplan.estimate(model=str(tmp_path / "config.json"), bf16=True)
    assert est.scenario.training.precision == "bf16-mixed"
    assert any("states no dtype" in w and "assumes float32" in w for w in est.warnings)


# --------------------------------------------------------------------------- the referee (CPU torch)


torch = None


def _torch():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    try:
        import fitplan_torch  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    import torch as t

    return t


REFEREE_ARCHS = ("tiny-llama", "tiny-qwen2", "tiny-gemma", "tiny-gpt2")


@pytest.mark.parametrize("name", REFEREE_ARCHS)
def test_bf16_flag_on_a_bf16_checkpoint_against_the_referee(tmp_path, name):
    """TrainingArguments(bf16=True) on a bf16 checkpoint: every category the referee measures, to the byte."""
    _torch()
    import fitplan_torch

    est = fitplan.estimate(model=str(bf16_config(tmp_path, name)), bf16=True, per_device_train_batch_size=2,
                           max_seq_length=16, device="cpu")
    assert est.scenario.training.precision == "bf16-autocast"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fitplan_torch.validate(est, mode="cpu")
    errors = {k: c["relative_error"] for k, c in report["components"].items()}
    assert errors == {k: 0.0 for k in errors}, report["components"]


@pytest.mark.parametrize("name", ("tiny-llama", "tiny-qwen2", "tiny-mistral"))
def test_the_hf_default_path_itself_against_the_estimate(tmp_path, name):
    """The path a transformers 5.24 user takes, run for real: a bf16 checkpoint saved and loaded with
    ``from_pretrained`` and no dtype (``"auto"``), the optimizer the Trainer builds for ``TrainingArguments(bf16=
    True)`` by default, one step under accelerate's bf16 autocast on the CPU. fitplan's estimate from the same
    config with only ``bf16=True`` matches every category to the byte."""
    t = _torch()
    import transformers
    from fitplan_torch.build import make_batch, vocab_size_of
    from fitplan_torch.runner import COMPONENTS, predicted_quantity
    from fitplan_torch.step import measure_step

    cfg_path = bf16_config(tmp_path, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.AutoConfig.from_pretrained(cfg_path.parent)
        t.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "ckpt")
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")  # dtype="auto"
        model.config.use_cache = False
        model.train()
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), bf16=True, use_cpu=True,
                                              report_to=[])
        assert args.optim == "adamw_torch_fused"
        cls, kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)
        optimizer = cls([p for p in model.parameters() if p.requires_grad], **kwargs)
    assert {p.dtype for p in model.parameters()} == {t.bfloat16}
    assert cls is t.optim.AdamW and kwargs.get("fused") is True
    batch = make_batch(vocab_size_of(model), 2, 16, device="cpu")
    m = measure_step(model, optimizer, batch, precision="bf16-autocast", device_type="cpu", memtracker=False)
    measured = {"parameters": m.parameters, "gradients": m.gradients, "optimizer_states": m.optimizer_states,
                "activations": m.retained, "peak": m.peak}
    est = fitplan.estimate(model=str(cfg_path), bf16=True, per_device_train_batch_size=2, max_seq_length=16,
                           device="cpu")
    predicted = {k: est[predicted_quantity(est, k)] for k in COMPONENTS}
    assert predicted == measured


def test_autocast_over_weights_of_the_other_16_bit_dtype_is_labelled_approximate(tmp_path):
    """bf16=True on an fp16 checkpoint (Llama-2): replayed on the autocast graph recorded over fp32 weights; the
    model states are exact, the activations within the stated band, and the confidence says approximate."""
    _torch()
    import fitplan_torch

    est = fitplan.estimate(model=str(bf16_config(tmp_path, "tiny-llama", "float16")), bf16=True,
                           per_device_train_batch_size=2, max_seq_length=16, device="cpu")
    assert est.scenario.training.precision == "bf16-autocast-fp16w"
    conf = est["memory_confidence"]
    assert conf["activations"]["level"] == "approximate" and conf["peak"]["level"] == "approximate"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fitplan_torch.validate(est, mode="cpu")
    c = report["components"]
    assert all(c[k]["relative_error"] == 0.0 for k in ("parameters", "gradients", "optimizer_states"))
    band = conf["peak"]["band"]
    assert abs(c["activations"]["relative_error"]) <= band and abs(c["peak"]["relative_error"]) <= band


def test_the_demo_job_fits_and_names_the_cheapest_gpu():
    """``make demo`` (its flags read from the Makefile) estimates a run that fits somewhere and says where it
    costs least: a B200/H100-class GPU holds 8B with bf16 weights and fused AdamW (2 + 2 + 4 B/param = 64 GB + the
    activations), a 24 GB card does not."""
    import re
    import shlex

    recipe = (ROOT / "Makefile").read_text().split("\ndemo: install\n", 1)[1].split("\n\n", 1)[0]
    args = shlex.split(re.sub(r"\\\n\s*", " ", recipe).split("fitplan estimate", 1)[1])
    proc = run_cli("estimate", *args, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["scenario"]["training"]["precision"] == "bf16-autocast"
    cheapest = data["cheapest"]
    assert "rtx-4090" not in cheapest["fits_on"] and "h100-sxm" in cheapest["fits_on"]
    assert cheapest["gpu"] in cheapest["fits_on"] and cheapest["on_demand_usd"] > 0
