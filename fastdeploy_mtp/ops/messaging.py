"""Host helpers of the token message queues (the messaging ops: ``speculate_save_output_topk``,
``speculate_get_output_topk``, ``mtp_save_first_token``, ``mtp_get_first_token``).

The layouts and the queue key are described in ``docs/ops.md``, "The messaging ops (shared
rules)". These helpers use libc through :mod:`ctypes` (Linux).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from typing import Final

from ._op_wrappers import FIRST_TOKEN_MAX_BSZ, MAX_BSZ, MAX_DRAFT_TOKENS, SPEC_LOGPROB_K

#: Bytes of one batch entry of a top-k message: 6 * 21 ints, 6 * 21 floats, 6 ints.
TOPK_ENTRY_BYTES: Final = 4 * (2 * MAX_DRAFT_TOKENS * (SPEC_LOGPROB_K + 1) + MAX_DRAFT_TOKENS)
#: Bytes of the meta block of a top-k message: ±msg_id, message_flag, bsz, 512 counts.
TOPK_META_BYTES: Final = 4 * (3 + MAX_BSZ)
#: Bytes of text of a first-token message (always sent whole).
FIRST_TOKEN_MESSAGE_BYTES: Final = 4 * (2 + FIRST_TOKEN_MAX_BSZ * (1 + MAX_DRAFT_TOKENS))

_IPC_RMID: Final = 0
_IPC_STAT: Final = 2
_IPC_CREAT: Final = 0o1000
_IPC_EXCL: Final = 0o2000
_KEY_PATH: Final = "/dev/shm"
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.msgget.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.msgget.restype = ctypes.c_int
        lib.msgctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        lib.msgctl.restype = ctypes.c_int
        _libc = lib
    return _libc


def topk_message_bytes(bsz: int) -> int:
    """Bytes of message text ``speculate_save_output_topk`` sends for ``bsz`` items (the meta
    block plus ``bsz`` batch entries; the size ``kernel.msgmax`` must allow)."""
    if not 0 <= bsz <= MAX_BSZ:
        raise ValueError(f"bsz must be in [0, {MAX_BSZ}], got {bsz}")
    return TOPK_META_BYTES + bsz * TOPK_ENTRY_BYTES


def topk_slots_within(msgmax: int) -> int:
    """The most batch entries (``bsz``, at most ``MAX_BSZ``) whose top-k message fits in
    ``msgmax`` bytes of text; 0 when not even the meta block with one entry fits."""
    return max(0, min(MAX_BSZ, (msgmax - TOPK_META_BYTES) // TOPK_ENTRY_BYTES))


def read_msgmax() -> int:
    """The system's largest SysV message text in bytes (``/proc/sys/kernel/msgmax``)."""
    with open("/proc/sys/kernel/msgmax") as f:
        return int(f.read().strip())


def msg_queue_key(msg_queue_id: int, shm: os.stat_result | None = None) -> int:
    """The SysV key of queue ``msg_queue_id`` (FastDeploy's ``custom_ftok`` on /dev/shm), as
    the ops compute it; ``msg_queue_id`` in ``[0, 2**20)``. A signed 32-bit value, like
    ``key_t``. ``shm``: the ``os.stat`` of the /dev/shm the ops ran against, when it is not
    this process's (a process in another mount namespace with a /dev/shm of its own; the
    queues themselves are shared by every mount namespace)."""
    if (
        isinstance(msg_queue_id, bool)
        or not isinstance(msg_queue_id, int)
        or not 0 <= msg_queue_id < 1 << 20
    ):
        raise ValueError(f"msg_queue_id must be an integer in [0, 1048575], got {msg_queue_id!r}")
    st = os.stat(_KEY_PATH) if shm is None else shm
    key = ((st.st_dev & 0xF) << 28) | ((st.st_ino & 0xFF) << 20) | msg_queue_id
    return key - (1 << 32) if key >= 1 << 31 else key


def _queue_id(msg_queue_id: int, shm: os.stat_result | None) -> int | None:
    """The id of queue ``msg_queue_id`` (``msgget`` without creating it; ``shm``: see
    :func:`msg_queue_key`), ``None`` if there is none; ``OSError`` for other failures."""
    qid = _lib().msgget(msg_queue_key(msg_queue_id, shm), 0)
    if qid >= 0:
        return qid
    err = ctypes.get_errno()
    if err == errno.ENOENT:
        return None
    raise OSError(err, f"msgget of queue {msg_queue_id}: {os.strerror(err)}")


def _control(qid: int, command: int, buf: ctypes.Array[ctypes.c_char] | None, what: str) -> bool:
    """``msgctl(qid, command, buf)``; False if the queue was removed meanwhile, ``OSError``
    naming ``what`` for other failures."""
    if _lib().msgctl(qid, command, buf) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.EIDRM):  # removed meanwhile
        return False
    raise OSError(err, f"{what}: {os.strerror(err)}")


def remove_msg_queue(msg_queue_id: int, shm: os.stat_result | None = None) -> bool:
    """Removes queue ``msg_queue_id`` (``shm``: see :func:`msg_queue_key`) and any messages
    in it (``msgctl(IPC_RMID)``).

    Returns True if a queue was removed, False if there was none. Raises ``OSError`` for
    other failures (e.g. a queue of another user).
    """
    qid = _queue_id(msg_queue_id, shm)
    what = f"msgctl(IPC_RMID) of queue {msg_queue_id}"
    return qid is not None and _control(qid, _IPC_RMID, None, what)


def queue_owner(msg_queue_id: int, shm: os.stat_result | None = None) -> tuple[int, int] | None:
    """``(owner uid, mode bits)`` of queue ``msg_queue_id`` (``shm``: see
    :func:`msg_queue_key`), ``None`` if there is none.
    Raises ``PermissionError`` when the queue exists but this user may not read its
    attributes (another user's queue without read permission for us)."""
    qid = _queue_id(msg_queue_id, shm)
    buf = ctypes.create_string_buffer(256)  # struct msqid_ds (120 bytes on x86-64 and arm64)
    what = f"msgctl(IPC_STAT) of queue {msg_queue_id}"
    if qid is None or not _control(qid, _IPC_STAT, buf, what):
        return None
    # struct ipc_perm starts msqid_ds: key_t __key; uid_t uid; gid_t gid; uid_t cuid;
    # gid_t cgid; unsigned short mode
    uid = int.from_bytes(buf.raw[4:8], "little")
    mode = int.from_bytes(buf.raw[20:22], "little") & 0o777
    return uid, mode


def create_msg_queue(msg_queue_id: int) -> None:
    """Create queue ``msg_queue_id`` for this user alone (mode 0600, exclusively), before the
    processes that use it start. A queue of this user left by a dead run is removed first; a
    queue of another user at that key is refused (``PermissionError`` naming it): whoever
    owns it could read the tokens or send forged ones."""
    lib = _lib()
    key = msg_queue_key(msg_queue_id)
    for _ in range(3):
        if lib.msgget(key, _IPC_CREAT | _IPC_EXCL | 0o600) >= 0:
            return
        err = ctypes.get_errno()
        if err != errno.EEXIST:
            raise OSError(
                err, f"msgget(IPC_CREAT | IPC_EXCL) of queue {msg_queue_id}: {os.strerror(err)}"
            )
        try:
            owner = queue_owner(msg_queue_id)
        except PermissionError:
            owner = (-1, 0)
        if owner is not None and owner[0] != os.geteuid():
            raise PermissionError(
                errno.EPERM,
                f"the SysV message queue for msg_queue_id {msg_queue_id} (key {key:#x}) belongs "
                f"to uid {owner[0]}, not to this user; choose another --engine-worker-queue-port "
                f"(or remove that queue: `ipcrm -Q {key:#x}`)",
            )
        remove_msg_queue(msg_queue_id)  # ours, from a run that did not clean up
    raise OSError(errno.EEXIST, f"queue {msg_queue_id} keeps being re-created while we create it")


__all__ = [
    "FIRST_TOKEN_MAX_BSZ",
    "FIRST_TOKEN_MESSAGE_BYTES",
    "MAX_BSZ",
    "MAX_DRAFT_TOKENS",
    "SPEC_LOGPROB_K",
    "TOPK_ENTRY_BYTES",
    "TOPK_META_BYTES",
    "create_msg_queue",
    "msg_queue_key",
    "queue_owner",
    "read_msgmax",
    "remove_msg_queue",
    "topk_message_bytes",
    "topk_slots_within",
]
