"""Continuous batching for the reference engine: slots, chunked prefill under a token
budget, KV blocks with a K + 1 lookahead, finishing and slot reuse."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..config import FDConfig
from .request import Request, RequestType


class OutOfBlocksError(RuntimeError):
    """The KV cache has no free block for a running request (the reference engine does not
    preempt)."""


@dataclass
class SlotState:
    request: Request
    prefill_pos: int = 0  # prompt tokens already prefilled
    blocks: list[int] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.prefill_pos < len(self.request.prompt_token_ids)


class Scheduler:
    """Assigns requests to ``max_num_seqs`` slots and plans each step.

    Per step: every decoding slot runs (it costs ``1 + drafts`` tokens, at most ``K + 1``);
    then prefilling slots get prompt chunks, in slot order, while the token budget
    ``max_num_batched_tokens`` lasts (``prefill_chunk_size`` caps one chunk). Before a slot
    runs, it owns KV blocks for every position it (target or MTP layer) can write before the
    next schedule: ``2K + 2`` past its committed tokens. Finished slots free their blocks and take the
    next waiting request.

    Args:
        fd_config: serving config.
        prefill_chunk_size: most prompt tokens of one request per step (0 = no cap besides
            the token budget).
    """

    def __init__(self, fd_config: FDConfig, prefill_chunk_size: int = 0):
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
        self.free_blocks: list[int] = list(range(fd_config.cache_config.total_block_num - 1, -1, -1))
        self.waiting: deque[Request] = deque()
        self.slots: dict[int, SlotState] = {}
        self.max_model_len = fd_config.model_config.max_model_len
        # Positions a slot may write before the next schedule: the target's K + 1 tokens of
        # this step, then up to K - 1 MTP substep positions past the accepted ones; 2K + 2
        # covers those 2K with two positions to spare.
        self.lookahead = 2 * self.k + 2

    def add_request(self, req: Request) -> None:
        need = len(req.prompt_token_ids) + req.max_tokens + self.k + 1
        if need > self.max_model_len:
            raise ValueError(
                f"request {req.request_id!r}: prompt ({len(req.prompt_token_ids)}) + "
                f"max_tokens ({req.max_tokens}) + K + 1 = {need} exceeds "
                f"max_model_len {self.max_model_len}"
            )
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.slots)

    def _ensure_blocks(self, state: SlotState, tokens: int) -> None:
        need = -(-tokens // self.block_size)
        if need > self.max_blocks_per_seq:
            raise OutOfBlocksError(
                f"request {state.request.request_id!r} needs {need} blocks, "
                f"more than a slot holds ({self.max_blocks_per_seq})"
            )
        while len(state.blocks) < need:
            if not self.free_blocks:
                raise OutOfBlocksError(
                    "the KV cache is out of blocks: raise cache_config.total_block_num or lower max_num_seqs"
                )
            state.blocks.append(self.free_blocks.pop())

    def schedule(self, step: int, decode_lens: np.ndarray) -> list[Request]:
        """Plan this step: first place waiting requests (FIFO, once their ``arrival_step`` has
        come) in free slots, then plan the slots. ``decode_lens[b]`` = tokens slot ``b`` feeds
        if it decodes (the target's ``seq_lens_this_time`` after the proposer). Returns the
        tasks: a DECODE task (block-table refresh) per decoding slot, then a PREFILL task per
        slot that gets a chunk."""
        for idx in range(self.max_num_seqs):
            if idx in self.slots or not self.waiting or self.waiting[0].arrival_step > step:
                continue
            req = self.waiting.popleft()
            req.idx = idx
            self.slots[idx] = SlotState(req)
        tasks: list[Request] = []
        budget = self.budget
        for idx, state in sorted(self.slots.items()):
            if state.prefilling:
                continue
            req = state.request
            used = len(req.prompt_token_ids) + len(req.output_token_ids)
            self._ensure_blocks(state, used + self.lookahead)
            req.task_type = RequestType.DECODE
            req.block_tables = list(state.blocks)
            budget -= int(decode_lens[idx])
            tasks.append(req)
        for _, state in sorted(self.slots.items()):
            if not state.prefilling or budget <= 0:
                continue
            req = state.request
            chunk = min(len(req.prompt_token_ids) - state.prefill_pos, budget)
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

    def finish(self, idx: int) -> Request:
        """Free slot ``idx`` and its blocks; returns its request."""
        state = self.slots.pop(idx)
        self.free_blocks.extend(reversed(state.blocks))
        state.request.finished = True
        return state.request
