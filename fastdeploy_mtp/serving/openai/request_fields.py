"""Which top-level fields a request body may carry, beyond those the server acts on (the body
models' declared fields and the structured-output ones): the fields refused unless their value
asks for nothing (:data:`NEUTRAL_ONLY`), and a 400 naming any field neither endpoint's schema
(OpenAI's, vLLM's) knows (:func:`refuse_unknown_fields`). The fields accepted and ignored are
declared on the body models (:mod:`.protocol`), so their types are checked.
"""

from __future__ import annotations

from typing import Any

from .errors import APIError
from .guided_fields import GUIDED_FIELDS

#: Fields this server cannot honour (OpenAI's and vLLM's, of either endpoint), with the values
#: that ask for nothing (accepted); any other value is a 400 naming the field, so none of them
#: is silently ignored. ``None`` (the JSON ``null``) always asks for nothing.
NEUTRAL_ONLY: dict[str, tuple[Any, ...]] = {
    "logit_bias": ({},),
    "echo": (False,),
    "suffix": ("",),
    "priority": (0,),
    "use_beam_search": (False,),
    "include_stop_str_in_output": (False,),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
    "reasoning_effort": (),
    "verbosity": (),
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
}

#: Why a refused field cannot be honoured, where its name does not say it.
_WHY: dict[str, str] = {
    "priority": "requests are scheduled first come, first served (priority 0 is accepted)",
}

#: Fields of the other endpoint, with the field to use instead.
_OTHER_ENDPOINT: dict[tuple[bool, str], str] = {
    (False, "max_completion_tokens"): (
        "max_completion_tokens is a /v1/chat/completions field: /v1/completions takes max_tokens"
    ),
    (True, "prompt"): "prompt is a /v1/completions field: a chat request sends messages",
}


def refuse_neutral_only(name: str, value: Any, neutral: tuple[Any, ...]) -> None:
    """400 naming ``name`` unless ``value`` is ``None`` or one of ``neutral`` (of the same
    type: ``0`` is not ``False``)."""
    if value is None or any(type(value) is type(n) and value == n for n in neutral):
        return
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    why = _WHY.get(name)
    message = f"{name}={shown} is not supported by this server" + (f": {why}" if why else "")
    raise APIError(400, message, name)


def refuse_unknown_fields(extra: dict[str, Any], chat: bool, also_known: tuple[str, ...]) -> None:
    """400 naming the first field of ``extra`` (the body's undeclared fields, pydantic's
    ``model_extra``) that is neither a structured-output field, nor one of
    :data:`NEUTRAL_ONLY`, nor in ``also_known`` (``chat``: the body is a
    ``/v1/chat/completions`` one)."""
    known = {*GUIDED_FIELDS, *NEUTRAL_ONLY, *also_known}
    for name in extra:
        if name in known:
            continue
        endpoint = "/v1/chat/completions" if chat else "/v1/completions"
        message = _OTHER_ENDPOINT.get(
            (chat, name),
            f"unknown field {name!r}: {endpoint} does not take it (docs/openai_api.md lists "
            "the fields this server accepts)",
        )
        raise APIError(400, message, name)
