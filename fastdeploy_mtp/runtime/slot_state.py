"""What the scheduler keeps per occupied slot (:class:`SlotState`: its request, prefill
progress, KV blocks and prefix-cache keys, the splitwise transfer flags) and the error of a
slot that finds no KV block (:class:`OutOfBlocksError`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import Request


class OutOfBlocksError(RuntimeError):
    """The KV cache has no free block for a running request. Submission and admission
    control make this unreachable (a request is admitted only when the free blocks cover its
    worst case); it remains as an internal consistency check."""


@dataclass
class SlotState:
    """One occupied slot: its request and how far the scheduler has taken it."""

    request: Request
    prefill_pos: int = 0  # prompt tokens already prefilled
    blocks: list[int] = field(default_factory=list)
    #: prefix-cache keys of the prompt's cacheable blocks (empty without prefix caching)
    keys: list[bytes] = field(default_factory=list)
    #: the same blocks' keys in the chain of blocks without MTP KV (``block_pool.TARGET_ONLY``;
    #: empty where no request can be admitted without the MTP layer)
    target_only_keys: list[bytes] = field(default_factory=list)
    #: leading blocks already registered in the prefix cache (hits included)
    registered: int = 0
    #: splitwise decode: the slot waits for its KV blocks from the prefill instance
    awaiting_kv: bool = False
    #: splitwise decode: the KV arrived; the next schedule loads the slot (an IMPORT task)
    needs_import: bool = False

    @property
    def prefilling(self) -> bool:
        return self.prefill_pos < len(self.request.prompt_token_ids)
