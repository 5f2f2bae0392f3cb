"""The ``shm`` token channel (the default): the engine's private shared-memory segment,
which rank 0 writes each step's tokens to.

A POSIX shared-memory segment ``/dev/shm/fdmtp_step_tokens.<port>``
(``<port>``: the deployment's ``--engine-worker-queue-port``, like its other names),
created by the engine with mode 0600 and removed when it stops. Any number of slots; one
copy of ``N * (K+1) * 8 + N * 4`` bytes per step. Layout (little-endian): a header of
:data:`HEADER_INTS` int64 (magic, version, creator pid, creator start time, ``N``,
``K+1``, step), then ``counts int32 [N]`` (padded to 8 bytes), then
``tokens int64 [N, K+1]``. Rank 0 writes the counts and the tokens, then the step number;
the ``done`` reply (a ZMQ message, so a system call after the writes) tells the engine to
read; a step number that is not the awaited one is a :class:`WorkerStepError`.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import TokenChannelError, WorkerStepError

if TYPE_CHECKING:
    from ...runtime.target_runner import StepOutput

#: the shm segment's name in /dev/shm, suffixed with ``.<engine_worker_queue_port>``
SHM_PREFIX = "fdmtp_step_tokens"
#: int64 fields before the counts: magic, version, creator pid, creator start, N, K+1, step
HEADER_INTS = 7
_MAGIC = 0x4E4B5450544D4446  # "FDMTPTKN"
_VERSION = 1
_STEP_AT = 6


def shm_name(port: int) -> str:
    """The shm segment's name (in /dev/shm) of the deployment on engine-worker port ``port``."""
    return f"{SHM_PREFIX}.{port}"


def shm_bytes(n: int, width: int) -> int:
    """Bytes of the segment for ``n`` slots of ``width`` (``K+1``) tokens each."""
    return 8 * HEADER_INTS + 8 * (-(-n // 2)) + 8 * n * width


def step_counts(out: StepOutput, inputs: Any) -> np.ndarray:
    """``accept_num`` as the engine reads it (int64 ``[N]``): clipped to ``[0, K+1]``, and 0
    for a slot whose prompt is still being prefilled (``seq_lens_decoder < prompt_lens`` in
    the target's buffers ``inputs``), as FastDeploy's message counts them."""
    n, width = out.accept_tokens.shape
    counts = np.clip(np.asarray(out.accept_num).reshape(-1)[:n].astype(np.int64), 0, width)
    dec = np.asarray(inputs.seq_lens_decoder.numpy()).reshape(-1)[:n]
    prompt = np.asarray(inputs.prompt_lens.numpy()).reshape(-1)[:n]
    counts[dec < prompt] = 0
    return counts


class _Segment:
    """The mapped segment: header, counts and tokens as numpy views (no copy)."""

    def __init__(self, fd: int, n: int, width: int):
        self.n, self.width = n, width
        self.map = mmap.mmap(fd, shm_bytes(n, width))
        self.header = np.ndarray([HEADER_INTS], np.int64, self.map, 0)
        self.counts = np.ndarray([n], np.int32, self.map, 8 * HEADER_INTS)
        self.tokens = np.ndarray([n, width], np.int64, self.map, 8 * HEADER_INTS + 8 * (-(-n // 2)))

    def close(self) -> None:
        del (
            self.header,
            self.counts,
            self.tokens,
        )  # the views first: mmap refuses to close under them
        self.map.close()


def _start_time(pid: int) -> int:
    from ..processes.runtime_dir import process_start

    return process_start(pid) or 0


class ShmTokenReader:
    """The engine's shm segment for ``n`` slots of ``width`` tokens, created exclusively
    (mode 0600) at ``/dev/shm/<name>``. A leftover of this user from a dead process is
    replaced; one of a live process (this one included) or of another user is refused with
    :class:`TokenChannelError`."""

    def __init__(self, name: str, n: int, width: int):
        if n < 1 or width < 1:
            raise ValueError(
                f"a token segment needs n >= 1 and width >= 1, got n={n}, width={width}"
            )
        self.path = os.path.join("/dev/shm", name)
        fd = self._create()
        try:
            os.ftruncate(fd, shm_bytes(n, width))
            self._seg = _Segment(fd, n, width)
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise
        os.close(fd)
        self._seg.header[:] = [_MAGIC, _VERSION, os.getpid(), _start_time(os.getpid()), n, width, 0]
        self._closed = False

    def _create(self) -> int:
        for _ in range(3):
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                self._refuse_or_remove()
        raise TokenChannelError(
            f"token segment {self.path} keeps being re-created while we create it"
        )

    def _refuse_or_remove(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return  # removed meanwhile: create it again
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
            raise TokenChannelError(
                f"token segment {self.path} exists and is not this user's (uid {st.st_uid}); "
                "choose another --engine-worker-queue-port or remove it"
            )
        with open(self.path, "rb") as f:
            head = np.frombuffer(f.read(8 * HEADER_INTS).ljust(8 * HEADER_INTS, b"\0"), np.int64)
        from ...ipc.signals import process_alive

        pid, start = int(head[2]), int(head[3])
        if head[0] == _MAGIC and process_alive(pid) and _start_time(pid) == start:
            raise TokenChannelError(
                f"token segment {self.path} belongs to a running deployment (pid {pid}); give each "
                "server its own --engine-worker-queue-port"
            )
        os.unlink(self.path)  # a dead run's

    def read(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        seg = self._seg
        written = int(seg.header[_STEP_AT])
        if written != step:
            raise WorkerStepError(
                f"token segment holds step {written}'s tokens, expected step {step}"
            )
        tokens = seg.tokens.copy()
        counts = seg.counts.astype(np.int64)
        return tokens, counts

    def drain(self) -> None:
        pass  # the next step overwrites it

    def close(self) -> None:
        """Unmap and remove the segment (once)."""
        if self._closed:
            return
        self._closed = True
        self._seg.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class ShmTokenWriter:
    """Rank 0's view of the engine's segment ``/dev/shm/<name>``: attached only if it is a
    regular file of this user with mode 0600, the size and the header of ``n`` slots of
    ``width`` tokens (:class:`TokenChannelError` otherwise)."""

    def __init__(self, name: str, n: int, width: int):
        path = os.path.join("/dev/shm", name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            reason = os.strerror(exc.errno or errno.EIO)
            raise TokenChannelError(f"cannot open token segment {path}: {reason}") from None
        try:
            st = os.fstat(fd)
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_uid != os.geteuid()
                or stat.S_IMODE(st.st_mode) != 0o600
            ):
                raise TokenChannelError(
                    f"token segment {path} is not this user's private segment (mode 0600)"
                )
            if st.st_size != shm_bytes(n, width):
                raise TokenChannelError(
                    f"token segment {path} has {st.st_size} bytes, expected {shm_bytes(n, width)}"
                )
            self._seg = _Segment(fd, n, width)
        finally:
            os.close(fd)
        head = self._seg.header
        if int(head[0]) != _MAGIC or int(head[4]) != n or int(head[5]) != width:
            self._seg.close()
            raise TokenChannelError(
                f"token segment {path} is not laid out for {n} slots of {width} tokens"
            )

    def send(self, out: StepOutput, inputs: Any, step: int) -> None:
        seg = self._seg
        w = min(seg.width, out.accept_tokens.shape[1])
        seg.tokens[:, :w] = out.accept_tokens[:, :w]
        seg.counts[:] = step_counts(out, inputs)
        seg.header[_STEP_AT] = step  # last: the step is complete

    def close(self) -> None:
        self._seg.close()
