"""A response's text and logprobs as its tokens arrive: the ``"tokens"`` events of a
:class:`~fastdeploy_mtp.serving.engine_client.engine_loop.Stream` (:class:`Emitted`) and their
decoding (:class:`TextTracker`)."""

from __future__ import annotations

from typing import Any, NamedTuple

from ...runtime.request import Request
from ...runtime.sampling_params import StepDrafts, TokenLogprob
from ...tokenization import IncrementalDetokenizer, Tokenizer


class Emitted(NamedTuple):
    """A ``"tokens"`` event's value: new token ids and, when the request asked for logprobs,
    one :class:`TokenLogprob` per id (else ``None``); with ``include_draft_logprobs``, the
    :class:`StepDrafts` of the steps whose first token is among these ids (else ``None``)."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    drafts: list[StepDrafts] | None = None


def emitted_of(req: Request, tokens: list[int]) -> Emitted:
    """The ``"tokens"`` event of ``tokens``, the ids ``req`` just emitted (called right after
    their step): with their logprobs (``req.output_logprobs[emitted_count - len(tokens) :
    emitted_count]``) when the request asked, and the draft logprobs of the steps that
    started among them (a step whose tokens were all cut off by a stop string has none to
    go with)."""
    if req.sampling.logprobs is None:
        return Emitted(list(tokens))
    end = req.emitted_count
    start = end - len(tokens)
    logprobs = list(req.output_logprobs[start:end]) if tokens else []
    if not req.sampling.include_draft_logprobs:
        return Emitted(list(tokens), logprobs)
    drafts = [step for step in req.output_draft_logprobs if start <= step.position < end]
    return Emitted(list(tokens), logprobs, drafts)


class TextTracker:
    """A response's text, decoded incrementally by the model's tokenizer (an
    :class:`~fastdeploy_mtp.tokenization.IncrementalDetokenizer`: a character split across
    tokens waits for its last token; special tokens and padding ids have no text), and the
    OpenAI logprobs of its tokens.

    A token's string is the token decoded alone (``Tokenizer.token_string``: U+FFFD for part
    of a character), its ``bytes`` the bytes it stands for (``Tokenizer.token_bytes``); its
    ``text_offset`` is the number of characters of response text returned before it."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self.length = 0  # characters of text returned so far

    def feed(self, ids: list[int], final: bool = False) -> str:
        """The text ``ids`` complete (a partial character waits for the next ids; ``final``
        releases it)."""
        text = self._detokenizer.add(ids)
        if final:
            text += self._detokenizer.finish()
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
        return self.tokenizer.token_string(token_id)

    def token_bytes(self, token_id: int) -> list[int]:
        return self.tokenizer.token_bytes(token_id)

    def completion_logprobs(self, entries: list[tuple[int, TokenLogprob]]) -> dict[str, Any]:
        """Completions' ``choices[0].logprobs``: ``tokens``, ``token_logprobs``,
        ``top_logprobs`` (``{token: logprob}`` of the ``k`` most likely) and ``text_offset``."""
        return {
            "tokens": [self.token(lp.token_id) for _, lp in entries],
            "token_logprobs": [lp.logprob for _, lp in entries],
            "top_logprobs": [{self.token(t): v for t, v in lp.top} for _, lp in entries],
            "text_offset": [offset for offset, _ in entries],
        }

    def draft_logprobs(self, steps: list[StepDrafts]) -> list[dict[str, Any]]:
        """The ``draft_logprobs`` of a choice (both endpoints): per step that verified MTP
        drafts, ``{"position", "drafts": [{"token", "token_id", "logprob"}]}`` (see
        :class:`StepDrafts`)."""
        return [
            {
                "position": step.position,
                "drafts": [
                    {
                        "token": self.token(lp.token_id),
                        "token_id": lp.token_id,
                        "logprob": lp.logprob,
                    }
                    for lp in step.drafts
                ],
            }
            for step in steps
        ]

    def chat_logprobs(self, entries: list[tuple[int, TokenLogprob]]) -> dict[str, Any]:
        """Chat's ``choices[0].logprobs``: ``{"content": [{"token", "logprob", "bytes",
        "top_logprobs": [{"token", "logprob", "bytes"}]}]}``."""

        def one(token_id: int, logprob: float) -> dict[str, Any]:
            return {
                "token": self.token(token_id),
                "logprob": logprob,
                "bytes": self.token_bytes(token_id),
            }

        return {
            "content": [
                {**one(lp.token_id, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}
                for _, lp in entries
            ]
        }
