"""What the OpenAI app needs from the thing that generates: :class:`Backend` (the
``serve`` engine loop, :class:`~.engine_loop.AsyncEngine`, or the splitwise router's
:class:`~fastdeploy_mtp.serving.router.routing.RouterBackend`), and :class:`Stream`, one
request's events on their way from the backend to its HTTP handler (an ``asyncio.Queue``),
read with :func:`stream_events`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from ...runtime.request import Request


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
    """What :func:`~fastdeploy_mtp.serving.openai.app.create_app` needs from the thing that
    generates: the in-process engine loop (:class:`AsyncEngine`, ``serve``) or the splitwise router
    (:class:`~fastdeploy_mtp.serving.router.routing.RouterBackend`), which forwards to other
    instances.

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
