"""The ``"mooncake"`` KV transport: D reads the offered blocks straight out of P's caches
into its own with the Mooncake transfer engine (RDMA where the engine finds NICs, its TCP
transport otherwise), no copy in between.

Each engine runs over RDMA where the kernel lists an RDMA device and over the engine's TCP
transport otherwise (:func:`protocol`; ``FDMTP_MOONCAKE_PROTOCOL=rdma|tcp`` overrides: both
ends must agree). Only the TCP transport has run here; the RDMA path is unverified.

P registers every cache of every rank with its process's engine once, when its
:class:`~fastdeploy_mtp.splitwise.kv_source.KVSource` starts (source option
``mooncake=True``), and its descriptors carry ``"mooncake": {"segment": "host:port",
"buffers": [[base address per cache] per rank]}``: the engine's segment name (its
handshake port at the source's advertised host) and where each cache starts in P's
address space. D registers its own caches with its engine on its first pull, then reads,
per rank, one batch holding every (cache, run of consecutive blocks) of the request:
block ``block_ids[j]`` of cache ``c`` is ``block_nbytes(c)`` bytes at
``buffers[r][c] + block_ids[j] * block_nbytes(c)``. The blocks and addresses read are
those of P's own ``check`` answer (:mod:`..control`), never the hand-over's; P's engine
refuses any read outside the memory it registered.

What the engine itself does not give: it authenticates no one. Whoever reaches its port can
read (and write) every registered cache, the same as in every serving stack that uses it.
The transfer token and signature guard the control socket (who may hold and release an
offer), not the engine's port, so keep that port on the cluster's network (the trust model
in ``docs/architecture.md``). P's engine listens only on the advertised host
(``MC_TCP_BIND_ADDRESS``) unless the environment sets another.

Installing: the ``pd`` extra (``pip install ".[pd]"``: the PyPI package
``mooncake-transfer-engine-non-cuda``) and the system library ``libibverbs.so.1`` (Debian:
``apt-get install libibverbs1``), which the engine loads even where it finds no RDMA
device. :func:`require` names whichever is missing.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import threading
import weakref
from typing import Any

import numpy as np

from ..addresses import address_towards
from ..descriptor import Descriptor
from ..kv_layout import Caches, KVLayout, TransferError
from ..transport import PullJob, Transport, finish_direct_read, register

__all__ = ["MooncakeTransport", "available", "protocol", "require"]

logger = logging.getLogger(__name__)

NAME = "mooncake"
_PACKAGE = "mooncake-transfer-engine-non-cuda"
_MAX_ADDRESS = 1 << 64

_lock = threading.Lock()
_import_error: str | None = None
_engine: _Engine | None = None


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
    transfer engine cannot be imported here."""
    _import()


def available() -> bool:
    """Whether the Mooncake transfer engine imports here."""
    try:
        _import()
    except TransferError:
        return False
    return True


class _Engine:
    """This process's Mooncake transfer engine (one per process: the engine's handshake
    port and segment are per process) and the memory registered with it."""

    def __init__(self, host: str, timeout: float):
        module = _import()
        # the engine reads these when it starts; an operator's own settings win
        if _is_address(host) and not ipaddress.ip_address(host).is_unspecified:
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", host)
        os.environ.setdefault("MC_TRANSFER_TIMEOUT", str(max(1, math.ceil(timeout))))
        self.host = host
        self.engine = module.TransferEngine()
        self.protocol = protocol()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", self.protocol, "")
        if rc != 0:
            raise TransferError(
                f"KV transport 'mooncake': the transfer engine did not start at {host} over "
                f"{self.protocol} (code {rc})"
            )
        logger.info("mooncake: transfer engine at %s over %s", host, self.protocol)
        self.segment = f"{_bracketed(host)}:{self.engine.get_rpc_port()}"
        # base address -> (bytes registered, the array that owns them while it lives)
        self.regions: dict[int, tuple[int, weakref.ref[np.ndarray]]] = {}
        self.lock = threading.Lock()  # pulls run in a thread each

    def register(self, array: np.ndarray, what: str) -> int:
        """Register ``array``'s memory (C-contiguous) once; its base address."""
        if not array.flags.c_contiguous:
            raise TransferError(
                f"KV transport 'mooncake': {what} is not C-contiguous and cannot be registered"
            )
        base, size = int(array.ctypes.data), int(array.nbytes)
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


def protocol() -> str:
    """The engine's protocol: ``$FDMTP_MOONCAKE_PROTOCOL`` if set (``"rdma"`` or ``"tcp"``),
    else ``"rdma"`` where the kernel lists an RDMA device (``/sys/class/infiniband``), else
    ``"tcp"``. Both ends of a transfer must agree."""
    chosen = os.environ.get("FDMTP_MOONCAKE_PROTOCOL")
    if chosen is not None:
        if chosen not in ("rdma", "tcp"):
            raise TransferError(f"FDMTP_MOONCAKE_PROTOCOL must be 'rdma' or 'tcp', got {chosen!r}")
        return chosen
    try:
        devices = os.listdir("/sys/class/infiniband")
    except OSError:
        devices = []
    return "rdma" if devices else "tcp"


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _engine_at(host: str, timeout: float = 60.0) -> _Engine:
    """This process's engine, started at ``host`` on first use, its transfers given up after
    ``timeout`` seconds without progress (a later call reuses it whatever its arguments: the
    engine serves from one address)."""
    global _engine
    with _lock:
        engine = _engine
    if engine is None:
        engine = _Engine(host, timeout)
        with _lock:
            if _engine is None:
                _engine = engine
            engine = _engine
    return engine


def _read_field(value: Any, layout: KVLayout, where: str) -> dict[str, Any] | None:
    """The ``mooncake`` field checked: ``None`` or ``{"segment": "host:port", "buffers":
    [[int per cache] per rank]}``."""
    if value is None:
        return None
    field = f"{where}: `mooncake`"
    if not isinstance(value, dict) or set(value) != {"segment", "buffers"}:
        raise TransferError(f"{field} must be null or an object with `segment` and `buffers`")
    segment = value["segment"]
    if not isinstance(segment, str) or not 3 <= len(segment) <= 300 or ":" not in segment:
        raise TransferError(f"{field}.segment must be a 'host:port' str, got {segment!r:.100}")
    port = segment.rsplit(":", 1)[1]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise TransferError(f"{field}.segment must end in a port, got {segment!r:.100}")
    buffers = value["buffers"]
    tp, nc = layout.tensor_parallel_size, layout.num_caches
    if not isinstance(buffers, list) or len(buffers) != tp:
        raise TransferError(f"{field}.buffers must hold one list per rank ({tp})")
    out = []
    for r, rank in enumerate(buffers):
        if not isinstance(rank, list) or len(rank) != nc:
            raise TransferError(f"{field}.buffers[{r}] must hold {nc} addresses (one per cache)")
        for c, (base, entry) in enumerate(zip(rank, layout.caches)):
            extent = entry.shape[0] * entry.block_nbytes
            if (
                not isinstance(base, int)
                or isinstance(base, bool)
                or not 0 < base < _MAX_ADDRESS - extent
            ):
                raise TransferError(
                    f"{field}.buffers[{r}][{c}] must be the address of {entry.label}, "
                    f"got {base!r:.40}"
                )
        out.append(list(rank))
    return {"segment": segment, "buffers": out}


def _runs(src: np.ndarray, dst: np.ndarray) -> list[tuple[int, int, int]]:
    """(first source block, first destination block, count) of each maximal run where both
    the source and the destination ids go up by one."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src.tolist(), dst.tolist()):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            first_s, first_d, n = runs[-1]
            runs[-1] = (first_s, first_d, n + 1)
        else:
            runs.append((s, d, 1))
    return runs


@register
class MooncakeTransport(Transport):
    """Read the offered blocks from P's registered caches with the Mooncake transfer engine."""

    name = NAME
    preference = 5  # "auto": below shm (same host), above tcp (a copy through the control socket)
    fields = ("mooncake",)

    def offer_fields(
        self, caches: Caches, layout: KVLayout, options: dict[str, Any], host: str, where: str
    ) -> dict[str, Any]:
        wanted = options.pop("mooncake", False)
        if not isinstance(wanted, bool):
            raise TransferError(f"{where}: `mooncake` must be a bool, got {wanted!r}")
        if not wanted:
            return {"mooncake": None}
        engine = _engine_at(host)
        buffers: list[list[int]] = []
        try:
            for r, rank in enumerate(caches):
                buffers.append([])
                for cache, entry in zip(rank, layout.caches):
                    buffers[-1].append(engine.register(cache, f"rank {r} {entry.label}"))
        except BaseException:  # none of this source's registrations stays behind
            engine.forget([base for rank_bases in buffers for base in rank_bases])
            raise
        return {"mooncake": {"segment": engine.segment, "buffers": buffers}}

    def close_fields(self, fields: dict[str, Any]) -> None:
        offered = fields.get("mooncake")
        engine = _engine
        if offered is None or engine is None:
            return
        engine.forget([base for rank in offered["buffers"] for base in rank])

    def read_fields(
        self, descriptor: dict[str, Any], layout: KVLayout, where: str
    ) -> dict[str, Any]:
        return {"mooncake": _read_field(descriptor["mooncake"], layout, where)}

    def usable(self, descriptor: dict[str, Any]) -> bool:
        return descriptor.get("mooncake") is not None and available()

    def check_pullable(self, descriptor: Descriptor, where: str) -> None:
        if descriptor.fields["mooncake"] is None:
            raise TransferError(
                f"{where}: transport 'mooncake' needs the prefill instance to register its caches "
                "with the Mooncake transfer engine (serve --splitwise-role prefill "
                "--kv-transport mooncake); this one did not"
            )
        require()

    def pull(self, job: PullJob) -> None:
        # pull_blocks asked "check" just before: P holds the offer, and `job.descriptor` is it
        descriptor = job.descriptor
        offered = descriptor.fields["mooncake"]
        segment = offered["segment"]
        layout = descriptor.layout
        engine = _engine_at(
            address_towards(segment.rsplit(":", 1)[0].strip("[]")) or "127.0.0.1", job.timeout
        )
        mine = [
            [engine.register(cache, f"rank {r} {e.label}") for cache, e in zip(rank, layout.caches)]
            for r, rank in enumerate(job.caches)
        ]
        runs = _runs(np.asarray(descriptor.block_ids, np.int64), job.dst_idx)
        for r in range(layout.tensor_parallel_size):
            local: list[int] = []
            remote: list[int] = []
            lengths: list[int] = []
            for c, entry in enumerate(layout.caches):
                size = entry.block_nbytes
                for s, d, n in runs:
                    local.append(mine[r][c] + d * size)
                    remote.append(offered["buffers"][r][c] + s * size)
                    lengths.append(n * size)
            rc = engine.engine.batch_transfer_sync_read(segment, local, remote, lengths)
            if rc != 0:
                raise TransferError(
                    f"{descriptor.where}: the Mooncake read of rank {r}'s blocks from {segment} "
                    f"failed (code {rc}): the prefill instance is gone or unreachable, or "
                    "refused the addresses; the destination blocks may be partly written"
                )
        finish_direct_read(job, "mooncake")
