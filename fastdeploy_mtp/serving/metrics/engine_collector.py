"""``serve``'s ``/metrics``: :class:`EngineCollector` reads the engine's counters, its
scheduler and the latency histograms at scrape time (the speculation series are
:mod:`.speculation`'s, the refused messages :mod:`.router_collector`'s
:class:`~.router_collector.DroppedCollector`).

Plus request counters (``fastdeploy:request_success_total``, ``..._failure_total``,
``..._cancelled_total`` for clients that disconnected),
prompt/generation token counters, and running/waiting gauges.

Latency histograms (vLLM's names; seconds of ``time.monotonic()``, buckets from 1 ms to 10
minutes, 0.5 ms to 10 s for the time per output token). The stages and which requests are
observed are defined in :mod:`~fastdeploy_mtp.serving.metrics.latency`; in short, each is observed
once per request when it ends, for requests that completed (failed and cancelled requests
are not observed), and "arrival" is the engine client's ``submit``:

* ``fastdeploy:time_to_first_token_seconds`` — arrival to the end of the engine step that
  generated the first output token (not the first streamed chunk: a token held back because
  it could begin a stop string counts when it is generated);
* ``fastdeploy:time_per_output_token_seconds`` — (e2e - TTFT) / (output tokens - 1), for
  requests with at least 2 output tokens. With speculation a step brings several tokens, so
  this is a mean over the request, not the gap between streamed chunks;
* ``fastdeploy:e2e_request_latency_seconds`` — arrival to the end of the step the request
  completed in (stop or length);
* ``fastdeploy:request_queue_time_seconds`` — arrival to the start of the engine step that
  placed the request in a slot;
* ``fastdeploy:request_prefill_time_seconds`` — slot to first token (all prefill chunks);
* ``fastdeploy:request_decode_time_seconds`` — first token to completion.

Splitwise: a prefill instance observes queue time, TTFT and prefill time of the requests it
hands off; a decode instance does not observe TTFT or prefill time of handed-over requests
(their first token came from the prefill instance), and times their queue and e2e latency
from their arrival there and their time per output token from the first step that gave them
tokens there (after the KV transfer).

KV cache and prefix cache (FastDeploy calls the usage ``gpu_cache_usage_perc``, vLLM
``kv_cache_usage_perc``):

* ``fastdeploy:kv_cache_usage_perc`` — fraction 0..1 of the KV blocks referenced by a
  running request or held for a splitwise hand-over; cached prefix blocks that no request
  references count as free (0 when idle);
* ``fastdeploy:num_kv_blocks_cached`` — blocks that hold a cached prompt prefix;
* ``fastdeploy:prefix_cache_queries_total`` / ``fastdeploy:prefix_cache_hits_total`` —
  prompt tokens looked up in the prefix cache / found there, at admission (vLLM v1's names;
  both 0 without ``cache_config.enable_prefix_caching``);
* ``fastdeploy:prefix_cache_hit_rate`` — hits / queries since start (0 before any query).

Splitwise (zero on a mixed instance):

* ``fastdeploy:splitwise_handed_off_total`` — prefill instance: requests handed to a decode
  instance after their first token and first drafts;
* ``fastdeploy:splitwise_first_round_draft_tokens_total`` /
  ``..._first_round_accepted_tokens_total`` — decode instance: drafts the prefill instance
  made that this instance's first verify round offered / accepted (they are also in the
  ``spec_decode`` counters);
* ``fastdeploy:splitwise_kv_transfers_total{transport}``, ``..._kv_transfer_bytes_total``,
  ``..._kv_transfer_seconds_total``, ``..._kv_transfer_failures_total`` — decode instance:
  KV block transfers from prefill instances (every target and MTP layer, every rank), one
  series per KV transport (``shm``, ``mooncake``, ``tcp``: the one each transfer used);
* ``fastdeploy:splitwise_kv_blocks_held`` — KV blocks out of circulation outside any slot:
  on a prefill instance those of handed-off requests no decode instance has copied yet, on
  a decode instance those an aborted request's transfer may still write;
* ``fastdeploy:num_kv_blocks_free`` — free KV blocks (every instance; cached prefix blocks
  no request references are free).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import NamedTuple

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ...credentials import DroppedMessages
from ...runtime.engine_metrics import Metrics
from ...runtime.scheduler import Scheduler
from .counters import ServerCounters, TransferCounts
from .families import PREFIX, counter, gauge
from .latency import HISTOGRAMS, Histogram, LatencyTracker
from .router_collector import DroppedCollector
from .speculation import guided_metrics, spec_decode_metrics


class EngineCollector(Collector):
    """Reads the engine's :class:`~fastdeploy_mtp.runtime.engine.Metrics` at scrape time."""

    def __init__(
        self,
        metrics: Metrics,
        scheduler: Scheduler,
        counters: ServerCounters,
        lock: threading.Lock,
        latency: LatencyTracker | None = None,
    ):
        self.metrics = metrics
        self.scheduler = scheduler
        self.counters = counters
        self.lock = lock  # the engine loop's lock: a scrape sees one step's counts, not half
        self.latency = latency

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            m = copy.deepcopy(self.metrics)
            sched = self.scheduler
            occupancy = Occupancy(
                len(sched.slots),
                len(sched.waiting),
                sum(len(b) for b in sched.held.values()),
                sched.num_free_blocks,
            )
            kv = KVCache.of(sched)
            histograms = self.latency.snapshot() if self.latency is not None else {}
        with self.counters.lock:
            c = copy.copy(self.counters)
            c.kv = copy.deepcopy(self.counters.kv)
        yield from spec_decode_metrics(m)
        yield from guided_metrics(m)
        yield from _request_metrics(m, occupancy, c)
        yield from _splitwise_metrics(m, occupancy, c)
        yield from _kv_cache_metrics(kv)
        yield from _latency_metrics(histograms)


class Occupancy(NamedTuple):
    """The scheduler's requests and blocks at scrape time."""

    running: int
    waiting: int
    held_blocks: int
    free_blocks: int


class KVCache(NamedTuple):
    """The KV blocks and the prefix cache's counts at scrape time."""

    total_blocks: int
    free_blocks: int
    cached_blocks: int
    queried_tokens: int
    hit_tokens: int

    @classmethod
    def of(cls, sched: Scheduler) -> KVCache:
        pool = sched.pool
        return cls(
            sched.total_blocks, pool.num_free, pool.num_cached, pool.queried_tokens, pool.hit_tokens
        )


def _request_metrics(m: Metrics, occupancy: Occupancy, c: ServerCounters) -> Iterator[Metric]:
    yield counter(
        "generation_tokens",
        "Generated tokens (first tokens of prefills included).",
        m.generated_tokens,
    )
    yield counter("prompt_tokens", "Prompt tokens of admitted requests.", c.prompt_tokens)
    yield counter("request_success", "Requests that completed.", c.success)
    yield counter("request_failure", "Requests that failed after admission.", c.failure)
    yield counter(
        "request_cancelled", "Requests aborted because their client disconnected.", c.cancelled
    )
    yield gauge("num_requests_running", "Requests holding a slot.", occupancy.running)
    yield gauge("num_requests_waiting", "Requests queued for a slot.", occupancy.waiting)


def _splitwise_metrics(m: Metrics, occupancy: Occupancy, c: ServerCounters) -> Iterator[Metric]:
    drafts = "Decode instance: drafts made on the prefill instance that the first verify round"
    for name, doc, value in (
        (
            "splitwise_handed_off",
            "Prefill instance: requests handed to a decode instance.",
            m.handed_off,
        ),
        ("splitwise_first_round_draft_tokens", f"{drafts} offered.", m.handoff_drafts_proposed),
        ("splitwise_first_round_accepted_tokens", f"{drafts} accepted.", m.handoff_drafts_accepted),
    ):
        yield counter(name, doc, value)
    yield from _transfer_metrics(c.kv)
    held_doc = (
        "KV blocks held outside any slot (prefill: handed off, not yet copied; decode: an "
        "aborted transfer's)."
    )
    yield gauge("splitwise_kv_blocks_held", held_doc, occupancy.held_blocks)
    yield gauge(
        "num_kv_blocks_free",
        "Free KV blocks (cached prefix blocks no request references included).",
        occupancy.free_blocks,
    )


def _kv_cache_metrics(kv: KVCache) -> Iterator[Metric]:
    used = kv.total_blocks - kv.free_blocks
    yield gauge(
        "kv_cache_usage_perc",
        "Fraction (0..1) of the KV blocks in use: referenced by a running request or held for a "
        "splitwise hand-over. Cached prefix blocks no request references count as free.",
        used / kv.total_blocks if kv.total_blocks else 0.0,
    )
    yield gauge(
        "num_kv_blocks_cached",
        "KV blocks holding a cached prompt prefix (referenced by a request or not).",
        kv.cached_blocks,
    )
    yield counter(
        "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", kv.queried_tokens
    )
    yield counter(
        "prefix_cache_hits",
        "Prompt tokens found in the prefix cache (their KV was reused).",
        kv.hit_tokens,
    )
    yield gauge(
        "prefix_cache_hit_rate",
        "Prefix cache hits / queries (prompt tokens) since start; 0 before any query.",
        kv.hit_tokens / kv.queried_tokens if kv.queried_tokens else 0.0,
    )


def _latency_metrics(histograms: dict[str, Histogram]) -> Iterator[Metric]:
    for name, h in histograms.items():
        doc = HISTOGRAMS[name][0]
        yield HistogramMetricFamily(PREFIX + name, doc, buckets=h.cumulative(), sum_value=h.sum)


def _transfer_metrics(kv: dict[str, TransferCounts]) -> Iterator[Metric]:
    """The KV-transfer counters, one series per transport (every registered one, zeros too)."""
    from ...splitwise.transport import transport_names

    names = sorted({*transport_names(), *kv})
    per = " Decode instance, per KV transport:"
    for name, doc, attr in (
        ("splitwise_kv_transfers", f"{per} completed KV block transfers.", "transfers"),
        (
            "splitwise_kv_transfer_bytes",
            f"{per} KV bytes received (all layers, all ranks).",
            "bytes",
        ),
        (
            "splitwise_kv_transfer_seconds",
            f"{per} wall seconds spent in KV transfers (failed ones too).",
            "seconds",
        ),
        ("splitwise_kv_transfer_failures", f"{per} KV transfers that failed.", "failures"),
    ):
        family = CounterMetricFamily(PREFIX + name, doc.strip(), labels=["transport"])
        for transport in names:
            family.add_metric([transport], getattr(kv.get(transport, TransferCounts()), attr))
        yield family


def make_registry(
    metrics: Metrics,
    scheduler: Scheduler,
    counters: ServerCounters,
    lock: threading.Lock,
    dropped: DroppedMessages | None = None,
    latency: LatencyTracker | None = None,
) -> CollectorRegistry:
    """The registry of ``serve``'s ``/metrics``: the engine's series and, given ``dropped``,
    the refused messages."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(metrics, scheduler, counters, lock, latency))
    if dropped is not None:
        registry.register(DroppedCollector(dropped))
    return registry
