"""The offers a prefill instance's KV source holds: per request its reserved blocks, transfer
token and deadline, why each finished offer ended (for the error messages), and the answer
to a control request about one of them (:mod:`.control`).

:class:`Offers` is shared by the engine thread (offer, withdraw, close) and the source's
server thread (answers, expiry); every method takes its lock. It calls nothing back: the
source runs ``on_release`` for the request ids these methods hand it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..credentials import strings_equal
from .kv_layout import TransferError

__all__ = ["Offers", "Reply", "error_reply", "same_secret"]

#: How many finished offers are remembered for the error messages.
_FINISHED_MEMORY = 4096

#: One answer of the source: the header and the data frames.
Reply = tuple[dict[str, Any], list[np.ndarray]]


@dataclass
class _Offer:
    block_ids: np.ndarray  # int64 [n]
    deadline: float  # time.monotonic()
    token: str  # the transfer token (see .control)
    descriptor: dict[str, Any]  # what `check` answers: the descriptor without its token
    fetched: bool = False


class Offers:
    """The pending offers of one source, each held for ``hold_timeout`` seconds at most."""

    def __init__(self, hold_timeout: float):
        self.hold_timeout = hold_timeout
        self._lock = threading.Lock()
        self._offers: dict[str, _Offer] = {}
        self._finished: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._withdrawn: list[str] = []  # released by withdraw(), callback still to run
        self._closed = False

    def add(
        self, request_id: str, block_ids: list[int], token: str, descriptor: dict[str, Any]
    ) -> None:
        """Hold ``block_ids`` for ``request_id`` under ``token``; ``descriptor`` is what its
        ``check`` answers (the offer's descriptor without its token). Refuses a request
        already pending, or any once closed."""
        where = f"KVSource.offer({request_id!r})"
        with self._lock:
            if self._closed:
                raise TransferError(f"{where}: the source at {descriptor['address']} is closed")
            if request_id in self._offers:
                raise TransferError(
                    f"{where}: request {request_id!r} is already offered and not yet released"
                )
            self._offers[request_id] = _Offer(
                np.asarray(block_ids, np.int64),
                time.monotonic() + self.hold_timeout,
                token,
                descriptor,
            )
            self._finished.pop(request_id, None)

    def withdraw(self, request_id: str) -> bool:
        """Drop a pending offer (its callback is handed out by :meth:`take_withdrawn`);
        whether it was pending."""
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

    def close(self) -> bool:
        """Take no more offers; False if already closed."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        return True

    def end_all(self) -> list[str]:
        """The server stopped: close, and end every offer left as ``"closed"`` (returned)."""
        with self._lock:
            self._closed = True
            left = list(self._offers)
            self._offers.clear()
            for rid in left:
                self._remember(rid, "closed")
        return left

    def expire(self) -> list[str]:
        """End the offers whose deadline passed as ``"expired"``; their request ids."""
        now = time.monotonic()
        with self._lock:
            gone = [rid for rid, o in self._offers.items() if o.deadline <= now]
            for rid in gone:
                del self._offers[rid]
                self._remember(rid, "expired")
        return gone

    def take_withdrawn(self) -> list[str]:
        """The offers withdrawn since the last call."""
        with self._lock:
            todo, self._withdrawn = self._withdrawn, []
        return todo

    def answer(
        self, op: str, rid: str, token: str, first: int, fetch: Callable[[np.ndarray], Reply]
    ) -> Reply | None:
        """The answer to an authenticated ``check``, ``fetch``, ``digest`` or ``release`` of
        ``rid`` (:mod:`.control`); ``None`` when ``token`` is not the offer's.
        ``fetch(block_ids)`` reads the blocks (for a fetch, once per offer, or a digest),
        under the lock: a :meth:`withdraw` that returned sees no later reads. A release
        answers ``"_released": True`` and ``"_request_id"`` besides."""
        with self._lock:
            offer = self._offers.get(rid)
            if offer is not None and not same_secret(token, offer.token):
                return None
            if offer is None or offer.deadline <= time.monotonic():
                # the server's expire() ends it and tells on_release
                return error_reply(self._gone_reason(rid, expired=offer is not None))
            if op == "check":
                reply = {"ok": True, "num_blocks": len(offer.block_ids), "offer": offer.descriptor}
                return reply, []
            if op == "release":
                del self._offers[rid]
                self._remember(rid, "released")
                return {"ok": True, "_released": True, "_request_id": rid}, []
            if op == "fetch" and offer.fetched:
                return error_reply(
                    f"request {rid!r} was already fetched (an offer is fetched once)"
                )
            if first >= len(offer.block_ids):
                return error_reply(
                    f"`first` {first} leaves none of the {len(offer.block_ids)} offered blocks "
                    "to send"
                )
            offer.fetched = offer.fetched or op == "fetch"
            return fetch(offer.block_ids[first:])

    def _remember(self, request_id: str, reason: str) -> None:
        """Record why an offer ended (for error messages); the caller holds the lock."""
        self._finished[request_id] = reason
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def _gone_reason(self, request_id: str, expired: bool) -> str:
        """Why ``request_id`` is not served; ``expired``: its deadline passed (before
        :meth:`expire` saw it)."""
        reason = "expired" if expired else self._finished.get(request_id)
        if reason == "expired":
            return (
                f"request {request_id!r} expired (not released within hold_timeout "
                f"{self.hold_timeout:g} s)"
            )
        if reason is not None:
            return f"request {request_id!r} was {reason} and its blocks freed"
        return f"unknown request {request_id!r} (never offered here)"


def same_secret(given: Any, expected: str | None) -> bool:
    """``given == expected`` for two str, in constant time."""
    return expected is not None and strings_equal(given, expected)


def error_reply(text: str) -> Reply:
    """The answer to a request that failed: ``{"ok": false, "error": text}``, no data."""
    return {"ok": False, "error": text}, []
