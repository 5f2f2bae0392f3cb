"""The splitwise side of a ``fastdeploy-mtp serve`` instance: what a prefill or a decode
instance adds to the API server (the router in front is :mod:`.router`).

Both endpoints take an optional ``"sampling"``: the request's
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
``data: [DONE]`` (an error after the start: ``data: {"error": {...}}``). Once the request
has a slot and blocks, a thread pulls its KV blocks from the prefill instance (shared
memory by name on one host, the TCP stream otherwise), bounded by ``--kv-transfer-timeout``;
a failed transfer fails the request with an error naming the prefill instance and frees its
blocks. Closing the stream aborts the request.

The OpenAI endpoints of both roles answer 400: clients talk to the router.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from ..runtime.engine import Engine
from ..runtime.events import StepEvents
from ..runtime.request import InvalidRequestError, Request
from ..runtime.sampling_params import SamplingParams
from .api_server import APIError, AsyncEngine, Emitted, Stream, emitted_of, logprob_to_dict, stream_events

TRANSPORTS = ("auto", "shm", "tcp")


class PrefillBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any] | None = None


class DecodeBody(PrefillBody):
    output_token_ids: list[int]
    handoff: dict[str, Any]


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
        transport: decode: ``"shm"``, ``"tcp"`` or ``"auto"`` (shared memory when the prefill
            instance's cache names exist on this host).
        transfer_timeout: decode: seconds a KV transfer may take.
        max_waiting: decode: handed-over requests that may wait for a slot before new ones get 429.
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
    ):
        if transport not in TRANSPORTS:
            raise ValueError(f"--kv-transport must be one of {TRANSPORTS}, got {transport!r}")
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
        super().__init__(engine, on_fatal)

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
                stream.put("error", APIError(500, f"cannot offer the KV blocks: {exc}", kind="server_error"))
                with self.counters.lock:
                    self.counters.failure += 1
                continue
            stream.put("tokens", emitted_of(h.request, list(h.request.output_token_ids)))
            stream.put("handoff", {"state": h.state, "kv": descriptor})
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
                    stream.put("error", APIError(502, f"KV transfer failed: {error}", kind="server_error"))
                with self.counters.lock:
                    self.counters.failure += 1
        if self._descriptors:  # forget those of requests aborted before they got a slot
            self._descriptors = {k: v for k, v in self._descriptors.items() if not v[0].finished}

    # ---- decode ----------------------------------------------------------------------------
    def full(self) -> bool:
        """Too many handed-over requests wait for a slot (answer 429)."""
        return len(self.engine.scheduler.waiting) + self._inbox.qsize() >= self.max_waiting

    def submit_transferred(self, req: Request, descriptor: dict[str, Any]) -> Stream:
        self._descriptors[req.request_id] = (req, descriptor)
        return self.submit(req)

    def _fetch(self, req: Request, blocks: list[int]) -> None:
        """The engine's ``kv_fetcher``: pull ``req``'s blocks in a thread."""
        from ..splitwise.kv_client import pull_blocks
        from ..splitwise.transport import choose_transport

        _, descriptor = self._descriptors.pop(req.request_id)
        transport = choose_transport(self.transport, descriptor)
        caches = self.caches
        if caches is None:
            raise RuntimeError("a decode instance needs its caches to receive KV blocks")

        def pull() -> None:
            error: BaseException | None = None
            t0 = time.perf_counter()
            try:
                nbytes = pull_blocks(descriptor, caches, self.layout, blocks, transport, self.transfer_timeout)
            except Exception as exc:
                error = exc
            with self.counters.lock:
                if error is None:
                    self.counters.kv_transfers += 1
                    self.counters.kv_transfer_bytes += nbytes
                else:
                    self.counters.kv_transfer_failures += 1
                self.counters.kv_transfer_seconds += time.perf_counter() - t0
            self._transfers_done.put((req, error))

        threading.Thread(target=pull, name=f"kv-pull-{req.request_id}", daemon=True).start()


def _error_response(exc: APIError) -> JSONResponse:
    return exc.response()


def sampling_of(values: dict[str, Any] | None) -> SamplingParams:
    """The :class:`SamplingParams` of a ``/v1/splitwise/*`` body's ``sampling`` (``None``:
    greedy); a 400 naming the field when it is malformed or invalid."""
    if values is None:
        return SamplingParams()
    try:
        params = SamplingParams.from_dict(values)
    except TypeError as exc:
        raise APIError(400, f"sampling: not SamplingParams fields ({exc})", "sampling") from None
    problem = params.check()
    if problem is not None:
        raise APIError(400, f"sampling.{problem}", problem.split(":", 1)[0])
    return params


def _logprobs_json(event: Emitted) -> list[dict[str, Any]] | None:
    return None if event.logprobs is None else [logprob_to_dict(lp) for lp in event.logprobs]


def add_splitwise_routes(app: FastAPI, se: SplitwiseEngine) -> None:
    """Add the ``/v1/splitwise/*`` endpoint of ``se``'s role to ``app``."""

    if se.role == "prefill":

        @app.post("/v1/splitwise/prefill")
        async def prefill(body: PrefillBody) -> Any:
            sampling = sampling_of(body.sampling)
            try:
                req = Request(body.request_id, body.prompt_token_ids, max_tokens=body.max_tokens, sampling=sampling)
            except ValueError as exc:
                raise APIError(400, str(exc), "prompt_token_ids" if "prompt" in str(exc) else "max_tokens") from None
            se.check(req)
            stream = se.submit(req)
            tokens: list[int] = []
            logprobs: list[dict[str, Any]] | None = None if sampling.logprobs is None else []
            handoff = None
            reason = None
            async for kind, value in stream_events(se, stream, ("finished", "handoff")):
                if kind == "tokens":
                    tokens.extend(value.token_ids)
                    if logprobs is not None:
                        logprobs.extend(_logprobs_json(value) or [])
                elif kind == "handoff":
                    handoff = value
                else:
                    reason = value
            from ..splitwise.handoff import first_drafts

            return {
                "request_id": req.request_id,
                "output_token_ids": tokens,
                "output_logprobs": logprobs,
                "draft_token_ids": first_drafts(handoff["state"]) if handoff else [],
                "finished": handoff is None,
                "finish_reason": reason,
                "handoff": handoff,
            }

        return

    @app.post("/v1/splitwise/decode")
    async def decode(body: DecodeBody) -> Any:
        from ..splitwise.kv_layout import KVLayout, TransferError

        handoff = body.handoff
        if set(handoff) != {"state", "kv"} or not isinstance(handoff["kv"], dict):
            raise APIError(400, "handoff must be the prefill instance's object with keys `state` and `kv`", "handoff")
        try:
            KVLayout.from_dict(handoff["kv"].get("layout")).check_matches(se.layout)
        except TransferError as exc:
            raise APIError(400, f"handoff: {exc}", "handoff") from None
        sampling = sampling_of(body.sampling)
        try:
            req = Request(
                body.request_id,
                body.prompt_token_ids,
                max_tokens=body.max_tokens,
                output_token_ids=list(body.output_token_ids),
                handoff_state=handoff["state"],
                sampling=sampling,
            )
        except ValueError as exc:
            raise APIError(400, str(exc), "prompt_token_ids" if "prompt" in str(exc) else "max_tokens") from None
        se.check(req)
        if se.full():
            return JSONResponse(
                {"error": {"message": "the decode instance is full", "type": "overloaded", "param": None, "code": 429}},
                status_code=429,
                headers={"Retry-After": "1"},
            )
        stream = se.submit_transferred(req, handoff["kv"])

        async def body_iter() -> AsyncIterator[str]:
            try:
                async for kind, value in stream_events(se, stream):
                    if kind == "tokens":
                        event: dict[str, Any] = {"token_ids": value.token_ids}
                        logprobs = _logprobs_json(value)
                        if logprobs is not None:
                            event["logprobs"] = logprobs
                        yield f"data: {json.dumps(event)}\n\n"
                    else:
                        yield f"data: {json.dumps({'finish_reason': value})}\n\n"
            except APIError as exc:
                error = {"message": exc.message, "type": exc.kind, "code": exc.status}
                yield f"data: {json.dumps({'error': error})}\n\n"
                return
            yield "data: [DONE]\n\n"

        return StreamingResponse(body_iter(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
