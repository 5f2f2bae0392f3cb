"""The structured-output fields of a request body -- OpenAI's ``response_format`` and vLLM's
``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar`` (a Lark grammar, or
a llama.cpp GBNF one converted by llguidance) -- checked and turned into the one
``SamplingParams.guided`` constraint a request may carry; a bad one is a 400 naming its
field."""

from __future__ import annotations

import json
from typing import Any

from .errors import APIError

#: Body fields that constrain the output (:func:`guided_constraint`), at most one per request.
GUIDED_FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


def guided_constraint(extra: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The output constraint a request body asks for (``extra``: the body's fields beyond
    the declared ones, pydantic's ``model_extra``), as ``SamplingParams.guided``
    (``{"kind", "spec"}``, see :mod:`~fastdeploy_mtp.runtime.guided`), and the body field it
    came from; ``(None, None)`` when there is none (``response_format`` ``{"type": "text"}``
    asks for none). The grammar itself is checked by :meth:`SamplingParams.check`.

    Raises:
        APIError: 400 naming the field: more than one constraint, or one of the wrong shape.
    """
    given = [name for name in GUIDED_FIELDS if extra.get(name) is not None]
    if extra.get("response_format") == {"type": "text"}:
        given.remove("response_format")
    if len(given) > 1:
        raise APIError(
            400, f"at most one output constraint per request, got {', '.join(given)}", given[1]
        )
    if not given:
        return None, None
    name = given[0]
    value = extra[name]
    if name == "response_format":
        return _response_format(value), name
    if name == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise APIError(400, f"guided_json: not valid JSON ({exc})", name) from None
            except RecursionError:  # the body parser's own limit is not applied to this text
                raise APIError(400, "guided_json: nested too deeply to parse", name) from None
        if not isinstance(value, dict):
            raise APIError(
                400, f"guided_json must be a JSON schema object, got {type(value).__name__}", name
            )
        return {"kind": "json", "spec": value}, name
    if name == "guided_regex":
        if not isinstance(value, str):
            raise APIError(400, f"guided_regex must be a string, got {type(value).__name__}", name)
        return {"kind": "regex", "spec": value}, name
    if name == "guided_choice":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise APIError(400, "guided_choice must be a non-empty list of non-empty strings", name)
        return {"kind": "choice", "spec": list(value)}, name
    if not isinstance(value, str) or not value.strip():
        raise APIError(
            400, "guided_grammar must be a non-empty string (a Lark or GBNF grammar)", name
        )
    return {"kind": "grammar", "spec": _lark_of(value)}, name


def _response_format(value: Any) -> dict[str, Any]:
    """``SamplingParams.guided`` of an OpenAI ``response_format`` other than text."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return {"kind": "json_object", "spec": None}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            message = (
                'response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}'
            )
            raise APIError(400, message, "response_format")
        return {"kind": "json", "spec": spec["schema"]}
    message = f'response_format type must be "text", "json_object" or "json_schema", got {kind!r}'
    raise APIError(400, message, "response_format")


def _lark_of(grammar: str) -> str:
    """A ``guided_grammar`` as Lark: itself, or llguidance's conversion of a GBNF grammar
    (one without a ``start:`` rule or a ``%llguidance`` line)."""
    from llguidance.gbnf_to_lark import gbnf_to_lark, is_lark_syntax

    if is_lark_syntax(grammar):
        return grammar
    try:
        return gbnf_to_lark(grammar)
    except Exception as exc:  # the converter raises plain exceptions for what it cannot parse
        raise APIError(
            400, f"guided_grammar: neither Lark nor valid GBNF ({exc})", "guided_grammar"
        ) from None
