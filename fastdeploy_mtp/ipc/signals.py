"""IPC signals: small numpy arrays shared between processes by name (FastDeploy's IPCSignal).

A creator (e.g. the cache manager) makes a signal such as ``cache_ready_signal`` (int32
``[tp_size]``) and raises entries; attachers (workers, the proposer) map the same memory and
poll ``.value``. Layout: the array's bytes first, exactly as upstream, so FastDeploy's own
``IPCSignal`` can attach ours and we can attach theirs; then a 16-byte trailer of ours
(magic, creator pid) that lets an attacher notice that the creator died
(:meth:`IPCSignal.wait_for`) instead of waiting forever.

Trust: a signal is created with mode 0600, exclusively (a stale segment of the same name
that this user owns is unlinked first; another user's is refused). Attaching accepts only
a regular segment owned by this process's effective uid with no group/other permission
bits, and :meth:`IPCSignal.wait_for` accepts a value only while the creator recorded in the
trailer is alive. Names are 1..255 characters out of ``A-Z a-z 0-9 _ . -`` without
``..``. See docs/architecture.md, "Processes and shared memory".

Python's resource tracker unlinks every segment a process *attached* when that process
exits (Python < 3.13), which would delete the creator's signal under everyone else. Attaching
here unregisters the segment from the tracker (``track=False`` on 3.13+), so only the creator
owns the name. Names follow upstream: ``name + "." + str(suffix)`` when ``suffix`` is given.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import time
from collections.abc import Callable
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

__all__ = [
    "IPCSignal",
    "IPCSignalError",
    "IPCSignalNameError",
    "CreatorGoneError",
    "shared_memory_exists",
]

_MAGIC = 0x4C4E474953504446  # "FDPSIGNL" little-endian
_TRAILER = np.dtype([("magic", "<u8"), ("pid", "<i8")])
# Segments this process created (and its resource tracker holds): attaching one of them in
# the same process must not unregister the creator's registration.
_CREATED_HERE: set = set()
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_NAME_MAX = 255  # one /dev/shm file name


class IPCSignalError(RuntimeError):
    """A signal could not be created, attached or waited on; the message says why."""


class IPCSignalNameError(IPCSignalError, ValueError):
    """The signal's name (``name`` plus ``suffix``) is not a valid shared-memory name."""


class CreatorGoneError(IPCSignalError):
    """The process that created a signal exited while another was waiting on it."""


def _full_name(name: str, suffix: Any) -> str:
    """``name`` or ``name.suffix``, checked: 1.._NAME_MAX characters of [A-Za-z0-9_.-], no '..'."""
    if not isinstance(name, str):
        raise IPCSignalNameError(f"IPCSignal: `name` must be a str, got {type(name).__name__}")
    full = name if suffix is None else f"{name}.{suffix}"
    arg = "`name`" if suffix is None else "`name` + '.' + `suffix`"
    if not name:
        raise IPCSignalNameError("IPCSignal: `name` must be non-empty and contain no '/'")
    if len(full.encode()) > _NAME_MAX:
        raise IPCSignalNameError(
            f"IPCSignal: {arg} {full[:40]!r}... is {len(full.encode())} bytes long; "
            f"at most {_NAME_MAX}"
        )
    if "/" in full:
        raise IPCSignalNameError(f"IPCSignal: {arg} {full!r} must contain no '/'")
    if _NAME.fullmatch(full) is None:
        raise IPCSignalNameError(
            f"IPCSignal: {arg} {full!r} may hold only letters, digits, '_', '.' and '-'"
        )
    if ".." in full:
        raise IPCSignalNameError(f"IPCSignal: {arg} {full!r} must not contain '..'")
    return full


def _check_own(fd: int, name: str, doing: str) -> None:
    """Refuses a segment that another local user created or may access (see the module
    docstring): not a regular file, another owner, or any group/other permission bit."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise IPCSignalError(
            f"IPCSignal {name!r}: not a regular shared-memory segment; refusing to {doing} it"
        )
    if st.st_uid != os.geteuid():
        raise IPCSignalError(
            f"IPCSignal {name!r}: the segment is owned by uid {st.st_uid}, not by this process's "
            f"uid {os.geteuid()}; refusing to {doing} a segment another user created"
        )
    if st.st_mode & 0o077:
        raise IPCSignalError(
            f"IPCSignal {name!r}: the segment has mode {stat.S_IMODE(st.st_mode):04o}: other "
            f"users may read or write it (IPCSignal creates segments with mode 0600); refusing to "
            f"{doing} it"
        )


def _replace_stale(name: str) -> None:
    """Removes an existing segment called ``name`` that this user owns (a stale one: upstream
    unlinks it too); one owned by another user is refused."""
    import _posixshmem

    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDONLY | os.O_NONBLOCK, 0)
    except FileNotFoundError:
        return
    except PermissionError:
        raise IPCSignalError(
            f"IPCSignal {name!r}: a segment of that name exists and this process cannot open it "
            "(another user's); refusing to replace it"
        ) from None
    try:
        owner = os.fstat(fd).st_uid
    finally:
        os.close(fd)
    if owner != os.geteuid():
        raise IPCSignalError(
            f"IPCSignal {name!r}: a segment of that name exists and is owned by uid {owner}, not "
            f"by this process's uid {os.geteuid()}; refusing to replace another user's segment"
        )
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def _open(name: str, create: bool, size: int = 0) -> shared_memory.SharedMemory:
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, create=create, size=size, track=create)
    shm = shared_memory.SharedMemory(name=name, create=create, size=size)
    if create:
        _CREATED_HERE.add(name)
    elif name not in _CREATED_HERE:  # the creator owns the name; see the module docstring
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def _unlink(shm: shared_memory.SharedMemory, tracked: bool) -> None:
    if tracked:
        _CREATED_HERE.discard(shm.name)
        shm.unlink()  # also unregisters it from the tracker
        return
    import _posixshmem  # the call SharedMemory.unlink makes, without the tracker message

    _posixshmem.shm_unlink(shm._name)  # type: ignore[attr-defined]


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # unknown creator (an upstream signal): only the timeout applies
    return process_alive(pid)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (``False`` for a pid <= 0, a gone process or a zombie;
    ``True`` for one of another user, which we may not signal)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited child that nobody reaped yet is a zombie: gone for our purposes
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def shared_memory_exists(name: str) -> bool:
    """Whether a shared-memory segment called ``name`` exists (upstream's probe)."""
    return (
        os.path.exists(os.path.join("/dev/shm", name))
        if os.path.isdir("/dev/shm")
        else _probe(name)
    )


def _probe(name: str) -> bool:  # pragma: no cover - systems without /dev/shm
    try:
        shm = _open(name, create=False)
    except FileNotFoundError:
        return False
    shm.close()
    return True


class IPCSignal:
    """A numpy array in shared memory, created or attached by name (FastDeploy's signature).

    Args:
        name: base name; the segment is ``name.suffix`` when ``suffix`` is given.
        array: the initial contents (create) or a template of the shape (attach).
        dtype: must equal ``array.dtype`` (as upstream).
        suffix: appended as ``"." + str(suffix)`` (upstream uses the engine worker queue port).
        create: True to create (an existing segment of that name is unlinked first, as
            upstream), False to attach.
        shm_size: without ``array``: size in bytes of a raw block; ``.value`` is None then.
        timeout: attach only: wait up to this many seconds for the creator to create the
            segment (attach-before-create); 0 fails at once if it does not exist.

    ``.value`` is a numpy view on the shared memory; ``.clear()`` closes it and removes the
    name. Attaching never lets this process's resource tracker delete the segment.

    Example::

        ready = IPCSignal("cache_ready_signal", np.zeros([tp], np.int32), np.int32, suffix=port)
        ...  # creator: ready.value[rank] = 1
        sig = IPCSignal("cache_ready_signal", np.zeros([tp], np.int32), np.int32, suffix=port,
                        create=False, timeout=30)
        sig.wait_for(lambda v: v[rank] == 1, timeout=60)
    """

    def __init__(
        self,
        name: str,
        array: np.ndarray | None = None,
        dtype: Any = None,
        suffix: Any = None,
        create: bool = True,
        shm_size: int | None = None,
        timeout: float = 0.0,
    ) -> None:
        self.name = _full_name(name, suffix)
        self._tracked = create
        self.value: np.ndarray | None = None
        if array is not None:
            if dtype is None or np.dtype(dtype) != array.dtype:
                raise IPCSignalError(
                    f"IPCSignal {self.name!r}: dtype {dtype!r} does not match the array's "
                    f"{array.dtype}"
                )
            nbytes = array.nbytes
        elif shm_size is None:
            raise IPCSignalError(
                f"IPCSignal {self.name!r}: give `array` and `dtype`, or `shm_size`"
            )
        else:
            nbytes = int(shm_size)
        if create:
            _replace_stale(self.name)
            try:
                shm = _open(self.name, create=True, size=nbytes + _TRAILER.itemsize)
            except FileExistsError:
                raise IPCSignalError(
                    f"IPCSignal {self.name!r}: another process created a segment of that name "
                    "while this one replaced it"
                ) from None
            trailer = np.ndarray((), _TRAILER, buffer=shm.buf, offset=nbytes)
            trailer["pid"] = os.getpid()
            trailer["magic"] = _MAGIC
            del trailer
            self.creator_pid = os.getpid()
        else:
            shm = self._attach(timeout)
            self.creator_pid = 0
            if shm.size >= nbytes + _TRAILER.itemsize:
                trailer = np.ndarray((), _TRAILER, buffer=shm.buf, offset=nbytes)
                if int(trailer["magic"]) == _MAGIC:
                    self.creator_pid = int(trailer["pid"])
                del trailer
            if shm.size < nbytes:
                size = shm.size
                shm.close()
                raise IPCSignalError(
                    f"IPCSignal {self.name!r}: the segment holds {size} bytes, the array needs "
                    f"{nbytes}"
                )
        self.shm: shared_memory.SharedMemory | None = shm
        if array is not None:
            self.value = np.ndarray(array.shape, dtype=array.dtype, buffer=shm.buf)
            if create:
                self.value[...] = array

    def _attach(self, timeout: float) -> shared_memory.SharedMemory:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                shm = _open(self.name, create=False)
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise IPCSignalError(
                        f"IPCSignal {self.name!r}: no such shared-memory segment"
                        + (f" after waiting {timeout:g} s" if timeout > 0 else "")
                        + " (has its creator started?)"
                    ) from None
                time.sleep(0.01)
                continue
            except PermissionError:
                raise IPCSignalError(
                    f"IPCSignal {self.name!r}: this process may not open the segment (another "
                    "user's); refusing to attach it"
                ) from None
            except (OSError, ValueError) as e:  # a directory, an empty file, ...
                raise IPCSignalError(
                    f"IPCSignal {self.name!r}: cannot attach the segment: {e}"
                ) from None
            try:
                _check_own(shm._fd, self.name, "attach")  # type: ignore[attr-defined]
            except BaseException:
                shm.close()
                raise
            return shm

    def creator_alive(self) -> bool:
        """False once the creating process has exited (unknown creators count as alive)."""
        return _pid_alive(self.creator_pid)

    def wait_for(
        self, predicate: Callable[[np.ndarray], object], timeout: float, poll: float = 0.005
    ) -> np.ndarray:
        """Poll until ``predicate(self.value)`` is true while the creator lives; returns
        ``self.value``.

        A value is accepted only while the creating process (the pid in the segment's
        trailer) is alive: a value left behind by a creator that has exited (a previous run's
        ``cache_ready_signal``) is stale. Raises :class:`CreatorGoneError` once the creator
        has exited (whatever the value), and :class:`IPCSignalError` after ``timeout``
        seconds. A signal without our trailer (created by upstream FastDeploy) has no known
        creator; only the timeout applies to it.
        """
        if self.value is None:
            raise IPCSignalError(f"IPCSignal {self.name!r}: a raw block has no value to wait on")
        deadline = time.monotonic() + timeout
        while True:
            held = bool(predicate(self.value))
            if not self.creator_alive():  # checked after reading: the value is the live creator's
                why = (
                    "has exited; the value it left is stale and not accepted"
                    if held
                    else "exited before the awaited condition held"
                )
                raise CreatorGoneError(
                    f"IPCSignal {self.name!r}: its creator (pid {self.creator_pid}) {why}; "
                    f"value {self.value.tolist()}"
                )
            if held:
                return self.value
            if time.monotonic() >= deadline:
                raise IPCSignalError(
                    f"IPCSignal {self.name!r}: timed out after {timeout:g} s waiting for the "
                    f"awaited condition; value {self.value.tolist()}"
                )
            time.sleep(poll)

    def close(self) -> None:
        """Unmap this process's view (the name stays)."""
        self.value = None
        if self.shm is not None:
            self.shm.close()
            self.shm = None

    def clear(self) -> None:
        """Close this view and remove the name if it still exists (upstream's ``clear``)."""
        shm = self.shm
        if shm is None:
            return
        self.close()
        if shared_memory_exists(self.name):
            try:
                _unlink(shm, self._tracked)
            except FileNotFoundError:
                pass
