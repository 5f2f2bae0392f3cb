"""``n`` choices and ``best_of`` candidates through ``fastdeploy-mtp serve``: each choice is its
own engine request whose seed is ``choice_seed(seed, i)``, so choice 0 is the one-choice
response, choice ``i`` the one-choice response with seed ``seed + i``, with and without
speculation; streamed choices reassemble to the non-streamed ones; ``best_of`` returns the
candidates with the highest cumulative logprob; invalid counts are a 400 naming the field.
A scripted backend (no engine) shows that one failing choice fails the whole response and
cancels the other choices' requests, as a client disconnect does; the engine thread never
runs a request cancelled before it was admitted. The splitwise router serves them too (and
lists of prompts, n choices each).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi.testclient import TestClient

openai = pytest.importorskip("openai")

from fastdeploy_mtp.models import ASSETS_DIR  # noqa: E402
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from fastdeploy_mtp.runtime.request import Request  # noqa: E402
from fastdeploy_mtp.runtime.sampling_params import choice_seed  # noqa: E402
from fastdeploy_mtp.serving.engine_client.backend import Stream  # noqa: E402
from fastdeploy_mtp.serving.openai.app import create_app  # noqa: E402
from fastdeploy_mtp.serving.openai.protocol import MAX_CHOICES, APIError  # noqa: E402
from fastdeploy_mtp.serving.openai.text import emitted_of  # noqa: E402
from fastdeploy_mtp.tokenization import load_tokenizer  # noqa: E402
from tests.support.scripted_backend import ScriptedBackend  # noqa: E402
from tests.support.servers import (  # noqa: E402
    http_post as post,
    splitwise_instances,
    splitwise_router,
)

MODEL = "fastdeploy-mtp-tiny"
MTP3 = '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 3}'
PROMPT = DEMO_PROMPTS[0]
SAMPLED: dict[str, Any] = {"temperature": 0.9, "max_tokens": 20}
SEED = 11


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def completion(url: str, **fields: Any) -> Any:
    extra = {k: fields.pop(k) for k in ("best_of",) if k in fields}
    fields.setdefault("prompt", PROMPT)
    return client(url).completions.create(model=MODEL, extra_body=extra or None, **fields)


def texts(response: Any) -> list[str]:
    assert [c.index for c in response.choices] == list(range(len(response.choices)))
    return [c.text for c in response.choices]


# ---- n: per-choice seeds -----------------------------------------------------------------------
def test_choice_i_is_the_one_choice_response_with_choice_i_seed(spec_server, plain_server):
    url = spec_server.base_url
    many = completion(url, n=3, seed=SEED, **SAMPLED)
    got = texts(many)
    singles = [completion(url, n=1, seed=choice_seed(SEED, i), **SAMPLED) for i in range(3)]
    assert got == [s.choices[0].text for s in singles]
    assert (
        got[0] == completion(url, seed=SEED, **SAMPLED).choices[0].text
    )  # n never changes choice 0
    assert len(set(got)) == 3, got  # different seeds sample different texts
    assert [c.finish_reason for c in many.choices] == [s.choices[0].finish_reason for s in singles]
    assert many.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert many.usage.total_tokens == many.usage.prompt_tokens + many.usage.completion_tokens
    # speculation settles more tokens per step but samples the same seeded choices
    assert texts(completion(plain_server.base_url, n=3, seed=SEED, **SAMPLED)) == got


def test_chat_choices_follow_the_same_seeds(spec_server):
    c = client(spec_server.base_url)
    messages = [{"role": "user", "content": PROMPT}]
    many = c.chat.completions.create(model=MODEL, messages=messages, n=2, seed=SEED, **SAMPLED)
    assert [ch.index for ch in many.choices] == [0, 1]
    singles = [
        c.chat.completions.create(
            model=MODEL, messages=messages, seed=choice_seed(SEED, i), **SAMPLED
        )
        for i in range(2)
    ]
    assert [ch.message.content for ch in many.choices] == [
        s.choices[0].message.content for s in singles
    ]
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)


def test_greedy_choices_are_identical_and_unseeded_ones_differ(spec_server):
    url = spec_server.base_url
    greedy = texts(completion(url, n=3, max_tokens=12))
    assert greedy == [completion(url, max_tokens=12).choices[0].text] * 3
    unseeded = texts(completion(url, n=3, **{**SAMPLED, "temperature": 1.0}))
    assert len(set(unseeded)) > 1, unseeded  # each choice's seed derives from its own request id


# ---- streaming -------------------------------------------------------------------------------
def test_streamed_choices_reassemble_to_the_whole_ones(spec_server):
    url = spec_server.base_url
    whole = completion(url, n=2, seed=SEED, **SAMPLED)
    stream = completion(
        url, n=2, seed=SEED, stream=True, stream_options={"include_usage": True}, **SAMPLED
    )
    got, reasons, usage = ["", ""], [[], []], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            got[ch.index] += ch.text
            if ch.finish_reason is not None:
                reasons[ch.index].append(ch.finish_reason)
    assert got == texts(whole)
    assert reasons == [[c.finish_reason] for c in whole.choices]  # one finish chunk per choice
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

    c = client(url)
    messages = [{"role": "user", "content": PROMPT}]
    chat = c.chat.completions.create(model=MODEL, messages=messages, n=2, seed=SEED, **SAMPLED)
    parts, roles, finishes = ["", ""], [0, 0], [0, 0]
    for chunk in c.chat.completions.create(
        model=MODEL, messages=messages, n=2, seed=SEED, stream=True, **SAMPLED
    ):
        for ch in chunk.choices:
            parts[ch.index] += ch.delta.content or ""
            roles[ch.index] += ch.delta.role == "assistant"
            finishes[ch.index] += ch.finish_reason is not None
    assert parts == [ch.message.content for ch in chat.choices]
    assert roles == finishes == [1, 1]


# ---- best_of ---------------------------------------------------------------------------------
def test_best_of_returns_the_candidates_with_the_highest_cumulative_logprob(spec_server):
    url = spec_server.base_url
    candidates = []
    for k in range(3):
        one = completion(url, seed=choice_seed(SEED, k), logprobs=0, **SAMPLED).choices[0]
        candidates.append((sum(one.logprobs.token_logprobs), one.text))
    ranked = [text for _, text in sorted(candidates, key=lambda c: -c[0])]
    assert len(set(ranked)) == 3, candidates

    best = completion(url, best_of=3, n=1, seed=SEED, **SAMPLED)
    assert texts(best) == ranked[:1]
    assert best.choices[0].logprobs is None  # ranked by logprobs the client did not ask for
    two = completion(url, best_of=3, n=2, seed=SEED, logprobs=1, **SAMPLED)
    assert texts(two) == ranked[:2]
    assert [len(c.logprobs.top_logprobs[0]) for c in two.choices] == [1, 1]
    # usage counts the returned choices only
    assert two.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in two.choices)


# ---- the splitwise router: the same fan-out, one routed request per choice ---------------------
def test_the_router_serves_n_choices_and_best_of(spec_server):
    want = texts(completion(spec_server.base_url, n=2, seed=SEED, **SAMPLED))
    best = texts(completion(spec_server.base_url, best_of=3, seed=SEED, **SAMPLED))
    prompts = [PROMPT, DEMO_PROMPTS[1]]  # a list of prompts: n choices each
    listed = texts(completion(spec_server.base_url, prompt=prompts, n=2, seed=SEED, **SAMPLED))
    with (
        splitwise_instances(("prefill", MTP3), ("decode", MTP3)) as (p, d),
        splitwise_router(p, d) as url,
    ):
        assert texts(completion(url, n=2, seed=SEED, **SAMPLED)) == want
        assert texts(completion(url, best_of=3, seed=SEED, **SAMPLED)) == best
        assert texts(completion(url, prompt=prompts, n=2, seed=SEED, **SAMPLED)) == listed


# ---- refusals --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, fields, param",
    [
        ("completions", {"n": 0}, "n"),
        ("completions", {"n": MAX_CHOICES + 1}, "n"),
        ("chat/completions", {"n": MAX_CHOICES + 1}, "n"),
        ("completions", {"n": 3, "best_of": 2}, "best_of"),
        ("completions", {"best_of": MAX_CHOICES + 1}, "best_of"),
        ("completions", {"best_of": 2, "stream": True}, "best_of"),
        ("chat/completions", {"best_of": 2}, "best_of"),
    ],
)
def test_invalid_counts_are_a_400_naming_the_field(spec_server, path, fields, param):
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, **fields}
    if path == "completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    status, answer = post(f"{spec_server.base_url}/v1/{path}", body)
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer


# ---- one failing choice, a disconnect (scripted backend) -------------------------------------
class FailingChoiceBackend(ScriptedBackend):
    """Emits one token per request at once; the request of choice ``bad`` then fails, the
    others never finish (until cancelled). Records which requests were cancelled."""

    def __init__(self, bad: int | None):
        super().__init__()
        self.bad = bad

    def answer(self, req: Request, stream: Stream, index: int) -> None:
        req.output_token_ids.append(5)
        req.emitted_count += 1
        stream.put("tokens", emitted_of(req, [5]))
        if index == self.bad:
            stream.put("error", APIError(500, "choice failed", kind="server_error"))


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_choice_fails_the_response_and_cancels_the_others(stream):
    backend = FailingChoiceBackend(bad=1)
    app = create_app(backend, "m", load_tokenizer(ASSETS_DIR), eos_token_ids=[])
    body = {"prompt": "hi", "n": 3, "max_tokens": 8, "stream": stream}
    r = TestClient(app).post("/v1/completions", json=body)
    if stream:  # the response had started: the error ends the event stream
        assert r.status_code == 200
        assert '"error"' in r.text and "choice failed" in r.text and "[DONE]" not in r.text
    else:
        assert r.status_code == 500 and r.json()["error"]["message"] == "choice failed"
    ids = [req.request_id for req in backend.submitted]
    assert len(ids) == 3 and ids[1:] == [f"{ids[0]}-1", f"{ids[0]}-2"]
    assert {ids[0], ids[2]} <= set(backend.cancelled)  # nothing left running


def test_a_disconnect_cancels_every_choice():
    backend = FailingChoiceBackend(bad=None)
    app = create_app(backend, "m", load_tokenizer(ASSETS_DIR), eos_token_ids=[])
    with TestClient(app) as tc:
        with tc.stream(
            "POST", "/v1/completions", json={"prompt": "hi", "n": 2, "stream": True}
        ) as r:
            first = next(r.iter_lines())
            assert first.startswith("data: {")
    ids = [req.request_id for req in backend.submitted]
    assert len(ids) == 2 and set(ids) <= set(backend.cancelled)


def test_requests_cancelled_right_after_submission_never_run(random_model):
    """The app cancels the other choices as soon as one fails, possibly before the engine
    thread admitted them: such a request must not run anyway."""
    from fastdeploy_mtp.assembly import build_engine
    from fastdeploy_mtp.serving.engine_client.engine_loop import AsyncEngine
    from tests.support.engines import make_config

    target, mtp = random_model
    engine = build_engine(make_config(3, steps=3), target, mtp)
    fatal: list[str] = []
    backend = AsyncEngine(engine, fatal.append)
    reqs = [Request(f"c{i}", [3, 4, 5, 6], max_tokens=100) for i in range(8)]

    async def submit_and_cancel() -> None:
        for req in reqs:
            backend.submit(req)
            backend.cancel(req)
        for _ in range(400):
            await asyncio.sleep(0.01)
            if backend._inbox.empty() and backend._cancels.empty() and not engine.has_work:
                return
        raise AssertionError("the engine kept working")

    try:
        asyncio.run(submit_and_cancel())
    finally:
        backend.stop()
    assert fatal == []
    assert all(req.finish_reason is None and len(req.output_token_ids) < 100 for req in reqs)
    assert all(req.finished and req.error is not None for req in reqs)  # aborted, admitted or not
    assert backend.counters.cancelled == len(reqs)


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", True),
        ("n", "2"),
        ("best_of", True),
        ("best_of", "3"),
        ("include_draft_logprobs", "yes"),
    ],
)
def test_counts_and_flags_of_another_json_type_are_a_400_naming_the_field(field, value):
    # not coerced (true is not 1, "yes" not true): refused before any request is submitted
    backend = FailingChoiceBackend(bad=0)
    app = create_app(backend, MODEL, load_tokenizer(ASSETS_DIR))  # type: ignore[arg-type]
    with TestClient(app) as http:
        r = http.post(
            "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "logprobs": 0, field: value}
        )
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.json()
    assert backend.submitted == []
