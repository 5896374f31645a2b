"""torchtune's ``optimizer_in_bwd`` (scenario field ``optimizer_in_bwd``; builtin/peak.py, builtin/model_states.py).

torchtune @ 30b8519 builds one optimizer per parameter and steps it in the parameter's post-accumulate-grad hook,
then frees the gradient (recipes/full_finetune_single_device.py ``_setup_optimizer``, torchtune/training/memory.py
``register_optim_in_bwd_hooks``). The hook runs on the CPU, so the torch referee measures it (fitplan_torch/
in_backward.py builds the same optimizers and hooks). Every scenario states ``optim`` and ``precision``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fitplan
from fitplan import FitplanError
from referee_support import fitplan_torch_referee

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "configs" / "tiny-llama" / "config.json")


def _tiny(**kw):
    base = dict(model=TINY, precision="bf16-true", optim="adamw_torch", per_device_train_batch_size=2, max_seq_length=64,
                device="cpu")
    return fitplan.estimate(**{**base, **kw})


def test_no_gradient_is_held_past_the_backward():
    """The optimizer step phase holds no gradient and no step temporaries; without optimizer_in_bwd it holds every
    gradient (tiny-llama full: 228,672 parameters, bf16: 2 bytes each) and foreach AdamW's state-sized list."""
    e, plain = _tiny(optimizer_in_bwd=True), _tiny()
    assert e["gradient_bytes"] == 0
    step, plain_step = e["phase_rows"]["optimizer_step"], plain["phase_rows"]["optimizer_step"]
    assert (step["gradients"], step["temporaries"]) == (0, 0)
    assert plain_step["gradients"] == 2 * 228_672
    assert e["weight_bytes"] == plain["weight_bytes"] == 2 * 228_672
    assert plain_step["temporaries"] == 2 * 228_672  # foreach AdamW: _foreach_sqrt(exp_avg_sqs), then in place
    gone = plain_step["gradients"] + plain_step["temporaries"]
    assert e["phase_bytes"]["optimizer_step"] == plain["phase_bytes"]["optimizer_step"] - gone


def test_accumulation_and_sharding_are_refused():
    with pytest.raises(FitplanError, match="gradient accumulation") as err:
        _tiny(optimizer_in_bwd=True, gradient_accumulation_steps=2)
    assert err.value.field.endswith("optimizer_in_bwd")
    with pytest.raises(FitplanError, match="one GPU"):
        _tiny(optimizer_in_bwd=True, num_gpus=2, device="cuda", gpu="a100-80gb")["peak_bytes"]


@pytest.mark.parametrize(("method", "loss", "ckpt", "optim"), [
    ("full", "hf", False, "adamw_torch"),           # foreach AdamW per parameter: its temporaries in the backward
    ("lora", "hf", True, "adamw_torch"),
    ("full", "chunked", True, "adamw_torch_fused"),  # the LM head's 8 gradients summed before its hook runs
])
def test_optimizer_in_bwd_against_torch(method, loss, ckpt, optim):
    fitplan_torch = fitplan_torch_referee()
    lora = dict(method="lora", lora_r=8, lora_target_modules=("q_proj", "v_proj")) if method == "lora" else {}
    est = _tiny(optim=optim, gradient_checkpointing=ckpt, loss_implementation=loss, optimizer_in_bwd=True, **lora)
    report = fitplan_torch.validate(est, mode="cpu", memtracker=False)
    off = {k: c["relative_error"] for k, c in report["components"].items()}
    # the chunked loss's +152 bytes: fitplan replays HF's label shift per chunk (docs/accuracy.md)
    assert all(abs(v) <= 0.001 for v in off.values()), off
    assert report["components"]["gradients"]["measured"] == 0
    assert report["peak_phase"]["predicted"] == report["peak_phase"]["measured"]
