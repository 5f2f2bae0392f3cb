"""The prompts of a ``/v1/completions`` body as token ids. OpenAI's four forms: a string, a
list of strings, a list of token ids, a list of token-id lists (:func:`completion_prompts`);
each prompt carries the name an error gives it (``prompt``, or ``prompt[i]`` in a list of
prompts)."""

from __future__ import annotations

from typing import Any, NamedTuple

from ...tokenization import Tokenizer
from .errors import APIError

_FORMS = "a string, a list of strings, a list of token ids or a list of token-id lists"


class Prompt(NamedTuple):
    """One prompt: its token ids and the body field an error about it names."""

    ids: list[int]
    field: str


def _is_token(value: Any) -> bool:
    return type(value) is int  # a JSON true is not a token id, nor is 3.0


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def completion_prompts(prompt: Any, tokenizer: Tokenizer) -> list[Prompt]:
    """The prompts of a ``/v1/completions`` body's ``prompt``, in order: a string or a list
    of token ids is one prompt (named ``prompt``); a list of strings or of token-id lists is
    one prompt per item (named ``prompt[i]``). The kind of a list's items is its first
    item's (OpenAI's forms do not mix). Strings are tokenized with the tokenizer's special
    tokens (as a single-prompt request's are).

    Raises:
        APIError: 400 naming ``prompt`` (not one of the four forms, an empty list) or
            ``prompt[i]`` (an item of another kind than the first).
    """
    if isinstance(prompt, str):
        return [Prompt(tokenizer.encode(prompt), "prompt")]
    if not isinstance(prompt, list):
        raise APIError(400, f"prompt must be {_FORMS}, got {_shown(prompt)}", "prompt")
    if not prompt:
        raise APIError(400, "prompt must not be an empty list", "prompt")
    first = prompt[0]
    if _is_token(first):
        for i, item in enumerate(prompt):
            if not _is_token(item):
                message = f"prompt[{i}] must be a token id (an integer), got {_shown(item)}"
                raise APIError(400, message, f"prompt[{i}]")
        return [Prompt(list(prompt), "prompt")]
    if not isinstance(first, (str, list)):
        raise APIError(400, f"prompt must be {_FORMS}, got a list of {_shown(first)}", "prompt")
    prompts = []
    for i, item in enumerate(prompt):
        name = f"prompt[{i}]"
        if isinstance(first, str) and isinstance(item, str):
            prompts.append(Prompt(tokenizer.encode(item), name))
        elif isinstance(first, list) and isinstance(item, list) and all(map(_is_token, item)):
            prompts.append(Prompt(list(item), name))
        else:
            kind = "a string" if isinstance(first, str) else "a list of token ids"
            message = f"{name} must be {kind}, as prompt[0] is, got {_shown(item)}"
            raise APIError(400, message, name)
    return prompts
