"""The proposer interface the target runner drives, and the one factory that picks the
proposer of ``speculative_config.method``.

A proposer runs once per engine step, after the target's verification and status update
(:meth:`Proposer.run`), and leaves the next step's drafts in the target's ``share_inputs``:
``draft_tokens[b, 1:]`` (``[N, K]`` int64, -1 = none) and ``seq_lens_this_time[b]`` (int32:
1 + the number of drafts of a decoding slot, 0 for a stopped one). Methods:

* ``"mtp"``: :class:`~fastdeploy_mtp.proposer.MTPProposer` (the MTP layer, with its own KV
  caches and draft state ``model_inputs``);
* ``"ngram"``, ``"suffix"``, ``"naive"``: the model-free proposers of
  :mod:`~fastdeploy_mtp.proposer.model_free` and :mod:`~fastdeploy_mtp.proposer.suffix`, which
  have no caches and no draft state of their own (``model_inputs is None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import paddle

    from ..config import FDConfig
    from ..models.cache_spec import CacheSpec
    from ..models.interfaces import MTPModel, TargetModel
    from ..runtime.input_batch import InputBatch
    from ..runtime.request import Request


class Proposer(Protocol):
    """What :class:`~fastdeploy_mtp.runtime.target_runner.TargetRunner` needs of a proposer.

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

    def insert_tasks_v1(self, req_dicts: Sequence[Request], num_running_requests: int = 0) -> None:
        """Set up the slots of this step's prefill chunks (and stop aborted ones)."""
        ...

    def forget_slot(self, idx: int) -> None:
        """Drop what the proposer keeps for slot ``idx`` (its request finished or was replaced)."""
        ...

    def run(
        self,
        full_hidden_states: paddle.Tensor,
        step_use_cudagraph: bool = False,
        is_dummy_run: bool = False,
        real_bsz: int = 0,
        num_steps: int | None = None,
    ) -> None:
        """Write the next step's drafts and token counts into the target's buffers."""
        ...

    def skip_round(
        self,
        full_hidden_states: paddle.Tensor,
        accept_tokens: np.ndarray,
        accept_num: np.ndarray,
        rows_start: np.ndarray,
        decoding: np.ndarray,
    ) -> None:
        """A round without drafts (adaptive draft length; only the MTP proposer supports it)."""
        ...

    def clear_mtp_cache(self) -> None:
        """Release the proposer's caches (nothing without a draft model)."""
        ...


def make_proposer(
    fd_config: FDConfig,
    main_model: TargetModel,
    target_model_inputs: InputBatch,
    num_blocks: int,
    mtp_model: MTPModel | None = None,
) -> Proposer | None:
    """The proposer of ``fd_config.speculative_config.method`` over the target's
    ``share_inputs`` (``None`` without speculation). The MTP proposer gets ``mtp_model`` and
    its KV caches of ``num_blocks`` blocks (created or attached); the model-free proposers
    ignore both.

    Raises:
        ValueError: an unknown method, or ``"mtp"`` without ``mtp_model``.
    """
    method = fd_config.speculative_config.method
    if method is None:
        return None
    if method == "mtp":
        from .mtp import MTPProposer

        pc = fd_config.parallel_config
        proposer = MTPProposer(
            fd_config, main_model, pc.local_rank, pc.device_id, target_model_inputs, model=mtp_model
        )
        proposer.initialize_kv_cache(num_blocks)
        return proposer
    if method == "ngram":
        from .model_free import NgramProposer

        return NgramProposer(fd_config, target_model_inputs)
    if method == "suffix":
        from .suffix import SuffixProposer

        return SuffixProposer(fd_config, target_model_inputs)
    if method == "naive":
        from .model_free import NaiveProposer

        return NaiveProposer(fd_config, target_model_inputs)
    raise ValueError(f"speculative_config.method {method!r} has no proposer")
