"""``fitplan dataset`` and ``--dataset``: the report's keys, the shared summary, the cache, and estimates whose
time and cost are those of ``--total-tokens N`` (N the computed tokens) and whose memory is that of the realized
sequence length."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("tokenizers")

from dataset_support import DATA, REPO, reference_tokenizer  # noqa: E402

import fitplan  # noqa: E402
from fitplan.data import resolve, scan  # noqa: E402
from fitplan.data.resolve import Request, make  # noqa: E402
from fitplan.errors import FitplanError  # noqa: E402

BASE = {"model": "llama-2-7b", "gpu": "a100-80gb", "precision": "bf16-mixed", "per_device_train_batch_size": 4,
        "provider": "aws", "tokenizer": REPO}


def _env() -> dict[str, str]:
    return {k: os.environ[k] for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "FITPLAN_CACHE_DIR")}


def test_dataset_command_json(hub, cli, tmp_path):
    out = tmp_path / "summary.toml"
    proc = cli("dataset", str(DATA / "text.jsonl"), "--tokenizer", REPO, "--max-seq-length", "24",
               "--per-device-train-batch-size", "4", "--format", "json", "--out", str(out), env=_env())
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    tok = reference_tokenizer(hub)
    lengths = sorted(len(tok.encode(json.loads(line)["text"] + "</s>").ids)
                     for line in (DATA / "text.jsonl").read_text(encoding="utf-8").splitlines())
    assert r["examples"] == 12 and r["tokens"]["total"] == sum(lengths) and r["tokens"]["max"] == lengths[-1]
    assert r["tokens"]["p50"] == lengths[5] and r["tokens"]["p99"] == lengths[-1]  # nearest rank of 12
    assert r["truncated_examples"] == sum(n > 24 for n in lengths)
    assert r["padding"]["pad"]["computed_tokens_per_epoch"] == 12 * 24
    assert r["padding"]["pack"]["computed_tokens_per_epoch"] == sum(min(n, 24) for n in lengths)
    assert set(r["padding"]) == {"pad", "longest", "group_by_length", "pack", "padding_free"}
    again = cli("dataset", str(out), "--max-seq-length", "24", "--per-device-train-batch-size", "4", "--format", "json")
    assert json.loads(again.stdout)["padding"] == r["padding"]


def test_second_run_reads_the_cache(hub, monkeypatch):
    first = make(Request(str(DATA / "chat.jsonl"), tokenizer=REPO))
    monkeypatch.setattr(scan, "scan", lambda *a, **k: pytest.fail("tokenized again"))
    second = make(Request(str(DATA / "chat.jsonl"), tokenizer=REPO))
    assert second.lengths.to_dict() == first.lengths.to_dict() and second.key == first.key


def test_a_bad_cache_entry_is_ignored_and_rewritten(hub):
    from fitplan.data.summary import cache_dir

    first = make(Request(str(DATA / "text.jsonl"), tokenizer=REPO))
    entry = cache_dir() / f"{first.key}.toml"
    entry.write_text(entry.read_text().replace("counts = [", "counts = [0, "))  # fails the check
    assert make(Request(str(DATA / "text.jsonl"), tokenizer=REPO)).lengths.to_dict() == first.lengths.to_dict()
    assert "counts = [0, " not in entry.read_text()
    entry.unlink()
    os.mkfifo(entry)  # never read from a FIFO: no hang, replaced by a regular file
    assert make(Request(str(DATA / "text.jsonl"), tokenizer=REPO)).lengths.to_dict() == first.lengths.to_dict()
    assert entry.is_file()


def test_the_cache_key_follows_the_content(hub, tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "the cat"}\n')
    a = make(Request(str(p), tokenizer=REPO))
    p.write_text('{"text": "the cat sat on the mat"}\n')
    b = make(Request(str(p), tokenizer=REPO))
    assert a.key != b.key and b.lengths.total > a.lengths.total


def _est(**kw):
    return fitplan.estimate({**BASE, **kw})


@pytest.mark.parametrize("mode", ["pack", "pad"])
def test_time_and_cost_equal_total_tokens(hub, mode):
    with_data = _est(dataset_path=str(DATA / "chat.jsonl"), padding=mode, max_seq_length=64)
    n = with_data["epoch_tokens"]
    assert n == int(n)
    by_hand = fitplan.estimate({k: v for k, v in BASE.items() if k != "tokenizer"} | {"total_tokens": int(n),
                                                                                      "max_seq_length": 64})
    for role in ("seconds", "cost.on_demand"):
        assert with_data.role(role) == pytest.approx(by_hand.role(role), rel=1e-12)
    assert with_data["realized_seq_length"] == 64 and with_data.role("peak") == by_hand.role("peak")


def test_longest_time_and_memory(hub):
    """Padding to the longest: time and memory of the expected computed tokens in micro-batches as long as the
    longest example (the realized length: the step the roofline prices)."""
    d = _est(dataset_path=str(DATA / "text.jsonl"), padding="longest", max_seq_length=2048)
    longest = make(Request(str(DATA / "text.jsonl"), tokenizer=REPO)).lengths.max
    assert d["realized_seq_length"] == longest
    short = fitplan.estimate({k: v for k, v in BASE.items() if k != "tokenizer"} | {"max_seq_length": longest})
    assert d.role("peak") == short.role("peak")
    n = d["epoch_tokens"]
    tokens = fitplan.estimate({k: v for k, v in BASE.items() if k != "tokenizer"}
                              | {"num_examples": 1, "tokens_per_example": n, "max_seq_length": longest})
    assert d.role("seconds") == pytest.approx(tokens.role("seconds"), rel=1e-12)
    assert d["padding_tokens"] == pytest.approx(n - d["dataset_tokens"])


def test_summary_file_gives_the_same_estimate(hub, tmp_path):
    summary = tmp_path / "s.toml"
    summary.write_text(make(Request(str(DATA / "chat.jsonl"), tokenizer=REPO)).to_toml())
    a = _est(dataset_path=str(DATA / "chat.jsonl"), padding="longest")
    b = _est(dataset_path=str(summary), padding="longest", tokenizer=None)
    assert a.role("seconds") == b.role("seconds") and a.role("peak") == b.role("peak")


def test_bad_combinations(hub, tmp_path):
    with pytest.raises(FitplanError, match="--padding longest needs the examples' lengths"):
        _est(total_tokens=1000, padding="longest")
    with pytest.raises(FitplanError, match="--total-tokens cannot be given with it"):
        _est(dataset_path=str(DATA / "text.jsonl"), total_tokens=1000)
    bad = tmp_path / "s.toml"
    bad.write_text('format = "fitplan-dataset-summary"\nversion = 1\nkind = "text"\nexamples = 2\nread = 3\n'
                   '[lengths]\nvalues = [1, 2]\ncounts = [1, 2]\n')
    with pytest.raises(FitplanError, match="not a valid dataset summary: read .3. must equal") as e:
        resolve.make(Request(str(bad)))
    assert e.value.file == str(bad)


def test_estimate_report_says_which_length(hub, cli):
    proc = cli("estimate", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--bf16", "--dataset", str(DATA / "text.jsonl"),
               "--tokenizer", REPO, "--padding", "longest", env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "sequence length  memory sized at" in proc.stdout and "the longest example" in proc.stdout
    assert "padded to the longest in each micro-batch" in proc.stdout


def test_recommend_with_a_dataset(hub, cli):
    proc = cli("recommend", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--provider", "aws", "--dataset",
               str(DATA / "chat.jsonl"), "--tokenizer", REPO, "--padding", "longest", "--method", "lora",
               "--top", "2", "--format", "json", env=_env())
    assert proc.returncode == 0, proc.stderr
    plans = json.loads(proc.stdout)["plans"]
    assert plans and all(p["train_seconds"] > 0 for p in plans)
