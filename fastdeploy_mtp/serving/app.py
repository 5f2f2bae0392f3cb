"""The OpenAI-compatible HTTP app (FastAPI) over a :class:`~.engine_client.Backend`, and
:func:`run_http`, which serves it with uvicorn.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``:
server-sent events ending in ``data: [DONE]``), ``GET /v1/models``, ``GET /health`` (200, or
503 with the backend's reason: for ``serve``, once the deployment lost a process),
``GET /metrics`` (Prometheus text; see :mod:`.metrics`). The request bodies and sampling
fields are :mod:`.openai_protocol`'s. ``finish_reason`` is the engine's (``"stop"``: EOS, a
stop token id or a stop string, which the text does not include; ``"length"``).

The engine requests behind one response (``n`` choices, ``best_of`` candidates) are
started, collected and cancelled together by :mod:`.choices`. The backend is the engine loop
for ``serve`` (:class:`~.engine_client.AsyncEngine`) or the splitwise router
(:class:`~.router_backend.RouterBackend`).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from ..runtime.sampling_params import StepDrafts
from ..tokenization import GenerationDefaults, Tokenizer
from .choices import (
    Entries,
    Served,
    cancel_all,
    collect_or_abort,
    max_tokens_of,
    merged,
    new_requests,
    started_all,
    submit_all,
    usage,
)
from .engine_client import Backend, Stream
from .http_auth import Access, install
from .metrics import render
from .openai_protocol import (
    APIError,
    ChatBody,
    CompletionBody,
    RequestBody,
    chat_prompt,
    refuse_invalid_text,
)


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

    config = uvicorn.Config(
        app, host=host, port=port, log_level="info", access_log=False, timeout_graceful_shutdown=5
    )
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
    app = FastAPI(
        title="fastdeploy-mtp", description="OpenAI-compatible server with MTP speculative decoding"
    )
    app.state.served = Served(
        backend, model_name, tokenizer, int(time.time()), defaults, list(eos_token_ids)
    )
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
    msg = (
        f"{param}: {first.get('msg', 'invalid value')}"
        if param
        else str(first.get("msg", "invalid request body"))
    )
    return APIError(400, msg, param).response()


async def health(served: ServedDep) -> Response:
    reason = await served.backend.health()
    if reason:
        return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)
    return JSONResponse({"status": "ok"})


async def metrics(served: ServedDep) -> Response:
    return Response(
        render(served.backend.registry), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


async def models(served: ServedDep) -> dict[str, Any]:
    card = {
        "id": served.model_name,
        "object": "model",
        "created": served.created,
        "owned_by": "fastdeploy-mtp",
    }
    return {"object": "list", "data": [card]}


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
            yield json.dumps(
                {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}}
            )
            return
        yield "[DONE]"

    return EventSourceResponse(events(), headers={"Cache-Control": "no-cache"}, ping=0, sep="\n")


async def completions(body: CompletionBody, served: ServedDep, http: HTTPRequest) -> Any:
    refuse_invalid_text(body.model_dump())
    prompt: Any = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(
                400, "batched prompts are not supported: send one request per prompt", "prompt"
            )
        prompt = prompt[0]
    ids = served.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    choices = new_requests(served, ids, max_tokens_of(served, body, 16), body, "cmpl")
    streams = submit_all(served, choices.requests)
    first = choices.requests[0]
    base = {
        "id": first.request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": served.model_name,
    }
    trackers = [served.tracker() for _ in streams]

    def choice(
        i: int,
        text: str,
        reason: str | None,
        entries: Entries | None,
        drafts: list[StepDrafts] | None = None,
    ) -> dict[str, Any]:
        shown = entries is not None and choices.logprobs
        logprobs = (
            trackers[i].completion_logprobs(entries) if shown and entries is not None else None
        )
        one = {"index": i, "text": text, "finish_reason": reason, "logprobs": logprobs}
        if drafts is not None:
            one["draft_logprobs"] = trackers[i].draft_logprobs(drafts)
        return one

    if not body.stream:
        results = await collect_or_abort(http, served, streams)
        picked = choices.picked(results)
        returned = [choice(i, *results[k]) for i, k in enumerate(picked)]
        return {**base, "choices": returned, "usage": usage([choices.requests[k] for k in picked])}
    events = await started_all(served, streams)

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        complete = False
        try:
            async for i, (kind, value) in merged(events):
                if kind == "tokens":
                    text, entries = trackers[i].feed_event(value)
                    if text or entries:
                        yield {**base, "choices": [choice(i, text, None, entries, value.drafts)]}
                else:
                    yield {**base, "choices": [choice(i, trackers[i].feed([], True), value, None)]}
            complete = True
        finally:
            if not complete:  # the client went away, or one choice failed: end them all
                cancel_all(served, streams)
        if include_usage(body):
            yield {**base, "choices": [], "usage": usage(choices.requests)}

    return sse(chunks())


async def chat(body: ChatBody, served: ServedDep, http: HTTPRequest) -> Any:
    refuse_invalid_text(body.model_dump())
    if not body.messages:
        raise APIError(400, "messages must not be empty", "messages")
    prompt = chat_prompt(served.tokenizer, [m.model_dump() for m in body.messages])
    # the template wrote the special tokens the model expects; none are added again
    ids = served.tokenizer.encode(prompt, add_special_tokens=False)
    choices = new_requests(served, ids, max_tokens_of(served, body, 64), body, "chatcmpl")
    streams = submit_all(served, choices.requests)
    base = {
        "id": choices.requests[0].request_id,
        "created": int(time.time()),
        "model": served.model_name,
    }
    if not body.stream:
        results = await collect_or_abort(http, served, streams)
        returned = []
        for i, (text, reason, entries, drafts) in enumerate(results):
            tracker = served.tracker()
            logprobs = None if entries is None else tracker.chat_logprobs(entries)
            message = {"role": "assistant", "content": text}
            one = {"index": i, "message": message, "finish_reason": reason, "logprobs": logprobs}
            if drafts is not None:
                one["draft_logprobs"] = tracker.draft_logprobs(drafts)
            returned.append(one)
        return {
            **base,
            "object": "chat.completion",
            "choices": returned,
            "usage": usage(choices.requests),
        }
    events = await started_all(served, streams)
    head = {**base, "object": "chat.completion.chunk"}
    return sse(chat_chunks(served, streams, events, head, include_usage(body)))


async def chat_chunks(
    served: Served,
    streams: list[Stream],
    events: list[AsyncIterator[tuple[str, Any]]],
    head: dict[str, Any],
    with_usage: bool,
) -> AsyncIterator[dict[str, Any]]:
    """A streamed chat response's chunks: each choice's assistant role, then the choices'
    text as it arrives (each chunk names its choice's ``index``), then each choice's finish
    reason (and, ``with_usage``, the usage of all of them). If it stops early, every
    stream's request is cancelled."""
    trackers = [served.tracker() for _ in events]
    for i in range(len(events)):
        yield {
            **head,
            "choices": [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            ],
        }
    complete = False
    try:
        async for i, (kind, value) in merged(events):
            if kind == "tokens":
                text, entries = trackers[i].feed_event(value)
                if text or entries:
                    one: dict[str, Any] = {
                        "index": i,
                        "delta": {"content": text},
                        "finish_reason": None,
                    }
                    if entries is not None:
                        one["logprobs"] = trackers[i].chat_logprobs(entries)
                    if value.drafts is not None:
                        one["draft_logprobs"] = trackers[i].draft_logprobs(value.drafts)
                    yield {**head, "choices": [one]}
            else:
                tail = trackers[i].feed([], True)
                delta = {"content": tail} if tail else {}
                yield {**head, "choices": [{"index": i, "delta": delta, "finish_reason": value}]}
        complete = True
    finally:
        if not complete:  # the client went away, or one choice failed: end them all
            cancel_all(served, streams)
    if with_usage:
        yield {**head, "choices": [], "usage": usage([stream.request for stream in streams])}
