"""Shared by the dataset tests: a tiny byte-level BPE tokenizer trained here (no download) and laid out as the
Hugging Face cache lays out a repository, its chat template, and an independent way to count tokens (the
``tokenizers`` library and a jinja2 environment configured as transformers documents it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "datasets"
REPO = "tiny-org/tiny-chat"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('unknown role: ' + message['role']) }}
    {% endif %}
    {{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>' }}
{% endfor %}
{% if add_generation_prompt %}
    {{ '<|im_start|>assistant\\n' }}
{% endif %}
"""
"""Indented block tags: only trim_blocks + lstrip_blocks render it as transformers does."""


def corpus() -> list[str]:
    out = []
    for f in DATA.glob("*.jsonl"):
        out += [line for line in f.read_text(encoding="utf-8").splitlines()]
    return out


def build_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "add_bos_token": False, "chat_template": TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory) -> Path:
    """A Hugging Face cache holding ``tiny-org/tiny-chat`` (refs/main -> a commit, snapshots/<commit>/files)."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    repo = cache / ("models--" + REPO.replace("/", "--"))
    build_tokenizer(repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT, encoding="ascii")
    return cache


@pytest.fixture
def hub(hub_cache, monkeypatch, tmp_path):
    """The cache in the environment, offline; fitplan's dataset cache in a fresh directory."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("FITPLAN_CACHE_DIR", str(tmp_path / "fitplan-cache"))
    return hub_cache


def snapshot(hub_cache: Path) -> Path:
    return hub_cache / ("models--" + REPO.replace("/", "--")) / "snapshots" / COMMIT


def reference_tokenizer(hub_cache: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(snapshot(hub_cache) / "tokenizer.json"))


def render(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The template rendered by jinja2 here, configured as transformers' chat_template_utils documents."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    clean = [{k: v for k, v in m.items() if v is not None} for m in messages]
    return env.from_string(TEMPLATE).render(messages=clean, add_generation_prompt=add_generation_prompt,
                                            bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]
