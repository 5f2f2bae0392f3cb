"""``fastdeploy-mtp serve`` end to end: a real server (cache manager + worker processes) on
a loopback port, talked to with the ``openai`` client.

Every server here is stopped with SIGTERM and must exit 0 leaving no process, no
``/dev/shm`` name and no SysV queue behind (:func:`stopped_cleanly`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS  # noqa: E402
from tests.support.servers import (  # noqa: E402
    ServerProcess,
    http_get,
    offline,
    scrape_metrics,
    serving,
    stopped_cleanly,
)

MAX_TOKENS = 24
# a request that runs to its max_tokens: the shipped model ends some demo prompts early
# (DEMO_PROMPTS[1] after 33 tokens), and a test that needs a stream still in flight must not
# race that end
LONG = {"ignore_eos": True}
SPEC = (
    '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1, '
    '"mtp_strategy": "with_ngram"}'
)


@pytest.fixture(scope="module")
def server():
    yield from serving(["--speculative-config", SPEC])


@pytest.fixture(scope="module")
def expected():
    return dict(zip(DEMO_PROMPTS, offline(DEMO_PROMPTS, SPEC)))


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120
    )


def get(server: ServerProcess, path: str) -> tuple[int, str]:
    return http_get(server.base_url + path)


def metrics(server: ServerProcess) -> dict[str, float]:
    return scrape_metrics(server.base_url)


def test_start_up_reports_progress_and_models_health(server):
    log = server.output()
    for stage in ("config:", "cache manager", "worker rank 0 ready", "listening on"):
        assert stage in log, f"no {stage!r} line in the start-up log:\n{log}"
    assert get(server, "/health")[0] == 200
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["fastdeploy-mtp-tiny"]


def test_completions_equal_the_offline_engine(server, expected):
    c = client(server)
    for prompt in DEMO_PROMPTS[:4]:
        r = c.completions.create(model="fastdeploy-mtp-tiny", prompt=prompt, max_tokens=MAX_TOKENS)
        assert r.choices[0].text == expected[prompt]
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == MAX_TOKENS
        assert r.usage.prompt_tokens == len(prompt.encode())
        chunks = list(
            c.completions.create(
                model="fastdeploy-mtp-tiny", prompt=prompt, max_tokens=MAX_TOKENS, stream=True
            )
        )
        assert "".join(ch.choices[0].text for ch in chunks) == expected[prompt]
        assert len(chunks) > 2, "streaming should deliver the text in several events"
        assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_completions_stream_and_not(server):
    from fastdeploy_mtp.models import ASSETS_DIR
    from fastdeploy_mtp.tokenization import load_tokenizer

    messages = [{"role": "user", "content": "def add(a, b):"}]
    prompt = load_tokenizer(ASSETS_DIR).apply_chat_template(messages)
    assert prompt == "user: def add(a, b):\nassistant:"  # the byte model's template
    want = offline([prompt], SPEC)[0]
    c = client(server)
    r = c.chat.completions.create(
        model="fastdeploy-mtp-tiny", messages=messages, max_tokens=MAX_TOKENS
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    stream = c.chat.completions.create(
        model="fastdeploy-mtp-tiny",
        messages=messages,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_64_concurrent_streaming_clients(server, expected):
    async def one(c: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await c.completions.create(
            model="fastdeploy-mtp-tiny", prompt=prompt, max_tokens=MAX_TOKENS, stream=True
        )
        return "".join([ch.choices[0].text async for ch in stream])

    async def run() -> list[str]:
        c = openai.AsyncOpenAI(
            base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300
        )
        try:
            return await asyncio.gather(
                *(one(c, DEMO_PROMPTS[i % len(DEMO_PROMPTS)]) for i in range(64))
            )
        finally:
            await c.close()

    texts = asyncio.run(run())
    for i, text in enumerate(texts):
        assert text == expected[DEMO_PROMPTS[i % len(DEMO_PROMPTS)]], f"client {i}"


def test_metrics_add_up(server):
    before = metrics(server)
    c = client(server)
    for prompt in DEMO_PROMPTS[:3]:
        c.completions.create(model="fastdeploy-mtp-tiny", prompt=prompt, max_tokens=MAX_TOKENS)
    m = metrics(server)
    d = {k: m[k] - before.get(k, 0.0) for k in m}
    assert d["fastdeploy:request_success_total"] == 3
    assert d["fastdeploy:generation_tokens_total"] == 3 * MAX_TOKENS
    assert d["fastdeploy:prompt_tokens_total"] == sum(len(p.encode()) for p in DEMO_PROMPTS[:3])
    # every generated token is a prefill's first token or emitted by a decode step
    assert d["fastdeploy:spec_decode_num_emitted_tokens_total"] == 3 * (MAX_TOKENS - 1)
    offered = [
        m[f'fastdeploy:spec_decode_num_draft_tokens_per_pos_total{{method="mtp",position="{i}"}}']
        for i in (1, 2, 3)
    ]
    accepted = [
        m[
            f'fastdeploy:spec_decode_num_accepted_tokens_per_pos_total{{method="mtp",position="{i}"}}'
        ]
        for i in (1, 2, 3)
    ]
    assert sum(offered) == m["fastdeploy:spec_decode_num_draft_tokens_total"] > 0
    assert sum(accepted) == m["fastdeploy:spec_decode_num_accepted_tokens_total"] > 0
    assert all(a <= o for a, o in zip(accepted, offered))
    assert accepted[0] >= accepted[1] >= accepted[2], (
        "a draft is accepted only after the ones before it"
    )
    steps = m["fastdeploy:spec_decode_num_decode_steps_total"]
    emitted = m["fastdeploy:spec_decode_num_emitted_tokens_total"]
    # each decode step emits its accepted drafts plus one token of the target's own, except the
    # last step of a request whose max_tokens falls on an accepted draft (no own token then)
    accepted_total = m["fastdeploy:spec_decode_num_accepted_tokens_total"]
    assert (
        steps + accepted_total - m["fastdeploy:request_success_total"]
        <= emitted
        <= steps + accepted_total
    )
    assert m["fastdeploy:spec_decode_mean_accepted_length"] == pytest.approx(emitted / steps)


def test_a_client_that_disconnects_frees_its_slot(server):
    before = metrics(server)
    c = client(server)
    stream = c.completions.create(
        model="fastdeploy-mtp-tiny",
        prompt=DEMO_PROMPTS[1],
        max_tokens=900,
        stream=True,
        extra_body=LONG,
    )
    next(iter(stream))
    stream.close()  # hang up mid-generation
    deadline = time.monotonic() + 30
    while metrics(server)["fastdeploy:request_cancelled_total"] == before.get(
        "fastdeploy:request_cancelled_total", 0
    ):
        assert time.monotonic() < deadline, "the engine did not notice the disconnect"
        time.sleep(0.1)
    m = metrics(server)
    assert m["fastdeploy:num_requests_running"] == 0
    generated = (
        m["fastdeploy:generation_tokens_total"] - before["fastdeploy:generation_tokens_total"]
    )
    assert generated < 900, "the request ran to the end after its client left"


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
        ({"prompt": "x", "temperature": -0.7}, 400, "temperature"),
        ({"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
        ({"prompt": "x" * 2000}, 400, "prompt"),
        ({"prompt": ""}, 400, "prompt"),
        ({"prompt": [300]}, 400, "prompt"),
        ({"max_tokens": 4}, 400, "prompt"),
        ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
        ({"prompt": "x", "stop": [""]}, 400, "stop"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_field_and_the_server_keeps_serving(
    server, body, status, param
):
    req = urllib.request.Request(
        server.base_url + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == status
    error = json.loads(err.value.read())["error"]
    assert error["param"] == param and param in error["message"], error
    r = client(server).completions.create(
        model="fastdeploy-mtp-tiny", prompt=DEMO_PROMPTS[0], max_tokens=4
    )
    assert r.usage.completion_tokens == 4


def test_tensor_parallel_2_equals_tp_1(expected):
    srv = ServerProcess(["--speculative-config", SPEC, "--tensor-parallel-size", "2"])
    try:
        assert len(srv.worker_pids()) == 2
        c = client(srv)
        for prompt in DEMO_PROMPTS:
            r = c.completions.create(
                model="fastdeploy-mtp-tiny", prompt=prompt, max_tokens=MAX_TOKENS
            )
            assert r.choices[0].text == expected[prompt], prompt
    except BaseException:
        srv.kill()
        raise
    stopped_cleanly(srv)


@contextlib.contextmanager
def server_that_will_lose_a_worker():
    """A server the test makes exit with status 1; it must still leave nothing behind."""
    srv = ServerProcess(["--speculative-config", SPEC])
    try:
        yield srv
        left = srv.leftovers()
        assert left == {"children": [], "shm": [], "queue": False, "runtime_dir": False}, left
    except BaseException:
        srv.kill()
        raise
    srv.close_log()


def test_a_killed_worker_fails_requests_in_flight_and_the_server_exits_non_zero():
    with server_that_will_lose_a_worker() as srv:
        c = client(srv)
        stream = c.completions.create(
            model="fastdeploy-mtp-tiny",
            prompt=DEMO_PROMPTS[0],
            max_tokens=900,
            stream=True,
            extra_body=LONG,
        )
        first = next(iter(stream))
        assert first.choices[0].text is not None
        (worker,) = srv.worker_pids()
        os.kill(worker, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(openai.APIError, match="worker rank 0"):
            for _ in stream:
                pass
        assert time.monotonic() - t0 < 30, "the failure must be prompt, not a timeout"
        code = srv.wait(60)
        assert code == 1, srv.output()
        assert "exited with code" in srv.output()


def test_a_worker_dying_while_the_server_idles_stops_it_with_status_1():
    with server_that_will_lose_a_worker() as srv:
        (worker,) = srv.worker_pids()
        os.kill(worker, signal.SIGKILL)
        assert srv.wait(30) == 1, srv.output()
        assert f"worker rank 0 (pid {worker}) exited with code -9" in srv.output()


def test_sigterm_with_a_stream_in_flight_stops_cleanly_and_promptly():
    srv = ServerProcess(["--speculative-config", SPEC])
    try:
        stream = client(srv).completions.create(
            model="fastdeploy-mtp-tiny",
            prompt=DEMO_PROMPTS[2],
            max_tokens=900,
            stream=True,
            extra_body=LONG,
        )
        next(iter(stream))
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(Exception):  # an error or a truncated stream: either is fine
            for _ in stream:  # ends: completed within the grace period, or cut off
                pass
        assert srv.wait(60) == 0, srv.output()
        assert time.monotonic() - t0 < 30, (
            "shutdown must not wait for the stream to finish on its own"
        )
    except BaseException:
        srv.kill()
        raise
    stopped_cleanly(srv)


def test_a_killed_cache_manager_stops_the_server_and_its_names_are_removed():
    with server_that_will_lose_a_worker() as srv:
        (manager,) = [
            p
            for p in srv.children
            if b"cache_manager" in pathlib.Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        os.kill(manager, signal.SIGKILL)  # it cannot remove its names itself
        assert srv.wait(30) == 1, srv.output()
        assert "cache manager" in srv.output() and "exited with code -9" in srv.output()
