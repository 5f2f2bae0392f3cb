"""Proposers without a draft model: ``"naive"`` (no drafts) and ``"ngram"`` (FastDeploy's
``ngram_match`` op), and their common base (also that of
:class:`~fastdeploy_mtp.proposer.suffix.SuffixProposer`).

They write the target's ``share_inputs`` directly (``draft_tokens`` ``[N, K+1]`` int64,
``seq_lens_this_time`` ``[N]`` int32) and keep no KV caches and no draft state of their own.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np
import paddle

from .. import ops
from ..config import FDConfig
from ..constants import PLACEHOLDER_TOKEN_ID
from ..models.cache_spec import CacheSpec
from ..runtime.input_batch import InputBatch
from ..runtime.request import Request
from ..runtime.spec_step import PaddleBackend, postprocess
from ..runtime.step_output import StepOutput
from .round_entry import RoundEntry


class ModelFreeProposer(RoundEntry):
    """The parts of :class:`~fastdeploy_mtp.runtime.collaborators.Proposer` every model-free
    method shares: no caches, no draft state, no model time. A round writes the method's
    drafts (:meth:`write_drafts`) and ends with ``draft_model_postprocess``.

    Args:
        fd_config: serving config; ``speculative_config.num_speculative_tokens`` is ``K``.
        target_model_inputs: the target runner's ``share_inputs``, written in place.
    """

    def __init__(self, fd_config: FDConfig, target_model_inputs: InputBatch):
        self.fd_config = fd_config
        self.target_model_inputs = target_model_inputs
        self.max_draft_token_num = fd_config.speculative_config.num_speculative_tokens
        self.num_model_steps = 0
        self.model_inputs: None = None
        self.caches: list[paddle.Tensor] = []
        self.cache_specs: list[CacheSpec] = []
        self.model_seconds = 0.0
        self.seq_len_bound: int | None = None
        self.rows_bound: int | None = None
        self.overlap_round = False
        self.excluded: np.ndarray | None = None
        self.alternatives: None = None
        self._ops = PaddleBackend()

    def insert_tasks_v1(self, req_dicts: Sequence[Request], num_running_requests: int = 0) -> None:
        """Nothing to set up: every input the method reads is in the target's buffers."""

    def forget_slot(self, idx: int) -> None:
        """Nothing is kept per slot."""

    def clear_mtp_cache(self) -> None:
        """No caches to release."""

    def skip_round(
        self, full_hidden_states: paddle.Tensor, step: StepOutput, rows_start: np.ndarray
    ) -> None:
        """Not supported: the config refuses ``adaptive_draft_length`` for model-free methods."""
        method = self.fd_config.speculative_config.method
        raise NotImplementedError(
            f"speculative_config.method {method!r} has no adaptive draft length"
        )

    def propose(
        self, full_hidden_states: paddle.Tensor, real_bsz: int, num_steps: int | None
    ) -> None:
        """The method's drafts, then each slot's next token count (the arguments are the
        draft model's; a model-free round reads only the target's buffers)."""
        self.write_drafts()
        self._finish_round()

    @abstractmethod
    def write_drafts(self) -> None:
        """This round's drafts into the target's ``draft_tokens[:, 1:]``."""

    def _clear_drafts(self) -> None:
        """Empty every slot's draft columns ``draft_tokens[:, 1:]`` (column 0, the last
        accepted token, stays)."""
        self.target_model_inputs.draft_tokens[:, 1:] = PLACEHOLDER_TOKEN_ID

    def _finish_round(self) -> None:
        """``draft_model_postprocess``: a decoding slot feeds its last token and its drafts,
        a stopped slot nothing (a slot that stopped this step still has its cached length,
        so a method may have drafted for it)."""
        postprocess(self._ops, self.target_model_inputs)


class NaiveProposer(ModelFreeProposer):
    """``method == "naive"``: no drafts. Every decoding slot feeds its last token; the target
    still runs the speculative step (verification with nothing to verify, the status update
    over ``K + 1`` wide buffers), so it emits one token per step, as without speculation."""

    def write_drafts(self) -> None:
        """No drafts: clear them."""
        self._clear_drafts()


class NgramProposer(ModelFreeProposer):
    """``method == "ngram"``: FastDeploy's n-gram proposer. ``ngram_match`` runs on the
    target's device buffers: for each decoding slot it takes the newest ``n`` generated tokens
    (``n`` from ``max_ngram_size`` down to 1), finds their leftmost earlier occurrence in the
    prompt (``token_ids_all[b, :prompt_lens[b]]``) or else in the generated tokens, and drafts
    up to ``K`` of the tokens that followed it. ``min_ngram_size`` does not bound the search
    (the op has no such attribute). The op's global token threshold
    (``INFER_WITH_REFERENCE_TOKENUM_THRESHOLD``, default 128) applies as in FastDeploy.

    The runner's history convention differs from the op's by one: after ``n`` generated
    tokens ``step_idx`` is ``n`` (the newest at index ``n - 1``), where the op reads the
    newest at ``step_idx``; it gets ``step_idx - 1`` and ``max_dec_len - 1``, so a slot is
    offered at most as many drafts as it may still emit tokens after its next one.
    """

    def write_drafts(self) -> None:
        """Draft from n-gram matches into the target's buffers."""
        self._clear_drafts()
        target = self.target_model_inputs
        self._match(target.draft_tokens, target.seq_lens_this_time)

    def candidate_rows(self) -> np.ndarray:
        """This round's n-gram drafts ``[N, K]`` int64 on the host (-1 = none), matched into
        copies: the target's buffers are left as they are."""
        target = self.target_model_inputs
        drafts = target.draft_tokens.clone()
        drafts[:, 1:] = PLACEHOLDER_TOKEN_ID
        self._match(drafts, target.seq_lens_this_time.clone())
        return drafts[:, 1:].numpy()

    def _match(self, draft_tokens: paddle.Tensor, seq_lens_this_time: paddle.Tensor) -> None:
        target = self.target_model_inputs
        ops.ngram_match(
            input_ids=target.token_ids_all,
            input_ids_len=target.prompt_lens,
            token_ids_all=target.token_ids_all,
            prompt_lens=target.prompt_lens,
            step_idx=target.step_idx - 1,
            draft_token_num=target.actual_draft_token_num,
            draft_tokens=draft_tokens,
            seq_lens_this_time=seq_lens_this_time,
            seq_lens_encoder=target.seq_lens_encoder,
            seq_lens_decoder=target.seq_lens_decoder,
            max_dec_len=target.max_dec_len - 1,
            max_ngram_size=self.fd_config.speculative_config.max_ngram_size,
            max_draft_tokens=self.max_draft_token_num,
        )
