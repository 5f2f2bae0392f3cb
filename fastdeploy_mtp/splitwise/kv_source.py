"""The prefill side of the KV transfer: :class:`KVSource`, a ZeroMQ server in P's engine
process that offers a request's blocks, serves them to decode instances and frees them on
release or after a hold timeout (the protocol is in :mod:`.control`)."""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zmq

from ..credentials import DroppedMessages, derive
from .addresses import discover_host
from .control import BLOCK_OPS, control_mac
from .descriptor import Descriptor
from .kv_layout import (
    Caches,
    KVLayout,
    TransferError,
    block_id_list,
    check_caches,
    int_field,
    nonempty_str,
    positive_number,
)
from .kv_mac import answer_mac, frame_tags
from .offers import Offers, Reply, error_reply, same_secret
from .transport import close_fields, offer_fields
from .transports.tcp import fetch_reply

__all__ = ["KVSource"]

logger = logging.getLogger(__name__)

#: The control ops (:mod:`.control`).
_OPS = ("check", "fetch", "digest", "release")

_POLL_MS = 100  # server loop period: expiry and queued callbacks are handled at least this often
_MAX_CONTROL_BYTES = 1 << 16  # a control message is a few hundred bytes; bigger peers are dropped

#: Bind addresses that mean "every interface": a decode instance cannot connect to them.
_WILDCARD_HOSTS = ("0.0.0.0", "*", "::", "[::]")

#: What a refused control request is told: the same whether the token, the signature or the
#: request id was wrong, so a probing peer learns nothing.
_NOT_AUTHORIZED = (
    "not authorized: no offer of this request id holds this transfer token under this "
    "splitwise secret"
)


class KVSource:
    """Serves a prefill instance's offered KV blocks to decode instances.

    One per prefill deployment, in its engine process. The constructor binds a ZeroMQ ROUTER
    socket on ``tcp://host:port`` (``port=0``: a free one; see :attr:`address`) and serves it
    in a daemon thread (the wire protocol is in :mod:`.control`).

    Args:
        caches: per rank, one cache array per entry of ``layout.caches`` (every target and
            every MTP layer's), each ``[num_blocks, *block_shape]`` of its host dtype, read while
            a request is fetched (zero-copy views of the live caches).
        layout: the layout of ``caches``.
        on_release: ``on_release(request_id, reason)``, called exactly once per offer from the
            server thread once its blocks are free again; ``reason`` is ``"released"`` (the
            decode instance copied them), ``"expired"`` (``hold_timeout`` passed first),
            ``"withdrawn"`` (:meth:`withdraw`) or ``"closed"`` (:meth:`close`). An exception it
            raises is logged and otherwise ignored.
        host, port: where to bind.
        hold_timeout: seconds an offer stays reserved without a release.
        advertise_host: the host name decode instances connect to, put in the descriptors'
            ``address`` (default ``host``; for a wildcard ``host`` such as ``"0.0.0.0"``, the
            address :func:`~.addresses.discover_host` finds).
        transport_options: what the transports offer besides the control socket, each read
            by its transport (:mod:`.transports`): ``shm_names``, per rank the names the
            caches are published under with ``set_data_ipc`` (same order as ``caches``), for
            the ``"shm"`` transport (``None``, the default: not offered); ``mooncake=True``
            registers every cache with this process's Mooncake transfer engine, serving
            from the advertised host, for the ``"mooncake"`` transport (default False).
        secret: the splitwise secret (:func:`fastdeploy_mtp.credentials.splitwise_secret`):
            every control request must carry its ``mac`` (see :mod:`.control`), and every
            answer carries one and every block frame a tag (:mod:`.kv_mac`); ``None``: the
            transfer token alone authorizes a request, and nothing is signed.
        dropped: counts the refused requests (channel ``"kv"``; a new counter if not given).

    Raises:
        TransferError: an argument that does not fit (named), an option no transport takes,
            or the bind failed.
    """

    def __init__(
        self,
        caches: Caches,
        layout: KVLayout,
        on_release: Callable[[str, str], None],
        host: str = "127.0.0.1",
        port: int = 0,
        hold_timeout: float = 60.0,
        advertise_host: str | None = None,
        secret: bytes | None = None,
        dropped: DroppedMessages | None = None,
        **transport_options: Any,
    ):
        where = "KVSource"
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise TransferError(f"{where}: `secret` must be non-empty bytes or None")
        self._key = None if secret is None else derive(secret, "kv")
        self.dropped = dropped if dropped is not None else DroppedMessages()
        if advertise_host is not None:
            nonempty_str(advertise_host, "advertise_host", where)
        if not isinstance(layout, KVLayout):
            raise TransferError(
                f"{where}: `layout` must be a KVLayout, got {type(layout).__name__}"
            )
        self.num_blocks = check_caches(caches, layout, where, writable=False)
        if not callable(on_release):
            raise TransferError(f"{where}: `on_release` must be callable, got {on_release!r}")
        nonempty_str(host, "host", where)
        port = int_field(port, "port", 0, where)
        if port > 65535:
            raise TransferError(f"{where}: `port` must be <= 65535, got {port}")
        self.hold_timeout = positive_number(
            hold_timeout, "hold_timeout", where, "a positive number of seconds"
        )
        self.layout = layout
        self._caches = [list(rank) for rank in caches]
        self._on_release = on_release
        self._offers = Offers(self.hold_timeout)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._bind_error: BaseException | None = None
        self.address = ""
        self._thread = threading.Thread(
            target=self._serve, args=(host, port), name=f"KVSource:{host}:{port}", daemon=True
        )
        self._start(host, port, advertise_host)
        try:
            self._fields = offer_fields(
                caches, layout, transport_options, _host_of(self.address), where
            )
        except BaseException:
            self._stop.set()
            self._thread.join()
            raise

    def _start(self, host: str, port: int, advertise_host: str | None) -> None:
        """Run the server thread until it bound (or failed to), then advertise its address."""
        self._thread.start()
        self._ready.wait()
        if self._bind_error is not None:
            self._offers.close()
            self._thread.join()
            raise TransferError(f"KVSource: cannot bind tcp://{host}:{port}: {self._bind_error}")
        advertised = advertise_host or (discover_host() if host in _WILDCARD_HOSTS else None)
        if advertised:
            self.address = f"tcp://{advertised}:{self.address.rsplit(':', 1)[1]}"

    # -- engine-thread API --
    def offer(self, request_id: str, block_ids: Sequence[int]) -> dict[str, Any]:
        """Reserve ``block_ids`` (in P's caches) for ``request_id`` until a decode instance
        releases them, and return the JSON-able descriptor it pulls them with
        (:mod:`.descriptor`).

        Raises:
            TransferError: ``request_id`` not a non-empty str or already pending, ``block_ids``
                empty, repeated or outside ``[0, num_blocks)``, or the source is closed.
        """
        where = f"KVSource.offer({request_id!r})"
        nonempty_str(request_id, "request_id", "KVSource.offer")
        ids = block_id_list(block_ids, self.num_blocks, "block_ids", where)
        if not ids:
            raise TransferError(f"{where}: `block_ids` is empty")
        token = secrets.token_urlsafe(32)
        descriptor = Descriptor(
            request_id,
            self.address,
            self.layout,
            ids,
            self.num_blocks,
            self.hold_timeout,
            self._fields,
            token,
        )
        self._offers.add(request_id, ids, token, descriptor.offer_dict())
        return descriptor.to_dict()

    def withdraw(self, request_id: str) -> bool:
        """Cancel a pending offer (later pulls of it fail). ``on_release(request_id,
        "withdrawn")`` follows from the server thread. Returns whether it was pending."""
        return self._offers.withdraw(request_id)

    def pending(self) -> list[str]:
        """Request ids offered and not yet released, expired or withdrawn (offer order)."""
        return self._offers.pending()

    def close(self) -> None:
        """Stop serving; every pending offer gets ``on_release(id, "closed")``. Idempotent."""
        if not self._offers.close():
            return
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
            close_fields(self._fields)

    def __enter__(self) -> KVSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- server thread --
    def _notify(self, request_id: str, reason: str) -> None:
        try:
            self._on_release(request_id, reason)
        except Exception:
            logger.exception("KVSource: on_release(%r, %r) raised", request_id, reason)

    def _bind(self, host: str, port: int) -> tuple[zmq.Context, zmq.Socket] | None:
        """The bound ROUTER (and its context); ``None`` after recording why the bind failed."""
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
            return None
        return ctx, sock

    def _serve(self, host: str, port: int) -> None:
        bound = self._bind(host, port)
        self._ready.set()
        if bound is None:
            return
        ctx, sock = bound
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
                for rid in self._offers.expire():
                    self._notify(rid, "expired")
                self._run_withdrawn()
        except Exception:
            logger.exception("KVSource %s: server loop failed", self.address)
        finally:
            sock.close(0)
            ctx.term()
            self._close_offers()

    def _close_offers(self) -> None:
        """The server stopped: every offer left ends ``"closed"``."""
        left = self._offers.end_all()
        self._run_withdrawn()
        for rid in left:
            self._notify(rid, "closed")

    def _run_withdrawn(self) -> None:
        for rid in self._offers.take_withdrawn():
            self._notify(rid, "withdrawn")

    def _handle(self, sock: zmq.Socket, msg: list[bytes]) -> None:
        identity, frames = msg[0], msg[1:]
        released = None
        try:
            reply, data = self._answer(frames)
            if reply.pop("_released", False):
                released = reply.pop("_request_id")
        except Exception as exc:  # a bad message must not stop the server
            reply, data = error_reply(f"internal error: {type(exc).__name__}: {exc}")
        try:
            parts: list[Any] = [identity, json.dumps(reply).encode(), *data]
            sock.send_multipart(parts, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:  # the peer's queue is full or it went away
            logger.warning("KVSource %s: reply dropped: %s", self.address, exc)
        if released is not None:
            self._notify(released, "released")

    def _answer(self, frames: list[bytes]) -> Reply:
        """The reply to one control message (header, data frames)."""
        if len(frames) != 1:
            return self._refused(f"expected one JSON frame, got {len(frames)}")
        try:
            req = json.loads(frames[0])
        except (ValueError, UnicodeDecodeError) as exc:
            return self._refused(f"malformed JSON: {exc}")
        if not isinstance(req, dict):
            return self._refused(f"expected a JSON object, got {type(req).__name__}")
        op, rid, token = req.get("op"), req.get("request_id"), req.get("token")
        if op not in _OPS:
            return self._refused(f"unknown op {op!r} (expected one of {', '.join(_OPS)})")
        if not isinstance(rid, str) or not isinstance(token, str):
            return self._refused("`request_id` and `token` must be str")
        first = req.get("first", 0)
        if (
            isinstance(first, bool)
            or not isinstance(first, int)
            or first < 0
            or (first and op not in BLOCK_OPS)
        ):
            return self._refused(
                f"`first` must be an int >= 0, on a fetch or digest only, got {first!r:.40}"
            )
        if self._key is not None and not same_secret(
            req.get("mac"), control_mac(self._key, op, rid, token, first)
        ):
            return self._refused(_NOT_AUTHORIZED)
        if op == "digest" and self._key is None:
            return error_reply("this source has no splitwise secret: it tags no blocks")
        reply = self._offers.answer(op, rid, token, first, self._fetch)
        if reply is None:
            return self._refused(_NOT_AUTHORIZED)
        return reply if self._key is None else _signed(self._key, reply, op, rid, token, first)

    def _fetch(self, block_ids: np.ndarray) -> Reply:
        """The answer to a fetch of ``block_ids`` (int64 ``[n]``): their bytes."""
        return fetch_reply(self._caches, self.layout, block_ids)

    def _refused(self, text: str) -> Reply:
        """A request from a peer that proved nothing (counted as dropped; nothing changes)."""
        self.dropped.add("kv")
        return error_reply(text)


def _signed(key: bytes, reply: Reply, op: str, rid: str, token: str, first: int) -> Reply:
    """``reply`` to an authenticated request with its MACs (:mod:`.kv_mac`): the tags of its
    data frames in the header (a digest answer keeps only those), the header's ``mac``.
    Keys starting with ``_`` stay on this side (:meth:`KVSource._handle` takes them out)."""
    header, data = reply
    if header.get("ok") is not True:
        return reply
    if data:
        header["tags"] = frame_tags(key, rid, token, first, data, len(data))
    public = {k: v for k, v in header.items() if not k.startswith("_")}
    header["mac"] = answer_mac(key, op, rid, token, first, public)
    return header, [] if op == "digest" else data


def _host_of(address: str) -> str:
    """The host of ``tcp://host:port`` (brackets of an IPv6 literal removed)."""
    host = address.split("://", 1)[-1].rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host
