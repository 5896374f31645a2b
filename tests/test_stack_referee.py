"""The referee runs the stacks users run, on the CPU: DeepSpeed 0.19.8 (gloo ranks, ``DS_ACCELERATOR=cpu``),
accelerate 1.16's FSDP2 / FSDP1 as the HF Trainer sets them up (gloo ranks) and bitsandbytes 0.50.2 (QLoRA, 8-bit
AdamW). Each category is measured from the engine's own tensors and must
equal fitplan's prediction; the wider matrix is bench/accuracy/run.py --groups stacks (docs/accuracy-stacks.md).

Skipped without deepspeed / bitsandbytes (``make install-test`` installs both). The DeepSpeed case takes
about 35 s on 2 cores (spawned ranks, DeepSpeed's import; its first run JIT-builds a small shm op, ~2 min);
the QLoRA case about 20 s; each accelerate FSDP case about 20 s.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import fitplan  # noqa: E402

TINY = str(Path(__file__).resolve().parent / "data" / "configs" / "tiny-llama" / "config.json")
EXACT = ("parameters", "gradients", "optimizer_states", "activations", "master_weights")


def validate(**fields):
    import fitplan_torch

    est = fitplan.estimate(model=TINY, per_device_train_batch_size=2, max_seq_length=32, **fields)
    return fitplan_torch.validate(est, mode="cpu")


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_deepspeed_zero2_two_ranks_every_category_exact():
    r = validate(zero_stage=2, num_gpus=2, precision="bf16-master")
    assert r["world_size"] == 2 and len(r["ranks"]) == 2
    for c in EXACT:
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    assert abs(r["components"]["peak"]["relative_error"]) < 0.01


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed")
def test_bitsandbytes_qlora_every_category_exact():
    r = validate(method="qlora", precision="bf16-true", lora_target_modules=("all-linear",), gradient_checkpointing=True)
    for c in ("parameters", "gradients", "optimizer_states", "activations", "peak"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])


ACCELERATE = importlib.util.find_spec("accelerate") is None


@pytest.mark.skipif(ACCELERATE, reason="accelerate is not installed")
def test_accelerate_fsdp2_two_ranks_every_category_exact():
    # the Trainer's default FSDP: fp32 shards, bf16 gathers (MixedPrecisionPolicy), the embedding its own unit and
    # [final norm, lm_head] a tail unit kept gathered from its forward to its backward (fsdp_utils.py:884-898)
    r = validate(fsdp="full_shard", num_gpus=2, precision="bf16-mixed")
    assert r["world_size"] == 2 and r["measured"]["wrapper"].startswith("FSDP")
    for c in ("parameters", "gradients", "optimizer_states"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    # a race of the CPU (gloo) run, measured: in about one run in three the embedding unit's gathered bf16 table
    # is still alive when the forward ends (+128,128 B); otherwise the activations are exact (docs/stacks.md)
    act, peak = r["components"]["activations"], r["components"]["peak"]
    assert act["measured"] - act["predicted"] in (0, EMBEDDING_GATHER_RACE), act
    assert abs(peak["relative_error"]) < 0.01 or 0 < peak["measured"] - peak["predicted"] <= EMBEDDING_GATHER_RACE, peak


EMBEDDING_GATHER_RACE = 128_128
"""Bytes measured in the racy outcome: the tiny Llama's 1,000 x 64 embedding gathered in bf16 (128,000 B) and 128 B."""


@pytest.mark.skipif(ACCELERATE, reason="accelerate is not installed")
def test_accelerate_fsdp1_checkpointing_every_category_exact():
    # FSDP1 flat parameters (use_orig_params=True), the root unit kept gathered, the plugin's activation
    # checkpointing; the flat gradients zero_grad leaves until the next forward are accounted (stale_flat_grads)
    r = validate(fsdp="full_shard", num_gpus=2, precision="bf16-mixed", stack="fsdp1", gradient_checkpointing=True)
    assert r["measured"]["wrapper"] == "FullyShardedDataParallel" and r["measured"]["stale_flat_grads"] > 0
    for c in ("parameters", "gradients", "optimizer_states", "activations"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    assert abs(r["components"]["peak"]["relative_error"]) < 0.01
