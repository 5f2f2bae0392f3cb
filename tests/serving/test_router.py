"""``fastdeploy-mtp router`` against stub prefill and decode instances.

The stubs are FastAPI apps (uvicorn threads on loopback ports) that follow the splitwise
instance protocol deterministically: prefill answers the first token ``A`` (65), decode
streams ``B``, ``C``, ... (66, 67, ...) until ``max_tokens``, so a request of ``max_tokens=n``
reads ``"ABC..."[:n]``. Prompts steer them: ``bad`` -> prefill 400, ``midfail`` -> decode fails
after one token, ``stop`` -> decode stops after one token, ``slow`` -> decode trickles tokens.
The router runs in-process (:func:`router_app` in a uvicorn thread); the clients are
``openai``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, StreamingResponse

from fastdeploy_mtp.distributed import find_free_port_range
from fastdeploy_mtp.entrypoints.cli import main
from fastdeploy_mtp.models import ASSETS_DIR
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from fastdeploy_mtp.serving.messages.wire import version_headers
from fastdeploy_mtp.serving.router.forwarding import Instances
from fastdeploy_mtp.serving.router.routing import RouterBackend
from fastdeploy_mtp.serving.router.server import router_app
from fastdeploy_mtp.tokenization import load_tokenizer
from tests.support.servers import (
    ThreadServer,
    http_get,
    http_post,
    router_command,
    scrape_metrics,
)

openai = pytest.importorskip("openai")

MODEL = "stub-tiny"


# ---- stub instances ------------------------------------------------------------------------
@dataclass
class StubState:
    """What the stub instances saw, and how the decode stubs behave."""

    prefill_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    decode_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    decode_busy: int = 0  # answer this many decode attempts with 429 first
    decode_429s: int = 0  # 429s answered so far
    decode_closed: list[str] = field(
        default_factory=list
    )  # request ids whose stream the router closed early
    lock: threading.Lock = field(default_factory=threading.Lock)


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _common(app: FastAPI) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}


def prefill_app(name: str, state: StubState) -> FastAPI:
    app = FastAPI()
    _common(app)

    @app.post("/v1/splitwise/prefill")
    async def prefill(body: dict[str, Any]) -> Any:
        with state.lock:
            state.prefill_calls.append((name, body))
        prompt = bytes(body["prompt_token_ids"]).decode()
        if prompt.startswith("bad"):
            return _error(400, "prompt: 'bad' is refused by this instance", "prompt")
        if prompt.startswith("ids"):  # an instance names the fields of the splitwise message
            return _error(400, "prompt_token_ids[1]: out of the vocabulary", "prompt_token_ids[1]")
        if prompt.startswith("locked"):
            return _error(401, "this endpoint is for the splitwise router")
        if prompt.startswith("hang"):
            await asyncio.sleep(3)
        if body["max_tokens"] == 1:
            out = {
                "output_token_ids": [65],
                "finished": True,
                "finish_reason": "length",
                "handoff": None,
            }
        else:
            handoff = {"prefill": name, "request_id": body["request_id"], "blocks": [3, 1, 4]}
            out = {
                "output_token_ids": [65],
                "finished": False,
                "finish_reason": None,
                "handoff": handoff,
            }
        return JSONResponse({"request_id": body["request_id"], **out}, headers=version_headers())

    return app


def decode_app(name: str, state: StubState) -> FastAPI:
    app = FastAPI()
    _common(app)

    @app.post("/v1/splitwise/decode")
    async def decode(body: dict[str, Any], http: HTTPRequest) -> Any:
        with state.lock:
            state.decode_calls.append((name, body))
            if state.decode_busy > 0:
                state.decode_busy -= 1
                state.decode_429s += 1
                busy = True
            else:
                busy = False
        if busy:
            return JSONResponse(
                {"error": {"message": "full", "type": "server_error", "param": None, "code": 429}},
                status_code=429,
                headers={"Retry-After": "0.05"},
            )
        prompt = bytes(body["prompt_token_ids"]).decode()
        rid, have, want = body["request_id"], len(body["output_token_ids"]), body["max_tokens"]

        async def events() -> Any:
            done = False
            try:
                if prompt.startswith("midfail"):
                    yield f"data: {json.dumps({'token_ids': [66]})}\n\n"
                    error = {"message": "decode worker lost", "type": "server_error", "code": 500}
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    done = True
                    return
                if prompt.startswith("stop"):
                    yield f"data: {json.dumps({'token_ids': [66]})}\n\n"
                    yield f"data: {json.dumps({'finish_reason': 'stop'})}\n\n"
                else:
                    slow = prompt.startswith("slow")
                    step = 1 if slow else 2
                    for start in range(have, want, step):
                        if slow:
                            await asyncio.sleep(0.05)
                            if await http.is_disconnected():
                                return
                        ids = [65 + i for i in range(start, min(start + step, want))]
                        yield f"data: {json.dumps({'token_ids': ids})}\n\n"
                    yield f"data: {json.dumps({'finish_reason': 'length'})}\n\n"
                yield "data: [DONE]\n\n"
                done = True
            finally:
                if not done:
                    with state.lock:
                        state.decode_closed.append(rid)

        return StreamingResponse(
            events(), media_type="text/event-stream", headers=version_headers()
        )

    return app


@dataclass
class Cluster:
    state: StubState
    prefill: list[str]
    decode: list[str]
    dead: str  # a URL nothing listens on


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    state = StubState()
    base = find_free_port_range(5)
    servers: list[ThreadServer] = []
    try:
        for i in range(2):
            servers.append(ThreadServer(prefill_app(f"P{i}", state), base + i))
        for i in range(2):
            servers.append(ThreadServer(decode_app(f"D{i}", state), base + 2 + i))
        yield Cluster(
            state,
            [s.url for s in servers[:2]],
            [s.url for s in servers[2:]],
            f"http://127.0.0.1:{base + 4}",
        )
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def state(cluster: Cluster) -> StubState:
    s = cluster.state
    with s.lock:
        s.prefill_calls.clear()
        s.decode_calls.clear()
        s.decode_closed.clear()
        s.decode_busy = s.decode_429s = 0
    return s


@contextlib.contextmanager
def router(
    prefill: list[str],
    decode: list[str],
    queue_timeout: float = 10.0,
    instance_timeout: float = 60.0,
) -> Iterator[tuple[str, RouterBackend]]:
    backend = RouterBackend(
        Instances(prefill, decode, queue_timeout, instance_timeout=instance_timeout)
    )
    srv = ThreadServer(router_app(backend, MODEL), find_free_port_range(1))
    try:
        yield srv.url, backend
    finally:
        srv.stop()


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


def get(url: str) -> tuple[int, str]:
    return http_get(url, timeout=10)


def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    return http_post(url, body, timeout=30)


def metrics(url: str) -> dict[str, float]:
    return scrape_metrics(url)


def expected(n: int) -> str:
    return "".join(chr(65 + i) for i in range(n))


# ---- routing -------------------------------------------------------------------------------
def test_completions_stream_and_not_go_prefill_then_decode(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1]) as (url, _):
        c = client(url)
        assert [m.id for m in c.models.list().data] == [MODEL]
        r = c.completions.create(model=MODEL, prompt="hello", max_tokens=6)
        assert r.choices[0].text == expected(6) and r.choices[0].finish_reason == "length"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
            5,
            6,
            11,
        )
        (_, pre), (_, dec) = state.prefill_calls[0], state.decode_calls[0]
        # no sampling field in the body: greedy, with the model's end-of-text id among the
        # stop ids (the router's tokenizer is the shipped model's), sent to both
        eos = load_tokenizer(ASSETS_DIR).eos_token_ids
        assert eos == [256]
        greedy = SamplingParams(stop_token_ids=eos).to_dict()
        assert pre == {
            "request_id": r.id,
            "prompt_token_ids": list(b"hello"),
            "max_tokens": 6,
            "sampling": greedy,
            "cache_namespace": "",  # no API key, no cache_salt: the global namespace
        }
        assert dec == {
            "request_id": r.id,
            "prompt_token_ids": list(b"hello"),
            "output_token_ids": [65],
            "max_tokens": 6,
            "sampling": greedy,
            "cache_namespace": "",  # no API key, no cache_salt: the global namespace
            "handoff": {
                "prefill": "P0",
                "request_id": r.id,
                "blocks": [3, 1, 4],
            },  # passed on unchanged
        }
        chunks = list(c.completions.create(model=MODEL, prompt="hello", max_tokens=6, stream=True))
        texts = [ch.choices[0].text for ch in chunks]
        assert texts[0] == "A", (
            "the prefill's first token is streamed on its own, before the decode's"
        )
        assert "".join(texts) == expected(6) and chunks[-1].choices[0].finish_reason == "length"


def test_chat_stream_with_usage_and_not(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1]) as (url, _):
        c = client(url)
        messages = [{"role": "user", "content": "hi"}]
        r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
        assert r.choices[0].message.role == "assistant" and r.choices[
            0
        ].message.content == expected(5)
        prompt_len = len(b"user: hi\nassistant:")
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt_len, 5)
        chunks = list(
            c.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(
            ch.choices[0].delta.content or "" for ch in chunks if ch.choices
        ) == expected(5)
        assert (
            chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == prompt_len
        )


def test_a_request_that_finishes_at_prefill_never_reaches_decode(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1]) as (url, _):
        r = client(url).completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert r.choices[0].text == "A" and r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 1
        assert len(state.prefill_calls) == 1 and state.decode_calls == []


def test_decode_stop_reason_reaches_the_client(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1]) as (url, _):
        r = client(url).completions.create(model=MODEL, prompt="stop here", max_tokens=50)
        assert r.choices[0].text == "AB" and r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens == 2


def test_round_robin_over_instances_and_concurrent_clients(cluster, state):
    async def one(c: Any, i: int) -> str:
        stream = await c.completions.create(
            model=MODEL, prompt=f"p{i}", max_tokens=3 + i % 5, stream=True
        )
        return "".join([ch.choices[0].text async for ch in stream])

    async def run(url: str) -> list[str]:
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        try:
            return await asyncio.gather(*(one(c, i) for i in range(16)))
        finally:
            await c.close()

    with router(cluster.prefill, cluster.decode) as (url, _):
        texts = asyncio.run(run(url))
        assert texts == [expected(3 + i % 5) for i in range(16)]
        m = metrics(url)
    assert sorted(n for n, _ in state.prefill_calls) == ["P0"] * 8 + ["P1"] * 8
    assert sorted(n for n, _ in state.decode_calls) == ["D0"] * 8 + ["D1"] * 8
    assert m["fastdeploy:router_requests_routed_total"] == 16
    assert m["fastdeploy:router_requests_success_total"] == 16
    assert m["fastdeploy:router_requests_failure_total"] == 0


# ---- back-pressure -------------------------------------------------------------------------
def test_a_full_decode_instance_is_retried_and_no_request_is_lost(cluster, state):
    state.decode_busy = 2
    with router(cluster.prefill[:1], cluster.decode) as (url, _):
        t0 = time.monotonic()
        r = client(url).completions.create(model=MODEL, prompt="wait", max_tokens=4)
        assert r.choices[0].text == expected(4)
        assert time.monotonic() - t0 >= 0.1, "each 429 asked to wait 0.05 s (Retry-After)"
        assert state.decode_429s == 2
        assert [n for n, _ in state.decode_calls] == ["D0", "D1", "D0"], (
            "retries rotate the decode instances"
        )
        assert len({b["request_id"] for _, b in state.decode_calls}) == 1
        m = metrics(url)
        assert m["fastdeploy:router_decode_retries_total"] == 2
        assert m["fastdeploy:router_requests_success_total"] == 1


def test_no_room_within_the_queue_timeout_is_a_503(cluster, state):
    state.decode_busy = 10**6
    with router(cluster.prefill[:1], cluster.decode[:1], queue_timeout=0.3) as (url, _):
        t0 = time.monotonic()
        status, body = post(url + "/v1/completions", {"prompt": "wait", "max_tokens": 4})
        assert status == 503
        assert (
            "queue timeout" in body["error"]["message"]
            and cluster.decode[0] in body["error"]["message"]
        )
        assert 0.3 <= time.monotonic() - t0 < 5
        assert state.decode_429s >= 3
        assert metrics(url)["fastdeploy:router_requests_failure_total"] == 1


# ---- errors --------------------------------------------------------------------------------
def test_a_prefill_400_reaches_the_client_as_a_400(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1]) as (url, _):
        status, body = post(url + "/v1/completions", {"prompt": "bad prompt", "max_tokens": 4})
        assert status == 400
        assert (
            body["error"]["param"] == "prompt"
            and "refused by this instance" in body["error"]["message"]
        )
        with pytest.raises(openai.BadRequestError):
            client(url).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=0
            )
        assert state.decode_calls == []


def test_a_refused_stream_keeps_its_status_and_names_the_clients_field(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1]) as (url, _):
        status, body = post(
            url + "/v1/completions", {"prompt": "bad prompt", "max_tokens": 4, "stream": True}
        )
        assert status == 400 and body["error"]["param"] == "prompt", (
            body
        )  # not a 200 with an error event
        status, body = post(url + "/v1/completions", {"prompt": "ids", "max_tokens": 4})
        assert status == 400 and body["error"]["param"] == "prompt", body
        status, body = post(url + "/v1/completions", {"prompt": "locked", "max_tokens": 4})
        assert status == 502 and "same splitwise secret" in body["error"]["message"], body


def test_a_silent_instance_is_a_504_naming_it(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1], instance_timeout=0.5) as (url, _):
        status, body = post(url + "/v1/completions", {"prompt": "hang", "max_tokens": 4})
        assert status == 504 and cluster.prefill[0] in body["error"]["message"], body
        assert "--instance-timeout" in body["error"]["message"]


def test_a_decode_error_mid_stream_ends_the_stream_with_the_error(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1]) as (url, _):
        stream = client(url).completions.create(
            model=MODEL, prompt="midfail", max_tokens=8, stream=True
        )
        texts = []
        with pytest.raises(openai.APIError, match="decode worker lost"):
            for ch in stream:
                texts.append(ch.choices[0].text)
        assert "".join(texts) == "AB"
        status, body = post(url + "/v1/completions", {"prompt": "midfail", "max_tokens": 8})
        assert status == 500 and cluster.decode[0] in body["error"]["message"]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_an_unreachable_instance_is_a_502_naming_it(cluster, state, role):
    prefill = [cluster.dead] if role == "prefill" else cluster.prefill[:1]
    decode = [cluster.dead] if role == "decode" else cluster.decode[:1]
    with router(prefill, decode) as (url, _):
        status, body = post(url + "/v1/completions", {"prompt": "x", "max_tokens": 4})
        assert status == 502
        assert f"{role} instance {cluster.dead}" in body["error"]["message"]
        status, text = get(url + "/health")
        assert status == 503 and f"no {role} instance is healthy" in text and cluster.dead in text


def test_health_is_200_while_one_instance_of_each_role_answers(cluster, state):
    with router([cluster.dead, *cluster.prefill], [cluster.decode[0], cluster.dead]) as (url, _):
        assert get(url + "/health")[0] == 200


def test_a_client_that_disconnects_closes_the_decode_stream(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1]) as (url, _):
        stream = client(url).completions.create(
            model=MODEL, prompt="slow", max_tokens=400, stream=True
        )
        chunks = iter(stream)
        first = next(chunks)
        next(chunks)  # a decode token: the decode stream is open
        stream.close()
        deadline = time.monotonic() + 10
        while first.id not in state.decode_closed:
            assert time.monotonic() < deadline, "the decode instance's stream was not closed"
            time.sleep(0.05)
        deadline = time.monotonic() + 5
        while metrics(url)["fastdeploy:router_requests_cancelled_total"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_metrics_say_what_they_count(cluster, state):
    with router(cluster.prefill[:1], cluster.decode[:1]) as (url, _):
        status, text = get(url + "/metrics")
    assert status == 200
    for name in ("routed", "success", "failure", "cancelled"):
        assert re.search(rf"^# HELP fastdeploy:router_requests_{name}_total \S.+$", text, re.M), (
            name
        )
    assert re.search(r"^# HELP fastdeploy:router_decode_retries_total .*429", text, re.M)


def test_backend_refuses_bad_arguments():
    with pytest.raises(ValueError, match="decode"):
        RouterBackend(Instances(["http://127.0.0.1:1"], []))
    with pytest.raises(ValueError, match="prefill 'localhost:80'"):
        RouterBackend(Instances(["localhost:80"], ["http://127.0.0.1:1"]))
    with pytest.raises(ValueError, match="queue_timeout"):
        RouterBackend(Instances(["http://127.0.0.1:1"], ["http://127.0.0.1:2"], queue_timeout=0))


# ---- the command ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, word",
    [
        (["--prefill", "http://127.0.0.1:1"], "--decode"),
        (["--decode", "http://127.0.0.1:1"], "--prefill"),
        (["--prefill", "127.0.0.1:1", "--decode", "http://127.0.0.1:1"], "--prefill '127.0.0.1:1'"),
        (
            ["--prefill", "http://a:1", "--decode", "http://b:1", "--queue-timeout", "0"],
            "--queue-timeout",
        ),
    ],
)
def test_bad_router_arguments_are_one_line_usage_errors(capsys, args, word):
    code = main(["router", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and word in err and "Traceback" not in err


def test_router_gives_up_on_instances_that_never_become_healthy(capsys, cluster):
    port = find_free_port_range(1)
    code = main(
        ["router", "--prefill", cluster.prefill[0], "--decode", cluster.dead, "--port", str(port)]
        + ["--start-timeout", "0.3"]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert f"prefill instance {cluster.prefill[0]} healthy" in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("fastdeploy-mtp: error: not healthy after --start-timeout 0.3 s")
    )
    assert f"decode instance {cluster.dead}" in err


def test_router_command_serves_the_prefill_model_name_and_exits_0_on_sigterm(cluster, state):
    port = find_free_port_range(1)
    cmd = router_command(port, "--start-timeout", "30")
    cmd += [
        "--prefill",
        cluster.prefill[0],
        "--decode",
        cluster.decode[0],
        "--decode",
        cluster.decode[1],
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with contextlib.suppress(OSError):
                if get(url + "/health")[0] == 200:
                    break
            assert time.monotonic() < deadline, "the router did not become healthy"
            time.sleep(0.1)
        c = client(url)
        assert [m.id for m in c.models.list().data] == [MODEL]  # taken from the prefill instance
        assert c.completions.create(model=MODEL, prompt="cli", max_tokens=3).choices[
            0
        ].text == expected(3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        err = proc.stderr.read() if proc.stderr else ""
        for line in (
            "waiting for 1 prefill and 2 decode",
            "decode instance",
            "healthy",
            "listening on",
        ):
            assert line in err, err
        assert re.search(r"^\[router +\d+\.\d+s\] ", err, re.M), err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if proc.stderr:
            proc.stderr.close()
