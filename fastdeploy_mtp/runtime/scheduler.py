"""Continuous batching for the reference engine: slots, chunked prefill under a token
budget, KV blocks with a K + 1 lookahead, finishing and slot reuse."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from ..config import FDConfig
from .block_pool import BlockPool, block_keys
from .collaborators import SlotHandover
from .request import InvalidRequestError, Request, RequestType
from .slot_state import OutOfBlocksError, SlotState
from .submission_checks import (
    check_arrival,
    check_counts,
    check_fits,
    check_fresh,
    check_handed_over_output,
    check_prompt,
    check_sampling,
)


class Scheduler:
    """Assigns requests to ``max_num_seqs`` slots and plans each step.

    Per step: every decoding slot runs (it costs ``1 + drafts`` tokens, at most ``K + 1``);
    then prefilling slots get prompt chunks, in slot order, while the token budget
    ``max_num_batched_tokens`` lasts (``prefill_chunk_size`` caps one chunk); a slot part-way
    through its prompt always gets at least one token (its runner state would otherwise run
    on as a decode row), which the budget's lower bound ``N * (K + 1) + 1`` guarantees.
    Before a slot runs, it owns KV blocks for every position it (target or MTP layer) can
    write before the next schedule: ``2K + 2`` past its committed tokens. Finished slots free
    their blocks and take the next waiting request. The reference engine does not preempt: a
    waiting request takes a free slot only when the free blocks, less those the running
    requests may still claim, cover its worst case (:meth:`worst_case_blocks`), so a running
    request never runs out.

    Args:
        fd_config: serving config.
        prefill_chunk_size: most prompt tokens of one request per step (0 = no cap besides
            the token budget).
        vocab_size: token ids of a prompt must be below it (default
            ``model_config.vocab_size``; the engine passes the model's own if smaller).
        max_positions: positions the model can encode (e.g. its RoPE table); ``None`` = no
            limit besides ``max_model_len``.
        handover: reads a handed-over request's slot state (splitwise decode; ``None``: no
            handed-over request is accepted).
    """

    def __init__(
        self,
        fd_config: FDConfig,
        prefill_chunk_size: int = 0,
        vocab_size: int | None = None,
        max_positions: int | None = None,
        handover: SlotHandover | None = None,
    ):
        self.fd_config = fd_config
        sc = fd_config.scheduler_config
        spec = fd_config.speculative_config
        self.k = spec.num_speculative_tokens if spec.enabled else 0
        self.max_num_seqs = sc.max_num_seqs
        self.budget = sc.max_num_batched_tokens
        if self.budget < self.max_num_seqs * (self.k + 1) + 1:
            raise ValueError(
                f"scheduler_config.max_num_batched_tokens ({self.budget}) must exceed "
                f"max_num_seqs * (K + 1) = {self.max_num_seqs * (self.k + 1)} so that "
                "prefill can progress while every slot decodes"
            )
        if prefill_chunk_size < 0:
            raise ValueError(f"`prefill_chunk_size` must be >= 0, got {prefill_chunk_size}")
        self.prefill_chunk_size = prefill_chunk_size
        self.block_size = fd_config.cache_config.block_size
        self.max_blocks_per_seq = fd_config.max_blocks_per_seq
        cache = fd_config.cache_config
        #: the KV blocks: free list, reference counts, prefix cache
        self.pool = BlockPool(cache.total_block_num, cache.enable_prefix_caching)
        #: prefix-cache keys cover the token after a block when MTP layers have KV caches
        self._key_next = spec.enabled and spec.method == "mtp"
        #: the draft planner may admit requests without the MTP layer: a second key chain
        self._two_chains = self._key_next and spec.adaptive_draft_length
        #: the head of the queue and its prefix-cache key chains: a head that waits for
        #: blocks is looked up again each step, its prompt hashed once
        self._head_keys: tuple[Request, list[list[bytes]]] | None = None
        self.waiting: deque[Request] = deque()
        self.slots: dict[int, SlotState] = {}
        self.max_model_len = fd_config.model_config.max_model_len
        # Positions a slot may write before the next schedule: the target's K + 1 tokens of
        # this step, then up to K - 1 MTP substep positions past the accepted ones; 2K + 2
        # covers those 2K with two positions to spare.
        self.lookahead = 2 * self.k + 2
        self.vocab_size = fd_config.model_config.vocab_size if vocab_size is None else vocab_size
        self.max_positions = max_positions
        self.total_blocks = fd_config.cache_config.total_block_num
        #: blocks out of circulation but not in a slot, per request id: on a prefill
        #: instance those of a handed-off request until the decode instance copied them; on
        #: a decode instance those an aborted request's KV transfer may still be writing
        self.held: dict[str, list[int]] = {}
        self._admitted_transfers: list[Request] = []
        self.handover = handover

    # ---- submission --------------------------------------------------------------------------
    def worst_case_blocks(self, req: Request) -> int:
        """KV blocks ``req`` can hold at most: its last schedule happens with at most
        ``max_tokens - 1`` generated tokens, plus the ``2K + 2`` lookahead."""
        return -(
            -(len(req.prompt_token_ids) + req.max_tokens - 1 + self.lookahead) // self.block_size
        )

    def validate(self, req: object, max_arrival_step: int | None = None) -> None:
        """Raise :class:`~fastdeploy_mtp.runtime.request.InvalidRequestError` (a
        ``ValueError`` naming the request and the field) unless ``req`` can run to the end:

        * it is a :class:`Request` never submitted before (no slot, no outputs, not finished)
          whose ``request_id`` is a ``str`` no queued or running request has;
        * ``prompt_token_ids`` is a non-empty flat sequence of integer ids in
          ``[0, vocab_size)``;
        * ``max_tokens`` is an integer ``> 0`` and ``arrival_step`` an integer in
          ``[0, max_arrival_step)``; ``cache_namespace`` is ``bytes``;
        * ``len(prompt) + max_tokens + K + 1 <= max_model_len`` (and ``<= max_positions``);
        * its worst-case KV blocks fit a slot's block table and the whole cache.

        Duplicates *within* one submission are checked by :meth:`add_requests`.
        """
        if not isinstance(req, Request):
            raise InvalidRequestError(
                None, "request", f"is not a Request but a {type(req).__name__}"
            )
        running = {s.request.request_id for s in self.slots.values()}
        check_fresh(req, running, {w.request_id for w in self.waiting}, self.held)
        check_prompt(req, self.vocab_size)
        check_counts(req)
        if req.handoff_state is not None:
            if self.handover is None:
                raise InvalidRequestError(
                    req.request_id, "handoff", "this engine takes no handed-over requests"
                )
            check_handed_over_output(req, self.vocab_size)
        check_sampling(req, self.fd_config.speculative_config)
        check_arrival(req, max_arrival_step)
        positions = (self.max_model_len, self.max_positions)
        blocks = (self.max_blocks_per_seq, self.total_blocks)
        check_fits(req, self.k, positions, self.worst_case_blocks(req), blocks)

    def add_requests(self, reqs: Sequence[Request], max_arrival_step: int | None = None) -> None:
        """Validate every request (:meth:`validate`, plus no ``request_id`` twice among
        ``reqs``), then queue them all, in order; if one is refused, none is queued and no
        request is modified. Queuing copies each prompt to a ``list[int]``."""
        seen: set[str] = set()
        for req in reqs:
            self.validate(req, max_arrival_step)
            if req.request_id in seen:
                raise InvalidRequestError(
                    req.request_id, "request_id", "appears twice in one submission"
                )
            seen.add(req.request_id)
        for req in reqs:
            req.prompt_token_ids = [int(t) for t in req.prompt_token_ids]
            req.max_tokens = int(req.max_tokens)
            req.arrival_step = int(req.arrival_step)
            req.submitted = True
            self.waiting.append(req)

    def add_request(self, req: Request) -> None:
        """Validate and queue one request (see :meth:`add_requests`)."""
        self.add_requests([req])

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.slots)

    def next_arrival(self) -> int | None:
        """``arrival_step`` of the head of the queue (``None`` when nothing waits)."""
        return self.waiting[0].arrival_step if self.waiting else None

    def _reserved_blocks(self) -> int:
        """Blocks the running requests may still claim (worst case less what they hold)."""
        return sum(
            max(self.worst_case_blocks(s.request) - len(s.blocks), 0) for s in self.slots.values()
        )

    def _ensure_blocks(self, state: SlotState, tokens: int) -> None:
        need = -(-tokens // self.block_size)
        if need > self.max_blocks_per_seq:
            raise OutOfBlocksError(
                f"request {state.request.request_id!r} needs {need} blocks, "
                f"more than a slot holds ({self.max_blocks_per_seq})"
            )
        while len(state.blocks) < need:
            if not self.pool.num_free:
                raise OutOfBlocksError(
                    "the KV cache is out of blocks: raise cache_config.total_block_num or lower "
                    "max_num_seqs"
                )
            state.blocks.append(self.pool.allocate())

    @property
    def free_blocks(self) -> list[int]:
        """Ids of the blocks a request can be given (free, or cached with no reference)."""
        return self.pool.free_ids()

    @property
    def num_free_blocks(self) -> int:
        """How many blocks a request can be given (free, or cached with no reference)."""
        return self.pool.num_free

    def _admit(self, idx: int) -> bool:
        """Place the head of the queue in free slot ``idx`` if the free blocks cover its worst
        case (less the blocks a prefix-cache hit gives it); returns whether it was placed."""
        req = self.waiting[0]
        chains: list[list[bytes]] = [[], []]
        hits: list[int] = []
        if self.pool.enable_caching:
            if self._head_keys is None or self._head_keys[0] is not req:
                args = (req.prompt_token_ids, self.block_size, self._key_next, req.cache_namespace)
                both = self._two_chains and req.sampling.speculative_method != "mtp"
                second = [block_keys(*args, target_only=True)] if both else []
                self._head_keys = (req, [block_keys(*args), *second])
            chains = self._head_keys[1] + [[]]
            chain, hits = self.pool.lookup_longest(chains[:-1])
            req.prefix_without_mtp = chain == 1  # its hit holds no MTP KV
        taken_from_free = sum(1 for b in hits if self.pool.refs(b) == 0)
        available = self.pool.num_free - taken_from_free - self._reserved_blocks()
        if available < self.worst_case_blocks(req) - len(hits):
            return False
        self.waiting.popleft()
        req.idx = idx
        if self.pool.enable_caching:
            self.pool.count_query(len(req.prompt_token_ids), len(hits) * self.block_size)
        self.pool.take(hits)
        req.num_cached_tokens = len(hits) * self.block_size
        state = SlotState(
            req,
            prefill_pos=req.num_cached_tokens,
            blocks=list(hits),
            keys=chains[0],
            target_only_keys=chains[1],
            registered=len(hits),
        )
        self.slots[idx] = state
        if req.handoff_state is not None:
            # handed over by a prefill instance: its KV blocks are allocated now, so the
            # transfer has somewhere to go (past the ones this instance's prefix cache already
            # holds); the slot runs once they arrived (kv_arrived)
            state.prefill_pos, state.awaiting_kv = len(req.prompt_token_ids), True
            self._ensure_blocks(
                state, len(req.prompt_token_ids) + len(req.output_token_ids) + self.lookahead
            )
            self._admitted_transfers.append(req)
        return True

    def schedule(self, step: int, decode_lens: np.ndarray) -> list[Request]:
        """Plan this step: first place waiting requests (FIFO, once their ``arrival_step`` has
        come and the free blocks cover their worst case) in free slots, then plan the slots.
        ``decode_lens[b]`` = tokens slot ``b`` feeds if it decodes (the target's
        ``seq_lens_this_time`` after the proposer). Returns the
        tasks: a DECODE task (block-table refresh) per decoding slot, then a PREFILL task per
        slot that gets a chunk."""
        for idx in range(self.max_num_seqs):
            if idx in self.slots or not self.waiting or self.waiting[0].arrival_step > step:
                continue
            if not self._admit(idx):
                break
        tasks: list[Request] = []
        budget = self.budget
        for idx, state in sorted(self.slots.items()):
            if state.prefilling or state.awaiting_kv:
                continue
            req = state.request
            used = len(req.prompt_token_ids) + len(req.output_token_ids)
            self._ensure_blocks(state, used + self.lookahead)
            req.task_type = RequestType.DECODE
            req.block_tables = list(state.blocks)
            if state.needs_import:
                assert self.handover is not None  # validate() admits no hand-over without it
                req.task_type = RequestType.IMPORT
                state.needs_import = False
                budget -= self.handover.slot_tokens(req.handoff_state)
            else:
                budget -= int(decode_lens[idx])
            tasks.append(req)
        prefilling = [
            (idx, s) for idx, s in sorted(self.slots.items()) if s.prefilling and not s.awaiting_kv
        ]
        # a slot whose prompt is part-way prefilled must get a chunk every step (its runner
        # state would otherwise run on as a decode row): keep one token for each after this one
        started = [idx for idx, s in prefilling if s.prefill_pos > s.request.num_cached_tokens]
        for idx, state in prefilling:
            room = budget - sum(1 for j in started if j > idx)
            if room <= 0:
                continue
            req = state.request
            chunk = min(len(req.prompt_token_ids) - state.prefill_pos, room)
            if self.prefill_chunk_size:
                chunk = min(chunk, self.prefill_chunk_size)
            req.prefill_start_index = state.prefill_pos
            req.prefill_end_index = state.prefill_pos + chunk
            self._ensure_blocks(state, req.prefill_end_index + self.lookahead)
            req.task_type = RequestType.PREFILL
            req.block_tables = list(state.blocks)
            state.prefill_pos += chunk
            budget -= chunk
            tasks.append(req)
        return tasks

    def finish(self, idx: int, hold: bool = False) -> Request:
        """Free slot ``idx`` and its blocks (with ``hold``: keep the blocks out of circulation
        in :attr:`held` until :meth:`release`); returns its request."""
        state = self.slots.pop(idx)
        if hold:
            self.held[state.request.request_id] = state.blocks
        else:
            self.pool.free(state.blocks)
        state.request.finished = True
        return state.request

    def release(self, request_id: str) -> int:
        """Return the blocks :attr:`held` for ``request_id`` to the free list; returns how many
        (0 if none were held)."""
        blocks = self.held.pop(request_id, [])
        self.pool.free(blocks)
        return len(blocks)

    def cache_computed(
        self, tasks: Sequence[Request], mtp_unseen: np.ndarray | None = None
    ) -> None:
        """The step that ran ``tasks`` succeeded: register in the prefix cache the prompt
        blocks whose KV it completed (every layer's; see
        :mod:`~fastdeploy_mtp.runtime.block_pool`). A prefill chunk ``[start, end)``
        completes the cacheable blocks that end at or before ``end``; an imported slot (a
        splitwise decode instance) arrived with its whole prompt's KV. ``mtp_unseen`` ``[N]``
        bool (the step's :attr:`~.step_output.StepOutput.mtp_unseen`): slots whose chunks
        the MTP layer skipped; their blocks miss its KV and go to the target-only chain."""
        if not self.pool.enable_caching:
            return
        for req in tasks:
            state = self.slots.get(req.idx)
            if state is None or state.request is not req:
                continue
            unseen = mtp_unseen is not None and req.idx < len(mtp_unseen) and mtp_unseen[req.idx]
            keys = state.target_only_keys if unseen else state.keys
            if req.task_type == RequestType.PREFILL:
                done = min(len(keys), req.prefill_end_index // self.block_size)
            elif req.task_type == RequestType.IMPORT:
                done = len(keys)
            else:
                continue
            for i in range(state.registered, done):
                self.pool.register(state.blocks[i], keys[i])
            state.registered = max(state.registered, done)

    def take_admitted_transfers(self) -> list[Request]:
        """The handed-over requests admitted to slots since the last call (their KV blocks
        are allocated and must now be fetched; see :meth:`kv_arrived`)."""
        out, self._admitted_transfers = self._admitted_transfers, []
        return out

    def awaiting_kv(self, req: Request) -> bool:
        """``req`` holds a slot whose KV blocks have not arrived yet."""
        state = self.slots.get(req.idx)
        return state is not None and state.request is req and state.awaiting_kv

    def kv_arrived(self, req: Request) -> None:
        """The KV blocks of handed-over ``req`` are in its blocks: load the slot next step."""
        state = self.slots.get(req.idx)
        if state is None or state.request is not req or not state.awaiting_kv:
            raise RuntimeError(f"request {req.request_id!r} is not waiting for its KV blocks")
        state.awaiting_kv = False
        state.needs_import = True

    def abort(self, req: Request, error: BaseException) -> None:
        """Take ``req`` out of the queue or its slot (freeing the slot's blocks) and mark it
        finished with ``error``. The caller resets the slot's buffers. The blocks of a slot
        whose KV transfer is in flight are :attr:`held` instead (the transfer may still write
        them): :meth:`release` them once it has ended."""
        if req.idx in self.slots and self.slots[req.idx].request is req:
            self.finish(req.idx, hold=self.slots[req.idx].awaiting_kv)
        else:
            self.waiting = deque(w for w in self.waiting if w is not req)
            req.finished = True
        req.error = error
