"""The decode side of the KV transfer: :func:`pull_blocks` copies the blocks a prefill
instance offered into this instance's caches over a transport (:mod:`.transports`), talking
to P's :class:`~.kv_source.KVSource` through a :class:`_Peer` (protocol in :mod:`.control`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import zmq

from ..credentials import DroppedMessages, derive, strings_equal
from .control import BLOCK_OPS, control_mac
from .descriptor import Descriptor, differing_field
from .kv_layout import Caches, KVLayout, TransferError, block_id_list, check_caches, positive_number
from .kv_mac import Refused, check_answer, check_tags, frame_tags
from .transport import PullJob, get_transport, read_descriptor

__all__ = ["pull_blocks"]

logger = logging.getLogger(__name__)

_RELEASE_TIMEOUT = 5.0  # at most this long (and at most the pull's timeout) for the release reply


class _NoAnswer(TransferError):
    """The source did not answer in time."""


class _Peer:
    """A DEALER connected to a source, with bounded request/reply (a
    :class:`~.control.ControlChannel`).

    There is no retry: a request that gets no answer within its timeout fails the pull, and
    the decode instance aborts the request (``docs/architecture.md``, "Faults and
    back-pressure"); resending would only double the wait on a dead prefill instance."""

    def __init__(
        self, address: str, request_id: str, token: str, key: bytes | None, first: int = 0
    ):
        self.address = address
        #: offered blocks D already holds: a fetch asks for ``block_ids[first:]``
        self.first = first
        self.request_id = request_id
        self.token = token
        self.key = key
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def ask(self, op: str, timeout: float) -> tuple[dict[str, Any], list[zmq.Frame]]:
        """Send ``op``; the reply header (``ok`` checked, and with a key its ``mac``) and its
        data frames (not yet checked against their tags: :meth:`check_frames`)."""
        deadline = time.monotonic() + timeout
        self._send(op, timeout)
        return self._receive(op, deadline, timeout)

    def _first(self, op: str) -> int:
        return self.first if op in BLOCK_OPS else 0

    def _send(self, op: str, timeout: float) -> None:
        first = self._first(op)
        mac = control_mac(self.key, op, self.request_id, self.token, first)
        body: dict[str, Any] = {
            "op": op,
            "request_id": self.request_id,
            "token": self.token,
            "mac": mac,
        }
        if first:
            body["first"] = first
        if not self.sock.poll(max(1, int(timeout * 1000)), zmq.POLLOUT):
            raise self._timeout(op, timeout)
        self.sock.send(json.dumps(body).encode(), zmq.NOBLOCK)

    def _receive(
        self, op: str, deadline: float, timeout: float
    ) -> tuple[dict[str, Any], list[zmq.Frame]]:
        left = deadline - time.monotonic()
        if left <= 0 or not self.sock.poll(max(1, int(left * 1000)), zmq.POLLIN):
            raise self._timeout(op, timeout)
        frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
        try:
            header = json.loads(frames[0].bytes)
        except (ValueError, UnicodeDecodeError) as exc:
            raise TransferError(
                f"pull_blocks({self.request_id!r}): {op} reply from {self.address} is not "
                f"JSON: {exc}"
            ) from None
        if not isinstance(header, dict) or header.get("ok") is not True:
            error = header.get("error") if isinstance(header, dict) else header
            raise TransferError(
                f"pull_blocks({self.request_id!r}): prefill source {self.address} refused "
                f"{op}: {error}"
            )
        if self.key is not None:
            problem = check_answer(
                self.key, op, self.request_id, self.token, self._first(op), header
            )
            if problem is not None:
                raise Refused(
                    f"pull_blocks({self.request_id!r}): refused the {op} answer from "
                    f"{self.address}: {problem} (not the prefill instance that made this "
                    "offer, or changed on the way)"
                )
        return header, frames[1:]

    def check_frames(self, header: dict[str, Any], frames: list[Any], labels: list[str]) -> None:
        """Refuse (:class:`~.kv_mac.Refused`) ``frames``, the data of the fetch answer
        ``header`` (one per label), unless each matches its tag; nothing without a key."""
        if self.key is None:
            return
        where = f"pull_blocks({self.request_id!r}): fetch answer from {self.address}"
        if len(frames) != len(labels):
            raise Refused(f"{where}: {len(frames)} data frames, expected {len(labels)}")
        theirs = check_tags(header, len(labels), where)
        self._compare(theirs, self._tags(frames, self.key, len(labels)), labels, "sent")

    def check_copy(
        self, frames: Iterable[Any], labels: list[str], timeout: float, how: str
    ) -> None:
        """Refuse (:class:`~.kv_mac.Refused`) this instance's copy of the offer's blocks,
        ``frames`` (one per label, each the C-order bytes of the blocks of one cache of one
        rank), read over ``how`` straight from P's memory, unless each matches the tag P gives
        of its own blocks (``digest``); nothing without a key. P hashes while this side
        does."""
        if self.key is None:
            return
        self._send("digest", timeout)
        mine = self._tags(frames, self.key, len(labels))
        header, _ = self._receive("digest", time.monotonic() + timeout, timeout)
        where = f"pull_blocks({self.request_id!r}): digest answer from {self.address}"
        theirs = check_tags(header, len(labels), where)
        self._compare(theirs, mine, labels, f"read over {how}")

    def _tags(self, frames: Iterable[Any], key: bytes, count: int) -> list[str]:
        """The tags of ``frames`` (:func:`~.kv_mac.frame_tags`), frame ``i`` of ``count``."""
        return frame_tags(key, self.request_id, self.token, self.first, frames, count)

    def _compare(self, theirs: list[str], mine: list[str], labels: list[str], how: str) -> None:
        """Refuse the first frame whose tag here (``mine``) is not P's (``theirs``)."""
        for i, (tag, ours, label) in enumerate(zip(theirs, mine, labels)):
            if not strings_equal(tag, ours):
                raise Refused(
                    f"pull_blocks({self.request_id!r}): the blocks of {label} {how} from "
                    f"{self.address} do not match the prefill instance's tag (frame {i} of "
                    f"{len(theirs)}: changed, replayed from another request or position, or "
                    "truncated)"
                )

    def _timeout(self, op: str, timeout: float) -> TransferError:
        return _NoAnswer(
            f"pull_blocks({self.request_id!r}): prefill source {self.address} did not answer "
            f"{op} within {timeout:g} s (dead or hung prefill instance?)"
        )

    def release(self, timeout: float) -> bool:
        """Release the offer, waiting at most ``min(timeout, 5 s)`` for the answer; False if
        the source did not answer in time (a dead source after a complete copy is not an
        error). A refusal raises :class:`TransferError`."""
        try:
            self.ask("release", min(timeout, _RELEASE_TIMEOUT))
        except _NoAnswer as exc:
            logger.warning("%s", exc)
            return False
        return True

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def pull_blocks(
    descriptor: dict[str, Any],
    caches: Caches,
    layout: KVLayout,
    dst_block_ids: Sequence[int],
    transport: str = "tcp",
    timeout: float = 30.0,
    secret: bytes | None = None,
    skip: int = 0,
    dropped: DroppedMessages | None = None,
) -> int:
    """Copy the blocks a prefill instance offered into this (decode) instance's caches, then
    tell the source to release them.

    The ``j``-th offered block of cache ``c`` on rank ``r`` lands in
    ``caches[r][c][dst_block_ids[j]]``; extra ``dst_block_ids`` are ignored, other blocks are
    untouched. Everything is checked before a byte is written: the descriptor's keys and
    types, ``layout`` against the prefill's (:meth:`KVLayout.check_matches`), the block ids on
    both sides, the descriptor against the offer the source holds (its ``check`` answer: a
    hand-over whose block ids, layout or transport fields differ from what P offered is
    refused, and the blocks read are the offer's), and (``"tcp"``) the count and exact size of
    every received frame. With ``secret`` every answer and block must carry its MAC
    (:mod:`.kv_mac`; a ``"mooncake"`` copy is checked after the read, before the release).

    Args:
        descriptor: what :meth:`~.kv_source.KVSource.offer` returned (after a JSON round trip
            or not).
        caches: per rank, this instance's writable cache arrays, one per entry of
            ``layout.caches`` (every target and every MTP layer's), each
            ``[num_blocks, *block_shape]``.
        layout: the layout of ``caches``.
        dst_block_ids: distinct block ids in ``caches``, at least one per offered block.
        transport: a registered transport (:func:`~.transport.transport_names`): ``"tcp"``
            (the bytes come over the socket), ``"shm"`` (same host: P's published caches are
            attached by the descriptor's ``shm_names``, copied from and detached; needs
            ``shm_names``) or ``"mooncake"`` (the Mooncake transfer engine reads the blocks
            from P's registered caches into ``caches``, which it registers on first use; needs
            the descriptor's ``mooncake``). :func:`~.transport.choose_transport` resolves
            ``"auto"``.
        timeout: seconds the source may take to answer each request.
        secret: the splitwise secret the source was given (it signs the control requests and
            checks the answers); ``None`` for a source without one.
        skip: the first ``skip`` offered blocks are already in ``dst_block_ids[:skip]`` (this
            instance's prefix cache holds them): only the blocks after them are read or sent.
        dropped: counts each refused answer or block (channel ``"kv"``).

    Returns:
        Bytes copied (``tp * (len(block_ids) - skip) * layout.block_nbytes``: every cache of
        every rank).

    Raises:
        TransferError: a bad argument or descriptor field (named), a layout mismatch, a source
            that does not answer within ``timeout`` (names its address and the timeout), or a
            request the source no longer holds (unknown, expired, withdrawn, released). Nothing
            was written then, except when the source drops the offer during an ``"shm"`` copy
            (the copied blocks may be torn; the error says so).
        Refused: (a :class:`TransferError`, counted in ``dropped``) a MAC that does not hold.
    """
    checked = read_descriptor(descriptor)
    where = checked.where
    dst_idx = _destination(checked, caches, layout, dst_block_ids)
    mover = get_transport(transport, where)
    mover.check_pullable(checked, where)
    seconds = positive_number(timeout, "timeout", where, "a positive number of seconds")
    n = len(checked.block_ids)
    _check_skip(skip, n, where)
    key = None if secret is None else derive(secret, "kv")
    peer = _Peer(checked.address, checked.request_id, checked.token, key, skip)
    try:
        offered = _offer_of(peer, checked, seconds)
        # the tail only: every transport reads or is sent `offered.block_ids` alone
        offered = dataclasses.replace(offered, block_ids=offered.block_ids[skip:])
        mover.pull(PullJob(peer, offered, caches, dst_idx[skip:], seconds))
    except Refused:
        if dropped is not None:
            dropped.add("kv")
        raise
    finally:
        peer.close()
    return layout.tensor_parallel_size * (n - skip) * layout.block_nbytes


def _check_skip(skip: Any, n: int, where: str) -> None:
    """Refuse a ``skip`` that is not an int in ``[0, n)`` (``n``: the blocks offered)."""
    if isinstance(skip, bool) or not isinstance(skip, int) or not 0 <= skip < n:
        raise TransferError(
            f"{where}: `skip` must be an int in [0, {n}) (blocks offered: {n}), got {skip!r}"
        )


def _offer_of(peer: _Peer, handed_over: Descriptor, timeout: float) -> Descriptor:
    """What the source offered for this request (its ``check`` answer), which must be what
    the hand-over describes; the pull then reads the offer's blocks, never the hand-over's."""
    where = handed_over.where
    header, _ = peer.ask("check", timeout)
    offer = header.get("offer")
    if not isinstance(offer, dict):
        raise TransferError(f"{where}: the check answer from {peer.address} carries no offer")
    try:
        offered = read_descriptor({**offer, "token": handed_over.token})
    except TransferError as exc:
        raise TransferError(f"{where}: the offer at {peer.address} is unreadable: {exc}") from None
    field = differing_field(handed_over, offered)
    if field is not None:
        raise TransferError(
            f"{where}: the hand-over's `{field}` differs from what the prefill instance offered "
            "for this request; refusing to pull"
        )
    return Descriptor(
        offered.request_id,
        handed_over.address,
        offered.layout,
        offered.block_ids,
        offered.num_blocks,
        offered.hold_timeout,
        offered.fields,
        offered.token,
    )


def _destination(
    descriptor: Descriptor, caches: Caches, layout: KVLayout, dst_block_ids: Sequence[int]
) -> np.ndarray:
    """Check this instance's side of a pull; int64 ``[len(descriptor.block_ids)]``, the
    blocks of ``caches`` the offered ones land in."""
    where = descriptor.where
    if not isinstance(layout, KVLayout):
        raise TransferError(f"{where}: `layout` must be a KVLayout, got {type(layout).__name__}")
    descriptor.layout.check_matches(layout)
    num_blocks = check_caches(caches, layout, where, writable=True)
    dst = block_id_list(dst_block_ids, num_blocks, "dst_block_ids", where)
    n = len(descriptor.block_ids)
    if len(dst) < n:
        raise TransferError(
            f"{where}: `dst_block_ids` has {len(dst)} block(s), the prefill offered {n}"
        )
    return np.asarray(dst[:n], np.int64)
