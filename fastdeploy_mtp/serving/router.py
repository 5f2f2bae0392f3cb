"""``fastdeploy-mtp router``: the OpenAI front end of splitwise (disaggregated) serving.

Each request goes to a prefill instance (``serve --splitwise-role prefill``), which computes
the prompt's KV cache and the first token(s), then to a decode instance
(``serve --splitwise-role decode``), which generates the rest; the client sees one OpenAI
response, streamed or not, exactly as from ``serve`` (the formatting is
:func:`~.api_server.create_app`'s; :class:`RouterBackend` is its backend).

What the router says to the instances (JSON over HTTP):

* ``POST /v1/splitwise/prefill`` ``{"request_id", "prompt_token_ids", "max_tokens",
  "sampling"}`` -> ``{"request_id", "output_token_ids", "output_logprobs", "finished",
  "finish_reason", "handoff"}``; the first tokens go to the client at once; ``handoff``
  (opaque, ``null`` iff finished) is passed on unchanged.
* ``POST /v1/splitwise/decode`` ``{"request_id", "prompt_token_ids", "output_token_ids",
  "max_tokens", "sampling", "handoff"}`` -> server-sent events ``{"token_ids": [...],
  "logprobs": [...]}`` (``logprobs`` only when the request asked for them), then
  ``{"finish_reason": ...}``, then ``[DONE]`` (``{"error": {...}}`` if it fails mid-stream).
  A 429 means the instance is full: the router waits (``Retry-After``, at most 1 s a time)
  and tries the next decode instance, until the queue timeout; the request is never dropped
  before that. Closing the stream aborts the request on the instance (the router does so
  when its client disconnects).
* ``GET /health`` and ``GET /v1/models`` on both.

``sampling`` is the request's :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams` as
``to_dict()``, built from the OpenAI body exactly as ``serve`` does
(:func:`~.api_server.sampling_params`, in :func:`~.api_server.create_app`); logprobs travel as
``{"token_id", "logprob", "top": [[id, logprob], ...]}`` per token.

Instances are taken round-robin, prefill and decode separately. A 400 from an instance (the
request is invalid) reaches the client as that 400; an unreachable instance is a 502, an
instance answering 503 a 503, any other failure a 502, each naming the instance's URL.
``/health`` is 200 while at least one prefill and one decode instance answer theirs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ..runtime.request import InvalidRequestError, Request
from ..runtime.sampling_params import TokenLogprob
from .api_server import APIError, Emitted, Stream, create_app, logprob_from_dict, run_http

PREFILL_PATH = "/v1/splitwise/prefill"
DECODE_PATH = "/v1/splitwise/decode"
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
        raise ValueError(f"{option} {url!r}: give an instance's base URL, e.g. http://127.0.0.1:8001")
    return str(url).rstrip("/")


# ---- metrics -------------------------------------------------------------------------------
@dataclass
class RouterCounters:
    """What the router counts (read and written on the event loop only)."""

    routed: int = 0
    success: int = 0
    failure: int = 0
    cancelled: int = 0
    decode_retries: int = 0


class RouterCollector(Collector):
    """``fastdeploy:router_*`` counters, read at scrape time."""

    def __init__(self, counters: RouterCounters):
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self.counters
        for name, doc, value in (
            ("router_requests_routed", "Requests the router sent to a prefill instance.", c.routed),
            ("router_requests_success", "Routed requests that finished (stop or length).", c.success),
            (
                "router_requests_failure",
                "Routed requests that ended with an error (an instance refused, failed or was unreachable, "
                "or no decode instance had room within the queue timeout).",
                c.failure,
            ),
            ("router_requests_cancelled", "Routed requests abandoned because their client disconnected.", c.cancelled),
            (
                "router_decode_retries",
                "Decode attempts a full decode instance answered with 429 (the request waited and was retried).",
                c.decode_retries,
            ),
        ):
            yield CounterMetricFamily("fastdeploy:" + name, doc, value=value)


# ---- the backend ---------------------------------------------------------------------------
def _error_of(response: httpx.Response) -> tuple[str, str | None]:
    """(message, param) of an instance's OpenAI-style error body (or its raw text)."""
    try:
        err = response.json()["error"]
        return str(err["message"]), err.get("param")
    except (ValueError, KeyError, TypeError):
        return response.text[:300] or response.reason_phrase, None


class RouterBackend:
    """A :class:`~.api_server.Backend` that forwards each request to a prefill instance, then
    to a decode instance (see the module docstring), over one ``httpx.AsyncClient``.

    Args:
        prefill: base URLs of the prefill instances (e.g. ``http://10.0.0.1:8001``), at least one.
        decode: base URLs of the decode instances, at least one.
        queue_timeout: seconds a request may wait for a decode instance with room (429s)
            before it fails with a 503.

    Use it from one event loop (the server's): the HTTP client is made there on first use;
    :meth:`aclose` ends the requests in flight and closes it.
    """

    fatal: str | None = None

    def __init__(self, prefill: Sequence[str], decode: Sequence[str], queue_timeout: float = 600.0):
        if not prefill:
            raise ValueError("prefill: at least one prefill instance URL is needed")
        if not decode:
            raise ValueError("decode: at least one decode instance URL is needed")
        if not queue_timeout > 0:
            raise ValueError(f"queue_timeout must be > 0 seconds, got {queue_timeout}")
        self.prefill = [check_instance_url(u, "prefill") for u in prefill]
        self.decode = [check_instance_url(u, "decode") for u in decode]
        self.queue_timeout = float(queue_timeout)
        self.counters = RouterCounters()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RouterCollector(self.counters))
        self._next_prefill = itertools.cycle(range(len(self.prefill)))
        self._next_decode = itertools.cycle(range(len(self.decode)))
        self._client: httpx.AsyncClient | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(timeout=timeout, limits=limits)
        return self._client

    # -- Backend ---------------------------------------------------------------------------
    def validate(self, req: Request) -> None:
        """Local checks only (the prefill instance checks the rest): a non-empty prompt of
        integer ids and ``max_tokens > 0``."""
        if not req.prompt_token_ids:
            raise InvalidRequestError(req.request_id, "prompt_token_ids", "the prompt is empty")
        if not all(isinstance(t, int) and t >= 0 for t in req.prompt_token_ids):
            raise InvalidRequestError(req.request_id, "prompt_token_ids", "prompt ids must be non-negative integers")
        if req.max_tokens <= 0:
            raise InvalidRequestError(req.request_id, "max_tokens", f"max_tokens must be > 0, got {req.max_tokens}")

    def submit(self, req: Request) -> Stream:
        """Start routing ``req`` in a task; the stream's first event is the prefill's outcome
        (its first tokens, or the error), so a refused request can still get its status code."""
        if self._closed:
            raise APIError(503, "the router is shutting down", kind="server_error")
        loop = asyncio.get_running_loop()
        stream = Stream(req, loop)
        self.counters.routed += 1
        self._tasks[req.request_id] = loop.create_task(self._route(req, stream), name=f"route {req.request_id}")
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
        for role, found in (("prefill", answers[: len(self.prefill)]), ("decode", answers[len(self.prefill) :])):
            if all(a is not None for a in found):
                problems.append(f"no {role} instance is healthy: " + "; ".join(a for a in found if a))
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
                reason = await self._decode(req, stream, handoff)
            stream.put("finished", reason)
            self.counters.success += 1
        except asyncio.CancelledError:
            if self._closed:
                stream.put("error", APIError(503, "the router is shutting down", kind="server_error"))
                self.counters.failure += 1
            else:
                self.counters.cancelled += 1
            raise
        except APIError as exc:
            stream.put("error", exc)
            self.counters.failure += 1
        except Exception as exc:  # a malformed answer from an instance: fail this request only
            stream.put("error", APIError(502, f"request {req.request_id}: {exc}", kind="server_error"))
            self.counters.failure += 1
        finally:
            self._tasks.pop(req.request_id, None)

    def _emit(self, req: Request, stream: Stream, ids: Any, logprobs: Any, source: str) -> None:
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise APIError(
                502, f"{source} sent token ids that are not a list of integers: {ids!r}", kind="server_error"
            )
        parsed: list[TokenLogprob] | None = None
        if req.sampling.logprobs is not None:
            try:
                parsed = [logprob_from_dict(d) for d in logprobs]
            except (ValueError, KeyError, TypeError) as exc:
                raise APIError(502, f"{source} sent malformed logprobs: {exc!r}", kind="server_error") from None
            if len(parsed) != len(ids):
                raise APIError(502, f"{source} sent {len(parsed)} logprobs for {len(ids)} tokens", kind="server_error")
        if ids:
            req.output_token_ids.extend(ids)
            if parsed is not None:
                req.output_logprobs.extend(parsed)
            stream.put("tokens", Emitted(list(ids), parsed))

    def _refusal(self, role: str, url: str, response: httpx.Response) -> APIError:
        message, param = _error_of(response)
        if response.status_code == 400:  # the request itself is invalid: the client's 400
            return APIError(400, message, param)
        status = 503 if response.status_code == 503 else 502
        return APIError(
            status, f"{role} instance {url} answered {response.status_code}: {message}", kind="server_error"
        )

    async def _prefill(self, req: Request, stream: Stream) -> tuple[str | None, Any]:
        """POST the prefill; emits the first tokens. Returns ``(finish reason, None)`` if the
        request finished there, else ``(None, handoff)`` for the decode instance."""
        url = self.prefill[next(self._next_prefill)]
        body = {
            "request_id": req.request_id,
            "prompt_token_ids": req.prompt_token_ids,
            "max_tokens": req.max_tokens,
            "sampling": req.sampling.to_dict(),
        }
        try:
            r = await self._http().post(url + PREFILL_PATH, json=body)
        except httpx.HTTPError as exc:
            raise APIError(
                502, f"prefill instance {url} is unreachable ({type(exc).__name__}: {exc})", kind="server_error"
            ) from None
        if r.status_code != 200:
            raise self._refusal("prefill", url, r)
        try:
            answer = r.json()
            first, finished = answer["output_token_ids"], bool(answer["finished"])
            first_logprobs = answer.get("output_logprobs")
        except (ValueError, KeyError, TypeError) as exc:
            raise APIError(502, f"prefill instance {url} sent a malformed answer: {exc}", kind="server_error") from None
        if not first:
            raise APIError(502, f"prefill instance {url} sent no first token", kind="server_error")
        self._emit(req, stream, first, first_logprobs, f"prefill instance {url}")
        if finished:
            full = len(req.output_token_ids) >= req.max_tokens
            return answer.get("finish_reason") or ("length" if full else "stop"), None
        return None, answer.get("handoff")

    async def _decode(self, req: Request, stream: Stream, handoff: Any) -> str:
        """POST the decode to a decode instance with room (retrying 429s until the queue
        timeout) and emit its tokens as they arrive; returns the finish reason."""
        body = {
            "request_id": req.request_id,
            "prompt_token_ids": req.prompt_token_ids,
            "output_token_ids": list(req.output_token_ids),
            "max_tokens": req.max_tokens,
            "sampling": req.sampling.to_dict(),
            "handoff": handoff,
        }
        deadline = time.monotonic() + self.queue_timeout
        for attempt in itertools.count():
            url = self.decode[next(self._next_decode)]
            try:
                async with self._http().stream("POST", url + DECODE_PATH, json=body) as r:
                    if r.status_code == 429:
                        wait = _retry_after(r, attempt)
                    elif r.status_code != 200:
                        await r.aread()
                        raise self._refusal("decode", url, r)
                    else:
                        return await self._relay(req, stream, url, r.aiter_lines())
            except httpx.HTTPError as exc:
                raise APIError(
                    502, f"decode instance {url} failed ({type(exc).__name__}: {exc})", kind="server_error"
                ) from None
            left = deadline - time.monotonic()
            if left <= 0:
                raise APIError(
                    503,
                    f"request {req.request_id}: no decode instance had room within the queue timeout "
                    f"({self.queue_timeout:g} s); the last one asked, {url}, answered 429",
                    kind="server_error",
                )
            self.counters.decode_retries += 1
            await asyncio.sleep(min(wait, left))
        raise AssertionError("unreachable")

    async def _relay(self, req: Request, stream: Stream, url: str, lines: AsyncIterator[str]) -> str:
        reason: str | None = None
        async for line in lines:
            if not line.startswith("data:"):
                continue  # blank separators, comments
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                err = event["error"] if isinstance(event["error"], dict) else {"message": str(event["error"])}
                code = err.get("code")
                status = code if isinstance(code, int) and 400 <= code < 600 else 502
                raise APIError(status, f"decode instance {url}: {err.get('message')}", kind="server_error")
            if "token_ids" in event:
                self._emit(req, stream, event["token_ids"], event.get("logprobs"), f"decode instance {url}")
            if event.get("finish_reason"):
                reason = str(event["finish_reason"])
        if reason is None:
            raise APIError(
                502,
                f"decode instance {url} ended the stream before request {req.request_id} finished",
                kind="server_error",
            )
        return reason


def _retry_after(response: httpx.Response, attempt: int) -> float:
    """Seconds to wait before the next decode attempt: an exponential backoff from
    :data:`FIRST_RETRY_WAIT_S`, never longer than the instance's ``Retry-After`` (whole
    seconds, so only an upper bound: a slot usually frees within a few steps) nor
    :data:`MAX_RETRY_WAIT_S`."""
    wait = FIRST_RETRY_WAIT_S * 2 ** min(attempt, 16)
    try:
        wait = min(wait, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        pass
    return max(0.0, min(wait, MAX_RETRY_WAIT_S))


# ---- the command ---------------------------------------------------------------------------
def router_app(backend: RouterBackend, model_name: str) -> FastAPI:
    """The OpenAI app over ``backend`` (the byte-level tokenizer of the served tiny model);
    its shutdown ends the requests in flight and closes the backend's HTTP client."""
    from ..models.tiny import ByteTokenizer

    app = create_app(backend, model_name, ByteTokenizer(), ByteTokenizer.vocab_size)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await backend.aclose()

    app.router.lifespan_context = lifespan
    return app


@dataclass
class RouterOptions:
    """The ``router`` command's options (``fastdeploy_mtp.entrypoints.router`` defines their flags)."""

    prefill: list[str]
    decode: list[str]
    host: str = "127.0.0.1"
    port: int = 8000
    queue_timeout: float = 600.0
    served_model_name: str | None = None
    start_timeout: float = 300.0


def wait_for_instances(urls: Sequence[tuple[str, str]], timeout: float, progress: Callable[[str], None]) -> None:
    """Poll each ``(role, url)``'s ``/health`` until it answers 200, reporting each one ready.

    Raises:
        TimeoutError: some instance was not healthy within ``timeout`` seconds (names them).
    """
    deadline = time.monotonic() + timeout
    waiting = dict.fromkeys(urls, "not asked yet")
    with httpx.Client(timeout=HEALTH_TIMEOUT_S) as client:
        while waiting:
            for role, url in list(waiting):
                try:
                    status = client.get(url + "/health").status_code
                    waiting[(role, url)] = f"/health answered {status}"
                except httpx.HTTPError as exc:
                    status, waiting[(role, url)] = 0, f"unreachable ({type(exc).__name__})"
                if status == 200:
                    del waiting[(role, url)]
                    progress(f"{role} instance {url} healthy")
            if not waiting:
                return
            if time.monotonic() >= deadline:
                left = ", ".join(f"{role} instance {url} ({why})" for (role, url), why in waiting.items())
                raise TimeoutError(f"not healthy after --start-timeout {timeout:g} s: {left}")
            time.sleep(0.2)


def fetch_model_name(url: str) -> str:
    """``data[0].id`` of the instance's ``/v1/models``."""
    try:
        r = httpx.get(url + "/v1/models", timeout=HEALTH_TIMEOUT_S)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ConnectionError(f"could not read the served model name from {url}/v1/models: {exc}") from None


def run_router(opts: RouterOptions) -> int:
    """Wait for the instances, then route until SIGINT/SIGTERM (returns 0; 130 if interrupted
    during start-up, 1 if the server could not start)."""

    t0 = time.perf_counter()

    def progress(line: str) -> None:
        print(f"[router {time.perf_counter() - t0:6.2f}s] {line}", file=sys.stderr, flush=True)

    backend = RouterBackend(opts.prefill, opts.decode, opts.queue_timeout)  # checks the URLs first
    # httpx logs every request at INFO, and Paddle's import sets the root logger to print INFO
    logging.getLogger("httpx").setLevel(logging.WARNING)

    def interrupted(signum: int, frame: object) -> None:  # during start-up: stop waiting
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        progress(
            f"waiting for {len(backend.prefill)} prefill and {len(backend.decode)} decode instance(s) "
            f"(at most {opts.start_timeout:g} s)"
        )
        wait_for_instances(
            [("prefill", u) for u in backend.prefill] + [("decode", u) for u in backend.decode],
            opts.start_timeout,
            progress,
        )
        model_name = opts.served_model_name or fetch_model_name(backend.prefill[0])
        progress(f"serving model {model_name!r}; decode queue timeout {opts.queue_timeout:g} s")
        started = run_http(router_app(backend, model_name), opts.host, opts.port, progress, t0)
        return 0 if started else 1  # not started: e.g. the port was taken (uvicorn said why)
    except KeyboardInterrupt:
        progress("interrupted during start-up")
        return 130
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
