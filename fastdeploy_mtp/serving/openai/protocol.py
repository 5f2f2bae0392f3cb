"""The OpenAI side of the API server: request bodies, errors, how a body's fields become
:class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams`, and a chat's prompt (the
model's own chat template, :func:`chat_prompt`).

Sampling follows the request's OpenAI fields (:func:`sampling_params`): ``temperature``
(absent = 0, greedy), ``top_p``, ``seed``, ``stop``, ``presence_penalty``,
``frequency_penalty``, ``logprobs`` (chat: ``logprobs`` + ``top_logprobs``) and vLLM's extra
body fields ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``stop_token_ids``,
``ignore_eos``, and FastDeploy's ``include_draft_logprobs`` (with logprobs, each choice also
carries ``draft_logprobs``: the MTP drafts each step verified and their log-probabilities
under the MTP layer), and ``speculative_method`` (ours: the drafting method this request
uses, where the engine's draft planner offers several). Fields a request leaves out take the
model folder's ``generation_config.json`` values when it sets them
(:class:`GenerationDefaults`, as vLLM's ``--generation-config auto``), else the neutral value.
The model's EOS ids end the output unless ``ignore_eos`` (:func:`sampling_params` adds them
to ``stop_token_ids``).
Structured output: OpenAI's ``response_format`` (``{"type": "json_object"}`` or
``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``) or one of vLLM's
``guided_json`` (a schema, or its JSON text), ``guided_regex``, ``guided_choice`` (a list of
strings), ``guided_grammar`` (a Lark grammar; a llama.cpp GBNF grammar is converted), at most
one per request (:func:`.guided_fields.guided_constraint`); each is compiled here, so a bad
one is a 400 naming its field.
``n`` (and, for completions, ``best_of``) ask for several choices (:func:`choice_counts`).
Chat's output limit is ``max_completion_tokens`` or its deprecated name ``max_tokens`` (both
given and different: a 400). A few fields are accepted and ignored (declared below, their
types checked: none changes the output); fields this server cannot honour (``echo``,
``logit_bias``, ``tools``, ...) are refused with a 400 naming the field unless their value
asks for nothing, and so is a field no schema knows (:func:`refuse_unsupported`,
:mod:`.request_fields`); so is any invalid value. Errors use
OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}`` (:class:`.errors.APIError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from ...runtime.sampling_params import MAX_LOGPROBS, SamplingParams
from ...tokenization import ChatTemplateError, GenerationDefaults, Tokenizer
from .errors import APIError
from .guided_fields import guided_constraint
from .request_fields import NEUTRAL_ONLY, refuse_neutral_only, refuse_unknown_fields


def chat_prompt(tokenizer: Tokenizer, messages: list[dict[str, Any]]) -> str:
    """The prompt text of a chat request: the tokenizer's chat template over ``messages``,
    opening the assistant's turn (tokenize it without adding special tokens again).

    Raises:
        APIError: 400 (``param`` ``messages``) when the template refuses the messages or the
            model has no chat template.
    """
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except (ChatTemplateError, ValueError) as exc:
        raise APIError(400, str(exc), "messages") from None


class RequestBody(BaseModel):
    """The fields a completion request and a chat request share (other fields are kept, so
    :func:`refuse_unsupported` can name them)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    # strict: a JSON true or "2" is not a count (pydantic would coerce them to 1 and 2)
    n: StrictInt | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    # accepted and ignored: OpenAI's end-user id (for its abuse monitoring)
    user: str | None = None
    # vLLM's extra sampling fields (``extra_body`` of the openai client)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    # FastDeploy's: also return the MTP drafts' logprobs (``draft_logprobs``; needs logprobs)
    include_draft_logprobs: StrictBool = False
    # ours: the request's own drafting method ("mtp", "ngram", "suffix", "none"; absent: the
    # engine's draft planner chooses per round)
    speculative_method: str | None = None
    # vLLM's: the request shares prefix-cache blocks only with requests of the same salt (and
    # tenant; see :mod:`fastdeploy_mtp.tenancy`)
    cache_salt: StrictStr | None = None

    def output_limit(self) -> tuple[int | None, str]:
        """The most tokens the body asks for (``None``: not given) and the field that asked."""
        return self.max_tokens, "max_tokens"


class CompletionBody(RequestBody):
    #: a string, a list of strings, a list of token ids or a list of token-id lists
    #: (checked by :func:`.prompts.completion_prompts`, which names ``prompt[i]``)
    prompt: Any
    best_of: StrictInt | None = None
    logprobs: int | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatBody(RequestBody):
    messages: list[ChatMessage]
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # OpenAI's current name of max_tokens (which it keeps as a deprecated alias)
    max_completion_tokens: int | None = None
    # accepted and ignored (OpenAI's; none changes the output): only their types are checked
    metadata: dict[str, str] | None = None
    store: StrictBool | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    parallel_tool_calls: StrictBool | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    def output_limit(self) -> tuple[int | None, str]:
        """``max_completion_tokens``, or ``max_tokens``; a 400 when both are given and differ."""
        new, old = self.max_completion_tokens, self.max_tokens
        if new is not None and old is not None and new != old:
            message = (
                f"max_tokens ({old}) and max_completion_tokens ({new}) disagree: send one "
                "(max_tokens is OpenAI's deprecated name of max_completion_tokens)"
            )
            raise APIError(400, message, "max_completion_tokens")
        if new is not None:
            return new, "max_completion_tokens"
        return old, "max_tokens"


def refuse_unsupported(body: RequestBody) -> None:
    """400 for what one request cannot ask of this server (naming the field): a field no
    schema knows, one this server cannot honour (:mod:`.request_fields`), an output limit
    that is not positive, or ``min_tokens`` above it."""
    chat = isinstance(body, ChatBody)
    extra = body.model_extra or {}
    refuse_unknown_fields(extra, chat, ("best_of",) if chat else ())
    for name, neutral in NEUTRAL_ONLY.items():
        refuse_neutral_only(name, extra.get(name), neutral)
    limit, name = body.output_limit()
    if limit is not None and limit <= 0:
        raise APIError(400, f"{name} must be > 0, got {limit}", name)
    if limit is not None and body.min_tokens is not None and body.min_tokens > limit:
        message = f"min_tokens ({body.min_tokens}) must not exceed {name} ({limit})"
        raise APIError(400, message, "min_tokens")


def refuse_invalid_text(value: Any, path: str = "") -> None:
    """400 naming the first string in ``value`` (a request body as plain data) that is not
    valid Unicode text: a lone surrogate such as ``"\\ud800"``, which JSON can spell but
    no encoding can carry."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            field = path.split("[")[0].split(".")[0] or None
            message = (
                f"{path or 'the body'}: not valid Unicode text (a lone surrogate at character "
                f"{exc.start})"
            )
            raise APIError(400, message, field) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_invalid_text(key, path or "the body")
            refuse_invalid_text(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            refuse_invalid_text(item, f"{path}[{i}]")


def sampling_params(
    body: CompletionBody | ChatBody,
    defaults: GenerationDefaults | None = None,
    eos_token_ids: Sequence[int] = (),
) -> SamplingParams:
    """The :class:`SamplingParams` an OpenAI request body asks for (``serve`` and the
    splitwise router both use it). A field the body leaves out takes ``defaults``' value
    (the model's ``generation_config.json``) when it has one, else the neutral value
    (``temperature`` 0: greedy; OpenAI's default of 1 is not assumed). ``stop`` may be a
    string or a list; ``top_k`` of -1 (vLLM's "off") is 0. ``logprobs``: completions give the
    number of alternatives ``k`` directly; chat gives ``logprobs: true`` and ``top_logprobs:
    k`` (0 when absent). ``eos_token_ids`` (the model's EOS ids) join ``stop_token_ids``
    unless the body sets ``ignore_eos``.

    Raises:
        APIError: 400 naming the field (``param``) of the first invalid value.
    """
    k: int | None = None
    if isinstance(body, ChatBody):
        if body.logprobs:
            k = body.top_logprobs or 0
            if k < 0 or k > MAX_LOGPROBS:
                raise APIError(
                    400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {k}", "top_logprobs"
                )
        elif body.top_logprobs is not None:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    else:
        k = body.logprobs
    fallback = defaults.sampling_overrides() if defaults is not None else {}

    def given(name: str, neutral: Any) -> Any:
        value = getattr(body, name)
        return value if value is not None else fallback.get(name, neutral)

    stop = body.stop
    guided, guided_field = guided_constraint(body.model_extra or {})
    stop_ids = list(body.stop_token_ids or [])
    if not body.ignore_eos:
        stop_ids += [int(t) for t in eos_token_ids if int(t) not in stop_ids]
    top_k = given("top_k", 0)
    params = SamplingParams(
        temperature=float(given("temperature", 0.0)),
        top_p=float(given("top_p", 1.0)),
        top_k=0 if top_k == -1 else int(top_k),
        min_p=float(given("min_p", 0.0)),
        seed=body.seed,
        repetition_penalty=float(given("repetition_penalty", 1.0)),
        frequency_penalty=body.frequency_penalty or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        min_tokens=body.min_tokens or 0,
        ignore_eos=bool(body.ignore_eos),
        stop=[stop] if isinstance(stop, str) else list(stop or []),
        stop_token_ids=stop_ids,
        logprobs=k,
        include_draft_logprobs=body.include_draft_logprobs,
        guided=guided,
        speculative_method=body.speculative_method,
    )
    problem = params.check()
    if problem is not None:
        name, _, why = problem.partition(": ")
        if name == "guided":
            raise APIError(400, f"{guided_field}: {why}", guided_field)
        raise APIError(400, problem, body_field(name, isinstance(body, ChatBody)))
    return params


def body_field(sampling_field: str, chat: bool) -> str:
    """The request-body field a :class:`SamplingParams` field comes from."""
    return "top_logprobs" if chat and sampling_field == "logprobs" else sampling_field


#: Names of the :class:`SamplingParams` fields (an engine refusal naming one is the client's 400).
SAMPLING_FIELDS = frozenset(SamplingParams().to_dict())


#: Most choices one request may ask for (``n``, and ``best_of`` candidates).
MAX_CHOICES = 16

#: Most generations one request may start: its prompts times ``best_of`` (or ``n``). The
#: engine queues every request it is sent; this keeps one HTTP request from queueing more
#: than a full batch of the largest deployment.
MAX_RESPONSE_REQUESTS = 256


def choice_counts(body: RequestBody) -> tuple[int, int]:
    """``(n, best_of)`` of ``body``: the choices returned and the candidates generated
    (``best_of`` defaults to ``n``). ``best_of`` is a completions field (a chat body's is
    refused), must be at least ``n`` and cannot stream (as OpenAI); both are at most
    :data:`MAX_CHOICES`.

    Raises:
        APIError: 400 naming ``n`` or ``best_of``.
    """
    n = 1 if body.n is None else body.n
    if not 1 <= n <= MAX_CHOICES:
        raise APIError(400, f"n must be an integer in [1, {MAX_CHOICES}], got {n!r}", "n")
    best_of = getattr(body, "best_of", None) if isinstance(body, CompletionBody) else None
    extra = (body.model_extra or {}).get("best_of")
    if (
        not isinstance(body, CompletionBody)
        and extra is not None
        and not (type(extra) is int and extra == 1)
    ):
        raise APIError(
            400,
            "best_of is a /v1/completions field (a chat request asks for choices with n)",
            "best_of",
        )
    if best_of is None:
        return n, n
    if not n <= best_of <= MAX_CHOICES:
        raise APIError(
            400,
            f"best_of must be an integer in [n, {MAX_CHOICES}] (n = {n}), got {best_of!r}",
            "best_of",
        )
    if body.stream and best_of > 1:
        raise APIError(400, "best_of > 1 cannot be streamed: set stream to false", "best_of")
    return n, best_of
