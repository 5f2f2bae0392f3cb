"""KV-cache blocks handed from a prefill instance to a decode instance (pull model).

In splitwise serving a prefill instance ("P") computes a prompt's KV caches, for every target
layer and every MTP layer, and hands the request to a decode instance ("D"), which copies
the request's blocks into its own caches and decodes from there. P's engine process runs one
:class:`KVSource`; it :meth:`~KVSource.offer`\\ s a request's blocks, which stay reserved on P
until D says it copied them (or a hold timeout passes), and gets the descriptor D needs.
D's engine process calls :func:`pull_blocks` with that descriptor.

Caches, on either side, are given per tensor-parallel rank as a list of arrays in the order
``key0, value0, key1, value1, ...`` (the target's layers, then the MTP layers), each a
writable numpy array ``[num_blocks, *block_shape]`` (float32 ``[num_blocks,
kv_heads_per_rank, block_size, head_dim]`` for this project's caches; ``cache[b]`` is block
``b``). P and D may have different block counts, every other dimension (:class:`KVLayout`)
must agree.

Descriptor (a JSON-able dict that travels from P to D with the request)::

    {"version": 1, "request_id": str, "address": "tcp://host:port",
     "layout": KVLayout.to_dict(), "block_ids": [int, ...],
     "num_blocks": <P's cache block count>,
     "shm_names": [[name per cache] per rank] or None, "hold_timeout": float}

Wire protocol. P binds a ZeroMQ ROUTER socket at ``address``; D connects a DEALER socket
(a fresh one per pull). Every request is one frame of JSON (never pickle):

* ``{"op": "fetch", "request_id": id}``: P answers a JSON header frame ``{"ok": true,
  "frames": tp * num_caches, "block_nbytes": <bytes of one block of one cache>,
  "num_blocks": <blocks in each data frame, len(block_ids)>}`` followed, in the same
  multipart message, by one data frame per (rank, cache) in rank-major order, each the
  C-order bytes of ``cache[block_ids]``.
* ``{"op": "check", "request_id": id}``: ``{"ok": true, "num_blocks": len(block_ids)}``
  while the offer is held (the "shm" transport asks this before it reads P's memory).
* ``{"op": "release", "request_id": id}``: P drops the offer and calls its ``on_release``
  with ``"released"``; answers ``{"ok": true}``.

Any failure (an unknown, expired, withdrawn or already released request, an unknown op,
malformed JSON, a message of more than one frame) is answered ``{"ok": false, "error":
"<what went wrong>"}``; a bad message never stops P's server thread.

Transports of :func:`pull_blocks`: ``"tcp"`` moves the bytes in the fetch reply; ``"shm"``
(both instances on one host, P's caches published with ``set_data_ipc`` under the names in
the descriptor) attaches P's caches with ``share_external_data``, copies, detaches, and
sends the release over the socket.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import operator
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

__all__ = ["DESCRIPTOR_VERSION", "KVLayout", "KVSource", "TransferError", "pull_blocks"]

logger = logging.getLogger(__name__)

#: ``"version"`` of the descriptors :meth:`KVSource.offer` writes and :func:`pull_blocks` reads.
DESCRIPTOR_VERSION = 1

#: Reasons :class:`KVSource` passes to ``on_release``.
RELEASE_REASONS = ("released", "expired", "withdrawn", "closed")

_POLL_MS = 100  # server loop period: expiry and queued callbacks are handled at least this often
_MAX_CONTROL_BYTES = 1 << 16  # a control message is a few hundred bytes; bigger peers are dropped
_RELEASE_TIMEOUT = 5.0  # at most this long (and at most the pull's timeout) for the release reply
_FINISHED_MEMORY = 4096  # how many finished offers the source remembers for its error messages


class TransferError(RuntimeError):
    """A KV-block transfer failed or was refused; the message names the request, the peer
    or the argument/field at fault."""


class _NoAnswer(TransferError):
    """The source did not answer in time."""


# ---- layout -------------------------------------------------------------------------------


def _int_field(value: Any, name: str, minimum: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TransferError(f"{where}: `{name}` must be an int, got {value!r}")
    if value < minimum:
        raise TransferError(f"{where}: `{name}` must be >= {minimum}, got {value}")
    return int(value)


@dataclass(frozen=True)
class KVLayout:
    """What must agree between the prefill and the decode instance's caches.

    Attributes:
        tensor_parallel_size: ranks, each with its own list of caches.
        num_target_layers: target layers (a key and a value cache each).
        num_mtp_layers: MTP layers after them (a key and a value cache each).
        block_shape: ``cache.shape[1:]`` of every cache on one rank, e.g. ``(kv_heads_per_rank,
            block_size, head_dim)``.
        dtype: numpy dtype name of every cache, e.g. ``"float32"``.
    """

    tensor_parallel_size: int
    num_target_layers: int
    num_mtp_layers: int
    block_shape: tuple[int, ...]
    dtype: str

    _FIELDS = ("tensor_parallel_size", "num_target_layers", "num_mtp_layers", "block_shape", "dtype")

    def __post_init__(self) -> None:
        where = "KVLayout"
        _int_field(self.tensor_parallel_size, "tensor_parallel_size", 1, where)
        _int_field(self.num_target_layers, "num_target_layers", 1, where)
        _int_field(self.num_mtp_layers, "num_mtp_layers", 0, where)
        shape = self.block_shape
        if not isinstance(shape, tuple | list) or not shape:
            raise TransferError(f"{where}: `block_shape` must be a non-empty sequence of ints, got {shape!r}")
        dims = tuple(_int_field(d, "block_shape", 1, where) for d in shape)
        object.__setattr__(self, "block_shape", dims)
        if not isinstance(self.dtype, str):
            raise TransferError(f"{where}: `dtype` must be a numpy dtype name (str), got {self.dtype!r}")
        try:
            name = np.dtype(self.dtype).name
        except TypeError:
            name = None
        if name != self.dtype:
            raise TransferError(f"{where}: `dtype` {self.dtype!r} is not a numpy dtype name")

    @property
    def num_caches(self) -> int:
        """Cache tensors per rank: a key and a value for each target and MTP layer."""
        return 2 * (self.num_target_layers + self.num_mtp_layers)

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block of one cache tensor (``prod(block_shape) * itemsize``)."""
        return math.prod(self.block_shape) * np.dtype(self.dtype).itemsize

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict that :meth:`from_dict` reads back."""
        return {
            "tensor_parallel_size": self.tensor_parallel_size,
            "num_target_layers": self.num_target_layers,
            "num_mtp_layers": self.num_mtp_layers,
            "block_shape": list(self.block_shape),
            "dtype": self.dtype,
        }

    @classmethod
    def from_dict(cls, d: Any) -> KVLayout:
        """The layout :meth:`to_dict` wrote. Raises :class:`TransferError` naming a missing,
        unknown or ill-typed key."""
        if not isinstance(d, dict):
            raise TransferError(f"KV layout must be a dict, got {type(d).__name__}")
        for key in cls._FIELDS:
            if key not in d:
                raise TransferError(f"KV layout: missing key `{key}`")
        for key in d:
            if key not in cls._FIELDS:
                raise TransferError(f"KV layout: unknown key `{key}`")
        if not isinstance(d["block_shape"], list | tuple):
            raise TransferError(f"KV layout: `block_shape` must be a list of ints, got {d['block_shape']!r}")
        return cls(**{key: d[key] for key in cls._FIELDS})

    def check_matches(self, other: KVLayout) -> None:
        """Refuse a decode instance whose layout differs from this (the prefill's) one.

        Raises:
            TransferError: naming the first differing field with both values.
        """
        for key in self._FIELDS:
            mine, theirs = getattr(self, key), getattr(other, key)
            if mine != theirs:
                raise TransferError(
                    f"KV layout mismatch in `{key}`: prefill has {mine!r}, this decode instance has {theirs!r}"
                )

    @classmethod
    def of_caches(cls, caches: Sequence[Sequence[np.ndarray]], num_target_layers: int, num_mtp_layers: int) -> KVLayout:
        """The layout of ``caches`` (per rank, ``key0, value0, ...``, target layers first).

        Raises:
            TransferError: a rank without ``2 * (num_target_layers + num_mtp_layers)`` arrays,
                or arrays that differ in shape or dtype.
        """
        if not isinstance(caches, Sequence) or not caches:
            raise TransferError("KVLayout.of_caches: `caches` must be a non-empty sequence (one entry per rank)")
        first = caches[0][0] if isinstance(caches[0], Sequence) and caches[0] else None
        if not isinstance(first, np.ndarray) or first.ndim < 2:
            raise TransferError(
                "KVLayout.of_caches: `caches[0][0]` must be a numpy array [num_blocks, *block_shape], "
                f"got {type(first).__name__}"
            )
        layout = cls(len(caches), num_target_layers, num_mtp_layers, tuple(first.shape[1:]), first.dtype.name)
        _check_caches(caches, layout, "KVLayout.of_caches", writable=False)
        return layout


def _check_caches(caches: Any, layout: KVLayout, where: str, writable: bool) -> int:
    """Check ``caches`` against ``layout``; returns their common block count."""
    if not isinstance(caches, Sequence) or len(caches) != layout.tensor_parallel_size:
        got = len(caches) if isinstance(caches, Sequence) else type(caches).__name__
        raise TransferError(f"{where}: `caches` must hold {layout.tensor_parallel_size} rank(s), got {got}")
    num_blocks = None
    for r, rank in enumerate(caches):
        if not isinstance(rank, Sequence) or len(rank) != layout.num_caches:
            got = len(rank) if isinstance(rank, Sequence) else type(rank).__name__
            raise TransferError(
                f"{where}: `caches[{r}]` must hold {layout.num_caches} arrays (key and value per "
                f"{layout.num_target_layers} target + {layout.num_mtp_layers} MTP layers), got {got}"
            )
        for c, arr in enumerate(rank):
            if not isinstance(arr, np.ndarray):
                raise TransferError(f"{where}: `caches[{r}][{c}]` must be a numpy array, got {type(arr).__name__}")
            if arr.ndim != 1 + len(layout.block_shape) or tuple(arr.shape[1:]) != layout.block_shape:
                raise TransferError(
                    f"{where}: `caches[{r}][{c}]` has shape {list(arr.shape)}, expected "
                    f"[num_blocks, {', '.join(map(str, layout.block_shape))}]"
                )
            if arr.dtype.name != layout.dtype:
                raise TransferError(f"{where}: `caches[{r}][{c}]` has dtype {arr.dtype.name}, expected {layout.dtype}")
            if num_blocks is None:
                num_blocks = arr.shape[0]
            elif arr.shape[0] != num_blocks:
                raise TransferError(
                    f"{where}: `caches[{r}][{c}]` has {arr.shape[0]} blocks, `caches[0][0]` has {num_blocks}"
                )
            if writable and not arr.flags.writeable:
                raise TransferError(f"{where}: `caches[{r}][{c}]` is read-only; the blocks are copied into it")
    assert num_blocks is not None
    return int(num_blocks)


def _block_id_list(ids: Any, num_blocks: int, name: str, where: str) -> list[int]:
    """``ids`` as a list of distinct ints in ``[0, num_blocks)``."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence | np.ndarray):
        raise TransferError(f"{where}: `{name}` must be a sequence of block ids, got {type(ids).__name__}")
    out = []
    for i in ids:
        if isinstance(i, bool | np.bool_):
            raise TransferError(f"{where}: `{name}` holds a bool {i!r}, expected block ids")
        try:
            b = operator.index(i)
        except TypeError:
            raise TransferError(f"{where}: `{name}` holds {i!r}, expected int block ids") from None
        if not 0 <= b < num_blocks:
            raise TransferError(f"{where}: `{name}` holds block id {b}, outside [0, {num_blocks})")
        out.append(b)
    if len(set(out)) != len(out):
        dup = next(b for b in out if out.count(b) > 1)
        raise TransferError(f"{where}: `{name}` holds block id {dup} more than once")
    return out


# ---- prefill side ---------------------------------------------------------------------------


@dataclass
class _Offer:
    block_ids: np.ndarray  # int64 [n]
    deadline: float  # time.monotonic()


#: Bind addresses that mean "every interface": a decode instance cannot connect to them.
_WILDCARD_HOSTS = ("0.0.0.0", "*", "::", "[::]")


class KVSource:
    """Serves a prefill instance's offered KV blocks to decode instances.

    One per prefill deployment, in its engine process. The constructor binds a ZeroMQ ROUTER
    socket on ``tcp://host:port`` (``port=0``: a free one; see :attr:`address`) and serves it
    in a daemon thread (the wire protocol is in the module docstring).

    Args:
        caches: per rank, the cache arrays ``key0, value0, ...`` (target layers, then MTP
            layers), each ``[num_blocks, *layout.block_shape]`` of ``layout.dtype``, read while
            a request is fetched (zero-copy views of the live caches).
        layout: the layout of ``caches``.
        on_release: ``on_release(request_id, reason)``, called exactly once per offer from the
            server thread once its blocks are free again; ``reason`` is ``"released"`` (the
            decode instance copied them), ``"expired"`` (``hold_timeout`` passed first),
            ``"withdrawn"`` (:meth:`withdraw`) or ``"closed"`` (:meth:`close`). An exception it
            raises is logged and otherwise ignored.
        shm_names: per rank, the names the caches are published under with ``set_data_ipc``
            (same order as ``caches``), put in descriptors for the ``"shm"`` transport; ``None``:
            only ``"tcp"``.
        host, port: where to bind.
        hold_timeout: seconds an offer stays reserved without a release.
        advertise_host: the host name decode instances connect to, put in the descriptors'
            ``address`` (default ``host``; for a wildcard ``host`` such as ``"0.0.0.0"``, this
            machine's fully qualified name).

    Raises:
        TransferError: an argument that does not fit (named), or the bind failed.
    """

    def __init__(
        self,
        caches: Sequence[Sequence[np.ndarray]],
        layout: KVLayout,
        on_release: Callable[[str, str], None],
        shm_names: Sequence[Sequence[str]] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        hold_timeout: float = 60.0,
        advertise_host: str | None = None,
    ):
        where = "KVSource"
        if advertise_host is not None and (not isinstance(advertise_host, str) or not advertise_host):
            raise TransferError(f"{where}: `advertise_host` must be a non-empty str, got {advertise_host!r}")
        if not isinstance(layout, KVLayout):
            raise TransferError(f"{where}: `layout` must be a KVLayout, got {type(layout).__name__}")
        self.num_blocks = _check_caches(caches, layout, where, writable=False)
        if not callable(on_release):
            raise TransferError(f"{where}: `on_release` must be callable, got {on_release!r}")
        if shm_names is not None:
            shm_names = _check_shm_names(shm_names, layout, where)
        if not isinstance(host, str) or not host:
            raise TransferError(f"{where}: `host` must be a non-empty str, got {host!r}")
        port = _int_field(port, "port", 0, where)
        if port > 65535:
            raise TransferError(f"{where}: `port` must be <= 65535, got {port}")
        if isinstance(hold_timeout, bool) or not isinstance(hold_timeout, int | float) or not hold_timeout > 0:
            raise TransferError(f"{where}: `hold_timeout` must be a positive number of seconds, got {hold_timeout!r}")
        self.layout = layout
        self.hold_timeout = float(hold_timeout)
        self._caches = [list(rank) for rank in caches]
        self._shm_names = shm_names
        self._on_release = on_release
        self._lock = threading.Lock()
        self._offers: dict[str, _Offer] = {}
        self._finished: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._withdrawn: list[str] = []  # released by withdraw(), callback still to run
        self._closed = False
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._bind_error: BaseException | None = None
        self.address = ""
        self._thread = threading.Thread(
            target=self._serve, args=(host, port), name=f"KVSource:{host}:{port}", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._bind_error is None:
            advertised = advertise_host or (socket.getfqdn() if host in _WILDCARD_HOSTS else None)
            if advertised:
                self.address = f"tcp://{advertised}:{self.address.rsplit(':', 1)[1]}"
        if self._bind_error is not None:
            self._closed = True
            self._thread.join()
            raise TransferError(f"{where}: cannot bind tcp://{host}:{port}: {self._bind_error}")

    # -- engine-thread API --
    def offer(self, request_id: str, block_ids: Sequence[int]) -> dict[str, Any]:
        """Reserve ``block_ids`` (in P's caches) for ``request_id`` until a decode instance
        releases them, and return the JSON-able descriptor it pulls them with (module docstring).

        Raises:
            TransferError: ``request_id`` not a non-empty str or already pending, ``block_ids``
                empty, repeated or outside ``[0, num_blocks)``, or the source is closed.
        """
        where = f"KVSource.offer({request_id!r})"
        if not isinstance(request_id, str) or not request_id:
            raise TransferError(f"KVSource.offer: `request_id` must be a non-empty str, got {request_id!r}")
        ids = _block_id_list(block_ids, self.num_blocks, "block_ids", where)
        if not ids:
            raise TransferError(f"{where}: `block_ids` is empty")
        with self._lock:
            if self._closed:
                raise TransferError(f"{where}: the source at {self.address} is closed")
            if request_id in self._offers:
                raise TransferError(f"{where}: request {request_id!r} is already offered and not yet released")
            self._offers[request_id] = _Offer(np.asarray(ids, np.int64), time.monotonic() + self.hold_timeout)
            self._finished.pop(request_id, None)
        return {
            "version": DESCRIPTOR_VERSION,
            "request_id": request_id,
            "address": self.address,
            "layout": self.layout.to_dict(),
            "block_ids": ids,
            "num_blocks": self.num_blocks,
            "shm_names": None if self._shm_names is None else [list(r) for r in self._shm_names],
            "hold_timeout": self.hold_timeout,
        }

    def withdraw(self, request_id: str) -> bool:
        """Cancel a pending offer (later pulls of it fail). ``on_release(request_id,
        "withdrawn")`` follows from the server thread. Returns whether it was pending."""
        with self._lock:
            if self._closed or self._offers.pop(request_id, None) is None:
                return False
            self._remember(request_id, "withdrawn")
            self._withdrawn.append(request_id)
        return True

    def pending(self) -> list[str]:
        """Request ids offered and not yet released, expired or withdrawn (offer order)."""
        with self._lock:
            return list(self._offers)

    def close(self) -> None:
        """Stop serving; every pending offer gets ``on_release(id, "closed")``. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> KVSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- server thread --
    def _remember(self, request_id: str, reason: str) -> None:
        """Record why an offer ended (for error messages); caller holds the lock."""
        self._finished[request_id] = reason
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def _notify(self, request_id: str, reason: str) -> None:
        try:
            self._on_release(request_id, reason)
        except Exception:
            logger.exception("KVSource: on_release(%r, %r) raised", request_id, reason)

    def _serve(self, host: str, port: int) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, _MAX_CONTROL_BYTES)
            sock.bind(f"tcp://{host}:{port if port else '*'}")
            endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
            assert isinstance(endpoint, bytes)
            self.address = endpoint.decode()
        except Exception as exc:  # reported by the constructor
            self._bind_error = exc
            sock.close(0)
            ctx.term()
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(_POLL_MS):
                    for _ in range(64):  # then look at expiry again
                        try:
                            msg = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(sock, msg)
                self._expire()
                self._run_withdrawn()
        except Exception:
            logger.exception("KVSource %s: server loop failed", self.address)
        finally:
            sock.close(0)
            ctx.term()
            with self._lock:
                self._closed = True
                left = list(self._offers)
                self._offers.clear()
                for rid in left:
                    self._remember(rid, "closed")
            self._run_withdrawn()
            for rid in left:
                self._notify(rid, "closed")

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            gone = [rid for rid, o in self._offers.items() if o.deadline <= now]
            for rid in gone:
                del self._offers[rid]
                self._remember(rid, "expired")
        for rid in gone:
            self._notify(rid, "expired")

    def _run_withdrawn(self) -> None:
        with self._lock:
            todo, self._withdrawn = self._withdrawn, []
        for rid in todo:
            self._notify(rid, "withdrawn")

    def _gone_reason(self, request_id: str) -> str:
        reason = self._finished.get(request_id)
        if reason == "expired":
            return f"request {request_id!r} expired (not released within hold_timeout {self.hold_timeout:g} s)"
        if reason is not None:
            return f"request {request_id!r} was {reason} and its blocks freed"
        return f"unknown request {request_id!r} (never offered here)"

    def _handle(self, sock: zmq.Socket, msg: list[bytes]) -> None:
        identity, frames = msg[0], msg[1:]
        released = None
        try:
            reply, data = self._answer(frames)
            if reply.pop("_released", False):
                released = reply.pop("_request_id")
        except Exception as exc:  # a bad message must not stop the server
            reply, data = {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}, []
        try:
            parts: list[Any] = [identity, json.dumps(reply).encode(), *data]
            sock.send_multipart(parts, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:  # the peer's queue is full or it went away
            logger.warning("KVSource %s: reply dropped: %s", self.address, exc)
        if released is not None:
            self._notify(released, "released")

    def _answer(self, frames: list[bytes]) -> tuple[dict[str, Any], list[np.ndarray]]:
        def error(text: str) -> tuple[dict[str, Any], list[np.ndarray]]:
            return {"ok": False, "error": text}, []

        if len(frames) != 1:
            return error(f"expected one JSON frame, got {len(frames)}")
        try:
            req = json.loads(frames[0])
        except (ValueError, UnicodeDecodeError) as exc:
            return error(f"malformed JSON: {exc}")
        if not isinstance(req, dict):
            return error(f"expected a JSON object, got {type(req).__name__}")
        op, rid = req.get("op"), req.get("request_id")
        if op not in ("fetch", "check", "release"):
            return error(f"unknown op {op!r} (expected 'fetch', 'check' or 'release')")
        if not isinstance(rid, str):
            return error(f"`request_id` must be a str, got {rid!r}")
        with self._lock:
            offer = self._offers.get(rid)
            if offer is not None and offer.deadline <= time.monotonic():
                offer = None  # expired; the loop's _expire() tells on_release
                reason = f"request {rid!r} expired (not released within hold_timeout {self.hold_timeout:g} s)"
            elif offer is None:
                reason = self._gone_reason(rid)
            if offer is None:
                return error(reason)
            n = len(offer.block_ids)
            if op == "check":
                return {"ok": True, "num_blocks": n}, []
            if op == "release":
                del self._offers[rid]
                self._remember(rid, "released")
                return {"ok": True, "_released": True, "_request_id": rid}, []
            # fetch: copied under the lock, so a withdraw() that returned sees no later reads
            data = [np.ascontiguousarray(cache[offer.block_ids]) for rank in self._caches for cache in rank]
        header = {"ok": True, "frames": len(data), "block_nbytes": self.layout.block_nbytes, "num_blocks": n}
        return header, data


def _check_shm_names(names: Any, layout: KVLayout, where: str) -> list[list[str]]:
    if not isinstance(names, Sequence) or isinstance(names, str) or len(names) != layout.tensor_parallel_size:
        raise TransferError(f"{where}: `shm_names` must hold one list per rank ({layout.tensor_parallel_size})")
    out = []
    for r, rank in enumerate(names):
        if (
            not isinstance(rank, Sequence)
            or isinstance(rank, str)
            or len(rank) != layout.num_caches
            or not all(isinstance(n, str) and n for n in rank)
        ):
            raise TransferError(f"{where}: `shm_names[{r}]` must hold {layout.num_caches} non-empty names")
        out.append(list(rank))
    return out


# ---- decode side --------------------------------------------------------------------------


def _check_descriptor(descriptor: Any) -> tuple[str, str, KVLayout, list[int], int, list[list[str]] | None]:
    where = "pull_blocks: descriptor"
    if not isinstance(descriptor, dict):
        raise TransferError(f"{where} must be a dict, got {type(descriptor).__name__}")
    for key in ("version", "request_id", "address", "layout", "block_ids", "num_blocks", "shm_names", "hold_timeout"):
        if key not in descriptor:
            raise TransferError(f"{where}: missing key `{key}`")
    if descriptor["version"] != DESCRIPTOR_VERSION or isinstance(descriptor["version"], bool):
        raise TransferError(f"{where}: `version` {descriptor['version']!r} is not {DESCRIPTOR_VERSION}")
    rid = descriptor["request_id"]
    if not isinstance(rid, str) or not rid:
        raise TransferError(f"{where}: `request_id` must be a non-empty str, got {rid!r}")
    where = f"pull_blocks({rid!r}): descriptor"
    address = descriptor["address"]
    if not isinstance(address, str) or not address.startswith("tcp://"):
        raise TransferError(f"{where}: `address` must be a 'tcp://host:port' str, got {address!r}")
    try:
        src_layout = KVLayout.from_dict(descriptor["layout"])
    except TransferError as exc:
        raise TransferError(f"{where}: `layout`: {exc}") from None
    num_blocks = _int_field(descriptor["num_blocks"], "num_blocks", 1, where)
    block_ids = _block_id_list(descriptor["block_ids"], num_blocks, "block_ids", where)
    if not block_ids:
        raise TransferError(f"{where}: `block_ids` is empty")
    names = descriptor["shm_names"]
    if names is not None:
        names = _check_shm_names(names, src_layout, where)
    hold = descriptor["hold_timeout"]
    if isinstance(hold, bool) or not isinstance(hold, int | float) or not hold > 0:
        raise TransferError(f"{where}: `hold_timeout` must be a positive number, got {hold!r}")
    return rid, address, src_layout, block_ids, num_blocks, names


class _Peer:
    """A DEALER connected to a source, with bounded request/reply."""

    def __init__(self, address: str, request_id: str):
        self.address = address
        self.request_id = request_id
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def ask(self, op: str, timeout: float) -> tuple[dict[str, Any], list[zmq.Frame]]:
        """Send ``op``; the reply header (``ok`` checked) and its data frames."""
        deadline = time.monotonic() + timeout
        msg = json.dumps({"op": op, "request_id": self.request_id}).encode()
        if not self.sock.poll(max(1, int(timeout * 1000)), zmq.POLLOUT):
            raise self._timeout(op, timeout)
        self.sock.send(msg, zmq.NOBLOCK)
        left = deadline - time.monotonic()
        if left <= 0 or not self.sock.poll(max(1, int(left * 1000)), zmq.POLLIN):
            raise self._timeout(op, timeout)
        frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
        try:
            header = json.loads(frames[0].bytes)
        except (ValueError, UnicodeDecodeError) as exc:
            raise TransferError(
                f"pull_blocks({self.request_id!r}): {op} reply from {self.address} is not JSON: {exc}"
            ) from None
        if not isinstance(header, dict) or header.get("ok") is not True:
            error = header.get("error") if isinstance(header, dict) else header
            raise TransferError(
                f"pull_blocks({self.request_id!r}): prefill source {self.address} refused {op}: {error}"
            )
        return header, frames[1:]

    def _timeout(self, op: str, timeout: float) -> TransferError:
        return _NoAnswer(
            f"pull_blocks({self.request_id!r}): prefill source {self.address} did not answer {op} within "
            f"{timeout:g} s (dead or hung prefill instance?)"
        )

    def release(self, timeout: float) -> bool:
        """Release the offer; False if the source did not answer in time (a dead source after
        a complete copy is not an error). A refusal raises :class:`TransferError`."""
        try:
            self.ask("release", timeout)
        except _NoAnswer as exc:
            logger.warning("%s", exc)
            return False
        return True

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def pull_blocks(
    descriptor: dict[str, Any],
    caches: Sequence[Sequence[np.ndarray]],
    layout: KVLayout,
    dst_block_ids: Sequence[int],
    transport: str = "tcp",
    timeout: float = 30.0,
) -> int:
    """Copy the blocks a prefill instance offered into this (decode) instance's caches, then
    tell the source to release them.

    The ``j``-th offered block of cache ``c`` on rank ``r`` lands in
    ``caches[r][c][dst_block_ids[j]]``; extra ``dst_block_ids`` are ignored, other blocks are
    untouched. Everything is checked before a byte is written: the descriptor's keys and
    types, ``layout`` against the prefill's (:meth:`KVLayout.check_matches`), the block ids on
    both sides, and (``"tcp"``) the count and exact size of every received frame.

    Args:
        descriptor: what :meth:`KVSource.offer` returned (after a JSON round trip or not).
        caches: per rank, this instance's writable cache arrays ``key0, value0, ...`` (target
            layers, then MTP layers), each ``[num_blocks, *layout.block_shape]``.
        layout: the layout of ``caches``.
        dst_block_ids: distinct block ids in ``caches``, at least one per offered block.
        transport: ``"tcp"`` (the bytes come over the socket) or ``"shm"`` (same host: P's
            published caches are attached by the descriptor's ``shm_names``, copied from and
            detached; needs ``shm_names``).
        timeout: seconds the source may take to answer each request.

    Returns:
        Bytes copied (``tp * num_caches * len(block_ids) * block_nbytes``).

    Raises:
        TransferError: a bad argument or descriptor field (named), a layout mismatch, a source
            that does not answer within ``timeout`` (names its address and the timeout), or a
            request the source no longer holds (unknown, expired, withdrawn, released). Nothing
            was written then, except when the source drops the offer during an ``"shm"`` copy
            (the copied blocks may be torn; the error says so).
    """
    rid, address, src_layout, src_ids, src_num_blocks, names = _check_descriptor(descriptor)
    where = f"pull_blocks({rid!r})"
    if not isinstance(layout, KVLayout):
        raise TransferError(f"{where}: `layout` must be a KVLayout, got {type(layout).__name__}")
    src_layout.check_matches(layout)
    dst_num_blocks = _check_caches(caches, layout, where, writable=True)
    dst = _block_id_list(dst_block_ids, dst_num_blocks, "dst_block_ids", where)
    if len(dst) < len(src_ids):
        raise TransferError(f"{where}: `dst_block_ids` has {len(dst)} block(s), the prefill offered {len(src_ids)}")
    dst_idx = np.asarray(dst[: len(src_ids)], np.int64)
    if transport not in ("tcp", "shm"):
        raise TransferError(f"{where}: `transport` must be 'tcp' or 'shm', got {transport!r}")
    if transport == "shm" and names is None:
        raise TransferError(f"{where}: transport 'shm' needs `shm_names` in the descriptor; the source has none")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise TransferError(f"{where}: `timeout` must be a positive number of seconds, got {timeout!r}")
    n = len(src_ids)
    total = layout.tensor_parallel_size * layout.num_caches * n * layout.block_nbytes
    peer = _Peer(address, rid)
    try:
        if transport == "tcp":
            _pull_tcp(peer, caches, layout, n, dst_idx, float(timeout))
            try:  # the bytes were consistent when fetched; a lost offer now costs nothing
                peer.release(min(float(timeout), _RELEASE_TIMEOUT))
            except TransferError as exc:
                logger.warning("%s (after a complete copy)", exc)
        else:
            assert names is not None
            peer.ask("check", float(timeout))
            _copy_shm(names, caches, layout, src_num_blocks, np.asarray(src_ids, np.int64), dst_idx, where)
            try:
                peer.release(min(float(timeout), _RELEASE_TIMEOUT))
            except TransferError as exc:
                raise TransferError(
                    f"{exc}; the offer ended while its blocks were copied over shm, so they may be torn"
                ) from None
    finally:
        peer.close()
    return total


def _pull_tcp(
    peer: _Peer, caches: Sequence[Sequence[np.ndarray]], layout: KVLayout, n: int, dst_idx: np.ndarray, timeout: float
) -> None:
    header, frames = peer.ask("fetch", timeout)
    where = f"pull_blocks({peer.request_id!r}): fetch reply from {peer.address}"
    want = layout.tensor_parallel_size * layout.num_caches
    for key, expected in (("frames", want), ("block_nbytes", layout.block_nbytes), ("num_blocks", n)):
        if header.get(key) != expected:
            raise TransferError(f"{where}: header `{key}` is {header.get(key)!r}, expected {expected}")
    if len(frames) != want:
        raise TransferError(f"{where}: {len(frames)} data frames, expected {want}")
    size = n * layout.block_nbytes
    for i, frame in enumerate(frames):
        if len(frame.buffer) != size:
            raise TransferError(
                f"{where}: data frame {i} (rank {i // layout.num_caches}, cache {i % layout.num_caches}) has "
                f"{len(frame.buffer)} bytes, expected {size}"
            )
    shape = (n, *layout.block_shape)
    for i, frame in enumerate(frames):
        cache = caches[i // layout.num_caches][i % layout.num_caches]
        cache[dst_idx] = np.frombuffer(frame.buffer, dtype=layout.dtype).reshape(shape)


def _copy_shm(
    names: list[list[str]],
    caches: Sequence[Sequence[np.ndarray]],
    layout: KVLayout,
    src_num_blocks: int,
    src_idx: np.ndarray,
    dst_idx: np.ndarray,
    where: str,
) -> None:
    import paddle

    from .. import ops

    shape = [src_num_blocks, *layout.block_shape]
    attached: list[tuple[Any, str]] = []
    try:
        for rank in names:  # attach everything first: a missing name fails before any write
            for name in rank:
                try:
                    t = ops.share_external_data(input=paddle.empty([], dtype=layout.dtype), shm_name=name, shape=shape)
                except Exception as exc:
                    raise TransferError(f"{where}: cannot attach the prefill's cache {name!r}: {exc}") from None
                attached.append((t, name))
        for i, (t, _name) in enumerate(attached):
            src = np.from_dlpack(t)
            caches[i // layout.num_caches][i % layout.num_caches][dst_idx] = src[src_idx]
            del src
    finally:
        for t, name in attached:
            ops.unset_data_ipc(tmp_input=t, shm_name=name, close_ipc=True, unlink_shm=False)
