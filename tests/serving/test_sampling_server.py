"""Sampling at ``temperature > 0`` through ``fastdeploy-mtp serve`` and the splitwise router:
OpenAI's sampling fields map to the engine's ``SamplingParams``, a seeded request gets the same
tokens with and without speculation (and from the offline engine), logprobs come in OpenAI's
shapes, stop strings end the text, and invalid values are a 400 naming the field.

Every server is stopped with SIGTERM and must exit 0 leaving nothing behind
(:func:`~tests.support.servers.stopped_cleanly`).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from fastdeploy_mtp.runtime.sampling_params import SamplingParams  # noqa: E402
from tests.support.servers import (  # noqa: E402
    ServerProcess,
    http_post as post,  # noqa: E402
    splitwise_instances,
    splitwise_router,
    stopped_cleanly,
)

MODEL = "fastdeploy-mtp-tiny"
MTP3 = '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 3}'
NO_SPEC = '{"method": null}'
MAX_TOKENS = 24
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 7}
PROMPTS = DEMO_PROMPTS[:3]


def offline_requests(
    prompts: list[str], sampling: SamplingParams, spec: str = MTP3, max_tokens: int = MAX_TOKENS
):
    """The offline engine's finished requests (the reference)."""
    from fastdeploy_mtp.config import SpeculativeConfig
    from fastdeploy_mtp.entrypoints.offline import run_requests

    reqs, texts, _ = run_requests(
        prompts, max_tokens, SpeculativeConfig.from_json(spec), 4, "offline", None, sampling
    )
    return reqs, texts


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def complete(url: str, prompt: str, stream: bool = False, **fields: Any) -> tuple[str, str, Any]:
    """(text, finish_reason, logprobs as a dict or None) of one completion, streamed or not
    (streamed: the chunks' texts and logprobs concatenated)."""
    c = client(url)
    extra = {
        k: fields.pop(k)
        for k in ("top_k", "min_p", "repetition_penalty", "stop_token_ids")
        if k in fields
    }
    fields.setdefault("max_tokens", MAX_TOKENS)
    r = c.completions.create(
        model=MODEL, prompt=prompt, stream=stream, extra_body=extra or None, **fields
    )
    if not stream:
        ch = r.choices[0]
        return ch.text, ch.finish_reason, None if ch.logprobs is None else ch.logprobs.model_dump()
    text, reason, lp = "", None, None
    for chunk in r:
        ch = chunk.choices[0]
        text += ch.text
        reason = ch.finish_reason or reason
        if ch.logprobs is not None:
            d = ch.logprobs.model_dump()
            lp = d if lp is None else {k: lp[k] + d[k] for k in lp}
    return text, reason, lp


# ---- seeded sampling -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def expected_sampled():
    reqs, texts = offline_requests(PROMPTS, SamplingParams(**SAMPLED))
    greedy = offline_requests(PROMPTS, SamplingParams())[1]
    assert texts != greedy, "temperature 0.8 should change some output of the tiny model"
    return texts


def test_seeded_sample_equals_with_and_without_speculation_and_offline(
    spec_server, plain_server, expected_sampled
):
    for prompt, want in zip(PROMPTS, expected_sampled):
        for srv in (spec_server, plain_server):
            text, reason, lp = complete(srv.base_url, prompt, **SAMPLED)
            assert (text, reason, lp) == (want, "length", None)
        streamed = complete(spec_server.base_url, prompt, stream=True, **SAMPLED)
        assert streamed[:2] == (want, "length")


def test_a_different_seed_samples_differently(spec_server, expected_sampled):
    others = [complete(spec_server.base_url, p, **{**SAMPLED, "seed": 8})[0] for p in PROMPTS]
    assert others != expected_sampled


def test_vllm_extra_fields_reach_the_sampler(spec_server, plain_server):
    fields = {"temperature": 1.0, "seed": 3, "top_k": 1, "repetition_penalty": 1.0, "min_p": 0.0}
    greedy = complete(spec_server.base_url, PROMPTS[0])[0]
    # top_k 1 keeps only the argmax: sampling at any temperature is greedy decoding
    assert complete(spec_server.base_url, PROMPTS[0], **fields)[0] == greedy
    assert complete(plain_server.base_url, PROMPTS[0], **fields)[0] == greedy


# ---- logprobs ------------------------------------------------------------------------------
def check_completion_logprobs(lp: dict[str, Any], text: str, n: int, k: int) -> None:
    assert (
        len(lp["tokens"])
        == len(lp["token_logprobs"])
        == len(lp["top_logprobs"])
        == len(lp["text_offset"])
        == n
    )
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert all(o <= len(text) for o in lp["text_offset"])
    for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert value <= 0.0 and math.isfinite(value)
        assert 1 <= len(top) <= k  # bytes of multi-byte characters all decode to U+FFFD alone
        best = max(top.values())
        assert value <= best + 1e-5, "the top logprobs are the most likely tokens"
        if tok in top and tok != "\ufffd":
            assert top[tok] == pytest.approx(value, abs=1e-5)


def test_completion_logprobs_shapes_and_equal_with_and_without_speculation(
    spec_server, plain_server
):
    got = {}
    for name, srv in (("spec", spec_server), ("plain", plain_server)):
        text, reason, lp = complete(srv.base_url, PROMPTS[1], logprobs=3, **SAMPLED)
        check_completion_logprobs(lp, text, MAX_TOKENS, 3)
        assert "".join(lp["tokens"]) == text or "\ufffd" in "".join(lp["tokens"])
        got[name] = (text, lp)
        streamed = complete(srv.base_url, PROMPTS[1], stream=True, logprobs=3, **SAMPLED)
        assert streamed[0] == text and streamed[2]["tokens"] == lp["tokens"]
        assert streamed[2]["text_offset"] == lp["text_offset"]
        # to float32 rounding: the streamed request hits the prefix cache, so its prefill sums
        # over fewer rows than the first one's
        assert streamed[2]["token_logprobs"] == pytest.approx(lp["token_logprobs"], abs=1e-5)
    (t1, a), (t2, b) = got["spec"], got["plain"]
    assert t1 == t2 and a["tokens"] == b["tokens"]
    assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-4)
    for x, y in zip(a["top_logprobs"], b["top_logprobs"]):
        assert x.keys() == y.keys() and [x[t] for t in x] == pytest.approx(
            [y[t] for t in x], abs=1e-4
        )


def test_chat_logprobs_in_openai_shape_streamed_and_not(spec_server):
    c = client(spec_server.base_url)
    messages = [{"role": "user", "content": "def add(a, b):"}]
    kw = dict(
        model=MODEL, messages=messages, max_tokens=12, logprobs=True, top_logprobs=2, **SAMPLED
    )
    r = c.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 12
    for entry in content:
        assert entry.logprob <= 0.0 and len(entry.bytes) == 1
        assert entry.token == bytes(entry.bytes).decode("utf-8", errors="replace")
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob <= entry.top_logprobs[0].logprob + 1e-5
    assert (
        bytes(b for e in content for b in e.bytes).decode("utf-8", errors="replace")
        == r.choices[0].message.content
    )
    streamed = []
    for chunk in c.chat.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed.extend(chunk.choices[0].logprobs.content)
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-6)
    # without logprobs: none
    plain = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert plain.choices[0].logprobs is None


# ---- stop ----------------------------------------------------------------------------------
def test_a_stop_string_ends_the_text_before_it(spec_server):
    full = complete(spec_server.base_url, PROMPTS[0], **SAMPLED)[0]
    stop = full[10:13]
    assert stop and full.index(stop) <= 10
    want = full[: full.index(stop)]
    for stream in (False, True):
        text, reason, _ = complete(
            spec_server.base_url, PROMPTS[0], stream=stream, stop=stop, **SAMPLED
        )
        assert (text, reason) == (want, "stop")
    text, reason, _ = complete(
        spec_server.base_url, PROMPTS[0], stop=["\x00never", stop], **SAMPLED
    )
    assert (text, reason) == (want, "stop")


def test_a_stop_token_id_ends_the_output_after_it(spec_server):
    full = complete(spec_server.base_url, PROMPTS[0])[0]
    stop_id = full.encode()[5]
    want = full.encode()[: full.encode().index(stop_id) + 1].decode()
    text, reason, _ = complete(spec_server.base_url, PROMPTS[0], stop_token_ids=[stop_id])
    assert (text, reason) == (want, "stop")


# ---- invalid values ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, body, param",
    [
        ("completions", {"temperature": -0.5}, "temperature"),
        ("completions", {"top_p": 1.5}, "top_p"),
        ("completions", {"top_p": 0}, "top_p"),
        ("completions", {"top_k": -3}, "top_k"),
        ("completions", {"min_p": 2}, "min_p"),
        ("completions", {"presence_penalty": 2.5}, "presence_penalty"),
        ("completions", {"frequency_penalty": -3}, "frequency_penalty"),
        ("completions", {"repetition_penalty": 0}, "repetition_penalty"),
        ("completions", {"seed": -1}, "seed"),
        ("completions", {"logprobs": 21}, "logprobs"),
        ("completions", {"stop": [""]}, "stop"),
        ("completions", {"stop_token_ids": [-2]}, "stop_token_ids"),
        ("completions", {"min_tokens": -1}, "min_tokens"),
        ("completions", {"n": 0}, "n"),
        ("completions", {"n": 2, "best_of": 1}, "best_of"),
        ("completions", {"echo": True}, "echo"),
        ("completions", {"logit_bias": {"65": 5}}, "logit_bias"),
        ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("chat/completions", {"n": 0}, "n"),
        ("chat/completions", {"temperature": "hot"}, "temperature"),
    ],
)
def test_invalid_sampling_values_get_a_400_naming_the_field(spec_server, path, body, param):
    base = (
        {"prompt": "x"}
        if path == "completions"
        else {"messages": [{"role": "user", "content": "x"}]}
    )
    status, answer = post(f"{spec_server.base_url}/v1/{path}", {**base, "max_tokens": 4, **body})
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer


def test_a_greedy_verify_strategy_refuses_temperature():
    srv = ServerProcess(["--speculative-config", MTP3[:-1] + ', "verify_strategy": "greedy"}'])
    try:
        status, answer = post(srv.base_url + "/v1/completions", {"prompt": "x", "temperature": 0.5})
        assert status == 400 and answer["error"]["param"] == "temperature", answer
        assert "verify_strategy" in answer["error"]["message"]
        assert post(srv.base_url + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
    except BaseException:
        srv.kill()
        raise
    stopped_cleanly(srv)


# ---- through the splitwise router ----------------------------------------------------------
def test_sampling_stop_and_logprobs_through_the_router_equal_mixed(spec_server, expected_sampled):
    with (
        splitwise_instances(("prefill", MTP3), ("decode", MTP3)) as (p, d),
        splitwise_router(p, d) as url,
    ):
        for prompt, want in zip(PROMPTS[:2], expected_sampled):
            assert complete(url, prompt, **SAMPLED)[:2] == (want, "length")
            assert complete(url, prompt, stream=True, **SAMPLED)[:2] == (want, "length")
        mixed = complete(spec_server.base_url, PROMPTS[1], logprobs=2, **SAMPLED)
        routed = complete(url, PROMPTS[1], logprobs=2, **SAMPLED)
        assert routed[0] == mixed[0] and routed[2]["tokens"] == mixed[2]["tokens"]
        assert routed[2]["token_logprobs"] == pytest.approx(mixed[2]["token_logprobs"], abs=1e-4)
        assert routed[2]["text_offset"] == mixed[2]["text_offset"]
        stop = expected_sampled[0][8:11]
        want = expected_sampled[0][: expected_sampled[0].index(stop)]
        assert complete(url, PROMPTS[0], stop=stop, **SAMPLED)[:2] == (want, "stop")
        status, answer = post(url + "/v1/completions", {"prompt": "x", "top_p": 7})
        assert status == 400 and answer["error"]["param"] == "top_p", answer
