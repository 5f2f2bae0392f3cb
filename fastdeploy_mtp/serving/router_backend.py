"""The splitwise router's backend: each request goes to a prefill instance, then to a
decode instance (see :mod:`.router` for the protocol), over one ``httpx.AsyncClient``. The
bodies are :mod:`.messages`', validated as they arrive; the decode stream is read with
httpx-sse, and a full decode instance (429) is retried with tenacity.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse
from prometheus_client import CollectorRegistry
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from ..credentials import DroppedMessages, http_token
from ..runtime.request import InvalidRequestError, Request
from ..runtime.sampling_params import TokenLogprob
from .engine_client import Stream
from .messages import (
    DECODE_PATH,
    PREFILL_PATH,
    VERSION_HEADER,
    DecodeRequest,
    ErrorMessage,
    MessageError,
    PrefillAnswer,
    PrefillRequest,
    TokensEvent,
    check_header_version,
    decode_event,
    decode_http,
    version_headers,
)
from .metrics import DroppedCollector, RouterCollector, RouterCounters
from .openai_protocol import APIError, body_field
from .text import Emitted

#: First wait after a 429 without ``Retry-After`` (doubled each retry), and the cap on any wait.
FIRST_RETRY_WAIT_S = 0.05
MAX_RETRY_WAIT_S = 1.0
#: How long one ``/health`` probe of an instance may take.
HEALTH_TIMEOUT_S = 2.0
#: Connecting to an instance; reads are unbounded (a decode stream may pause while it queues).
CONNECT_TIMEOUT_S = 10.0


def check_instance_url(url: str, option: str) -> str:
    """``url`` without a trailing ``/``; a ``ValueError`` naming ``option`` unless it is an
    ``http://`` or ``https://`` URL with a host."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"{option} {url!r}: not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"{option} {url!r}: give an instance's base URL, e.g. http://127.0.0.1:8001"
        )
    return str(url).rstrip("/")


def _error_of(response: httpx.Response) -> tuple[str, str | None]:
    """(message, param) of an instance's OpenAI-style error body (or its raw text)."""
    try:
        error = decode_http(ErrorMessage, response.content, "an instance").error
    except MessageError:
        return response.text[:300] or response.reason_phrase, None
    return error.message, error.param


def _server_error(status: int, message: str) -> APIError:
    return APIError(status, message, kind="server_error")


class DecodeBusy(Exception):
    """A decode instance answered 429 (full); ``retry_after``: its ``Retry-After``, if any."""

    def __init__(self, url: str, retry_after: float | None):
        super().__init__(f"decode instance {url} is full")
        self.url, self.retry_after = url, retry_after


def retry_after_of(response: httpx.Response) -> float | None:
    """A 429's ``Retry-After`` in seconds (``None``: absent or not a number)."""
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


#: The wait before retry ``n`` (1, 2, ...) of a full decode instance, before its
#: ``Retry-After``: :data:`FIRST_RETRY_WAIT_S` doubled each retry, at most :data:`MAX_RETRY_WAIT_S`.
_backoff = wait_exponential(multiplier=FIRST_RETRY_WAIT_S, exp_base=2, max=MAX_RETRY_WAIT_S)


def decode_retry_wait(queue_timeout: float) -> Any:
    """tenacity's ``wait`` of the decode retries: the backoff, never longer than the
    instance's ``Retry-After`` (whole seconds, so only an upper bound: a slot usually frees
    within a few steps), :data:`MAX_RETRY_WAIT_S` or what is left of ``queue_timeout``."""

    def wait(state: RetryCallState) -> float:
        seconds = _backoff(state)
        assert state.outcome is not None
        busy = state.outcome.exception()
        if isinstance(busy, DecodeBusy) and busy.retry_after is not None:
            seconds = min(seconds, busy.retry_after)
        left = queue_timeout - (state.seconds_since_start or 0.0)
        return max(0.0, min(seconds, MAX_RETRY_WAIT_S, left))

    return wait


class RouterBackend:
    """A :class:`~.engine_client.Backend` that forwards each request to a prefill instance, then
    to a decode instance (see the module docstring), over one ``httpx.AsyncClient``.

    Args:
        prefill: base URLs of the prefill instances (e.g. ``http://10.0.0.1:8001``), at least one.
        decode: base URLs of the decode instances, at least one.
        queue_timeout: seconds a request may wait for a decode instance with room (429s)
            before it fails with a 503.
        secret: the deployment's splitwise secret; the router presents the token derived from
            it (:func:`~fastdeploy_mtp.credentials.http_token`) to every instance.
        instance_timeout: seconds an instance may stay silent (no answer, or no event in a
            stream) before the request fails with a 504 naming it.

    Use it from one event loop (the server's): the HTTP client is made there on first use;
    :meth:`aclose` ends the requests in flight and closes it.
    """

    fatal: str | None = None

    def __init__(
        self,
        prefill: Sequence[str],
        decode: Sequence[str],
        queue_timeout: float = 600.0,
        secret: bytes | None = None,
        instance_timeout: float = 60.0,
    ):
        if not prefill:
            raise ValueError("prefill: at least one prefill instance URL is needed")
        if not decode:
            raise ValueError("decode: at least one decode instance URL is needed")
        if not queue_timeout > 0:
            raise ValueError(f"queue_timeout must be > 0 seconds, got {queue_timeout}")
        self.prefill = [check_instance_url(u, "prefill") for u in prefill]
        self.decode = [check_instance_url(u, "decode") for u in decode]
        if not instance_timeout > 0:
            raise ValueError(f"instance_timeout must be > 0 seconds, got {instance_timeout}")
        self.queue_timeout = float(queue_timeout)
        self.instance_timeout = float(instance_timeout)
        self.headers = _json_headers()
        if secret is not None:
            self.headers["Authorization"] = "Bearer " + http_token(secret).decode()
        self.counters = RouterCounters()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RouterCollector(self.counters))
        #: requests refused by the router's app (no API key), shown in its /metrics
        self.dropped = DroppedMessages()
        self.registry.register(DroppedCollector(self.dropped))
        self._next_prefill = itertools.cycle(range(len(self.prefill)))
        self._next_decode = itertools.cycle(range(len(self.decode)))
        self._client: httpx.AsyncClient | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S, read=self.instance_timeout)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(timeout=timeout, limits=limits)
        return self._client

    # -- Backend ---------------------------------------------------------------------------
    def validate(self, req: Request) -> None:
        """Local checks only (the prefill instance checks the rest): a non-empty prompt of
        integer ids and ``max_tokens > 0``; ``include_draft_logprobs`` is refused (the decode
        stream carries no draft logprobs). ``n`` and ``best_of`` need nothing here: the app
        routes one request per choice."""
        if not req.prompt_token_ids:
            raise InvalidRequestError(req.request_id, "prompt_token_ids", "the prompt is empty")
        if not all(isinstance(t, int) and t >= 0 for t in req.prompt_token_ids):
            raise InvalidRequestError(
                req.request_id, "prompt_token_ids", "prompt ids must be non-negative integers"
            )
        if req.max_tokens <= 0:
            raise InvalidRequestError(
                req.request_id, "max_tokens", f"max_tokens must be > 0, got {req.max_tokens}"
            )
        if req.sampling.include_draft_logprobs:
            message = "is not served through the splitwise router: ask a serve instance"
            raise InvalidRequestError(req.request_id, "include_draft_logprobs", message)

    def submit(self, req: Request) -> Stream:
        """Start routing ``req`` in a task; the stream's first event is the prefill's outcome
        (its first tokens, or the error), so a refused request can still get its status code."""
        if self._closed:
            raise APIError(503, "the router is shutting down", kind="server_error")
        loop = asyncio.get_running_loop()
        stream = Stream(req, loop)
        self.counters.routed += 1
        self._tasks[req.request_id] = loop.create_task(
            self._route(req, stream), name=f"route {req.request_id}"
        )
        return stream

    def cancel(self, req: Request) -> None:
        """The client went away: stop routing ``req`` (closing its decode stream aborts it there)."""
        task = self._tasks.get(req.request_id)
        if task is not None and not task.done():
            task.cancel()

    async def health(self) -> str | None:
        """``None`` while at least one prefill and one decode instance answer ``/health``
        with 200; otherwise what each instance of the missing role said."""
        client = self._http()

        async def probe(url: str) -> str | None:
            try:
                r = await client.get(url + "/health", timeout=HEALTH_TIMEOUT_S)
            except httpx.HTTPError as exc:
                return f"{url} unreachable ({type(exc).__name__}: {exc})"
            return None if r.status_code == 200 else f"{url} answered {r.status_code}"

        answers = await asyncio.gather(*(probe(u) for u in self.prefill + self.decode))
        problems = []
        for role, found in (
            ("prefill", answers[: len(self.prefill)]),
            ("decode", answers[len(self.prefill) :]),
        ):
            if all(a is not None for a in found):
                problems.append(
                    f"no {role} instance is healthy: " + "; ".join(a for a in found if a)
                )
        return "; ".join(problems) or None

    async def aclose(self) -> None:
        """End the requests in flight (their clients get a 503) and close the HTTP client."""
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- one request -----------------------------------------------------------------------
    async def _route(self, req: Request, stream: Stream) -> None:
        try:
            reason, handoff = await self._prefill(req, stream)
            if reason is None:
                assert handoff is not None
                reason = await self._decode(req, stream, handoff)
            stream.put("finished", reason)
            self.counters.success += 1
        except asyncio.CancelledError:
            if self._closed:
                stream.put("error", _server_error(503, "the router is shutting down"))
                self.counters.failure += 1
            else:
                self.counters.cancelled += 1
            raise
        except APIError as exc:
            stream.put("error", exc)
            self.counters.failure += 1
        except Exception as exc:  # a malformed answer from an instance: fail this request only
            stream.put("error", _server_error(502, f"request {req.request_id}: {exc}"))
            self.counters.failure += 1
        finally:
            self._tasks.pop(req.request_id, None)

    def _emit(
        self,
        req: Request,
        stream: Stream,
        ids: list[int],
        logprobs: list[TokenLogprob] | None,
        source: str,
    ) -> None:
        if req.sampling.logprobs is None:
            logprobs = None
        elif logprobs is None or len(logprobs) != len(ids):
            count = 0 if logprobs is None else len(logprobs)
            raise _server_error(502, f"{source} sent {count} logprobs for {len(ids)} tokens")
        if ids:
            req.output_token_ids.extend(ids)
            if logprobs is not None:
                req.output_logprobs.extend(logprobs)
            stream.put("tokens", Emitted(list(ids), logprobs))

    def _timed_out(self, role: str, url: str) -> APIError:
        return _server_error(
            504,
            f"{role} instance {url} sent nothing for {self.instance_timeout:g} s (the router's --instance-timeout)",
        )

    def _refusal(self, role: str, url: str, response: httpx.Response, req: Request) -> APIError:
        message, param = _error_of(response)
        if response.status_code == 400:  # the request itself is invalid: the client's 400
            return APIError(
                400, message, client_param(param, req.request_id.startswith("chatcmpl"))
            )
        if response.status_code == 401:
            return _server_error(
                502,
                f"{role} instance {url} refused the router's credential: give the router and every instance the "
                "same splitwise secret (--splitwise-secret-file, or $FASTDEPLOY_MTP_SPLITWISE_SECRET)",
            )
        status = 503 if response.status_code == 503 else 502
        return _server_error(
            status, f"{role} instance {url} answered {response.status_code}: {message}"
        )

    def _check_answer(self, role: str, url: str, response: httpx.Response) -> None:
        """A 200 answer must speak this protocol version (else a 502 naming both)."""
        try:
            check_header_version(response.headers.get(VERSION_HEADER), f"{role} instance {url}")
        except MessageError as exc:
            raise _server_error(502, str(exc)) from None

    async def _prefill(
        self, req: Request, stream: Stream
    ) -> tuple[str | None, dict[str, Any] | None]:
        """POST the prefill; emits the first tokens. Returns ``(finish reason, None)`` if the
        request finished there, else ``(None, handoff)`` for the decode instance."""
        url = self.prefill[next(self._next_prefill)]
        body = PrefillRequest(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            max_tokens=req.max_tokens,
            sampling=req.sampling,
        )
        try:
            r = await self._http().post(
                url + PREFILL_PATH, content=body.encode(), headers=self.headers
            )
        except httpx.TimeoutException:
            raise self._timed_out("prefill", url) from None
        except httpx.HTTPError as exc:
            raise _server_error(
                502, f"prefill instance {url} is unreachable ({type(exc).__name__}: {exc})"
            ) from None
        if r.status_code != 200:
            raise self._refusal("prefill", url, r, req)
        self._check_answer("prefill", url, r)
        try:
            answer = decode_http(PrefillAnswer, r.content, f"prefill instance {url}")
        except MessageError as exc:
            raise _server_error(502, str(exc)) from None
        if not answer.output_token_ids:
            raise _server_error(502, f"prefill instance {url} sent no first token")
        self._emit(
            req, stream, answer.output_token_ids, answer.output_logprobs, f"prefill instance {url}"
        )
        if answer.finished:
            full = len(req.output_token_ids) >= req.max_tokens
            return answer.finish_reason or ("length" if full else "stop"), None
        if answer.handoff is None:
            raise _server_error(
                502, f"prefill instance {url} sent no handoff for an unfinished request"
            )
        return None, answer.handoff

    async def _decode(self, req: Request, stream: Stream, handoff: dict[str, Any]) -> str:
        """POST the decode to a decode instance with room and emit its tokens as they arrive;
        returns the finish reason. A 429 is retried on the next decode instance (tenacity:
        :func:`decode_retry_wait`) until the queue timeout, then it is a 503."""
        body = DecodeRequest(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            output_token_ids=list(req.output_token_ids),
            max_tokens=req.max_tokens,
            sampling=req.sampling,
            handoff=handoff,
        ).encode()
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(DecodeBusy),
            stop=stop_after_delay(self.queue_timeout),
            wait=decode_retry_wait(self.queue_timeout),
            before_sleep=self._count_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._decode_once(req, stream, body)
        except DecodeBusy as busy:
            raise _server_error(
                503,
                f"request {req.request_id}: no decode instance had room within the queue timeout "
                f"({self.queue_timeout:g} s); the last one asked, {busy.url}, answered 429",
            ) from None
        raise AssertionError("unreachable")

    def _count_retry(self, state: RetryCallState) -> None:
        self.counters.decode_retries += 1

    async def _decode_once(self, req: Request, stream: Stream, body: bytes) -> str:
        """One decode attempt on the next decode instance (raises :class:`DecodeBusy` on a 429)."""
        url = self.decode[next(self._next_decode)]
        try:
            async with aconnect_sse(
                self._http(), "POST", url + DECODE_PATH, content=body, headers=self.headers
            ) as events:
                r = events.response
                if r.status_code == 429:
                    raise DecodeBusy(url, retry_after_of(r))
                if r.status_code != 200:
                    await r.aread()
                    raise self._refusal("decode", url, r, req)
                self._check_answer("decode", url, r)
                return await self._relay(req, stream, f"decode instance {url}", events.aiter_sse())
        except httpx.TimeoutException:
            raise self._timed_out("decode", url) from None
        except httpx.HTTPError as exc:
            raise _server_error(
                502, f"decode instance {url} failed ({type(exc).__name__}: {exc})"
            ) from None

    async def _relay(
        self, req: Request, stream: Stream, source: str, events: AsyncIterator[ServerSentEvent]
    ) -> str:
        """Emit a decode stream's tokens up to ``[DONE]``; returns its finish reason."""
        reason: str | None = None
        async for sse in events:
            if sse.data == "[DONE]":
                break
            event = decode_event(sse.data, source)
            if isinstance(event, ErrorMessage):
                code = event.error.code
                status = code if isinstance(code, int) and 400 <= code < 600 else 502
                raise _server_error(status, f"{source}: {event.error.message}")
            if isinstance(event, TokensEvent):
                self._emit(req, stream, event.token_ids, event.logprobs, source)
            else:
                reason = event.finish_reason
        if reason is None:
            raise _server_error(
                502, f"{source} ended the stream before request {req.request_id} finished"
            )
        return reason


def client_param(param: str | None, chat: bool) -> str | None:
    """The client's field behind an instance's ``param`` (the instances name the fields of
    the splitwise messages: ``prompt_token_ids[1]``, ``sampling.top_p``, ...)."""
    if param is None:
        return None
    head = param.split("[")[0].split(".")[0]
    if head in ("prompt_token_ids", "output_token_ids", "handoff", "request_id"):
        return "messages" if chat else "prompt"
    if head == "sampling" and "." in param:
        return body_field(param.split(".")[1].split("[")[0], chat)
    return param


def _json_headers() -> dict[str, str]:
    return {"Content-Type": "application/json", **version_headers()}
