"""KV transports: the interface a transport implements, the registry of the shipped ones,
and what is done across all of them (a source's descriptor fields, reading a descriptor).

A transport moves the blocks of an offer from a prefill instance's ("P") caches into a
decode instance's ("D"), between D's ``check`` and ``release`` of the control protocol
(:mod:`.control`). Each is a :class:`Transport` in its own module of :mod:`.transports` that
registers itself with :func:`register`; the registry imports every module there on first
use, so adding a transport is adding one module. ``"auto"`` (:func:`choose_transport`) picks
the registered transport of the highest :attr:`~Transport.preference` that is
:meth:`~Transport.usable` for a descriptor: ``"shm"`` when P's caches are published on this
host, else ``"mooncake"`` when P registered them with a Mooncake transfer engine and the
engine imports here, else ``"tcp"``. Every transport owns some fields of the descriptor
(:mod:`.descriptor`), present in every descriptor.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from . import transports as _transports_package
from .control import ControlChannel, release_after_direct_read
from .descriptor import Descriptor, check_descriptor
from .kv_layout import Caches, KVLayout, TransferError

__all__ = [
    "AUTO",
    "PullJob",
    "Transport",
    "choose_transport",
    "close_fields",
    "finish_direct_read",
    "frame_labels",
    "get_transport",
    "offer_fields",
    "read_descriptor",
    "register",
    "transport_names",
]

#: The transport name that lets :func:`choose_transport` pick one per descriptor.
AUTO = "auto"


@dataclass(frozen=True)
class PullJob:
    """What :meth:`Transport.pull` is given for one request.

    Attributes:
        channel: the control connection to P's source for this request.
        descriptor: P's offer, checked; ``descriptor.layout`` matches ``caches``.
        caches: D's writable caches (checked).
        dst_idx: int64 ``[len(descriptor.block_ids)]``, distinct block ids in ``caches``.
        timeout: seconds P may take to answer each request.
    """

    channel: ControlChannel
    descriptor: Descriptor
    caches: Caches
    dst_idx: np.ndarray
    timeout: float


class Transport(ABC):
    """How the blocks of an offer get from P's caches into D's.

    A subclass sets :attr:`name`, :attr:`preference` and :attr:`fields`, implements
    :meth:`pull`, overrides the other hooks it needs, and is decorated with :func:`register`.
    Every refusal or failure is a :class:`TransferError` naming the request, the peer or the
    field at fault.
    """

    #: what ``pull_blocks(transport=...)`` and ``--kv-transport`` call it
    name: ClassVar[str]
    #: ``"auto"`` picks the usable transport with the highest preference
    preference: ClassVar[int] = 0
    #: the descriptor keys this transport owns; every descriptor carries them (``None``
    #: where the source does not offer this transport)
    fields: ClassVar[tuple[str, ...]] = ()

    def offer_fields(
        self, caches: Caches, layout: KVLayout, options: dict[str, Any], host: str, where: str
    ) -> dict[str, Any]:
        """Prefill side, once per source: the values of :attr:`fields` for its descriptors.

        Args:
            caches: the source's caches (per rank, ``layout.num_caches`` arrays ``[num_blocks,
                *block_shape]`` per entry of ``layout.caches``), already checked.
            layout: their layout.
            options: the source's transport options not yet taken; pop the ones this
                transport reads (what is left over is refused).
            host: the host decode instances reach the source at (its control address).
            where: prefix of error messages.
        """
        return {}

    def close_fields(self, fields: dict[str, Any]) -> None:
        """Prefill side: the source that offered ``fields`` (its :meth:`offer_fields`)
        closed; let go of what they hold."""
        return None

    def read_fields(
        self, descriptor: dict[str, Any], layout: KVLayout, where: str
    ) -> dict[str, Any]:
        """Decode side: the values of :attr:`fields` in a received ``descriptor`` (the keys
        are present), checked against the prefill's ``layout``."""
        return {}

    def usable(self, descriptor: dict[str, Any]) -> bool:
        """Whether ``"auto"`` may pick this transport for ``descriptor`` (as received,
        unchecked) on this host."""
        return True

    def check_pullable(self, descriptor: Descriptor, where: str) -> None:
        """Refuse a checked ``descriptor`` this transport cannot pull, before anything is sent."""
        return None  # by default: any descriptor that read_descriptor accepted

    @abstractmethod
    def pull(self, job: PullJob) -> None:
        """Copy block ``job.descriptor.block_ids[j]`` of P's cache ``c`` on rank ``r`` into
        ``job.caches[r][c][job.dst_idx[j]]`` and release the offer over ``job.channel``.

        Raises:
            TransferError: nothing may have been written unless the message says so.
        """


_T = TypeVar("_T", bound=type[Transport])
_registry: dict[str, Transport] = {}
_load_lock = threading.Lock()
_loaded = False


def register(cls: _T) -> _T:
    """Class decorator: make the transport ``cls`` available under ``cls.name``."""
    if cls.name == AUTO or cls.name in _registry:
        raise ValueError(f"KV transport name {cls.name!r} is taken")
    _registry[cls.name] = cls()
    return cls


def _load() -> None:
    """Import every module of :mod:`.transports` once (each registers its transport)."""
    global _loaded
    with _load_lock:
        if _loaded:
            return
        for module in pkgutil.iter_modules(_transports_package.__path__):
            importlib.import_module(f"{_transports_package.__name__}.{module.name}")
        _loaded = True


def _transports() -> list[Transport]:
    """Every registered transport, from the lowest preference (the fallback) up."""
    _load()
    return sorted(_registry.values(), key=lambda t: (t.preference, t.name))


def transport_names() -> tuple[str, ...]:
    """The registered transports' names, from the lowest preference up (``"auto"`` aside)."""
    return tuple(t.name for t in _transports())


def get_transport(name: Any, where: str) -> Transport:
    """The registered transport ``name``; a :class:`TransferError` listing the names if none."""
    transports = _transports()
    for transport in transports:
        if transport.name == name:
            return transport
    names = [repr(t.name) for t in transports]
    either = " or ".join(filter(None, (", ".join(names[:-1]), names[-1])))
    raise TransferError(f"{where}: `transport` must be {either}, got {name!r}")


def choose_transport(requested: str, descriptor: dict[str, Any]) -> str:
    """``requested``, or for ``"auto"`` the usable registered transport of the highest
    preference for ``descriptor`` (as received)."""
    if requested != AUTO:
        return requested
    for transport in reversed(_transports()):
        if transport.usable(descriptor):
            return transport.name
    raise TransferError(
        f"no KV transport can pull request {descriptor.get('request_id')!r} on this host"
    )


def offer_fields(
    caches: Caches, layout: KVLayout, options: dict[str, Any], host: str, where: str
) -> dict[str, Any]:
    """A source's descriptor fields from every transport (:meth:`Transport.offer_fields`;
    ``host``: where decode instances reach the source); refuses an option that no transport
    takes. On a failure, what the transports already took is let go."""
    left = dict(options)
    fields: dict[str, Any] = {}
    try:
        for transport in _transports():
            fields.update(transport.offer_fields(caches, layout, left, host, where))
        if left:
            unknown = ", ".join(map(repr, sorted(left)))
            raise TransferError(f"{where}: no KV transport takes the option(s) {unknown}")
    except BaseException:
        close_fields(fields)
        raise
    return fields


def close_fields(fields: dict[str, Any]) -> None:
    """A source that offered ``fields`` closed: each transport lets go of its part."""
    for transport in _transports():
        if any(key in fields for key in transport.fields):
            transport.close_fields(fields)


def read_descriptor(descriptor: Any) -> Descriptor:
    """The checked fields of a received descriptor (a :class:`TransferError` names the first
    missing or ill-typed key); each registered transport reads its own fields."""
    transports = _transports()

    def read_fields(raw: dict[str, Any], layout: KVLayout, where: str) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for transport in transports:
            fields.update(transport.read_fields(raw, layout, where))
        return fields

    return check_descriptor(descriptor, [key for t in transports for key in t.fields], read_fields)


def frame_labels(layout: KVLayout) -> list[str]:
    """What each block frame of an offer is, rank-major: ``"rank r <cache label>"``."""
    ranks = range(layout.tensor_parallel_size)
    return [f"rank {r} {entry.label}" for r in ranks for entry in layout.caches]


def finish_direct_read(job: PullJob, how: str) -> None:
    """After a transport (``how``) read the offer's blocks straight from P's memory into
    ``job.caches`` over a path our MACs do not cover (the Mooncake engine's): check the copy
    against P's tags of its own blocks (:meth:`~.control.ControlChannel.check_copy`; with
    the splitwise secret only), then release the offer
    (:func:`~.control.release_after_direct_read`). A refused copy fails the pull; its blocks
    are freed unused. One HMAC pass over the copy here and over the blocks at P, at the same
    time (``scripts/bench_kv_mac.py``)."""
    layout = job.descriptor.layout
    copies = (cache[job.dst_idx] for rank in job.caches for cache in rank)  # one at a time
    job.channel.check_copy(copies, frame_labels(layout), job.timeout, how)
    release_after_direct_read(job.channel, job.timeout, how)
