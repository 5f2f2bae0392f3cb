"""What ``serve`` and the router count as requests end, and the KV transfers of a decode
instance (the collectors read them at scrape time)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class RequestCounters:
    """How requests ended: finished (stop or length), failed, or abandoned by their client."""

    success: int = 0
    failure: int = 0
    cancelled: int = 0


@dataclass
class ServerCounters(RequestCounters):
    """Request-level counters the API server keeps (under :attr:`lock`)."""

    prompt_tokens: int = 0
    #: KV transfers of a decode instance, per transport name
    kv: dict[str, TransferCounts] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count_transfer(self, transport: str, nbytes: int | None, seconds: float) -> None:
        """One KV transfer over ``transport`` ended after ``seconds``: ``nbytes`` moved, or
        ``None`` when it failed. Takes :attr:`lock`."""
        with self.lock:
            counts = self.kv.setdefault(transport, TransferCounts())
            if nbytes is None:
                counts.failures += 1
            else:
                counts.transfers += 1
                counts.bytes += nbytes
            counts.seconds += seconds


@dataclass
class TransferCounts:
    """KV transfers over one transport."""

    transfers: int = 0
    bytes: int = 0
    seconds: float = 0.0
    failures: int = 0


@dataclass
class RouterCounters(RequestCounters):
    """What the router counts (read and written on the event loop only): besides how the
    requests it routed ended, how many it routed and how often a full decode instance made
    one wait."""

    routed: int = 0
    decode_retries: int = 0
