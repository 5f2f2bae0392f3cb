"""The messages between the engine and its workers (ZMQ), typed and versioned (see
:mod:`.wire`).

Engine -> every worker (ZMQ, the same message to every tensor-parallel rank): :class:`Step`
(reset the listed slots, load the tasks, run one target step + proposer round; ``export``,
splitwise prefill: rank 0 returns these slots' states) and :class:`Shutdown` (release the
caches, exit 0). A task is a :class:`PrefillTask` (one chunk of a prompt), a
:class:`DecodeTask` or an :class:`ImportTask` (splitwise decode: a slot handed over by a
prefill instance, its ``state`` as :mod:`fastdeploy_mtp.splitwise.handoff` exports it).

Worker -> engine (ZMQ): :class:`Ready` once its model is loaded and its caches attached;
:class:`Done` after a step (rank 0 adds the step's :class:`StepResult`; it sends the step's
tokens *before* it, through ``speculate_save_output_topk``, FastDeploy's SysV message
layout, which is not one of these messages); :class:`Failed` when the step raised.
These carry ``version``; a receiver refuses another (or none) with an error naming both.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import Field, TypeAdapter, ValidationError

from ...runtime.request import Request, RequestType
from ...runtime.sampling_params import SamplingParams, TokenLogprob
from .wire import Message, Versioned, check_version, refusal

if TYPE_CHECKING:
    import numpy as np

    from ...runtime.target_runner import StepOutput


class _TaskBase(Message):
    idx: int
    request_id: str
    block_tables: list[int]


class PrefillTask(_TaskBase):
    """One chunk ``[start, end)`` of a prompt; the request's first chunk also carries
    ``prompt_token_ids`` and ``sampling`` (the worker starts a new request in the slot), and
    ``prefix_without_mtp`` (:attr:`~fastdeploy_mtp.runtime.request.Request.prefix_without_mtp`)."""

    type: Literal["PREFILL"] = "PREFILL"
    start: int
    end: int
    max_tokens: int
    output_token_ids: list[int]
    prompt_token_ids: list[int] | None = None
    sampling: SamplingParams | None = None
    prefix_without_mtp: bool = False


class DecodeTask(_TaskBase):
    type: Literal["DECODE"] = "DECODE"


class ImportTask(_TaskBase):
    """A slot handed over by a prefill instance (splitwise decode)."""

    type: Literal["IMPORT"] = "IMPORT"
    prompt_token_ids: list[int]
    max_tokens: int
    output_token_ids: list[int]
    state: dict[str, Any]
    sampling: SamplingParams


Task = Annotated[PrefillTask | DecodeTask | ImportTask, Field(discriminator="type")]


class Step(Versioned):
    type: Literal["step"] = "step"
    step: int
    free: list[int] = []
    abort: list[int] = []
    tasks: list[Task] = []
    export: list[int] = []


class Shutdown(Versioned):
    type: Literal["shutdown"] = "shutdown"


EngineMessage = Annotated[Step | Shutdown, Field(discriminator="type")]


def task_message(req: Request, first_chunk: bool) -> Task:
    """The wire form of a scheduled task (a prefill's first chunk carries the prompt and
    sampling)."""
    ids: dict[str, Any] = {
        "idx": int(req.idx),
        "request_id": req.request_id,
        "block_tables": [int(b) for b in req.block_tables],
    }
    if req.task_type == RequestType.PREFILL:
        return PrefillTask(
            **ids,
            start=int(req.prefill_start_index),
            end=int(req.prefill_end_index),
            max_tokens=int(req.max_tokens),
            output_token_ids=[int(t) for t in req.output_token_ids],
            prompt_token_ids=[int(t) for t in req.prompt_token_ids] if first_chunk else None,
            sampling=req.sampling if first_chunk else None,
            prefix_without_mtp=bool(req.prefix_without_mtp),
        )
    if req.task_type == RequestType.IMPORT:
        assert isinstance(req.handoff_state, dict)
        return ImportTask(
            **ids,
            prompt_token_ids=[int(t) for t in req.prompt_token_ids],
            max_tokens=int(req.max_tokens),
            output_token_ids=[int(t) for t in req.output_token_ids],
            state=req.handoff_state,
            sampling=req.sampling,
        )
    return DecodeTask(**ids)


# ---- worker -> engine --------------------------------------------------------------------
class StepResult(Message):
    """What rank 0 reports of a step besides its tokens (``N`` slots, ``K`` drafts).

    Attributes:
        stop_flags: ``[N]``, the slots that are free after the step.
        decode_lens: ``[N]``, tokens each slot feeds next step.
        drafts: ``[N, K]``, the drafts verified this step.
        decode_mask: ``[N]``, the slots that decoded this step (not prefill).
        num_tokens: tokens in the step's target forward.
        exports: slot -> its state, for the slots the step listed in ``export``.
        logprobs: slot -> one :class:`TokenLogprob` per emitted token, for the slots whose
            requests asked.
        draft_logprobs: slot -> the MTP drafts verified this step with their log-probabilities,
            for the slots whose requests asked (``include_draft_logprobs``).
        guided_checked / guided_cut / guided_seconds: the step's grammar work (drafts of
            constrained requests checked / cut before verification, host seconds).
        draft_methods: ``[N]``, the method code of each slot's verified drafts (-1: none).
        guided_forced / guided_forced_accepted: of the drafts verified, those the grammar
            forced / of those, the accepted ones.
        mtp_unseen: ``[N]``, the slots whose rows the MTP layer never takes (empty: none).
    """

    stop_flags: list[bool]
    decode_lens: list[int]
    drafts: list[list[int]]
    decode_mask: list[bool]
    num_tokens: int
    exports: dict[int, dict[str, Any]] = {}
    logprobs: dict[int, list[TokenLogprob]] = {}
    draft_logprobs: dict[int, list[TokenLogprob]] = {}
    guided_checked: int = 0
    guided_cut: int = 0
    guided_seconds: float = 0.0
    draft_methods: list[int] = []
    guided_forced: int = 0
    guided_forced_accepted: int = 0
    mtp_unseen: list[bool] = []

    @classmethod
    def of(cls, out: StepOutput, decode_lens: np.ndarray) -> StepResult:
        """Rank 0's report of step ``out`` (``decode_lens [N]``: the runner's, after the step)."""
        return cls(
            stop_flags=out.stop_flags.astype(bool).tolist(),
            decode_lens=decode_lens.astype(int).tolist(),
            drafts=out.drafts.astype(int).tolist(),
            decode_mask=out.decode_mask.astype(bool).tolist(),
            num_tokens=int(out.num_tokens),
            exports=dict(out.exports),
            logprobs=dict(out.logprobs),
            draft_logprobs=dict(out.draft_logprobs),
            guided_checked=int(out.guided.checked),
            guided_cut=int(out.guided.cut),
            guided_seconds=float(out.guided.seconds),
            draft_methods=out.draft_methods.astype(int).tolist(),
            guided_forced=int(out.guided.forced),
            guided_forced_accepted=int(out.guided.forced_accepted),
            mtp_unseen=out.mtp_unseen.astype(bool).tolist(),
        )


class Ready(Versioned):
    type: Literal["ready"] = "ready"
    rank: int
    pid: int


class Done(Versioned):
    type: Literal["done"] = "done"
    step: int
    rank: int
    result: StepResult | None = None  # rank 0's


class Failed(Versioned):
    """A step raised (``step``: ``None`` when no step message could be read, or at start-up)."""

    type: Literal["error"] = "error"
    step: int | None
    rank: int
    message: str


WorkerMessage = Annotated[Ready | Done | Failed, Field(discriminator="type")]

_ENGINE_MESSAGE: TypeAdapter[Step | Shutdown] = TypeAdapter(EngineMessage)
_WORKER_MESSAGE: TypeAdapter[Ready | Done | Failed] = TypeAdapter(WorkerMessage)

M = TypeVar("M")


def _decode(adapter: TypeAdapter[M], payload: bytes, sender: str) -> M:
    try:
        msg = adapter.validate_json(payload)
    except ValidationError as exc:
        try:  # a message of another version is refused as such, not field by field
            raw = json.loads(payload)
        except ValueError:
            raw = None
        if isinstance(raw, dict):
            check_version(raw.get("version"), sender)
        raise refusal(exc, f"message from {sender}") from None
    assert isinstance(msg, Versioned)
    check_version(msg.version if "version" in msg.model_fields_set else None, sender)
    return msg


def decode_engine_message(payload: bytes, sender: str = "the engine") -> Step | Shutdown:
    """A worker's receipt of the engine's ``payload`` (raises :class:`MessageError`)."""
    return _decode(_ENGINE_MESSAGE, payload, sender)


def decode_worker_message(payload: bytes, sender: str = "a worker") -> Ready | Done | Failed:
    """The engine's receipt of a worker's ``payload`` (raises :class:`MessageError`)."""
    return _decode(_WORKER_MESSAGE, payload, sender)
