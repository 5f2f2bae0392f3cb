"""A streamed response: every choice's events, merged as they arrive, as the chunks of
either endpoint (:func:`stream_chunks`, shaped by :class:`CompletionChunks` or
:class:`ChatChunks`), sent as server-sent events (:func:`sse`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, NamedTuple, Protocol

from sse_starlette import EventSourceResponse

from ...runtime.sampling_params import StepDrafts
from ..engine_client.backend import Stream
from .choices import Entries, Served, cancel_all, merged, usage
from .protocol import APIError
from .text import TextTracker


class Piece(NamedTuple):
    """A choice's new ``text``, with its logprob ``entries`` and ``drafts`` when the request
    asked for them."""

    text: str
    entries: Entries | None
    drafts: list[StepDrafts] | None


class ChunkShape(Protocol):
    """How one endpoint writes a choice in a streamed chunk."""

    def opening(self, i: int) -> dict[str, Any] | None:
        """Choice ``i``'s first chunk, before any text (``None``: there is none)."""
        ...

    def piece(self, tracker: TextTracker, i: int, new: Piece) -> dict[str, Any]:
        """Choice ``i``'s ``new`` text (``tracker``: its text so far)."""
        ...

    def ending(self, i: int, tail: str, reason: str) -> dict[str, Any]:
        """Choice ``i``'s last chunk: the text its detokenizer still held and its
        ``finish_reason``."""
        ...


def completion_choice(
    tracker: TextTracker,
    i: int,
    text: str,
    reason: str | None,
    entries: Entries | None,
    drafts: list[StepDrafts] | None = None,
    logprobs: bool = True,
) -> dict[str, Any]:
    """A completion choice (whole, or a streamed piece of one): its ``logprobs`` when there
    are ``entries`` and the client asked (``logprobs``), its ``draft_logprobs`` when it has
    ``drafts``."""
    shown = tracker.completion_logprobs(entries) if logprobs and entries is not None else None
    one = {"index": i, "text": text, "finish_reason": reason, "logprobs": shown}
    if drafts is not None:
        one["draft_logprobs"] = tracker.draft_logprobs(drafts)
    return one


class CompletionChunks:
    """``/v1/completions`` chunks: ``{"index", "text", "finish_reason", "logprobs"}`` per
    choice (``logprobs``: whether the client asked for them)."""

    def __init__(self, logprobs: bool):
        self.logprobs = logprobs

    def opening(self, i: int) -> dict[str, Any] | None:
        return None

    def piece(self, tracker: TextTracker, i: int, new: Piece) -> dict[str, Any]:
        return completion_choice(tracker, i, new.text, None, new.entries, new.drafts, self.logprobs)

    def ending(self, i: int, tail: str, reason: str) -> dict[str, Any]:
        return {"index": i, "text": tail, "finish_reason": reason, "logprobs": None}


class ChatChunks:
    """``/v1/chat/completions`` chunks: each choice's assistant role first, then ``delta``s
    of its content (with ``logprobs`` and ``draft_logprobs`` when asked), then its
    ``finish_reason``."""

    def opening(self, i: int) -> dict[str, Any] | None:
        return {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}

    def piece(self, tracker: TextTracker, i: int, new: Piece) -> dict[str, Any]:
        one: dict[str, Any] = {"index": i, "delta": {"content": new.text}, "finish_reason": None}
        if new.entries is not None:
            one["logprobs"] = tracker.chat_logprobs(new.entries)
        if new.drafts is not None:
            one["draft_logprobs"] = tracker.draft_logprobs(new.drafts)
        return one

    def ending(self, i: int, tail: str, reason: str) -> dict[str, Any]:
        delta = {"content": tail} if tail else {}
        return {"index": i, "delta": delta, "finish_reason": reason}


async def stream_chunks(
    served: Served,
    streams: list[Stream],
    events: list[AsyncIterator[tuple[str, Any]]],
    head: dict[str, Any],
    shape: ChunkShape,
    with_usage: bool,
    prompts: int = 1,
) -> AsyncIterator[dict[str, Any]]:
    """A streamed response's chunks (``head`` and one choice each, as ``shape`` writes it):
    every choice's opening, then the choices' text as it arrives (each chunk names its
    choice's ``index``: ``streams[i]``'s is ``i``), then each choice's ending; ``with_usage``,
    a last chunk with the usage of all of them (``streams`` are those of ``prompts`` prompts,
    as many for each: :func:`~.choices.usage`). If it stops early (the client went away, or
    one choice failed), every stream's request is cancelled."""
    trackers = [served.tracker() for _ in events]
    for i in range(len(events)):
        opening = shape.opening(i)
        if opening is not None:
            yield {**head, "choices": [opening]}
    complete = False
    try:
        async for i, (kind, value) in merged(events):
            if kind == "tokens":
                text, entries = trackers[i].feed_event(value)
                if text or entries:
                    one = shape.piece(trackers[i], i, Piece(text, entries, value.drafts))
                    yield {**head, "choices": [one]}
            else:
                yield {**head, "choices": [shape.ending(i, trackers[i].feed([], True), value)]}
        complete = True
    finally:
        if not complete:
            cancel_all(served, streams)
    if with_usage:
        requests = [stream.request for stream in streams]
        yield {**head, "choices": [], "usage": usage(requests, prompts)}


def sse(chunks: AsyncIterator[dict[str, Any]]) -> EventSourceResponse:
    """``chunks`` as server-sent events: ``data: <json>`` each, then ``data: [DONE]``; an
    :class:`APIError` once the response started ends the stream with ``data: {"error": ...}``
    instead. The framing is what the hand-written version sent: ``\\n`` separators (not
    sse-starlette's default ``\\r\\n``), ``Cache-Control: no-cache``, and no keep-alive
    ping comments (``ping=0``), so a long stream carries nothing but its events."""

    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield json.dumps(chunk)
        except APIError as exc:  # the response has started: report it in the stream
            yield json.dumps(
                {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}}
            )
            return
        yield "[DONE]"

    return EventSourceResponse(events(), headers={"Cache-Control": "no-cache"}, ping=0, sep="\n")
