"""Splitwise across "hosts": instances and a router configured only with
``--splitwise-secret-file`` (no environment) serve exactly; another uid, who cannot read the
file, cannot inject a hand-over; a router with another secret gets a 502 that says so; the
router token of another secret does not open the splitwise endpoints.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from fastdeploy_mtp.credentials import SECRET_ENV
from tests.support.hostile import run_as_nobody
from tests.support.servers import ServerProcess, offline, scrape_metrics, stop_all, stopped_cleanly

MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'


def secret_file(folder: Path, name: str) -> Path:
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    return path


def test_splitwise_with_secret_files_only(tmp_path: Path):
    from fastdeploy_mtp.credentials import read_secret_file
    from fastdeploy_mtp.serving.router.forwarding import Instances
    from fastdeploy_mtp.serving.router.routing import RouterBackend
    from fastdeploy_mtp.serving.router.server import router_app
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
            backend = RouterBackend(Instances([p.base_url], [d.base_url], 60.0, secret=secret))
            srv = ThreadServer(router_app(backend, "fastdeploy-mtp-tiny"), find_free_port_range(1))
            try:
                r = httpx.post(
                    srv.url + "/v1/completions",
                    json={"prompt": prompt, "max_tokens": 16},
                    timeout=120,
                )
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
body = json.dumps({{"request_id": "x", "prompt_token_ids": [1, 2], "output_token_ids": [3],
                   "max_tokens": 4, "handoff": {{}}}}).encode()
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
        # the API key of a client does not open the splitwise endpoints either; the router token
        # does
        assert (
            splitwise_post(
                d.base_url + "/v1/splitwise/decode", {}, secret=read_secret_file(theirs)
            )[0]
            == 401
        )
        assert (
            splitwise_post(d.base_url + "/v1/splitwise/decode", {}, secret=read_secret_file(ours))[
                0
            ]
            == 400
        )
    except BaseException:
        stop_all(started)
        raise
    while started:
        stopped_cleanly(started.pop())


def _device_id() -> str:
    from tests.support.servers import device_ids

    return device_ids(1)
