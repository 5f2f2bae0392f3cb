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
import copy
import json
import math
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple, TypeVar

from fastapi import Depends, FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from ..runtime.request import InvalidRequestError, Request
from ..runtime.sampling_params import StepDrafts, TokenLogprob, choice_seed
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
    choice_counts,
    refuse_invalid_text,
    refuse_unsupported,
    sampling_params,
)
from .text import TextTracker

_T = TypeVar("_T")

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


@dataclass
class Choices:
    """The engine requests of one response: ``requests[k]`` generates candidate ``k`` (its
    own request, batched with the others); ``n`` of them are returned, all of them unless
    ``best_of`` asked for more candidates; ``logprobs``: the client asked for logprobs (to
    rank ``best_of`` candidates they are asked for internally, and not returned)."""

    requests: list[Request]
    n: int
    logprobs: bool

    def picked(self, results: list[Collected]) -> list[int]:
        """Which candidates are returned, in order: all of them, or with ``best_of`` the ``n``
        with the highest cumulative log-probability of their tokens, best first (a tie goes
        to the lower candidate index)."""
        if len(results) == self.n:
            return list(range(self.n))
        ranked = sorted(range(len(results)), key=lambda k: (-cumulative_logprob(results[k].entries), k))
        return ranked[: self.n]


def new_requests(
    served: Served, prompt_ids: list[int], max_tokens: int, body: CompletionBody | ChatBody, prefix: str
) -> Choices:
    """The engine requests ``body`` asks for (``n``, or ``best_of`` candidates), each checked
    by the backend (400/404 naming the field). With a ``seed`` s, candidate ``k`` samples with
    :func:`~fastdeploy_mtp.runtime.sampling_params.choice_seed` ``(s, k)`` (``s + k`` mod
    2**63); without, each candidate's seed derives from its own request id (candidate 0's is
    the response id, candidate ``k``'s that id with ``-k`` appended)."""
    chat = isinstance(body, ChatBody)
    if body.model not in (None, served.model_name):
        message = f"model {body.model!r} is not served here (this server serves {served.model_name!r})"
        raise APIError(404, message, "model")
    refuse_unsupported(body)
    n, best_of = choice_counts(body)
    sampling = sampling_params(body, served.defaults, served.eos_token_ids)
    if not prompt_ids:
        raise APIError(400, "the prompt is empty", "messages" if chat else "prompt")
    asked = sampling.logprobs is not None
    if best_of > n and not asked:
        sampling.logprobs = 0  # the emitted tokens' own logprobs rank the candidates
    response_id = f"{prefix}-{uuid.uuid4().hex}"
    requests = []
    for k in range(best_of):
        params = copy.deepcopy(sampling)
        if sampling.seed is not None:
            params.seed = choice_seed(sampling.seed, k)
        rid = response_id if k == 0 else f"{response_id}-{k}"
        requests.append(Request(rid, list(prompt_ids), max_tokens=max_tokens, sampling=params))
    for req in requests:
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
    return Choices(requests, n, asked)


def submit_all(served: Served, requests: list[Request]) -> list[Stream]:
    """Every request started on the backend; if one cannot be, those already started are
    cancelled before the error propagates."""
    streams: list[Stream] = []
    try:
        for req in requests:
            streams.append(served.backend.submit(req))
    except BaseException:
        cancel_all(served, streams)
        raise
    return streams


def cancel_all(served: Served, streams: list[Stream]) -> None:
    """Cancel every stream's request on the backend (a finished one is left as it is)."""
    for stream in streams:
        served.backend.cancel(stream.request)


def max_tokens_of(served: Served, body: RequestBody, fallback: int) -> int:
    """The body's ``max_tokens``, else the model's ``max_new_tokens`` default, else ``fallback``."""
    return body.max_tokens or served.defaults.max_new_tokens or fallback


Entries = list[tuple[int, TokenLogprob]]


class Collected(NamedTuple):
    """A whole response of one candidate: its text, finish reason, logprob entries (``None``
    when its request did not ask for logprobs) and draft logprobs (``None`` unless it asked
    for them: ``include_draft_logprobs``)."""

    text: str
    reason: str
    entries: Entries | None
    drafts: list[StepDrafts] | None = None


def cumulative_logprob(entries: Entries | None) -> float:
    """The sum of the log-probabilities of a candidate's tokens (``best_of`` ranks by it)."""
    return math.fsum(lp.logprob for _, lp in entries or [])


async def collect(served: Served, stream: Stream) -> Collected:
    """The whole response of ``stream``."""
    tracker = served.tracker()
    text, reason = "", "length"
    entries: Entries | None = None
    drafts: list[StepDrafts] | None = [] if stream.request.sampling.include_draft_logprobs else None
    async for kind, value in stream_events(served.backend, stream):
        if kind == "tokens":
            piece, got = tracker.feed_event(value)
            text += piece
            if got is not None:
                entries = (entries or []) + got
            if drafts is not None and value.drafts:
                drafts += value.drafts
        else:
            reason = value
    if stream.request.sampling.logprobs is not None and entries is None:
        entries = []
    return Collected(text + tracker.feed([], True), reason, entries, drafts)


async def collect_all(served: Served, streams: list[Stream]) -> list[Collected]:
    """Every stream's whole response, collected concurrently. If one fails (or this is
    cancelled), every request is cancelled before the error propagates."""
    tasks = [asyncio.ensure_future(collect(served, stream)) for stream in streams]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        cancel_all(served, streams)  # also those whose task was cancelled before it started
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def collect_or_abort(http: HTTPRequest, served: Served, streams: list[Stream]) -> list[Collected]:
    """:func:`collect_all`, aborting every request if the client disconnects first (a
    non-streaming response has nothing to write until the end, so the disconnect is
    watched for)."""
    task = asyncio.ensure_future(collect_all(served, streams))
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await http.is_disconnected():
            task.cancel()  # collect_all cancels the requests on the backend
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


async def started_all(served: Served, streams: list[Stream]) -> list[AsyncIterator[tuple[str, Any]]]:
    """:func:`started` events of every stream (so an error before any choice's first event
    is still the response's status); on an error every request is cancelled."""
    try:
        return [await started(stream_events(served.backend, stream)) for stream in streams]
    except BaseException:
        cancel_all(served, streams)
        raise


async def merged(sources: list[AsyncIterator[_T]]) -> AsyncIterator[tuple[int, _T]]:
    """``(i, item)`` for the items of every ``sources[i]``, as they arrive (each source's in
    its order). An error of one source is raised at once; when the consumer stops early the
    pending reads are cancelled."""
    pending = {asyncio.ensure_future(anext(source)): i for i, source in enumerate(sources)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: pending[t]):
                i = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(sources[i]))] = i
                yield i, item
    finally:
        for task in pending:
            task.cancel()


def usage(requests: list[Request]) -> dict[str, int]:
    """OpenAI's usage of the returned choices' ``requests``: the prompt counted once, the
    completion tokens summed over them."""
    p, c = len(requests[0].prompt_token_ids), sum(len(r.output_token_ids) for r in requests)
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
        i: int, text: str, reason: str | None, entries: Entries | None, drafts: list[StepDrafts] | None = None
    ) -> dict[str, Any]:
        shown = entries is not None and choices.logprobs
        logprobs = trackers[i].completion_logprobs(entries) if shown and entries is not None else None
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
    base = {"id": choices.requests[0].request_id, "created": int(time.time()), "model": served.model_name}
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
        return {**base, "object": "chat.completion", "choices": returned, "usage": usage(choices.requests)}
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
        yield {**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    complete = False
    try:
        async for i, (kind, value) in merged(events):
            if kind == "tokens":
                text, entries = trackers[i].feed_event(value)
                if text or entries:
                    one: dict[str, Any] = {"index": i, "delta": {"content": text}, "finish_reason": None}
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
