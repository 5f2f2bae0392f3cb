"""``include_draft_logprobs`` through ``fastdeploy-mtp serve``: without it a choice has no
``draft_logprobs``; with it (and logprobs) every step that verified MTP drafts is listed with
its position and each draft's log-probability, the positions follow what the target accepted,
the streamed steps add up to the whole response's, and without speculation the list is empty.
The flag without logprobs is a 400 naming it, and the splitwise router refuses it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fastdeploy_mtp.models import ASSETS_DIR
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.serving.openai.app import create_app
from fastdeploy_mtp.serving.router.forwarding import Instances
from fastdeploy_mtp.serving.router.routing import RouterBackend
from fastdeploy_mtp.tokenization import load_tokenizer
from tests.support.servers import http_post as post

ASK = {"prompt": DEMO_PROMPTS[1], "max_tokens": 24, "logprobs": 0, "include_draft_logprobs": True}


def completion(url: str, body: dict[str, Any]) -> Any:
    status, answer = post(url + "/v1/completions", body)
    assert status == 200, answer
    return answer


def test_the_field_comes_only_with_the_flag(spec_server):
    plain = completion(spec_server.base_url, {**ASK, "include_draft_logprobs": False})["choices"][0]
    assert "draft_logprobs" not in plain and plain["logprobs"] is not None


def test_each_step_lists_its_verified_drafts_with_their_logprobs(spec_server):
    url = spec_server.base_url
    choice = completion(url, ASK)["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    steps = choice["draft_logprobs"]
    assert (
        steps and steps[0]["position"] == 1
    )  # the prefill step emits token 0 and verifies no drafts
    accepted_any = False
    for step, following in zip(steps, steps[1:]):
        drafts = step["drafts"]
        assert 1 <= len(drafts) <= 3
        for d in drafts:
            assert (
                isinstance(d["token_id"], int)
                and math.isfinite(d["logprob"])
                and d["logprob"] <= 0.0
            )
        accepted = 0
        for j, d in enumerate(drafts):
            if tokens[step["position"] + j] != d["token"]:
                break
            accepted += 1
        accepted_any = accepted_any or accepted > 0
        # the target emitted the accepted drafts and one token of its own: the next step starts
        # there
        assert following["position"] == step["position"] + accepted + 1
    assert accepted_any  # the trained MTP layer's drafts are accepted at times

    streamed: list[dict[str, Any]] = []
    for event in post(url + "/v1/completions", {**ASK, "stream": True})[1]:
        for ch in event["choices"]:
            streamed += ch.get("draft_logprobs", [])
    # the same steps and drafts; the log-probabilities to float32 rounding (the second request
    # hits the prefix cache, so its prefill sums over fewer rows)
    ids = [(s["position"], [d["token_id"] for d in s["drafts"]]) for s in steps]
    assert [(s["position"], [d["token_id"] for d in s["drafts"]]) for s in streamed] == ids
    logprobs = [d["logprob"] for s in steps for d in s["drafts"]]
    assert [d["logprob"] for s in streamed for d in s["drafts"]] == pytest.approx(
        logprobs, abs=1e-5
    )

    chat = {
        "messages": [{"role": "user", "content": DEMO_PROMPTS[1]}],
        "max_tokens": 12,
        "logprobs": True,
    }
    status, answer = post(url + "/v1/chat/completions", {**chat, "include_draft_logprobs": True})
    assert status == 200 and answer["choices"][0]["draft_logprobs"], answer


def test_without_speculation_the_list_is_empty(plain_server):
    choice = completion(plain_server.base_url, ASK)["choices"][0]
    assert choice["draft_logprobs"] == [] and len(choice["logprobs"]["tokens"]) == ASK["max_tokens"]


def test_the_flag_needs_logprobs(spec_server):
    status, answer = post(spec_server.base_url + "/v1/completions", {**ASK, "logprobs": None})
    assert status == 400 and answer["error"]["param"] == "include_draft_logprobs", answer


def test_the_router_refuses_the_flag():
    backend = RouterBackend(Instances(["http://127.0.0.1:9"], ["http://127.0.0.1:9"]))
    r = TestClient(create_app(backend, "m", load_tokenizer(ASSETS_DIR))).post(
        "/v1/completions", json=ASK
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "include_draft_logprobs", r.text
