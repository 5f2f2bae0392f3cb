"""``fastdeploy-mtp serve`` with the default configuration (the draft planner on): served texts
equal plain decoding's, pinned and free requests alike; ``/metrics`` counts the drafts by the
method that made them, summing to the drafts offered."""

from __future__ import annotations

import re

import pytest

from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from tests.support.servers import http_post, offline, scrape_metrics, serving

MAX_TOKENS = 40
BY_METHOD = "fastdeploy:spec_decode_num_draft_tokens_by_method_total"
ACCEPTED_BY_METHOD = "fastdeploy:spec_decode_num_accepted_tokens_by_method_total"


@pytest.fixture(scope="module")
def server():
    yield from serving([])


def by_method(metrics: dict[str, float], family: str) -> dict[str, float]:
    return {
        m[1]: v
        for k, v in metrics.items()
        if (m := re.fullmatch(family + r'\{method="(\w+)"\}', k))
    }


def complete(server, prompt: str, **extra):
    return http_post(
        server.base_url + "/v1/completions",
        {"model": "fastdeploy-mtp-tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, **extra},
        timeout=120,
    )


def test_planned_drafting_serves_plain_decodings_text_and_counts_drafts_by_method(server):
    """Requests one after another, /metrics read around each: a pinned request's drafts are
    its method's only (``"none"``: no drafts), and the per-method counts sum to the drafts
    offered. (Whether the planner drafts at all follows this host's step times, so the counts
    themselves are not asserted, only where they go.)"""
    prompts = DEMO_PROMPTS[:4]
    want = offline(prompts, '{"method": null}', MAX_TOKENS)
    drafts = 'fastdeploy:spec_decode_num_draft_tokens_total{method="mtp"}'
    first = scrape_metrics(server.base_url)
    for prompt, text, pin in zip(prompts, want, [None, "suffix", "ngram", "none"]):
        before = scrape_metrics(server.base_url)
        status, body = complete(
            server, prompt, **({} if pin is None else {"speculative_method": pin})
        )
        assert status == 200, body
        assert body["choices"][0]["text"] == text, pin
        after = scrape_metrics(server.base_url)
        grown = {
            k: v - by_method(before, BY_METHOD).get(k, 0.0)
            for k, v in by_method(after, BY_METHOD).items()
            if v > by_method(before, BY_METHOD).get(k, 0.0)
        }
        if pin is not None:
            assert set(grown) <= ({pin} if pin != "none" else set()), (pin, grown)
        assert sum(grown.values()) == after[drafts] - before.get(drafts, 0.0)
    log = server.output()
    assert "MTP K=3 S=1 +ngram adaptive" in log, log
    assert after[drafts] > first.get(drafts, 0.0)  # the planner's first measurements draft
    accepted = by_method(after, ACCEPTED_BY_METHOD)
    assert all(accepted[k] <= by_method(after, BY_METHOD)[k] for k in accepted)


def test_a_pin_the_engine_cannot_honour_is_a_400_naming_the_field(server):
    status, body = complete(server, "x", speculative_method="eagle")
    assert status == 400 and body["error"]["param"] == "speculative_method", body
