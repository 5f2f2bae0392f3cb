"""``method == "suffix"``: suffix decoding on the host.

The structure is a depth-bounded suffix trie with counts (:class:`SuffixTrie`): for a token
sequence, every contiguous window of at most ``D`` tokens (``D`` =
``suffix_decoding_max_tree_depth``) is a path from the root, and each node counts how often
its path occurs. Appending one token touches at most ``D`` nodes (the nodes of the current
suffixes of length ``0 .. D - 1``, kept in a :class:`Cursor`), so a request's trie grows with
each accepted token instead of being rebuilt. Removing a sequence replays its windows with
negative counts (the shared trie drops the oldest finished request that way).

Drafting from a trie: the longest suffix of the request's context (prompt + output, at most
``D - 1`` tokens) that occurs with at least one continuation is the match, of length ``m``;
from its node the most frequent child (ties: the smaller token id) is drafted while the
running product of ``count(child) / sum(count(children))`` stays at or above
``suffix_decoding_min_token_prob``, up to ``min(K, int(suffix_decoding_max_spec_factor * m))``
tokens. Each request drafts from its own trie and, with
``suffix_decoding_max_cached_requests > 0``, from a trie of the outputs of recently finished
requests; the draft whose probabilities sum higher wins (the request's own on a tie).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import paddle

from ..config import FDConfig
from ..constants import PLACEHOLDER_TOKEN_ID
from ..runtime.input_batch import InputBatch
from ..runtime.request import Request, RequestType
from .model_free import ModelFreeProposer


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0


@dataclass
class Cursor:
    """Where a sequence being appended to a :class:`SuffixTrie` ends: ``open[i]`` is the node
    of its last ``i + 1`` tokens, for ``i + 1 < D`` (the nodes a next token extends)."""

    open: list[_Node] = field(default_factory=list)


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


class SuffixTrie:
    """Counts of every window of at most ``max_depth`` tokens of the sequences added to it.

    Args:
        max_depth: ``D``, the longest window counted (``>= 1``).
    """

    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"SuffixTrie max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node()

    def extend(self, cursor: Cursor, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the sequence ending at ``cursor`` (updated in place): each
        token adds one occurrence to the window of each length ``1 .. D`` it ends."""
        self._walk(cursor, tokens, 1)

    def remove(self, tokens: Sequence[int]) -> None:
        """Take one whole sequence, added before with :meth:`extend` from a fresh cursor, out
        of the counts; nodes whose count reaches 0 are dropped."""
        self._walk(Cursor(), tokens, -1)

    def _walk(self, cursor: Cursor, tokens: Sequence[int], delta: int) -> None:
        keep = self.max_depth - 1
        for token in tokens:
            t = int(token)
            extended = []
            for node in [self.root, *cursor.open]:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                child.count += delta
                if child.count <= 0:
                    # detached, but still reachable from the cursor: deeper windows of this
                    # sequence are decremented through it on the next tokens
                    del node.children[t]
                extended.append(child)
            cursor.open = extended[:keep]

    def counts(self) -> dict[tuple[int, ...], int]:
        """Every counted window and its count (for tests and inspection)."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[tuple[int, ...], _Node]] = [((), self.root)]
        while stack:
            path, node = stack.pop()
            for t, child in node.children.items():
                out[path + (t,)] = child.count
                stack.append((path + (t,), child))
        return out

    def _find(self, suffix: Sequence[int]) -> _Node | None:
        node: _Node | None = self.root
        for t in suffix:
            assert node is not None
            node = node.children.get(int(t))
            if node is None:
                return None
        return node

    def match(self, context: Sequence[int]) -> tuple[_Node, int] | None:
        """The node of the longest suffix of ``context`` (at most ``D - 1`` tokens) that has a
        continuation, and its length; ``None`` if no suffix has one."""
        for m in range(min(len(context), self.max_depth - 1), 0, -1):
            node = self._find(context[len(context) - m :])
            if node is not None and node.children:
                return node, m
        return None

    @staticmethod
    def match_at(cursor: Cursor) -> tuple[_Node, int] | None:
        """:meth:`match` of the sequence ending at ``cursor`` (the trie's own sequence: its
        suffix nodes are the cursor's, so no walk from the root is needed)."""
        for i in range(len(cursor.open) - 1, -1, -1):
            if cursor.open[i].children:
                return cursor.open[i], i + 1
        return None

    def draft(
        self, context: Sequence[int], max_tokens: int, max_spec_factor: float, min_token_prob: float
    ) -> Draft:
        """The draft for ``context`` (see the module docstring); empty without a match."""
        return self.follow(self.match(context), max_tokens, max_spec_factor, min_token_prob)

    @staticmethod
    def follow(
        found: tuple[_Node, int] | None,
        max_tokens: int,
        max_spec_factor: float,
        min_token_prob: float,
    ) -> Draft:
        """The draft from a match ``(node, length)`` (:meth:`match`); empty for ``None``."""
        if found is None:
            return Draft([], [], 0)
        node, m = found
        limit = min(max_tokens, int(max_spec_factor * m))
        tokens: list[int] = []
        probs: list[float] = []
        prob = 1.0
        while len(tokens) < limit and node.children:
            total = sum(c.count for c in node.children.values())
            token, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
            prob *= child.count / total
            if prob < min_token_prob:
                break
            tokens.append(token)
            probs.append(prob)
            node = child
        return Draft(tokens, probs, m)


class SuffixCache:
    """The outputs of the ``max_requests`` most recently finished requests in one
    :class:`SuffixTrie` (each output its own sequence: no window spans two requests).

    Outputs are added to the trie when it is next read (:attr:`trie`), not when they arrive:
    a deployment whose requests rarely draft from the cache pays nothing per finished
    request, and an output that is pushed out again before the next read is never counted.
    The counts read are the same either way."""

    def __init__(self, max_depth: int, max_requests: int):
        self._trie = SuffixTrie(max_depth)
        self.max_requests = max_requests
        self._outputs: deque[list[int]] = deque()  # in the trie, oldest first
        self._pending: deque[list[int]] = deque()  # newer, not counted yet

    def __len__(self) -> int:
        return min(len(self._outputs) + len(self._pending), max(self.max_requests, 0))

    def add(self, output: Sequence[int]) -> None:
        """Add a finished request's output, dropping the oldest beyond ``max_requests``."""
        if self.max_requests <= 0 or len(output) == 0:
            return
        self._pending.append([int(t) for t in output])
        if len(self._pending) > self.max_requests:  # pushed out before it was ever read
            self._pending.popleft()

    @property
    def trie(self) -> SuffixTrie:
        """The trie of the newest ``max_requests`` outputs."""
        if self._pending:
            drop = len(self._outputs) + len(self._pending) - self.max_requests
            for _ in range(max(drop, 0)):
                self._trie.remove(self._outputs.popleft())
            while self._pending:
                tokens = self._pending.popleft()
                self._trie.extend(Cursor(), tokens)
                self._outputs.append(tokens)
        return self._trie


@dataclass
class _Slot:
    """One request's suffix state: its trie, where its sequence ends, the sequence, and how
    much of the sequence the trie holds (the trie catches up when the slot is drafted for: a
    request the draft planner keeps on other methods never pays for its trie)."""

    trie: SuffixTrie
    cursor: Cursor
    tokens: list[int]
    prompt_len: int
    built: int = 0


class SuffixProposer(ModelFreeProposer):
    """``method == "suffix"``: drafts a variable number of tokens (at most ``K``) per decoding
    slot from suffix tries (see the module docstring), on the host.

    Per round (:meth:`run`), after the target's step: the tokens each slot emitted
    (``accept_tokens`` / ``accept_num``, read from the target's buffers) extend its trie; each
    slot still running gets its draft in ``draft_tokens[b, 1:]`` (one host-to-device copy for
    the batch), and ``draft_model_postprocess`` sets ``seq_lens_this_time``. A slot's trie is
    started from its prompt (and any tokens already generated) when its final prompt chunk
    is inserted; when the request finishes its output goes to the shared cache.
    """

    def __init__(self, fd_config: FDConfig, target_model_inputs: InputBatch):
        super().__init__(fd_config, target_model_inputs)
        spec = fd_config.speculative_config
        self.max_depth = spec.suffix_decoding_max_tree_depth
        self.max_spec_factor = spec.suffix_decoding_max_spec_factor
        self.min_token_prob = spec.suffix_decoding_min_token_prob
        self.cache = SuffixCache(self.max_depth, spec.suffix_decoding_max_cached_requests)
        self._slots: dict[int, _Slot] = {}

    def insert_tasks_v1(self, req_dicts: Sequence[Request], num_running_requests: int = 0) -> None:
        """Start a slot's trie at its final prompt chunk (from the prompt and the tokens the
        request already generated); a new request's first chunk drops the old state without
        caching it. An abort finds no state: the runner frees the slot first
        (:meth:`forget_slot`, so the output so far joins the shared cache)."""
        for req in req_dicts:
            idx = int(req.idx)
            if req.is_first_chunk:
                self._slots.pop(idx, None)
            if req.task_type == RequestType.PREFILL and req.is_final_chunk:
                tokens = [int(t) for t in req.prompt_token_ids] + [
                    int(t) for t in req.output_token_ids
                ]
                slot = _Slot(
                    SuffixTrie(self.max_depth), Cursor(), tokens, len(req.prompt_token_ids)
                )
                self._slots[idx] = slot

    def forget_slot(self, idx: int) -> None:
        """The slot's request finished (or was replaced): its output goes to the shared cache."""
        slot = self._slots.pop(idx, None)
        if slot is not None:
            self.cache.add(slot.tokens[slot.prompt_len :])

    def draft_for(self, slot: _Slot) -> Draft:
        """The draft for the slot's sequence from its own trie (first brought up to date) or
        the shared cache, whichever scores higher."""
        if slot.built < len(slot.tokens):
            slot.trie.extend(slot.cursor, slot.tokens[slot.built :])
            slot.built = len(slot.tokens)
        k, factor, prob = self.max_draft_token_num, self.max_spec_factor, self.min_token_prob
        own = SuffixTrie.follow(SuffixTrie.match_at(slot.cursor), k, factor, prob)
        if len(self.cache) == 0:
            return own
        shared = self.cache.trie.draft(slot.tokens, k, factor, prob)
        return shared if shared.score > own.score else own

    def _take_emitted(self) -> np.ndarray:
        """Append this step's emitted tokens (the target's ``accept_tokens`` / ``accept_num``)
        to every slot's sequence; returns the target's ``stop_flags`` ``[N]`` on the host."""
        target = self.target_model_inputs
        stopped = target.stop_flags.numpy().reshape(-1)
        if self._slots:
            accept_tokens = target.accept_tokens.numpy()
            accept_num = target.accept_num.numpy().reshape(-1)
            for idx, slot in self._slots.items():
                n = int(accept_num[idx])
                if n > 0:
                    slot.tokens.extend(accept_tokens[idx, :n].tolist())
        return stopped

    def candidate_rows(self, wanted: np.ndarray | None = None) -> np.ndarray:
        """Record this step's emitted tokens (:meth:`_take_emitted`) and draft for the running
        slots (``wanted`` ``[N]`` bool: only those; None: all): ``[N, K]`` int64 on the host
        (-1 = no draft)."""
        n_slots = int(self.target_model_inputs.draft_tokens.shape[0])
        drafts = np.full((n_slots, self.max_draft_token_num), PLACEHOLDER_TOKEN_ID, np.int64)
        stopped = self._take_emitted()
        for idx, slot in self._slots.items():
            if stopped[idx] or (wanted is not None and not wanted[idx]):
                continue
            tokens = self.draft_for(slot).tokens
            drafts[idx, : len(tokens)] = tokens
        return drafts

    def write_drafts(self) -> None:
        """Record this step's emitted tokens and draft for the running slots."""
        self.target_model_inputs.draft_tokens[:, 1:] = paddle.to_tensor(self.candidate_rows())
