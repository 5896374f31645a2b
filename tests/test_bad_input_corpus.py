"""The bad-input corpus (docs/reliability.md): every channel a user feeds fitplan, with malformed content.

Each case runs the real command line in-process (``fitplan.cli.main``) and asserts what docs/reliability.md
guarantees: exit status 2, no traceback, the file or the field named in the message, nothing written or changed
in the case's folder, and no case over 10 seconds. A handful that need a fresh process (plugins, environment)
run in a subprocess at the end.
"""

from __future__ import annotations

import codecs
import json
import os
import time
from pathlib import Path

import pytest

from fitplan.cli import main

CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 512}
GPU = ('[[gpu]]\nid = "lab-gpu"\nname = "Lab"\nmemory_bytes = 50_000_000_000\nusable_bytes = 49_000_000_000\n'
       'peak_tflops = {{ bf16 = {tflops} }}\nbandwidth_gbps = 1000\nsource = "test"\n')
POLICY = '[[policy]]\nid = "p"\ndescription = "d"\ncondition = {cond}\n'


def cfg(**changes) -> bytes:
    return json.dumps({**CONFIG, **changes}).encode()


def nested_json(depth: int) -> bytes:
    return ('{"model_type": "llama", "x": ' + "[" * depth + "]" * depth + "}").encode()


# (id, files {name: bytes | "fifo" | "dir"}, argv with {d} for the case folder, needles in stderr)
CASES: list[tuple[str, dict, list[str], list[str]]] = []


def case(cid, files, argv, *needles):
    CASES.append((cid, files, argv, list(needles)))


# ---- scenario TOML files
for cid, body, needle in [
    ("scenario-not-utf8", b'[model]\nmodel = "llama-2-7b\xff"\n', "not valid UTF-8"),
    ("scenario-latin1", '[model]\nmodel = "café"\n'.encode("latin-1"), "not valid UTF-8"),
    ("scenario-malformed", b"[model\nmodel = 1\n", "malformed TOML"),
    ("scenario-unknown-key", b'[model]\nmodle = "x"\n', "modle"),
    ("scenario-unknown-section", b'[modle]\nmodel = "x"\n', "modle"),
    ("scenario-wrong-type", b'[model]\nmodel = "llama-2-7b"\n[training]\nper_device_train_batch_size = [4]\n',
     "per_device_train_batch_size"),
    ("scenario-bool-for-int", b'[model]\nmodel = "llama-2-7b"\n[training]\nmax_seq_length = true\n', "max_seq_length"),
    ("scenario-float-for-int", b'[model]\nmodel = "llama-2-7b"\n[training]\nmax_seq_length = 2048.5\n', "max_seq_length"),
    ("scenario-zero-batch", b'[model]\nmodel = "llama-2-7b"\n[training]\nper_device_train_batch_size = 0\n',
     "per_device_train_batch_size"),
    ("scenario-huge-batch", b'[model]\nmodel = "llama-2-7b"\n[training]\nper_device_train_batch_size = 100000000000\n',
     "per_device_train_batch_size"),
    ("scenario-huge-int", b'[training]\nmax_seq_length = ' + b"9" * 5000 + b"\n", "digits"),
    ("scenario-nan", b'[model]\nmodel = "llama-2-7b"\n[training]\nnum_train_epochs = nan\n', "non-finite"),
    ("scenario-inf", b'[model]\nmodel = "llama-2-7b"\n[cost]\ntokens_per_second = inf\n', "non-finite"),
    ("scenario-negative-epochs", b'[model]\nmodel = "llama-2-7b"\n[training]\nnum_train_epochs = -1.0\n',
     "num_train_epochs"),
    ("scenario-deep", b"x = " + b"[" * 3000 + b"]" * 3000 + b"\n", "nested"),
    ("scenario-long-string", b'[model]\nmodel = "' + b"a" * 300_000 + b'"\n', "Model.model"),
    ("scenario-control-chars", b'[model]\nmodel = "llama\\u001b[31m"\n', "Model.model"),
    ("scenario-lora-dropout", b'[model]\nmodel = "llama-2-7b"\nmethod = "lora"\n[lora]\nlora_dropout = 1.5\n',
     "lora_dropout"),
    ("scenario-empty-targets", b'[model]\nmodel = "llama-2-7b"\nmethod = "lora"\n[lora]\nlora_target_modules = []\n',
     "lora_target_modules"),
    ("scenario-mfu-percent", b'[model]\nmodel = "llama-2-7b"\n[cost]\nmfu = 40.0\n', "mfu"),
    ("scenario-empty", b"", "no model given"),
]:
    case(cid, {"s.toml": body}, ["estimate", "{d}/s.toml"], needle)
case("scenario-fifo", {"s.toml": "fifo"}, ["estimate", "{d}/s.toml"], "not a regular file", "s.toml")
case("scenario-directory", {"s.toml": "dir"}, ["estimate", "{d}/s.toml"], "is a directory")
case("scenario-missing", {}, ["estimate", "{d}/missing.toml"], "file not found", "missing.toml")

# ---- config.json
for cid, body, needle in [
    ("config-not-utf8", b'{"model_type": "llama\xff"}', "not valid UTF-8"),
    ("config-malformed", b'{"model_type": "llama",}', "malformed JSON"),
    ("config-not-object", b"[1, 2]", "model config must be a JSON object"),
    ("config-no-model-type", json.dumps({k: v for k, v in CONFIG.items() if k != "model_type"}).encode(), "model_type"),
    ("config-unknown-model-type", cfg(model_type="no_such_arch"), "no_such_arch"),
    ("config-model-type-number", cfg(model_type=7), "model_type"),
    ("config-dropout-string", cfg(attention_dropout="abc"), "$.attention_dropout"),
    ("config-dropout-over-one", cfg(attention_dropout=2.0), "$.attention_dropout"),
    ("config-hidden-null", cfg(hidden_size=None), "hidden_size"),
    ("config-hidden-string", cfg(hidden_size="64"), "$.hidden_size"),
    ("config-hidden-float", cfg(hidden_size=64.0), "$.hidden_size"),
    ("config-hidden-negative", cfg(hidden_size=-64), "$.hidden_size"),
    ("config-hidden-huge", cfg(hidden_size=10**12), "$.hidden_size"),
    ("config-not-divisible", cfg(hidden_size=100, num_attention_heads=3), "must be a multiple"),
    ("config-zero-kv-heads", cfg(num_key_value_heads=0), "$.num_key_value_heads"),
    ("config-kv-not-dividing", cfg(num_key_value_heads=3), "num_key_value_heads"),
    ("config-head-dim-zero", cfg(head_dim=0), "$.head_dim"),
    ("config-negative-experts", cfg(model_type="mixtral", num_local_experts=-2, num_experts_per_tok=2),
     "$.num_local_experts"),
    ("config-topk-over-experts", cfg(model_type="mixtral", num_local_experts=4, num_experts_per_tok=8),
     "num_experts_per_tok"),
    ("config-bias-string", cfg(attention_bias="yes"), "$.attention_bias"),
    ("config-layers-bool", cfg(num_hidden_layers=True), "num_hidden_layers"),
    ("config-vocab-zero", cfg(vocab_size=0), "vocab_size"),
    ("config-huge-int", b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}", "digits"),
    # a config.json is read as transformers reads it (json.loads: NaN and Infinity are floats, inputs/files.py);
    # a field fitplan uses then refuses the non-finite value by name
    ("config-nan", b'{"model_type": "llama", "attention_dropout": NaN}', "attention_dropout must be a number"),
    ("config-infinity", b'{"model_type": "llama", "hidden_size": Infinity}', "hidden_size must be an integer, got inf"),
    ("config-tagged-infinity", b'{"model_type": "llama", "hidden_size": {"__float__": "Infinity"}}',
     "hidden_size must be an integer, got inf"),
    ("config-deep", nested_json(100_000), "nested"),
    ("config-deep-70", nested_json(70), "nested more than 64 levels"),
]:
    case(cid, {"config.json": body}, ["estimate", "--model", "{d}/config.json"], needle)
case("config-utf16-is-read", {"config.json": codecs.BOM_UTF16_LE + cfg(hidden_size=100, num_attention_heads=3)
                                                                  .decode().encode("utf-16-le")},
     ["estimate", "--model", "{d}/config.json"], "must be a multiple")
case("config-dir-without-config", {"m": "dir"}, ["estimate", "--model", "{d}/m"], "file not found")
case("config-fifo", {"config.json": "fifo"}, ["estimate", "--model", "{d}/config.json"], "not a regular file")

# ---- DeepSpeed and TrainingArguments JSON
for cid, body, needle in [
    ("ds-not-utf8", b'{"zero_optimization": {"stage": 2}\xff}', "not valid UTF-8"),
    ("ds-malformed", b'{"zero_optimization": ', "malformed JSON"),
    ("ds-stage-7", b'{"zero_optimization": {"stage": 7}}', "zero_optimization.stage"),
    ("ds-zero-not-object", b'{"zero_optimization": 2}', "zero_optimization"),
    ("ds-offload-device", b'{"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}}', "offload_param"),
    ("ds-micro-batch-zero", b'{"train_micro_batch_size_per_gpu": 0}', "train_micro_batch_size_per_gpu"),
    ("ds-micro-batch-string", b'{"train_micro_batch_size_per_gpu": "4"}', "train_micro_batch_size_per_gpu"),
    ("ds-nan", b'{"gradient_clipping": NaN}', "non-finite"),
    ("ds-list", b"[]", "expected a JSON object"),
    ("ds-deep", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
]:
    case(cid, {"ds.json": body}, ["estimate", "--model", "llama-2-7b", "--num-gpus", "2", "--deepspeed", "{d}/ds.json"],
         needle, "ds.json")
case("ds-empty-path", {}, ["estimate", "--model", "llama-2-7b", "--deepspeed", ""], "--deepspeed")
case("ds-missing", {}, ["estimate", "--model", "llama-2-7b", "--deepspeed", "{d}/nope.json"], "nope.json")
for cid, body, needle in [
    ("ta-not-utf8", b'{"per_device_train_batch_size": 4\xff}', "not valid UTF-8"),
    ("ta-batch-zero", b'{"per_device_train_batch_size": 0}', "per_device_train_batch_size"),
    ("ta-bf16-and-fp16", b'{"bf16": true, "fp16": true}', "bf16 and fp16"),
    ("ta-bf16-string", b'{"bf16": "yes"}', "bf16"),
    ("ta-optim-unknown", b'{"optim": "adamw_torh"}', "optim"),
    ("ta-fsdp-bad", b'{"fsdp": "shard_everything"}', "fsdp"),
    ("ta-deepspeed-number", b'{"deepspeed": 3}', "deepspeed"),
    ("ta-epochs-negative", b'{"num_train_epochs": -1}', "num_train_epochs"),
    ("ta-huge-int", b'{"per_device_train_batch_size": ' + b"9" * 6000 + b"}", "digits"),
]:
    case(cid, {"ta.json": body}, ["estimate", "--model", "llama-2-7b", "--training-args", "{d}/ta.json"], needle, "ta.json")

# ---- policies
for cid, body, needle in [
    ("policy-not-utf8", b'[[policy]]\nid = "p\xff"\n', "not valid UTF-8"),
    ("policy-none", b'[[gpu]]\n', "policy"),
    ("policy-unknown-name", POLICY.format(cond='{ gt = { peak_byte = 1 } }').encode(), "peak_byte"),
    ("policy-type-mismatch", POLICY.format(cond='{ gt = { method = 3 } }').encode(), "method"),
    ("policy-text-vs-number", POLICY.format(cond='{ eq = { peak_bytes = "big" } }').encode(), "peak_bytes"),
    ("policy-unknown-operator", POLICY.format(cond='{ gtt = { peak_bytes = 1 } }').encode(), "gtt"),
    ("policy-deep-not", POLICY.format(cond="{ not = " * 400 + "{ gt = { peak_bytes = 1 } }" + " }" * 400).encode(),
     "nested"),
    ("policy-nan-penalty", (POLICY.format(cond='{ gt = { peak_bytes = 1 } }') + 'action = "penalise"\npenalty = nan\n').encode(),
     "non-finite"),
    ("policy-negative-penalty", (POLICY.format(cond='{ gt = { peak_bytes = 1 } }') + 'action = "penalise"\npenalty = -1.0\n').encode(),
     "penalty"),
    ("policy-uppercase-id", POLICY.replace('"p"', '"P"').format(cond='{ gt = { peak_bytes = 1 } }').encode(), "lowercase"),
    ("policy-empty-all", POLICY.format(cond="{ all = [] }").encode(), "non-empty list"),
]:
    case(cid, {"policy.toml": body}, ["estimate", "--model", "llama-2-7b", "--policy", "{d}/policy.toml"], needle)

# ---- ruleset directories and `rulesets check`
RULESET_CASES = [
    ("rules-not-utf8", b'[[gpu]]\nid = "lab\xff"\n', "not valid UTF-8"),
    ("rules-nan-tflops", GPU.format(tflops="nan").encode(), "non-finite"),
    ("rules-inf-tflops", GPU.format(tflops="inf").encode(), "non-finite"),
    ("rules-negative-tflops", GPU.format(tflops="-100").encode(), "peak_tflops"),
    ("rules-zero-tflops", GPU.format(tflops="0").encode(), "peak_tflops"),
    ("rules-huge-tflops", GPU.format(tflops="1e12").encode(), "peak_tflops"),
    ("rules-unknown-dtype", GPU.format(tflops="100, bf17 = 2").encode(), "bf17"),
    ("rules-uppercase-gpu", GPU.format(tflops="100").replace('"lab-gpu"', '"Lab-GPU"').encode(), "lowercase"),
    ("rules-usable-huge", GPU.format(tflops="100").replace("49_000_000_000", "4_900_000_000_000_000").encode(), "usable_bytes"),
    ("rules-price-nan", b'[[provider]]\nid = "lab"\nname = "L"\nsource = "s"\n[[instance]]\nprovider = "lab"\nid = "x"\n'
                        b'gpu = "h100-sxm"\ngpus = 1\non_demand_per_hour = nan\nsource = "s"\n', "non-finite"),
    ("rules-price-negative", b'[[provider]]\nid = "lab"\nname = "L"\nsource = "s"\n[[instance]]\nprovider = "lab"\nid = "x"\n'
                             b'gpu = "h100-sxm"\ngpus = 1\non_demand_per_hour = -3.0\nsource = "s"\n', "on_demand_per_hour"),
    ("rules-unknown-key", b'[[gpu]]\nidd = "x"\n', "idd"),
    ("rules-duplicate-id", GPU.format(tflops="100").encode() * 2, "duplicate gpu id"),
    ("rules-advice-width", b'[[advice]]\nid = "a"\ncondition = { gt = { peak_bytes = 1 } }\n'
                           b'message = "{peak_bytes:>200000000}"\n', "format spec"),
    ("rules-advice-bad-spec", b'[[advice]]\nid = "a"\ncondition = { gt = { peak_bytes = 1 } }\nmessage = "{peak_bytes:Q}"\n',
     "format spec"),
    ("rules-advice-attribute", b'[[advice]]\nid = "a"\ncondition = { gt = { peak_bytes = 1 } }\n'
                               b'message = "{peak_bytes.__class__}"\n', "attribute"),
    ("rules-model-bad-config", b'[[model]]\nid = "m"\nsource = "s"\nconfig = { model_type = "llama", hidden_size = "x" }\n',
     "hidden_size"),
    ("rules-deep", b"x = " + b"[" * 3000 + b"]" * 3000 + b"\n", "nested"),
    ("rules-tiny-tflops", GPU.format(tflops="1e-300").encode(), "must be at least 0.001"),
    ("rules-tiny-bandwidth", GPU.format(tflops="100").replace("bandwidth_gbps = 1000", "bandwidth_gbps = 1e-300").encode(),
     "bandwidth_gbps"),
    ("rules-calibration-scale-huge", b'[[time_calibration]]\ngpu = "h100-sxm"\nscale = 1e9\n', "scale"),
]
for cid, body, needle in RULESET_CASES:
    case(cid, {"r/x.toml": body}, ["estimate", "--model", "llama-2-7b", "--ruleset-dir", "{d}/r"], needle)
    case(cid + "-check", {"r/x.toml": body}, ["rulesets", "check", "{d}/r"], needle)
case("rules-dir-missing", {}, ["estimate", "--model", "llama-2-7b", "--ruleset-dir", "{d}/nope"], "nope")
case("rules-dir-empty-check", {"r": "dir"}, ["rulesets", "check", "{d}/r"], "no *.toml files")

# ---- SkyPilot CSV
HEADER = b"InstanceType,AcceleratorName,AcceleratorCount,Price,SpotPrice,Region\n"
for cid, body, needle in [
    ("csv-not-utf8", HEADER + b"p5.48xlarge,H100\xff,8,55.0,,us-east-1\n", "not valid UTF-8"),
    ("csv-missing-columns", b"InstanceType,Price\np5,1\n", "header lacks"),
    ("csv-huge-field", HEADER + b"p5," + b"H" * 200_000 + b",8,55.0,,us-east-1\n", "malformed CSV"),
    ("csv-bad-price", HEADER + b"p5.48xlarge,H100,8,cheap,,us-east-1\n", "Price"),
    ("csv-nan-price", HEADER + b"p5.48xlarge,H100,8,nan,,us-east-1\n", "Price"),
    ("csv-bad-count", HEADER + b"p5.48xlarge,H100,2.5,55.0,,us-east-1\n", "AcceleratorCount"),
    ("csv-empty", b"", "empty file"),
]:
    case(cid, {"aws_vms.csv": body}, ["rulesets", "import-skypilot", "{d}/aws_vms.csv", "--out", "{d}/out.toml"], needle)

# ---- flags
for cid, argv, needle in [
    ("flag-params-overflow", ["--params", "1e309"], "params"),
    ("flag-params-huge", ["--params", "1e20"], "at most"),
    ("flag-params-text", ["--params", "seven"], "cannot read"),
    ("flag-params-long", ["--params", "9" * 100_000], "params"),
    ("flag-tps-inf", ["--params", "7B", "--tokens-per-second", "inf"], "tokens_per_second"),
    ("flag-tps-nan", ["--params", "7B", "--tokens-per-second", "nan"], "tokens_per_second"),
    ("flag-epochs-nan", ["--params", "7B", "--num-train-epochs", "nan"], "num_train_epochs"),
    ("flag-lora-dropout-nan", ["--model", "llama-2-7b", "--method", "lora", "--lora-dropout", "nan"], "lora_dropout"),
    ("flag-lora-r-huge", ["--model", "llama-2-7b", "--method", "lora", "--lora-r", "100000000"], "lora_r"),
    ("flag-batch-huge", ["--params", "7B", "--per-device-train-batch-size", "99999999999"], "per_device_train_batch_size"),
    ("flag-seq-huge", ["--params", "7B", "--max-seq-length", "999999999"], "max_seq_length"),
    ("flag-gpus-huge", ["--params", "7B", "--num-gpus", "99999999"], "num_gpus"),
    ("flag-model-markup", ["--model", "[/]"], "unknown model '[/]'"),
    ("flag-model-markup-red", ["--model", "[red]llama-2-7b"], "[red]llama-2-7b"),
    ("flag-model-escape", ["--model", "llama\x1b[31m"], "Model.model"),
    ("flag-model-long", ["--model", "x" * 3_000_000], "Model.model"),
    ("flag-gpu-long", ["--params", "7B", "--gpu", "g" * 100_000], "Hardware.gpu"),
    ("flag-gpu-unknown", ["--params", "7B", "--gpu", "a100-80g"], "a100-80gb"),
    ("flag-optim-unknown", ["--params", "7B", "--optim", "adamw_torh"], "adamw_torch"),
    ("flag-both-model-params", ["--params", "7B", "--model", "llama-2-7b"], "either --model or --params"),
    ("flag-bf16-fp16", ["--params", "7B", "--bf16", "--fp16"], "--bf16/--fp16"),
    ("flag-lora-target-missing", ["--model", "llama-2-7b", "--method", "lora", "--lora-target-modules", "q_prj"],
     "lora_target_modules"),
]:
    case(cid, {}, ["estimate", *argv], needle)
for cid, argv, needle in [
    ("recommend-headroom-overflow", ["--headroom", "1e308GB"], "--headroom"),
    ("recommend-headroom-text", ["--headroom", "lots"], "--headroom"),
    ("recommend-headroom-one", ["--headroom", "1.5"], "--headroom"),
    ("recommend-batch-huge", ["--effective-batch-size", "1000000000000"], "--effective-batch-size"),
    ("recommend-batch-float", ["--effective-batch-size", "1e12"], "--effective-batch-size"),
    ("recommend-top-zero", ["--top", "0"], "--top"),
    ("recommend-max-gpus-huge", ["--max-gpus", "100000"], "--max-gpus"),
    ("recommend-unknown-gpus", ["--gpus", "h100-sx"], "h100-sxm"),
    ("recommend-unknown-method", ["--methods", "lora,qlorra"], "qlora"),
    ("recommend-unknown-market", ["--markets", "spott"], "spot"),
    ("recommend-unknown-vary", ["--vary", "colour"], "precision"),
    ("recommend-vary-fixed", ["--vary", "optim", "--optim", "sgd"], "fixes optim"),
]:
    case(cid, {}, ["recommend", "--model", "llama-2-7b", "--num-examples", "100", "--tokens-per-example", "100", *argv],
         needle)

# ---- datasets (--dataset, fitplan dataset; docs/dataset.md): a word-level tokenizer small enough to inline
TOKENIZER = json.dumps({"version": "1.0", "added_tokens": [], "normalizer": None,
                        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
                        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hi": 1}, "unk_token": "[UNK]"}}).encode()
RAISES = json.dumps({"eos_token": "[UNK]", "chat_template": "{{ raise_exception('no system role') }}"}).encode()
TOK = {"tok/tokenizer.json": TOKENIZER, "tok/tokenizer_config.json": RAISES}
DATASET = ["dataset", "{d}/d.jsonl", "--tokenizer", "{d}/tok"]
for cid, body, needles in [
    ("dataset-malformed-line", b'{"text": "hi"}\n{"text": "hi"\n', ("d.jsonl", "line 2: malformed JSON")),
    ("dataset-missing-field", b'{"text": "hi"}\n{"body": "hi"}\n', ("d.jsonl", "line 2: no field 'text'", "@ text")),
    ("dataset-not-utf8", b'{"text": "hi"}\n{"text": "h\xe9"}\n', ("d.jsonl", "line 2: not UTF-8", "@ text")),
    ("dataset-text-not-string", b'{"text": ["hi"]}\n', ("line 1: field 'text' is a list",)),
    ("dataset-not-an-object", b'["hi"]\n', ("line 1: expected a JSON object",)),
    ("dataset-template-error", b'{"messages": [{"role": "system", "content": "hi"}]}\n',
     ("line 1: the chat template failed: no system role", "@ messages")),
    ("dataset-bad-message", b'{"messages": [{"role": "user", "content": "hi"}, "hi"]}\n', ("messages[1]",)),
    ("dataset-empty", b"\n\n", ("the dataset has no records",)),
]:
    case(cid, {"d.jsonl": body, **TOK}, DATASET, *needles)
case("dataset-fifo", {"d.jsonl": "fifo", **TOK}, DATASET, "not a regular file", "d.jsonl")
case("dataset-missing", TOK, DATASET, "dataset not found", "d.jsonl")
case("dataset-unknown-format", {"d.txt": b"hi", **TOK}, ["dataset", "{d}/d.txt", "--tokenizer", "{d}/tok"],
     "cannot read a .txt file")
case("dataset-no-tokenizer-json", {"d.jsonl": b'{"text": "hi"}\n', "tok/tokenizer_config.json": RAISES}, DATASET,
     "no tokenizer.json")
case("dataset-bad-tokenizer-config", {"d.jsonl": b'{"text": "hi"}\n', "tok/tokenizer.json": TOKENIZER,
                                      "tok/tokenizer_config.json": b"{"}, DATASET, "tokenizer_config.json")
case("dataset-summary-invalid", {"s.toml": b'format = "fitplan-dataset-summary"\nversion = 1\n'},
     ["dataset", "{d}/s.toml"], "not a valid dataset summary", "s.toml")
case("dataset-summary-not-utf8", {"s.toml": b'format = "\xff"\n'}, ["dataset", "{d}/s.toml"], "not valid UTF-8")
case("dataset-with-total-tokens", {"d.jsonl": b'{"text": "hi"}\n', **TOK},
     ["estimate", "--model", "llama-2-7b", "--dataset", "{d}/d.jsonl", "--tokenizer", "{d}/tok", "--total-tokens", "9"],
     "--total-tokens cannot be given with it")
case("dataset-needs-a-tokenizer", {"d.jsonl": b'{"text": "hi"}\n'}, ["estimate", "--params", "7B", "--dataset",
                                                                      "{d}/d.jsonl"], "needs a tokenizer")
case("padding-longest-without-dataset", {}, ["estimate", "--model", "llama-2-7b", "--total-tokens", "9",
                                             "--padding", "longest"], "--padding longest needs")
case("dataset-out-onto-directory", {"d.jsonl": b'{"text": "hi"}\n', "o": "dir", **TOK},
     [*DATASET, "--out", "{d}/o"], "is a directory")
case("dataset-sample-zero", {"d.jsonl": b'{"text": "hi"}\n', **TOK}, [*DATASET, "--sample", "0"], "--sample")

# ---- output paths (nothing half-written, nothing replaced)
case("out-missing-dir", {}, ["recommend", "--model", "llama-2-7b", "--gpus", "a100-80gb", "--providers", "lambda",
                             "--objective", "gpus", "--top", "1", "--format", "json", "--out", "{d}/no/such/dir/r.json"],
     "does not exist")
case("out-is-dir", {"r.json": "dir"}, ["estimate", "--model", "llama-2-7b", "--format", "json", "--out", "{d}/r.json"],
     "is a directory")
case("emit-into-full-folder", {"plan/old.txt": b"keep me", "r.html": b"old report"},
     ["recommend", "--model", "llama-2-7b", "--gpus", "a100-80gb", "--providers", "lambda", "--objective", "gpus",
      "--top", "1", "--format", "html", "--out", "{d}/r.html", "--emit", "all", "{d}/plan"], "--force")
case("emit-onto-a-file", {"plan": b"a file"}, ["recommend", "--model", "llama-2-7b", "--gpus", "a100-80gb",
                                               "--providers", "lambda", "--objective", "gpus", "--emit", "all", "{d}/plan"],
     "is a file")
case("graph-out-onto-file", {"g": b"a file"}, ["graph", "--out", "{d}/g"], "g")
case("explain-unknown", {}, ["explain", "peak_byte"], "peak_bytes")


# ---- second pass (fitplan issue #30): output all-or-nothing, exit 70 on bad input, bounds on every channel
REC = ["recommend", "--model", "llama-2-7b", "--gpus", "a100-80gb", "--providers", "lambda", "--objective", "gpus",
       "--top", "1", "--methods", "lora", "--precisions", "bf16-mixed", "--optims", "adamw_torch", "--markets",
       "on_demand", "--max-gpus", "1", "--max-nodes", "1", "--per-device-train-batch-size", "1"]  # a 3-plan search
case("out-empty", {}, ["estimate", "--model", "llama-2-7b", "--out", ""], "is empty", "--out")
case("out-trailing-slash", {}, ["estimate", "--model", "llama-2-7b", "--out", "{d}/report/"], "path separator")
case("emit-failure-keeps-the-report", {"r.json": b"old report", "plan/accelerate_config.yaml": "dir"},
     [*REC, "--format", "json", "--out", "{d}/r.json", "--emit", "all", "{d}/plan", "--force"], "is a directory")
case("emit-second-folder-fails-first-not-made", {"p2/accelerate_config.yaml": "dir"},
     [*REC, "--emit", "scenario", "{d}/p1", "--emit", "accelerate", "{d}/p2", "--force"], "accelerate_config.yaml")
case("graph-out-second-file-fails", {"g/fitplan-graph.mmd": "dir"}, ["graph", "--out", "{d}/g"], "fitplan-graph.mmd")
CALIBRATE = ["calibrate", "{d}/trainer_state.json", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--precision",
             "bf16-mixed", "--optim", "adamw_torch", "--out", "{d}/c.toml"]
for cid, body, needle in [
    ("calibrate-log-history-number", b'{"log_history": 5}', "log_history"),
    ("calibrate-zero-step-time", b'{"log_history": [{"train_runtime": 1e-300, "step": 1e300}]}', "train_runtime / step"),
    ("calibrate-batch-text", b'{"train_batch_size": "8", "log_history": [{"train_runtime": 10, "step": 10}]}',
     "train_batch_size"),
    ("calibrate-runtime-text", b'{"train_runtime": "x", "train_steps_per_second": 1}', "train_runtime"),
    ("calibrate-scale-unusable", b'{"log_history": [{"train_runtime": 1e9, "step": 1}]}', "nothing written"),
    ("calibrate-lone-surrogate", b'{"log_history": [{"train_runtime": 10, "step": 10, "note": "\\ud800"}]}',
     "lone surrogate"),
]:
    case(cid, {"trainer_state.json": body}, CALIBRATE, needle)
case("config-lone-surrogate", {"config.json": cfg(hidden_act="\ud800").replace(b"\\\\ud800", b"\\ud800")},
     ["estimate", "--model", "{d}/config.json"], "lone surrogate", "$.hidden_act")
case("ta-lone-surrogate", {"ta.json": b'{"optim": "adamw\\udc00"}'},
     ["estimate", "--model", "llama-2-7b", "--training-args", "{d}/ta.json"], "lone surrogate", "$.optim")
for cid, body, needles in [
    ("dataset-lone-surrogate", b'{"text": "hi"}\n{"text": "a\\ud800"}\n', ("line 2: a lone surrogate", "@ text")),
    ("dataset-huge-int", b'{"text": "hi", "n": ' + b"9" * 5000 + b"}\n", ("line 1: malformed JSON",)),
    ("dataset-deep", b'{"text": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", ("line 1", "nested too deeply")),
]:
    case(cid, {"d.jsonl": body, **TOK}, DATASET, *needles)
case("dataset-json-array-huge-int", {"d.json": b'[{"text": ' + b"9" * 5000 + b"}]", **TOK},
     ["dataset", "{d}/d.json", "--tokenizer", "{d}/tok"], "malformed JSON")
case("hub-revision-long", {}, ["estimate", "--model", "org/name@" + "a" * 300], "not a revision", "--model")
case("hub-revision-dotdot", {}, ["estimate", "--model", "org/name@../../../etc"], "not a revision")
case("hub-tokenizer-revision-long", {"d.jsonl": b'{"text": "hi"}\n'},
     ["dataset", "{d}/d.jsonl", "--tokenizer", "org/name@" + "b" * 300], "not a revision", "--tokenizer")

from bad_input_cases import CASES as SECOND_PART  # noqa: E402 - issue #30's classes 1-2 on every channel, and more

CASES += SECOND_PART


def _make(d: Path, files: dict) -> None:
    for name, body in files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if body == "fifo":
            os.mkfifo(p)
        elif body == "dir":
            p.mkdir()
        else:
            p.write_bytes(body)


def _state(d: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(d.rglob("*")) if not p.is_fifo()}


def run_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_the_corpus_is_large():
    assert len(CASES) >= 350
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("cid", "files", "argv", "needles"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, capsys, cid, files, argv, needles):
    _make(tmp_path, files)
    before = _state(tmp_path)
    t0 = time.perf_counter()
    code, out, err = run_in_process([a.replace("{d}", str(tmp_path)) for a in argv], capsys)
    elapsed = time.perf_counter() - t0
    assert code == 2, (code, out[-500:], err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out
    for needle in needles:
        assert needle in err, (needle, err[-2000:])
    assert "\x1b[31m" not in err  # no terminal escape sequence from the input reaches the terminal
    assert _state(tmp_path) == before  # nothing written, nothing replaced
    assert elapsed < 10, elapsed


# ---- second pass (issue #30): what a case table cannot say (valid input accepted, links and modes kept,
# signals, the environment, the cache's trust, plugins)
EST = ["estimate", "--model", "llama-2-7b", "--optim", "adamw_torch", "--precision", "bf16-mixed", "--format", "json"]


def test_out_through_a_symlink_writes_the_target_and_keeps_its_mode(tmp_path, capsys):
    target = tmp_path / "private.json"
    target.write_bytes(b"old")
    target.chmod(0o600)
    (tmp_path / "link.json").symlink_to(target)
    code, _, err = run_in_process([*EST, "--out", str(tmp_path / "link.json")], capsys)
    assert code == 0, err
    assert (tmp_path / "link.json").is_symlink() and os.readlink(tmp_path / "link.json") == str(target)
    assert json.loads(target.read_bytes())["model"]["name"] == "llama-2-7b"
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "private.json"]  # no temporary left


def test_a_new_report_gets_the_umask_mode(tmp_path, capsys):
    old = os.umask(0o027)
    try:
        code, _, err = run_in_process([*EST, "--out", str(tmp_path / "r.json")], capsys)
    finally:
        os.umask(old)
    assert code == 0, err
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o640  # 0666 & ~0027


def test_a_failed_rename_puts_back_the_files_already_replaced(tmp_path, monkeypatch):
    from fitplan import files

    (tmp_path / "a").write_bytes(b"old a")
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the second file's rename fails (a full disk, a lost mount)
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(files.FitplanError, match="No space left"):
        files.write_all([(tmp_path / "a", b"new a"), (tmp_path / "b", b"new b")])
    assert (tmp_path / "a").read_bytes() == b"old a" and not (tmp_path / "b").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


@pytest.mark.parametrize("space", ["\u00a0", "\u202f"], ids=["nbsp", "narrow-nbsp"])
def test_paths_with_unicode_spaces_are_read(tmp_path, capsys, space):
    d = tmp_path / f"my{space}model"
    d.mkdir()
    (d / "config.json").write_bytes(cfg())
    (d / "s.toml").write_text(f'[model]\nmodel = "{d / "config.json"}"\n', encoding="utf-8")
    code, _, err = run_in_process(["estimate", str(d / "s.toml"), "--optim", "adamw_torch", "--precision", "bf16-mixed",
                                   "--max-seq-length", "512", "--out", str(d / "r.json"), "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads((d / "r.json").read_bytes())["model"]["name"] == f"my{space}model"


def test_control_and_format_characters_are_still_refused():
    from fitplan.inputs.field_checks import printable

    assert printable("a\u00a0b\u202fc d\u3000e")
    assert not printable("a\u202eb")  # a right-to-left override
    assert not printable("a\u2028b")  # a line separator
    assert not printable("a\x1bb")


@pytest.mark.parametrize("name,body", [("d.csv", b"\xef\xbb\xbftext\nhi\nhi hi\n"),
                                       ("d.jsonl", b'\xef\xbb\xbf{"text": "hi"}\n{"text": "hi hi"}\n'),
                                       ("d.json", b'\xef\xbb\xbf[{"text": "hi"}, {"text": "hi hi"}]')])
def test_datasets_with_a_utf8_byte_order_mark_are_read(tmp_path, capsys, name, body):
    _make(tmp_path, {name: body, **TOK})
    code, out, err = run_in_process(["dataset", str(tmp_path / name), "--tokenizer", str(tmp_path / "tok"),
                                     "--format", "json", "--no-cache"], capsys)
    assert code == 0, err
    assert '"examples": 2' in out.replace("\n", " ").replace("  ", " ") or json.loads(out)["examples"] == 2


def test_a_line_longer_than_the_bound_is_an_error_not_a_read_to_its_end(tmp_path, capsys, monkeypatch):
    from fitplan.data import readers

    monkeypatch.setattr(readers, "MAX_LINE", 1000)
    _make(tmp_path, {"d.jsonl": b'{"text": "hi"}\n{"text": "' + b"a" * 5000 + b'"}\n', **TOK})
    code, _, err = run_in_process(["dataset", str(tmp_path / "d.jsonl"), "--tokenizer", str(tmp_path / "tok"),
                                   "--no-cache"], capsys)
    assert code == 2 and "line 2 is longer than 1,000 bytes" in err, err


def test_ctrl_c_inside_a_command_exits_130(capsys, monkeypatch):
    import signal

    from fitplan.cli.commands import estimate

    def interrupted(options):
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT, delivered inside the command
        time.sleep(5)

    monkeypatch.setattr(estimate, "estimate_from", interrupted)
    code, _, err = run_in_process(EST, capsys)
    assert code == 130 and "interrupted" in err, (code, err)


def test_an_unwritable_stdout_exits_1_naming_it():
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "fitplan", *EST], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "standard output: No space left on device" in proc.stderr and "Traceback" not in proc.stderr


def test_a_plugin_memory_quantity_of_nan_is_named():
    import fitplan
    from fitplan import PluginError, hookimpl, quantity
    from fitplan.pluginmgr.registry import make_registry

    class NanBytes:
        @hookimpl
        def fitplan_register_quantities(self, register):
            @quantity("bytes", category="memory")
            def lookup_table_bytes(param_count):
                """NaN bytes by mistake."""
                return float("nan")

            register(lookup_table_bytes)

    with pytest.raises(PluginError, match="plugin 'NanBytes': quantity 'lookup_table_bytes' returned float nan"):
        fitplan.estimate(params="1B", registry=make_registry(entry_points=False, extra_plugins=[("NanBytes", NanBytes())]))


# ---- the disk cache: special files, trust, no code from a planted entry
def test_a_fifo_where_a_cache_entry_belongs_is_never_read(tmp_path, monkeypatch):
    from fitplan import diskcache

    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(tmp_path / "c"))
    diskcache.store("traces", "x.pickle", "key", [1, 2])
    assert diskcache.load("traces", "x.pickle", "key") == [1, 2]
    os.unlink(tmp_path / "c" / "traces" / "x.pickle")
    os.mkfifo(tmp_path / "c" / "traces" / "x.pickle")
    t0 = time.perf_counter()
    assert diskcache.load("traces", "x.pickle", "key") is None
    assert time.perf_counter() - t0 < 1


def test_cache_folders_are_created_private(tmp_path, monkeypatch):
    from fitplan import diskcache

    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(tmp_path / "a" / "b"))
    diskcache.store("traces", "x.pickle", "key", 1)
    for d in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "traces"):
        assert d.stat().st_mode & 0o777 == 0o700, d


def test_a_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch, capsys):
    from fitplan import diskcache

    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(diskcache, "_WARNED", set())
    diskcache.store("traces", "x.pickle", "key", 1)
    (tmp_path / "c").chmod(0o777)
    assert diskcache.load("traces", "x.pickle", "key") is None
    assert "can be written by others (mode 0777)" in capsys.readouterr().err
    diskcache.store("traces", "y.pickle", "key", 1)
    assert not (tmp_path / "c" / "traces" / "y.pickle").exists()


def test_a_planted_pickle_runs_no_code(tmp_path, monkeypatch):
    import pickle

    from fitplan import diskcache

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(tmp_path / "c"))
    diskcache.store("traces", "x.pickle", "key", 1)
    (tmp_path / "c" / "traces" / "x.pickle").write_bytes(pickle.dumps(("key", Evil())))
    assert diskcache.load("traces", "x.pickle", "key") is None
    assert not (tmp_path / "pwned").exists()


def test_every_kept_entry_loads_through_the_allow_list(tmp_path):
    """The allow-list holds every type the three kinds keep: after a command, each entry on disk loads."""
    import io

    from fitplan import diskcache

    import subprocess
    import sys

    env = {**os.environ, "FITPLAN_CACHE_DIR": str(tmp_path / "c")}  # a fresh process: nothing kept in memory
    proc = subprocess.run([sys.executable, "-m", "fitplan", *EST, "--gpu", "a100-80gb", "--total-tokens", "1000000"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    entries = sorted((tmp_path / "c").rglob("*.pickle"))
    assert {p.parent.name for p in entries} >= {"rulesets", "traces"}
    for p in entries:
        diskcache._Unpickler(io.BytesIO(p.read_bytes())).load()


# ---- plugins: BaseException at import, printing at import, names that clash
def _plugin(fitplan_entry_points, tmp_path, dist, eps: dict[str, str], modules: dict[str, str]):
    src = tmp_path / f"src-{dist}"
    src.mkdir()
    for name, text in modules.items():
        (src / f"{name}.py").write_text(text, encoding="utf-8")
    return fitplan_entry_points(dist, eps, src=src)


def _errors(**kw) -> list[str]:
    from fitplan.pluginmgr.registry import make_registry

    return [e.render() for e in make_registry(**kw).errors]


def test_a_base_exception_at_a_plugins_import_is_its_error(fitplan_entry_points, tmp_path):
    _plugin(fitplan_entry_points, tmp_path, "fitplan-boom", {"boom": "boom_plugin"},
            {"boom_plugin": "class Boom(BaseException):\n    pass\n\nraise Boom('at import')\n"})
    errors = _errors(entry_points=["boom"])
    assert any("plugin 'boom' (boom_plugin) failed to load: Boom: at import" in e for e in errors), errors


def test_a_plugin_printing_at_import_does_not_reach_stdout(fitplan_entry_points, tmp_path, capsys):
    _plugin(fitplan_entry_points, tmp_path, "fitplan-noisy", {"noisy": "noisy_plugin"},
            {"noisy_plugin": "print('hello from a plugin')\n"})
    assert _errors(entry_points=["noisy"]) == []
    out, err = capsys.readouterr()
    assert out == "" and "hello from a plugin" in err


def test_an_entry_point_named_like_a_builtin_is_refused(fitplan_entry_points, tmp_path):
    _plugin(fitplan_entry_points, tmp_path, "fitplan-impostor", {"cost": "impostor_plugin"}, {"impostor_plugin": ""})
    errors = _errors(entry_points=["cost"])
    assert any("entry point 'cost' of distribution fitplan-impostor 0.0.0 has the name of a built-in plugin" in e
               for e in errors), errors


def test_two_distributions_with_one_entry_point_name_are_both_named(fitplan_entry_points, tmp_path):
    _plugin(fitplan_entry_points, tmp_path, "fitplan-one", {"same": "same_one"}, {"same_one": ""})
    _plugin(fitplan_entry_points, tmp_path, "fitplan-two", {"same": "same_two"}, {"same_two": ""})
    errors = _errors(entry_points=["same"])
    assert any("'same' is declared by distribution fitplan-" in e and "and again by fitplan-" in e
               and "fitplan-one" in e and "fitplan-two" in e for e in errors), errors


def test_a_base_exception_while_a_quantity_is_evaluated_names_the_plugin():
    import fitplan
    from fitplan import PluginError, hookimpl, quantity
    from fitplan.pluginmgr.registry import make_registry

    class Stop(BaseException):
        pass

    class Stops:
        @hookimpl
        def fitplan_register_quantities(self, register):
            @quantity("bytes", category="memory")
            def lookup_table_bytes(param_count):
                """Raises a BaseException of its own."""
                raise Stop("no")

            register(lookup_table_bytes)

    with pytest.raises(PluginError, match="plugin 'Stops': quantity 'lookup_table_bytes' raised Stop: no"):
        fitplan.estimate(params="1B", registry=make_registry(entry_points=False, extra_plugins=[("Stops", Stops())]))


def test_a_dangling_link_among_learned_architecture_files_is_no_internal_error(tmp_path, capsys, monkeypatch):
    (tmp_path / "gone.json").symlink_to(tmp_path / "nowhere.json")
    monkeypatch.setenv("FITPLAN_ARCH_DIR", str(tmp_path))
    code, _, err = run_in_process([*EST, "--max-seq-length", "1024"], capsys)
    assert code == 0, err


def test_learn_architecture_on_a_model_type_transformers_does_not_know(tmp_path):
    """Was an internal error (transformers' ValueError listing every model type); a fresh process: torch."""
    import subprocess
    import sys

    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_bytes(cfg(model_type="lama"))
    proc = subprocess.run([sys.executable, "-m", "fitplan", "learn-architecture", str(tmp_path / "config.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "transformers has no model_type 'lama'" in proc.stderr and "'llama'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_builtin_failing_on_accepted_input_is_not_a_plugin_to_block():
    """Bad input that slipped past the checks must not be blamed on a built-in the user cannot block."""
    import fitplan
    from fitplan import PluginError, hookimpl, quantity
    from fitplan.errors import FitplanError
    from fitplan.pluginmgr.registry import make_registry

    class Divides:
        @hookimpl
        def fitplan_register_quantities(self, register):
            @quantity("bytes", category="memory")
            def lookup_table_bytes(param_count):
                """Divides by zero on this input."""
                return param_count // 0

            register(lookup_table_bytes)

    reg = make_registry(entry_points=False, extra_plugins=[("fitplan.builtin.lookup", Divides())])
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(params="1B", registry=reg)
    assert not isinstance(e.value, PluginError)
    assert "fitplan cannot compute quantity 'lookup_table_bytes' for these inputs: ZeroDivisionError" in e.value.render()
    assert "FITPLAN_BLOCK_PLUGINS" not in e.value.render()


def test_a_planted_pickle_cannot_use_a_class_a_fitplan_module_imported(tmp_path, monkeypatch):
    """``fitplan.x.Popen`` (a module's ``from subprocess import Popen``) is not fitplan's class: refused."""
    import pickle
    import subprocess

    from fitplan import diskcache

    monkeypatch.setattr(diskcache, "Popen", subprocess.Popen, raising=False)
    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(tmp_path / "c"))
    diskcache.store("traces", "x.pickle", "key", 1)
    command = pickle.dumps(["touch", str(tmp_path / "pwned")], protocol=2)[2:-1]  # the list, without PROTO and STOP
    blob = b"\x80\x02X\x03\x00\x00\x00key" + b"cfitplan.diskcache\nPopen\n" + command + b"\x85R\x86."
    (tmp_path / "c" / "traces" / "x.pickle").write_bytes(blob)
    assert diskcache.load("traces", "x.pickle", "key") is None
    time.sleep(0.2)
    assert not (tmp_path / "pwned").exists()


def test_a_fifo_among_learned_architecture_files_hangs_nothing(tmp_path):
    """A FIFO named like an architecture file in the user's folder: skipped, never opened (a fresh process
    with a timeout, so that a regression fails instead of hanging the suite)."""
    import subprocess
    import sys

    os.mkfifo(tmp_path / "llama.json")
    os.mkfifo(tmp_path / "llama.graphs.json")
    env = {**os.environ, "FITPLAN_ARCH_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "fitplan", *EST, "--max-seq-length", "1024"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_dataset_summary_cache_others_can_write_is_not_used(tmp_path, capsys, monkeypatch):
    from fitplan import diskcache

    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(diskcache, "_WARNED", set())
    monkeypatch.setattr(diskcache, "_TRUSTED", set())
    _make(tmp_path, {"d.jsonl": b'{"text": "hi"}\n', **TOK})
    argv = ["dataset", str(tmp_path / "d.jsonl"), "--tokenizer", str(tmp_path / "tok"), "--format", "json"]
    assert run_in_process(argv, capsys)[0] == 0
    assert len(list((tmp_path / "c" / "datasets").glob("*.toml"))) == 1
    assert (tmp_path / "c" / "datasets").stat().st_mode & 0o777 == 0o700
    (tmp_path / "c").chmod(0o777)
    monkeypatch.setattr(diskcache, "_TRUSTED", set())
    from fitplan.data import resolve

    monkeypatch.setattr(resolve, "_MEMO", {})  # as a new process: the summary is looked up in the cache again
    code, _, err = run_in_process(argv, capsys)
    assert code == 0 and "can be written by others (mode 0777); the cache is not used" in err


def test_a_plugin_quantity_of_nan_of_any_kind_is_named():
    """Not only memory: a third-party float that is NaN would reach the JSON writer (an internal error)."""
    import fitplan
    from fitplan import PluginError, hookimpl, quantity
    from fitplan.pluginmgr.registry import make_registry

    class NanSeconds:
        @hookimpl
        def fitplan_register_quantities(self, register):
            @quantity("s")
            def warmup_seconds(param_count):
                """NaN seconds by mistake."""
                return float("nan")

            register(warmup_seconds)

    reg = make_registry(entry_points=False, extra_plugins=[("NanSeconds", NanSeconds())])
    with pytest.raises(PluginError, match="plugin 'NanSeconds': quantity 'warmup_seconds' returned float nan, expected a finite number"):
        fitplan.estimate(params="1B", registry=reg)


# ---- issue #30, classes 1-2: the library's own refusals, valid input accepted, the API, plugin values
LIBRARY_ELSEWHERE = {
    "ta-fsdp1-reshard-bool": "plugin", "ta-fsdp1-reshard-unknown": "plugin", "ta-fsdp-prefetch": "plugin",
    "ta-fsdp-state-dict": "plugin", "ta-fsdp2-local-state-dict": "plugin",
    "ta-fsdp-ckpt-and-gc": "Trainer.__init__ (transformers/trainer.py:879), after TrainingArguments",
    "ta-fsdp-ckpt-and-ac": "Trainer.__init__ (transformers/trainer.py:879), after TrainingArguments",
    "ta-fsdp-version-3": "fitplan: accelerate has FSDP1 and FSDP2 only (dataclasses.py tests fsdp_version == 1 or 2)",
    "ta-fsdp-cpu-offload-text": "fitplan: transformers tests it for truth (training_args.py:2830), so \"false\" offloads",
}
"""The TrainingArguments rows that ``TrainingArguments(**row)`` itself does not refuse, and who does: accelerate's
``FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)`` ("plugin"), the Trainer, or fitplan, with its reason."""


def test_training_args_refusals_are_transformers_own():
    """Every TrainingArguments row of the corpus, given to transformers 5.24 itself: TrainingArguments (or, where
    stated, accelerate's FSDP plugin built from its fsdp_plugin_args) refuses it, so fitplan's refusals are the
    library's, measured, not fitplan's idea of it."""
    import warnings

    pytest.importorskip("transformers")
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    from bad_input_cases import TA_FSDP, TA_POST_INIT

    wrong = []
    for cid, data, _ in TA_FSDP + TA_POST_INIT:
        where = LIBRARY_ELSEWHERE.get(cid, "TrainingArguments")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                args = TrainingArguments(output_dir="unused", use_cpu=True, **data)
            except (ValueError, TypeError, AttributeError, OSError):
                if where != "TrainingArguments":
                    wrong.append((cid, "TrainingArguments refused it"))
                continue
        if where == "TrainingArguments":
            wrong.append((cid, "TrainingArguments accepted it"))
        elif where == "plugin":
            with pytest.raises((ValueError, KeyError)):
                FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert wrong == []


ACCEPTED_TA = [
    ({"fsdp": True}, {"stack": "fsdp2", "fsdp": "full_shard"}),  # training_args.py:2793: fsdp=True
    ({"fsdp": 1}, {"stack": "fsdp2", "fsdp": "full_shard"}),  # any other true value is fsdp=True
    ({"fsdp": "auto_wrap"}, {"stack": "fsdp2", "fsdp": "full_shard"}),  # no strategy: reshard_after_forward True
    ({"fsdp": True, "fsdp_config": {"reshard_after_forward": "no"}}, {"fsdp": "shard_grad_op"}),  # str_to_bool
    ({"fsdp": "full_shard shard_grad_op"}, {"fsdp": "full_shard"}),  # setdefault: the first word wins
    ({"fsdp": "shard_grad_op", "fsdp_config": {"fsdp_reshard_after_forward": True}}, {"fsdp": "full_shard"}),
    ({"fsdp": ["hybrid_shard"], "fsdp_config": {"version": "1"}}, {"stack": "fsdp1", "fsdp": "hybrid_shard"}),
    ({"fsdp": True, "fsdp_config": {"version": 1, "reshard_after_forward": 2}}, {"stack": "fsdp1", "fsdp": "shard_grad_op"}),
    ({"fsdp": "full_shard offload"}, {"offload_params": True, "offload_optimizer": True}),
    ({"fsdp": True, "fsdp_config": {"activation_checkpointing": "yes"}}, {"gradient_checkpointing": True}),
    ({"activation_checkpointing": True, "gradient_checkpointing": False}, {"gradient_checkpointing": True}),
    ({"fsdp": "", "fsdp_config": {"version": 7}}, {}),  # no fsdp: fsdp_config is never read
    ({"fsdp": True, "fsdp_config": {"activation_checkpointing_offload": True}}, {"stack": "fsdp2"}),  # not passed on
    ({"save_strategy": "best", "load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 10}, {}),
]


@pytest.mark.parametrize(("data", "expected"), ACCEPTED_TA, ids=[json.dumps(d)[:60] for d, _ in ACCEPTED_TA])
def test_valid_training_args_are_read_as_transformers_reads_them(tmp_path, data, expected):
    """Class 7: what transformers 5.24 accepts is accepted, and read as it reads it (the expected fields follow
    ``_process_fsdp_args`` / ``_apply_legacy_fsdp_to_config`` by hand, lines cited beside each row)."""
    from fitplan.inputs.importers import training_args_fields

    (tmp_path / "ta.json").write_text(json.dumps(data), encoding="utf-8")
    fields, _ = training_args_fields(tmp_path / "ta.json")
    assert {k: fields.get(k) for k in expected} == expected


WEB_CASES = [
    ("estimate", [("model", "llama-2-7b"), ("num-gpus", "99999999")], "num_gpus"),
    ("estimate", [("model", "llama-2-7b"), ("num-gpus", "65536"), ("num-nodes", "8")], "num_gpus x num_nodes"),
    ("estimate", [("model", "llama-2-7b"), ("num-examples", "1000000000000"), ("tokens-per-example", "1000000")],
     "num_examples x tokens_per_example"),
    ("estimate", [("model", "llama-2-7b"), ("optim", "sgd"), ("optim-args", "momentum=nan")], "momentum"),
    ("estimate", [("model", "llama-2-7b"), ("zero", "2"), ("precision", "bf16-master"), ("num-gpus", "2"),
                  ("reduce-bucket-size", "1e300")], "reduce_bucket_size"),
    ("estimate", [("model", "llama-2-7b"), ("reduce-bucket-size", "5e8")], "DeepSpeed zero_optimization key"),
    ("estimate", [("model", "llama-2-7b"), ("num-gpus", "2"), ("stack", "ddp"), ("fsdp", "full_shard")],
     "--stack ddp does not shard"),
    ("estimate", [("model", "llama-2-7b"), ("total-tokens", "100000000000000000000")], "total_tokens"),
    ("estimate", [("model", "llama-2-7b"), ("mfu", "40")], "mfu"),
    ("estimate", [("model", "llama-2-7b"), ("tokens-per-second", "1e-300")], "tokens_per_second"),
    ("estimate", [("params", "1e20")], "at most"),
    ("estimate", [("model", "llama-2-7b"), ("max-seq-length", "999999999")], "max_seq_length"),
    ("estimate", [("model", "llama-2-7b"), ("lora-dropout", "nan"), ("method", "lora")], "lora_dropout"),
    ("estimate", [("model", "llama-2-7b"), ("training-args", "ta.json")], "training-args"),
    ("recommend", [("model", "llama-2-7b"), ("top", "0")], "top"),
    ("recommend", [("model", "llama-2-7b"), ("max-gpus", "100000")], "max-gpus"),
    ("recommend", [("model", "llama-2-7b"), ("effective-batch-size", "1000000")], "effective"),
    ("recommend", [("model", "llama-2-7b"), ("objective", "gpus"), ("headroom", "1e308GB")], "headroom"),
]


@pytest.mark.parametrize(("endpoint", "query", "needle"), WEB_CASES, ids=[f"{e}-{q[-1][0]}-{i}" for i, (e, q, _)
                                                                           in enumerate(WEB_CASES)])
def test_the_api_applies_every_bound(endpoint, query, needle):
    """Class 2, the web API channel (``fitplan serve``; docs/serve.md): the same bounds, as HTTP 400 with the
    CLI's message, in-process through the endpoint functions."""
    from fitplan.web import api

    reply = api.answer(getattr(api, endpoint), api.Settings(search_seconds=5), query)
    body = json.loads(reply.body)
    assert reply.status == 400, body
    assert needle in body["error"], body


def _plugin_registry(unit: str, value, *, reducer_on: str | None = None):
    from fitplan import hookimpl, quantity, reducer
    from fitplan.pluginmgr.registry import make_registry

    class Odd:
        @hookimpl
        def fitplan_register_quantities(self, register):
            if reducer_on is None:
                @quantity(unit, category="memory" if unit == "bytes" else "")
                def lookup_table_bytes(param_count):
                    """A plugin's quantity with a value out of range."""
                    return value

                register(lookup_table_bytes)

        @hookimpl
        def fitplan_register_reducers(self, register):
            if reducer_on is not None:
                @reducer(reducer_on, when=lambda param_count: True)
                def odd(x):
                    """A plugin's reducer with a value out of range."""
                    return value

                register(odd)

    return make_registry(entry_points=False, extra_plugins=[("odd-plugin", Odd())])


@pytest.mark.parametrize(("unit", "value", "reducer_on"), [
    ("bytes", -1, None), ("bytes", -0.5, None), ("bytes", 1e300, None), ("bytes", 10**40, None),
    ("s", -3.0, None), ("USD", 1e89, None), ("tokens", -1, None), ("bytes", float("inf"), None),
    ("bytes", -(2**40), "weight_bytes"), ("bytes", 1e300, "optimizer_state_bytes"),
])
def test_a_plugin_amount_out_of_range_is_named(unit, value, reducer_on):
    """Class 2, plugin return values: a third-party amount that is negative, above 1e30 or not finite is the
    plugin's fault, named with the way to block it (it would otherwise report negative memory as "fits")."""
    import fitplan
    from fitplan import PluginError

    with pytest.raises(PluginError) as e:
        fitplan.estimate(params="1B", optim="adamw_torch", precision="bf16-mixed",
                         registry=_plugin_registry(unit, value, reducer_on=reducer_on))
    text = e.value.render()
    assert "plugin 'odd-plugin'" in text and "FITPLAN_BLOCK_PLUGINS=odd-plugin" in text, text
    assert ("reducer 'odd'" if reducer_on else "quantity 'lookup_table_bytes'") in text, text
