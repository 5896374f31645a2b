"""Several optimizer steps on the sharded stacks: the referee reports every step's peak and the highest, and runs
accelerate's FSDP1 / FSDP2 through the real HF ``Trainer.train()`` (fitplan_torch/trainer_fsdp.py); fitplan's peak
is compared with the highest step (issue #31, docs/accuracy-stacks.md).

The gloo cases take about 30 s each on 2 quiet cores, 60-80 s on busy ones (two spawned ranks); skipped without
accelerate / deepspeed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import fitplan

TINY = str(Path(__file__).resolve().parent / "data" / "configs" / "tiny-llama" / "config.json")
BASE = dict(model=TINY, per_device_train_batch_size=2, max_seq_length=32, num_gpus=2, optim="adamw_torch_fused")

# the tiny Llama (config.json): hidden 64, intermediate 176, 2 layers; one decoder layer's parameters are
# q, k, v, o (4 x 64 x 64) + gate, up, down (3 x 64 x 176) + two RMSNorm weights (2 x 64) = 50,304 elements
LAYER_ELEMENTS = 4 * 64 * 64 + 3 * 64 * 176 + 2 * 64
LAYERS = 2


def test_fsdp1_shard_grad_op_from_the_environment_keeps_every_layer_gathered():
    # FSDP1 runs FSDP_SHARDING_STRATEGY (accelerate launch exports it from an accelerate config), not the Trainer's
    # fsdp="shard_grad_op" (accelerate/utils/dataclasses.py:1719-1728, accelerator.py:1919): with it unset the
    # estimate is FULL_SHARD's; with SHARD_GRAD_OP every layer's flat buffer stays gathered from its forward to its
    # post-backward (torch/distributed/fsdp/_flat_param.py:112-119, _runtime_utils.py:496-500), so the backward
    # peak (at the loss gradient, both layers already gathered) grows by both layers' unsharded bf16 flat
    # parameters: 50,304 elements each (every parameter a multiple of 8 elements: no alignment padding; even:
    # no padding to N = 2) x 2 B
    kw = dict(BASE, fsdp="shard_grad_op", stack="fsdp1", precision="bf16-mixed")
    full = fitplan.estimate(**kw)
    sgo = fitplan.estimate(**kw, fsdp_sharding_strategy="shard_grad_op")
    assert full["effective_fsdp"] == "full_shard" and sgo["effective_fsdp"] == "shard_grad_op"
    assert "FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP" in sgo["stack_description"]
    assert full["peak_phase"] == sgo["peak_phase"] == "backward"
    assert sgo["peak_bytes"] - full["peak_bytes"] == LAYERS * LAYER_ELEMENTS * 2
    # the Trainer's own fsdp="full_shard" with the variable set to FULL_SHARD is the unset case
    explicit = fitplan.estimate(**dict(kw, fsdp="full_shard"), fsdp_sharding_strategy="full_shard")
    assert explicit["peak_bytes"] == full["peak_bytes"]


def test_fsdp_sharding_strategy_is_ignored_by_fsdp2():
    # FSDP2 reads reshard_after_forward, never FSDP_SHARDING_STRATEGY (dataclasses.py:1719: fsdp_version == 1 only)
    kw = dict(BASE, fsdp="full_shard", stack="fsdp2", precision="bf16-mixed")
    assert fitplan.estimate(**kw, fsdp_sharding_strategy="shard_grad_op")["peak_bytes"] == fitplan.estimate(**kw)["peak_bytes"]


pytest.importorskip("torch")
pytest.importorskip("transformers")
ACCELERATE = importlib.util.find_spec("accelerate") is None


def trainer_run(**fields):
    import fitplan_torch

    est = fitplan.estimate(**BASE, **fields)
    return fitplan_torch.validate(est, mode="cpu", driver="trainer")


def assert_highest_step_within(r, rel):
    m = r["measured"]
    peaks = m["step_peaks"]
    assert len(peaks) >= 4 and m["peak"] == max(peaks) and peaks[m["peak_step"] - 1] == m["peak"], m
    # the first step has no optimizer states until its optimizer step: a later step holds the peak
    assert m["peak_step"] >= 2 and peaks[0] < m["peak"], peaks
    assert abs(r["components"]["peak"]["relative_error"]) < rel, r["components"]["peak"]


def test_trainer_driver_is_refused_outside_accelerate_fsdp():
    import fitplan_torch
    from fitplan.errors import FitplanError

    est = fitplan.estimate(**BASE, zero_stage=2, precision="bf16-master")
    with pytest.raises(FitplanError) as e:
        fitplan_torch.validate(est, mode="cpu", driver="trainer")
    assert "--driver" in e.value.render() and "deepspeed" in e.value.render()


@pytest.mark.skipif(ACCELERATE, reason="accelerate is not installed")
def test_trainer_fsdp1_shard_grad_op_from_the_environment():
    r = trainer_run(fsdp="shard_grad_op", stack="fsdp1", precision="bf16-mixed", fsdp_sharding_strategy="shard_grad_op")
    m = r["measured"]
    assert m["driver"] == "trainer" and m["wrapper"] == "FullyShardedDataParallel"
    assert m["sharding_strategy"] == "ShardingStrategy.SHARD_GRAD_OP", m["sharding_strategy"]
    assert m["stale_flat_grads"] > 0  # Trainer's model.zero_grad() leaves FSDP1's flat gradients (use_orig_params)
    for c in ("parameters", "optimizer_states"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    assert_highest_step_within(r, 0.01)


@pytest.mark.skipif(ACCELERATE, reason="accelerate is not installed")
def test_trainer_fsdp2_bf16_checkpointing():
    r = trainer_run(fsdp="full_shard", stack="fsdp2", precision="bf16-mixed", gradient_checkpointing=True)
    m = r["measured"]
    assert m["driver"] == "trainer" and m["wrapper"].startswith("FSDP") and m["stale_flat_grads"] == 0
    for c in ("parameters", "optimizer_states"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    assert_highest_step_within(r, 0.01)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_deepspeed_zero2_auto_buckets_every_step():
    # HF's "auto" reduce_bucket_size is hidden² = 4,096 elements (transformers/integrations/deepspeed.py:232), far
    # below the tiny Llama's 98,624 parameters: the IPG bucket fills and is reduced many times per backward
    import fitplan_torch

    est = fitplan.estimate(**BASE, zero_stage=2, precision="bf16-master", reduce_bucket_size="auto")
    assert est["deepspeed_config_values"]["reduce_bucket_size"] == 64 * 64
    r = fitplan_torch.validate(est, mode="cpu")
    assert r["measured"]["wrapper"] == "DeepSpeedZeroOptimizer"
    for c in ("parameters", "gradients", "optimizer_states", "master_weights", "comm_buffers"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    assert_highest_step_within(r, 0.01)
