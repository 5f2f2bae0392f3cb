"""IPCSignal in one process: naming, values, errors and timeouts (cross-process behaviour
is in test_ipc_processes.py)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from fastdeploy_mtp.runtime.ipc import CreatorGoneError, IPCSignal, IPCSignalError, shared_memory_exists

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs POSIX shared memory at /dev/shm")


@pytest.fixture
def suffix():
    s = uuid.uuid4().hex[:8]
    yield s
    left = [p.name for p in SHM.iterdir() if p.name.endswith("." + s)]
    for n in left:
        (SHM / n).unlink(missing_ok=True)
    assert not left, f"/dev/shm leftovers: {left}"


def test_create_attach_share_values_and_clear(suffix):
    s = IPCSignal("cache_ready_signal", np.array([0, 5], np.int32), np.int32, suffix=suffix)
    assert s.name == f"cache_ready_signal.{suffix}" and shared_memory_exists(s.name)
    a = IPCSignal("cache_ready_signal", np.zeros(2, np.int32), np.int32, suffix=suffix, create=False)
    assert a.value.tolist() == [0, 5] and a.creator_pid == s.creator_pid and a.creator_alive()
    a.value[0] = 1
    assert s.value[0] == 1
    a.close()
    s.clear()
    assert not shared_memory_exists(s.name)
    s.clear()  # twice is fine


def test_create_replaces_a_stale_block(suffix):
    old = IPCSignal("sig", np.full(3, 7, np.int64), np.int64, suffix=suffix)
    new = IPCSignal("sig", np.zeros(3, np.int64), np.int64, suffix=suffix)
    assert new.value.tolist() == [0, 0, 0] and old.value.tolist() == [7, 7, 7]
    old.close()
    new.clear()


def test_raw_block_has_no_value(suffix):
    s = IPCSignal("raw", shm_size=64, suffix=suffix)
    assert s.value is None and s.shm.size >= 64
    with pytest.raises(IPCSignalError, match="raw block has no value"):
        s.wait_for(lambda v: True, timeout=0.1)
    s.clear()


def test_bad_arguments():
    with pytest.raises(IPCSignalError, match="does not match the array's int32"):
        IPCSignal("x", np.zeros(2, np.int32), np.int64)
    with pytest.raises(IPCSignalError, match="give `array` and `dtype`, or `shm_size`"):
        IPCSignal("x")
    with pytest.raises(IPCSignalError, match="contain no '/'"):
        IPCSignal("a/b", np.zeros(2, np.int32), np.int32)


def test_attach_before_create_times_out_with_a_clear_error(suffix):
    t0 = time.monotonic()
    with pytest.raises(IPCSignalError, match=r"no such shared-memory segment after waiting 0.2 s"):
        IPCSignal("never", np.zeros(1, np.int32), np.int32, suffix=suffix, create=False, timeout=0.2)
    assert time.monotonic() - t0 < 5


def test_attached_block_smaller_than_the_array(suffix):
    s = IPCSignal("small", np.zeros(2, np.int32), np.int32, suffix=suffix)
    with pytest.raises(IPCSignalError, match="the segment holds 24 bytes, the array needs 4096"):
        IPCSignal("small", np.zeros(1024, np.int32), np.int32, suffix=suffix, create=False)
    s.clear()


def test_wait_for_times_out_while_the_creator_lives(suffix):
    s = IPCSignal("wait", np.zeros(1, np.int32), np.int32, suffix=suffix)
    a = IPCSignal("wait", np.zeros(1, np.int32), np.int32, suffix=suffix, create=False)
    with pytest.raises(IPCSignalError, match=r"timed out after 0.2 s .*value \[0\]"):
        a.wait_for(lambda v: v[0] == 1, timeout=0.2)
    s.value[0] = 1
    assert a.wait_for(lambda v: v[0] == 1, timeout=0.2)[0] == 1
    a.close()
    s.clear()


def test_wait_for_reports_a_dead_creator(suffix):
    s = IPCSignal("dead", np.zeros(1, np.int32), np.int32, suffix=suffix)
    a = IPCSignal("dead", np.zeros(1, np.int32), np.int32, suffix=suffix, create=False)
    a.creator_pid = 2**22 + 12345  # beyond pid_max on default kernels: no such process
    with pytest.raises(CreatorGoneError, match="exited before the awaited condition held"):
        a.wait_for(lambda v: v[0] == 1, timeout=30)
    a.close()
    s.clear()
