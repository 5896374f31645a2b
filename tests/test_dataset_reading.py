"""Reading datasets: token counts equal those made here directly with ``tokenizers`` (and, for chats, with the
template rendered by jinja2 here), whatever the format; bad records are named by file, line and field."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("pyarrow")

from dataset_support import DATA, REPO, records, reference_tokenizer, render, snapshot  # noqa: E402

from fitplan.data import readers  # noqa: E402
from fitplan.data.resolve import Request, make  # noqa: E402
from fitplan.errors import FitplanError  # noqa: E402


def lengths_of(summary) -> list[int]:
    return sorted(summary.lengths.expand().tolist())


def text_lengths(hub_cache) -> list[int]:
    """Language-modeling text as TRL prepares it: EOS text appended, tokenized with the special tokens
    (the tokenizer.json post-processor adds BOS)."""
    tok = reference_tokenizer(hub_cache)
    texts = [r["text"] + "</s>" for r in records("text.jsonl")]
    return sorted(len(tok.encode(t).ids) for t in texts)


def chat_lengths(hub_cache, name: str = "chat.jsonl") -> list[int]:
    tok = reference_tokenizer(hub_cache)
    return sorted(len(tok.encode(render(r["messages"]), add_special_tokens=False).ids) for r in records(name))


@pytest.mark.parametrize("name", ["text.jsonl", "text.csv", "text.parquet"])
def test_text_counts_equal_tokenizers(hub, name):
    s = make(Request(str(DATA / name), tokenizer=REPO))
    assert s.kind == "text"
    assert lengths_of(s) == text_lengths(hub)
    assert s.examples == 12 and s.read == 12
    assert s.lengths.total == sum(text_lengths(hub))


def test_text_counts_include_bos_and_eos(hub):
    s = make(Request(str(DATA / "text.jsonl"), tokenizer=REPO))
    tok = reference_tokenizer(hub)
    bare = sorted(len(tok.encode(r["text"], add_special_tokens=False).ids) for r in records("text.jsonl"))
    assert [a - b for a, b in zip(lengths_of(s), bare)] == [2] * 12  # <s> and </s> are single tokens here


@pytest.mark.parametrize("name", ["chat.jsonl", "chat.json"])
def test_chat_counts_equal_template_rendered_here(hub, name):
    s = make(Request(str(DATA / name), tokenizer=REPO))
    assert s.kind == "messages"
    assert lengths_of(s) == chat_lengths(hub)


def test_sharegpt_conversations_are_converted(hub):
    s = make(Request(str(DATA / "sharegpt.jsonl"), tokenizer=REPO))
    tok = reference_tokenizer(hub)
    expected = sorted(len(tok.encode(render(r["messages"]), add_special_tokens=False).ids)
                      for r in records("chat.jsonl")[:3])
    assert lengths_of(s) == expected


def test_prompt_completion_counts_and_prompt_lengths(hub):
    s = make(Request(str(DATA / "prompt_completion.jsonl"), tokenizer=REPO))
    tok = reference_tokenizer(hub)
    full, prefix = [], []
    for r in records("prompt_completion.jsonl"):
        ids = tok.encode(r["prompt"] + r["completion"] + "</s>").ids
        p = tok.encode(r["prompt"]).ids
        full.append(len(ids))
        n = 0
        while n < min(len(p), len(ids)) and p[n] == ids[n]:
            n += 1
        prefix.append(n)
    assert s.kind == "prompt_completion"
    assert lengths_of(s) == sorted(full)
    assert sorted(s.prompts.expand().tolist()) == sorted(prefix)


def test_same_counts_as_transformers(hub):
    """transformers 5.24 itself: ``tokenizer(text)`` and ``apply_chat_template`` on the same files (it ignores
    ``add_bos_token`` when a tokenizer.json exists, and so does fitplan)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(snapshot(hub)))
    texts = sorted(len(hf(r["text"] + hf.eos_token)["input_ids"]) for r in records("text.jsonl"))
    chats = sorted(len(hf.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"])
                   for r in records("chat.jsonl"))
    assert lengths_of(make(Request(str(DATA / "text.jsonl"), tokenizer=REPO))) == texts
    assert lengths_of(make(Request(str(DATA / "chat.jsonl"), tokenizer=REPO))) == chats


def test_saved_dataset_directories(hub, tmp_path):
    """The layout ``datasets``' save_to_disk writes (Arrow stream files listed in state.json; a DatasetDict's
    dataset_dict.json), written here with pyarrow alone."""
    import pyarrow as pa

    texts = [r["text"] for r in records("text.jsonl")]
    split = tmp_path / "saved" / "train"
    split.mkdir(parents=True)
    table = pa.table({"text": texts})
    with pa.ipc.new_stream(str(split / "data-00000-of-00001.arrow"), table.schema) as w:
        w.write_table(table, max_chunksize=5)
    (split / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (tmp_path / "saved" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    assert lengths_of(make(Request(str(tmp_path / "saved"), tokenizer=REPO))) == text_lengths(hub)
    assert lengths_of(make(Request(str(split), tokenizer=REPO))) == text_lengths(hub)
    with pytest.raises(FitplanError, match="no split 'test'"):
        make(Request(str(tmp_path / "saved"), tokenizer=REPO, split="test"))


def test_directory_of_shards(hub, tmp_path):
    lines = (DATA / "text.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(lines[:5]), encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("".join(lines[5:]), encoding="utf-8")
    assert lengths_of(make(Request(str(tmp_path), tokenizer=REPO))) == text_lengths(hub)


def test_json_array_across_small_blocks(hub, monkeypatch):
    whole = list(readers.json_records(DATA / "chat.json"))
    monkeypatch.setattr(readers, "CHUNK", 7)
    assert list(readers.json_records(DATA / "chat.json")) == whole
    starts = [i for i, line in enumerate((DATA / "chat.json").read_text().splitlines(), 1) if line == "  {"]
    assert [w for _, w, _ in whole] == [f"line {n} (element {i})" for i, n in enumerate(starts, 1)]


def test_line_ranges_cover_the_file_once():
    path = DATA / "text.jsonl"
    size = path.stat().st_size
    whole = list(readers.jsonl_records(path))
    parts = []
    for a, b in readers.line_ranges(path, size, 4):
        parts += [(w, r) for _, w, r in readers.jsonl_records(path, a, b)]
    assert parts == [(w, r) for _, w, r in whole]
    assert parts[-1][0] == "line 12"


# --------------------------------------------------------------------------- errors name the file, line and field


def _write(tmp_path, name: str, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def test_malformed_line(hub, tmp_path):
    p = _write(tmp_path, "bad.jsonl", b'{"text": "ok"}\n\n{"text": "no end"\n')
    with pytest.raises(FitplanError) as e:
        make(Request(p, tokenizer=REPO))
    assert e.value.file == p and "line 3: malformed JSON" in e.value.message


def test_missing_field(hub, tmp_path):
    p = _write(tmp_path, "missing.jsonl", b'{"text": "ok"}\n{"body": "where is text?"}\n')
    with pytest.raises(FitplanError) as e:
        make(Request(p, tokenizer=REPO))
    assert (e.value.file, e.value.field) == (p, "text")
    assert "line 2: no field 'text'" in e.value.message and "body" in e.value.suggestion


def test_not_utf8_names_line_and_field(hub, tmp_path):
    p = _write(tmp_path, "latin1.jsonl", b'{"text": "ok"}\n{"id": 1, "text": "caf\xe9"}\n')
    with pytest.raises(FitplanError) as e:
        make(Request(p, tokenizer=REPO))
    assert (e.value.file, e.value.field) == (p, "text") and "line 2: not UTF-8" in e.value.message


def test_not_utf8_in_csv(hub, tmp_path):
    p = _write(tmp_path, "latin1.csv", b'id,text\n1,ok\n2,"caf\xe9, au lait"\n')
    with pytest.raises(FitplanError) as e:
        make(Request(p, tokenizer=REPO))
    assert e.value.field == "text" and "row 2 (line 3): not UTF-8" in e.value.message


def test_template_error_names_the_record(hub, tmp_path):
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "{}"}]}
    p = _write(tmp_path, "chat.jsonl", (json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n"
                                        + json.dumps(bad) + "\n").encode())
    with pytest.raises(FitplanError) as e:
        make(Request(p, tokenizer=REPO))
    assert (e.value.file, e.value.field) == (p, "messages")
    assert "line 2: the chat template failed: unknown role: tool" in e.value.message


def test_parquet_missing_column(hub):
    with pytest.raises(FitplanError) as e:
        make(Request(str(DATA / "text.parquet"), tokenizer=REPO, text_field="body"))
    assert e.value.field == "body" and "row 1: no field 'body'" in e.value.message and "text" in e.value.suggestion


def test_malformed_json_array(hub, tmp_path):
    p = _write(tmp_path, "bad.json", b'[\n  {"text": "a"},\n  {"text": "b"}\n  {"text": "c"}\n]\n')
    with pytest.raises(FitplanError) as e:
        make(Request(p, tokenizer=REPO))
    assert "line 4: malformed JSON: expected ',' or ']'" in e.value.message


def test_missing_extra_is_named():
    from fitplan.data.extra import need

    with pytest.raises(FitplanError) as e:
        need("fitplan_no_such_module")
    assert "pip install 'fitplan[data]'" in e.value.suggestion


def test_cli_errors_exit_2_without_traceback(hub, tmp_path, cli):
    bad = _write(tmp_path, "bad.jsonl", b'{"text": "ok"}\n{"text": 3}\n')
    env = {k: os.environ[k] for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "FITPLAN_CACHE_DIR")}
    proc = cli("dataset", bad, "--tokenizer", REPO, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "bad.jsonl: line 2: field 'text' is a int, not a string @ text" in proc.stderr.replace("\n", " ")
    blocked = cli("dataset", str(DATA / "text.jsonl"), "--tokenizer", REPO,
                  env={**env, "PYTHONPATH": str(tmp_path / "block")}) if _block(tmp_path) else None
    assert blocked.returncode == 2 and "fitplan[data]" in blocked.stderr and "Traceback" not in blocked.stderr


def _block(tmp_path) -> bool:
    """A ``tokenizers`` that cannot be imported (first on PYTHONPATH), as if the extra were not installed."""
    d = tmp_path / "block" / "tokenizers"
    d.mkdir(parents=True)
    (d / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    return True


def test_worker_processes_count_the_same(hub, monkeypatch, tmp_path):
    """A JSON Lines file read by 2 worker processes in ranges gives the single process's histogram, and an
    error in a later range still names its line (counted from the start of the file)."""
    from fitplan.data import scan

    lines = (DATA / "text.jsonl").read_text(encoding="utf-8").splitlines(keepends=True) * 5
    p = tmp_path / "big.jsonl"
    p.write_text("".join(lines), encoding="utf-8")
    monkeypatch.setattr(scan, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(scan, "RANGE_BYTES", 900)
    one = make(Request(str(p), tokenizer=REPO, jobs=1, use_cache=False))
    two = make(Request(str(p), tokenizer=REPO, jobs=2, use_cache=False))
    assert two.lengths.to_dict() == one.lengths.to_dict() and one.read == 60
    p.write_text("".join(lines) + '{"text": 1}\n', encoding="utf-8")
    with pytest.raises(FitplanError) as e:
        make(Request(str(p), tokenizer=REPO, jobs=2, use_cache=False))
    assert (e.value.file, e.value.field) == (str(p), "text") and "line 61:" in e.value.message


def test_the_tokenizer_of_a_catalog_model_is_its_hub_id(hub):
    from fitplan.data.tokenizer import locate, tokenizer_spec

    class Entry:
        id, hf_id = "tiny", REPO

    class Rules:
        def model_entry(self, name):
            if name != "tiny":
                raise FitplanError(f"unknown model {name!r}")
            return Entry()

    assert tokenizer_spec(None, "tiny", Rules()) == REPO
    assert tokenizer_spec("dir", "tiny", Rules()) == "dir"
    assert tokenizer_spec(None, "other-org/model", Rules()) == "other-org/model"
    name, files = locate(REPO)
    assert files["tokenizer.json"] == snapshot(hub) / "tokenizer.json" and files["chat_template.jinja"] is None
    with pytest.raises(FitplanError) as e:
        locate("other-org/not-cached")
    assert "not in the Hugging Face cache and HF_HUB_OFFLINE is set" in e.value.message


def test_chat_template_file_wins_over_the_config(hub, tmp_path):
    import shutil

    d = tmp_path / "tok"
    shutil.copytree(snapshot(hub), d)
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    s = make(Request(str(DATA / "chat.jsonl"), tokenizer=str(d)))
    tok = reference_tokenizer(hub)
    expected = sorted(len(tok.encode("".join(m["content"] for m in r["messages"]), add_special_tokens=False).ids)
                      for r in records("chat.jsonl"))
    assert lengths_of(s) == expected


@pytest.mark.parametrize("name", ["text.jsonl", "text.csv", "text.parquet", "chat.json"])
def test_sample_reads_the_drawn_records(hub, name):
    """``--sample 5`` of 12: the records drawn by ``random.Random(seed).sample``, totals scaled by 12/5."""
    import random

    tok = reference_tokenizer(hub)
    if name == "chat.json":
        chats = [r["messages"] for r in records("chat.jsonl")]
        picked = random.Random(7).sample(range(6), 5)
        expected = sorted(len(tok.encode(render(chats[i]), add_special_tokens=False).ids) for i in picked)
    else:
        texts = [r["text"] for r in records("text.jsonl")]
        picked = random.Random(7).sample(range(12), 5)
        expected = sorted(len(tok.encode(texts[i] + "</s>").ids) for i in picked)
    s = make(Request(str(DATA / name), tokenizer=REPO, sample=5, seed=7))
    n = 6 if name == "chat.json" else 12
    assert (s.examples, s.read, s.sampled) == (n, 5, True)
    assert lengths_of(s) == expected
    from fitplan.data.figures import figures

    f = figures(s, 2048, 2)
    assert f["tokens"]["total"] == pytest.approx(sum(expected) * n / 5)
    lo, hi = f["tokens"]["total_ci"]
    assert lo < f["tokens"]["total"] < hi and f["sample"]["read"] == 5
