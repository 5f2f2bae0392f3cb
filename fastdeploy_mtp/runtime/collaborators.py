"""The reference engine's collaborators, as interfaces it defines and others implement.

The engine sits below the proposers, the splitwise hand-over and serving: it never imports
them. What it needs of them is declared here and handed in through the constructors by the
composition layer (:mod:`fastdeploy_mtp.assembly`):

* :class:`Runner`: one worker's target step and proposer round (in-process
  :class:`~fastdeploy_mtp.runtime.target_runner.TargetRunner`, or serving's worker processes);
* :class:`Proposer` and :class:`ProposerFactory`: the drafting method the runner drives (the
  proposers of :mod:`fastdeploy_mtp.proposer`);
* :class:`SlotHandover` and :class:`HandoffError`: how a slot's state crosses from a prefill to
  a decode instance (:mod:`fastdeploy_mtp.splitwise.handoff`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import paddle

    from ..config import FDConfig
    from ..models.cache_spec import CacheSpec
    from ..models.interfaces import MTPModel, TargetModel
    from .guided import GuidedSlots
    from .input_batch import InputBatch
    from .request import Request
    from .sampling_params import TokenLogprob
    from .step_output import StepOutput


class HandoffError(ValueError):
    """A handed-off slot state that does not fit this engine (names the buffer)."""


class Runner(Protocol):
    """What :class:`~fastdeploy_mtp.runtime.engine.Engine` drives: one worker's target step
    and proposer round, here in-process
    (:class:`~fastdeploy_mtp.runtime.target_runner.TargetRunner`) or in worker processes
    (:class:`fastdeploy_mtp.serving.processes.remote_runner.RemoteRunner`)."""

    vocab_size: int

    def decode_lens(self) -> np.ndarray:
        """``[N]`` tokens each slot feeds if it decodes next step (the target's
        ``seq_lens_this_time`` after the proposer)."""
        ...

    def check_task(self, req: Request) -> None:
        """Raise :class:`~fastdeploy_mtp.runtime.request.InvalidRequestError` if ``req``'s
        task cannot reach the model (see
        :func:`~fastdeploy_mtp.runtime.request.check_prefill_task`)."""
        ...

    def insert_tasks(self, tasks: Sequence[Request]) -> None:
        """Load this step's tasks (prefill chunks, block-table updates)."""
        ...

    def execute(self) -> StepOutput:
        """One target step + proposer round; what it emitted, on the host."""
        ...

    def free_slot(self, idx: int) -> None:
        """Stop a slot whose request finished."""
        ...

    def abort_slot(self, req: Request) -> None:
        """Reset the target and draft state of an aborted request's slot."""
        ...

    def set_exports(self, idxs: Sequence[int]) -> None:
        """Splitwise prefill: have the next :meth:`execute` return these slots' state."""
        ...

    def check_handoff(self, state: object) -> None:
        """Raise :class:`HandoffError` unless a handed-over slot ``state`` fits this runner's
        buffers."""
        ...

    def close(self) -> None: ...


class DraftAlternatives(Protocol):
    """Model-free drafting kept beside a draft model for the draft planner
    (:class:`~fastdeploy_mtp.proposer.alternatives.ModelFreeAlternatives`)."""

    #: the method codes it drafts for (:data:`~fastdeploy_mtp.runtime.draft_methods.METHODS`)
    codes: tuple[int, ...]

    def candidates(self, wanted: np.ndarray | None) -> dict[int, np.ndarray]:
        """This round's candidates ``[N, K]`` int64 (-1 = none) by method code (``wanted``
        ``[N]`` bool: the slots whose costly candidates are needed; None: no candidates this
        round, only the emitted tokens taken in)."""
        ...


class Proposer(Protocol):
    """What :class:`~fastdeploy_mtp.runtime.target_runner.TargetRunner` needs of a proposer.

    A proposer runs once per engine step, after the target's verification and status update
    (:meth:`run`), and leaves the next step's drafts in the target's ``share_inputs``:
    ``draft_tokens[b, 1:]`` (``[N, K]`` int64, -1 = none) and ``seq_lens_this_time[b]``
    (int32: 1 + the number of drafts of a decoding slot, 0 for a stopped one).

    Attributes:
        max_draft_token_num: ``K``, the most drafts per slot and round.
        num_model_steps: draft-model forwards per round (0 for the model-free methods).
        model_inputs: the proposer's own per-slot draft state, which a splitwise hand-over
            carries with the slot; ``None`` when it keeps none.
        caches / cache_specs: the proposer's KV caches and what they hold (empty without a
            draft model).
        model_seconds: seconds in draft-model forwards since the runner last reset it.
        seq_len_bound / rows_bound / overlap_round: per-round bounds the runner sets before
            :meth:`run` (see :class:`~fastdeploy_mtp.proposer.MTPProposer`); model-free
            proposers ignore them.
        excluded: ``[N]`` bool, the slots a draft model leaves alone (the draft planner admitted
            their requests without it; the runner sets the planner's array), or None.
        alternatives: the model-free methods the draft planner may give a request instead of
            the draft model (:class:`DraftAlternatives`), or None.
    """

    max_draft_token_num: int
    num_model_steps: int
    model_inputs: Any
    caches: list[paddle.Tensor]
    cache_specs: list[CacheSpec]
    model_seconds: float
    seq_len_bound: int | None
    rows_bound: int | None
    overlap_round: bool
    excluded: np.ndarray | None

    @property
    def alternatives(self) -> DraftAlternatives | None: ...

    def insert_tasks_v1(self, req_dicts: Sequence[Request], num_running_requests: int = 0) -> None:
        """Set up the slots of this step's prefill chunks (and stop aborted ones)."""
        ...

    def forget_slot(self, idx: int) -> None:
        """Drop what the proposer keeps for slot ``idx`` (its request finished or was replaced)."""
        ...

    def run(
        self, full_hidden_states: paddle.Tensor, *, real_bsz: int = 0, num_steps: int | None = None
    ) -> None:
        """Write the next step's drafts and token counts into the target's buffers
        (``full_hidden_states``: ``[T, H]``, the target's hidden rows of this step)."""
        ...

    def skip_round(
        self, full_hidden_states: paddle.Tensor, step: StepOutput, rows_start: np.ndarray
    ) -> None:
        """A round without drafts after ``step`` (adaptive draft length; only the MTP proposer
        supports it); ``rows_start`` ``[N]``: each slot's first row in the hidden states."""
        ...

    def clear_mtp_cache(self) -> None:
        """Release the proposer's caches (nothing without a draft model)."""
        ...


@runtime_checkable
class DraftLogprobs(Protocol):
    """A proposer's sampler that keeps its drafts' log-probabilities for the slots in
    :attr:`wanted` (the MTP layer's: :class:`~fastdeploy_mtp.proposer.sampler.MTPSampler`)."""

    wanted: set[int]

    def verified(self, drafts: np.ndarray, slots: list[int]) -> dict[int, list[TokenLogprob]]:
        """For each of ``slots``: the drafts of ``drafts`` ``[N, K]`` (the ones a step just
        verified) that the sampler proposed, with their log-probabilities."""
        ...


#: Builds the proposer of ``fd_config.speculative_config.method`` over the target's buffers
#: (``None`` without speculation); arguments ``(fd_config, main_model, target_model_inputs,
#: num_blocks, mtp_model, guided)``: a draft model gets ``mtp_model``, KV caches of
#: ``num_blocks`` blocks and the runner's grammar matchers ``guided``.
ProposerFactory: TypeAlias = (
    "Callable[[FDConfig, TargetModel, InputBatch, int, MTPModel | None, GuidedSlots | None], "
    "Proposer | None]"
)


class SlotHandover(Protocol):
    """How a slot's state leaves a prefill instance and enters a decode instance. The state is
    JSON; ``target`` is the runner's ``share_inputs``, ``draft`` the proposer's
    ``model_inputs`` (``None`` without one). Every failure is a :class:`HandoffError`."""

    def export_slot(self, target: Any, draft: Any | None, idx: int) -> dict[str, Any]:
        """Slot ``idx``'s state, read from the buffers."""
        ...

    def check_slot_state(
        self, state: object, target: Any, draft: Any | None, vocab_size: int | None = None
    ) -> object:
        """Raise :class:`HandoffError` unless ``state`` fits these buffers."""
        ...

    def import_slot(self, state: object, target: Any, draft: Any | None, idx: int) -> None:
        """Write ``state`` (checked first) into slot ``idx`` of the buffers."""
        ...

    def slot_tokens(self, state: object) -> int:
        """Tokens the handed-over slot feeds in its first decode step."""
        ...

    def sampling_mismatch(
        self, state: object, sampling: Any, request_id: str, max_tokens: int
    ) -> str | None:
        """``None`` if ``state`` was loaded with the request's sampling parameters, else which
        field differs."""
        ...
