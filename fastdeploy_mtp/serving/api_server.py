"""The API server + engine process: an OpenAI-compatible HTTP API (FastAPI, uvicorn) over
the engine loop, which drives the worker processes.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``:
server-sent events ending in ``data: [DONE]``), ``GET /v1/models``, ``GET /health`` (200, or
503 with the backend's reason: for ``serve``, once the deployment lost a process),
``GET /metrics`` (Prometheus text; see :mod:`.metrics`).

Sampling follows the request's OpenAI fields (:func:`sampling_params`): ``temperature``
(absent = 0, greedy), ``top_p``, ``seed``, ``stop``, ``presence_penalty``,
``frequency_penalty``, ``logprobs`` (chat: ``logprobs`` + ``top_logprobs``) and vLLM's extra
body fields ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``stop_token_ids``.
``n`` other than 1, ``best_of``, ``echo`` and ``logit_bias`` are refused with a 400 naming the
field rather than ignored; so is any invalid value. ``finish_reason`` is the engine's
(``"stop"``: EOS, a stop token id or a stop string, which the text does not include;
``"length"``). Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``.

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
from typing import Any, Literal, NamedTuple, Protocol

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict

from ..runtime.engine import Engine
from ..runtime.events import StepEvents
from ..runtime.request import InvalidRequestError, Request
from ..runtime.sampling_params import MAX_LOGPROBS, SamplingParams, TokenLogprob
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
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    user: str | None = None
    # vLLM's extra sampling fields (``extra_body`` of the openai client)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None


class CompletionBody(_Common):
    prompt: str | list[str] | list[int]
    echo: bool | None = None
    logprobs: int | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatBody(_Common):
    messages: list[ChatMessage]
    logprobs: bool | None = None
    top_logprobs: int | None = None


#: Fields this server cannot honour, with their neutral values (any other value is a 400, so
#: they are never silently ignored).
_UNSUPPORTED: dict[str, Any] = {"best_of": 1, "logit_bias": {}, "echo": False}


def _refuse_unsupported(body: _Common) -> None:
    """400 for what one request cannot ask of this server (naming the field)."""
    if body.n not in (None, 1):
        raise APIError(400, f"n={body.n}: one choice per request is served", "n")
    extra = body.model_extra or {}
    for name, neutral in _UNSUPPORTED.items():
        value = getattr(body, name) if name in type(body).model_fields else extra.get(name)
        if value is not None and (type(value) is not type(neutral) or value != neutral):
            raise APIError(400, f"{name}={value!r} is not supported by this server", name)
    if body.max_tokens is not None and body.max_tokens <= 0:
        raise APIError(400, f"max_tokens must be > 0, got {body.max_tokens}", "max_tokens")


def sampling_params(body: CompletionBody | ChatBody) -> SamplingParams:
    """The :class:`SamplingParams` an OpenAI request body asks for (``serve`` and the
    splitwise router both use it). Absent fields take the neutral value (``temperature`` 0:
    greedy; OpenAI's default of 1 is not assumed). ``stop`` may be a string or a list;
    ``top_k`` of -1 (vLLM's "off") is 0. ``logprobs``: completions give the number of
    alternatives ``k`` directly; chat gives ``logprobs: true`` and ``top_logprobs: k`` (0 when
    absent).

    Raises:
        APIError: 400 naming the field (``param``) of the first invalid value.
    """
    k: int | None = None
    if isinstance(body, ChatBody):
        if body.logprobs:
            k = body.top_logprobs or 0
            if k < 0 or k > MAX_LOGPROBS:
                raise APIError(400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {k}", "top_logprobs")
        elif body.top_logprobs is not None:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    else:
        k = body.logprobs
    stop = body.stop
    params = SamplingParams(
        temperature=0.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=0 if body.top_k in (None, -1) else body.top_k,
        min_p=body.min_p or 0.0,
        seed=body.seed,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        frequency_penalty=body.frequency_penalty or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        min_tokens=body.min_tokens or 0,
        stop=[stop] if isinstance(stop, str) else list(stop or []),
        stop_token_ids=list(body.stop_token_ids or []),
        logprobs=k,
    )
    problem = params.check()
    if problem is not None:
        name = problem.split(":", 1)[0]
        raise APIError(400, problem, _body_field(name, isinstance(body, ChatBody)))
    return params


def _body_field(sampling_field: str, chat: bool) -> str:
    """The request-body field a :class:`SamplingParams` field comes from."""
    return "top_logprobs" if chat and sampling_field == "logprobs" else sampling_field


#: Names of the :class:`SamplingParams` fields (an engine refusal naming one is the client's 400).
SAMPLING_FIELDS = frozenset(SamplingParams().to_dict())


class Emitted(NamedTuple):
    """A ``"tokens"`` event's value: new token ids and, when the request asked for logprobs,
    one :class:`TokenLogprob` per id (else ``None``)."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None


def logprob_to_dict(lp: TokenLogprob) -> dict[str, Any]:
    """The JSON form of a :class:`TokenLogprob` between splitwise instances and the router."""
    return {"token_id": int(lp.token_id), "logprob": float(lp.logprob), "top": [[int(t), float(v)] for t, v in lp.top]}


def logprob_from_dict(d: Any) -> TokenLogprob:
    """Inverse of :func:`logprob_to_dict` (``ValueError``/``KeyError``/``TypeError`` if malformed)."""
    top = [(int(t), float(v)) for t, v in d["top"]]
    return TokenLogprob(int(d["token_id"]), float(d["logprob"]), top)


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
        ``("tokens", Emitted)`` (new token ids, also appended to ``req.output_token_ids``, with
        their logprobs when ``req.sampling.logprobs`` is set), then ``("finished", "stop" |
        "length")``, or ``("error", APIError)`` at any point.

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
                        self._streams[req.request_id].put("tokens", emitted_of(req, tokens))
                for req in events.finished:
                    done = self._streams.pop(req.request_id, None)
                    if done is not None:
                        done.put("finished", finish_reason_of(req))
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


def emitted_of(req: Request, tokens: list[int]) -> Emitted:
    """The ``"tokens"`` event of ``tokens``, the ids ``req`` just emitted (called right after
    their step): with their logprobs (``req.output_logprobs[emitted_count - len(tokens) :
    emitted_count]``) when the request asked."""
    if req.sampling.logprobs is None:
        return Emitted(list(tokens))
    end = req.emitted_count
    return Emitted(list(tokens), list(req.output_logprobs[end - len(tokens) : end]) if tokens else [])


def finish_reason_of(req: Request) -> str:
    """The engine's ``finish_reason`` of a finished ``req`` (``"stop"`` or ``"length"``)."""
    return req.finish_reason or "stop"


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
class TextTracker:
    """A response's text, decoded incrementally from its byte-level token ids (ids ``>=
    ori_vocab_size``, padding, are left out), and the OpenAI logprobs of its tokens.

    A token's string is its byte decoded alone (``errors="replace"``: a byte of a multi-byte
    character is U+FFFD), its ``bytes`` the byte itself; its ``text_offset`` is the length of
    the response text decoded before it."""

    def __init__(self, ori_vocab_size: int):
        self.ori_vocab_size = ori_vocab_size
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.length = 0  # characters of text returned so far

    def feed(self, ids: list[int], final: bool = False) -> str:
        """The text ``ids`` complete (a partial UTF-8 character waits for the next ids;
        ``final`` flushes it)."""
        text = self._decoder.decode(bytes(t for t in ids if t < self.ori_vocab_size), final=final)
        self.length += len(text)
        return text

    def feed_event(self, event: Emitted) -> tuple[str, list[tuple[int, TokenLogprob]] | None]:
        """(text, ``[(text_offset, logprob)]`` per token or ``None`` without logprobs)."""
        if event.logprobs is None:
            return self.feed(event.token_ids), None
        text, entries = "", []
        for lp in event.logprobs:
            entries.append((self.length, lp))
            text += self.feed([lp.token_id])
        return text, entries

    def token(self, token_id: int) -> str:
        return bytes([token_id]).decode("utf-8", errors="replace") if token_id < self.ori_vocab_size else ""

    def token_bytes(self, token_id: int) -> list[int]:
        return [int(token_id)] if token_id < self.ori_vocab_size else []

    def completion_logprobs(self, entries: list[tuple[int, TokenLogprob]]) -> dict[str, Any]:
        """Completions' ``choices[0].logprobs``: ``tokens``, ``token_logprobs``,
        ``top_logprobs`` (``{token: logprob}`` of the ``k`` most likely) and ``text_offset``."""
        return {
            "tokens": [self.token(lp.token_id) for _, lp in entries],
            "token_logprobs": [lp.logprob for _, lp in entries],
            "top_logprobs": [{self.token(t): v for t, v in lp.top} for _, lp in entries],
            "text_offset": [offset for offset, _ in entries],
        }

    def chat_logprobs(self, entries: list[tuple[int, TokenLogprob]]) -> dict[str, Any]:
        """Chat's ``choices[0].logprobs``: ``{"content": [{"token", "logprob", "bytes",
        "top_logprobs": [{"token", "logprob", "bytes"}]}]}``."""

        def one(token_id: int, logprob: float) -> dict[str, Any]:
            return {"token": self.token(token_id), "logprob": logprob, "bytes": self.token_bytes(token_id)}

        return {
            "content": [
                {**one(lp.token_id, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]} for _, lp in entries
            ]
        }


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

    def new_request(prompt_ids: list[int], max_tokens: int, body: CompletionBody | ChatBody, prefix: str) -> Request:
        chat = isinstance(body, ChatBody)
        if body.model not in (None, model_name):
            raise APIError(404, f"model {body.model!r} is not served here (this server serves {model_name!r})", "model")
        _refuse_unsupported(body)
        sampling = sampling_params(body)
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", "messages" if chat else "prompt")
        req = Request(f"{prefix}-{uuid.uuid4().hex}", prompt_ids, max_tokens=max_tokens, sampling=sampling)
        try:
            backend.validate(req)
        except InvalidRequestError as exc:
            if exc.field == "max_tokens":
                param = "max_tokens"
            elif exc.field in SAMPLING_FIELDS:
                param = _body_field(exc.field, chat)
            else:
                param = "messages" if chat else "prompt"
            raise APIError(400, str(exc), param) from None
        return req

    def events(stream: Stream) -> AsyncIterator[tuple[str, Any]]:
        return stream_events(backend, stream)

    async def collect(stream: Stream) -> tuple[str, str, list[tuple[int, TokenLogprob]] | None]:
        """(text, finish reason, logprob entries or ``None``) of a whole response."""
        tracker = TextTracker(ori_vocab_size)
        text, reason = "", "length"
        entries: list[tuple[int, TokenLogprob]] | None = None
        async for kind, value in events(stream):
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
        tracker = TextTracker(ori_vocab_size)

        def choice(text: str, reason: str | None, entries: list[tuple[int, TokenLogprob]] | None) -> dict[str, Any]:
            logprobs = None if entries is None else tracker.completion_logprobs(entries)
            return {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}

        if not body.stream:
            text, reason, entries = await collect(stream)
            return {**base, "choices": [choice(text, reason, entries)], "usage": usage(req)}

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            async for kind, value in events(stream):
                if kind == "tokens":
                    text, entries = tracker.feed_event(value)
                    if text or entries:
                        yield {**base, "choices": [choice(text, None, entries)]}
                else:
                    tail = tracker.feed([], True)
                    yield {**base, "choices": [choice(tail, value, None)]}
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
        tracker = TextTracker(ori_vocab_size)
        if not body.stream:
            text, reason, entries = await collect(stream)
            message = {"role": "assistant", "content": text}
            logprobs = None if entries is None else tracker.chat_logprobs(entries)
            return {
                **base,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": logprobs}],
                "usage": usage(req),
            }

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            head = {**base, "object": "chat.completion.chunk"}
            yield {
                **head,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
            }
            async for kind, value in events(stream):
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
            if include_usage(body):
                yield {**head, "choices": [], "usage": usage(req)}

        return sse(chunks())

    return app
