"""The API server + engine process: an OpenAI-compatible HTTP API (FastAPI, uvicorn) over
the engine loop, which drives the worker processes.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``:
server-sent events ending in ``data: [DONE]``), ``GET /v1/models``, ``GET /health`` (200, or
503 with the backend's reason: for ``serve``, once the deployment lost a process),
``GET /metrics`` (Prometheus text; see :mod:`.metrics`).

Decoding is greedy (the reference engine's verify strategy): ``temperature`` must be 0 or
absent, ``top_p`` 1 or absent, ``n`` 1; ``stop``, ``logprobs``, ``echo`` and penalties are
refused with a 400 naming the field rather than ignored. Errors use OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``.

:func:`create_app` serves any :class:`Backend`: for ``serve`` the engine loop, run in one
thread (:class:`AsyncEngine`); for ``fastdeploy-mtp router`` the splitwise router
(:mod:`.router`). Each request's tokens reach its HTTP handler through an ``asyncio.Queue``
(:class:`Stream`). In ``serve``, when a worker dies, every request in flight fails with a
clear error, ``/health`` turns 503 and the server stops with exit status 1.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict

from ..runtime.engine import Engine, StepEvents
from ..runtime.request import InvalidRequestError, Request
from .metrics import ServerCounters, make_registry, render

#: Chat template of the byte-level tiny model (it has none of its own): one line per
#: message, ``"<role>: <content>"``, then ``"assistant:"``.
CHAT_TEMPLATE_DOC = "one line per message, '<role>: <content>', then 'assistant:'"


def apply_chat_template(messages: list[dict[str, str]]) -> str:
    """The prompt of a chat request (see :data:`CHAT_TEMPLATE_DOC`)."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


class APIError(Exception):
    """An OpenAI-style error response."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        return JSONResponse(body, status_code=self.status)


# ---- request bodies ------------------------------------------------------------------------
class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    logprobs: Any = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    user: str | None = None


class CompletionBody(_Common):
    prompt: str | list[str] | list[int]
    echo: bool | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatBody(_Common):
    messages: list[ChatMessage]


def _refuse_unsupported(body: _Common) -> None:
    """400 for the sampling options greedy decoding cannot honour (naming the field)."""
    if body.temperature not in (None, 0, 0.0):
        raise APIError(
            400, f"temperature={body.temperature}: only greedy decoding (temperature 0) is served", "temperature"
        )
    if body.top_p not in (None, 1, 1.0):
        raise APIError(400, f"top_p={body.top_p}: only greedy decoding (top_p 1) is served", "top_p")
    if body.n not in (None, 1):
        raise APIError(400, f"n={body.n}: one choice per request is served", "n")
    for name in ("stop", "logprobs", "presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if value not in (None, 0, 0.0, False, [], ""):
            raise APIError(400, f"{name} is not supported by this server", name)
    if getattr(body, "echo", None):
        raise APIError(400, "echo is not supported by this server", "echo")
    if body.max_tokens is not None and body.max_tokens <= 0:
        raise APIError(400, f"max_tokens must be > 0, got {body.max_tokens}", "max_tokens")


# ---- the engine thread ---------------------------------------------------------------------
@dataclass
class Stream:
    """One request's channel from its backend (the engine thread, or the router's task) to its
    HTTP handler: ``(kind, value)`` events, see :meth:`Backend.submit`."""

    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)

    def put(self, kind: str, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the server's event loop has closed: nobody is listening any more
            pass


class Backend(Protocol):
    """What :func:`create_app` needs from the thing that generates: the in-process engine
    loop (:class:`AsyncEngine`, ``serve``) or the splitwise router
    (:class:`~fastdeploy_mtp.serving.router.RouterBackend`), which forwards to other instances.

    The app formats everything OpenAI-side (completions, chat, SSE, usage, errors,
    detokenization); a backend only turns a :class:`Request` into a :class:`Stream` of events.

    Attributes:
        fatal: why the backend can serve nothing any more (``None`` while it can); new
            requests are refused while it is set.
        registry: the Prometheus collectors ``/metrics`` renders.
    """

    fatal: str | None
    registry: CollectorRegistry

    def validate(self, req: Request) -> None:
        """Checks that can refuse ``req`` before a response starts.

        Raises:
            InvalidRequestError: naming the field (the app answers 400).
        """
        ...

    def submit(self, req: Request) -> Stream:
        """Start ``req`` (called from the event loop); its events arrive on the stream:
        ``("tokens", list[int])`` (new token ids, also appended to ``req.output_token_ids``),
        then ``("finished", "stop" | "length")``, or ``("error", APIError)`` at any point.

        Raises:
            APIError: ``req`` cannot be started at all (e.g. the backend is shutting down).
        """
        ...

    def cancel(self, req: Request) -> None:
        """Abort ``req`` if it has not finished (its client went away)."""
        ...

    async def health(self) -> str | None:
        """Why ``/health`` should answer 503 right now, or ``None`` for 200."""
        ...


class AsyncEngine:
    """Runs :meth:`Engine.step` in a thread as requests arrive; hands tokens to streams.

    Args:
        engine: the engine (its runner drives the workers).
        on_fatal: called once, from the engine thread, when the deployment is lost.
    """

    def __init__(self, engine: Engine, on_fatal: Callable[[str], None]):
        self.engine = engine
        self.counters = ServerCounters()
        self.lock = threading.Lock()
        self.registry = make_registry(engine.metrics, engine.scheduler, self.counters, self.lock)
        self._inbox: queue.Queue[Stream] = queue.Queue()
        self._cancels: queue.Queue[Request] = queue.Queue()
        self._streams: dict[str, Stream] = {}
        self._stop = threading.Event()
        self._on_fatal = on_fatal
        self.fatal: str | None = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def validate(self, req: Request) -> None:
        """Submission checks (raises InvalidRequestError) before a response starts."""
        self.engine.scheduler.validate(req)

    def submit(self, req: Request) -> Stream:
        if self.fatal:
            raise APIError(503, f"the server is shutting down: {self.fatal}", kind="server_error")
        stream = Stream(req, asyncio.get_running_loop())
        self._inbox.put(stream)
        return stream

    def cancel(self, req: Request) -> None:
        """Abort ``req`` if it has not finished (its client went away); thread-safe."""
        self._cancels.put(req)

    async def health(self) -> str | None:
        """Unhealthy exactly when the deployment was lost (:attr:`fatal`)."""
        return self.fatal

    def stop(self) -> None:
        """Stop the loop; requests still in flight (or queued) end with a 503."""
        self._stop.set()
        self._thread.join(30)
        if self._thread.is_alive():
            return  # stuck in a step: the runner's shutdown ends it
        error = APIError(503, "the server is shutting down", kind="server_error")
        for stream in list(self._streams.values()):
            stream.put("error", error)
        self._streams.clear()
        while True:
            try:
                self._inbox.get_nowait().put("error", error)
            except queue.Empty:
                break

    def _admit(self) -> None:
        while True:  # first the requests whose clients went away
            try:
                req = self._cancels.get_nowait()
            except queue.Empty:
                break
            if self._streams.pop(req.request_id, None) is not None:
                with self.lock:
                    self.engine.abort(req, RuntimeError("the client disconnected"))
                with self.counters.lock:
                    self.counters.cancelled += 1
        while True:
            try:
                self._admit_one(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _admit_one(self, stream: Stream) -> None:
        try:
            if stream.request.handoff_state is not None:  # splitwise decode: handed over by a prefill instance
                self.engine.add_transferred(stream.request)
            else:
                self.engine.add_requests([stream.request])
        except InvalidRequestError as exc:
            stream.put("error", APIError(400, str(exc), exc.field))
            return
        self._streams[stream.request.request_id] = stream
        with self.counters.lock:
            self.counters.prompt_tokens += len(stream.request.prompt_token_ids)

    def _run(self) -> None:
        step = 0
        check_children = getattr(self.engine.runner, "check_children", None)
        try:
            while not self._stop.is_set():
                self._admit()
                with self.lock:
                    self._before_step()
                if not self.engine.has_work:
                    if check_children is not None:
                        check_children()  # a worker that dies while the server idles is noticed too
                    try:  # wait for a request; admitted here, in arrival order
                        self._admit_one(self._inbox.get(timeout=0.05))
                    except queue.Empty:
                        pass
                    continue
                with self.lock:
                    events = self.engine.step(step)
                    self._after_step(events)
                step += 1
                if not events.ran:  # e.g. every slot waits for its KV transfer: do not spin
                    time.sleep(0.002)
                for req, tokens in events.emitted:
                    if tokens and req.request_id in self._streams:
                        self._streams[req.request_id].put("tokens", tokens)
                for req in events.finished:
                    done = self._streams.pop(req.request_id, None)
                    if done is not None:
                        done.put("finished", "length" if len(req.output_token_ids) >= req.max_tokens else "stop")
                    with self.counters.lock:
                        self.counters.success += 1
                self._fail(events.failed)
                dead = getattr(self.engine.runner, "dead", None)
                if dead:
                    raise RuntimeError(dead)
        except BaseException as exc:  # the deployment is gone: fail everything, stop the server
            self.fatal = f"{type(exc).__name__}: {exc}" if not isinstance(exc, RuntimeError) else str(exc)
            with self.lock:
                self._fail(self.engine.abort_all(RuntimeError(self.fatal)))
            while True:  # and whatever arrived meanwhile
                try:
                    self._inbox.get_nowait().put("error", APIError(503, self.fatal, kind="server_error"))
                except queue.Empty:
                    break
            self._on_fatal(self.fatal)

    def _before_step(self) -> None:
        """Called under :attr:`lock` before every step (splitwise instances hook in here)."""

    def _after_step(self, events: StepEvents) -> None:
        """Called under :attr:`lock` after every step, before its tokens are handed out."""

    def _fail(self, failed: list[tuple[Request, BaseException]]) -> None:
        for req, err in failed:
            stream = self._streams.pop(req.request_id, None)
            if stream is not None:
                stream.put("error", APIError(500, f"request failed: {err}", kind="server_error"))
            with self.counters.lock:
                self.counters.failure += 1


async def stream_events(
    backend: Backend, stream: Stream, last: tuple[str, ...] = ("finished",)
) -> AsyncIterator[tuple[str, Any]]:
    """``stream``'s events ``(kind, value)`` up to one whose kind is in ``last``; an
    ``"error"`` event is raised. If the consumer stops early (its client disconnected: the
    handler was cancelled or the response closed), the request is cancelled on ``backend``."""
    done = False
    try:
        while True:
            kind, value = await stream.events.get()
            if kind == "error":
                done = True
                raise value
            yield kind, value
            if kind in last:
                done = True
                return
    finally:
        if not done:
            backend.cancel(stream.request)


def run_http(
    app: FastAPI,
    host: str,
    port: int,
    progress: Callable[[str], None],
    t0: float,
    on_server: Callable[[Any], None] | None = None,
) -> bool:
    """Serve ``app`` with uvicorn on ``host:port`` until SIGINT/SIGTERM; returns whether it
    started (e.g. not when the port was taken: uvicorn said why). ``on_server`` gets the
    ``uvicorn.Server`` first (to stop it from another thread). uvicorn handles the signals
    while it runs and raises them again once it has stopped; the handlers installed here take
    that second delivery (the caller restores its own afterwards), so the caller's clean-up
    runs."""
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
    server.run()
    return bool(server.started)


# ---- the app -------------------------------------------------------------------------------
def create_app(backend: Backend, model_name: str, tokenizer: Any, ori_vocab_size: int) -> FastAPI:
    """The FastAPI app over ``backend`` (an :class:`AsyncEngine`, or any other :class:`Backend`)
    serving the model id ``model_name``; ``tokenizer.encode(str) -> list[int]`` makes prompts,
    and token ids ``>= ori_vocab_size`` (padding) are left out of the text."""
    app = FastAPI(title="fastdeploy-mtp", description="OpenAI-compatible server with MTP speculative decoding")
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(_: HTTPRequest, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        msg = (
            f"{param}: {first.get('msg', 'invalid value')}" if param else str(first.get("msg", "invalid request body"))
        )
        return APIError(400, msg, param).response()

    @app.get("/health")
    async def health() -> Response:
        reason = await backend.health()
        if reason:
            return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(backend.registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "fastdeploy-mtp"}
        return {"object": "list", "data": [card]}

    def new_request(prompt_ids: list[int], max_tokens: int, body: _Common, prefix: str) -> Request:
        if body.model not in (None, model_name):
            raise APIError(404, f"model {body.model!r} is not served here (this server serves {model_name!r})", "model")
        _refuse_unsupported(body)
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", "prompt" if prefix == "cmpl" else "messages")
        req = Request(f"{prefix}-{uuid.uuid4().hex}", prompt_ids, max_tokens=max_tokens)
        try:
            backend.validate(req)
        except InvalidRequestError as exc:
            field_name = "max_tokens" if exc.field == "max_tokens" else ("prompt" if prefix == "cmpl" else "messages")
            raise APIError(400, str(exc), field_name) from None
        return req

    def detokenizer() -> Callable[[list[int], bool], str]:
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def feed(ids: list[int], final: bool = False) -> str:
            return dec.decode(bytes(t for t in ids if t < ori_vocab_size), final=final)

        return feed

    def events(stream: Stream) -> AsyncIterator[tuple[str, Any]]:
        return stream_events(backend, stream)

    async def collect(stream: Stream) -> tuple[str, str]:
        feed = detokenizer()
        text, reason = "", "length"
        async for kind, value in events(stream):
            if kind == "tokens":
                text += feed(value, False)
            else:
                reason = value
        return text + feed([], True), reason

    def usage(req: Request) -> dict[str, int]:
        p, c = len(req.prompt_token_ids), len(req.output_token_ids)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def sse(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
        async def body() -> AsyncIterator[str]:
            try:
                async for chunk in chunks:
                    yield f"data: {json.dumps(chunk)}\n\n"
            except APIError as exc:  # the response has started: report it in the stream
                error = {"message": exc.message, "type": exc.kind, "code": exc.status}
                yield f"data: {json.dumps({'error': error})}\n\n"
                return
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def include_usage(body: _Common) -> bool:
        return bool(body.stream_options and body.stream_options.get("include_usage"))

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> Any:
        prompt: Any = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "batched prompts are not supported: send one request per prompt", "prompt")
            prompt = prompt[0]
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        req = new_request(ids, body.max_tokens or 16, body, "cmpl")
        stream = backend.submit(req)
        base = {"id": req.request_id, "object": "text_completion", "created": int(time.time()), "model": model_name}
        if not body.stream:
            text, reason = await collect(stream)
            choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
            return {**base, "choices": [choice], "usage": usage(req)}

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            feed = detokenizer()
            async for kind, value in events(stream):
                if kind == "tokens":
                    text = feed(value, False)
                    if text:
                        yield {**base, "choices": [{"index": 0, "text": text, "finish_reason": None, "logprobs": None}]}
                else:
                    tail = feed([], True)
                    yield {**base, "choices": [{"index": 0, "text": tail, "finish_reason": value, "logprobs": None}]}
            if include_usage(body):
                yield {**base, "choices": [], "usage": usage(req)}

        return sse(chunks())

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody) -> Any:
        if not body.messages:
            raise APIError(400, "messages must not be empty", "messages")
        prompt = apply_chat_template([m.model_dump() for m in body.messages])
        req = new_request(tokenizer.encode(prompt), body.max_tokens or 64, body, "chatcmpl")
        stream = backend.submit(req)
        base = {"id": req.request_id, "created": int(time.time()), "model": model_name}
        if not body.stream:
            text, reason = await collect(stream)
            message = {"role": "assistant", "content": text}
            return {
                **base,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
                "usage": usage(req),
            }

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            head = {**base, "object": "chat.completion.chunk"}
            yield {
                **head,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
            }
            feed = detokenizer()
            async for kind, value in events(stream):
                if kind == "tokens":
                    text = feed(value, False)
                    if text:
                        yield {**head, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
                else:
                    tail = feed([], True)
                    delta = {"content": tail} if tail else {}
                    yield {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": value}]}
            if include_usage(body):
                yield {**head, "choices": [], "usage": usage(req)}

        return sse(chunks())

    return app
