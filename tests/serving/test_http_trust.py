"""The HTTP surfaces against callers without credentials and against malformed requests:

* ``--api-key``: ``/v1/*`` answers 401 in OpenAI's error shape without ``Authorization:
  Bearer <key>`` (counted in ``/metrics``); ``/health`` and ``/metrics`` stay open;
* errors keep OpenAI's shape (unknown path, wrong method, a body that is not JSON, a lone
  surrogate), refused fields are named, and a non-streaming request whose client leaves is
  aborted;
* splitwise across "hosts": instances and router configured only with
  ``--splitwise-secret-file`` (no environment) serve exactly; another uid, who cannot read
  the file, cannot inject a hand-over; a router with another secret gets a 502 that says so.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fastdeploy_mtp.credentials import API_KEY_ENV, SECRET_ENV
from tests.support.hostile import run_as_nobody
from tests.support.servers import (
    ServerProcess,
    http_get,
    offline,
    scrape_metrics,
    stop_all,
    stopped_cleanly,
)

KEY = "sk-test-" + "k" * 24
MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(["--speculative-config", MTP1], env={**os.environ, API_KEY_ENV: KEY})
    try:
        yield srv
    except BaseException:
        srv.kill()
        raise
    stopped_cleanly(srv)


def post(url: str, body: Any, key: str | None = KEY, raw: bytes | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else json.dumps(body).encode()
    r = httpx.post(url, content=data, headers=headers, timeout=60)
    return r.status_code, r.json()


def is_openai_error(answer: Any) -> bool:
    return isinstance(answer, dict) and set(answer) == {"error"} and {"message", "type"} <= set(answer["error"])


def test_the_api_key_is_required_on_v1_only(server):
    url = server.base_url
    body = {"model": "fastdeploy-mtp-tiny", "prompt": "hello", "max_tokens": 4}
    before = scrape_metrics(url)['fastdeploy:dropped_messages_total{channel="http"}']
    for key in (None, "wrong", KEY + "x", KEY[:-1]):
        status, answer = post(url + "/v1/completions", body, key=key)
        assert status == 401 and is_openai_error(answer), (key, status, answer)
    status, _ = http_get(url + "/v1/models")
    assert status == 401
    assert scrape_metrics(url)['fastdeploy:dropped_messages_total{channel="http"}'] - before == 5
    assert http_get(url + "/health")[0] == 200  # open: no request content in them
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    text = client.completions.create(model="fastdeploy-mtp-tiny", prompt="hello", max_tokens=8).choices[0].text
    assert text == offline(["hello"], spec=MTP1, max_tokens=8)[0]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).models.list()


@pytest.mark.parametrize(
    "method, path, status",
    [("GET", "/v1/nothing-here", 404), ("GET", "/v1/completions", 405), ("DELETE", "/health", 405)],
)
def test_framework_errors_keep_openais_shape(server, method, path, status):
    r = httpx.request(method, server.base_url + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == status and is_openai_error(r.json()), r.text


def test_a_body_that_is_not_json_is_a_400_in_openais_shape(server):
    status, answer = post(server.base_url + "/v1/completions", None, raw=b'{"prompt": "a", ')
    assert status == 400 and is_openai_error(answer), answer


@pytest.mark.parametrize(
    "path, raw, param",
    [
        ("/v1/completions", b'{"prompt": "ab\\ud800", "max_tokens": 4}', "prompt"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x\\udfff"}], "max_tokens": 4}',
            "messages",
        ),
        ("/v1/completions", b'{"prompt": "ok", "stop": ["\\ud800"], "max_tokens": 4}', "stop"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, raw, param):
    status, answer = post(server.base_url + path, None, raw=raw)
    assert status == 400 and is_openai_error(answer) and answer["error"]["param"] == param, answer
    assert "surrogate" in answer["error"]["message"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ({"suffix": "tail"}, "suffix"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"guided_regex": "a+"}, "guided_regex"),
    ],
)
def test_what_the_server_cannot_honour_is_refused_by_name(server, extra, param):
    body = {"prompt": "hello", "max_tokens": 4, **extra}
    status, answer = post(server.base_url + "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == param, answer
    # the neutral values ask for nothing and are accepted
    neutral = {"prompt": "hello", "max_tokens": 4, "response_format": {"type": "text"}, "tool_choice": "none"}
    assert post(server.base_url + "/v1/completions", neutral)[0] == 200


def test_a_non_streaming_request_is_aborted_when_its_client_leaves(server):
    body = {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.base_url + "/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=httpx.Timeout(1.5, connect=5),
        )
    deadline = time.monotonic() + 10
    while scrape_metrics(server.base_url)["fastdeploy:num_requests_running"] > 0:
        assert time.monotonic() < deadline, "the abandoned request still holds its slot"
        time.sleep(0.1)


# ---- splitwise with a secret file on every "host" --------------------------------------------
def secret_file(folder: Path, name: str) -> Path:
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    return path


def test_splitwise_with_secret_files_only(tmp_path: Path):
    from fastdeploy_mtp.credentials import read_secret_file
    from fastdeploy_mtp.serving.router_backend import RouterBackend
    from fastdeploy_mtp.serving.router_server import router_app
    from tests.support.servers import ThreadServer, find_free_port_range, splitwise_post

    os.chmod(tmp_path, 0o700)  # the other uid cannot read the file (nor list the folder)
    ours, theirs = secret_file(tmp_path, "ours"), secret_file(tmp_path, "theirs")
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    flags = ["--splitwise-secret-file", str(ours)]
    started: list[ServerProcess] = []
    try:
        for role, extra in (("prefill", []), ("decode", ["--kv-transport", "tcp"])):
            args = ["--speculative-config", MTP1, "--splitwise-role", role, *flags, *extra]
            started.append(ServerProcess([*args, "--device-ids", _device_id()], env=env))
        p, d = started
        prompt = "The quick brown fox"
        expected = offline([prompt], spec=MTP1, max_tokens=16)[0]
        for secret, status in ((read_secret_file(ours), 200), (read_secret_file(theirs), 502)):
            backend = RouterBackend([p.base_url], [d.base_url], 60.0, secret=secret)
            srv = ThreadServer(router_app(backend, "fastdeploy-mtp-tiny"), find_free_port_range(1))
            try:
                r = httpx.post(srv.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 16}, timeout=120)
            finally:
                srv.stop()
            assert r.status_code == status, r.text
            if status == 200:
                assert r.json()["choices"][0]["text"] == expected
            else:
                assert "same splitwise secret" in r.json()["error"]["message"], r.text
        # another uid with a hand-over-shaped body: refused before anything is parsed
        before = scrape_metrics(d.base_url)['fastdeploy:dropped_messages_total{channel="http"}']
        script = f"""
import json, urllib.request, urllib.error
body = json.dumps({{"request_id": "x", "prompt_token_ids": [1, 2], "output_token_ids": [3], "max_tokens": 4,
                   "handoff": {{}}}}).encode()
codes = []
for auth in (None, "Bearer guess"):
    headers = {{"Content-Type": "application/json"}}
    if auth:
        headers["Authorization"] = auth
    req = urllib.request.Request({d.base_url + "/v1/splitwise/decode"!r}, body, headers)
    try:
        codes.append(urllib.request.urlopen(req, timeout=10).status)
    except urllib.error.HTTPError as e:
        codes.append(e.code)
print(json.dumps(codes))
"""
        assert run_as_nobody(script) == [401, 401]
        after = scrape_metrics(d.base_url)['fastdeploy:dropped_messages_total{channel="http"}']
        assert after - before == 2
        # the API key of a client does not open the splitwise endpoints either; the router token does
        assert splitwise_post(d.base_url + "/v1/splitwise/decode", {}, secret=read_secret_file(theirs))[0] == 401
        assert splitwise_post(d.base_url + "/v1/splitwise/decode", {}, secret=read_secret_file(ours))[0] == 400
    except BaseException:
        stop_all(started)
        raise
    while started:
        stopped_cleanly(started.pop())


def _device_id() -> str:
    from tests.support.servers import device_ids

    return device_ids(1)
