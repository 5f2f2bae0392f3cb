"""The OpenAI fields current clients send, through ``fastdeploy-mtp serve`` and the
``openai`` client: ``max_completion_tokens`` (chat), lists of prompts in ``/v1/completions``
(each prompt ``n`` choices, indexed ``i * n + j``; streamed too, with the usage chunk),
``/version``, unknown fields refused with a 400 naming them while the accepted-and-ignored
ones pass, and a body that is not JSON answered with its line and column.

A scripted backend (no engine) checks the prompt forms and their errors, and that a bug in a
handler, or a request uvicorn cancels at shutdown, still answers in OpenAI's error shape;
an in-process engine loop checks that a request submitted while the deployment is lost is
refused or failed, never left waiting.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

openai = pytest.importorskip("openai")

import fastdeploy_mtp  # noqa: E402
from fastdeploy_mtp.distributed import find_free_port_range  # noqa: E402
from fastdeploy_mtp.models import ASSETS_DIR  # noqa: E402
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from fastdeploy_mtp.runtime.request import Request  # noqa: E402
from fastdeploy_mtp.serving.engine_client.backend import Stream  # noqa: E402
from fastdeploy_mtp.serving.messages.router_instances import PrefillRequest  # noqa: E402
from fastdeploy_mtp.serving.openai.app import create_app  # noqa: E402
from fastdeploy_mtp.serving.openai.protocol import MAX_RESPONSE_REQUESTS, APIError  # noqa: E402
from fastdeploy_mtp.serving.openai.text import emitted_of  # noqa: E402
from fastdeploy_mtp.serving.pd.endpoints import new_request  # noqa: E402
from fastdeploy_mtp.tokenization import load_tokenizer  # noqa: E402
from tests.support.scripted_backend import ScriptedBackend  # noqa: E402
from tests.support.servers import ThreadServer  # noqa: E402

MODEL = "fastdeploy-mtp-tiny"
PROMPTS = DEMO_PROMPTS[:3]
CHAT = [{"role": "user", "content": DEMO_PROMPTS[0]}]


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def refusal(call: Any) -> dict[str, Any]:
    """The OpenAI error of a call that must answer 400."""
    with pytest.raises(openai.BadRequestError) as err:
        call()
    assert err.value.status_code == 400
    error = err.value.body
    assert set(error) >= {"message", "type", "param", "code"}, error
    return dict(error)


# ---- served: the openai client against a real server -----------------------------------------
def test_max_completion_tokens_limits_the_output(spec_server):
    chat = client(spec_server.base_url).chat.completions
    r = chat.create(model=MODEL, messages=CHAT, max_completion_tokens=5)
    assert 1 <= r.usage.completion_tokens <= 5
    full = chat.create(
        model=MODEL, messages=CHAT, max_completion_tokens=5, extra_body={"ignore_eos": True}
    )
    assert full.usage.completion_tokens == 5 and full.choices[0].finish_reason == "length"
    same = chat.create(model=MODEL, messages=CHAT, max_completion_tokens=5, max_tokens=5)
    assert same.choices[0].message.content == r.choices[0].message.content
    error = refusal(
        lambda: chat.create(model=MODEL, messages=CHAT, max_completion_tokens=5, max_tokens=6)
    )
    assert error["param"] == "max_completion_tokens" and "max_tokens (6)" in error["message"]
    error = refusal(lambda: chat.create(model=MODEL, messages=CHAT, max_completion_tokens=0))
    assert error["param"] == "max_completion_tokens"
    completions = client(spec_server.base_url).completions
    error = refusal(
        lambda: completions.create(model=MODEL, prompt="x", extra_body={"max_completion_tokens": 5})
    )
    assert error["param"] == "max_completion_tokens" and "max_tokens" in error["message"]


def singles(url: str, prompts: list[str], max_tokens: int) -> list[Any]:
    return [
        client(url).completions.create(model=MODEL, prompt=p, max_tokens=max_tokens).choices[0]
        for p in prompts
    ]


def test_a_list_of_prompts_gives_n_choices_each_equal_to_the_single_prompt_ones(spec_server):
    url = spec_server.base_url
    one = singles(url, PROMPTS, 12)
    c = client(url).completions
    r = c.create(model=MODEL, prompt=list(PROMPTS), n=2, max_tokens=12)
    assert [ch.index for ch in r.choices] == list(range(6))
    assert [ch.text for ch in r.choices] == [s.text for s in one for _ in range(2)]
    assert [ch.finish_reason for ch in r.choices] == [s.finish_reason for s in one for _ in (0, 1)]
    tokenizer = load_tokenizer(ASSETS_DIR)
    ids = [tokenizer.encode(p) for p in PROMPTS]
    assert r.usage.prompt_tokens == sum(map(len, ids))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    by_ids = c.create(model=MODEL, prompt=ids, max_tokens=12)  # a list of token-id lists
    assert [ch.text for ch in by_ids.choices] == [s.text for s in one]
    assert by_ids.usage.prompt_tokens == r.usage.prompt_tokens
    assert 2 * by_ids.usage.completion_tokens == r.usage.completion_tokens
    alone = c.create(model=MODEL, prompt=ids[1], max_tokens=12)  # a list of token ids: one
    assert [ch.text for ch in alone.choices] == [one[1].text]


def test_a_streamed_list_of_prompts_carries_each_choice_index_and_one_usage_chunk(spec_server):
    url = spec_server.base_url
    c = client(url).completions
    whole = c.create(model=MODEL, prompt=list(PROMPTS), n=2, max_tokens=12)
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usages = []
    for chunk in c.create(
        model=MODEL,
        prompt=list(PROMPTS),
        n=2,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            assert chunk.choices == []
            usages.append(chunk.usage)
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason is not None:
                reasons[ch.index] = ch.finish_reason
    assert [texts[i] for i in range(6)] == [ch.text for ch in whole.choices]
    assert [reasons[i] for i in range(6)] == [ch.finish_reason for ch in whole.choices]
    assert len(usages) == 1 and usages[0].model_dump() == whole.usage.model_dump()
    plain = c.create(model=MODEL, prompt=list(PROMPTS), max_tokens=12, stream=True)
    assert {ch.index for chunk in plain for ch in chunk.choices} == {0, 1, 2}


def test_unknown_fields_are_refused_and_the_accepted_ignored_ones_pass(spec_server):
    url = spec_server.base_url
    chat = client(url).chat.completions
    for extra in [{"frobnicate": 1}, {"cache_salt": ""}, {"cache_salt": 7}, {"priority": 1}]:
        error = refusal(
            lambda: chat.create(model=MODEL, messages=CHAT, max_tokens=4, extra_body=extra)  # noqa: B023
        )
        (field,) = extra
        assert error["param"] == field and field in error["message"], error
    error = refusal(
        lambda: client(url).completions.create(
            model=MODEL, prompt="x", max_tokens=4, extra_body={"frobnicate": 1}
        )
    )
    assert error["param"] == "frobnicate"
    plain = chat.create(model=MODEL, messages=CHAT, max_tokens=8)
    ignored = chat.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=8,
        user="u-1",
        metadata={"team": "a"},
        store=False,
        service_tier="auto",
        parallel_tool_calls=False,
        safety_identifier="s-1",
        prompt_cache_key="k-1",
        extra_body={"priority": 0},
    )
    assert ignored.choices[0].message.content == plain.choices[0].message.content
    error = refusal(
        lambda: chat.create(model=MODEL, messages=CHAT, max_tokens=4, extra_body={"store": "yes"})
    )
    assert error["param"] == "store"


def test_version_and_a_body_that_is_not_json(spec_server):
    url = spec_server.base_url
    r = httpx.get(url + "/version")
    assert r.status_code == 200 and r.json() == {"version": fastdeploy_mtp.__version__}
    body = '{"prompt": "x",\n "max_tokens" 4}'
    r = httpx.post(
        url + "/v1/completions", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    with pytest.raises(json.JSONDecodeError) as parsed:
        json.loads(body)
    where = f"{parsed.value.msg} at line {parsed.value.lineno}, column {parsed.value.colno}"
    error = r.json()["error"]
    assert error["message"] == f"request body is not valid JSON: {where}", error
    assert error["param"] is None and where.endswith("line 2, column 15")


# ---- scripted: prompt forms and errors without an engine --------------------------------------
class EchoBackend(ScriptedBackend):
    """Answers each request with its prompt's last token, ``max_tokens`` times (``"length"``);
    with ``hang``, submits and never answers."""

    def __init__(self, hang: bool = False):
        super().__init__()
        self.hang = hang

    def answer(self, req: Request, stream: Stream, index: int) -> None:
        if not self.hang:
            ids = [req.prompt_token_ids[-1]] * req.max_tokens
            req.output_token_ids += ids
            req.emitted_count += len(ids)
            stream.put("tokens", emitted_of(req, ids))
            stream.put("finished", "length")


def scripted(backend: Any) -> TestClient:
    return TestClient(create_app(backend, MODEL, load_tokenizer(ASSETS_DIR), eos_token_ids=[]))


def test_prompt_forms_and_choice_indices():
    tokenizer = load_tokenizer(ASSETS_DIR)
    backend = EchoBackend()
    http = scripted(backend)
    r = http.post("/v1/completions", json={"prompt": ["ab", "cd", "ef"], "n": 2, "max_tokens": 3})
    assert r.status_code == 200, r.json()
    want = [tokenizer.decode([tokenizer.encode(p)[-1]] * 3) for p in ("ab", "cd", "ef")]
    assert [(c["index"], c["text"]) for c in r.json()["choices"]] == [
        (i * 2 + j, want[i]) for i in range(3) for j in range(2)
    ]
    ids = [req.request_id for req in backend.submitted]
    assert ids[1:] == [f"{ids[0]}-{g}" for g in range(1, 6)]  # every generation its own id
    prompts = sum(len(tokenizer.encode(p)) for p in ("ab", "cd", "ef"))
    assert r.json()["usage"] == {
        "prompt_tokens": prompts,
        "completion_tokens": 18,
        "total_tokens": prompts + 18,
    }
    r = http.post("/v1/completions", json={"prompt": [[5, 6], [7]], "max_tokens": 1})
    texts = [c["text"] for c in r.json()["choices"]]
    assert texts == [tokenizer.decode([6]), tokenizer.decode([7])]


@pytest.mark.parametrize(
    "prompt, param, words",
    [
        ([], "prompt", "empty list"),
        (["a", "b", ""], "prompt[2]", "empty"),
        (["a", "b", 3], "prompt[2]", "a string"),
        ([[1, 2], [3, "x"]], "prompt[1]", "token ids"),
        ([1, 2, True], "prompt[2]", "token id"),
        ([[1], []], "prompt[1]", "empty"),
        (7, "prompt", "a list of token-id lists"),
        (None, "prompt", "a list of token-id lists"),
        ([{"text": "a"}], "prompt", "a list of token-id lists"),
        (["a"] * (MAX_RESPONSE_REQUESTS // 2 + 1), "prompt", "at most"),
    ],
)
def test_bad_prompts_are_a_400_naming_the_item(prompt, param, words):
    backend = EchoBackend()
    r = scripted(backend).post("/v1/completions", json={"prompt": prompt, "n": 2, "max_tokens": 2})
    assert r.status_code == 400, r.json()
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert backend.submitted == []


def test_a_body_that_is_not_a_json_object_is_a_400():
    http = scripted(EchoBackend())
    for content in (b"", b"[1, 2]", b'"prompt"'):
        r = http.post(
            "/v1/completions", content=content, headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 400
        assert "must be a JSON object" in r.json()["error"]["message"], r.json()


class BrokenBackend(EchoBackend):
    def validate(self, req: Request) -> None:
        raise KeyError("a bug")


def test_a_bug_in_a_handler_is_an_openai_shaped_500():
    app = create_app(BrokenBackend(), MODEL, load_tokenizer(ASSETS_DIR))
    http = TestClient(app, raise_server_exceptions=False)
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "server_error" and "KeyError" in error["message"], error


def test_a_request_cancelled_by_the_servers_shutdown_gets_a_json_503():
    """uvicorn cancels the requests still running when its graceful shutdown times out, and
    answered them with a plain-text "Internal Server Error"."""
    backend = EchoBackend(hang=True)
    server = ThreadServer(
        create_app(backend, MODEL, load_tokenizer(ASSETS_DIR)), find_free_port_range(1)
    )
    answers: list[httpx.Response] = []
    body = {"prompt": "x", "max_tokens": 2, "stream": True}
    sender = threading.Thread(
        target=lambda: answers.append(httpx.post(server.url + "/v1/completions", json=body))
    )
    sender.start()
    for _ in range(500):
        if backend.submitted:
            break
        threading.Event().wait(0.01)
    assert backend.submitted, "the request never reached the backend"
    server.stop()
    sender.join(10)
    assert len(answers) == 1
    assert answers[0].status_code == 503, answers[0].text
    assert answers[0].json()["error"]["message"] == "the server is shutting down"


# ---- the engine loop: a request submitted while the deployment is lost -------------------------
def test_a_request_submitted_while_the_deployment_is_lost_is_refused_not_left_waiting(
    random_model,
):
    """The engine thread's end (reason set, queue failed) and a submission racing it: the
    submission is refused, or its request fails; it never waits for an engine that is gone."""
    from fastdeploy_mtp.assembly import build_engine
    from fastdeploy_mtp.serving.engine_client.engine_loop import AsyncEngine
    from tests.support.engines import make_config

    lost = threading.Event()

    class LosingEngine(AsyncEngine):
        def _before_step(self) -> None:
            if lost.is_set():
                raise RuntimeError("the cache manager died")

    target, mtp = random_model
    fatal: list[str] = []
    backend = LosingEngine(build_engine(make_config(1), target, mtp), fatal.append)
    arrived = backend.latency.arrived

    def arrive_as_the_deployment_is_lost(req: Request) -> None:
        lost.set()  # the engine thread ends while this submission is on its way
        for _ in range(500):
            if fatal:
                break
            threading.Event().wait(0.01)
        arrived(req)

    backend.latency.arrived = arrive_as_the_deployment_is_lost  # type: ignore[method-assign]

    async def submit() -> str:
        try:
            stream = backend.submit(Request("late", [3, 4, 5], max_tokens=4))
        except APIError as exc:
            return f"refused {exc.status}: {exc.message}"
        kind, value = await asyncio.wait_for(stream.events.get(), 5)
        return f"{kind} {value.status}: {value.message}"

    try:
        outcome = asyncio.run(submit())
    finally:
        backend.stop()
    assert fatal == ["the cache manager died"]
    assert outcome == "refused 503: the server is shutting down: the cache manager died"


# ---- splitwise: an instance's request id ---------------------------------------------------
def test_an_empty_splitwise_request_id_is_a_400_naming_it():
    body = PrefillRequest(request_id="", prompt_token_ids=[3, 4], max_tokens=4)
    with pytest.raises(APIError) as err:
        new_request(body)
    assert (err.value.status, err.value.param) == (400, "request_id")
