"""The latency histograms and KV-cache gauges of ``/metrics``.

* :class:`~fastdeploy_mtp.serving.metrics.latency.LatencyTracker` on hand-made steps and a fake
  clock: which stage each histogram spans, what is observed for completed, one-token,
  failed, handed-off (prefill) and handed-over (decode) requests;
* an in-process :class:`~fastdeploy_mtp.serving.engine_client.engine_loop.AsyncEngine` with prefix
  caching on: per-request stages are ordered, a repeated long prompt hits the cache, the
  KV usage is 0 when idle;
* a real ``fastdeploy-mtp serve``: streamed and non-streamed requests are observed once
  each, the ``/metrics`` text parses, buckets are cumulative, every family has its HELP.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastdeploy_mtp.runtime.events import HandedOffRequest, StepEvents
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.serving.metrics.families import render
from fastdeploy_mtp.serving.metrics.latency import HISTOGRAMS, Histogram, LatencyTracker

TTFT, TPOT, E2E = (
    "time_to_first_token_seconds",
    "time_per_output_token_seconds",
    "e2e_request_latency_seconds",
)
QUEUE, PREFILL, DECODE = (
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def step(
    tracker: LatencyTracker, clock: FakeClock, start: float, end: float, in_slots, **events
) -> None:
    """One engine step from ``start`` to ``end`` (the tokens are already appended)."""
    clock.now = end
    tracker.after_step(start, in_slots, StepEvents(ran=True, **events))


def observed(tracker: LatencyTracker) -> dict[str, list[float]]:
    """Per histogram: [count, sum]."""
    return {name: [h.count, h.sum] for name, h in tracker.histograms.items()}


def test_histogram_buckets_are_inclusive_and_cumulative():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 3.0):
        h.observe(v)
    assert h.cumulative() == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert h.count == 5 and h.sum == pytest.approx(4.65)


def test_a_completed_request_spans_each_stage():
    clock = FakeClock()
    tracker = LatencyTracker(clock)
    req = Request("r", list(range(20)), max_tokens=7)
    clock.now = 1.0
    tracker.arrived(req)
    step(tracker, clock, 2.0, 3.0, [req])  # admitted, first prefill chunk: no token yet
    req.output_token_ids += [5]
    step(tracker, clock, 3.0, 4.0, [req], emitted=[(req, [5])])  # last chunk: the first token
    req.output_token_ids += [6, 7, 8]
    step(
        tracker, clock, 4.0, 5.0, [req], emitted=[(req, [])]
    )  # 3 tokens, held back from the stream
    req.output_token_ids += [9, 10, 11]
    step(tracker, clock, 5.0, 6.0, [], emitted=[(req, [6, 7, 8, 9, 10, 11])], finished=[req])
    t = req.timing
    assert t is not None and (t.arrival, t.scheduled, t.first_token, t.finished) == (
        1.0,
        2.0,
        4.0,
        6.0,
    )
    got = observed(tracker)
    assert got[QUEUE] == [1, 1.0]
    assert got[TTFT] == [1, 3.0]  # the step that generated the token, not the stream
    assert got[PREFILL] == [1, 2.0]
    assert got[E2E] == [1, 5.0]
    assert got[DECODE] == [1, 2.0]
    assert got[TPOT] == [1, pytest.approx((5.0 - 3.0) / (7 - 1))]  # (e2e - TTFT) / (tokens - 1)


def test_one_token_no_tpot_failed_and_unsubmitted_not_observed():
    clock = FakeClock()
    tracker = LatencyTracker(clock)
    one, bad = Request("one", [1, 2, 3], max_tokens=1), Request("bad", [1, 2, 3])
    direct = Request("direct", [1, 2, 3])  # run without the engine client: no timing
    for req in (one, bad):
        tracker.arrived(req)
    one.output_token_ids += [4]
    direct.output_token_ids += [4]
    clock.now = 0.5
    # admitted and finished in one step: never seen in a slot
    step(
        tracker, clock, 0.25, 0.5, [bad], finished=[one, direct], failed=[(bad, RuntimeError("x"))]
    )
    got = observed(tracker)
    assert got[E2E] == [1, 0.5] and got[TTFT] == [1, 0.5] and got[QUEUE] == [1, 0.25]
    assert got[DECODE] == [1, 0.0] and got[TPOT] == [0, 0.0]
    assert bad.timing is not None and bad.timing.finished is None


def test_splitwise_prefill_and_decode_instances():
    clock = FakeClock()
    prefill = LatencyTracker(clock)
    req = Request("p", [1, 2, 3, 4])
    prefill.arrived(req)
    req.output_token_ids += [9]
    step(prefill, clock, 1.0, 2.0, [], handed_off=[HandedOffRequest(req, {}, [0])])
    got = observed(prefill)
    assert got[QUEUE] == [1, 1.0] and got[TTFT] == [1, 2.0] and got[PREFILL] == [1, 1.0]
    assert got[E2E][0] == got[TPOT][0] == got[DECODE][0] == 0  # it finishes on the decode instance

    decode = LatencyTracker(clock)
    handed = Request("d", [1, 2, 3, 4])
    handed.output_token_ids = [9]  # the prefill instance's first token
    clock.now = 10.0
    decode.arrived(handed)
    step(decode, clock, 11.0, 12.0, [handed])  # admitted, awaiting its KV
    handed.output_token_ids += [5, 6]
    step(decode, clock, 13.0, 14.0, [handed])  # imported, first verify round here
    handed.output_token_ids += [7, 8, 9, 10]
    step(decode, clock, 14.0, 16.0, [], finished=[handed])
    got = observed(decode)
    assert got[TTFT][0] == got[PREFILL][0] == 0  # its first token came from the prefill instance
    assert got[QUEUE] == [1, 1.0] and got[E2E] == [1, 6.0] and got[DECODE] == [1, 2.0]
    assert got[TPOT] == [1, pytest.approx(2.0 / 4)]  # the 4 tokens after the first step here


# ---- an in-process engine client ------------------------------------------------------------


def unlabelled(text: str) -> dict[str, float]:
    """The unlabelled samples of a ``/metrics`` text, by sample name (``..._total``,
    ``..._count``, ``..._sum``)."""
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if not s.labels
    }


def test_in_process_stages_ordered_prefix_cache_hits_and_idle_usage(random_model):
    from fastdeploy_mtp.assembly import build_engine
    from fastdeploy_mtp.serving.engine_client.backend import stream_events
    from fastdeploy_mtp.serving.engine_client.engine_loop import AsyncEngine
    from tests.support.engines import make_config

    config = make_config(3, steps=1)
    config.cache_config.enable_prefix_caching = True
    engine = build_engine(config, *random_model)
    backend = AsyncEngine(engine, lambda reason: None)
    prompt = [(7 * i) % 50 + 3 for i in range(45)]  # 5 full cacheable blocks of 8
    reqs = [Request(f"r{i}", list(prompt), max_tokens=6) for i in range(3)]
    reqs.append(Request("other", [4, 5, 6], max_tokens=1))

    async def run() -> None:
        for req in reqs:  # one after the other: the repeats find the first one's blocks
            async for _ in stream_events(backend, backend.submit(req)):
                pass

    try:
        asyncio.run(asyncio.wait_for(run(), 120))
    finally:
        backend.stop()
    for req in reqs:
        t = req.timing
        assert t is not None and None not in (t.scheduled, t.first_token, t.finished), (
            req.request_id
        )
        assert t.arrival <= t.scheduled <= t.first_token <= t.finished  # queue <= TTFT <= e2e
    assert reqs[1].num_cached_tokens == reqs[2].num_cached_tokens == 40
    m = unlabelled(render(backend.registry).decode())
    p = "fastdeploy:"
    for name in HISTOGRAMS:
        want = 3 if name == TPOT else 4  # the one-token request has no time per output token
        assert m[p + name + "_count"] == want, name
    hits, queries = m[p + "prefix_cache_hits_total"], m[p + "prefix_cache_queries_total"]
    assert hits == 80 and queries == 3 * 45 + 3
    assert m[p + "prefix_cache_hit_rate"] == pytest.approx(hits / queries)
    assert m[p + "num_kv_blocks_cached"] == 5
    assert (
        m[p + "kv_cache_usage_perc"] == 0.0
    )  # idle: cached blocks no request references count as free
    assert m[p + "num_kv_blocks_free"] == config.cache_config.total_block_num


# ---- a real server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    from tests.support.servers import serving

    spec = '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1}'
    yield from serving(
        ["--speculative-config", spec, "--max-num-seqs", "4", "--no-enable-prefix-caching"]
    )


def test_served_requests_are_observed_once_each(server):
    from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
    from tests.support.servers import http_get, http_post

    url = server.base_url
    bodies = [
        {"prompt": DEMO_PROMPTS[0], "max_tokens": 12},
        {"prompt": DEMO_PROMPTS[1], "max_tokens": 12, "stream": True},
        {"prompt": DEMO_PROMPTS[2], "max_tokens": 1},  # one token: no time per output token
    ]
    for body in bodies:
        status, _ = http_post(url + "/v1/completions", {"model": "fastdeploy-mtp-tiny", **body})
        assert status == 200
    chat = {
        "model": "fastdeploy-mtp-tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
    }
    assert http_post(url + "/v1/chat/completions", {**chat, "stream": True})[0] == 200
    status, text = http_get(url + "/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    m = unlabelled(text)
    p = "fastdeploy:"
    assert m[p + "request_success_total"] == 4
    for name, (doc, buckets) in HISTOGRAMS.items():
        fam = fams[p + name]
        assert fam.type == "histogram" and fam.documentation == doc
        assert f"# HELP {p}{name} " in text
        want = 3 if name == TPOT else 4
        assert m[p + name + "_count"] == want and m[p + name + "_sum"] > 0, name
        counts = [s.value for s in fam.samples if s.name.endswith("_bucket")]
        assert len(counts) == len(buckets) + 1 and counts[-1] == want
        assert counts == sorted(counts), f"{name}: buckets not cumulative"
    assert m[p + QUEUE + "_sum"] <= m[p + TTFT + "_sum"] <= m[p + E2E + "_sum"]
    assert m[p + PREFILL + "_sum"] <= m[p + TTFT + "_sum"]
    assert m[p + "kv_cache_usage_perc"] == 0.0  # idle
    assert (
        m[p + "prefix_cache_queries_total"] == m[p + "prefix_cache_hit_rate"] == 0.0
    )  # --no-enable-prefix-caching
