"""The ``serve`` backend: :class:`AsyncEngine` runs the engine loop in one thread and hands
each request's tokens to its HTTP handler through its :class:`~.backend.Stream`. When a
worker dies, every request in flight fails with a clear error, ``/health`` turns 503 and
``on_fatal`` stops the server.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable

from ...credentials import DroppedMessages
from ...runtime.engine import Engine
from ...runtime.events import StepEvents
from ...runtime.request import InvalidRequestError, Request
from ..metrics.counters import ServerCounters
from ..metrics.engine_collector import make_registry
from ..metrics.latency import LatencyTracker
from ..openai.protocol import APIError
from ..openai.text import emitted_of
from .backend import Stream


class AsyncEngine:
    """Runs :meth:`Engine.step` in a thread as requests arrive; hands tokens to streams.

    Args:
        engine: the engine (its runner drives the workers).
        on_fatal: called once, from the engine thread, when the deployment is lost.
        dropped: the deployment's count of refused messages (shown in ``/metrics``; a new
            one if not given).

    Attributes:
        latency: the requests' timing and the latency histograms of ``/metrics``
            (:class:`~fastdeploy_mtp.serving.metrics.latency.LatencyTracker`; stamped under
            :attr:`lock`).
    """

    def __init__(
        self,
        engine: Engine,
        on_fatal: Callable[[str], None],
        dropped: DroppedMessages | None = None,
    ):
        self.engine = engine
        self.counters = ServerCounters()
        self.dropped = dropped if dropped is not None else DroppedMessages()
        self.lock = threading.Lock()
        self.latency = LatencyTracker()
        self.registry = make_registry(
            engine.metrics, engine.scheduler, self.counters, self.lock, self.dropped, self.latency
        )
        self._inbox: queue.Queue[Stream] = queue.Queue()
        self._cancels: queue.Queue[Request] = queue.Queue()
        self._streams: dict[str, Stream] = {}
        #: streams submitted but not yet admitted, by request id (a cancel takes one out)
        self._queued: dict[str, Stream] = {}
        self._queued_lock = threading.Lock()
        self._stop = threading.Event()
        #: stop() began: new requests are refused (set under ``_queued_lock``)
        self._stopped = False
        self._on_fatal = on_fatal
        self.fatal: str | None = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def validate(self, req: Request) -> None:
        """Submission checks (raises InvalidRequestError) before a response starts."""
        self.engine.scheduler.validate(req)

    def submit(self, req: Request) -> Stream:
        """Queue ``req`` for the engine thread. The refusal check and the queueing hold
        :attr:`_queued_lock`, as the loop's end does while it sets its reason and takes what
        was queued: a request is either refused here or failed there, never left waiting."""
        stream = Stream(req, asyncio.get_running_loop())
        self.latency.arrived(req)
        with self._queued_lock:
            if self.fatal or self._stopped:
                reason = f": {self.fatal}" if self.fatal else ""
                raise APIError(503, f"the server is shutting down{reason}", kind="server_error")
            self._queued[req.request_id] = stream
            self._inbox.put(stream)
        return stream

    def cancel(self, req: Request) -> None:
        """Abort ``req`` if it has not finished (its client went away); thread-safe. A request
        not admitted yet is never admitted: it is marked finished (aborted) right here, since
        the engine thread will not see it again (a splitwise decode instance then forgets its
        KV descriptor)."""
        with self._queued_lock:
            if self._queued.pop(req.request_id, None) is not None:
                req.finished = True
                req.error = RuntimeError("the client disconnected before the request was admitted")
                with self.counters.lock:
                    self.counters.cancelled += 1
                return
        self._cancels.put(req)

    async def health(self) -> str | None:
        """Unhealthy exactly when the deployment was lost (:attr:`fatal`)."""
        return self.fatal

    def stop(self) -> None:
        """Stop the loop; requests still in flight (or queued) end with a 503."""
        with self._queued_lock:
            self._stopped = True
        self._stop.set()
        self._thread.join(30)
        if self._thread.is_alive():
            return  # stuck in a step: the runner's shutdown ends it
        error = APIError(503, "the server is shutting down", kind="server_error")
        for stream in list(self._streams.values()):
            stream.put("error", error)
        self._streams.clear()
        self._fail_queued(error)

    def _fail_queued(self, error: APIError) -> None:
        """End every request still queued (not admitted) with ``error``."""
        while True:
            try:
                self._inbox.get_nowait().put("error", error)
            except queue.Empty:
                return

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
        with self._queued_lock:
            if self._queued.pop(stream.request.request_id, None) is None:
                return  # cancelled before it was admitted
        try:
            if (
                stream.request.handoff_state is not None
            ):  # splitwise decode: handed over by a prefill instance
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
                    started = self.latency.clock()
                    events = self.engine.step(step)
                    self.latency.after_step(started, self._in_slots(), events)
                    self._after_step(events)
                step += 1
                if not events.ran:  # e.g. every slot waits for its KV transfer: do not spin
                    time.sleep(0.002)
                for req, tokens in events.emitted:
                    if tokens and req.request_id in self._streams:
                        self._streams[req.request_id].put("tokens", emitted_of(req, tokens))
                for req in events.finished:
                    # counted before its client hears of it: a client that reads /metrics
                    # right after its response must find its request there
                    with self.counters.lock:
                        self.counters.success += 1
                    done = self._streams.pop(req.request_id, None)
                    if done is not None:
                        done.put("finished", finish_reason_of(req))
                self._fail(events.failed)
                dead = getattr(self.engine.runner, "dead", None)
                if dead:
                    raise RuntimeError(dead)
        except BaseException as exc:  # the deployment is gone: fail everything, stop the server
            reason = (
                f"{type(exc).__name__}: {exc}" if not isinstance(exc, RuntimeError) else str(exc)
            )
            with self._queued_lock:  # from here submit() refuses: nothing joins the inbox
                self.fatal = reason
            with self.lock:
                self._fail(self.engine.abort_all(RuntimeError(reason)))
            self._fail_queued(APIError(503, reason, kind="server_error"))  # and what was queued
            self._on_fatal(reason)

    def _in_slots(self) -> list[Request]:
        """The requests holding a slot (call under :attr:`lock`)."""
        return [state.request for state in self.engine.scheduler.slots.values()]

    def _before_step(self) -> None:
        """Called under :attr:`lock` before every step (splitwise instances hook in here)."""

    def _after_step(self, events: StepEvents) -> None:
        """Called under :attr:`lock` after every step, before its tokens are handed out."""

    def _fail(self, failed: list[tuple[Request, BaseException]]) -> None:
        for req, err in failed:
            with self.counters.lock:  # (counted before the client hears of it, as successes)
                self.counters.failure += 1
            stream = self._streams.pop(req.request_id, None)
            if stream is not None:  # a task the runner refused for its data is the client's 400
                error = (
                    APIError(400, str(err), err.field)
                    if isinstance(err, InvalidRequestError)
                    else APIError(500, f"request failed: {err}", kind="server_error")
                )
                stream.put("error", error)


def finish_reason_of(req: Request) -> str:
    """The engine's ``finish_reason`` of a finished ``req`` (``"stop"`` or ``"length"``)."""
    return req.finish_reason or "stop"
