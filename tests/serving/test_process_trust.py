"""The process layer of ``serve`` against a hostile local user and a careless operator:

* the engine's socket to its workers lives in a 0700 runtime directory, so another uid
  (``nobody``) cannot even reach it; a stray frame from this user (who can) is dropped and
  counted, and the request in flight still completes exactly;
* the SysV token queue is created exclusively: one planted by another uid at its key makes
  ``serve`` refuse to start instead of trusting it;
* a runtime directory that is not private, or that a live deployment owns, is refused;
* a second mixed server with the first one's ``--device-ids`` is refused while the first
  runs (they would share KV cache names), and the first goes on serving;
* a taken HTTP port is refused before any worker starts (exit status 2);
* SIGKILL of the main process leaves nothing: its cache manager removes the names, the queue
  and the runtime directory, and the workers exit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastdeploy_mtp.distributed import find_free_port_range
from fastdeploy_mtp.ops import messaging
from fastdeploy_mtp.serving.processes import runtime_dir
from tests.support.hostile import run_as_nobody
from tests.support.servers import (
    ServerProcess,
    alive,
    device_ids,
    offline,
    scrape_metrics,
    serving,
    shm_names,
)

MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'


@pytest.fixture(scope="module")
def server():
    yield from serving(["--speculative-config", MTP1])


def free_port() -> int:
    return find_free_port_range(1)


def complete(srv: ServerProcess, prompt: str, max_tokens: int) -> str:
    from tests.support.servers import http_post

    body = {"model": "fastdeploy-mtp-tiny", "prompt": prompt, "max_tokens": max_tokens}
    status, answer = http_post(srv.base_url + "/v1/completions", body, timeout=120)
    assert status == 200, answer
    return answer["choices"][0]["text"]


def test_another_user_cannot_reach_the_worker_socket(server):
    directory = runtime_dir.deployment_dir(server.queue_port)
    sock_path = directory / runtime_dir.SOCKET_NAME
    assert sock_path.exists()
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory.parent).st_mode) == 0o700
    script = f"""
import json, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect({str(sock_path)!r})
    print(json.dumps("connected"))
except OSError as exc:
    print(json.dumps(type(exc).__name__))
"""
    assert run_as_nobody(script) == "PermissionError"


def test_a_stray_frame_is_dropped_and_counted_and_the_request_completes(server):
    import zmq

    prompt = "def area(r): return 3.14159 * r * r"
    expected = offline([prompt], spec=MTP1, max_tokens=40)[0]
    before = scrape_metrics(server.base_url)['fastdeploy:dropped_messages_total{channel="worker"}']
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(runtime_dir.endpoint(server.queue_port))
    try:
        strays = [
            json.dumps({"type": "done", "step": 999999, "rank": 0}).encode(),  # the frame
            b"\x00" * 44,
            json.dumps({"type": "ready", "rank": 0, "pid": 1}).encode(),
        ]
        for stray in strays:
            dealer.send(stray)
        assert complete(server, prompt, 40) == expected  # in flight while the strays arrive
        assert complete(server, prompt, 40) == expected  # and the deployment still works after
    finally:
        dealer.close(0)
        ctx.term()
    metrics = scrape_metrics(server.base_url)
    assert metrics['fastdeploy:dropped_messages_total{channel="worker"}'] - before == len(strays)
    assert server.proc.poll() is None


def test_a_token_queue_planted_by_another_user_is_refused(tmp_path: Path):
    port = 20000 + os.getpid() % 20000
    key = messaging.msg_queue_key(port)
    script = f"""
import ctypes, json
libc = ctypes.CDLL("libc.so.6", use_errno=True)
qid = libc.msgget(ctypes.c_int({key}), 0o1000 | 0o2000 | 0o666)
print(json.dumps(qid))
"""
    assert run_as_nobody(script) >= 0
    try:
        owner = messaging.queue_owner(port)
        assert owner is not None and owner[0] != os.geteuid()
        out = subprocess.run(
            [sys.executable, "-m", "fastdeploy_mtp.entrypoints.cli", "serve",
             "--port", str(free_port()), "--engine-worker-queue-port", str(port),
             "--device-ids", "7777"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 1, out.stderr
        assert f"msg_queue_id {port}" in out.stderr and "belongs to uid" in out.stderr, out.stderr
        assert "worker rank 0 ready" not in out.stderr
        assert messaging.queue_owner(port) == owner  # left as it was
        assert not runtime_dir.deployment_dir(port).exists()
    finally:
        messaging.remove_msg_queue(port)


def test_a_runtime_directory_that_is_not_private_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    base = runtime_dir.base_dir()
    assert base == tmp_path / "fastdeploy_mtp"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    with pytest.raises(runtime_dir.RuntimeDirError, match="mode 755"):
        runtime_dir.claim(5555)
    os.rmdir(base)
    os.symlink(tmp_path, base)
    with pytest.raises(runtime_dir.RuntimeDirError, match="not a directory"):
        runtime_dir.claim(5555)
    os.unlink(base)
    base.mkdir(mode=0o700)
    os.chown(base, 65534, 65534)
    with pytest.raises(runtime_dir.RuntimeDirError, match="owned by uid 65534"):
        runtime_dir.claim(5555)


def test_a_runtime_directory_of_a_live_deployment_is_refused_and_a_dead_ones_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    directory = runtime_dir.claim(5556)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = {"pid": other.pid, "start": runtime_dir.process_start(other.pid), "children": []}
        (directory / runtime_dir.OWNER_NAME).write_text(json.dumps(record))
        with pytest.raises(
            runtime_dir.RuntimeDirError, match=f"another deployment \\(pid {other.pid}\\)"
        ):
            runtime_dir.claim(5556)
        # the same pid, but another process (recycled): not the owner
        (directory / runtime_dir.OWNER_NAME).write_text(
            json.dumps({**record, "start": record["start"] - 1})
        )
        assert runtime_dir.claim(5556) == directory
    finally:
        other.kill()
        other.wait()
    assert runtime_dir.read_owner(directory)["pid"] == os.getpid()  # type: ignore[index]
    runtime_dir.remove(5556)
    assert not directory.exists()


def test_a_second_server_on_the_same_device_ids_is_refused_while_the_first_runs(server):
    device = ",".join(map(str, server.device_ids))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastdeploy_mtp.entrypoints.cli",
            "serve",
            "--port",
            str(free_port()),
            "--device-ids",
            device,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2  # a bad argument
    assert (
        "belongs to a running deployment" in out.stderr and f"--device-ids {device}" in out.stderr
    ), out.stderr
    assert complete(server, "hello", 4)  # the first one's names are intact: it still serves


def test_a_taken_port_is_refused_before_any_worker_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        device = device_ids(1)  # cache names of its own: other servers may run beside this one
        before = shm_names()
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "fastdeploy_mtp.entrypoints.cli", "serve", "--port", str(port),
             "--device-ids", device],
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"--port {port}" in out.stderr and "in use" in out.stderr, out.stderr
    assert "starting the cache manager" not in out.stderr
    caches = ("key_caches", "value_caches")
    made = [
        n for n in shm_names() - before if n.startswith(caches) and n.endswith(f".device{device}")
    ]
    assert not made, made
    print(f"refused in {time.monotonic() - t0:.1f} s")


def test_sigkill_of_the_main_process_leaves_nothing():
    srv = ServerProcess(["--speculative-config", MTP1])
    try:
        assert complete(srv, "hello", 4)
        children = list(srv.children)
        assert children
        directory = runtime_dir.deployment_dir(srv.queue_port)
        assert directory.exists() and messaging.queue_owner(srv.queue_port) is not None
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = srv.leftovers_now()
            if not any(left.values()):
                break
            time.sleep(0.2)
        assert left == {"children": [], "shm": [], "queue": False, "runtime_dir": False}, (
            f"{left}\n{srv.output()}"
        )
        assert "the engine died" in srv.output()
    finally:
        srv.kill()
        srv.close_log()
    assert not any(alive(p) for p in children)
