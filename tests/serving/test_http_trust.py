"""The HTTP surfaces of ``serve`` and ``router``: who may call what, and how refusals look.

* ``--api-key`` (or ``$FASTDEPLOY_MTP_API_KEY``): every ``/v1/*`` request needs
  ``Authorization: Bearer <key>``, else a 401 in OpenAI's error shape (``code``
  ``invalid_api_key``), counted as ``dropped_messages_total{channel="http"}``; ``/health`` and
  ``/metrics`` stay open. On the router too.
* ``/v1/splitwise/*`` take only the router's token (derived from the splitwise secret), never
  the API key; the instances take that token on ``/v1/*`` too. A router whose secret the
  instances do not share gets their 401 and answers 502 saying so.
* A prefill instance that stops answering (SIGSTOP) is a 504 naming it within the router's
  ``--instance-timeout``.
* A non-streaming request whose client hangs up is aborted (its slot freed).
* Errors are OpenAI-shaped everywhere: 404/405, a body that is not JSON, a lone surrogate
  (400 naming the client's field, on the server and through the router), fields this server
  cannot honour, ``min_tokens > max_tokens``, an unexpected exception (500); a stream the
  instance refuses is a 400 through the router, not a 200 with an error event.
* Bad credentials and a taken port are usage errors (exit status 2) before anything starts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fastdeploy_mtp.credentials import API_KEY_ENV, SECRET_ENV, splitwise_secret
from fastdeploy_mtp.distributed import find_free_port_range
from fastdeploy_mtp.entrypoints.cli import main
from fastdeploy_mtp.serving.router.forwarding import Instances
from fastdeploy_mtp.serving.router.routing import RouterBackend
from fastdeploy_mtp.serving.router.server import fetch_model_name
from tests.support.servers import (
    ServerProcess,
    device_ids,
    http_get,
    http_post,
    router_command,
    router_headers,
    scrape_metrics,
    splitwise_instances,
    splitwise_post,
    splitwise_router,
    stopped_cleanly,
)

MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'
KEY = "sk-test-" + "k" * 24
AUTH = {"Authorization": f"Bearer {KEY}"}
DROPPED_HTTP = 'fastdeploy:dropped_messages_total{channel="http"}'
INSTANCE_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """A mixed server whose API key comes from the environment."""
    srv = ServerProcess(["--speculative-config", MTP1], env={**os.environ, API_KEY_ENV: KEY})
    yield srv
    stopped_cleanly(srv)


@pytest.fixture(scope="module")
def pd() -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """A prefill and a decode instance, each with ``--api-key``."""
    with splitwise_instances(
        ("prefill", MTP1, "--api-key", KEY),
        ("decode", MTP1, "--api-key", KEY),
    ) as (prefill, decode):
        yield prefill, decode


@pytest.fixture(scope="module")
def router(pd: tuple[ServerProcess, ServerProcess]) -> Iterator[str]:
    """A router with ``--api-key`` and a short ``--instance-timeout`` over ``pd``."""
    with splitwise_router(*pd, api_key=KEY, instance_timeout=INSTANCE_TIMEOUT) as url:
        yield url


def dropped(url: str) -> float:
    return scrape_metrics(url).get(DROPPED_HTTP, 0.0)


def error_of(answer: Any) -> dict[str, Any]:
    assert isinstance(answer, dict) and set(answer) == {"error"}, answer
    error = answer["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    return dict(error)


def post_raw(url: str, content: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    r = httpx.post(
        url,
        content=content,
        headers={"Content-Type": "application/json", **(headers or {})},
        timeout=60,
    )
    return r.status_code, r.json()


# ---- the API key ------------------------------------------------------------------------------
def test_the_api_key_guards_every_v1_endpoint_and_refusals_are_counted(server):
    before = dropped(server.base_url)
    body = {"prompt": "def f():", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, answer = http_post(server.base_url + "/v1/completions", body, headers=headers)
        assert status == 401, answer
        assert (
            error_of(answer)["code"] == "invalid_api_key"
            and error_of(answer)["type"] == "invalid_request_error"
        )
    assert http_get(server.base_url + "/v1/models")[0] == 401
    assert http_get(server.base_url + "/health")[0] == 200  # open, as vLLM's
    assert dropped(server.base_url) == before + 4  # /metrics is open too
    status, answer = http_post(server.base_url + "/v1/completions", body, headers=AUTH)
    assert status == 200 and answer["usage"]["completion_tokens"] == 2, answer
    assert http_get(server.base_url + "/v1/models", headers=AUTH)[0] == 200


# ---- OpenAI's error shape -----------------------------------------------------------------
def test_404_405_and_a_body_that_is_not_json_are_openai_shaped(server):
    status, text = http_get(server.base_url + "/v1/nothing", headers=AUTH)
    assert status == 404 and error_of(json.loads(text))["type"] == "not_found_error"
    status, text = http_get(server.base_url + "/v1/completions", headers=AUTH)
    assert status == 405 and error_of(json.loads(text))["type"] == "invalid_request_error"
    status, answer = post_raw(server.base_url + "/v1/completions", b"{not json", AUTH)
    assert status == 400 and error_of(answer)["type"] == "invalid_request_error"
    status, answer = post_raw(
        server.base_url + "/v1/completions", b'{"max_tokens": "many", "prompt": "x"}', AUTH
    )
    assert status == 400 and error_of(answer)["param"] == "max_tokens"


@pytest.mark.parametrize(
    "path, raw, param",
    [
        ("/v1/completions", b'{"prompt": "ab\\ud800", "max_tokens": 2}', "prompt"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "\\udc00x"}]}',
            "messages",
        ),
        ("/v1/completions", b'{"prompt": "ab\\ud800", "max_tokens": 2, "stream": true}', "prompt"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, raw, param):
    status, answer = post_raw(server.base_url + path, raw, AUTH)
    assert status == 400 and error_of(answer)["param"] == param, answer


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"suffix": "x"}, "suffix"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
    ],
)
def test_fields_this_server_cannot_honour_are_a_400_naming_them(server, extra, param):
    body = {"prompt": "def f():", "max_tokens": 2, **extra}
    status, answer = http_post(server.base_url + "/v1/completions", body, headers=AUTH)
    assert (
        status == 400
        and error_of(answer)["param"] == param
        and param in error_of(answer)["message"]
    ), answer


def test_the_neutral_values_of_those_fields_are_accepted(server):
    body = {
        "prompt": "def f():",
        "max_tokens": 2,
        "response_format": {"type": "text"},
        "tool_choice": "none",
    }
    status, answer = http_post(server.base_url + "/v1/completions", body, headers=AUTH)
    assert status == 200, answer


def test_an_unexpected_exception_is_a_500_in_the_error_shape():
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry

    from fastdeploy_mtp.models.tiny import ASSETS_DIR
    from fastdeploy_mtp.serving.openai.app import create_app
    from fastdeploy_mtp.tokenization import load_tokenizer

    class Broken:
        fatal = None
        registry = CollectorRegistry()

        def validate(self, req: Any) -> None:
            return None

        def submit(self, req: Any) -> Any:
            raise RuntimeError("a bug")

    app = create_app(Broken(), "m", load_tokenizer(ASSETS_DIR))  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 500 and error_of(r.json())["type"] == "server_error"
    assert "RuntimeError" in r.json()["error"]["message"]


# ---- a client that leaves ---------------------------------------------------------------------
def test_a_non_streaming_request_whose_client_leaves_is_aborted(server):
    before = scrape_metrics(server.base_url)
    body = {"prompt": "def main():", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", json=body, headers=AUTH, timeout=1.0)
    deadline = time.monotonic() + 15
    while True:
        m = scrape_metrics(server.base_url)
        if m["fastdeploy:request_cancelled_total"] > before.get(
            "fastdeploy:request_cancelled_total", 0
        ):
            break
        assert time.monotonic() < deadline, "the request was not aborted when its client left"
        time.sleep(0.1)
    assert m["fastdeploy:num_requests_running"] == 0
    assert (
        m["fastdeploy:generation_tokens_total"] - before["fastdeploy:generation_tokens_total"] < 900
    )


# ---- splitwise: the router's credential -----------------------------------------------------
def test_splitwise_endpoints_take_the_router_token_and_never_the_api_key(pd):
    prefill, _ = pd
    url = prefill.base_url + "/v1/splitwise/prefill"
    body = {"request_id": "x", "prompt_token_ids": [1, 2], "max_tokens": 2, "sampling": {}}
    before = dropped(prefill.base_url)
    for headers in ({}, AUTH):
        status, answer = http_post(
            url, body, headers={**router_headers(), **headers} if headers else {}
        )
        assert status == 401 and error_of(answer)["code"] == "invalid_api_key", answer
    assert splitwise_post(url, body, secret=b"another secret of 32 bytes......")[0] == 401
    assert dropped(prefill.base_url) == before + 3
    # the router token opens /v1/* of an instance with an API key (the router reads /v1/models)
    assert http_get(prefill.base_url + "/v1/models", headers=router_headers())[0] == 200
    assert http_get(prefill.base_url + "/v1/models")[0] == 401
    backend = RouterBackend(
        Instances([prefill.base_url], [prefill.base_url], secret=splitwise_secret())
    )
    assert fetch_model_name(prefill.base_url, backend.headers) == "fastdeploy-mtp-tiny"


def test_the_router_takes_its_api_key_and_forwards_with_its_token(router):
    body = {"prompt": "def add(a, b):", "max_tokens": 6}
    status, answer = http_post(router + "/v1/completions", body)
    assert status == 401 and error_of(answer)["code"] == "invalid_api_key"
    assert dropped(router) >= 1
    status, answer = http_post(router + "/v1/completions", body, headers=AUTH)
    assert status == 200 and answer["usage"]["completion_tokens"] == 6, answer


def test_a_router_without_the_instances_secret_answers_502_saying_so(pd):
    with splitwise_router(*pd, secret=b"not the deployment's secret!!!!!") as url:
        status, answer = http_post(url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert status == 502 and "splitwise secret" in error_of(answer)["message"], answer


@pytest.mark.parametrize(
    "path, raw, param",
    [
        ("/v1/completions", b'{"prompt": "ab\\ud800", "max_tokens": 2}', "prompt"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "a\\ud800"}], "stream": true}',
            "messages",
        ),
        # the prefill instance refuses it (longer than --max-model-len): a 400 naming the client's
        # field
        (
            "/v1/completions",
            b'{"prompt": "' + b"y" * 1100 + b'", "max_tokens": 2, "stream": true}',
            "prompt",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "' + b"y" * 1100 + b'"}]}',
            "messages",
        ),
    ],
)
def test_the_router_answers_400_naming_the_clients_field(router, path, raw, param):
    status, answer = post_raw(router + path, raw, AUTH)
    assert status == 400 and error_of(answer)["param"] == param, answer


def test_a_non_streaming_request_through_the_router_whose_client_leaves_is_aborted(pd, router):
    _, decode = pd
    before = scrape_metrics(decode.base_url).get("fastdeploy:request_cancelled_total", 0)
    body = {"prompt": "def main():", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(router + "/v1/completions", json=body, headers=AUTH, timeout=1.5)
    deadline = time.monotonic() + 15
    while scrape_metrics(decode.base_url).get("fastdeploy:request_cancelled_total", 0) == before:
        assert time.monotonic() < deadline, (
            "the decode instance went on after the router's client left"
        )
        time.sleep(0.1)
    assert scrape_metrics(decode.base_url)["fastdeploy:num_requests_running"] == 0


def test_the_router_command_takes_api_key_and_reads_the_model_name_with_its_token(pd):
    """As a process: ``router --api-key`` (no ``--served-model-name``: it reads the instances'
    ``/v1/models``, which need its token), then SIGTERM ends it with status 0."""
    prefill, decode = pd
    port = find_free_port_range(1)
    cmd = router_command(port, "--api-key", KEY)
    cmd += ["--prefill", prefill.base_url, "--decode", decode.base_url, "--start-timeout", "30"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while http_get_or_none(url + "/health") != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "the router did not start"
            time.sleep(0.2)
        assert http_get(url + "/v1/models")[0] == 401
        status, text = http_get(url + "/v1/models", headers=AUTH)
        assert status == 200 and json.loads(text)["data"][0]["id"] == "fastdeploy-mtp-tiny"
        status, answer = http_post(
            url + "/v1/completions", {"prompt": "x", "max_tokens": 3}, headers=AUTH
        )
        assert status == 200 and answer["usage"]["completion_tokens"] == 3, answer
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


def http_get_or_none(url: str) -> int | None:
    try:
        return http_get(url, timeout=2)[0]
    except OSError:
        return None


def test_a_stopped_prefill_instance_is_a_504_naming_it_within_the_instance_timeout(pd, router):
    prefill, _ = pd
    os.kill(prefill.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        status, answer = http_post(
            router + "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers=AUTH
        )
        took = time.monotonic() - t0
    finally:
        os.kill(prefill.proc.pid, signal.SIGCONT)
    assert status == 504 and prefill.base_url in error_of(answer)["message"], answer
    assert INSTANCE_TIMEOUT <= took < INSTANCE_TIMEOUT + 5, took


# ---- usage errors (exit status 2, before anything starts) -----------------------------------
@pytest.mark.parametrize(
    "args, words",
    [
        (["serve", "--api-key", ""], ["--api-key"]),
        (
            ["serve", "--splitwise-role", "prefill", "--splitwise-secret-file", "/nonexistent/s"],
            ["/nonexistent/s"],
        ),
        (["serve", "--tokenizer", "/nonexistent/t"], ["--tokenizer /nonexistent/t"]),
        (
            [
                "router",
                "--prefill",
                "http://a:1",
                "--decode",
                "http://b:1",
                "--tokenizer",
                "/nonexistent/t",
            ],
            ["--tokenizer"],
        ),
    ],
)
def test_bad_credentials_and_folders_exit_2_with_one_line(capsys, monkeypatch, args, words):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    if args[0] == "serve":  # KV cache names of its own (another server may use device 0)
        args = [*args, "--device-ids", device_ids(1)]
    code = main([*args, "--port", str(find_free_port_range(1))])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        code == 2 and err.startswith("fastdeploy-mtp: error:") and all(w in err for w in words)
    ), err


def test_a_taken_port_is_refused_by_the_router_before_it_waits(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        code = main(
            [
                "router",
                "--prefill",
                "http://127.0.0.1:9",
                "--decode",
                "http://127.0.0.1:9",
                "--port",
                str(port),
            ]
        )
    err = capsys.readouterr().err
    assert code == 2 and f"--port {port}" in err and "in use" in err, err
    assert time.monotonic() - t0 < 10 and "waiting for" not in err
