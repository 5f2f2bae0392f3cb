"""Output constraints (``SamplingParams.guided``) as llguidance grammars: what a constraint
may be (:data:`GUIDED_KINDS`), its grammar (:func:`grammar_of`) and why it is refused
(:func:`guided_problem`). Compiling needs no tokenizer, so the API server, the router and the
engine all check a constraint the same way; :mod:`.guided` runs it against the drafts."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

#: The constraint kinds of ``SamplingParams.guided["kind"]`` and what ``spec`` holds:
#: ``json`` a JSON schema (a dict), ``json_object`` any JSON object (``spec`` None),
#: ``regex`` a regular expression (the whole output matches it), ``choice`` a non-empty list
#: of strings (the output is one of them), ``grammar`` a Lark grammar (llguidance's dialect,
#: rule ``start``).
GUIDED_KINDS = ("json", "json_object", "regex", "choice", "grammar")
#: How JSON is laid out: compact (``,`` and ``:`` separators, no other whitespace). With
#: llguidance's default (any whitespace between tokens) a model can emit whitespace forever
#: without leaving the grammar; a schema may still ask for it through its ``"x-guidance"``
#: options (``{"whitespace_flexible": true}``).
JSON_DEFAULTS: JsonCompileOptions = {"whitespace_flexible": False}
#: Largest constraint accepted: characters of its ``spec`` as compact JSON (OpenAI caps a
#: schema near 120,000 characters of strings). llguidance's compile time grows faster than
#: the grammar (100,000 choices: about 19 s), and the API server checks a constraint on its
#: event loop.
MAX_GUIDED_CHARS = 128 * 1024


def grammar_of(guided: dict[str, Any]) -> str:
    """The llguidance grammar (a JSON string ``LLMatcher`` takes) of a constraint.

    Raises:
        ValueError: an unknown ``kind``, or a ``spec`` of the wrong type.
    """
    from llguidance import LLMatcher

    kind, spec = guided.get("kind"), guided.get("spec")
    if kind == "json":
        if not isinstance(spec, dict):
            raise ValueError(f"a JSON schema must be an object, got {type(spec).__name__}")
        return str(LLMatcher.grammar_from_json_schema(spec, defaults=JSON_DEFAULTS))
    if kind == "json_object":
        return str(LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS))
    if kind == "regex":
        if not isinstance(spec, str):
            raise ValueError(f"a regex must be a string, got {type(spec).__name__}")
        return str(LLMatcher.grammar_from_regex(spec))
    if kind == "choice":
        if (
            not isinstance(spec, list)
            or not spec
            or not all(isinstance(s, str) and s for s in spec)
        ):
            raise ValueError(
                f"a choice must be a non-empty list of non-empty strings, got {spec!r}"
            )
        # JSON string literals are Lark string literals (the same escapes)
        return str(LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(s) for s in spec)))
    if kind == "grammar":
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError("a grammar must be a non-empty string")
        return str(LLMatcher.grammar_from_lark(spec))
    raise ValueError(f"kind must be one of {', '.join(GUIDED_KINDS)}, got {kind!r}")


def guided_problem(guided: Any) -> str | None:
    """``None`` if ``guided`` is a valid constraint (or ``None``), else why not: its shape, or
    what llguidance says of the grammar (an invalid regex, an unsupported schema keyword,
    a Lark syntax error). Needs no tokenizer."""
    if guided is None:
        return None
    if not isinstance(guided, dict) or set(guided) - {"kind", "spec"}:
        return f'must be {{"kind": ..., "spec": ...}}, got {guided!r}'[:300]
    try:
        size = len(json.dumps(guided.get("spec"), separators=(",", ":"), ensure_ascii=False))
    except RecursionError:
        return "nested too deeply"
    except (TypeError, ValueError):  # not JSON data: grammar_of names what is wrong with it
        size = 0
    if size > MAX_GUIDED_CHARS:
        return f"the constraint is {size} characters long (as JSON), at most {MAX_GUIDED_CHARS}"
    try:
        grammar = grammar_of(guided)
    except ValueError as exc:
        return str(exc)
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(grammar)
    return " ".join(str(error).split())[:500] or None
