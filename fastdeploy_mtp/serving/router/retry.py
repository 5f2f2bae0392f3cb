"""How the router waits for a full decode instance: a 429 is :class:`DecodeBusy`, retried
(tenacity) after a backoff that a ``Retry-After`` shortens (:func:`decode_retry_wait`)."""

from __future__ import annotations

from typing import Any

import httpx
from tenacity import RetryCallState, wait_exponential

#: First wait after a 429 without ``Retry-After`` (doubled each retry), and the cap on any wait.
FIRST_RETRY_WAIT_S = 0.05
MAX_RETRY_WAIT_S = 1.0


class DecodeBusy(Exception):
    """A decode instance answered 429 (full); ``retry_after``: its ``Retry-After``, if any."""

    def __init__(self, url: str, retry_after: float | None):
        super().__init__(f"decode instance {url} is full")
        self.url, self.retry_after = url, retry_after


def retry_after_of(response: httpx.Response) -> float | None:
    """A 429's ``Retry-After`` in seconds (``None``: absent or not a number)."""
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


#: The wait before retry ``n`` (1, 2, ...) of a full decode instance, before its
#: ``Retry-After``: :data:`FIRST_RETRY_WAIT_S` doubled each retry, at most :data:`MAX_RETRY_WAIT_S`.
_backoff = wait_exponential(multiplier=FIRST_RETRY_WAIT_S, exp_base=2, max=MAX_RETRY_WAIT_S)


def decode_retry_wait(queue_timeout: float) -> Any:
    """tenacity's ``wait`` of the decode retries: the backoff, never longer than the
    instance's ``Retry-After`` (whole seconds, so only an upper bound: a slot usually frees
    within a few steps), :data:`MAX_RETRY_WAIT_S` or what is left of ``queue_timeout``."""

    def wait(state: RetryCallState) -> float:
        seconds = _backoff(state)
        assert state.outcome is not None
        busy = state.outcome.exception()
        if isinstance(busy, DecodeBusy) and busy.retry_after is not None:
            seconds = min(seconds, busy.retry_after)
        left = queue_timeout - (state.seconds_since_start or 0.0)
        return max(0.0, min(seconds, MAX_RETRY_WAIT_S, left))

    return wait
