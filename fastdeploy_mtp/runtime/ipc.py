"""IPC signals: small numpy arrays shared between processes by name (FastDeploy's IPCSignal).

A creator (e.g. the cache manager) makes a signal such as ``cache_ready_signal`` (int32
``[tp_size]``) and raises entries; attachers (workers, the proposer) map the same memory and
poll ``.value``. Layout: the array's bytes first, exactly as upstream, so FastDeploy's own
``IPCSignal`` can attach ours and we can attach theirs; then a 16-byte trailer of ours
(magic, creator pid) that lets an attacher notice that the creator died
(:meth:`IPCSignal.wait_for`) instead of waiting forever.

Python's resource tracker unlinks every segment a process *attached* when that process
exits (Python < 3.13), which would delete the creator's signal under everyone else. Attaching
here unregisters the segment from the tracker (``track=False`` on 3.13+), so only the creator
owns the name. Names follow upstream: ``name + "." + str(suffix)`` when ``suffix`` is given.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

__all__ = ["IPCSignal", "IPCSignalError", "CreatorGoneError", "shared_memory_exists"]

_MAGIC = 0x4C4E474953504446  # "FDPSIGNL" little-endian
_TRAILER = np.dtype([("magic", "<u8"), ("pid", "<i8")])
# Segments this process created (and its resource tracker holds): attaching one of them in
# the same process must not unregister the creator's registration.
_CREATED_HERE: set = set()


class IPCSignalError(RuntimeError):
    """A signal could not be created, attached or waited on; the message says why."""


class CreatorGoneError(IPCSignalError):
    """The process that created a signal exited while another was waiting on it."""


def _full_name(name: str, suffix: Any) -> str:
    return name if suffix is None else f"{name}.{suffix}"


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
    return os.path.exists(os.path.join("/dev/shm", name)) if os.path.isdir("/dev/shm") else _probe(name)


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
        if "/" in self.name or not self.name:
            raise IPCSignalError(f"IPCSignal: name {self.name!r} must be non-empty and contain no '/'")
        self._tracked = create
        self.value: np.ndarray | None = None
        if array is not None:
            if dtype is None or np.dtype(dtype) != array.dtype:
                raise IPCSignalError(
                    f"IPCSignal {self.name!r}: dtype {dtype!r} does not match the array's {array.dtype}"
                )
            nbytes = array.nbytes
        elif shm_size is None:
            raise IPCSignalError(f"IPCSignal {self.name!r}: give `array` and `dtype`, or `shm_size`")
        else:
            nbytes = int(shm_size)
        if create:
            if shared_memory_exists(self.name):  # a stale block (upstream unlinks it too)
                try:
                    stale = _open(self.name, create=False)
                except FileNotFoundError:
                    pass
                else:
                    stale.close()
                    _unlink(stale, tracked=False)
            shm = _open(self.name, create=True, size=nbytes + _TRAILER.itemsize)
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
                    f"IPCSignal {self.name!r}: the segment holds {size} bytes, the array needs {nbytes}"
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
                return _open(self.name, create=False)
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise IPCSignalError(
                        f"IPCSignal {self.name!r}: no such shared-memory segment"
                        + (f" after waiting {timeout:g} s" if timeout > 0 else "")
                        + " (has its creator started?)"
                    ) from None
                time.sleep(0.01)

    def creator_alive(self) -> bool:
        """False once the creating process has exited (unknown creators count as alive)."""
        return _pid_alive(self.creator_pid)

    def wait_for(self, predicate: Callable[[np.ndarray], object], timeout: float, poll: float = 0.005) -> np.ndarray:
        """Poll until ``predicate(self.value)`` is true; returns ``self.value``.

        Raises :class:`CreatorGoneError` as soon as the creator has exited without the
        condition becoming true, and :class:`IPCSignalError` after ``timeout`` seconds.
        """
        if self.value is None:
            raise IPCSignalError(f"IPCSignal {self.name!r}: a raw block has no value to wait on")
        deadline = time.monotonic() + timeout
        while True:
            if predicate(self.value):
                return self.value
            if not self.creator_alive():
                if predicate(self.value):
                    return self.value
                raise CreatorGoneError(
                    f"IPCSignal {self.name!r}: its creator (pid {self.creator_pid}) exited before the "
                    f"awaited condition held; value {self.value.tolist()}"
                )
            if time.monotonic() >= deadline:
                raise IPCSignalError(
                    f"IPCSignal {self.name!r}: timed out after {timeout:g} s waiting for the awaited "
                    f"condition; value {self.value.tolist()}"
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
