"""The splitwise side of a ``fastdeploy-mtp serve`` instance: what a prefill or a decode
instance adds to the API server (the router in front is :mod:`.router`).

The bodies are :mod:`.messages`' (validated once, as they arrive; the protocol version in
the ``X-FastDeploy-MTP-Protocol`` header: another is a 400 naming both). Both endpoints take
an optional ``"sampling"``: the request's
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

import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from sse_starlette import EventSourceResponse

from ..credentials import DroppedMessages
from ..runtime.engine import Engine
from ..runtime.events import StepEvents
from ..runtime.request import InvalidRequestError, Request
from ..runtime.sampling_params import SamplingParams
from .engine_client import AsyncEngine, Stream, stream_events
from .messages import (
    DECODE_PATH,
    PREFILL_PATH,
    VERSION_HEADER,
    DecodeRequest,
    ErrorDetail,
    ErrorMessage,
    FinishEvent,
    HandoffMessage,
    MessageError,
    PrefillAnswer,
    PrefillRequest,
    TokensEvent,
    check_header_version,
    decode_http,
    version_headers,
)
from .openai_protocol import APIError
from .text import emitted_of

#: seconds between keep-alive comments on a decode stream
KEEPALIVE_S = 2

B = TypeVar("B", bound=BaseModel)


class SplitwiseEngine(AsyncEngine):
    """:class:`AsyncEngine` of a prefill or decode instance.

    Args:
        engine: the engine (``scheduler_config.splitwise_role`` is ``"prefill"`` or ``"decode"``).
        on_fatal: see :class:`AsyncEngine`.
        kv_source: prefill: offers handed-off requests' blocks
            (:class:`~fastdeploy_mtp.splitwise.kv_source.KVSource`); its ``on_release``
            must be :meth:`released`.
        layout: decode: this instance's KV layout (checked against each descriptor).
        caches: decode: every rank's caches as writable numpy views (the pull's target).
        transport: decode: ``"shm"``, ``"mooncake"``, ``"tcp"`` or ``"auto"`` (per request: shared
            memory when the prefill instance's cache names exist on this host, else the Mooncake
            transfer engine when the prefill instance offers it, else tcp).
        transfer_timeout: decode: seconds a KV transfer may take.
        max_waiting: decode: handed-over requests that may wait for a slot before new ones get 429.
        dropped: the deployment's count of refused messages.
        secret: the splitwise secret (:func:`fastdeploy_mtp.credentials.splitwise_secret`):
            the router's credential on ``/v1/splitwise/*``, the hand-over signature's key.
    """

    def __init__(
        self,
        engine: Engine,
        on_fatal: Callable[[str], None],
        kv_source: Any = None,
        layout: Any = None,
        caches: list[list[Any]] | None = None,
        transport: str = "auto",
        transfer_timeout: float = 60.0,
        max_waiting: int = 8,
        dropped: DroppedMessages | None = None,
        secret: bytes | None = None,
    ):
        from ..splitwise.transport import AUTO, transport_names

        if transport not in (AUTO, *transport_names()):
            raise ValueError(
                f"--kv-transport must be one of {(AUTO, *transport_names())}, got {transport!r}"
            )
        self.role = engine.role
        self.kv_source = kv_source
        self.layout = layout
        self.caches = caches
        self.transport = transport
        self.transfer_timeout = transfer_timeout
        self.max_waiting = max_waiting
        self._released: queue.Queue[str] = queue.Queue()
        self._transfers_done: queue.Queue[tuple[Request, BaseException | None]] = queue.Queue()
        self._descriptors: dict[str, tuple[Request, dict[str, Any]]] = {}
        self._pending = 0  # decode: submitted, not yet admitted to the engine's queue
        if self.role == "decode":
            engine.kv_fetcher = self._fetch
        self.secret = secret
        super().__init__(engine, on_fatal, dropped)

    def _secret(self) -> bytes:
        if self.secret is None:
            raise RuntimeError("a splitwise instance needs the splitwise secret")
        return self.secret

    # ---- the OpenAI endpoints are the router's --------------------------------------------
    def validate(self, req: Request) -> None:
        raise APIError(
            400,
            f"this is a splitwise {self.role} instance: send requests to the router (`fastdeploy-mtp router`)",
            kind="invalid_request_error",
        )

    def check(self, req: Request) -> None:
        """Submission checks of a ``/v1/splitwise/*`` request (400 naming the field)."""
        try:
            self.engine.scheduler.validate(req)
            if req.handoff_state is not None:
                self.engine.runner.check_handoff(req.handoff_state)
        except (InvalidRequestError, ValueError) as exc:
            raise APIError(400, str(exc), getattr(exc, "field", "handoff")) from None

    # ---- prefill ---------------------------------------------------------------------------
    def released(self, request_id: str, reason: str) -> None:
        """``KVSource``'s ``on_release``: the blocks of ``request_id`` may be reused."""
        self._released.put(request_id)

    def _after_step(self, events: StepEvents) -> None:
        for h in events.handed_off:
            rid = h.request.request_id
            stream = self._streams.pop(rid, None)
            if stream is None:  # its client left meanwhile: nobody will fetch the blocks
                self.engine.release_handoff(rid)
                continue
            try:
                descriptor = self.kv_source.offer(rid, h.blocks)
            except Exception as exc:  # e.g. the KV source is closing: fail this request only
                self.engine.release_handoff(rid)
                stream.put(
                    "error",
                    APIError(500, f"cannot offer the KV blocks: {exc}", kind="server_error"),
                )
                with self.counters.lock:
                    self.counters.failure += 1
                continue
            from ..splitwise.handoff import sign_handoff

            outputs = list(h.request.output_token_ids)
            signature = sign_handoff(
                self._secret(), rid, h.request.prompt_token_ids, outputs, h.state, descriptor
            )
            stream.put("tokens", emitted_of(h.request, outputs))
            stream.put("handoff", HandoffMessage(state=h.state, kv=descriptor, signature=signature))
            with self.counters.lock:
                self.counters.success += 1

    def _before_step(self) -> None:
        while True:
            try:
                self.engine.release_handoff(self._released.get_nowait())
            except queue.Empty:
                break
        while True:
            try:
                req, error = self._transfers_done.get_nowait()
            except queue.Empty:
                break
            aborted_before = req.finished
            self.engine.transfer_done(req, error)
            if error is not None and not aborted_before:
                stream = self._streams.pop(req.request_id, None)
                if stream is not None:
                    stream.put(
                        "error", APIError(502, f"KV transfer failed: {error}", kind="server_error")
                    )
                with self.counters.lock:
                    self.counters.failure += 1
        if self._descriptors:  # forget those of requests aborted before they got a slot
            self._descriptors = {k: v for k, v in self._descriptors.items() if not v[0].finished}

    # ---- decode ----------------------------------------------------------------------------
    def full(self) -> bool:
        """Too many handed-over requests wait for a slot (answer 429)."""
        return len(self.engine.scheduler.waiting) + self._inbox.qsize() >= self.max_waiting

    def check_signature(self, body: DecodeRequest, handoff: HandoffMessage) -> None:
        """A 400 (counted as a dropped hand-over) unless a prefill instance holding this
        deployment's splitwise secret signed this hand-over for this request, prompt and
        first tokens."""
        from ..splitwise.handoff import handoff_signature_matches

        if not handoff_signature_matches(
            self._secret(),
            handoff.signature,
            body.request_id,
            body.prompt_token_ids,
            body.output_token_ids,
            handoff.state,
            handoff.kv,
        ):
            self.dropped.add("handoff")
            raise APIError(
                400,
                "handoff: the signature does not match: not made by a prefill instance with this deployment's "
                "splitwise secret for this request id, prompt and first tokens, or changed on the way",
                "handoff",
            )

    def check_history(self, req: Request, handoff: HandoffMessage) -> None:
        """A 400 (counted) unless the slot state is this request's just after its prompt and
        the offered blocks hold every cached position
        (:func:`~fastdeploy_mtp.splitwise.handoff.check_handoff_history`)."""
        from ..splitwise.handoff import HandoffError, check_handoff_history

        block_ids = handoff.kv.get("block_ids")
        spec = self.engine.fd_config.speculative_config
        try:
            check_handoff_history(
                handoff.state,
                req.prompt_token_ids,
                req.output_token_ids,
                len(block_ids) if isinstance(block_ids, list) else 0,
                self.engine.fd_config.cache_config.block_size,
                spec.num_speculative_tokens if spec.enabled else 0,
            )
        except HandoffError as exc:
            self.dropped.add("handoff")
            raise APIError(400, f"handoff: {exc}", "handoff") from None

    def submit_transferred(self, req: Request, descriptor: dict[str, Any]) -> Stream:
        self._descriptors[req.request_id] = (req, descriptor)
        return self.submit(req)

    def _fetch(self, req: Request, blocks: list[int]) -> None:
        """The engine's ``kv_fetcher``: pull ``req``'s blocks in a thread (all but the leading
        ones this instance's prefix cache already gave it: ``req.num_cached_tokens``)."""
        from ..splitwise.kv_client import pull_blocks
        from ..splitwise.transport import choose_transport

        _, descriptor = self._descriptors.pop(req.request_id)
        transport = choose_transport(self.transport, descriptor)
        caches = self.caches
        if caches is None:
            raise RuntimeError("a decode instance needs its caches to receive KV blocks")
        skip = req.num_cached_tokens // self.engine.fd_config.cache_config.block_size

        def pull() -> None:
            error: BaseException | None = None
            nbytes: int | None = None
            t0 = time.perf_counter()
            try:
                nbytes = pull_blocks(
                    descriptor,
                    caches,
                    self.layout,
                    blocks,
                    transport,
                    self.transfer_timeout,
                    self.secret,
                    skip,
                )
            except Exception as exc:
                error = exc
            self.counters.count_transfer(transport, nbytes, time.perf_counter() - t0)
            self._transfers_done.put((req, error))

        threading.Thread(target=pull, name=f"kv-pull-{req.request_id}", daemon=True).start()


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
    try:
        return Request(
            body.request_id,
            body.prompt_token_ids,
            max_tokens=body.max_tokens,
            sampling=sampling_of(body.sampling),
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
            from ..splitwise.handoff import first_drafts

            answer.handoff = value.model_dump()
            answer.draft_token_ids = first_drafts(value.state)
            answer.finished = False
        else:
            answer.finish_reason = value
    return Response(answer.encode(), media_type="application/json", headers=version_headers())


async def decode(request: HTTPRequest) -> Response:
    """Continue a handed-over request: its tokens as server-sent events (or 429: full)."""
    from ..splitwise.kv_layout import KVLayout, TransferError

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
    [DONE]`` (framed as :func:`~.app.sse` frames the OpenAI streams)."""

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
