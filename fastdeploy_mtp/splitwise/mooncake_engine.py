"""This process's Mooncake transfer engine, for the ``"mooncake"`` KV transport
(:mod:`.transports.mooncake`): importing it (naming what is missing), the protocol it runs
over, starting it over that protocol, and the memory registered with it.

The engine ignores the protocol :meth:`initialize` is given: it installs RDMA wherever it
finds an RDMA NIC, TCP otherwise, unless its ``MC_FORCE_TCP`` (TCP only) or ``MC_FORCE_HCA``
(RDMA or fail) is set. :class:`Engine` sets the one of :func:`protocol`, so the protocol a
descriptor carries is the one the engine runs over.

Wherever it starts, the engine listens on every interface (its handshake port on
``0.0.0.0``, its TCP data port on ``[::]``, dual-stack; both drawn from
``MC_MIN_PRC_PORT``..``MC_MAX_PRC_PORT``, default 15000..17000). The host it is given is
only the name it advertises; ``MC_TCP_BIND_ADDRESS`` is read only with a metadata server,
and only as that name.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
from typing import Any

import numpy as np

from .kv_layout import TransferError

__all__ = [
    "PROTOCOLS",
    "Engine",
    "available",
    "base_address",
    "current",
    "engine_at",
    "local_protocol",
    "protocol",
    "require",
]

logger = logging.getLogger(__name__)

_PACKAGE = "mooncake-transfer-engine-non-cuda"
#: the variable that makes the engine run over each protocol: it installs RDMA wherever it
#: finds an RDMA NIC unless ``MC_FORCE_TCP`` is set, and ``MC_FORCE_HCA`` makes it install
#: RDMA or fail to start
_FORCE = {"rdma": "MC_FORCE_HCA", "tcp": "MC_FORCE_TCP"}
#: the protocols an engine runs over
PROTOCOLS = tuple(_FORCE)

_lock = threading.Lock()
_import_error: str | None = None
_engine: Engine | None = None


def _import() -> Any:
    """The ``mooncake.engine`` module; a :class:`TransferError` naming the missing piece."""
    global _import_error
    with _lock:
        if _import_error is None:
            try:
                import mooncake.engine as module

                return module
            except ImportError as exc:
                _import_error = _missing(exc)
        raise TransferError(_import_error)


def _missing(exc: ImportError) -> str:
    """What the failed import of the Mooncake transfer engine lacks, in one line."""
    text = str(exc)
    if "libibverbs" in text:
        return (
            "KV transport 'mooncake' needs the system library libibverbs.so.1, which the "
            "Mooncake transfer engine loads even without RDMA devices (Debian/Ubuntu: "
            "apt-get install libibverbs1)"
        )
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "mooncake":
        return (
            f"KV transport 'mooncake' needs the package {_PACKAGE} "
            '(pip install ".[pd]", or pip install ' + _PACKAGE + ")"
        )
    return f"KV transport 'mooncake': the Mooncake transfer engine does not import: {text}"


def require() -> None:
    """Raise a one-line :class:`TransferError` naming what is missing when the Mooncake
    transfer engine cannot be imported here, or a bad ``$FDMTP_MOONCAKE_PROTOCOL``."""
    _import()
    protocol()


def available() -> bool:
    """Whether the Mooncake transfer engine imports here."""
    try:
        _import()
    except TransferError:
        return False
    return True


class Engine:
    """This process's Mooncake transfer engine (one per process: the engine's handshake
    port and segment are per process) and the memory registered with it."""

    def __init__(self, host: str, timeout: float):
        module = _import()
        self.protocol = protocol()
        # the engine reads these when it starts; the protocol is the one descriptors carry,
        # the timeout an operator's own if set
        for name, variable in _FORCE.items():
            if name == self.protocol:
                os.environ[variable] = "1"
            else:
                os.environ.pop(variable, None)
        os.environ.setdefault("MC_TRANSFER_TIMEOUT", str(max(1, math.ceil(timeout))))
        self.host = host
        self.engine = module.TransferEngine()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", self.protocol, "")
        if rc != 0:
            hint = " (no usable RDMA NIC? FDMTP_MOONCAKE_PROTOCOL=tcp runs it over TCP)"
            raise TransferError(
                f"KV transport 'mooncake': the transfer engine did not start at {host} over "
                f"{self.protocol} (code {rc}){hint if self.protocol == 'rdma' else ''}"
            )
        logger.info("mooncake: transfer engine at %s over %s", host, self.protocol)
        self.segment = f"{_bracketed(host)}:{self.engine.get_rpc_port()}"
        # base address -> (bytes registered, the array that owns them while it lives)
        self.regions: dict[int, tuple[int, weakref.ref[np.ndarray]]] = {}
        self.lock = threading.Lock()  # pulls run in a thread each

    def register(self, array: np.ndarray, what: str) -> int:
        """Register ``array``'s memory (C-contiguous) once; its base address."""
        base, size = base_address(array, what), int(array.nbytes)
        with self.lock:
            return self._register(array, base, size, what)

    def _register(self, array: np.ndarray, base: int, size: int, what: str) -> int:
        for old, (old_size, owner) in list(self.regions.items()):
            # a region whose array is gone (its memory may be another array's now), or one
            # that overlaps this array under another extent: let it go
            if owner() is None or (
                old < base + size and base < old + old_size and (old, old_size) != (base, size)
            ):
                self._unregister(old)
        if base in self.regions:
            return base
        rc = self.engine.register_memory(base, size)
        if rc != 0:
            raise TransferError(
                f"KV transport 'mooncake': registering {what} ({size} bytes) failed (code {rc})"
            )
        self.regions[base] = (size, weakref.ref(array))
        return base

    def forget(self, bases: list[int]) -> None:
        """Let go of the regions at ``bases`` (those registered)."""
        with self.lock:
            for base in bases:
                self._unregister(base)

    def _unregister(self, base: int) -> None:
        """Let go of the region at ``base`` (if registered); the caller holds :attr:`lock`."""
        if self.regions.pop(base, None) is not None:
            rc = self.engine.unregister_memory(base)
            if rc != 0:
                logger.warning(
                    "mooncake: unregistering the region at %#x failed (code %d)", base, rc
                )


def base_address(array: np.ndarray, what: str) -> int:
    """Where ``array`` (C-contiguous) starts: its blocks are read and written by offset
    from there."""
    if not array.flags.c_contiguous:
        raise TransferError(
            f"KV transport 'mooncake': {what} is not C-contiguous and cannot be transferred"
        )
    return int(array.ctypes.data)


def protocol() -> str:
    """The protocol this host's engine runs over: ``$FDMTP_MOONCAKE_PROTOCOL`` if set
    (``"rdma"`` or ``"tcp"``), else ``"rdma"`` if the environment sets the engine's own
    ``MC_FORCE_HCA``, ``"tcp"`` if it sets ``MC_FORCE_TCP``, else ``"rdma"`` where the kernel
    lists an RDMA device (``/sys/class/infiniband``), else ``"tcp"``. Both ends of a
    transfer must agree: descriptors carry it."""
    chosen = os.environ.get("FDMTP_MOONCAKE_PROTOCOL")
    if chosen is not None:
        if chosen not in PROTOCOLS:
            raise TransferError(f"FDMTP_MOONCAKE_PROTOCOL must be 'rdma' or 'tcp', got {chosen!r}")
        return chosen
    for name, variable in _FORCE.items():
        if variable in os.environ:
            return name
    try:
        devices = os.listdir("/sys/class/infiniband")
    except OSError:
        devices = []
    return "rdma" if devices else "tcp"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def engine_at(host: str, timeout: float = 60.0) -> Engine:
    """This process's engine, started at ``host`` on first use, its transfers given up after
    ``timeout`` seconds without progress (a later call reuses it whatever its arguments: the
    engine advertises one address)."""
    global _engine
    with _lock:
        engine = _engine
    if engine is None:
        engine = Engine(host, timeout)
        with _lock:
            if _engine is None:
                _engine = engine
            engine = _engine
    return engine


def current() -> Engine | None:
    """This process's engine, ``None`` before it starts."""
    return _engine


def local_protocol() -> str:
    """The protocol of this process's engine, or of the one it would start."""
    engine = _engine
    return protocol() if engine is None else engine.protocol
