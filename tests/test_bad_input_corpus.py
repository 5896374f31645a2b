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
    ("config-nan", b'{"model_type": "llama", "attention_dropout": NaN}', "non-finite"),
    ("config-infinity", b'{"model_type": "llama", "rope_theta": Infinity}', "non-finite"),
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
    assert len(CASES) >= 100
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
