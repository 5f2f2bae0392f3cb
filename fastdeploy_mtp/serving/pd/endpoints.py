"""The splitwise side of a ``fastdeploy-mtp serve`` instance: what a prefill or a decode
instance adds to the API server (the router in front is :mod:`.router`).

The bodies are :mod:`fastdeploy_mtp.serving.messages.router_instances`' (validated once, as they
arrive; the protocol version in the ``X-FastDeploy-MTP-Protocol`` header: another is a 400 naming
both). Both endpoints take an optional ``"sampling"``: the request's
:class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams` as ``to_dict()`` (absent: greedy).
Logprobs travel as ``{"token_id", "logprob", "top": [[id, logprob], ...]}`` per token.

Prefill instance (``--splitwise-role prefill``): ``POST /v1/splitwise/prefill`` with
``{"request_id", "prompt_token_ids", "max_tokens", "sampling"}`` runs the prompt through the
target and the MTP layer, and answers once the first token is out: ``{"request_id",
"output_token_ids", "output_logprobs", "draft_token_ids", "finished", "finish_reason",
"handoff"}`` (``output_logprobs``: one per output token when the request asked for logprobs,
else ``null``; ``draft_token_ids``: the first drafts, which the decode instance's first
verify round checks; informational, they also travel in the state). Unless the request
already finished, ``handoff``
carries its slot state (:mod:`fastdeploy_mtp.splitwise.handoff`) and a KV descriptor
(:func:`fastdeploy_mtp.splitwise.kv_source.KVSource.offer`); the instance holds the
request's KV blocks until a decode instance has copied them or ``--kv-hold-timeout`` passed.

Decode instance (``--splitwise-role decode``): ``POST /v1/splitwise/decode`` with
``{"request_id", "prompt_token_ids", "output_token_ids", "max_tokens", "sampling", "handoff"}``. The
descriptor and the slot state are checked against this instance first (400 naming what
differs: layers, block shape, speculation, lengths); when ``--max-waiting-requests``
requests already wait for a slot the answer is 429 with ``Retry-After`` (back-pressure: the
router retries, nothing is dropped). Otherwise the answer is an event stream:
``data: {"token_ids": [...]}`` per step (plus ``"logprobs": [...]``, one per id, when the
request asked for them), then ``data: {"finish_reason": ...}`` and
``data: [DONE]`` (an error after the start: ``data: {"error": {...}}``), with a comment line
(``: ping``) every :data:`KEEPALIVE_S` seconds. Once the request
has a slot and blocks, a thread pulls its KV blocks from the prefill instance (shared
memory by name on one host, the TCP stream otherwise), bounded by ``--kv-transfer-timeout``;
a failed transfer fails the request with an error naming the prefill instance and frees its
blocks. Closing the stream aborts the request.

The OpenAI endpoints of both roles answer 400: clients talk to the router.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from sse_starlette import EventSourceResponse

from ...runtime.request import Request
from ...runtime.sampling_params import SamplingParams
from ..engine_client.backend import Stream, stream_events
from ..messages.router_instances import (
    DECODE_PATH,
    PREFILL_PATH,
    DecodeRequest,
    ErrorDetail,
    ErrorMessage,
    FinishEvent,
    HandoffMessage,
    PrefillAnswer,
    PrefillRequest,
    TokensEvent,
    decode_http,
)
from ..messages.wire import VERSION_HEADER, MessageError, check_header_version, version_headers
from ..openai.protocol import APIError
from .splitwise_engine import SplitwiseEngine

#: seconds between keep-alive comments on a decode stream
KEEPALIVE_S = 2

B = TypeVar("B", bound=BaseModel)


def sampling_of(params: SamplingParams | None) -> SamplingParams:
    """The :class:`SamplingParams` of a ``/v1/splitwise/*`` body's ``sampling`` (``None``:
    greedy); a 400 naming the field when a value is invalid."""
    if params is None:
        return SamplingParams()
    problem = params.check()
    if problem is not None:
        raise APIError(400, f"sampling.{problem}", problem.split(":", 1)[0])
    return params


async def receive(request: HTTPRequest, model: type[B]) -> B:
    """The body of ``request`` as ``model``: a 400 naming the field (or the version) unless
    it is one of this protocol version's."""
    try:
        check_header_version(request.headers.get(VERSION_HEADER), "the router")
        return decode_http(model, await request.body(), "the router")
    except MessageError as exc:
        raise APIError(400, str(exc), exc.field) from None


def new_request(body: PrefillRequest, **extra: Any) -> Request:
    """The engine request of a ``/v1/splitwise/*`` body (a 400 naming what is invalid)."""
    if not body.request_id:  # it names the request's KV offer and its slot state
        raise APIError(400, "request_id must be a non-empty string", "request_id")
    try:
        namespace = bytes.fromhex(body.cache_namespace)
    except ValueError:
        namespace = b"?"
    if len(namespace) not in (0, 32):
        message = "cache_namespace must be empty or 64 hexadecimal digits"
        raise APIError(400, message, "cache_namespace")
    try:
        return Request(
            body.request_id,
            body.prompt_token_ids,
            max_tokens=body.max_tokens,
            sampling=sampling_of(body.sampling),
            cache_namespace=namespace,
            **extra,
        )
    except ValueError as exc:
        raise APIError(
            400, str(exc), "prompt_token_ids" if "prompt" in str(exc) else "max_tokens"
        ) from None


def add_splitwise_routes(app: FastAPI, se: SplitwiseEngine) -> None:
    """Add the ``/v1/splitwise/*`` endpoint of ``se``'s role to ``app``."""
    app.state.splitwise = se
    if se.role == "prefill":
        app.post(PREFILL_PATH)(prefill)
    else:
        app.post(DECODE_PATH)(decode)


def splitwise_engine(request: HTTPRequest) -> SplitwiseEngine:
    se = request.app.state.splitwise
    assert isinstance(se, SplitwiseEngine)
    return se


async def prefill(request: HTTPRequest) -> Response:
    """Run a prompt; answer its first tokens and the hand-over (:class:`PrefillAnswer`)."""
    se = splitwise_engine(request)
    req = new_request(await receive(request, PrefillRequest))
    se.check(req)
    stream = se.submit(req)
    answer = PrefillAnswer(
        request_id=req.request_id,
        output_token_ids=[],
        output_logprobs=None if req.sampling.logprobs is None else [],
        finished=True,
    )
    async for kind, value in stream_events(se, stream, ("finished", "handoff")):
        if kind == "tokens":
            answer.output_token_ids.extend(value.token_ids)
            if answer.output_logprobs is not None:
                answer.output_logprobs.extend(value.logprobs or [])
        elif kind == "handoff":
            from ...splitwise.handoff import first_drafts

            answer.handoff = value.model_dump()
            answer.draft_token_ids = first_drafts(value.state)
            answer.finished = False
        else:
            answer.finish_reason = value
    return Response(answer.encode(), media_type="application/json", headers=version_headers())


async def decode(request: HTTPRequest) -> Response:
    """Continue a handed-over request: its tokens as server-sent events (or 429: full)."""
    from ...splitwise.kv_layout import KVLayout, TransferError

    se = splitwise_engine(request)
    body = await receive(request, DecodeRequest)
    try:
        handoff = HandoffMessage.model_validate(body.handoff)
    except ValidationError:
        se.dropped.add("handoff")
        message = (
            "handoff must be the prefill instance's object with keys `state`, `kv` and `signature`"
        )
        raise APIError(400, message, "handoff") from None
    se.check_signature(body, handoff)
    try:
        KVLayout.from_dict(handoff.kv.get("layout")).check_matches(se.layout)
    except TransferError as exc:
        raise APIError(400, f"handoff: {exc}", "handoff") from None
    req = new_request(
        body, output_token_ids=list(body.output_token_ids), handoff_state=handoff.state
    )
    se.check(req)
    se.check_history(req, handoff)
    if se.full():
        full = APIError(429, "the decode instance is full", kind="overloaded").response()
        full.headers["Retry-After"] = "1"
        return full
    return decode_events(se, se.submit_transferred(req, handoff.kv))


def decode_events(se: SplitwiseEngine, stream: Stream) -> EventSourceResponse:
    """A decode answer: ``data: <TokensEvent>`` per step, ``data: <FinishEvent>``, ``data:
    [DONE]`` (framed as :func:`~fastdeploy_mtp.serving.openai.app.sse` frames the OpenAI
    streams)."""

    async def events() -> AsyncIterator[str]:
        try:
            async for kind, value in stream_events(se, stream):
                if kind == "tokens":  # no ``logprobs`` key unless the request asked
                    yield TokensEvent(
                        token_ids=value.token_ids, logprobs=value.logprobs
                    ).model_dump_json(exclude_none=True)
                else:
                    yield FinishEvent(finish_reason=value).model_dump_json()
        except APIError as exc:
            error = ErrorDetail(message=exc.message, type=exc.kind, code=exc.status)
            yield ErrorMessage(error=error).model_dump_json(exclude_none=True)
            return
        yield "[DONE]"

    headers = {"Cache-Control": "no-cache", **version_headers()}
    # a comment line every KEEPALIVE_S while the request waits (for a slot, for its KV), so the
    # router's --instance-timeout measures silence of the instance, not queueing
    return EventSourceResponse(events(), headers=headers, ping=KEEPALIVE_S, sep="\n")
