"""``method == "suffix"``: suffix decoding on the host.

What is counted: for a token sequence, every contiguous window of at most ``D`` tokens (``D``
= ``suffix_decoding_max_tree_depth``), with how often it occurs — the depth-bounded suffix
trie of suffix decoding. The windows are not stored: a draft looks them up in the sequence
itself (:func:`suffix_draft`), a handful of numpy scans, so appending a token costs nothing
and a request that is never drafted for costs nothing either.

Drafting: the longest suffix of the request's context (prompt + output, at most ``D - 1``
tokens) that occurs with at least one continuation is the match, of length ``m``; from it the
most frequent next token (ties: the smaller token id) is drafted while the running product of
``count(window + token) / count(window followed by any token)`` stays at or above
``suffix_decoding_min_token_prob``, up to ``min(K, int(suffix_decoding_max_spec_factor * m))``
tokens and while the window stays at most ``D`` tokens long. Each request drafts from its own
sequence and, with ``suffix_decoding_max_cached_requests > 0``, from the outputs of recently
finished requests (:class:`SuffixCache`; no window spans two of them); the draft whose
probabilities sum higher wins (the request's own on a tie).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import paddle

from ..config import FDConfig
from ..constants import PLACEHOLDER_TOKEN_ID
from ..runtime.input_batch import InputBatch
from ..runtime.request import Request, RequestType
from .model_free import ModelFreeProposer

#: Between two sequences kept end to end (token ids are never negative, so no window
#: containing it matches a context, and it is never a continuation).
SEPARATOR = -1
#: Above this many occurrences the next-token counts are taken with numpy, below with a
#: Python counter (cheaper for a few).
_NUMPY_COUNT = 64


@dataclass
class Draft:
    """A proposal: ``tokens`` (at most ``K``), their estimated probabilities ``probs`` (each
    the product of the continuation frequencies up to it), the match length ``match_len``."""

    tokens: list[int]
    probs: list[float]
    match_len: int

    @property
    def score(self) -> float:
        return float(sum(self.probs))


@dataclass
class SuffixLimits:
    """The drafting keys of ``speculative_config``: ``max_depth`` (``D``), ``max_tokens``
    (``K``), ``max_spec_factor``, ``min_token_prob``."""

    max_depth: int
    max_tokens: int
    max_spec_factor: float
    min_token_prob: float


def _match(seq: np.ndarray, context: np.ndarray, max_depth: int) -> tuple[np.ndarray, int]:
    """The longest suffix of ``context`` (at most ``max_depth - 1`` tokens) that occurs in
    ``seq`` followed by a token: the end positions (exclusive) of its occurrences that are,
    and its length; ``(empty, 0)`` if even its last token has none."""
    longest = min(int(context.shape[0]), max_depth - 1)
    n = int(seq.shape[0])
    if longest < 1 or n < 2:
        return np.zeros(0, np.int64), 0
    ends = np.flatnonzero(seq[: n - 1] == context[-1]) + 1
    ends = ends[seq[ends] >= 0]
    if ends.size == 0 or longest == 1:
        return ends, int(ends.size > 0)
    # per occurrence, how many tokens before it agree with the context's (one gather)
    back = ends[:, None] - np.arange(2, longest + 1)[None, :]  # [E, longest - 1]
    same = (back >= 0) & (seq[np.maximum(back, 0)] == context[-2 : -longest - 1 : -1][None, :])
    agree = 1 + np.cumprod(same, axis=1).sum(axis=1)
    m = int(agree.max())
    return ends[agree == m], m


def _most_frequent(nxt: np.ndarray) -> tuple[int, int]:
    """The most frequent token of ``nxt`` (the smaller id on a tie) and its count."""
    if nxt.shape[0] <= _NUMPY_COUNT:
        tally = Counter(nxt.tolist())
        token, count = max(tally.items(), key=lambda kv: (kv[1], -kv[0]))
        return int(token), int(count)
    values, counts = np.unique(nxt, return_counts=True)
    best = int(np.argmax(counts))  # np.unique sorts: the first maximum is the smallest id
    return int(values[best]), int(counts[best])


def suffix_draft(seq: np.ndarray, context: np.ndarray, limits: SuffixLimits) -> Draft:
    """The draft for ``context`` (``[C]`` int64) from the windows of ``seq`` (``[n]`` int64,
    sequences separated by :data:`SEPARATOR`), as the module docstring says."""
    ends, m = _match(seq, context, limits.max_depth)
    if m == 0:
        return Draft([], [], 0)
    limit = min(limits.max_tokens, int(limits.max_spec_factor * m))
    n = int(seq.shape[0])
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    depth = m
    while len(tokens) < limit and depth < limits.max_depth and ends.size:
        nxt = seq[ends]
        token, count = _most_frequent(nxt)
        prob *= count / int(ends.shape[0])
        if prob < limits.min_token_prob:
            break
        tokens.append(token)
        probs.append(prob)
        ends = ends[nxt == token] + 1
        ends = ends[ends < n]
        ends = ends[seq[ends] >= 0]
        depth += 1
    return Draft(tokens, probs, m)


class SuffixCache:
    """The outputs of the ``max_requests`` most recently finished requests, end to end with
    :data:`SEPARATOR` between them (each output its own sequence)."""

    def __init__(self, max_requests: int):
        self.max_requests = max_requests
        self._outputs: deque[np.ndarray] = deque()
        self._joined: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._outputs)

    @property
    def outputs(self) -> list[list[int]]:
        """The outputs kept, oldest first."""
        return [out.tolist() for out in self._outputs]

    def add(self, output: Sequence[int] | np.ndarray) -> None:
        """Add a finished request's output, dropping the oldest beyond ``max_requests``."""
        if self.max_requests <= 0 or len(output) == 0:
            return
        self._outputs.append(np.asarray(output, np.int64).copy())
        while len(self._outputs) > self.max_requests:
            self._outputs.popleft()
        self._joined = None

    @property
    def sequence(self) -> np.ndarray:
        """``[n]`` int64: the outputs, each followed by :data:`SEPARATOR`."""
        if self._joined is None:
            sep = np.full(1, SEPARATOR, np.int64)
            parts = [part for out in self._outputs for part in (out, sep)]
            self._joined = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._joined


class SlotSequences:
    """Every slot's sequence (prompt + output so far), one row each of a buffer that grows
    with the longest, so that a step's emitted tokens are appended for the whole batch at once
    (a few array operations, whatever the batch size).

    Args:
        num_slots: ``N``.
    """

    def __init__(self, num_slots: int):
        self.buf = np.zeros((num_slots, 64), np.int64)
        self.length = np.zeros(num_slots, np.int64)
        self.prompt_len = np.zeros(num_slots, np.int64)
        self.live = np.zeros(num_slots, bool)

    def _fit(self, longest: int) -> None:
        if longest > self.buf.shape[1]:
            grown = np.zeros((self.buf.shape[0], max(2 * self.buf.shape[1], longest)), np.int64)
            grown[:, : self.buf.shape[1]] = self.buf
            self.buf = grown

    def start(self, idx: int, tokens: Sequence[int], prompt_len: int) -> None:
        """Slot ``idx`` holds a new request's sequence ``tokens``."""
        self._fit(len(tokens))
        self.buf[idx, : len(tokens)] = tokens
        self.length[idx], self.prompt_len[idx], self.live[idx] = len(tokens), prompt_len, True

    def drop(self, idx: int) -> np.ndarray | None:
        """Forget slot ``idx``; its output (the sequence past the prompt), None if it held
        none."""
        if not self.live[idx]:
            return None
        self.live[idx] = False
        return self.buf[idx, self.prompt_len[idx] : self.length[idx]].copy()

    def append(self, tokens: np.ndarray, counts: np.ndarray) -> None:
        """Append ``tokens[b, :counts[b]]`` (``[N, W]``, ``[N]``) to every live slot."""
        counts = np.where(self.live, counts, 0)
        if not counts.any():
            return
        self._fit(int((self.length + counts).max()))
        within = np.arange(tokens.shape[1])[None, :] < counts[:, None]
        rows, cols = np.nonzero(within)
        self.buf[rows, self.length[rows] + cols] = tokens[rows, cols]
        self.length += counts

    def tokens(self, idx: int) -> np.ndarray:
        """``[n]`` int64, slot ``idx``'s sequence so far (a view)."""
        return self.buf[idx, : self.length[idx]]


class SuffixProposer(ModelFreeProposer):
    """``method == "suffix"``: drafts a variable number of tokens (at most ``K``) per decoding
    slot by suffix decoding (see the module docstring), on the host.

    Per round (:meth:`run`), after the target's step: the tokens each slot emitted
    (``accept_tokens`` / ``accept_num``, read from the target's buffers) are appended to its
    sequence; each slot still running gets its draft in ``draft_tokens[b, 1:]`` (one
    host-to-device copy for the batch), and ``draft_model_postprocess`` sets
    ``seq_lens_this_time``. A slot's sequence starts from its prompt (and any tokens already
    generated) when its final prompt chunk is inserted; when the request finishes its output
    goes to the shared cache.
    """

    def __init__(self, fd_config: FDConfig, target_model_inputs: InputBatch):
        super().__init__(fd_config, target_model_inputs)
        spec = fd_config.speculative_config
        self.limits = SuffixLimits(
            spec.suffix_decoding_max_tree_depth,
            self.max_draft_token_num,
            spec.suffix_decoding_max_spec_factor,
            spec.suffix_decoding_min_token_prob,
        )
        self.cache = SuffixCache(spec.suffix_decoding_max_cached_requests)
        self.sequences = SlotSequences(int(target_model_inputs.draft_tokens.shape[0]))

    def insert_tasks_v1(self, req_dicts: Sequence[Request], num_running_requests: int = 0) -> None:
        """Start a slot's sequence at its final prompt chunk (the prompt and the tokens the
        request already generated); a new request's first chunk drops the old state without
        caching it. An abort finds no state: the runner frees the slot first
        (:meth:`forget_slot`, so the output so far joins the shared cache)."""
        for req in req_dicts:
            idx = int(req.idx)
            if req.is_first_chunk:
                self.sequences.drop(idx)
            if req.task_type == RequestType.PREFILL and req.is_final_chunk:
                prompt = list(req.prompt_token_ids)
                self.sequences.start(idx, prompt + list(req.output_token_ids), len(prompt))

    def forget_slot(self, idx: int) -> None:
        """The slot's request finished (or was replaced): its output goes to the shared cache."""
        output = self.sequences.drop(idx)
        if output is not None:
            self.cache.add(output)

    def draft_for(self, idx: int) -> Draft:
        """The draft for slot ``idx``'s sequence from the sequence itself or the shared cache,
        whichever scores higher."""
        seq = self.sequences.tokens(idx)
        context = seq[max(0, seq.shape[0] - (self.limits.max_depth - 1)) :]
        own = suffix_draft(seq, context, self.limits)
        if len(self.cache) == 0:
            return own
        shared = suffix_draft(self.cache.sequence, context, self.limits)
        return shared if shared.score > own.score else own

    def take_emitted(self) -> np.ndarray:
        """Append this step's emitted tokens (the target's ``accept_tokens`` / ``accept_num``)
        to every slot's sequence; returns the target's ``stop_flags`` ``[N]`` on the host."""
        target = self.target_model_inputs
        stopped = target.stop_flags.numpy().reshape(-1)
        if self.sequences.live.any():
            accept_num = target.accept_num.numpy().reshape(-1).astype(np.int64)
            self.sequences.append(target.accept_tokens.numpy(), accept_num)
        return stopped

    def candidate_rows(self, wanted: np.ndarray | None = None) -> np.ndarray:
        """Record this step's emitted tokens (:meth:`take_emitted`) and draft for the running
        slots (``wanted`` ``[N]`` bool: only those; None: all): ``[N, K]`` int64 on the host
        (-1 = no draft)."""
        n_slots = int(self.target_model_inputs.draft_tokens.shape[0])
        drafts = np.full((n_slots, self.max_draft_token_num), PLACEHOLDER_TOKEN_ID, np.int64)
        stopped = self.take_emitted()
        chosen = self.sequences.live & ~stopped.astype(bool)
        if wanted is not None:
            chosen &= wanted
        for idx in map(int, np.flatnonzero(chosen)):
            tokens = self.draft_for(idx).tokens
            drafts[idx, : len(tokens)] = tokens
        return drafts

    def write_drafts(self) -> None:
        """Record this step's emitted tokens and draft for the running slots."""
        self.target_model_inputs.draft_tokens[:, 1:] = paddle.to_tensor(self.candidate_rows())
