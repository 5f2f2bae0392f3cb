"""Requests as the runner and the proposer see them (FastDeploy's attribute names)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ..constants import NO_SLOT


class RequestType(enum.Enum):
    """What a scheduled task asks of a slot this step."""

    PREFILL = 0  # a chunk of the prompt: [prefill_start_index, prefill_end_index)
    DECODE = 1  # keep decoding (only the block table may have changed)
    ABORT = 2  # free the slot


@dataclass
class Request:
    """One generation request.

    Attributes:
        request_id: caller's id.
        prompt_token_ids: the prompt.
        max_tokens: most tokens to generate (FastDeploy's ``max_dec_len``).
        arrival_step: the engine step at which the request becomes visible (for tests and
            benchmarks with staggered arrivals; 0 = from the start).
        idx: the slot it occupies (set by the scheduler; ``NO_SLOT`` until then).
        output_token_ids: tokens generated so far.
        prefill_start_index / prefill_end_index: the prompt chunk of the current task.
        task_type: :class:`RequestType` of the current task.
        block_tables: KV block ids of the slot, in order.
    """

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int = 64
    arrival_step: int = 0
    idx: int = NO_SLOT
    output_token_ids: list[int] = field(default_factory=list)
    prefill_start_index: int = 0
    prefill_end_index: int = 0
    task_type: RequestType = RequestType.PREFILL
    block_tables: list[int] = field(default_factory=list)
    finished: bool = False

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: `prompt_token_ids` is empty")
        if self.max_tokens <= 0:
            raise ValueError(f"request {self.request_id!r}: `max_tokens` must be > 0, got {self.max_tokens}")

    def get(self, key: str, default: Any | None = None) -> Any:
        """Dict-style access, as FastDeploy's ``Request.get``."""
        return getattr(self, key, default)

    @property
    def is_final_chunk(self) -> bool:
        return self.prefill_end_index >= len(self.prompt_token_ids)
