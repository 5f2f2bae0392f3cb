"""A response's text and logprobs as its tokens arrive: the ``"tokens"`` events of a
:class:`~.engine_client.Stream` (:class:`Emitted`) and their decoding (:class:`TextTracker`)."""

from __future__ import annotations

import codecs
from typing import Any, NamedTuple

from ..runtime.request import Request
from ..runtime.sampling_params import TokenLogprob


class Emitted(NamedTuple):
    """A ``"tokens"`` event's value: new token ids and, when the request asked for logprobs,
    one :class:`TokenLogprob` per id (else ``None``)."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None


def emitted_of(req: Request, tokens: list[int]) -> Emitted:
    """The ``"tokens"`` event of ``tokens``, the ids ``req`` just emitted (called right after
    their step): with their logprobs (``req.output_logprobs[emitted_count - len(tokens) :
    emitted_count]``) when the request asked."""
    if req.sampling.logprobs is None:
        return Emitted(list(tokens))
    end = req.emitted_count
    return Emitted(list(tokens), list(req.output_logprobs[end - len(tokens) : end]) if tokens else [])


class TextTracker:
    """A response's text, decoded incrementally from its byte-level token ids (ids ``>=
    ori_vocab_size``, padding, are left out), and the OpenAI logprobs of its tokens.

    A token's string is its byte decoded alone (``errors="replace"``: a byte of a multi-byte
    character is U+FFFD), its ``bytes`` the byte itself; its ``text_offset`` is the length of
    the response text decoded before it."""

    def __init__(self, ori_vocab_size: int):
        self.ori_vocab_size = ori_vocab_size
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.length = 0  # characters of text returned so far

    def feed(self, ids: list[int], final: bool = False) -> str:
        """The text ``ids`` complete (a partial UTF-8 character waits for the next ids;
        ``final`` flushes it)."""
        text = self._decoder.decode(bytes(t for t in ids if t < self.ori_vocab_size), final=final)
        self.length += len(text)
        return text

    def feed_event(self, event: Emitted) -> tuple[str, list[tuple[int, TokenLogprob]] | None]:
        """(text, ``[(text_offset, logprob)]`` per token or ``None`` without logprobs)."""
        if event.logprobs is None:
            return self.feed(event.token_ids), None
        text, entries = "", []
        for lp in event.logprobs:
            entries.append((self.length, lp))
            text += self.feed([lp.token_id])
        return text, entries

    def token(self, token_id: int) -> str:
        return bytes([token_id]).decode("utf-8", errors="replace") if token_id < self.ori_vocab_size else ""

    def token_bytes(self, token_id: int) -> list[int]:
        return [int(token_id)] if token_id < self.ori_vocab_size else []

    def completion_logprobs(self, entries: list[tuple[int, TokenLogprob]]) -> dict[str, Any]:
        """Completions' ``choices[0].logprobs``: ``tokens``, ``token_logprobs``,
        ``top_logprobs`` (``{token: logprob}`` of the ``k`` most likely) and ``text_offset``."""
        return {
            "tokens": [self.token(lp.token_id) for _, lp in entries],
            "token_logprobs": [lp.logprob for _, lp in entries],
            "top_logprobs": [{self.token(t): v for t, v in lp.top} for _, lp in entries],
            "text_offset": [offset for offset, _ in entries],
        }

    def chat_logprobs(self, entries: list[tuple[int, TokenLogprob]]) -> dict[str, Any]:
        """Chat's ``choices[0].logprobs``: ``{"content": [{"token", "logprob", "bytes",
        "top_logprobs": [{"token", "logprob", "bytes"}]}]}``."""

        def one(token_id: int, logprob: float) -> dict[str, Any]:
            return {"token": self.token(token_id), "logprob": logprob, "bytes": self.token_bytes(token_id)}

        return {
            "content": [
                {**one(lp.token_id, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]} for _, lp in entries
            ]
        }
