"""Streaming text for a growing list of token ids.

A token may hold part of a UTF-8 character (byte-level BPE, byte-fallback tokens, the byte
model's single bytes), and some decoders treat a token differently at the start of a text
(a SentencePiece word-start marker). So the new text is found by decoding a short window of
recent ids twice, with and without the newest ones, and taking the difference; while that
text ends in U+FFFD (a character still incomplete) it is held back. At the end the held-back
text is released, so the pieces put together equal ``decode(all ids)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """The text of one output as its ids arrive: :meth:`add` returns the text the new ids
    complete, :meth:`finish` what was held back. Special tokens are left out unless
    ``skip_special_tokens`` is False; ids past the tokenizer's vocabulary (a padded model
    vocabulary) have no text.

    Attributes:
        ids: every id added so far.
        text: every piece returned so far, joined.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # window start: ids before it are settled text
        self._read = 0  # ids before it are in ``text``

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _step(self, final: bool) -> str:
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or (after.endswith(_REPLACEMENT) and not final):
            return ""
        piece = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += piece
        return piece

    def add(self, ids: Sequence[int]) -> str:
        """Append ``ids``; return the text they complete (``""`` while a character is
        incomplete or the ids have no text)."""
        self.ids.extend(int(t) for t in ids)
        return self._step(final=False)

    def finish(self) -> str:
        """The text still held back (an incomplete character decodes as U+FFFD here)."""
        return self._step(final=True)
