"""Every message between the processes of a deployment, as typed classes (protocol version
:data:`PROTOCOL_VERSION`).

JSON is the encoding, never pickle: the engine's worker socket is a loopback TCP port another
local process could reach, and the splitwise endpoints are HTTP. A message is validated
once, where it is received (:func:`decode_engine_message`, :func:`decode_worker_message`,
:func:`decode_http`): the bytes become one of these objects or a :class:`MessageError`
naming what is wrong; the code after that reads attributes.

The classes are pydantic v2 models: validation runs in pydantic-core (compiled), straight
from the JSON bytes (``validate_json``, no ``json.loads`` first), so the per-step messages
(a few lists of ``N`` or ``N*K`` ints) cost some microseconds against a step of
milliseconds; msgspec would be faster still but is not a dependency, and dataclasses
through a ``TypeAdapter`` validate at the same speed with no gain. ``SamplingParams`` and
``TokenLogprob`` (stdlib dataclasses) are validated field by field as they are.

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

Router <-> splitwise instances (HTTP): :class:`PrefillRequest` -> :class:`PrefillAnswer`,
:class:`DecodeRequest` -> an event stream of :class:`TokensEvent`, then :class:`FinishEvent`
(or an :class:`ErrorMessage`), then ``[DONE]``. Their bodies keep the shape clients of the
instances see; the version travels in the :data:`VERSION_HEADER` of the request (the
instance answers 400 naming both versions) and of a 200 answer (the router answers 502).
The events of a decode stream belong to the answer whose header named the version. The
``handoff`` a prefill instance answers is opaque to the router (passed on unchanged); the
decode instance reads it as a :class:`HandoffMessage`. Errors use OpenAI's shape
(:class:`ErrorMessage`), which is not versioned.

The cache manager exchanges no message: it raises ``cache_ready_signal`` (shared memory,
:mod:`fastdeploy_mtp.ipc`) once the caches are published, and its exit status tells the
engine the rest.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ..runtime.request import Request, RequestType
from ..runtime.sampling_params import SamplingParams, TokenLogprob

if TYPE_CHECKING:
    import numpy as np

    from ..runtime.target_runner import StepOutput

PROTOCOL_VERSION = 2
#: HTTP header that carries the protocol version of a splitwise request or answer.
VERSION_HEADER = "X-FastDeploy-MTP-Protocol"


#: The splitwise endpoints of a prefill and a decode instance.
PREFILL_PATH = "/v1/splitwise/prefill"
DECODE_PATH = "/v1/splitwise/decode"


class MessageError(ValueError):
    """A message this process cannot read: malformed, or of another protocol version.

    Attributes:
        field: the first field at fault (dotted path), when one is.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def check_version(got: object, sender: str) -> None:
    """Raises :class:`MessageError` unless ``got`` (a message's version) is :data:`PROTOCOL_VERSION`."""
    if got is None:
        raise MessageError(
            f"{sender} sent no protocol version; this process speaks version {PROTOCOL_VERSION}"
        )
    if got != PROTOCOL_VERSION:
        raise MessageError(
            f"{sender} speaks protocol version {got!r}; this process speaks version {PROTOCOL_VERSION}"
        )


def check_header_version(value: str | None, sender: str) -> None:
    """:func:`check_version` of an HTTP :data:`VERSION_HEADER` value (``None``: absent)."""
    try:
        got: object = None if value is None else int(value)
    except ValueError:
        got = value
    check_version(got, sender)


def version_headers() -> dict[str, str]:
    """The HTTP headers a splitwise request or 200 answer carries."""
    return {VERSION_HEADER: str(PROTOCOL_VERSION)}


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def encode(self) -> bytes:
        """The JSON bytes on the wire."""
        return self.model_dump_json().encode()


class _Versioned(_Message):
    version: int = PROTOCOL_VERSION


# ---- engine -> worker --------------------------------------------------------------------
class _TaskBase(_Message):
    idx: int
    request_id: str
    block_tables: list[int]


class PrefillTask(_TaskBase):
    """One chunk ``[start, end)`` of a prompt; the request's first chunk also carries
    ``prompt_token_ids`` and ``sampling`` (the worker starts a new request in the slot)."""

    type: Literal["PREFILL"] = "PREFILL"
    start: int
    end: int
    max_tokens: int
    output_token_ids: list[int]
    prompt_token_ids: list[int] | None = None
    sampling: SamplingParams | None = None


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


class Step(_Versioned):
    type: Literal["step"] = "step"
    step: int
    free: list[int] = []
    abort: list[int] = []
    tasks: list[Task] = []
    export: list[int] = []


class Shutdown(_Versioned):
    type: Literal["shutdown"] = "shutdown"


EngineMessage = Annotated[Step | Shutdown, Field(discriminator="type")]


def task_message(req: Request, first_chunk: bool) -> Task:
    """The wire form of a scheduled task (a prefill's first chunk carries the prompt and sampling)."""
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
class StepResult(_Message):
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
        )


class Ready(_Versioned):
    type: Literal["ready"] = "ready"
    rank: int
    pid: int


class Done(_Versioned):
    type: Literal["done"] = "done"
    step: int
    rank: int
    result: StepResult | None = None  # rank 0's


class Failed(_Versioned):
    """A step raised (``step``: ``None`` when no step message could be read, or at start-up)."""

    type: Literal["error"] = "error"
    step: int | None
    rank: int
    message: str


WorkerMessage = Annotated[Ready | Done | Failed, Field(discriminator="type")]

_ENGINE_MESSAGE: TypeAdapter[Step | Shutdown] = TypeAdapter(EngineMessage)
_WORKER_MESSAGE: TypeAdapter[Ready | Done | Failed] = TypeAdapter(WorkerMessage)

M = TypeVar("M")
B = TypeVar("B", bound=BaseModel)


def _refusal(exc: ValidationError, what: str) -> MessageError:
    """The :class:`MessageError` of a failed validation: its first error, the field it names."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    detail = f"{where}: {first['msg']}" if where else str(first["msg"])
    return MessageError(f"malformed {what}: {detail}{more}", where or None)


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
        raise _refusal(exc, f"message from {sender}") from None
    assert isinstance(msg, _Versioned)
    check_version(msg.version if "version" in msg.model_fields_set else None, sender)
    return msg


def decode_engine_message(payload: bytes, sender: str = "the engine") -> Step | Shutdown:
    """A worker's receipt of the engine's ``payload`` (raises :class:`MessageError`)."""
    return _decode(_ENGINE_MESSAGE, payload, sender)


def decode_worker_message(payload: bytes, sender: str = "a worker") -> Ready | Done | Failed:
    """The engine's receipt of a worker's ``payload`` (raises :class:`MessageError`)."""
    return _decode(_WORKER_MESSAGE, payload, sender)


# ---- router <-> splitwise instances (HTTP) -------------------------------------------------
class PrefillRequest(_Message):
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    sampling: SamplingParams | None = None  # None: greedy


class DecodeRequest(PrefillRequest):
    output_token_ids: list[int]
    handoff: dict[str, Any]  # the prefill instance's, unchanged (a :class:`HandoffMessage`)


class HandoffMessage(_Message):
    """A prefill instance's hand-over: the slot state (:mod:`fastdeploy_mtp.splitwise.handoff`),
    the KV descriptor (``KVSource.offer``, versioned by :mod:`fastdeploy_mtp.splitwise`) and
    the prefill instance's ``signature`` over both, the request id, its prompt and first
    tokens (:func:`~fastdeploy_mtp.splitwise.handoff.sign_handoff`)."""

    state: dict[str, Any]
    kv: dict[str, Any]
    signature: str


class PrefillAnswer(_Message):
    """``output_logprobs``: one per output token when the request asked for logprobs;
    ``draft_token_ids``: the first drafts (informational, they also travel in the state);
    ``handoff``: ``None`` iff ``finished``."""

    request_id: str
    output_token_ids: list[int]
    output_logprobs: list[TokenLogprob] | None = None
    draft_token_ids: list[int] = []
    finished: bool
    finish_reason: str | None = None
    handoff: dict[str, Any] | None = None


class TokensEvent(_Message):
    """A decode stream's tokens of one step (``logprobs``: one per id, when asked)."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None


class FinishEvent(_Message):
    finish_reason: str


class ErrorDetail(BaseModel):
    """OpenAI's error object (other keys are ignored: the shape is OpenAI's, not ours)."""

    message: str
    type: str = "server_error"
    param: str | None = None
    code: int | str | None = None  # our status code, or OpenAI's name (``invalid_api_key``)


class ErrorMessage(_Message):
    """OpenAI's error body, also a decode stream's last event when it fails."""

    error: ErrorDetail


DecodeEvent = TokensEvent | FinishEvent | ErrorMessage
_DECODE_EVENT: TypeAdapter[DecodeEvent] = TypeAdapter(DecodeEvent)


def decode_http(model: type[B], payload: bytes | str, sender: str) -> B:
    """``payload`` (an HTTP body) as ``model`` (raises :class:`MessageError`; the version was
    checked on the headers)."""
    try:
        return model.model_validate_json(payload)
    except ValidationError as exc:
        raise _refusal(exc, f"message from {sender}") from None


def decode_event(data: str, sender: str) -> DecodeEvent:
    """One ``data:`` of a decode stream (not ``[DONE]``; raises :class:`MessageError`)."""
    try:
        return _DECODE_EVENT.validate_json(data)
    except ValidationError as exc:
        raise _refusal(exc, f"event from {sender}") from None
