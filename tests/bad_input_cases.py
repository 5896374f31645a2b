"""The corpus's cases of issue #30's second part (classes 1-2 on every channel), as data for
``tests/test_bad_input_corpus.py``: ``(id, files, argv, needles)`` rows, each a distinct input that must exit 2
naming the file, the field and the value.

Where a case stands for a library's refusal, the line it comes from is cited beside it; the TrainingArguments
rows are also checked against transformers itself (``tests/test_bad_input_corpus.py``
``test_training_args_refusals_are_transformers_own``), so that the corpus cannot drift from the library.
"""

from __future__ import annotations

import json

CASES: list[tuple[str, dict, list[str], list[str]]] = []


def case(cid, files, argv, *needles):
    CASES.append((cid, files, argv, list(needles)))


EST = ["estimate", "--model", "llama-2-7b", "--optim", "adamw_torch", "--precision", "bf16-mixed"]
DS_EST = ["estimate", "--model", "llama-2-7b", "--optim", "adamw_torch", "--precision", "bf16-master", "--num-gpus", "2"]

# ---- class 1: TrainingArguments' fsdp and fsdp_config (transformers/training_args.py _process_fsdp_args,
# accelerate/utils/dataclasses.py FullyShardedDataParallelPlugin.__post_init__, transformers/trainer.py:879)
TA_FSDP: list[tuple[str, dict, str]] = [
    ("ta-fsdp-unknown-word", {"fsdp": "full_shard offlaod"}, "Unknown `fsdp` option: offlaod"),  # :2938
    ("ta-fsdp-only-unknown", {"fsdp": ["shard_everything"]}, "Unknown `fsdp` option: shard_everything"),
    ("ta-fsdp2-hybrid", {"fsdp": "hybrid_shard"}, "only available with FSDP1"),  # :2927
    ("ta-fsdp2-no-shard", {"fsdp": "no_shard auto_wrap"}, "only available with FSDP1"),
    ("ta-fsdp2-hybrid-zero2", {"fsdp": ["hybrid_shard_zero2"]}, "only available with FSDP1"),
    ("ta-fsdp2-upper-case", {"fsdp": "FULL_SHARD"}, "only available with FSDP1"),  # the comparison is exact
    ("ta-fsdp-list-object", {"fsdp": ["full_shard", {"offload": True}]}, "fsdp must be true, a string or a list"),
    ("ta-fsdp-list-number", {"fsdp": ["full_shard", 3]}, "fsdp must be true, a string or a list of strings"),
    ("ta-fsdp-version-3", {"fsdp": True, "fsdp_config": {"version": 3}}, "version must be 1 or 2"),
    ("ta-fsdp-version-text", {"fsdp": True, "fsdp_config": {"fsdp_version": "two"}}, "version must be 1 or 2"),
    ("ta-fsdp-config-string", {"fsdp": True, "fsdp_config": "fsdp.json"}, "fsdp_config must be an object"),
    ("ta-fsdp-reshard-maybe", {"fsdp": True, "fsdp_config": {"reshard_after_forward": "maybe"}},
     "invalid truth value 'maybe'"),
    ("ta-fsdp1-reshard-bool", {"fsdp": True, "fsdp_config": {"version": 1, "reshard_after_forward": True}},
     "not supported with FSDP1"),  # dataclasses.py:1756
    ("ta-fsdp1-reshard-unknown", {"fsdp": True, "fsdp_config": {"version": 1, "reshard_after_forward": "zero_shard"}},
     "reshard_after_forward must be one of"),
    ("ta-fsdp-wrap-policy", {"fsdp": True, "fsdp_config": {"auto_wrap_policy": "LAYER_WRAP"}},
     "`auto_wrap_policy` must be one of"),  # training_args.py:2834
    ("ta-fsdp-min-params-text", {"fsdp": True, "fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP",
                                                                "min_num_params": "1e8"}}, "`min_num_params` must be an integer"),
    ("ta-fsdp-prefetch", {"fsdp": True, "fsdp_config": {"version": 1, "backward_prefetch": "backward_early"}},
     "backward_prefetch must be one of"),
    ("ta-fsdp-state-dict", {"fsdp": True, "fsdp_config": {"state_dict_type": "HALF_STATE_DICT"}},
     "state_dict_type must be one of"),
    ("ta-fsdp2-local-state-dict", {"fsdp": True, "fsdp_config": {"state_dict_type": "LOCAL_STATE_DICT"}},
     "FSDP2 does not support LOCAL_STATE_DICT"),  # dataclasses.py:1935
    ("ta-fsdp-ckpt-sometimes", {"fsdp": True, "fsdp_config": {"activation_checkpointing": "sometimes"}},
     "invalid truth value 'sometimes'"),
    ("ta-fsdp-version-fraction", {"fsdp": True, "fsdp_config": {"version": "1.5"}}, "version must be 1 or 2"),
    ("ta-fsdp-cpu-offload-text", {"fsdp": True, "fsdp_config": {"cpu_offload": "false"}}, "cpu_offload must be true or false"),
    ("ta-fsdp-orig-params", {"fsdp": True, "fsdp_config": {"version": 1, "use_orig_params": "perhaps"}},
     "invalid truth value 'perhaps'"),
    ("ta-fsdp-loading", {"fsdp": True, "fsdp_config": {"cpu_ram_efficient_loading": 2}}, "invalid truth value '2'"),
    ("ta-fsdp-ckpt-and-gc", {"fsdp": "full_shard", "gradient_checkpointing": True,
                             "fsdp_config": {"activation_checkpointing": True}}, "can't both be set to True"),
    ("ta-fsdp-ckpt-and-ac", {"fsdp": True, "activation_checkpointing": True,
                             "fsdp_config": {"fsdp_activation_checkpointing": "true"}}, "can't both be set to True"),
]
# ---- class 1: what TrainingArguments.__post_init__ refuses (transformers/training_args.py _validate_args)
TA_POST_INIT: list[tuple[str, dict, str]] = [
    ("ta-full-eval-both", {"bf16_full_eval": True, "fp16_full_eval": True}, "for full eval"),  # :1788
    ("ta-eval-strategy", {"eval_strategy": "sometimes"}, "not a valid IntervalStrategy"),
    ("ta-logging-strategy", {"logging_strategy": "hourly"}, "not a valid IntervalStrategy"),
    ("ta-save-strategy", {"save_strategy": "best_only"}, "not a valid SaveStrategy"),
    ("ta-logging-steps-zero", {"logging_steps": 0}, "requires non-zero --logging_steps"),  # :1733
    ("ta-logging-steps-fraction", {"logging_steps": 2.5}, "--logging_steps must be an integer"),  # :1737
    ("ta-save-steps-fraction", {"save_steps": 10.5}, "--save_steps must be an integer"),  # :1745
    ("ta-eval-steps-fraction", {"eval_strategy": "steps", "eval_steps": 3.5}, "--eval_steps must be an integer"),
    ("ta-eval-steps-none", {"eval_strategy": "steps", "logging_strategy": "no", "logging_steps": 0},
     "requires either non-zero --eval_steps"),  # :1580
    ("ta-best-model-mismatch", {"load_best_model_at_end": True, "eval_strategy": "epoch", "save_strategy": "steps"},
     "requires the save and eval strategy to match"),  # :1751
    ("ta-plateau-no-eval", {"lr_scheduler_type": "reduce_lr_on_plateau"}, "requires an eval strategy"),  # :1792
    ("ta-greedy-no-eval", {"lr_scheduler_type": "greedy"}, "requires an eval strategy"),  # :1798
    ("ta-warmup-negative", {"warmup_steps": -1}, "Expected value warmup_steps >= 0"),  # :1801
    ("ta-warmup-text", {"warmup_steps": "ten"}, "warmup_steps must be a number"),
    ("ta-empty-cache-zero", {"torch_empty_cache_steps": 0}, "`torch_empty_cache_steps` must be an integer"),  # :1727
    ("ta-empty-cache-fraction", {"torch_empty_cache_steps": 1.5}, "`torch_empty_cache_steps` must be an integer"),
    ("ta-prefetch-no-workers", {"dataloader_prefetch_factor": 2}, "--dataloader_prefetch_factor can only be set"),
]
for cid, data, needle in TA_FSDP + TA_POST_INIT:
    case(cid, {"ta.json": json.dumps(data).encode()},
         [*EST, "--num-gpus", "2", "--training-args", "{d}/ta.json"], needle, "ta.json")

# ---- class 1: accelerate YAML (accelerate launch's FSDP and DeepSpeed arguments; the plugin's refusals)
YAML_HEAD = "compute_environment: LOCAL_MACHINE\ndistributed_type: {dist}\nnum_machines: 1\nnum_processes: 2\n"


def fsdp_yaml(body: str, version: int = 2) -> bytes:
    return (YAML_HEAD.format(dist="FSDP") + f"fsdp_config:\n  fsdp_version: {version}\n" + body).encode()


for cid, body, needle in [
    ("yaml-fsdp-wrap-policy", fsdp_yaml("  fsdp_auto_wrap_policy: LAYER_WRAP\n"), "`auto_wrap_policy` must be one of"),
    ("yaml-fsdp-prefetch", fsdp_yaml("  fsdp_backward_prefetch: SOMETIMES\n", 1), "backward_prefetch must be one of"),
    ("yaml-fsdp-state-dict", fsdp_yaml("  fsdp_state_dict_type: HALF\n"), "state_dict_type must be one of"),
    ("yaml-fsdp2-local-state-dict", fsdp_yaml("  fsdp_state_dict_type: LOCAL_STATE_DICT\n"), "does not support LOCAL"),
    ("yaml-fsdp-ckpt-maybe", fsdp_yaml("  fsdp_activation_checkpointing: maybe\n"), "invalid truth value"),
    ("yaml-fsdp-ckpt-offload-alone", fsdp_yaml("  fsdp_activation_checkpointing_offload: true\n"),
     "requires `activation_checkpointing=True`"),
    ("yaml-fsdp1-ckpt-offload", fsdp_yaml("  fsdp_activation_checkpointing: true\n  fsdp_activation_checkpointing_offload: "
                                          "true\n", 1), "requires `fsdp_version=2`"),
    ("yaml-fsdp-min-params", fsdp_yaml("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: lots\n"),
     "`min_num_params` must be an integer"),
    ("yaml-fsdp-offload-perhaps", fsdp_yaml("  fsdp_offload_params: perhaps\n"), "invalid truth value"),
    ("yaml-fsdp-sync-states", fsdp_yaml("  fsdp_sync_module_states: 7\n", 1), "invalid truth value"),
    ("yaml-fsdp-version-3", fsdp_yaml("", 3), "fsdp_version must be 1 or 2"),
    ("yaml-fsdp-strategy-9", fsdp_yaml("  fsdp_sharding_strategy: 9\n", 1), "fsdp_sharding_strategy must be one of"),
    ("yaml-fsdp1-no-shard", fsdp_yaml("  fsdp_sharding_strategy: NO_SHARD\n", 1), "not modelled"),
    ("yaml-dist-type", YAML_HEAD.format(dist="FSDPP").encode(), "is not a valid DistributedType"),
    ("yaml-dist-missing", b"compute_environment: LOCAL_MACHINE\nnum_processes: 2\n", "distributed_type"),
    ("yaml-mixed-precision", (YAML_HEAD.format(dist="MULTI_GPU") + "mixed_precision: bf17\n").encode(), "mixed_precision"),
    ("yaml-processes-machines", YAML_HEAD.format(dist="MULTI_GPU").replace("num_machines: 1", "num_machines: 2")
     .replace("num_processes: 2", "num_processes: 3").encode(), "positive multiple"),
    ("yaml-unknown-key", (YAML_HEAD.format(dist="MULTI_GPU") + "num_processors: 2\n").encode(), "unknown keys"),
    ("yaml-sagemaker", YAML_HEAD.format(dist="MULTI_GPU").replace("LOCAL_MACHINE", "AMAZON_SAGEMAKER").encode(),
     "SageMaker"),
    ("yaml-ds-stage-5", (YAML_HEAD.format(dist="DEEPSPEED") + "deepspeed_config:\n  zero_stage: 5\n").encode(),
     "zero_stage must be 0, 1, 2 or 3"),
    ("yaml-ds-offload-gpu", (YAML_HEAD.format(dist="DEEPSPEED") + "deepspeed_config:\n  zero_stage: 3\n"
                             "  offload_param_device: gpu\n").encode(), "offload_param_device must be none, cpu or nvme"),
    ("yaml-ds-file-and-stage", (YAML_HEAD.format(dist="DEEPSPEED") + "deepspeed_config:\n  deepspeed_config_file: ds.json\n"
                                "  zero_stage: 2\n").encode(), "will be ignored"),
    ("yaml-not-mapping", b"- FSDP\n- 2\n", "must be a mapping"),
    ("yaml-syntax", b"distributed_type: [FSDP\n", "not valid YAML"),
    ("yaml-alias-bomb", b"a: &a [x, x]\nb: &b [*a, *a]\ndistributed_type: FSDP\n", "an alias"),
    ("yaml-deep", b"x: " + b"[" * 3000 + b"]" * 3000 + b"\n", "nested"),
    ("yaml-huge-int", b"num_processes: " + b"9" * 5000 + b"\n", "digits"),
    ("yaml-not-utf8", b"distributed_type: FSDP\xff\n", "not valid UTF-8"),
]:
    case(cid, {"acc.yaml": body}, [*EST, "--accelerate-config", "{d}/acc.yaml"], needle, "acc.yaml")
case("yaml-fifo", {"acc.yaml": "fifo"}, [*EST, "--accelerate-config", "{d}/acc.yaml"], "not a regular file", "acc.yaml")

# ---- class 1: stack flags that contradict each other (inputs/stacks.py, estimation.check_scenario)
for cid, argv, needle in [
    ("stack-ddp-with-fsdp", ["--num-gpus", "2", "--stack", "ddp", "--fsdp", "full_shard"], "--stack ddp does not shard"),
    ("stack-ddp-with-zero", ["--num-gpus", "2", "--stack", "ddp", "--zero", "1"], "--stack ddp does not shard"),
    ("stack-fsdp2-with-zero", ["--num-gpus", "2", "--stack", "fsdp2", "--zero", "2", "--fsdp", "full_shard"], "zero"),
    ("stack-fsdp2-no-strategy", ["--num-gpus", "2", "--stack", "fsdp2"], "needs an FSDP strategy"),
    ("stack-fsdp2-hybrid", ["--num-gpus", "2", "--fsdp", "hybrid_shard"], "hybrid_shard is an FSDP1 strategy"),
    ("stack-fsdp-half-offload", ["--num-gpus", "2", "--fsdp", "full_shard", "--offload-optimizer"], "offload"),
    ("stack-fsdp-master", ["--num-gpus", "2", "--fsdp", "full_shard", "--precision", "bf16-master"], "precision"),
    ("stack-deepspeed-fsdp", ["--num-gpus", "2", "--stack", "deepspeed", "--fsdp", "shard_grad_op"], "is FSDP, not DeepSpeed"),
    ("stack-offload-no-stack", ["--offload-params"], "--offload-params needs"),
    ("stack-bucket-no-deepspeed", ["--reduce-bucket-size", "5e8"], "is a DeepSpeed zero_optimization key"),
    ("stack-overlap-under-fsdp", ["--num-gpus", "2", "--fsdp", "full_shard", "--overlap-comm"], "overlap-comm"),
    ("stack-prefetch-under-ddp", ["--num-gpus", "2", "--stage3-prefetch-bucket-size", "1000"], "stack here is ddp"),
    ("stack-subgroup-under-torch", ["--num-gpus", "2", "--stack", "torch", "--zero", "3", "--sub-group-size", "1000"],
     "sub-group-size"),
]:
    case(cid, {}, [*EST, *argv], needle)
case("stack-scenario-zero-and-fsdp", {"s.toml": b'[model]\nmodel = "llama-2-7b"\n[hardware]\nnum_gpus = 2\n'
                                                 b'[parallel]\nzero_stage = 2\nfsdp = "full_shard"\n'},
     ["estimate", "{d}/s.toml"], "two different stacks")
case("stack-ta-fsdp-and-deepspeed", {"ta.json": json.dumps({"fsdp": "full_shard", "deepspeed": {
    "zero_optimization": {"stage": 2}}}).encode()}, [*EST, "--num-gpus", "2", "--training-args", "{d}/ta.json"],
     "two different stacks")

# ---- class 1: model configs transformers' config classes refuse (their strict types and relations)
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 512}
for cid, changes, needle in [
    ("config-layers-negative", {"num_hidden_layers": -2}, "$.num_hidden_layers"),
    ("config-intermediate-negative", {"intermediate_size": -2}, "$.intermediate_size"),
    ("config-intermediate-fraction", {"intermediate_size": 128.5}, "$.intermediate_size"),
    ("config-kv-heads-over-heads", {"num_key_value_heads": 8}, "num_key_value_heads"),
    ("config-heads-zero", {"num_attention_heads": 0}, "$.num_attention_heads"),
    ("config-tie-text", {"tie_word_embeddings": "no"}, "$.tie_word_embeddings"),
    ("config-torch-dtype-unknown", {"torch_dtype": "float17"}, "$.torch_dtype"),
    ("config-dtype-number", {"dtype": 16}, "$.dtype"),
    ("config-layers-huge", {"num_hidden_layers": 10**7}, "$.num_hidden_layers"),
    ("config-vocab-huge", {"vocab_size": 10**12}, "$.vocab_size"),
    ("config-head-dim-negative", {"head_dim": -4}, "$.head_dim"),
    ("config-experts-text", {"model_type": "mixtral", "num_local_experts": "8", "num_experts_per_tok": 2},
     "$.num_local_experts"),
    ("config-params-over-bound", {"hidden_size": 2**20, "num_attention_heads": 1024, "num_key_value_heads": 1024,
                                  "intermediate_size": 2**22, "num_hidden_layers": 1000}, "at most 1e+15"),  # class 2
]:
    case(cid, {"config.json": json.dumps({**CONFIG, **changes}).encode()},
         ["estimate", "--model", "{d}/config.json", "--optim", "adamw_torch", "--precision", "bf16-mixed"], needle, "config.json")

# ---- class 1: rulesets whose invariants break, references that resolve to nothing (estimate and rulesets check)
GPU = ('[[gpu]]\nid = "lab-gpu"\nname = "Lab"\nmemory_bytes = {mem}\nusable_bytes = {usable}\n'
       'peak_tflops = {{ bf16 = 100 }}\nbandwidth_gbps = 1000\nsource = "test"\n')
PRICE = ('[[provider]]\nid = "lab"\nname = "L"\nsource = "s"\n[[instance]]\nprovider = "{provider}"\nid = "x"\n'
         'gpu = "{gpu}"\ngpus = {gpus}\non_demand_per_hour = 3.0\n{extra}source = "s"\n')
for cid, body, needle in [
    ("rules-usable-over-total", GPU.format(mem="50_000_000_000", usable="60_000_000_000"), "exceeds memory_bytes"),
    ("rules-memory-zero", GPU.format(mem="0", usable="0"), "memory_bytes"),
    ("rules-usable-zero", GPU.format(mem="50_000_000_000", usable="0"), "usable_bytes"),
    ("rules-instance-no-gpus", PRICE.format(provider="lab", gpu="h100-sxm", gpus=0, extra=""), "gpus"),
    ("rules-instance-unknown-gpu", PRICE.format(provider="lab", gpu="h100-sxn", gpus=1, extra=""),
     "names gpu 'h100-sxn', which no ruleset defines"),
    ("rules-instance-unknown-provider", PRICE.format(provider="lbb", gpu="h100-sxm", gpus=1, extra=""),
     "names provider 'lbb', which no ruleset defines"),
    ("rules-calibration-unknown-gpu", '[[time_calibration]]\ngpu = "h100-sxn"\nscale = 1.2\n', "no ruleset defines"),
    ("rules-network-huge", PRICE.format(provider="lab", gpu="h100-sxm", gpus=1, extra="network_gbps = 1e9\n"),
     "network_gbps"),
    ("rules-spot-negative", PRICE.format(provider="lab", gpu="h100-sxm", gpus=1, extra="spot_per_hour = -1.0\n"),
     "spot_per_hour"),
]:
    case(cid, {"r/x.toml": body.encode()}, [*EST, "--ruleset-dir", "{d}/r"], needle)
    case(cid + "-check", {"r/x.toml": body.encode()}, ["rulesets", "check", "{d}/r"], needle)

# ---- class 1: policies and advice that can never fire (rulesets check, and at load with --policy)
POLICY = '[[policy]]\nid = "p"\ndescription = "d"\ncondition = {cond}\n'
ADVICE = '[[advice]]\nid = "a"\ncondition = {cond}\nmessage = "m"\n'
for cid, cond, needle in [
    ("never-method-case", '{ eq = { method = "LoRA" } }', "'LoRA' can never match"),
    ("never-method-typo", '{ ne = { method = "lorra" } }', "'lorra' can never match"),
    ("never-method-in-list", '{ in = { method = ["lora", "QLoRA"] } }', "'QLoRA' can never match"),
    ("never-precision-case", '{ eq = { precision = "BF16-mixed" } }', "can never match"),
    ("never-market-case", '{ eq = { market = "Spot" } }', "'Spot' can never match"),
    ("never-zero-stage-5", '{ eq = { zero_stage = 5 } }', "5 can never match"),
    ("never-zero-stage-text", '{ eq = { zero_stage = "2" } }', "'zero_stage' is a number"),
    ("never-stack-name", '{ eq = { stack = "DeepSpeed" } }', "can never match"),
    ("never-fsdp-upper", '{ eq = { fsdp = "FULL_SHARD" } }', "can never match"),
    ("never-padding", '{ not_in = { padding = ["packed"] } }', "'packed' can never match"),
    ("never-device", '{ eq = { device = "gpu" } }', "'gpu' can never match"),
    ("never-checkpointing-text", '{ eq = { gradient_checkpointing = "true" } }', "is true or false"),
    ("never-gpus-text", '{ ge = { num_gpus = "8" } }', "compares 'num_gpus' with a number"),
    ("never-attention-case", '{ eq = { attn_implementation = "SDPA" } }', "can never match"),
    ("never-gpu-id-case", '{ eq = { gpu = "H100-SXM" } }', "did you mean 'h100-sxm'?"),
    ("never-provider-id-case", '{ in = { "cost.provider" = ["Lambda"] } }', "'Lambda' can never match"),
]:
    case(cid + "-policy", {"p.toml": POLICY.format(cond=cond).encode()}, [*EST, "--policy", "{d}/p.toml"], needle, "p.toml")
    case(cid + "-check", {"r/x.toml": ADVICE.format(cond=cond).encode()}, ["rulesets", "check", "{d}/r"], needle)

# ---- class 2: every bound on every channel (flags, scenario TOML, TrainingArguments, DeepSpeed JSON, summaries)
for cid, argv, needle in [
    ("bound-bucket-huge", ["--reduce-bucket-size", "1e300"], "reduce_bucket_size"),
    ("bound-bucket-fraction", ["--reduce-bucket-size", "1.5"], "whole number"),
    ("bound-bucket-zero", ["--reduce-bucket-size", "0"], "reduce_bucket_size"),
    ("bound-prefetch-negative", ["--stage3-prefetch-bucket-size", "-5"], "stage3_prefetch_bucket_size"),
    ("bound-live-params-text", ["--stage3-max-live-parameters", "lots"], "stage3_max_live_parameters"),
    ("bound-reuse-inf", ["--stage3-max-reuse-distance", "inf"], "stage3_max_reuse_distance"),
    ("bound-gpus-times-nodes", ["--num-gpus", "65536", "--num-nodes", "2"], "num_gpus x num_nodes"),
]:
    case(cid, {}, [*DS_EST, "--zero", "3", *argv], needle)
for cid, argv, needle in [
    ("bound-optim-rank-huge", ["--optim", "galore_adamw", "--optim-target-modules", "q_proj", "--optim-args", "rank=1e300"],
     "rank must be an integer"),
    ("bound-optim-rank-negative", ["--optim", "galore_adamw", "--optim-target-modules", "q_proj", "--optim-args", "rank=-4"],
     "rank must be an integer"),
    ("bound-optim-rank-wide", ["--optim", "apollo_adamw", "--optim-target-modules", "q_proj", "--optim-args", "rank=100000"],
     "rank must be an integer"),
    ("bound-optim-momentum-nan", ["--optim", "sgd", "--optim-args", "momentum=nan"], "momentum must be a number"),
    ("bound-optim-momentum-two", ["--optim", "rmsprop", "--optim-args", "momentum=2"], "momentum must be a number"),
    ("bound-optim-momentum-negative", ["--optim", "sgd", "--optim-args", "momentum=-0.9"], "momentum must be a number"),
    ("bound-optim-centered", ["--optim", "rmsprop", "--optim-args", "centered=maybe"], "centered must be true or false"),
    ("bound-optim-block-zero", ["--optim", "adamw_torch_4bit", "--optim-args", "block_size=0"], "block_size"),
    ("bound-optim-not-pairs", ["--optim", "sgd", "--optim-args", "momentum"], "is not key=value"),
    ("bound-optim-two-equals", ["--optim", "sgd", "--optim-args", "momentum=0.9=1"], "is not key=value"),
    ("bound-examples-times-tokens", ["--num-examples", "1000000000000", "--tokens-per-example", "1000000"],
     "num_examples x tokens_per_example"),
    ("bound-total-tokens-huge", ["--total-tokens", "100000000000000000000"], "total_tokens"),
    ("bound-tokens-per-example-huge", ["--num-examples", "10", "--tokens-per-example", "1e10"], "tokens_per_example"),
    ("bound-tensor-parallel-huge", ["--tensor-parallel", "100000"], "tensor_parallel"),
    ("bound-nodes-huge", ["--num-nodes", "100000"], "num_nodes"),
    ("bound-accumulation-huge", ["--gradient-accumulation-steps", "99999999"], "gradient_accumulation_steps"),
    ("bound-lora-alpha-huge", ["--method", "lora", "--lora-alpha", "10000000000"], "lora_alpha"),
    ("bound-mfu-over-one", ["--mfu", "40"], "mfu"),
    ("bound-epochs-huge", ["--num-train-epochs", "1e9"], "num_train_epochs"),
]:
    case(cid, {}, [*[a for a in EST if a not in ("--optim", "adamw_torch")], *argv], needle)
for cid, body, needle in [
    ("bound-toml-bucket-huge", b'[parallel]\nzero_stage = 2\nreduce_bucket_size = "1e300"\n', "reduce_bucket_size"),
    ("bound-toml-optim-args", b'[training]\noptim = "sgd"\noptim_args = "momentum=inf"\n', "momentum"),
    ("bound-toml-gpus-times-nodes", b'[hardware]\nnum_gpus = 8\nnum_nodes = 10000\n', "num_gpus x num_nodes"),
    ("bound-toml-tokens-product", b'[dataset]\nnum_examples = 10000000000\ntokens_per_example = 1e8\n', "tokens_per_example"),
    ("bound-toml-tp-huge", b'[parallel]\ntensor_parallel = 1000000\n', "tensor_parallel"),
    ("bound-toml-runs-huge", b'[cost]\nruns = 10000000\n', "runs"),
]:
    case(cid, {"s.toml": b'[model]\nmodel = "llama-2-7b"\n' + body},
         ["estimate", "{d}/s.toml", "--precision", "bf16-mixed"], needle, "s.toml")
for cid, data, needle in [
    ("bound-ta-optim-args", {"optim": "galore_adamw", "optim_target_modules": ["q_proj"], "optim_args": "rank=0"}, "rank"),
    ("bound-ta-accumulation", {"gradient_accumulation_steps": 10**9}, "gradient_accumulation_steps"),
    ("bound-ta-seq-huge", {"max_length": 10**10}, "max_seq_length"),
    ("bound-ta-inline-ds-bucket", {"deepspeed": {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e300}}},
     "reduce_bucket_size"),
]:
    case(cid, {"ta.json": json.dumps(data).encode()}, [*EST, "--num-gpus", "2", "--training-args", "{d}/ta.json"],
         needle, "ta.json")
for cid, data, needle in [
    ("bound-ds-bucket-huge", {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e300}}, "reduce_bucket_size"),
    ("bound-ds-bucket-fraction", {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000.5}}, "reduce_bucket_size"),
    ("bound-ds-subgroup-negative", {"zero_optimization": {"stage": 3, "sub_group_size": -1}}, "sub_group_size"),
    ("bound-ds-micro-batch-huge", {"train_micro_batch_size_per_gpu": 10**8}, "per_device_train_batch_size"),
    ("bound-ds-accumulation-huge", {"gradient_accumulation_steps": 10**8}, "gradient_accumulation_steps"),
]:
    case(cid, {"ds.json": json.dumps(data).encode()}, [*DS_EST, "--deepspeed", "{d}/ds.json"], needle)
SUMMARY = ('format = "fitplan-dataset-summary"\nversion = 1\nkind = "text"\nexamples = {examples}\nread = {read}\n'
           'seed = {seed}\n[lengths]\nvalues = [{values}]\ncounts = [{counts}]\n')
for cid, fields, needle in [
    ("bound-summary-long-example", dict(examples=1, read=1, seed=0, values=10**12, counts=1), "an example of"),
    ("bound-summary-many-examples", dict(examples=10**15, read=10**15, seed=0, values=100, counts=10**15), "examples"),
    ("bound-summary-total-tokens", dict(examples=10**12, read=10**12, seed=0, values=10**8, counts=10**12), "tokens in all"),
    ("bound-summary-examples-huge", dict(examples=10**15, read=1, seed=0, values=100, counts=1), "examples"),
    ("bound-summary-seed-negative", dict(examples=1, read=1, seed=-1, values=100, counts=1), "seed"),
    ("bound-summary-seed-huge", dict(examples=1, read=1, seed=2**64, values=100, counts=1), "seed"),
    ("bound-summary-count-overflow", dict(examples=2**70, read=2**70, seed=0, values=1, counts=2**70), "examples"),
]:
    case(cid, {"s.toml": SUMMARY.format(**fields).encode()}, [*EST, "--dataset", "{d}/s.toml"], needle, "s.toml")
    if cid in ("bound-summary-long-example", "bound-summary-seed-negative"):
        case(cid + "-dataset", {"s.toml": SUMMARY.format(**fields).encode()}, ["dataset", "{d}/s.toml"], needle)

# ---- classes 3-8, more inputs: special files on every file channel (4), malformed content that was a crash (5)
for cid, flag, name in [("fifo-training-args", "--training-args", "ta.json"), ("fifo-deepspeed", "--deepspeed", "ds.json"),
                        ("fifo-policy", "--policy", "p.toml"), ("fifo-summary", "--dataset", "s.toml")]:
    case(cid, {name: "fifo"}, [*EST, flag, "{d}/" + name], "not a regular file", name)
case("fifo-ruleset-file", {"r/x.toml": "fifo"}, [*EST, "--ruleset-dir", "{d}/r"], "no *.toml files")  # never opened
case("dir-as-training-args", {"ta.json": "dir"}, [*EST, "--training-args", "{d}/ta.json"], "ta.json")
for cid, files, argv, needle in [
    ("ta-key-lone-surrogate", {"ta.json": b'{"optim_args": "rank=\\udfff"}'}, [*EST, "--training-args", "{d}/ta.json"],
     "lone surrogate"),
    ("ds-huge-int", {"ds.json": b'{"zero_optimization": {"stage": ' + b"9" * 5000 + b"}}"}, [*DS_EST, "--deepspeed", "{d}/ds.json"],
     "digits"),
    ("policy-huge-int", {"p.toml": POLICY.format(cond="{ gt = { peak_bytes = " + "9" * 5000 + " } }").encode()},
     [*EST, "--policy", "{d}/p.toml"], "digits"),
    ("ta-deep", {"ta.json": b'{"fsdp_config": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"},
     [*EST, "--training-args", "{d}/ta.json"], "nested"),
    ("summary-deep", {"s.toml": b"x = " + b"[" * 3000 + b"]" * 3000 + b"\n"}, [*EST, "--dataset", "{d}/s.toml"], "nested"),
    ("out-empty-graph", {}, ["graph", "--out", ""], "--out"),
    ("out-missing-dir-estimate", {}, [*EST, "--format", "json", "--out", "{d}/no/r.json"], "does not exist"),
]:
    case(cid, files, argv, needle)
