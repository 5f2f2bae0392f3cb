"""Run part of an op test in a forked child process: for calls that must finish (a length
value of 2**31 - 1 must not cost CPU time proportional to it) and for calls under a
resource limit (worker threads that cannot be created). The child inherits the imported
modules, so starting it is cheap; a hang is a failure after `timeout` seconds, not a stuck
test run."""

from __future__ import annotations

import multiprocessing
import os
import resource
import traceback
from collections.abc import Callable
from typing import Any


def _child(conn, fn: Callable[[], Any], address_space_headroom: int | None) -> None:
    try:
        if address_space_headroom is not None:
            # the address space in use now, plus a little: a thread's stack no longer fits
            with open("/proc/self/statm") as f:
                in_use = int(f.read().split()[0]) * resource.getpagesize()
            limit = in_use + address_space_headroom
            resource.setrlimit(
                resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1])
            )
        conn.send(("ok", fn()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))


#: Set by scripts/asan_check.sh: the sanitizer's shadow memory cannot live under RLIMIT_AS.
SANITIZED = bool(os.environ.get("FDMTP_SANITIZED"))


def run_in_child(
    fn: Callable[[], Any], *, timeout: float = 120.0, address_space_headroom: int | None = None
) -> Any:
    """fn() in a forked child; returns its (picklable) result, re-raises its failure as an
    AssertionError, and fails when it does not finish within `timeout` seconds."""
    if address_space_headroom is not None and SANITIZED:
        import pytest

        pytest.skip(
            "an address-space limit cannot be combined with AddressSanitizer's shadow memory"
        )
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, address_space_headroom))
    proc.start()
    child.close()
    if not parent.poll(timeout):
        proc.kill()
        proc.join()
        raise AssertionError(f"the call did not finish within {timeout} s")
    try:
        status, value = parent.recv()
    except EOFError:  # the child died without reporting (a crash)
        proc.join(timeout)
        raise AssertionError(f"the child process died with exit code {proc.exitcode}") from None
    proc.join(timeout)
    if status != "ok":
        raise AssertionError(f"the call failed in the child process:\n{value}")
    return value


def run_op_in_child(backend, op: str, tensors, attrs=(), outputs=(), timeout: float = 300.0) -> Any:
    """backend.run(op, ...) in a forked child (as backend.run: every tensor after the call)."""
    return run_in_child(
        lambda: backend.run(op, list(tensors), tuple(attrs), list(outputs)), timeout=timeout
    )
