"""Per-request latency bookkeeping behind the ``fastdeploy:*_seconds`` histograms of ``/metrics``.

:class:`LatencyTracker` stamps each served request's
:class:`~fastdeploy_mtp.runtime.request.RequestTiming` from the engine thread of
:class:`~fastdeploy_mtp.serving.engine_client.engine_loop.AsyncEngine`, and observes the histograms
when a request ends. All times are seconds of ``time.monotonic()`` (or of the clock a test injects);
the stages are:

* **arrival**: ``AsyncEngine.submit`` received the request (before it is queued for the engine);
* **scheduled**: the *start* of the engine step whose scheduling placed it in a slot (the
  scheduler admits waiting requests at the beginning of :meth:`Engine.step`; the engine
  client notices the slot after the step, and dates the admission to the step's start);
* **first token**: the *end* of the first step that generated an output token for it on this
  instance. This is when the token exists on the host, not when it is streamed: a token
  whose text could begin a stop string is held back from the stream, and that delay is not
  in the histograms;
* **finished**: the end of the step it completed in (``stop`` or ``length``).

What is observed, and when (all at the end of the request, as vLLM does):

* a request that **completed** (``fastdeploy:request_success_total``) observes every
  histogram, except ``time_per_output_token`` unless it has output tokens after its first
  token step (on a mixed instance: at least 2 output tokens);
* a request that **failed** or was **cancelled** observes none (they are counted by
  ``fastdeploy:request_failure_total`` / ``..._cancelled_total``);
* splitwise **prefill** instance: a request handed off to a decode instance observes queue
  time, TTFT and prefill time (its decode happens elsewhere);
* splitwise **decode** instance: a handed-over request arrives with the prefill instance's
  first token(s), so its TTFT and prefill time are not observed here; its queue time and e2e
  latency run from its arrival *at this instance*, and its time per output token from the
  end of the first step that gave it tokens here (after its KV transfer).
"""

from __future__ import annotations

import bisect
import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ...runtime.events import StepEvents
from ...runtime.request import Request, RequestTiming

#: bucket upper bounds (seconds) of the request-level latencies: 1 ms .. 10 minutes
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75,
    1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
#: bucket upper bounds (seconds) of the time per output token: 0.5 ms .. 10 s
TOKEN_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

_ARRIVAL = "from a request's arrival at the engine client (submit)"
#: histogram name (after ``fastdeploy:``) -> (HELP text, bucket bounds)
HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "time_to_first_token_seconds": (
        f"Seconds {_ARRIVAL} to the end of the engine step that generated its first output token "
        "(not its first streamed chunk: stop-string hold-back is not included). Completed and "
        "handed-off requests; not observed for requests handed over to a decode instance.",
        LATENCY_BUCKETS,
    ),
    "time_per_output_token_seconds": (
        "Per completed request: seconds from the end of its first-token step to the end of its "
        "last step, divided by the output tokens generated after the first-token step (on a "
        "mixed instance (e2e - TTFT) / (output tokens - 1)); only requests with such tokens (at "
        "least 2 output tokens). With speculation several tokens arrive per step: this is a "
        "mean, not a gap between chunks.",
        TOKEN_BUCKETS,
    ),
    "e2e_request_latency_seconds": (
        f"Seconds {_ARRIVAL} to the end of the engine step it completed in (stop or length). "
        "Completed requests only: failed and cancelled ones are not observed.",
        LATENCY_BUCKETS,
    ),
    "request_queue_time_seconds": (
        f"Seconds {_ARRIVAL} to the start of the engine step that placed it in a slot. Completed "
        "and handed-off requests.",
        LATENCY_BUCKETS,
    ),
    "request_prefill_time_seconds": (
        "Seconds from the start of the engine step that placed a request in a slot to the end of "
        "the step that generated its first output token (all its prefill chunks). Completed and "
        "handed-off requests; not observed for requests handed over to a decode instance.",
        LATENCY_BUCKETS,
    ),
    "request_decode_time_seconds": (
        "Seconds from the end of a completed request's first-token step to the end of the step it "
        "completed in.",
        LATENCY_BUCKETS,
    ),
}


@dataclass
class Histogram:
    """Observations of one latency, in seconds, in fixed buckets.

    Attributes:
        buckets: upper bounds, ascending (``+Inf`` is implicit).
        counts: observations per bucket (not cumulative), ``len(buckets) + 1`` of them (the
            last is above every bound).
        sum: seconds observed in all.
        count: observations.
    """

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, seconds: float) -> None:
        """Count one observation of ``seconds`` (a bound is inclusive, as Prometheus' ``le``)."""
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, observations <= le)`` per bound, then ``("+Inf", count)``, as
        ``HistogramMetricFamily`` takes them."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


class LatencyTracker:
    """Stamps served requests' :class:`RequestTiming` and observes the latency histograms
    (see the module docstring). Called from the engine thread under the engine client's lock,
    which the ``/metrics`` collector takes to copy :attr:`histograms`.

    Args:
        clock: seconds, monotonic (``time.monotonic``; tests inject a fake).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.histograms = {name: Histogram(buckets) for name, (_, buckets) in HISTOGRAMS.items()}

    def arrived(self, req: Request) -> None:
        """``req`` reached the engine client: start its timing."""
        req.timing = RequestTiming(self.clock(), tokens_at_arrival=len(req.output_token_ids))

    def after_step(self, started: float, in_slots: Iterable[Request], events: StepEvents) -> None:
        """An engine step that began at ``started`` (this tracker's clock) returned ``events``;
        ``in_slots``: the requests holding a slot after it. Stamps admissions and first tokens,
        then observes the requests that completed or were handed off."""
        now = self.clock()
        ended = [*events.finished, *(h.request for h in events.handed_off)]
        for req in (*in_slots, *ended):
            t = req.timing
            if t is None:
                continue
            if t.scheduled is None:
                t.scheduled = started
            if t.first_token is None and len(req.output_token_ids) > t.tokens_at_arrival:
                t.first_token = now
                t.tokens_at_first = len(req.output_token_ids)
        for req in events.finished:
            self._observe(req, now, completed=True)
        for h in events.handed_off:
            self._observe(h.request, now, completed=False)

    def _observe(self, req: Request, now: float, completed: bool) -> None:
        """``req`` completed (or, ``completed=False``, was handed off) at ``now``."""
        t = req.timing
        if t is None or t.scheduled is None:
            return
        t.finished = now
        h = self.histograms
        h["request_queue_time_seconds"].observe(t.scheduled - t.arrival)
        if t.first_token is not None and t.tokens_at_arrival == 0:
            h["time_to_first_token_seconds"].observe(t.first_token - t.arrival)
            h["request_prefill_time_seconds"].observe(t.first_token - t.scheduled)
        if not completed:
            return
        h["e2e_request_latency_seconds"].observe(now - t.arrival)
        if t.first_token is None:
            return
        h["request_decode_time_seconds"].observe(now - t.first_token)
        later = len(req.output_token_ids) - t.tokens_at_first
        if later > 0:
            h["time_per_output_token_seconds"].observe((now - t.first_token) / later)

    def snapshot(self) -> dict[str, Histogram]:
        """A copy of :attr:`histograms` (take it under the engine client's lock)."""
        return copy.deepcopy(self.histograms)
