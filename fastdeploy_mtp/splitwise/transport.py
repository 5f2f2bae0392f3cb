"""The KV-transfer protocol between a prefill instance ("P") and a decode instance ("D"), and
the registry of the transports that move the bytes (pull model).

In splitwise serving P computes a prompt's KV caches, for every target layer and every MTP
layer, and hands the request to D, which copies the request's blocks into its own caches
(:mod:`.kv_layout` says how caches are given) and decodes from there. P's engine process
runs one :class:`~.kv_source.KVSource`; it offers a request's blocks, which stay reserved on
P until D says it copied them (or a hold timeout passes), and gets the descriptor D needs.
D's engine process calls :func:`~.kv_client.pull_blocks` with that descriptor and the name
of a transport.

Descriptor (a JSON-able dict that travels from P to D with the request)::

    {"version": 4, "request_id": str, "address": "tcp://host:port", "token": str,
     "layout": KVLayout.to_dict(), "block_ids": [int, ...],
     "num_blocks": <P's cache block count>,
     <every transport's fields: "shm_names": [[name per cache] per rank] or None,
      "mooncake": {"segment": "host:port", "buffers": [[address per cache] per rank]} or None>,
     "hold_timeout": float}

``token`` is the offer's transfer token: 32 random bytes (URL-safe base64) drawn by P for
this offer alone. It is the capability to fetch, check or release the offer: only the
holder of the hand-over has it, so no other peer can read, release or redirect a request's
KV even if it guesses the request id.

Control protocol. P binds a ZeroMQ ROUTER socket at ``address``; D connects a DEALER socket
(a fresh one per pull). Every request is one frame of JSON (never pickle)
``{"op": op, "request_id": id, "token": token, "mac": mac}``: ``mac`` is the hex HMAC-SHA256
of ``[op, request_id, token]`` (compact JSON) under the key the splitwise secret derives for
``"kv"`` (:func:`fastdeploy_mtp.credentials.derive`), ``null`` where the source runs without a
secret. A request whose ``mac`` or ``token`` does not hold is refused with one error that
does not say which (and counted as dropped); it changes nothing at P.

* ``{"op": "check"}``: ``{"ok": true, "num_blocks": len(block_ids), "offer": <the offer's
  descriptor without its token>}`` while the offer is held. D pulls what P offered, never
  what the hand-over says: it refuses a hand-over whose descriptor differs from P's offer
  (block ids, layout, transport fields), and every transport reads the blocks of the offer.
* ``{"op": "fetch"}``: once per offer (a second fetch is refused). P answers a JSON header
  frame ``{"ok": true, "frames": tp * num_caches, "block_nbytes": [<bytes of one block of
  cache c> per cache], "num_blocks": <blocks in each data frame, len(block_ids)>}`` followed,
  in the same multipart message, by one data frame per (rank, cache) in rank-major order,
  each the C-order bytes of ``cache[block_ids]`` (the ``"tcp"`` transport,
  :mod:`.transports.tcp`). A fetch may carry ``"first": j`` (an int in ``[1, len(block_ids))``,
  then part of the mac: ``[op, request_id, token, j]``): P sends ``block_ids[j:]`` only, the
  blocks D's prefix cache does not already hold (``num_blocks`` counts those).
* ``{"op": "release"}``: P drops the offer and calls its ``on_release`` with ``"released"``;
  answers ``{"ok": true}``. The token is spent.

Any failure (an unknown, expired, withdrawn or already released request, an unknown op,
malformed JSON, a message of more than one frame) is answered ``{"ok": false, "error":
"<what went wrong>"}``; a bad message never stops P's server thread.

Transports. Each is a :class:`Transport` in its own module of :mod:`.transports` that
registers itself with :func:`register`; the registry imports every module there on first
use, so adding a transport is adding one module. ``"auto"`` (:func:`choose_transport`) picks
the registered transport of the highest :attr:`~Transport.preference` that is
:meth:`~Transport.usable` for a descriptor: ``"shm"`` when P's caches are published on this
host, else ``"mooncake"`` when P registered them with a Mooncake transfer engine and the
engine imports here, else ``"tcp"``.

The transports that read P's memory directly (``"shm"``, ``"mooncake"``) read it between
D's ``check`` and its ``release``: P holds the offer's blocks for that whole time, so they
cannot be reused under the read unless the hold timeout passes first, which the release
then reports (:func:`release_after_direct_read`).
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
import zmq

from . import transports as _transports_package
from .kv_layout import (
    Caches,
    KVLayout,
    TransferError,
    block_id_list,
    int_field,
    nonempty_str,
    positive_number,
)

__all__ = [
    "AUTO",
    "DESCRIPTOR_VERSION",
    "ControlChannel",
    "Descriptor",
    "Transport",
    "choose_transport",
    "close_fields",
    "control_mac",
    "differing_field",
    "get_transport",
    "offer_fields",
    "read_descriptor",
    "register",
    "release_after_direct_read",
    "transport_names",
]

#: ``"version"`` of the descriptors a source writes and :func:`read_descriptor` reads.
DESCRIPTOR_VERSION = 4

#: The transport name that lets :func:`choose_transport` pick one per descriptor.
AUTO = "auto"


class ControlChannel(Protocol):
    """D's connection to the source of one request (:class:`~.kv_client._Peer`)."""

    address: str
    request_id: str

    def ask(self, op: str, timeout: float) -> tuple[dict[str, Any], list[zmq.Frame]]:
        """Send ``op``; the reply header (``ok`` checked, else :class:`TransferError`) and
        its data frames."""
        ...

    def release(self, timeout: float) -> bool:
        """Release the offer; False if the source did not answer in time. A refusal raises."""
        ...


@dataclass(frozen=True)
class Descriptor:
    """A descriptor's fields, checked (:func:`read_descriptor`) or about to be sent
    (:meth:`to_dict`); ``fields`` holds every registered transport's fields."""

    request_id: str
    address: str
    layout: KVLayout
    block_ids: list[int]
    num_blocks: int
    hold_timeout: float
    fields: dict[str, Any]
    #: the offer's transfer token (module docstring)
    token: str = ""

    @property
    def where(self) -> str:
        """The prefix of the pull's error messages."""
        return f"pull_blocks({self.request_id!r})"

    def offer_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without the token: what P's ``check`` answer carries and D compares."""
        out = self.to_dict()
        del out["token"]
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able descriptor (module docstring), sharing no list with ``self``."""
        return {
            "version": DESCRIPTOR_VERSION,
            "request_id": self.request_id,
            "address": self.address,
            "token": self.token,
            "layout": self.layout.to_dict(),
            "block_ids": list(self.block_ids),
            "num_blocks": self.num_blocks,
            **copy.deepcopy(self.fields),
            "hold_timeout": self.hold_timeout,
        }


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
    def pull(
        self,
        channel: ControlChannel,
        descriptor: Descriptor,
        caches: Caches,
        dst_idx: np.ndarray,
        timeout: float,
    ) -> None:
        """Copy block ``descriptor.block_ids[j]`` of P's cache ``c`` on rank ``r`` into
        ``caches[r][c][dst_idx[j]]`` and release the offer over ``channel``.

        Args:
            channel: the control connection to P's source for this request.
            descriptor: checked; ``descriptor.layout`` matches ``caches``.
            caches: D's writable caches (checked).
            dst_idx: int64 ``[len(descriptor.block_ids)]``, distinct block ids in ``caches``.
            timeout: seconds P may take to answer each request.

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
            raise TransferError(
                f"{where}: no KV transport takes the option(s) {', '.join(map(repr, sorted(left)))}"
            )
    except BaseException:
        close_fields(fields)
        raise
    return fields


def close_fields(fields: dict[str, Any]) -> None:
    """A source that offered ``fields`` closed: each transport lets go of its part."""
    for transport in _transports():
        if any(key in fields for key in transport.fields):
            transport.close_fields(fields)


def release_after_direct_read(channel: ControlChannel, timeout: float, how: str) -> None:
    """Release the offer after its blocks were read straight from P's memory (``how``: the
    transport, for the message). A refusal means the offer ended during the read (its hold
    timeout passed, or P withdrew it), so P may have reused the blocks under the read: a
    :class:`TransferError` that says the copy may be torn. No answer in time is only logged
    by :meth:`ControlChannel.release` (the blocks were held while read)."""
    try:
        channel.release(timeout)
    except TransferError as exc:
        raise TransferError(
            f"{exc}; the offer ended while its blocks were read over {how}, so they may be torn"
        ) from None


def read_descriptor(descriptor: Any) -> Descriptor:
    """The checked fields of a received descriptor (a :class:`TransferError` names the first
    missing or ill-typed key)."""
    where = "pull_blocks: descriptor"
    if not isinstance(descriptor, dict):
        raise TransferError(f"{where} must be a dict, got {type(descriptor).__name__}")
    transports = _transports()
    own = [key for t in transports for key in t.fields]
    for key in (
        "version",
        "request_id",
        "address",
        "token",
        "layout",
        "block_ids",
        "num_blocks",
        *own,
        "hold_timeout",
    ):
        if key not in descriptor:
            raise TransferError(f"{where}: missing key `{key}`")
    if descriptor["version"] != DESCRIPTOR_VERSION or isinstance(descriptor["version"], bool):
        raise TransferError(
            f"{where}: `version` {descriptor['version']!r} is not {DESCRIPTOR_VERSION}"
        )
    rid = nonempty_str(descriptor["request_id"], "request_id", where)
    where = f"pull_blocks({rid!r}): descriptor"
    address = descriptor["address"]
    if not isinstance(address, str) or not address.startswith("tcp://"):
        raise TransferError(f"{where}: `address` must be a 'tcp://host:port' str, got {address!r}")
    token = descriptor["token"]
    if not isinstance(token, str) or not 16 <= len(token) <= 128:
        raise TransferError(
            f"{where}: `token` must be the offer's transfer token (a str of 16..128 characters)"
        )
    try:
        layout = KVLayout.from_dict(descriptor["layout"])
    except TransferError as exc:
        raise TransferError(f"{where}: `layout`: {exc}") from None
    num_blocks = int_field(descriptor["num_blocks"], "num_blocks", 1, where)
    for entry in layout.caches:
        if entry.shape[0] != num_blocks:
            raise TransferError(
                f"{where}: `layout` gives {entry.label} {entry.shape[0]} blocks, `num_blocks` is {num_blocks}"
            )
    block_ids = block_id_list(descriptor["block_ids"], num_blocks, "block_ids", where)
    if not block_ids:
        raise TransferError(f"{where}: `block_ids` is empty")
    fields: dict[str, Any] = {}
    for transport in transports:
        fields.update(transport.read_fields(descriptor, layout, where))
    hold = positive_number(descriptor["hold_timeout"], "hold_timeout", where)
    return Descriptor(rid, address, layout, block_ids, num_blocks, hold, fields, token)


def differing_field(handed_over: Descriptor, offered: Descriptor) -> str | None:
    """The first field in which the hand-over's descriptor differs from P's offer (``None``
    if they agree); the address and hold timeout are the hand-over's business."""
    ours, theirs = handed_over.offer_dict(), offered.offer_dict()
    for key in ours:
        if key not in ("address", "hold_timeout") and ours[key] != theirs.get(key):
            return key
    return None


def control_mac(
    key: bytes | None, op: str, request_id: str, token: str, first: int = 0
) -> str | None:
    """The ``mac`` of a control request (module docstring); ``None`` without a key.
    ``first``: a fetch's first block (covered by the mac when not 0)."""
    if key is None:
        return None
    from ..credentials import sign

    return sign(key, [op, request_id, token, *([first] if first else [])])
