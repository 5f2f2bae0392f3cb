"""The messages between the splitwise router and the prefill and decode instances (HTTP),
typed and versioned (see :mod:`.wire`).

Router <-> splitwise instances (HTTP): :class:`PrefillRequest` -> :class:`PrefillAnswer`,
:class:`DecodeRequest` -> an event stream of :class:`TokensEvent`, then :class:`FinishEvent`
(or an :class:`ErrorMessage`), then ``[DONE]``. Their bodies keep the shape clients of the
instances see; the version travels in the :data:`VERSION_HEADER` of the request (the
instance answers 400 naming both versions) and of a 200 answer (the router answers 502).
The events of a decode stream belong to the answer whose header named the version. The
``handoff`` a prefill instance answers is opaque to the router (passed on unchanged); the
decode instance reads it as a :class:`HandoffMessage`. Errors use OpenAI's shape
(:class:`ErrorMessage`), which is not versioned.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from ...runtime.sampling_params import SamplingParams, TokenLogprob
from .wire import Message, refusal

#: The splitwise endpoints of a prefill and a decode instance.
PREFILL_PATH = "/v1/splitwise/prefill"
DECODE_PATH = "/v1/splitwise/decode"

B = TypeVar("B", bound=BaseModel)


class PrefillRequest(Message):
    """``cache_namespace``: the request's prefix-cache namespace (the router derived it from
    the client's API key and ``cache_salt``; :mod:`fastdeploy_mtp.tenancy`), hex; ``""``:
    the global one."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    sampling: SamplingParams | None = None  # None: greedy
    cache_namespace: str = ""


class DecodeRequest(PrefillRequest):
    output_token_ids: list[int]
    handoff: dict[str, Any]  # the prefill instance's, unchanged (a :class:`HandoffMessage`)


class HandoffMessage(Message):
    """A prefill instance's hand-over: the slot state (:mod:`fastdeploy_mtp.splitwise.handoff`),
    the KV descriptor (``KVSource.offer``, versioned by :mod:`fastdeploy_mtp.splitwise`) and
    the prefill instance's ``signature`` over both, the request id, its prompt and first
    tokens (:func:`~fastdeploy_mtp.splitwise.handoff.sign_handoff`)."""

    state: dict[str, Any]
    kv: dict[str, Any]
    signature: str


class PrefillAnswer(Message):
    """``output_logprobs``: one per output token when the request asked for logprobs;
    ``draft_token_ids``: the first drafts (informational, they also travel in the state);
    ``handoff``: ``None`` iff ``finished``."""

    request_id: str
    output_token_ids: list[int]
    output_logprobs: list[TokenLogprob] | None = None
    draft_token_ids: list[int] = []
    finished: bool
    finish_reason: str | None = None
    handoff: dict[str, Any] | None = None


class TokensEvent(Message):
    """A decode stream's tokens of one step (``logprobs``: one per id, when asked)."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None


class FinishEvent(Message):
    finish_reason: str


class ErrorDetail(BaseModel):
    """OpenAI's error object (other keys are ignored: the shape is OpenAI's, not ours)."""

    message: str
    type: str = "server_error"
    param: str | None = None
    code: int | str | None = None  # our status code, or OpenAI's name (``invalid_api_key``)


class ErrorMessage(Message):
    """OpenAI's error body, also a decode stream's last event when it fails."""

    error: ErrorDetail


DecodeEvent = TokensEvent | FinishEvent | ErrorMessage
_DECODE_EVENT: TypeAdapter[DecodeEvent] = TypeAdapter(DecodeEvent)


def decode_http(model: type[B], payload: bytes | str, sender: str) -> B:
    """``payload`` (an HTTP body) as ``model`` (raises :class:`MessageError`; the version was
    checked on the headers)."""
    try:
        return model.model_validate_json(payload)
    except ValidationError as exc:
        raise refusal(exc, f"message from {sender}") from None


def decode_event(data: str, sender: str) -> DecodeEvent:
    """One ``data:`` of a decode stream (not ``[DONE]``; raises :class:`MessageError`)."""
    try:
        return _DECODE_EVENT.validate_json(data)
    except ValidationError as exc:
        raise refusal(exc, f"event from {sender}") from None
