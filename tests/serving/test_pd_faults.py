"""Fault injection on a splitwise deployment under load: a prefill instance, a decode
instance and a router (each its own process tree) serve a few clients that keep sending
streaming requests; one process kind is killed (SIGKILL) or stopped (SIGSTOP).

What must hold for each fault:

* every client request ends within the documented bound: a stopped instance is noticed by
  the router's ``--instance-timeout`` (and by the decode instance's
  ``--kv-transfer-timeout`` for a pull from a stopped prefill instance); a killed one at
  once. It ends either with its full output or with an error a client can read (an HTTP
  error in OpenAI's shape, an error event in the stream, or, for a killed router, a refused
  or reset connection), never by hanging;
* afterwards nothing of the faulted instance remains: no process, no ``/dev/shm`` name,
  no SysV queue (a SIGKILLed main process is cleaned up by its surviving children);
* the instances that were not faulted still serve and stop cleanly.

``pytest -s`` prints the fault table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from typing import Any

import httpx
import pytest

from fastdeploy_mtp.distributed import find_free_port_range
from tests.support.faults import Load
from tests.support.servers import router_command, splitwise_instance, stop_all, stopped_cleanly

MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'
INSTANCE_TIMEOUT = 4.0  # the router's read timeout on an instance
TRANSFER_TIMEOUT = 4.0  # the decode instance's bound on one KV pull
#: a request ends within this after the fault (the timeouts above plus scheduling slack on 2 cores)
BOUND = INSTANCE_TIMEOUT + TRANSFER_TIMEOUT + 20.0
#: how long the load runs after the fault (every bound above has passed by then)
SETTLE = INSTANCE_TIMEOUT + TRANSFER_TIMEOUT + 4.0


class RouterProcess:
    """``fastdeploy-mtp router`` over one prefill and one decode instance, in its own session."""

    def __init__(self, prefill: str, decode: str):
        self.port = find_free_port_range(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(
            "w+", prefix="fdmtp-router-", suffix=".log", delete=False
        )
        cmd = router_command(self.port)
        cmd += [
            "--prefill",
            prefill,
            "--decode",
            decode,
            "--instance-timeout",
            str(INSTANCE_TIMEOUT),
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"the router exited:\n{self.output()}"
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the router did not start:\n{self.output()}"
            time.sleep(0.2)

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()
        os.unlink(self.log.name)


TABLE: list[str] = []


def wait_until_gone(srv: Any, timeout: float = 30.0) -> dict[str, object]:
    """The leftovers of a killed instance once its survivors had ``timeout`` s to clean up."""
    deadline = time.monotonic() + timeout
    while True:
        left = srv.leftovers_now()
        if not any(left.values()) or time.monotonic() > deadline:
            return srv.leftovers()  # and the rest removed, for the next test
        time.sleep(0.25)


@pytest.mark.parametrize(
    "kind,sig",
    [
        ("prefill", signal.SIGKILL),
        ("prefill", signal.SIGSTOP),
        ("decode", signal.SIGKILL),
        ("decode", signal.SIGSTOP),
        ("router", signal.SIGKILL),
    ],
    ids=lambda v: v if isinstance(v, str) else signal.Signals(v).name,
)
def test_a_fault_under_load_ends_every_request_and_leaves_nothing(kind: str, sig: int) -> None:
    timeouts = ["--kv-transfer-timeout", str(TRANSFER_TIMEOUT), "--kv-hold-timeout", "30"]
    started = []
    router = None
    try:
        started.append(splitwise_instance("prefill", MTP1, *timeouts))
        started.append(splitwise_instance("decode", MTP1, "--kv-transport", "tcp", *timeouts))
        p, d = started
        router = RouterProcess(p.base_url, d.base_url)
        load = Load(router.url, client_timeout=BOUND + 30)
        load.start()
        time.sleep(3.0)  # requests in prefill, in transfer and decoding
        assert any(o.kind == "ok" for o in load.outcomes), [o.detail for o in load.outcomes]
        target = {"prefill": p.proc, "decode": d.proc, "router": router.proc}[kind]
        faulted_at = time.monotonic()
        os.kill(target.pid, sig)
        time.sleep(SETTLE)
        load.finish()
        after = [o for o in load.outcomes if o.ended >= faulted_at]
        late = [o for o in after if o.ended - max(o.started, faulted_at) > BOUND]
        hung = [o for o in after if o.kind == "hung"]
        failed = [o for o in after if o.kind in ("error", "refused")]
        slowest = max((o.ended - max(o.started, faulted_at) for o in after), default=0.0)
        seen = sorted({o.detail[:90] for o in failed})
        TABLE.append(
            f"{kind:8s} {signal.Signals(sig).name:8s} {len(after):3d} requests, {len(failed):3d} "
            f"failed, slowest end {slowest:5.1f} s: {seen[:3]}"
        )
        assert not hung and not late, [(o.kind, o.detail) for o in hung + late]
        assert failed, "the fault was not noticed by any client"
        if kind == "router":
            assert all(o.kind == "refused" for o in failed), seen
        else:
            assert all(o.kind == "error" for o in failed), seen  # an answer, in OpenAI's shape
            assert all("not OpenAI's error shape" not in o.detail for o in failed), seen
        if sig == signal.SIGSTOP:
            os.kill(target.pid, signal.SIGCONT)
        elif kind != "router":
            victim = p if kind == "prefill" else d
            target.wait(10)
            left = wait_until_gone(victim)
            assert not any(left.values()), f"{kind} left {left}:\n{victim.output()}"
            started.remove(victim)
            victim.close_log()
        router.stop()
        router = None
        while started:  # the others still stop cleanly
            stopped_cleanly(started.pop())
    except BaseException:
        if router is not None:
            router.stop()
        stop_all(started)
        raise


def teardown_module() -> None:
    print(
        "\nfault table (kind, signal, requests ending after the fault, failures, slowest end, "
        "messages):"
    )
    for line in TABLE:
        print("  " + line)
