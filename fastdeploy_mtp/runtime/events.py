"""What one step of the reference engine reports
(:meth:`~fastdeploy_mtp.runtime.engine.Engine.step`): tokens emitted, requests finished,
failed, or handed off to a splitwise decode instance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .request import Request


@dataclass
class HandedOffRequest:
    """A request a splitwise prefill instance hands to a decode instance (it left the engine
    after the step that emitted its first token and drafted its first MTP tokens).

    Attributes:
        request: the request (finished here; its first token(s) in ``output_token_ids``).
        state: its slot state, JSON
            (:meth:`~fastdeploy_mtp.runtime.collaborators.SlotHandover.export_slot`).
        blocks: its KV block ids here, in order, held until
            :meth:`~fastdeploy_mtp.runtime.engine.Engine.release_handoff`.
    """

    request: Request
    state: dict[str, Any]
    blocks: list[int]


@dataclass
class StepEvents:
    """What one :meth:`~fastdeploy_mtp.runtime.engine.Engine.step` did.

    Attributes:
        ran: a target step ran (something was scheduled).
        emitted: ``(request, new token ids)`` for each request that got tokens this step.
        finished: requests that completed this step (EOS, ``max_tokens`` or
            ``max_model_len``); their slots are free again.
        failed: ``(request, error)`` for each request aborted this step.
        handed_off: splitwise prefill: requests that got their first token and drafts and
            leave for a decode instance (not in ``finished``).
    """

    ran: bool = False
    emitted: list[tuple[Request, list[int]]] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    failed: list[tuple[Request, BaseException]] = field(default_factory=list)
    handed_off: list[HandedOffRequest] = field(default_factory=list)
