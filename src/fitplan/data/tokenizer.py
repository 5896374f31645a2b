"""The model's fast tokenizer and chat template, read as transformers 5.24 reads them, with ``tokenizers`` only.

Files: ``tokenizer.json`` (required), ``tokenizer_config.json`` (special tokens, ``chat_template``),
``chat_template.jinja`` (a template file, which wins over the config's, as in transformers'
``PreTrainedTokenizerBase._from_pretrained``) and ``special_tokens_map.json``; from a directory, or from the
Hugging Face cache through :func:`fitplan.inputs.hub.fetch_file` (the resolver ``--model`` uses).

What transformers does with them, and what is done here the same way:

* the special tokens around plain text are ``tokenizer.json``'s post-processor: ``_from_pretrained`` drops
  ``add_bos_token`` / ``add_eos_token`` from the config whenever a ``tokenizer.json`` exists, and the backend
  (``TokenizersBackend``) only rebuilds the post-processor when the file has none (then no token is added);
* the named special tokens of the config (``bos_token``, ``eos_token``, ... and any other ``*_token``) that the
  file's added vocabulary lacks are added as special tokens (``TokenizersBackend.__init__``), and they are the
  variables a chat template sees (``special_tokens_map``);
* a chat is rendered with the template (:mod:`fitplan.data.chat`) and tokenized without special tokens
  (``apply_chat_template(tokenize=True)`` calls the tokenizer with ``add_special_tokens=False``).

transformers' model-specific classes (``LlamaTokenizer``, ``GemmaTokenizer``, ...) rebuild the pipeline from the
vocabulary and merges; they are meant to give ``tokenizer.json``'s ids, which is what is counted here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import attrs

from fitplan.data.extra import need
from fitplan.errors import FitplanError

FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""``PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES`` (transformers 5.24)."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@attrs.frozen(eq=False)
class ModelTokenizer:
    """A loaded tokenizer. ``fingerprint``: sha256 of every file read (the summary's cache key uses it)."""

    name: str
    backend: Any
    special_tokens: dict[str, str]
    chat_template: Any
    """None, a template string, or ``{name: template}`` (a config's list of named templates)."""
    fingerprint: dict[str, str]
    files: dict[str, Path | None] = attrs.field(factory=dict)
    """The files it was loaded from (worker processes load it again from them)."""
    chat_template_path: str | None = None

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    def template(self, tools: Any = None) -> str | None:
        """The template ``get_chat_template`` picks: the only one, or ``tool_use`` with tools, else ``default``."""
        t = self.chat_template
        if isinstance(t, dict):
            return t.get("tool_use") if tools is not None and "tool_use" in t else t.get("default")
        return t

    def counts(self, texts: list[str], add_special_tokens: bool) -> list[int]:
        """Token counts of ``texts`` through the batch API."""
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [len(e) for e in encode(texts, add_special_tokens=add_special_tokens)]

    def ids(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=add_special_tokens)]


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_fingerprint(files: dict[str, Path | None], chat_template_path: str | None = None) -> dict[str, str]:
    """sha256 of each tokenizer file (and of the ``--chat-template`` file): what the cache key hashes."""
    out = {n: _sha256(p) for n, p in files.items() if p is not None}
    if chat_template_path:
        try:
            out["chat_template_path"] = _sha256(Path(chat_template_path))
        except OSError as e:
            raise FitplanError(f"cannot read the chat template: {e.strerror}", file=chat_template_path,
                               field="--chat-template") from None
    return out


def _read_json(path: Path | None) -> dict:
    if path is None:
        return {}
    from fitplan.inputs.files import read_json

    data = read_json(path, field="--tokenizer")
    return data if isinstance(data, dict) else {}


def special_tokens(config: dict, special_map: dict) -> dict[str, str]:
    """The template variables: the named special tokens, then the config's other ``*_token`` entries
    (transformers 5: model-specific tokens join ``SPECIAL_TOKENS_ATTRIBUTES``)."""
    out = {}
    for name in NAMED:
        text = _token_text(config.get(name, special_map.get(name)))
        if text is not None:
            out[name] = text
    for name, value in config.items():
        text = _token_text(value)
        if name.endswith("_token") and name not in out and text is not None:
            out[name] = text
    return out


def _added_tokens(config: dict, named: dict[str, str]) -> list[Any]:
    tokenizers = need("tokenizers")
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    if isinstance(extra, dict):
        extra = list(extra.values())
    out = []
    for value in [*named.values(), *extra]:
        text = _token_text(value)
        if text is None:
            continue
        opts = {k: value[k] for k in ("lstrip", "rstrip", "single_word", "normalized") if isinstance(value, dict) and k in value}
        out.append(tokenizers.AddedToken(text, special=True, **{"normalized": False, **opts}))
    return out


def _chat_template(config: dict, files: dict[str, Path | None]) -> Any:
    if files.get("chat_template.jinja") is not None:
        from fitplan.inputs.files import read_text

        return read_text(files["chat_template.jinja"], field="--tokenizer")
    t = config.get("chat_template")
    if isinstance(t, list):
        return {d["name"]: d["template"] for d in t if isinstance(d, dict) and "name" in d and "template" in d}
    return t if isinstance(t, str) else None


def load(name: str, files: dict[str, Path | None], chat_template_path: str | None = None) -> ModelTokenizer:
    """The tokenizer in ``files`` (file name -> path, None when absent); ``chat_template_path`` overrides the
    template (TRL's ``SFTConfig.chat_template_path`` with a ``.jinja`` file)."""
    tokenizers = need("tokenizers")
    path = files.get("tokenizer.json")
    if path is None:
        raise FitplanError(f"no tokenizer.json for {name}", field="--tokenizer", value=name,
                           suggestion="fitplan reads fast tokenizers only: point --tokenizer at a directory with tokenizer.json")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the Rust library's parse errors
        raise FitplanError(f"cannot load the tokenizer: {e}", file=str(path), field="--tokenizer") from None
    config = _read_json(files.get("tokenizer_config.json"))
    named = special_tokens(config, _read_json(files.get("special_tokens_map.json")))
    present = {t.content for t in backend.get_added_tokens_decoder().values()}
    missing = [t for t in _added_tokens(config, named) if t.content not in present]
    if missing:
        backend.add_special_tokens(missing)
    template = _chat_template(config, files)
    fingerprint = file_fingerprint(files, chat_template_path)
    if chat_template_path:
        from fitplan.inputs.files import read_text

        template = read_text(chat_template_path, field="--chat-template")
    return ModelTokenizer(name, backend, named, template, fingerprint, dict(files), chat_template_path)


# --------------------------------------------------------------------------- where the files are


def _local(directory: Path) -> dict[str, Path | None]:
    return {n: (directory / n if (directory / n).is_file() else None) for n in FILES}


def _hub(repo: str, revision: str) -> dict[str, Path | None]:
    from fitplan.inputs import hub

    out: dict[str, Path | None] = {"tokenizer.json": hub.fetch_file(repo, "tokenizer.json", revision, field="--tokenizer")}
    for n in FILES[1:]:
        out[n] = hub.find_file(repo, n, revision)
        if out[n] is None and not hub.offline():
            try:
                out[n] = hub.fetch_file(repo, n, revision, field="--tokenizer")
            except FitplanError:
                out[n] = None  # the repository has no such file
    return out


def locate(spec: str) -> tuple[str, dict[str, Path | None]]:
    """The files of tokenizer ``spec``: a directory, a ``tokenizer.json`` path, or a Hub id (``ORG/NAME[@rev]``)."""
    from fitplan.inputs import hub

    p = Path(spec)
    if p.is_dir():
        return str(p), _local(p)
    if p.is_file():
        return str(p.parent), _local(p.parent)
    if hub.is_repo_id(spec):
        repo, revision = hub.split_revision(spec)
        return spec, _hub(repo, revision)
    raise FitplanError("no such tokenizer directory, and not a Hugging Face id (ORG/NAME)", field="--tokenizer",
                       value=spec, suggestion="pass --tokenizer DIR (with tokenizer.json) or --tokenizer ORG/NAME")


def tokenizer_spec(tokenizer: str | None, model: str | None, rules: Any = None) -> str:
    """What names the tokenizer: ``--tokenizer``, else the model: a catalog model's ``hf_id``, a Hub id, or the
    directory of a ``config.json``."""
    if tokenizer:
        return tokenizer
    if not model:
        raise FitplanError("reading a dataset needs a tokenizer", field="--tokenizer",
                           suggestion="pass --model NAME (a catalog model or a Hugging Face id) or --tokenizer DIR_OR_ID")
    p = Path(model)
    if p.is_dir() or p.suffix == ".json" and p.is_file():
        return str(p if p.is_dir() else p.parent)
    if rules is not None:
        try:
            entry = rules.model_entry(model)
        except FitplanError:
            entry = None
        if entry is not None:
            if not entry.hf_id:
                raise FitplanError(f"catalog model {entry.id!r} names no Hugging Face id to find its tokenizer",
                                   field="--tokenizer", suggestion="pass --tokenizer DIR_OR_ID")
            return entry.hf_id
    return model
