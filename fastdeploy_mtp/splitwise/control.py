"""The control protocol between a decode instance ("D") and the KV source of a prefill
instance ("P"): the requests D sends, what P answers, how a request is signed.

In splitwise serving P computes a prompt's KV caches, for every target layer and every MTP
layer, and hands the request to D, which copies the request's blocks into its own caches
(:mod:`.kv_layout` says how caches are given) and decodes from there (pull model). P's engine
process runs one :class:`~.kv_source.KVSource`; it offers a request's blocks, which stay
reserved on P until D says it copied them (or a hold timeout passes), and gets the
descriptor D needs (:mod:`.descriptor`). D's engine process calls
:func:`~.kv_client.pull_blocks` with that descriptor and the name of a transport
(:mod:`.transport`).

The descriptor's ``token`` is the offer's transfer token: 32 random bytes (URL-safe base64)
drawn by P for this offer alone. It is the capability to fetch, check or release the offer:
only the holder of the hand-over has it, so no other peer can read, release or redirect a
request's KV even if it guesses the request id.

P binds a ZeroMQ ROUTER socket at the descriptor's ``address``; D connects a DEALER socket
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
* ``{"op": "digest"}`` (may carry ``"first"`` as a fetch does): the header of a fetch's
  answer without the data frames, with their ``"tags"``; only a source with a secret answers
  it. A transport that read the blocks straight from P's memory over a network
  (``"mooncake"``) asks it after the read to check its copy; P computes it while D hashes
  its copy. ``"shm"`` does not: P's caches are files only the deployment's user can open.
* ``{"op": "release"}``: P drops the offer and calls its ``on_release`` with ``"released"``;
  answers ``{"ok": true}``. The token is spent.

With a secret every ``ok`` answer carries ``"mac"`` and every block frame a tag, made with the
same KV key (:mod:`.kv_mac`): the answer's mac covers its direction, op, request id, token,
``first`` and whole header; a fetch (and digest) answer's header carries ``"tags"``, one per
data frame, each binding the frame's bytes to the offer and its position. D refuses an
answer or frame whose MAC does not hold before it uses anything in it (counted as dropped,
channel ``"kv"``), so whoever answers on P's address without the key (a process bound to the
port after P exited, a man in the middle) cannot feed D a byte of KV.

Any failure (an unknown, expired, withdrawn or already released request, an unknown op,
malformed JSON, a message of more than one frame) is answered ``{"ok": false, "error":
"<what went wrong>"}``; a bad message never stops P's server thread.

The transports that read P's memory directly (``"shm"``, ``"mooncake"``) read it between
D's ``check`` and its ``release``: P holds the offer's blocks for that whole time, so they
cannot be reused under the read unless the hold timeout passes first, which the release
then reports (:func:`release_after_direct_read`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import zmq

from .kv_layout import TransferError

__all__ = ["BLOCK_OPS", "ControlChannel", "control_mac", "release_after_direct_read"]

#: The ops whose request may carry ``first`` and whose answer covers ``block_ids[first:]``.
BLOCK_OPS = ("fetch", "digest")


class ControlChannel(Protocol):
    """D's connection to the source of one request (:class:`~.kv_client._Peer`)."""

    address: str
    request_id: str

    def ask(self, op: str, timeout: float) -> tuple[dict[str, Any], list[zmq.Frame]]:
        """Send ``op``; the reply header (``ok`` checked, else :class:`TransferError`; with a
        key its ``mac``, else :class:`~.kv_mac.Refused`) and its data frames."""
        ...

    def check_frames(self, header: dict[str, Any], frames: list[Any], labels: list[str]) -> None:
        """Refuse (:class:`~.kv_mac.Refused`) the data ``frames`` of a fetch answer (one per
        label) unless each matches its tag in ``header``; nothing without a key."""
        ...

    def check_copy(
        self, frames: Iterable[Any], labels: list[str], timeout: float, how: str
    ) -> None:
        """Refuse (:class:`~.kv_mac.Refused`) D's copy of the offer's blocks read over ``how``
        (``frames``: one per label, the C-order bytes of one cache's blocks of one rank) unless
        each matches the tag P's ``digest`` answer gives; nothing without a key."""
        ...

    def release(self, timeout: float) -> bool:
        """Release the offer; False if the source did not answer in time. A refusal raises."""
        ...


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


def control_mac(
    key: bytes | None, op: str, request_id: str, token: str, first: int = 0
) -> str | None:
    """The ``mac`` of a control request (module docstring); ``None`` without a key.
    ``first``: a fetch's first block (covered by the mac when not 0)."""
    if key is None:
        return None
    from ..credentials import sign

    return sign(key, [op, request_id, token, *([first] if first else [])])
