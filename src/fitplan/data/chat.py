"""Chat templates rendered exactly as transformers 5.24 renders them (utils/chat_template_utils.py).

``_cached_compile_jinja_template`` builds an ``ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)`` with the ``loopcontrols`` extension and a ``{% generation %}`` block (which renders its
body), the ``tojson`` filter (``json.dumps``, no HTML escaping), the globals ``raise_exception``,
``strftime_now``, ``dict`` and ``namespace``; ``apply_chat_template`` drops the message keys whose value is None,
copies a message's reasoning to ``reasoning_content`` and ``thinking`` (``_alias_reasoning_fields``), and renders
with ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the tokenizer's special tokens.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from fitplan.data.extra import need

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _environment():
    jinja2 = need("jinja2")
    from jinja2 import ext, nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(ext.Extension):
        """``{% generation %}...{% endgeneration %}``: transformers tracks the assistant's text; it renders as is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            values = dict(*args, **kwargs)
            for name in values:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, values)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"templates cannot store underscore-prefixed attributes ({name!r})")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=TemplateDict(), namespace=TemplateNamespace)
    return env


@functools.lru_cache(maxsize=16)
def compile_template(text: str):
    """The compiled template (cached per text). :raises jinja2.TemplateSyntaxError: a malformed template."""
    return _environment().from_string(text)


def normalize(messages: list) -> list:
    """Messages as the template sees them: None-valued keys dropped, reasoning aliased."""
    out = []
    for message in messages:
        if isinstance(message, dict):
            message = {k: v for k, v in message.items() if v is not None}
            reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render(template: str, messages: list, special_tokens: dict[str, str], *, tools: Any = None,
           add_generation_prompt: bool = False, extra: dict[str, Any] | None = None) -> str:
    """``apply_chat_template(messages, tokenize=False)``: the rendered text.

    :raises jinja2.TemplateError: what the template raises (``raise_exception``) or a rendering error.
    """
    kwargs = {**special_tokens, **(extra or {})}
    return compile_template(template).render(messages=normalize(messages), tools=tools, documents=None,
                                             add_generation_prompt=add_generation_prompt, **kwargs)
