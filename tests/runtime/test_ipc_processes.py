"""KV caches and signals shared between real processes (subprocesses, not threads).

Every process runs under a timeout; every test asserts that /dev/shm holds none of its
names afterwards (cleaning up before failing, so one failure does not leak into others).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from fastdeploy_mtp.ipc.signals import IPCSignal

ROLES = str(Path(__file__).with_name("ipc_roles.py"))
SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs POSIX shared memory at /dev/shm")


def leftovers(tag: str):
    return sorted(p.name for p in SHM.iterdir() if tag in p.name)


@pytest.fixture
def tag():
    t = f"fdmtpt{uuid.uuid4().hex[:8]}_"
    yield t
    # Tests that expect a clean teardown assert it themselves; here whatever a killed
    # process left is removed, and /dev/shm must then hold none of this test's names.
    for name in leftovers(t):
        (SHM / name).unlink(missing_ok=True)
    assert leftovers(t) == []


def start(role: str, tag: str, layers: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-W", "ignore", ROLES, role, tag, str(layers), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 60) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"process hung; output:\n{out}")
    return out


def test_creator_publishes_kv_caches_and_attacher_started_first_writes_them(tag):
    layers = 5  # every shareable dtype; 10 caches
    attacher = start("attacher", tag, layers, "--timeout", "40")  # attach-before-create
    time.sleep(0.2)
    creator = start("creator", tag, layers, "--timeout", "40")
    out_a = finish(attacher)
    out_c = finish(creator)
    assert attacher.returncode == 0 and "ATTACHER-OK" in out_a, out_a
    assert creator.returncode == 0 and "CREATOR-OK" in out_c, out_c
    assert leftovers(tag) == []  # clean teardown: every cache and signal unlinked


def test_attacher_gives_up_when_the_creator_dies_mid_way(tag):
    creator = start("creator", tag, 3, "--crash-after", "2")
    line = creator.stdout.readline()
    assert "CRASH-POINT" in line, line
    attacher = start("attacher", tag, 3, "--timeout", "60")
    line = attacher.stdout.readline()  # attached to the ready signal, now waiting on it
    assert "WAITING" in line, line
    t0 = time.monotonic()
    creator.send_signal(signal.SIGKILL)
    creator.wait(timeout=10)
    out = finish(attacher, timeout=60)
    assert attacher.returncode == 3, out
    assert "GONE" in out and "exited before the awaited condition held" in out, out
    assert time.monotonic() - t0 < 30  # not the 60 s timeout: it noticed the death
    # A killed creator cannot tear down: the two caches it published stay until someone
    # unlinks them (the fixture does, then checks nothing else is left).
    names = leftovers(tag)
    assert any("key_caches_0" in n for n in names), names


def test_attaching_a_signal_does_not_let_the_attachers_tracker_delete_it(tag):
    sig = IPCSignal("probe", np.arange(4, dtype=np.int32), np.int32, suffix=tag)
    code = f"""
        import sys, numpy as np
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from fastdeploy_mtp.ipc.signals import IPCSignal
        s = IPCSignal("probe", np.zeros(4, np.int32), np.int32, suffix={tag!r}, create=False)
        s.value[0] = 42
        # exits without clear(): Python's resource tracker must not unlink the segment
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "leaked shared_memory" not in proc.stderr
    assert (SHM / f"probe.{tag}").exists()
    assert sig.value.tolist() == [42, 1, 2, 3]
    sig.clear()
    assert not (SHM / f"probe.{tag}").exists()
