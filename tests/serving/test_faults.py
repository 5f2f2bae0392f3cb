"""Fault injection on a mixed ``serve`` under load: three clients keep sending streaming
requests while one process of the deployment is killed (SIGKILL) or stopped (SIGSTOP).

* main process (API server + engine): SIGKILL: connections are refused or reset at once, and
  the cache manager cleans up; SIGSTOP: no one can answer, so the clients' own timeout
  applies; then SIGKILL, and the cache manager cleans up.
* worker rank 0: SIGKILL: the engine notices within one poll; requests fail with an error
  naming the worker and the server exits 1. SIGSTOP: the same after ``--step-timeout``.
* cache manager: SIGKILL: as a worker. SIGSTOP: nothing to notice (the caches live on), the
  requests succeed, and SIGTERM still stops everything.

After each: no process, no ``/dev/shm`` name, no SysV queue and no runtime directory of
that server remain. ``pytest -s`` prints the fault table.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.faults import Load
from tests.support.servers import ServerProcess

MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'
STEP_TIMEOUT = 5.0
CLIENT_TIMEOUT = 10.0  # a client's own patience with a server that says nothing
#: every request ends, and the server exits, within this after the fault (step timeout,
#: uvicorn's graceful shutdown of 5 s, the children's stop, slack for a loaded 2-core machine)
BOUND = STEP_TIMEOUT + 30.0
TABLE: list[str] = []


def pid_of(srv: ServerProcess, kind: str) -> int:
    if kind == "main":
        return srv.proc.pid
    if kind == "worker":
        return srv.worker_pids()[0]
    for pid in srv.children:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"fastdeploy_mtp.serving.processes.cache_manager" in f.read():
                return pid
    raise AssertionError("no cache manager")


def wait_gone(srv: ServerProcess, timeout: float = 30.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        left = srv.leftovers_now()
        if not any(left.values()) or time.monotonic() > deadline:
            return srv.leftovers()
        time.sleep(0.2)


@pytest.mark.parametrize("kind", ["main", "worker", "cache manager"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["SIGKILL", "SIGSTOP"])
def test_a_fault_under_load_ends_every_request_and_leaves_nothing(kind: str, sig: int) -> None:
    srv = ServerProcess(["--speculative-config", MTP1, "--step-timeout", str(STEP_TIMEOUT)])
    try:
        load = Load(srv.base_url, client_timeout=CLIENT_TIMEOUT)
        load.start()
        time.sleep(2.0)
        assert any(o.kind == "ok" for o in load.outcomes), [o.detail for o in load.outcomes]
        target = pid_of(srv, kind)
        faulted_at = time.monotonic()
        os.kill(target, sig)
        if kind == "main" and sig == signal.SIGSTOP:
            time.sleep(CLIENT_TIMEOUT + 2)
            os.kill(target, signal.SIGKILL)  # the operator's next step; the survivors clean up
        else:
            try:
                code = srv.proc.wait(BOUND)
            except Exception:
                code = None
        load.finish()
        after = load.after(faulted_at)
        failed = [o for o in after if o.kind != "ok"]
        slowest = max((o.ended - max(o.started, faulted_at) for o in after), default=0.0)
        kinds = sorted({o.kind for o in failed})
        TABLE.append(
            f"{kind:13s} {signal.Signals(sig).name:8s} {len(after):3d} requests ended after, "
            f"{len(failed):3d} failed {kinds}, slowest {slowest:4.1f} s: "
            f"{sorted({o.detail[:80] for o in failed})[:2]}"
        )
        if kind == "cache manager" and sig == signal.SIGSTOP:
            assert not failed, [o.detail for o in failed]  # the caches live on: nothing to fail
            assert srv.proc.poll() is None
            os.kill(target, signal.SIGCONT)
            assert srv.stop(60) == 0
        elif kind == "main" and sig == signal.SIGSTOP:
            # the clients' own timeout; requests sent meanwhile are reset by the SIGKILL
            assert any(o.kind == "hung" for o in failed), [(o.kind, o.detail) for o in failed]
            assert all(o.kind in ("hung", "refused") for o in failed), [
                (o.kind, o.detail) for o in failed
            ]
        elif kind == "main":
            assert failed and all(o.kind == "refused" for o in failed), [
                (o.kind, o.detail) for o in failed
            ]
        else:
            assert code == 1, f"the server did not exit 1 within {BOUND} s:\n{srv.output()}"
            assert failed and all(o.kind in ("error", "refused") for o in failed), [
                (o.kind, o.detail) for o in failed
            ]
            errors = [o.detail for o in failed if o.kind == "error"]
            odd = [e for e in errors if "not OpenAI's error shape" in e]
            assert errors and not odd, odd or errors  # the message names the odd bodies themselves
            assert all(o.ended - max(o.started, faulted_at) <= BOUND for o in after)
        if kind != "main":
            srv.proc.wait(30)
        else:
            srv.proc.wait(10)
        left = wait_gone(srv)
        assert not any(left.values()), f"left behind {left}:\n{srv.output()}"
    except BaseException:
        srv.kill()
        raise
    finally:
        if srv.proc.poll() is None:
            srv.kill()
    srv.close_log()


def teardown_module() -> None:
    print(
        "\nfault table (process, signal, requests ending after the fault, failures, slowest end, "
        "messages):"
    )
    for line in TABLE:
        print("  " + line)
