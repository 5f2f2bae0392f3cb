"""Requests as the runner and the proposer see them (FastDeploy's attribute names), and the
errors the reference engine reports about them."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..constants import NO_SLOT
from .sampling_params import SamplingParams, StepDrafts, TokenLogprob


class RequestType(enum.Enum):
    """What a scheduled task asks of a slot this step."""

    PREFILL = 0  # a chunk of the prompt: [prefill_start_index, prefill_end_index)
    DECODE = 1  # keep decoding (only the block table may have changed)
    ABORT = 2  # free the slot
    IMPORT = 3  # splitwise decode: load a slot handed over by a prefill instance, then decode


class InvalidRequestError(ValueError):
    """A request the engine refuses: at submission (nothing of the call is queued), or found
    invalid just before its data would reach the model (it is aborted, the others go on).

    Attributes:
        request_id: the refused request's id (``None`` where the object is not a request).
        field: the offending attribute, e.g. ``"prompt_token_ids"`` or ``"max_tokens"``.
    """

    def __init__(self, request_id: object, field: str, message: str):
        self.request_id = request_id
        self.field = field
        where = "submitted item" if request_id is None else f"request {request_id!r}"
        super().__init__(
            f"{where}: {message}" if field == "request" else f"{where}: `{field}` {message}"
        )


class GenerationError(RuntimeError):
    """Raised by :meth:`~fastdeploy_mtp.runtime.engine.Engine.generate` after its loop when
    some requests were aborted (or the loop had to stop); every other request ran to the end.

    Attributes:
        results: generated ids per ``request_id`` of the requests that finished.
        failures: the error per ``request_id`` of the requests that were aborted (also set
            as their :attr:`Request.error`).
    """

    def __init__(
        self, results: dict[str, list[int]], failures: Mapping[str, BaseException], reason: str = ""
    ):
        self.results = results
        self.failures = dict(failures)
        listed = "; ".join(f"{rid!r}: {err}" for rid, err in self.failures.items())
        head = f"{reason}; " if reason else ""
        super().__init__(
            f"generate: {head}{len(self.failures)} request(s) aborted ({listed}); "
            f"the {len(results)} finished request(s) are in `.results`"
        )


def check_token_ids(
    request_id: object, ids: Sequence[int], vocab_size: int, offset: int = 0
) -> None:
    """Raise :class:`InvalidRequestError` unless ``ids`` are integers in ``[0, vocab_size)``
    (``offset``: index of ``ids[0]`` in the prompt, for the message)."""
    try:
        arr = np.asarray(ids)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidRequestError(
            request_id, "prompt_token_ids", f"is not a sequence of token ids ({exc})"
        ) from None
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise InvalidRequestError(
            request_id,
            "prompt_token_ids",
            f"must be a flat sequence of integer token ids, got dtype {arr.dtype}, "
            f"shape {list(arr.shape)}",
        )
    bad = np.nonzero((arr < 0) | (arr >= vocab_size))[0]
    if bad.size:
        i = int(bad[0])
        raise InvalidRequestError(
            request_id,
            f"prompt_token_ids[{offset + i}]",
            f"= {int(arr[i])} is not a token id: must be in [0, {vocab_size}) (the model's "
            "vocab_size)",
        )


@dataclass
class RequestTiming:
    """When a served request passed each stage, in seconds of ``time.monotonic()`` (``None``:
    not yet). Written by :class:`~fastdeploy_mtp.serving.metrics.latency.LatencyTracker` on the API
    server's engine thread; the engine never reads it.

    Attributes:
        arrival: the engine client received the request (``AsyncEngine.submit``).
        tokens_at_arrival: output tokens it arrived with (a splitwise decode instance's
            handed-over request brings the prefill instance's first token(s); 0 otherwise).
        scheduled: the start of the engine step whose scheduling placed it in a slot.
        first_token: the end of the first step that gave it an output token on this
            instance (when the token is generated, whether or not stop-string hold-back
            delays its streaming).
        tokens_at_first: its output tokens right after that step.
        finished: the end of the step it finished in (stop or length), or was handed off in.
    """

    arrival: float
    tokens_at_arrival: int = 0
    scheduled: float | None = None
    first_token: float | None = None
    tokens_at_first: int = 0
    finished: float | None = None


@dataclass
class Request:
    """One generation request.

    A ``Request`` object is used once: the engine fills in its slot, outputs and state, and
    refuses it if it is submitted again (to run the same prompt again, submit
    :meth:`fresh_copy`). What a submission checks is listed in
    :meth:`~fastdeploy_mtp.runtime.scheduler.Scheduler.validate`.

    Attributes:
        request_id: caller's id (a ``str``, unique among the requests queued or running).
        prompt_token_ids: the prompt (copied to a ``list[int]`` when it is queued).
        max_tokens: most tokens to generate (FastDeploy's ``max_dec_len``).
        arrival_step: the engine step at which the request becomes visible (for tests and
            benchmarks with staggered arrivals; 0 = from the start).
        idx: the slot it occupies (set by the scheduler; ``NO_SLOT`` until then).
        output_token_ids: tokens generated so far.
        prefill_start_index / prefill_end_index: the prompt chunk of the current task.
        task_type: :class:`RequestType` of the current task.
        block_tables: KV block ids of the slot, in order.
        finished: the request left the engine (it completed, or it was aborted).
        error: why it was aborted (``None`` when it completed).
        submitted: set when the request is queued (a submitted request is not accepted again).
        handoff_state: on a splitwise decode instance, the slot state the prefill instance
            handed over (:meth:`~fastdeploy_mtp.runtime.collaborators.SlotHandover.export_slot`);
            ``None`` for a request that starts from its prompt.
        sampling: how it picks tokens
            (:class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams`; the default is
            greedy).
        finish_reason: once it completed: ``"stop"`` (an EOS id, a stop token id or a stop
            string) or ``"length"`` (``max_tokens``, or ``max_model_len``).
        output_logprobs: with ``sampling.logprobs`` set, one
            :class:`~fastdeploy_mtp.runtime.sampling_params.TokenLogprob` per output token.
        emitted_count: how many of ``output_token_ids`` were handed out in
            ``StepEvents.emitted`` (tokens whose text could begin a stop string are held back
            until it is clear they do not; an event's tokens are
            ``output_token_ids[emitted_count - len(tokens) : emitted_count]`` right after its step).
        output_draft_logprobs: with ``sampling.include_draft_logprobs``, one
            :class:`~fastdeploy_mtp.runtime.sampling_params.StepDrafts` per step that verified
            MTP drafts, in step order.
        num_cached_tokens: prompt tokens whose KV (target and MTP layers) came from the
            prefix cache when the request was admitted (a multiple of the block size; 0
            without a hit). Its first prefill chunk starts there.
        prefix_without_mtp: its prefix-cache hit came from the chain of blocks without MTP
            KV (prompts the MTP layer never saw): the MTP layer does not see it either.
        cache_namespace: the prefix-cache namespace: the request shares KV blocks only with
            requests of the same namespace (``b""``: the global one; the server derives it
            from the client's API key and ``cache_salt``, see :mod:`fastdeploy_mtp.tenancy`).
        timing: when a served request passed each stage (:class:`RequestTiming`; set by the
            API server's engine client, ``None`` for a request the engine runs directly).
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
    error: BaseException | None = field(default=None, init=False)
    submitted: bool = field(default=False, init=False, repr=False)
    handoff_state: dict[str, Any] | None = field(default=None, repr=False)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cache_namespace: bytes = b""
    finish_reason: str | None = field(default=None, init=False)
    output_logprobs: list[TokenLogprob] = field(default_factory=list, init=False, repr=False)
    emitted_count: int = field(default=0, init=False, repr=False)
    output_draft_logprobs: list[StepDrafts] = field(default_factory=list, init=False, repr=False)
    num_cached_tokens: int = field(default=0, init=False)
    prefix_without_mtp: bool = field(default=False, init=False)
    timing: RequestTiming | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.prompt_token_ids) == 0:
            raise ValueError(f"request {self.request_id!r}: `prompt_token_ids` is empty")
        if self.max_tokens <= 0:
            raise ValueError(
                f"request {self.request_id!r}: `max_tokens` must be > 0, got {self.max_tokens}"
            )

    def fresh_copy(self) -> Request:
        """A new, never-submitted request with the same id, prompt, ``max_tokens``,
        ``arrival_step``, sampling parameters and prefix-cache namespace (no slot, no
        outputs)."""
        return Request(
            self.request_id,
            list(self.prompt_token_ids),
            max_tokens=self.max_tokens,
            arrival_step=self.arrival_step,
            sampling=SamplingParams.from_dict(self.sampling.to_dict()),
            cache_namespace=self.cache_namespace,
        )

    def get(self, key: str, default: Any | None = None) -> Any:
        """Dict-style access, as FastDeploy's ``Request.get``."""
        return getattr(self, key, default)

    @property
    def is_first_chunk(self) -> bool:
        """The task is the first prefill chunk of the request: it starts at position 0, or
        right after the blocks a prefix-cache hit gave it (``num_cached_tokens``)."""
        return (
            self.task_type == RequestType.PREFILL
            and self.prefill_start_index == self.num_cached_tokens
        )

    @property
    def is_final_chunk(self) -> bool:
        return self.prefill_end_index >= len(self.prompt_token_ids)


def check_prefill_task(req: Request, max_model_len: int, vocab_size: int) -> None:
    """Raise :class:`InvalidRequestError` if what a runner would load for ``req`` cannot reach
    the model: a prefill chunk outside the prompt, a prompt that no longer fits
    ``max_model_len``, or token ids outside ``[0, vocab_size)`` in the chunk (and the next
    prompt token, which the chunk's fix-up and the MTP layer read). Submission checks the
    same; this catches a request changed after it was queued, before it can poison a step
    shared with others."""
    if req.task_type != RequestType.PREFILL:
        return
    prompt = req.prompt_token_ids
    start, end = req.prefill_start_index, req.prefill_end_index
    if not 0 <= start < end <= len(prompt) or len(prompt) >= max_model_len:
        raise InvalidRequestError(
            req.request_id,
            "prompt_token_ids",
            f"changed after submission: chunk [{start}, {end}) of a {len(prompt)}-token prompt "
            f"(max_model_len {max_model_len})",
        )
    check_token_ids(req.request_id, list(prompt[start : end + 1]), vocab_size, offset=start)
