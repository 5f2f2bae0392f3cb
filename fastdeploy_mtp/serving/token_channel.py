"""How worker rank 0 hands each step's emitted tokens to the engine (``serve --token-channel``).

Two channels behind one interface: a :class:`TokenWriter` in rank 0 (``send`` after each
step, before the ``done`` reply) and a :class:`TokenReader` in the engine (``read`` once
that reply arrived). Both carry, per step, ``accept_tokens [N, K+1] int64`` (the tokens
slot ``b`` emitted are ``accept_tokens[b, :accept_num[b]]``) and ``accept_num [N] int64``
(0 for a slot still prefilling its prompt, or without a request).

* ``shm`` (default): a POSIX shared-memory segment ``/dev/shm/fdmtp_step_tokens.<port>``
  (``<port>``: the deployment's ``--engine-worker-queue-port``, like its other names),
  created by the engine with mode 0600 and removed when it stops. Any number of slots; one
  copy of ``N * (K+1) * 8 + N * 4`` bytes per step. Layout (little-endian): a header of
  :data:`HEADER_INTS` int64 (magic, version, creator pid, creator start time, ``N``,
  ``K+1``, step), then ``counts int32 [N]`` (padded to 8 bytes), then
  ``tokens int64 [N, K+1]``. Rank 0 writes the counts and the tokens, then the step number;
  the ``done`` reply (a ZMQ message, so a system call after the writes) tells the engine to
  read; a step number that is not the awaited one is a :class:`WorkerStepError`.
* ``sysv``: FastDeploy's SysV message (``speculate_save_output_topk`` /
  ``speculate_get_output_topk``): 2,060 + 1,032 bytes per slot, so ``kernel.msgmax`` bounds
  the slots (5 on a default kernel).

A splitwise prefill instance with MTP always sends ``mtp_save_first_token``'s SysV message
(its own layout, which fits 256 slots): :class:`FirstTokenReader`.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..ops.messaging import FIRST_TOKEN_MAX_BSZ, MAX_BSZ, MAX_DRAFT_TOKENS, SPEC_LOGPROB_K

if TYPE_CHECKING:
    from ..runtime.target_runner import StepOutput
    from .layout import ServeLayout

#: the ``--token-channel`` choices; the first is the default
TOKEN_CHANNELS = ("shm", "sysv")
#: the shm segment's name in /dev/shm, suffixed with ``.<engine_worker_queue_port>``
SHM_PREFIX = "fdmtp_step_tokens"
#: int64 fields before the counts: magic, version, creator pid, creator start, N, K+1, step
HEADER_INTS = 7
_MAGIC = 0x4E4B5450544D4446  # "FDMTPTKN"
_VERSION = 1
_STEP_AT = 6
#: ``message_flag`` of the target's token messages (FastDeploy: 3 target, 4 draft)
TARGET_MESSAGE_FLAG = 3
_TOPK = SPEC_LOGPROB_K + 1


class WorkerDiedError(RuntimeError):
    """A worker or the cache manager exited (or stopped answering); the deployment is gone."""


class WorkerStepError(RuntimeError):
    """A worker reported an exception in a step (the step's requests are aborted)."""


class TokenChannelError(OSError):
    """The shm token segment cannot be created or attached (the message names it and why; the
    command reports it in one line, exit status 1)."""


class TokenReader(Protocol):
    """The engine's end of a channel."""

    def read(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Step ``step``'s ``(accept_tokens [N, K+1] int64, accept_num [N] int64)``, once rank 0
        said ``done`` for it."""
        ...

    def drain(self) -> None:
        """Drop what a failed step may have left in the channel."""
        ...

    def close(self) -> None:
        """Release (and for the shm channel, remove) the channel."""
        ...


class TokenWriter(Protocol):
    """Rank 0's end of a channel."""

    def send(self, out: StepOutput, inputs: Any, step: int) -> None:
        """Send what step ``step`` emitted (``out``; ``inputs``: the target's buffers)."""
        ...

    def close(self) -> None: ...


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
    from .runtime_dir import process_start

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
                f"token segment {self.path} exists and is not this user's (uid {st.st_uid}); choose another "
                "--engine-worker-queue-port or remove it"
            )
        with open(self.path, "rb") as f:
            head = np.frombuffer(f.read(8 * HEADER_INTS).ljust(8 * HEADER_INTS, b"\0"), np.int64)
        from ..ipc.signals import process_alive

        pid, start = int(head[2]), int(head[3])
        if head[0] == _MAGIC and process_alive(pid) and _start_time(pid) == start:
            raise TokenChannelError(
                f"token segment {self.path} belongs to a running deployment (pid {pid}); give each server its own "
                "--engine-worker-queue-port"
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


class SysvTokenReader:
    """FastDeploy's reader: one ``speculate_get_output_topk`` message per step."""

    def __init__(self, msg_queue_id: int, n: int, k: int):
        import paddle

        from .. import ops

        self._ops, self.msg_queue_id, self.n, self.k = ops, msg_queue_id, n, k
        self._tokens = paddle.zeros(
            [3 + MAX_BSZ + MAX_BSZ * MAX_DRAFT_TOKENS * _TOPK], dtype="int64"
        )
        self._scores = paddle.zeros([MAX_BSZ * MAX_DRAFT_TOKENS * _TOPK], dtype="float32")
        self._ranks = paddle.zeros([MAX_BSZ * MAX_DRAFT_TOKENS], dtype="int64")

    def _receive(self, wait: bool) -> None:
        self._ops.speculate_get_output_topk(
            output_tokens=self._tokens,
            output_scores=self._scores,
            output_ranks=self._ranks,
            real_k=0,
            rank_id=0,
            wait_flag=wait,
            msg_queue_id=self.msg_queue_id,
            timeout_ms=5000,
        )

    def read(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        self._receive(wait=True)
        n, body_at = self.n, 3 + MAX_BSZ
        out = _checked(
            self._tokens[: body_at + n * MAX_DRAFT_TOKENS * _TOPK].numpy(), 2, n, "token"
        )
        counts = np.maximum(out[3 : 3 + n], 0).astype(np.int64)
        body = out[body_at : body_at + n * MAX_DRAFT_TOKENS * _TOPK].reshape(
            [n, MAX_DRAFT_TOKENS, _TOPK]
        )
        accept_tokens = np.zeros([n, self.k + 1], np.int64)
        width = min(self.k + 1, MAX_DRAFT_TOKENS)
        accept_tokens[:, :width] = body[:, :width, 0]
        return accept_tokens, counts

    def drain(self) -> None:
        self._receive(wait=False)

    def close(self) -> None:
        pass  # the runner removes the queue


class FirstTokenReader(SysvTokenReader):
    """A splitwise prefill instance's reader: ``mtp_get_first_token``'s message (per slot 0
    tokens, or 2: the first token and the first draft; the draft stays in the slot state)."""

    def __init__(self, msg_queue_id: int, n: int, k: int):
        import paddle

        super().__init__(msg_queue_id, n, k)
        self._first = paddle.zeros(
            [2 + FIRST_TOKEN_MAX_BSZ * (1 + MAX_DRAFT_TOKENS)], dtype="int64"
        )

    def _receive(self, wait: bool) -> None:
        self._ops.mtp_get_first_token(
            output_tokens=self._first,
            wait_flag=wait,
            msg_queue_id=self.msg_queue_id,
            timeout_ms=5000,
        )

    def read(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        self._receive(wait=True)
        n = self.n
        out = _checked(self._first.numpy(), 1, n, "first-token")
        counts = out[2 : 2 + n]
        body = 2 + FIRST_TOKEN_MAX_BSZ  # then MAX_DRAFT_TOKENS token slots per slot
        accept_tokens = np.zeros([n, self.k + 1], np.int64)
        accept_tokens[:, 0] = out[body : body + n * MAX_DRAFT_TOKENS : MAX_DRAFT_TOKENS]
        return accept_tokens, (counts > 0).astype(np.int64)


def _checked(out: np.ndarray, bsz_at: int, n: int, kind: str) -> np.ndarray:
    """``out`` once it is a message (not the no-message marker ``-2``) of ``n`` slots."""
    if out[0] == -2:
        raise WorkerDiedError(
            f"rank 0 acknowledged a step without sending its {kind.replace('-token', ' token')}s"
        )
    if int(out[bsz_at]) != n:
        raise WorkerStepError(f"{kind} message for {int(out[bsz_at])} slots, expected {n}")
    return out


class SysvTokenWriter:
    """FastDeploy's sender: one ``speculate_save_output_topk`` message per step, one packed
    row per emitted token, no logprobs (score 0, rank 0)."""

    def __init__(self, rank: int, msg_queue_id: int):
        self.rank, self.msg_queue_id = rank, msg_queue_id

    def send(self, out: StepOutput, inputs: Any, step: int) -> None:
        import paddle

        from .. import ops

        width = out.accept_tokens.shape[1]
        counts = np.clip(out.accept_num.astype(np.int32).reshape(-1), 0, width)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
        # every slot's first counts[b] tokens, in slot order, without a loop over the slots
        rows = out.accept_tokens[np.arange(width)[None, :] < counts[:, None]].astype(np.int64)
        n = int(rows.shape[0])
        ops.speculate_save_output_topk(
            sampled_token_ids=paddle.to_tensor(rows.reshape([n, 1])),
            logprob_token_ids=paddle.to_tensor(rows.reshape([n, 1])),
            logprob_scores=paddle.zeros([n, 1], dtype="float32"),
            logprob_ranks=paddle.zeros([n], dtype="int64"),
            token_num_per_batch=paddle.to_tensor(counts),
            cu_batch_token_offset=paddle.to_tensor(offsets),
            not_need_stop=inputs.not_need_stop,
            seq_lens_decoder=inputs.seq_lens_decoder,
            prompt_lens=inputs.prompt_lens,
            preempted_idx=paddle.zeros([len(counts)], dtype="int32"),
            message_flag=TARGET_MESSAGE_FLAG,
            rank_id=self.rank,
            save_each_rank=False,
            msg_queue_id=self.msg_queue_id,
        )

    def close(self) -> None:
        pass


def open_reader(layout: ServeLayout, n: int, k: int) -> TokenReader:
    """The engine's end of ``layout``'s channel for ``n`` slots and ``k`` drafts (create the
    shm segment before the workers start: they attach it)."""
    if layout.splitwise_role == "prefill" and k:
        return FirstTokenReader(layout.msg_queue_id, n, k)
    if layout.token_channel == "shm":
        return ShmTokenReader(shm_name(layout.engine_worker_queue_port), n, k + 1)
    return SysvTokenReader(layout.msg_queue_id, n, k)


def open_writer(layout: ServeLayout, rank: int, n: int, k: int) -> TokenWriter:
    """Rank 0's end of ``layout``'s channel (not for a prefill instance with MTP, which sends
    first tokens: :func:`~.worker_process.send_first_tokens`)."""
    if layout.token_channel == "shm":
        return ShmTokenWriter(shm_name(layout.engine_worker_queue_port), n, k + 1)
    return SysvTokenWriter(rank, layout.msg_queue_id)
