"""A record into the text TRL 1.16's SFT trainer tokenizes (``SFTTrainer._prepare_dataset``, trl/data_utils.py).

The dataset's kind is decided on its first record, as TRL does:

* ``conversations`` of ``{"from", "value"}`` messages become ``messages`` of ``{"role", "content"}``
  (``maybe_convert_to_chatml``; ``conversations`` already in role/content form are taken too, which TRL does not);
* a record with ``prompt`` is a **prompt-completion** example: conversational when the prompt is a list of
  messages. The tokens are those of ``prompt + completion``; the prompt's are counted too (TRL computes the loss
  on the completion only, and drops an example whose prompt fills ``max_length``);
* a record whose ``messages`` is a list of ``{"role", ...}`` dicts is **conversational**: rendered with the chat
  template and tokenized without special tokens;
* otherwise the text of ``dataset_text_field`` (``--text-field``, default ``text``) is **language modeling**
  text, tokenized with the tokenizer's special tokens.

For a dataset that is not conversational, TRL appends the EOS token's text to the text field (or, failing that,
to the completion) unless it already ends with it (``add_eos``). Rows may carry ``tools`` (a list, or JSON text)
and ``chat_template_kwargs``, passed to the template as ``apply_chat_template`` receives them.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from fitplan.data import chat
from fitplan.data.extra import need
from fitplan.data.tokenizer import ModelTokenizer
from fitplan.errors import FitplanError

KINDS = ("text", "messages", "prompt_completion", "chat_prompt_completion")
COLUMNS = ("messages", "conversations", "prompt", "completion", "tools", "chat_template_kwargs")
"""The fields any kind may read, besides the text field."""


def _is_chat(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


def _from_value(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "from" in value[0] and "value" in value[0]


def chatml(record: dict) -> dict:
    """``maybe_convert_to_chatml``: ``from``/``value`` messages to ``role``/``content``, ``conversations`` to
    ``messages``."""
    if not any(_from_value(record.get(k)) for k in ("prompt", "completion", "messages", "conversations")) \
            and "conversations" not in record:
        return record
    out = dict(record)
    for key in ("prompt", "completion", "messages", "conversations"):
        if isinstance(out.get(key), list):
            out[key] = [{("role" if k == "from" else "content" if k == "value" else k): v for k, v in m.items()}
                        if isinstance(m, dict) else m for m in out[key]]
    if "conversations" in out:
        out["messages"] = out.pop("conversations")
    return out


def detect_kind(record: dict) -> str:
    """The dataset's kind, from its first record (see the module doc)."""
    record = chatml(record)
    if "prompt" in record:
        return "chat_prompt_completion" if _is_chat(record["prompt"]) else "prompt_completion"
    if _is_chat(record.get("messages")):
        return "messages"
    return "text"


@attrs.frozen
class Renderer:
    """Turns records of one kind into strings to tokenize. ``file``: named in errors."""

    kind: str
    text_field: str
    tokenizer: ModelTokenizer
    file: str

    def _error(self, where: str, text: str, field: str, suggestion: str | None = None) -> FitplanError:
        return FitplanError(f"{where}: {text}", file=self.file, field=field, suggestion=suggestion)

    def _get(self, record: dict, field: str, where: str) -> Any:
        if record.get(field) is None:
            has = ", ".join(sorted(k for k, v in record.items() if v is not None)) or "none"
            hint = f"the record has: {has}" + ("; pass --text-field NAME" if field == self.text_field else "")
            raise self._error(where, f"field {field!r} is null" if field in record else f"no field {field!r}", field, hint)
        return record[field]

    def _text(self, record: dict, field: str, where: str) -> str:
        value = self._get(record, field, where)
        if not isinstance(value, str):
            raise self._error(where, f"field {field!r} is a {type(value).__name__}, not a string", field)
        return value

    def _messages(self, record: dict, field: str, where: str) -> list:
        value = self._get(record, field, where)
        if not isinstance(value, list) or not value:
            raise self._error(where, f"field {field!r} must be a non-empty list of messages", field)
        for i, m in enumerate(value):
            if not isinstance(m, dict) or "role" not in m:
                raise self._error(where, f"message {i + 1} is not a {{\"role\", \"content\"}} object", f"{field}[{i}]")
        return value

    def _eos(self, text: str) -> str:
        eos = self.tokenizer.eos_token
        return text if not eos or text.endswith(eos) else text + eos

    def _render(self, record: dict, messages: list, where: str, field: str, generation: bool = False) -> str:
        tools = record.get("tools")
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except (ValueError, RecursionError):
                raise self._error(where, "field 'tools' is not JSON", "tools") from None
        template = self.tokenizer.template(tools)
        if template is None:
            raise self._error(where, f"the tokenizer ({self.tokenizer.name}) has no chat template", field,
                              "pass --chat-template FILE.jinja, or --text-field for plain text")
        extra = record.get("chat_template_kwargs") or {}
        jinja2 = need("jinja2")
        try:
            return chat.render(template, messages, self.tokenizer.special_tokens, tools=tools,
                               add_generation_prompt=generation, extra=extra if isinstance(extra, dict) else {})
        except jinja2.TemplateError as e:
            raise self._error(where, f"the chat template failed: {e}", field,
                              f"template of {self.tokenizer.name}; --chat-template FILE replaces it") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise self._error(where, f"the chat template cannot render this record: {type(e).__name__}: {e}", field) from None

    def strings(self, record: dict, where: str) -> tuple[str, str | None]:
        """``(full, prompt)``: the text whose tokens are counted, and for prompt-completion the prompt's
        (tokenized alone with the same special-token setting)."""
        record = chatml(record)
        if self.kind == "text":
            return self._eos(self._text(record, self.text_field, where)), None
        if self.kind == "messages":
            return self._render(record, self._messages(record, "messages", where), where, "messages"), None
        if self.kind == "prompt_completion":
            prompt = self._text(record, "prompt", where)
            completion = self._text(record, "completion", where)
            if self.text_field not in record:  # TRL's add_eos: the text field if present, else the completion
                completion = self._eos(completion)
            return prompt + completion, prompt
        prompt = self._messages(record, "prompt", where)
        completion = self._messages(record, "completion", where)
        return (self._render(record, prompt + completion, where, "completion"),
                self._render(record, prompt, where, "prompt", generation=True))

    @property
    def special_tokens(self) -> bool:
        """Whether the tokenizer adds its special tokens (plain text: yes; a rendered chat: no)."""
        return self.kind in ("text", "prompt_completion")
