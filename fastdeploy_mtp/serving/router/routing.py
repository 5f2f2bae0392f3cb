"""The splitwise router's :class:`~fastdeploy_mtp.serving.engine_client.backend.Backend`:
:class:`RouterBackend` routes each request in a task (a prefill instance, then a decode
instance: :class:`~.forwarding.InstanceForwarder`), counts how they end and answers the
router's ``/health`` (see :mod:`.server` for the protocol).
"""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client import CollectorRegistry

from ...credentials import DroppedMessages
from ...runtime.request import InvalidRequestError, Request
from ..engine_client.backend import Stream
from ..metrics.router_collector import DroppedCollector, RouterCollector
from ..openai.protocol import APIError
from .forwarding import HEALTH_TIMEOUT_S, InstanceForwarder, Instances, server_error


class RouterBackend(InstanceForwarder):
    """A :class:`~fastdeploy_mtp.serving.engine_client.engine_loop.Backend` that forwards each
    request to a prefill instance, then to a decode instance (see the module docstring), over one
    ``httpx.AsyncClient``.

    Args:
        instances: the instances it forwards to and its timeouts (:class:`~.forwarding.Instances`).

    Use it from one event loop (the server's): the HTTP client is made there on first use;
    :meth:`aclose` ends the requests in flight and closes it.
    """

    fatal: str | None = None

    def __init__(self, instances: Instances):
        super().__init__(instances)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RouterCollector(self.counters))
        #: requests refused by the router's app (no API key), shown in its /metrics
        self.dropped = DroppedMessages()
        self.registry.register(DroppedCollector(self.dropped))
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False

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
        """The client went away: stop routing ``req`` (closing its decode stream aborts it
        there)."""
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
                stream.put("error", server_error(503, "the router is shutting down"))
                self.counters.failure += 1
            else:
                self.counters.cancelled += 1
            raise
        except APIError as exc:
            stream.put("error", exc)
            self.counters.failure += 1
        except Exception as exc:  # a malformed answer from an instance: fail this request only
            stream.put("error", server_error(502, f"request {req.request_id}: {exc}"))
            self.counters.failure += 1
        finally:
            self._tasks.pop(req.request_id, None)
