"""The router's ``/metrics`` (``fastdeploy:router_*``) and the refused messages both
``serve`` and the router count.

Trust (both ``serve`` and the router):

* ``fastdeploy:dropped_messages_total{channel="worker|kv|http|handoff"}`` — messages refused
  because their sender proved no credential or they were not the awaited answer: on the
  engine <-> worker socket, on a prefill instance's KV port, on HTTP (a missing or wrong
  ``Authorization``), and hand-overs whose signature or contents did not hold
  (:class:`~fastdeploy_mtp.credentials.DroppedMessages`). None of them failed a request.

The router (``fastdeploy-mtp router``) counts its own ``fastdeploy:router_*`` instead
(:class:`RouterCollector`).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ...credentials import DroppedMessages
from .counters import RouterCounters
from .families import PREFIX, counter


class RouterCollector(Collector):
    """``fastdeploy:router_*`` counters, read at scrape time."""

    def __init__(self, counters: RouterCounters):
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self.counters
        for name, doc, value in (
            ("router_requests_routed", "Requests the router sent to a prefill instance.", c.routed),
            (
                "router_requests_success",
                "Routed requests that finished (stop or length).",
                c.success,
            ),
            (
                "router_requests_failure",
                "Routed requests that ended with an error (an instance refused, failed or was "
                "unreachable, or no decode instance had room within the queue timeout).",
                c.failure,
            ),
            (
                "router_requests_cancelled",
                "Routed requests abandoned because their client disconnected.",
                c.cancelled,
            ),
            (
                "router_decode_retries",
                "Decode attempts a full decode instance answered with 429 (the request waited and "
                "was retried).",
                c.decode_retries,
            ),
        ):
            yield counter(name, doc, value)


class DroppedCollector(Collector):
    """``fastdeploy:dropped_messages_total{channel}`` from a :class:`DroppedMessages`."""

    def __init__(self, dropped: DroppedMessages):
        self.dropped = dropped

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            PREFIX + "dropped_messages",
            "Messages refused because the sender proved no credential or they were not the "
            "awaited answer (worker: engine<->worker socket; kv: KV port; http: Authorization; "
            "handoff: hand-over signature or contents). None of them failed a request.",
            labels=["channel"],
        )
        for channel, n in self.dropped.counts().items():
            family.add_metric([channel], n)
        yield family
