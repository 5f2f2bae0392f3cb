"""IPCSignal in one process: naming, values, errors and timeouts (cross-process behaviour
is in test_ipc_processes.py)."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from fastdeploy_mtp.ipc.signals import (
    CreatorGoneError,
    IPCSignal,
    IPCSignalError,
    IPCSignalNameError,
    shared_memory_exists,
)

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
    a = IPCSignal(
        "cache_ready_signal", np.zeros(2, np.int32), np.int32, suffix=suffix, create=False
    )
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
        IPCSignal(
            "never", np.zeros(1, np.int32), np.int32, suffix=suffix, create=False, timeout=0.2
        )
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


# ---- hardening: names, ownership and stale values (issue 13) -------------------------------
#
# Signals are forged by writing /dev/shm/<name> directly: the array's bytes, then our
# 16-byte trailer (magic, creator pid), as fastdeploy_mtp/ipc/signals.py lays it out.

TRAILER = struct.Struct("<Qq")
SIGNAL_MAGIC = 0x4C4E474953504446


def forge_signal(name: str, value: np.ndarray, pid: int | None, mode: int = 0o600) -> Path:
    raw = value.tobytes() + (TRAILER.pack(SIGNAL_MAGIC, pid) if pid is not None else b"")
    path = SHM / name
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, raw)
    finally:
        os.close(fd)
    os.chmod(path, mode)
    return path


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert proc.wait(timeout=60) == 0
    return proc.pid


@pytest.mark.parametrize(
    ("name", "suffix", "message"),
    [
        ("x" * 300, None, r"`name` 'x{40}'\.\.\. is 300 bytes long; at most 255"),
        (
            "cache_ready_signal",
            "9" * 250,
            r"`name` \+ '\.' \+ `suffix` '.*'\.\.\. is 269 bytes long; at most 255",
        ),
        ("..", None, r"`name` '\.\.' must not contain '\.\.'"),
        ("a..b", None, r"`name` 'a\.\.b' must not contain '\.\.'"),
        (
            "cache_ready_signal",
            "..",
            r"`name` \+ '\.' \+ `suffix` 'cache_ready_signal\.\.\.' must not contain '\.\.'",
        ),
        (
            "sig",
            "../../etc/x",
            r"`name` \+ '\.' \+ `suffix` 'sig\.\.\./\.\./etc/x' must contain no '/'",
        ),
        ("bad name", None, r"`name` 'bad name' may hold only letters, digits, '_', '\.' and '-'"),
        ("nul\x00", None, r"`name` 'nul\\x00' may hold only letters"),
        ("ünï", None, r"`name` 'ünï' may hold only letters"),
    ],
)
def test_bad_signal_names_are_refused_naming_the_argument(name, suffix, message):
    """Long or '..'-containing names used to raise a raw OSError from shm_open."""
    for create in (True, False):
        with pytest.raises(IPCSignalNameError, match=rf"^IPCSignal: {message}"):
            IPCSignal(name, np.zeros(1, np.int32), np.int32, suffix=suffix, create=create)
    assert issubclass(IPCSignalNameError, ValueError) and issubclass(
        IPCSignalNameError, IPCSignalError
    )


def test_the_longest_valid_name_works(suffix):
    s = IPCSignal("n" * (254 - len(suffix)), np.zeros(1, np.int32), np.int32, suffix=suffix)
    assert len(s.name) == 255
    s.clear()


@pytest.mark.parametrize("mode", [0o666, 0o660, 0o604, 0o640])
def test_attach_refuses_a_forged_ready_signal_others_can_access(suffix, mode):
    """A forged `cache_ready_signal.<port>` holding 1, planted world- or group-accessible
    (with a live pid in the trailer), is refused before its value is read."""
    forge_signal(f"cache_ready_signal.{suffix}", np.ones(1, np.int32), os.getpid(), mode)
    with pytest.raises(
        IPCSignalError,
        match=rf"the segment has mode 0{mode:03o}: other users may read or write it "
        r"\(IPCSignal creates segments with mode 0600\); refusing to attach it",
    ):
        IPCSignal(
            "cache_ready_signal", np.zeros(1, np.int32), np.int32, suffix=suffix, create=False
        )
    (SHM / f"cache_ready_signal.{suffix}").unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file another owner")
def test_attach_and_create_refuse_a_signal_owned_by_another_uid(suffix):
    """No second user exists here; as root the test chowns a forged 0600 signal to another
    uid (root could open it, and is refused all the same)."""
    path = forge_signal(f"cache_ready_signal.{suffix}", np.ones(1, np.int32), os.getpid())
    other = os.geteuid() + 4242
    os.chown(path, other, -1)
    with pytest.raises(
        IPCSignalError,
        match=rf"the segment is owned by uid {other}, not by this process's uid {os.geteuid()}; "
        "refusing to attach a segment another user created",
    ):
        IPCSignal(
            "cache_ready_signal", np.zeros(1, np.int32), np.int32, suffix=suffix, create=False
        )
    with pytest.raises(
        IPCSignalError,
        match=rf"a segment of that name exists and is owned by uid {other}, "
        r".*refusing to replace another user's",
    ):
        IPCSignal("cache_ready_signal", np.zeros(1, np.int32), np.int32, suffix=suffix)
    assert path.stat().st_uid == other  # left alone
    path.unlink()


def test_create_replaces_a_planted_world_writable_signal_with_a_private_one(suffix):
    planted = forge_signal(f"sig.{suffix}", np.full(2, 9, np.int32), os.getpid(), 0o666)
    spy = os.open(planted, os.O_RDWR)
    try:
        s = IPCSignal("sig", np.zeros(2, np.int32), np.int32, suffix=suffix)
        st = (SHM / s.name).stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_ino != os.fstat(spy).st_ino
        s.value[:] = 1
        assert np.frombuffer(os.pread(spy, 8, 0), np.int32).tolist() == [9, 9]  # none of the writes
    finally:
        os.close(spy)
    s.clear()


def test_wait_for_refuses_a_value_left_by_a_dead_creator(suffix):
    """A previous run's `cache_ready_signal` still holding 1 after its creator died used to
    be accepted at once, so a restarted worker attached stale caches."""
    forge_signal(f"cache_ready_signal.{suffix}", np.ones(2, np.int32), dead_pid())
    a = IPCSignal(
        "cache_ready_signal", np.zeros(2, np.int32), np.int32, suffix=suffix, create=False
    )
    assert a.value.tolist() == [1, 1] and a.creator_pid > 0 and not a.creator_alive()
    with pytest.raises(
        CreatorGoneError,
        match=r"its creator \(pid \d+\) has exited; the value it left is stale and not accepted",
    ):
        a.wait_for(lambda v: v[0] == 1, timeout=30)
    a.close()
    (SHM / a.name).unlink()


def test_wait_for_accepts_a_value_while_the_creator_lives(suffix):
    s = IPCSignal("cache_ready_signal", np.ones(1, np.int32), np.int32, suffix=suffix)
    a = IPCSignal(
        "cache_ready_signal", np.zeros(1, np.int32), np.int32, suffix=suffix, create=False
    )
    assert a.wait_for(lambda v: v[0] == 1, timeout=1)[0] == 1
    a.close()
    s.clear()


def test_attach_refuses_a_directory_in_place_of_a_signal(suffix):
    (SHM / f"sig.{suffix}").mkdir(mode=0o700)
    try:
        with pytest.raises(IPCSignalError, match=r"IPCSignal 'sig\..*': cannot attach the segment"):
            IPCSignal("sig", np.zeros(1, np.int32), np.int32, suffix=suffix, create=False)
    finally:
        (SHM / f"sig.{suffix}").rmdir()
