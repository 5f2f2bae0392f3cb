"""The checks a request handed over by a splitwise prefill instance passes before a decode
engine queues it: the engine's role, its slot state against the runner's buffers, and its
sampling parameters against the ones the slot was loaded with."""

from __future__ import annotations

from .collaborators import HandoffError, Runner, SlotHandover
from .request import InvalidRequestError, Request


def check_transferred(req: Request, role: str, runner: Runner, handover: SlotHandover) -> None:
    """Raise :class:`~fastdeploy_mtp.runtime.request.InvalidRequestError` (field ``handoff``
    or ``sampling``) unless ``req`` can decode on an engine of splitwise ``role`` whose
    runner is ``runner``: the role is ``"decode"``, ``req.handoff_state`` is present and fits
    the runner's buffers (:meth:`~fastdeploy_mtp.runtime.collaborators.Runner.check_handoff`),
    and it was loaded with ``req``'s sampling parameters, seed and EOS mask length."""
    rid = req.request_id
    if role != "decode":
        raise InvalidRequestError(
            rid, "handoff", f"this engine's splitwise_role is {role!r}, not 'decode'"
        )
    if req.handoff_state is None:
        raise InvalidRequestError(rid, "handoff", "is missing (no slot state)")
    try:
        runner.check_handoff(req.handoff_state)
    except HandoffError as exc:
        raise InvalidRequestError(rid, "handoff", f"does not fit this instance: {exc}") from None
    mismatch = handover.sampling_mismatch(req.handoff_state, req.sampling, rid, req.max_tokens)
    if mismatch is not None:
        raise InvalidRequestError(
            rid, "sampling", f"does not match the handed-over slot: {mismatch}"
        )
