"""Chat templates rendered the way HuggingFace transformers renders them: a Jinja2
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a ``tojson`` filter that does not escape HTML (keyword arguments
``ensure_ascii``, ``indent``, ``separators``, ``sort_keys``), and the globals
``raise_exception(message)`` and ``strftime_now(format)``. The template sees ``messages``,
``tools``, ``documents``, ``add_generation_prompt``, the special-token strings of the
tokenizer (``bos_token``, ``eos_token``, ...) and any extra keyword arguments."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """A chat template that does not compile or that refused the messages (its
    ``raise_exception`` or a rendering error); the message is one line."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template of ``source`` (cached: a server compiles its template once).

    Raises:
        ChatTemplateError: ``source`` is not a valid Jinja2 template (line and reason).
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template: syntax error on line {exc.lineno}: {exc.message}"
        ) from None


def render_chat_template(
    source: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: dict[str, str] | None = None,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> str:
    """The prompt text ``source`` renders for ``messages`` (``[{"role", "content", ...}]``).

    ``special_tokens`` (``{"bos_token": "<s>", ...}``) and ``kwargs`` become template
    variables; ``add_generation_prompt`` asks the template to open the assistant's turn.

    Raises:
        ChatTemplateError: the template does not compile, calls ``raise_exception``, or
            fails while rendering (its message, on one line).
    """
    template = compile_template(source)
    variables: dict[str, Any] = {**(special_tokens or {}), **kwargs}
    variables.update(
        messages=messages,
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
    )
    try:
        return template.render(**variables)
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise ChatTemplateError(f"chat template: {message}") from None
