"""``/metrics``: the engine's counters in Prometheus text format (``prometheus_client``).

Speculative decoding, under FastDeploy's ``fastdeploy:spec_decode_*`` prefix with vLLM's
metric names after it:

* ``fastdeploy:spec_decode_num_draft_tokens_total`` — drafts offered to the target for
  verification (placeholders not counted);
* ``fastdeploy:spec_decode_num_accepted_tokens_total`` — drafts the target accepted;
* ``..._per_pos_total{position="i"}`` — the same per draft position ``i = 1..K``. A draft at
  position ``i`` is only accepted if the drafts before it were, so accepted / offered at ``i``
  is cumulative (the share of rounds whose drafts ``1..i`` were all accepted), and accepted at
  ``i`` / accepted at ``i - 1`` is the rate conditional on draft ``i - 1`` having been
  accepted;
* ``fastdeploy:spec_decode_num_emitted_tokens_total`` — tokens emitted by decode steps
  (accepted drafts plus the target's own token per step);
* ``fastdeploy:spec_decode_num_decode_steps_total`` — (request, target forward) pairs that
  decoded;
* ``fastdeploy:spec_decode_mean_accepted_length`` — emitted / decode steps: tokens per
  request per target forward (1.0 = no gain from speculation).

Every speculation series carries a ``method`` label, the engine's
``speculative_config.method`` (``"mtp"``, ``"ngram"``, ``"suffix"``, ``"naive"``, or
``"none"`` without speculation), e.g. ``fastdeploy:spec_decode_num_draft_tokens_total{method="ngram"}``.
Structured output (``response_format``, ``guided_*``; see :mod:`~fastdeploy_mtp.runtime.guided`):

* ``fastdeploy:guided_drafts_checked_total`` — drafts of constrained requests checked against
  their grammar before verification;
* ``fastdeploy:guided_drafts_cut_total`` — of those, drafts cut before verification (past the
  longest grammar-valid prefix); they are not in the ``spec_decode`` counters;
* ``fastdeploy:guided_seconds_total`` — host seconds in grammar work (draft checks, token
  masks, advancing the matchers);
* ``fastdeploy:guided_rounds_total`` — target steps that did grammar work: seconds / rounds
  is the grammar overhead per round.

Plus request counters (``fastdeploy:request_success_total``, ``..._failure_total``,
``..._cancelled_total`` for clients that disconnected),
prompt/generation token counters, and running/waiting gauges.

Latency histograms (vLLM's names; seconds of ``time.monotonic()``, buckets from 1 ms to 10
minutes, 0.5 ms to 10 s for the time per output token). The stages and which requests are
observed are defined in :mod:`~fastdeploy_mtp.serving.latency`; in short, each is observed
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

import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..credentials import DroppedMessages
from ..runtime.engine_metrics import Metrics
from ..runtime.scheduler import Scheduler
from .latency import HISTOGRAMS, Histogram, LatencyTracker

PREFIX = "fastdeploy:"


@dataclass
class RequestCounters:
    """How requests ended: finished (stop or length), failed, or abandoned by their client."""

    success: int = 0
    failure: int = 0
    cancelled: int = 0


@dataclass
class ServerCounters(RequestCounters):
    """Request-level counters the API server keeps (under :attr:`lock`)."""

    prompt_tokens: int = 0
    #: KV transfers of a decode instance, per transport name
    kv: dict[str, TransferCounts] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count_transfer(self, transport: str, nbytes: int | None, seconds: float) -> None:
        """One KV transfer over ``transport`` ended after ``seconds``: ``nbytes`` moved, or
        ``None`` when it failed. Takes :attr:`lock`."""
        with self.lock:
            counts = self.kv.setdefault(transport, TransferCounts())
            if nbytes is None:
                counts.failures += 1
            else:
                counts.transfers += 1
                counts.bytes += nbytes
            counts.seconds += seconds


@dataclass
class TransferCounts:
    """KV transfers over one transport."""

    transfers: int = 0
    bytes: int = 0
    seconds: float = 0.0
    failures: int = 0


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
        yield from _spec_decode_metrics(m)
        yield from _guided_metrics(m)
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


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _spec_decode_metrics(m: Metrics) -> Iterator[Metric]:
    """The speculation series, each labelled with the engine's drafting ``method``."""
    proposed, accepted = [int(v) for v in m.proposed], [int(v) for v in m.accepted]
    method = [m.method]

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(PREFIX + name, doc, labels=["method"])
        family.add_metric(method, value)
        return family

    yield counter(
        "spec_decode_num_draft_tokens",
        "Draft tokens offered to the target for verification, by drafting method.",
        sum(proposed),
    )
    yield counter(
        "spec_decode_num_accepted_tokens",
        "Draft tokens the target accepted, by drafting method.",
        sum(accepted),
    )
    per_pos = CounterMetricFamily(
        PREFIX + "spec_decode_num_draft_tokens_per_pos",
        "Draft tokens offered at each draft position (1 = first draft), by drafting method.",
        labels=["method", "position"],
    )
    acc_pos = CounterMetricFamily(
        PREFIX + "spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens accepted at each draft position, by drafting method. A draft at position i is accepted "
        "only if drafts 1..i-1 were: accepted/offered at i is cumulative, accepted(i)/accepted(i-1) the rate "
        "conditional on draft i-1 being accepted.",
        labels=["method", "position"],
    )
    for i, (p, a) in enumerate(zip(proposed, accepted), start=1):
        per_pos.add_metric([m.method, str(i)], p)
        acc_pos.add_metric([m.method, str(i)], a)
    yield per_pos
    yield acc_pos
    emitted_doc = (
        "Tokens emitted by decode steps (accepted drafts + the target's own token per step), "
        "by drafting method."
    )
    yield counter("spec_decode_num_emitted_tokens", emitted_doc, m.emitted_tokens)
    yield counter(
        "spec_decode_num_decode_steps",
        "(request, target forward) pairs that decoded, by drafting method.",
        m.decode_item_steps,
    )
    gauge = GaugeMetricFamily(
        PREFIX + "spec_decode_mean_accepted_length",
        "Emitted tokens per decoding request per target forward (1.0 = no speculation gain), by drafting method.",
        labels=["method"],
    )
    gauge.add_metric(method, m.mean_accepted_length)
    yield gauge


def _guided_metrics(m: Metrics) -> Iterator[Metric]:
    for name, doc, value in (
        (
            "guided_drafts_checked",
            "Drafts of grammar-constrained requests checked against their grammar before verification.",
            m.guided_drafts_checked,
        ),
        (
            "guided_drafts_cut",
            "Drafts of grammar-constrained requests cut before verification (past the grammar-valid prefix).",
            m.guided_drafts_cut,
        ),
        (
            "guided_seconds",
            "Host seconds in grammar work (draft checks, token masks, matchers).",
            m.guided_seconds,
        ),
        (
            "guided_rounds",
            "Target steps that did grammar work (a constrained request ran).",
            m.guided_rounds,
        ),
    ):
        yield _counter(name, doc, value)


def _request_metrics(m: Metrics, occupancy: Occupancy, c: ServerCounters) -> Iterator[Metric]:
    yield _counter(
        "generation_tokens",
        "Generated tokens (first tokens of prefills included).",
        m.generated_tokens,
    )
    yield _counter("prompt_tokens", "Prompt tokens of admitted requests.", c.prompt_tokens)
    yield _counter("request_success", "Requests that completed.", c.success)
    yield _counter("request_failure", "Requests that failed after admission.", c.failure)
    yield _counter(
        "request_cancelled", "Requests aborted because their client disconnected.", c.cancelled
    )
    yield _gauge("num_requests_running", "Requests holding a slot.", occupancy.running)
    yield _gauge("num_requests_waiting", "Requests queued for a slot.", occupancy.waiting)


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
        yield _counter(name, doc, value)
    yield from _transfer_metrics(c.kv)
    held_doc = "KV blocks held outside any slot (prefill: handed off, not yet copied; decode: an aborted transfer's)."
    yield _gauge("splitwise_kv_blocks_held", held_doc, occupancy.held_blocks)
    yield _gauge(
        "num_kv_blocks_free",
        "Free KV blocks (cached prefix blocks no request references included).",
        occupancy.free_blocks,
    )


def _kv_cache_metrics(kv: KVCache) -> Iterator[Metric]:
    used = kv.total_blocks - kv.free_blocks
    yield _gauge(
        "kv_cache_usage_perc",
        "Fraction (0..1) of the KV blocks in use: referenced by a running request or held for a splitwise "
        "hand-over. Cached prefix blocks no request references count as free.",
        used / kv.total_blocks if kv.total_blocks else 0.0,
    )
    yield _gauge(
        "num_kv_blocks_cached",
        "KV blocks holding a cached prompt prefix (referenced by a request or not).",
        kv.cached_blocks,
    )
    yield _counter(
        "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", kv.queried_tokens
    )
    yield _counter(
        "prefix_cache_hits",
        "Prompt tokens found in the prefix cache (their KV was reused).",
        kv.hit_tokens,
    )
    yield _gauge(
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
    from ..splitwise.transport import transport_names

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


@dataclass
class RouterCounters(RequestCounters):
    """What the router counts (read and written on the event loop only): besides how the
    requests it routed ended, how many it routed and how often a full decode instance made
    one wait."""

    routed: int = 0
    decode_retries: int = 0


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
                "Routed requests that ended with an error (an instance refused, failed or was unreachable, "
                "or no decode instance had room within the queue timeout).",
                c.failure,
            ),
            (
                "router_requests_cancelled",
                "Routed requests abandoned because their client disconnected.",
                c.cancelled,
            ),
            (
                "router_decode_retries",
                "Decode attempts a full decode instance answered with 429 (the request waited and was retried).",
                c.decode_retries,
            ),
        ):
            yield _counter(name, doc, value)


class DroppedCollector(Collector):
    """``fastdeploy:dropped_messages_total{channel}`` from a :class:`DroppedMessages`."""

    def __init__(self, dropped: DroppedMessages):
        self.dropped = dropped

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            PREFIX + "dropped_messages",
            "Messages refused because the sender proved no credential or they were not the awaited answer "
            "(worker: engine<->worker socket; kv: KV port; http: Authorization; handoff: hand-over signature "
            "or contents). None of them failed a request.",
            labels=["channel"],
        )
        for channel, n in self.dropped.counts().items():
            family.add_metric([channel], n)
        yield family


def make_registry(
    metrics: Metrics,
    scheduler: Scheduler,
    counters: ServerCounters,
    lock: threading.Lock,
    dropped: DroppedMessages | None = None,
    latency: LatencyTracker | None = None,
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(metrics, scheduler, counters, lock, latency))
    if dropped is not None:
        registry.register(DroppedCollector(dropped))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
