"""Several optimizer steps on the sharded stacks: the referee reports every step's peak and the highest, and runs
accelerate's FSDP1 / FSDP2 (fitplan_torch/trainer_fsdp.py) and DeepSpeed (fitplan_torch/trainer_ds.py, the ds_config
given to ``TrainingArguments(deepspeed=...)`` and to fitplan as ``--deepspeed`` / ``--training-args`` files) through
the real HF ``Trainer.train()``; fitplan's peak is compared with the highest step (issue #31, docs/accuracy-stacks.md).

The gloo cases take 30-50 s each on 2 moderately busy cores (load ~5), 90-150 s on very busy ones (two spawned ranks;
under DeepSpeed each rank imports it and loads its shm communication op); skipped without accelerate / deepspeed.
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


def test_validate_hands_the_users_ds_config_to_the_trainer_driver(tmp_path):
    # `fitplan validate --driver trainer` passes the ds_config as written ("auto" kept, for TrainingArguments to fill):
    # from --deepspeed, or from --training-args' deepspeed key (a path relative to that file, or inline)
    import json

    from fitplan.cli.commands.validate import user_ds_config

    ds = {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}, "bf16": {"enabled": "auto"}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    (tmp_path / "args.json").write_text(json.dumps({"bf16": True, "deepspeed": "ds.json"}))
    (tmp_path / "inline.json").write_text(json.dumps({"bf16": True, "deepspeed": ds}))
    assert user_ds_config({"deepspeed": str(tmp_path / "ds.json")}) == ds
    assert user_ds_config({"training_args": str(tmp_path / "args.json")}) == ds
    assert user_ds_config({"training_args": str(tmp_path / "inline.json")}) == ds
    assert user_ds_config({"deepspeed": None, "training_args": None}) is None


def test_gloo_reduce_scatter_clones_its_input_and_the_nccl_stand_in_does_not(tmp_path):
    # the premise of gloo_settle.reduce_scatter_like_nccl, measured on a 1-rank gloo group: torch's
    # reduce_scatter_single on gloo allocates a clone of the whole input (ProcessGroupGloo.cpp
    # reduce_scatter_tensor_coalesced); the stand-in allocates nothing and gives the same output
    import torch
    import torch.distributed as dist
    from fitplan_torch import gloo_settle
    from fitplan_torch.measure import LiveBytes

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    orig = dist.reduce_scatter_single
    try:
        peaks, outs = [], []
        for patched in (False, True):
            if patched:
                gloo_settle.reduce_scatter_like_nccl()
            data, out = torch.arange(1000, dtype=torch.float32), torch.empty(1000)
            with LiveBytes() as counter:
                counter.track([data, out])
                base = counter.current
                dist.reduce_scatter_single(output=out, input=data.clone(), op=dist.ReduceOp.SUM)
            peaks.append(counter.peak - base)
            outs.append(out)
        assert peaks == [2 * 4000, 4000]  # the caller's input copy (4,000 B), and gloo's clone of it only unpatched
        assert torch.equal(outs[0], outs[1])
    finally:
        dist.reduce_scatter_single = orig
        dist.destroy_process_group()


def test_live_storage_counter_can_skip_meta_storages():
    # DeepSpeed ZeRO-1/2 keep a meta copy of every parameter (runtime/zero/stage_1_and_2.py:485): a size, no memory;
    # the counter skips them when told (the DeepSpeed Trainer driver), and counts them otherwise (FakeTensorMode)
    import torch
    from fitplan_torch.measure import LiveBytes

    for skip, expected in ((True, 0), (False, 64 * 4)):
        with LiveBytes() as counter:
            counter.skip_meta = skip
            t = torch.zeros(64, device="meta")
        assert counter.peak == expected, (skip, counter.peak)
        del t


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


def test_trainer_driver_is_refused_outside_accelerate_fsdp_and_deepspeed():
    import fitplan_torch

    from fitplan.errors import FitplanError

    est = fitplan.estimate(**BASE, precision="bf16-mixed")  # two GPUs and nothing else: plain DDP
    assert est["stack_name"] == "ddp"
    with pytest.raises(FitplanError) as e:
        fitplan_torch.validate(est, mode="cpu", driver="trainer")
    assert "--driver" in e.value.render() and "ddp" in e.value.render()


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
def test_trainer_fsdp1_lora_saves_a_copy_of_each_adapter_input():
    # FSDP1 wraps every adapter Linear as its own unit; peft reads lora_A.weight.dtype before that unit is gathered
    # (the fp32 shard), casts its input to fp32 (peft 0.21 tuners/lora/layer.py:1100) and autocast casts it back to
    # bf16 inside F.linear, whose mm saves that copy: one bf16 copy per adapted module, where FSDP2's gathered bf16
    # adapter shares the norm's output between q_proj's and v_proj's lora_A. By hand: 2 layers x (2 adapted modules
    # - 1 shared input) x T = 2 x 32 tokens x hidden 64 x 2 bytes more saved than under FSDP2 (-0.91 % before)
    lora = dict(fsdp="full_shard", precision="bf16-mixed", method="lora", lora_target_modules=("q_proj", "v_proj"))
    f1 = fitplan.estimate(**BASE, **lora, stack="fsdp1")
    f2 = fitplan.estimate(**BASE, **lora, stack="fsdp2")
    assert f1["activation_bytes"] - f2["activation_bytes"] == LAYERS * (2 - 1) * (2 * 32) * 64 * 2
    r = trainer_run(stack="fsdp1", **lora)
    assert r["measured"]["wrapper"] == "FullyShardedDataParallel"
    for c in ("parameters", "gradients", "optimizer_states"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    assert abs(r["components"]["activations"]["relative_error"]) < 1e-4, r["components"]["activations"]
    assert_highest_step_within(r, 0.001)


@pytest.mark.skipif(ACCELERATE, reason="accelerate is not installed")
def test_trainer_fsdp2_bf16_checkpointing():
    r = trainer_run(fsdp="full_shard", stack="fsdp2", precision="bf16-mixed", gradient_checkpointing=True)
    m = r["measured"]
    assert m["driver"] == "trainer" and m["wrapper"].startswith("FSDP") and m["stale_flat_grads"] == 0
    for c in ("parameters", "optimizer_states"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    assert_highest_step_within(r, 0.01)


@pytest.mark.skipif(ACCELERATE, reason="accelerate is not installed")
def test_trainer_fsdp2_fp32_reduce_scatter_with_nccls_memory():
    # the LM head's reduce-scatter holds the peak at 2 x 32 tokens in fp32; gloo clones the whole reduce-scatter input
    # there (ProcessGroupGloo.cpp reduce_scatter_tensor_coalesced), NCCL does not (ncclReduceScatter on the buffers):
    # the referee runs FSDP2's reduce-scatter with NCCL's memory (gloo_settle.reduce_scatter_like_nccl); with gloo's
    # clone the highest step was 1.26 % above fitplan (docs/accuracy-stacks.md)
    r = trainer_run(fsdp="full_shard", stack="fsdp2", precision="32-true")
    for c in ("parameters", "optimizer_states"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    assert_highest_step_within(r, 0.01)


DEEPSPEED = importlib.util.find_spec("deepspeed") is None or ACCELERATE
AUTO_DS = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
           "gradient_clipping": "auto", "bf16": {"enabled": "auto"}}


def estimate_from_files(tmp_path, ds: dict, ta: dict, **flags):
    """fitplan fed the ds_config and the TrainingArguments as files (``--deepspeed`` / ``--training-args``)."""
    import json

    from fitplan.inputs.sources import from_options

    (tmp_path / "ds.json").write_text(json.dumps(ds))
    (tmp_path / "args.json").write_text(json.dumps(ta))
    opts = {"deepspeed": str(tmp_path / "ds.json"), "training_args": str(tmp_path / "args.json"), "model": TINY,
            "max_seq_length": 32, "num_gpus": 2, **flags}
    return fitplan.estimate(from_options(opts).scenario)


def trainer_ds_run(tmp_path, zero: dict, *, bf16: bool = True, ckpt: bool = False, **flags):
    import fitplan_torch

    ds = {**AUTO_DS, "zero_optimization": zero}
    ta = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "bf16": bf16, "optim": "adamw_torch_fused",
          "gradient_checkpointing": ckpt}
    est = estimate_from_files(tmp_path, ds, ta, **flags)
    assert est["stack_name"] == "deepspeed" and est.scenario.training.precision == ("bf16-master" if bf16 else "32-true")
    return fitplan_torch.validate(est, mode="cpu", driver="trainer", ds_config=ds, max_real_ranks=flags.get("num_gpus", 2))


@pytest.mark.skipif(DEEPSPEED, reason="deepspeed or accelerate is not installed")
def test_trainer_deepspeed_zero2_fills_auto_values_as_fitplan_does(tmp_path):
    # TrainingArguments(deepspeed=...) fills "auto": reduce_bucket_size = hidden² = 64 x 64
    # (HfTrainerDeepSpeedConfig.trainer_config_finalize, transformers/integrations/deepspeed.py), gradient_clipping =
    # max_grad_norm (1.0); no optimizer section: the Trainer's adamw_torch_fused (torch AdamW) is DeepSpeed's client
    r = trainer_ds_run(tmp_path, {"stage": 2, "reduce_bucket_size": "auto"})
    m = r["measured"]
    assert m["driver"] == "trainer" and m["wrapper"] == "DeepSpeedZeroOptimizer" and m["optimizer_class"] == "AdamW"
    assert m["resolved_ds_config"] == {"reduce_bucket_size": 64 * 64} and m["gradient_clipping"] == 1.0
    for c in ("parameters", "gradients", "optimizer_states", "master_weights"):
        assert r["components"][c]["relative_error"] == 0, (c, r["components"][c])
    assert_highest_step_within(r, 0.01)


@pytest.mark.skipif(DEEPSPEED, reason="deepspeed or accelerate is not installed")
def test_trainer_deepspeed_zero3_small_explicit_buckets_with_checkpointing(tmp_path):
    # explicit buckets far below the model (the "small buckets" misses): a 2,000-element IPG bucket,
    # 1,000-element prefetch, parameters of at most 100 elements persistent (the norms' 64 are); the Trainer's
    # gradient_checkpointing; fitplan reads the explicit values as written (nothing "auto" to fill here)
    zero = {"stage": 3, "reduce_bucket_size": 2000, "stage3_prefetch_bucket_size": 1000,
            "stage3_param_persistence_threshold": 100}
    r = trainer_ds_run(tmp_path, zero, ckpt=True)
    m = r["measured"]
    assert m["wrapper"] == "DeepSpeedZeroOptimizer_Stage3" and m["resolved_ds_config"] == {
        "reduce_bucket_size": 2000, "stage3_prefetch_bucket_size": 1000, "stage3_param_persistence_threshold": 100}
    for c in ("parameters", "gradients", "optimizer_states", "master_weights"):
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
