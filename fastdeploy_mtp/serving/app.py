"""The OpenAI-compatible HTTP app (FastAPI) over a :class:`~.engine_client.Backend`, and
:func:`run_http`, which serves it with uvicorn.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``:
server-sent events ending in ``data: [DONE]``), ``GET /v1/models``, ``GET /health`` (200, or
503 with the backend's reason: for ``serve``, once the deployment lost a process),
``GET /metrics`` (Prometheus text; see :mod:`.metrics`). The request bodies and sampling
fields are :mod:`.openai_protocol`'s. ``finish_reason`` is the engine's (``"stop"``: EOS, a
stop token id or a stop string, which the text does not include; ``"length"``).

The backend is the engine loop for ``serve`` (:class:`~.engine_client.AsyncEngine`) or the
splitwise router (:class:`~.router_backend.RouterBackend`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from ..runtime.request import InvalidRequestError, Request
from ..runtime.sampling_params import TokenLogprob
from ..tokenization import GenerationDefaults, Tokenizer
from .engine_client import Backend, Stream, stream_events
from .http_auth import Access, install
from .metrics import render
from .openai_protocol import (
    SAMPLING_FIELDS,
    APIError,
    ChatBody,
    CompletionBody,
    RequestBody,
    body_field,
    chat_prompt,
    refuse_invalid_text,
    refuse_unsupported,
    sampling_params,
)
from .text import TextTracker

#: seconds between checks that the client of a non-streaming request is still there
DISCONNECT_POLL_S = 0.25


def run_http(
    app: FastAPI,
    host: str,
    port: int,
    progress: Callable[[str], None],
    t0: float,
    on_server: Callable[[Any], None] | None = None,
    sock: socket.socket | None = None,
) -> bool:
    """Serve ``app`` with uvicorn on ``host:port`` until SIGINT/SIGTERM; returns whether it
    started (e.g. not when the port was taken: uvicorn said why). ``on_server`` gets the
    ``uvicorn.Server`` first (to stop it from another thread). uvicorn handles the signals
    while it runs and raises them again once it has stopped; the handlers installed here take
    that second delivery (the caller restores its own afterwards), so the caller's clean-up
    runs. ``sock``: a socket :func:`bind_listener` bound already (uvicorn then binds none)."""
    import signal

    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    if on_server is not None:
        on_server(server)
    progress(f"ready in {time.perf_counter() - t0:.1f} s: listening on http://{host}:{port}")

    def requested_stop(signum: int, frame: object) -> None:
        progress(f"{signal.Signals(signum).name} received")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, requested_stop)
    server.run(sockets=[sock] if sock is not None else None)
    return bool(server.started)


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, bound before anything slow starts, so a taken
    port is refused at once. Raises ``UsageError`` naming ``--port`` or ``--host``."""
    from ..engine_args import UsageError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UsageError(f"--port {port}: cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(False)
    return sock


@dataclass
class Served:
    """What the app serves: ``backend`` under the model id ``model_name``; ``tokenizer``
    makes prompts (a chat's through its chat template) and decodes responses; ``defaults``
    fill the sampling fields a request leaves out; ``eos_token_ids`` end a response unless
    the request sets ``ignore_eos``."""

    backend: Backend
    model_name: str
    tokenizer: Tokenizer
    created: int
    defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    eos_token_ids: list[int] = field(default_factory=list)

    def tracker(self) -> TextTracker:
        return TextTracker(self.tokenizer)


def create_app(
    backend: Backend,
    model_name: str,
    tokenizer: Tokenizer,
    defaults: GenerationDefaults | None = None,
    eos_token_ids: list[int] | None = None,
    access: Access | None = None,
) -> FastAPI:
    """The FastAPI app over ``backend`` (an :class:`~.engine_client.AsyncEngine`, or any other
    :class:`~.engine_client.Backend`); see :class:`Served` for the other arguments.
    ``eos_token_ids`` defaults to the tokenizer's EOS id and ``defaults``' ids; ``access``
    says who may call which endpoint (:mod:`.http_auth`; default: everyone)."""
    defaults = defaults or GenerationDefaults()
    if eos_token_ids is None:
        eos_token_ids = list(dict.fromkeys([*tokenizer.eos_token_ids, *defaults.eos_token_ids]))
    app = FastAPI(title="fastdeploy-mtp", description="OpenAI-compatible server with MTP speculative decoding")
    app.state.served = Served(backend, model_name, tokenizer, int(time.time()), defaults, list(eos_token_ids))
    install(app, access or Access())
    app.exception_handler(APIError)(_api_error)
    app.exception_handler(RequestValidationError)(_validation_error)
    app.get("/health")(health)
    app.get("/metrics")(metrics)
    app.get("/v1/models")(models)
    app.post("/v1/completions")(completions)
    app.post("/v1/chat/completions")(chat)
    return app


def served_by(request: HTTPRequest) -> Served:
    """The :class:`Served` of the app answering ``request`` (a FastAPI dependency)."""
    served = request.app.state.served
    assert isinstance(served, Served)
    return served


#: A handler's :class:`Served` (FastAPI injects it).
ServedDep = Annotated[Served, Depends(served_by)]


async def _api_error(_: HTTPRequest, exc: APIError) -> JSONResponse:
    return exc.response()


async def _validation_error(_: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = f"{param}: {first.get('msg', 'invalid value')}" if param else str(first.get("msg", "invalid request body"))
    return APIError(400, msg, param).response()


async def health(served: ServedDep) -> Response:
    reason = await served.backend.health()
    if reason:
        return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)
    return JSONResponse({"status": "ok"})


async def metrics(served: ServedDep) -> Response:
    return Response(render(served.backend.registry), media_type="text/plain; version=0.0.4; charset=utf-8")


async def models(served: ServedDep) -> dict[str, Any]:
    card = {"id": served.model_name, "object": "model", "created": served.created, "owned_by": "fastdeploy-mtp"}
    return {"object": "list", "data": [card]}


def new_request(
    served: Served, prompt_ids: list[int], max_tokens: int, body: CompletionBody | ChatBody, prefix: str
) -> Request:
    """The engine request ``body`` asks for, checked by the backend (400/404 naming the field)."""
    chat = isinstance(body, ChatBody)
    if body.model not in (None, served.model_name):
        message = f"model {body.model!r} is not served here (this server serves {served.model_name!r})"
        raise APIError(404, message, "model")
    refuse_unsupported(body)
    sampling = sampling_params(body, served.defaults, served.eos_token_ids)
    if not prompt_ids:
        raise APIError(400, "the prompt is empty", "messages" if chat else "prompt")
    req = Request(f"{prefix}-{uuid.uuid4().hex}", prompt_ids, max_tokens=max_tokens, sampling=sampling)
    try:
        served.backend.validate(req)
    except InvalidRequestError as exc:
        if exc.field == "max_tokens":
            param = "max_tokens"
        elif exc.field in SAMPLING_FIELDS:
            param = body_field(exc.field, chat)
        else:
            param = "messages" if chat else "prompt"
        raise APIError(400, str(exc), param) from None
    return req


def max_tokens_of(served: Served, body: RequestBody, fallback: int) -> int:
    """The body's ``max_tokens``, else the model's ``max_new_tokens`` default, else ``fallback``."""
    return body.max_tokens or served.defaults.max_new_tokens or fallback


Entries = list[tuple[int, TokenLogprob]]


async def collect(served: Served, stream: Stream) -> tuple[str, str, Entries | None]:
    """(text, finish reason, logprob entries or ``None``) of a whole response."""
    tracker = served.tracker()
    text, reason = "", "length"
    entries: Entries | None = None
    async for kind, value in stream_events(served.backend, stream):
        if kind == "tokens":
            piece, got = tracker.feed_event(value)
            text += piece
            if got is not None:
                entries = (entries or []) + got
        else:
            reason = value
    if stream.request.sampling.logprobs is not None and entries is None:
        entries = []
    return text + tracker.feed([], True), reason, entries


async def collect_or_abort(http: HTTPRequest, served: Served, stream: Stream) -> tuple[str, str, Entries | None]:
    """:func:`collect`, aborting the request if the client disconnects first (a
    non-streaming response has nothing to write until the end, so the disconnect is
    watched for)."""
    task = asyncio.ensure_future(collect(served, stream))
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await http.is_disconnected():
            task.cancel()  # stream_events cancels the request on the backend
            with contextlib.suppress(asyncio.CancelledError, APIError):
                await task
            raise APIError(499, "the client disconnected; the request was aborted")


async def started(events: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[tuple[str, Any]]:
    """``events`` with its first item already awaited, so that an error before the first
    event (e.g. a splitwise instance's 400) is raised here, while the response can still
    carry its status, and not inside a started stream."""
    first = await anext(events)

    async def chained() -> AsyncIterator[tuple[str, Any]]:
        yield first
        async for item in events:
            yield item

    return chained()


def usage(req: Request) -> dict[str, int]:
    p, c = len(req.prompt_token_ids), len(req.output_token_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def include_usage(body: RequestBody) -> bool:
    return bool(body.stream_options and body.stream_options.get("include_usage"))


def sse(chunks: AsyncIterator[dict[str, Any]]) -> EventSourceResponse:
    """``chunks`` as server-sent events: ``data: <json>`` each, then ``data: [DONE]``; an
    :class:`APIError` once the response started ends the stream with ``data: {"error": ...}``
    instead. The framing is what the hand-written version sent: ``\\n`` separators (not
    sse-starlette's default ``\\r\\n``), ``Cache-Control: no-cache``, and no keep-alive
    ping comments (``ping=0``), so a long stream carries nothing but its events."""

    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield json.dumps(chunk)
        except APIError as exc:  # the response has started: report it in the stream
            yield json.dumps({"error": {"message": exc.message, "type": exc.kind, "code": exc.status}})
            return
        yield "[DONE]"

    return EventSourceResponse(events(), headers={"Cache-Control": "no-cache"}, ping=0, sep="\n")


async def completions(body: CompletionBody, served: ServedDep, http: HTTPRequest) -> Any:
    refuse_invalid_text(body.model_dump())
    prompt: Any = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "batched prompts are not supported: send one request per prompt", "prompt")
        prompt = prompt[0]
    ids = served.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    req = new_request(served, ids, max_tokens_of(served, body, 16), body, "cmpl")
    stream = served.backend.submit(req)
    base = {"id": req.request_id, "object": "text_completion", "created": int(time.time()), "model": served.model_name}
    tracker = served.tracker()

    def choice(text: str, reason: str | None, entries: Entries | None) -> dict[str, Any]:
        logprobs = None if entries is None else tracker.completion_logprobs(entries)
        return {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}

    if not body.stream:
        text, reason, entries = await collect_or_abort(http, served, stream)
        return {**base, "choices": [choice(text, reason, entries)], "usage": usage(req)}
    events = await started(stream_events(served.backend, stream))

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        async for kind, value in events:
            if kind == "tokens":
                text, entries = tracker.feed_event(value)
                if text or entries:
                    yield {**base, "choices": [choice(text, None, entries)]}
            else:
                yield {**base, "choices": [choice(tracker.feed([], True), value, None)]}
        if include_usage(body):
            yield {**base, "choices": [], "usage": usage(req)}

    return sse(chunks())


async def chat(body: ChatBody, served: ServedDep, http: HTTPRequest) -> Any:
    refuse_invalid_text(body.model_dump())
    if not body.messages:
        raise APIError(400, "messages must not be empty", "messages")
    prompt = chat_prompt(served.tokenizer, [m.model_dump() for m in body.messages])
    # the template wrote the special tokens the model expects; none are added again
    ids = served.tokenizer.encode(prompt, add_special_tokens=False)
    req = new_request(served, ids, max_tokens_of(served, body, 64), body, "chatcmpl")
    stream = served.backend.submit(req)
    base = {"id": req.request_id, "created": int(time.time()), "model": served.model_name}
    if not body.stream:
        text, reason, entries = await collect_or_abort(http, served, stream)
        message = {"role": "assistant", "content": text}
        logprobs = None if entries is None else served.tracker().chat_logprobs(entries)
        return {
            **base,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": logprobs}],
            "usage": usage(req),
        }
    events = await started(stream_events(served.backend, stream))
    head = {**base, "object": "chat.completion.chunk"}
    return sse(chat_chunks(served, events, head, req if include_usage(body) else None))


async def chat_chunks(
    served: Served, events: AsyncIterator[tuple[str, Any]], head: dict[str, Any], usage_of: Request | None
) -> AsyncIterator[dict[str, Any]]:
    """A streamed chat response's chunks: the assistant role, then the text as it arrives,
    then the finish reason (and the usage of ``usage_of``, when given)."""
    tracker = served.tracker()
    yield {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    async for kind, value in events:
        if kind == "tokens":
            text, entries = tracker.feed_event(value)
            if text or entries:
                one: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": None}
                if entries is not None:
                    one["logprobs"] = tracker.chat_logprobs(entries)
                yield {**head, "choices": [one]}
        else:
            tail = tracker.feed([], True)
            delta = {"content": tail} if tail else {}
            yield {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": value}]}
    if usage_of is not None:
        yield {**head, "choices": [], "usage": usage(usage_of)}
