"""What the router says to the splitwise instances: :class:`InstanceForwarder` posts a
request's prefill to a prefill instance, then its decode to a decode instance with room, and
emits their tokens on the request's stream; an instance's refusal, silence or failure becomes
the client's error naming it. The bodies are
:mod:`~fastdeploy_mtp.serving.messages.router_instances`', validated as they arrive; the
decode stream is read with httpx-sse, and a full decode instance (429) is retried with
tenacity (:mod:`.retry`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_delay

from ...credentials import http_token
from ...engine_args.values import MAX_PORT
from ...runtime.request import Request
from ...runtime.sampling_params import TokenLogprob
from ..engine_client.backend import Stream
from ..messages.router_instances import (
    DECODE_PATH,
    PREFILL_PATH,
    DecodeRequest,
    ErrorMessage,
    PrefillAnswer,
    PrefillRequest,
    TokensEvent,
    decode_event,
    decode_http,
)
from ..messages.wire import VERSION_HEADER, MessageError, check_header_version, version_headers
from ..metrics.counters import RouterCounters
from ..openai.protocol import APIError, body_field
from ..openai.text import Emitted
from .retry import DecodeBusy, decode_retry_wait, retry_after_of

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
    if parsed.port is not None and not 1 <= parsed.port <= MAX_PORT:
        raise ValueError(f"{option} {url!r}: the port must be 1..{MAX_PORT}")
    return str(url).rstrip("/")


def error_of(response: httpx.Response) -> tuple[str, str | None]:
    """(message, param) of an instance's OpenAI-style error body (or its raw text)."""
    try:
        error = decode_http(ErrorMessage, response.content, "an instance").error
    except MessageError:
        return response.text[:300] or response.reason_phrase, None
    return error.message, error.param


def server_error(status: int, message: str) -> APIError:
    """The router's own failure ``status`` (``server_error``), saying ``message``."""
    return APIError(status, message, kind="server_error")


@dataclasses.dataclass(frozen=True)
class Instances:
    """The splitwise instances a router forwards to, and how long it waits for them.

    Attributes:
        prefill: base URLs of the prefill instances (e.g. ``http://10.0.0.1:8001``), at least one.
        decode: base URLs of the decode instances, at least one.
        queue_timeout: seconds a request may wait for a decode instance with room (429s)
            before it fails with a 503.
        secret: the deployment's splitwise secret; the router presents the token derived from
            it (:func:`~fastdeploy_mtp.credentials.http_token`) to every instance.
        instance_timeout: seconds an instance may stay silent (no answer, or no event in a
            stream) before the request fails with a 504 naming it.
    """

    prefill: Sequence[str]
    decode: Sequence[str]
    queue_timeout: float = 600.0
    secret: bytes | None = None
    instance_timeout: float = 60.0


class InstanceForwarder:
    """Forwards requests to the splitwise ``instances`` (see the module docstring), over one
    ``httpx.AsyncClient`` made on first use. ``counters.decode_retries`` counts the waits for
    a full decode instance. A ``ValueError`` names a bad URL or timeout."""

    def __init__(self, instances: Instances):
        if not instances.prefill:
            raise ValueError("prefill: at least one prefill instance URL is needed")
        if not instances.decode:
            raise ValueError("decode: at least one decode instance URL is needed")
        if not instances.queue_timeout > 0:
            raise ValueError(f"queue_timeout must be > 0 seconds, got {instances.queue_timeout}")
        self.prefill = [check_instance_url(u, "prefill") for u in instances.prefill]
        self.decode = [check_instance_url(u, "decode") for u in instances.decode]
        if not instances.instance_timeout > 0:
            raise ValueError(
                f"instance_timeout must be > 0 seconds, got {instances.instance_timeout}"
            )
        self.queue_timeout = float(instances.queue_timeout)
        self.instance_timeout = float(instances.instance_timeout)
        secret = instances.secret
        self.headers = json_headers()
        if secret is not None:
            self.headers["Authorization"] = "Bearer " + http_token(secret).decode()
        self.counters = RouterCounters()
        self._next_prefill = itertools.cycle(range(len(self.prefill)))
        self._next_decode = itertools.cycle(range(len(self.decode)))
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S, read=self.instance_timeout)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(timeout=timeout, limits=limits)
        return self._client

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
            raise server_error(502, f"{source} sent {count} logprobs for {len(ids)} tokens")
        if ids:
            req.output_token_ids.extend(ids)
            if logprobs is not None:
                req.output_logprobs.extend(logprobs)
            stream.put("tokens", Emitted(list(ids), logprobs))

    @contextlib.contextmanager
    def _talking_to(self, role: str, url: str, failure: str) -> Iterator[None]:
        """httpx's errors while talking to the ``role`` instance at ``url`` as the client's:
        silence past the ``--instance-timeout`` is a 504, any other a 502 saying the instance
        ``failure`` (e.g. "is unreachable"), each naming the instance."""
        try:
            yield
        except httpx.TimeoutException:
            raise server_error(
                504,
                f"{role} instance {url} sent nothing for {self.instance_timeout:g} s (the router's "
                "--instance-timeout)",
            ) from None
        except httpx.HTTPError as exc:
            raise server_error(
                502, f"{role} instance {url} {failure} ({type(exc).__name__}: {exc})"
            ) from None

    def _refusal(self, role: str, url: str, response: httpx.Response, req: Request) -> APIError:
        message, param = error_of(response)
        if response.status_code == 400:  # the request itself is invalid: the client's 400
            return APIError(
                400, message, client_param(param, req.request_id.startswith("chatcmpl"))
            )
        if response.status_code == 401:
            return server_error(
                502,
                f"{role} instance {url} refused the router's credential: give the router and every "
                "instance the same splitwise secret (--splitwise-secret-file, or "
                "$FASTDEPLOY_MTP_SPLITWISE_SECRET)",
            )
        status = 503 if response.status_code == 503 else 502
        return server_error(
            status, f"{role} instance {url} answered {response.status_code}: {message}"
        )

    def _check_answer(self, role: str, url: str, response: httpx.Response) -> None:
        """A 200 answer must speak this protocol version (else a 502 naming both)."""
        try:
            check_header_version(response.headers.get(VERSION_HEADER), f"{role} instance {url}")
        except MessageError as exc:
            raise server_error(502, str(exc)) from None

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
            cache_namespace=req.cache_namespace.hex(),
        )
        with self._talking_to("prefill", url, "is unreachable"):
            r = await self._http().post(
                url + PREFILL_PATH, content=body.encode(), headers=self.headers
            )
        if r.status_code != 200:
            raise self._refusal("prefill", url, r, req)
        self._check_answer("prefill", url, r)
        try:
            answer = decode_http(PrefillAnswer, r.content, f"prefill instance {url}")
        except MessageError as exc:
            raise server_error(502, str(exc)) from None
        if not answer.output_token_ids:
            raise server_error(502, f"prefill instance {url} sent no first token")
        self._emit(
            req, stream, answer.output_token_ids, answer.output_logprobs, f"prefill instance {url}"
        )
        if answer.finished:
            full = len(req.output_token_ids) >= req.max_tokens
            return answer.finish_reason or ("length" if full else "stop"), None
        if answer.handoff is None:
            raise server_error(
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
            cache_namespace=req.cache_namespace.hex(),
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
            raise server_error(
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
        with self._talking_to("decode", url, "failed"):
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
                raise server_error(status, f"{source}: {event.error.message}")
            if isinstance(event, TokensEvent):
                self._emit(req, stream, event.token_ids, event.logprobs, source)
            else:
                reason = event.finish_reason
        if reason is None:
            raise server_error(
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


def json_headers() -> dict[str, str]:
    return {"Content-Type": "application/json", **version_headers()}
