"""``fastdeploy-mtp serve`` with a model-free drafting method (suffix decoding) through the
worker processes: served texts equal the offline engine's without speculation, the start-up
line names the method, ``/metrics`` labels the speculation series with it, and no MTP cache
is made."""

from __future__ import annotations

import re

import pytest

from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from tests.support.servers import http_post, offline, scrape_metrics, serving

MAX_TOKENS = 24
SPEC = '{"method": "suffix", "num_speculative_tokens": 3}'


@pytest.fixture(scope="module")
def server():
    yield from serving(["--speculative-config", SPEC])


def test_suffix_decoding_serves_the_non_speculative_output(server):
    prompts = DEMO_PROMPTS[:3]
    want = offline(prompts, '{"method": null}', MAX_TOKENS)
    for prompt, text in zip(prompts, want):
        status, body = http_post(
            server.base_url + "/v1/completions",
            {"model": "fastdeploy-mtp-tiny", "prompt": prompt, "max_tokens": MAX_TOKENS},
            timeout=120,
        )
        assert status == 200, body
        assert body["choices"][0]["text"] == text
    log = server.output()
    assert "suffix K=3" in log, log
    assert re.search(r"KV caches published \(\d+ target \+ 0 MTP", log), log
    m = scrape_metrics(server.base_url)
    assert (
        m['fastdeploy:spec_decode_num_decode_steps_total{method="suffix"}']
        >= len(prompts) * (MAX_TOKENS - 1) / 4
    )
    assert m['fastdeploy:spec_decode_num_draft_tokens_total{method="suffix"}'] > 0


@pytest.mark.parametrize(
    "pin, status",
    [("suffix", 200), ("none", 400), ("mtp", 400), ("ngram", 400), ("fast", 400), (3, 400)],
)
def test_a_request_pins_only_a_method_the_engine_offers(server, pin, status):
    """Without the draft planner this engine drafts with suffix decoding only: pinning it is
    accepted, anything else is a 400 naming the field (``"none"`` too: nothing would honour
    it)."""
    code, body = http_post(
        server.base_url + "/v1/completions",
        {"model": "fastdeploy-mtp-tiny", "prompt": "x", "max_tokens": 2, "speculative_method": pin},
        timeout=60,
    )
    assert code == status, body
    if status == 400:
        assert body["error"]["param"] == "speculative_method", body
