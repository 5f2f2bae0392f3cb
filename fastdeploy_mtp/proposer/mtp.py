"""``MTPProposer``: runs a model's MTP layer beside the target to draft tokens.

One round (:meth:`MTPProposer.propose`, after the target's verify and status update; the whole
engine step is described in ``docs/architecture.md``). Its op sequence is written once in
:mod:`fastdeploy_mtp.runtime.spec_step`, which the framework-free end-to-end check runs too;
the proposer supplies the MTP side (:meth:`MTPProposer.forward_substep`,
:meth:`MTPProposer.sample_substep`):

1. ``prepare_round``: ``draft_model_preprocess`` builds the draft's shadow state from the
   target's verified state; ``eagle_get_hidden_states`` picks the target hidden rows the MTP
   layer consumes (all prompt rows of a prefill item, the first ``accept_num`` rows of a
   decode item), staged in ``target_hidden_states``.
2. ``propose_substeps``: ``num_model_steps`` substeps of ``speculate_pre_process`` -> MTP
   layer -> ``eagle_gather_hidden_states`` (last row per item) -> logits -> greedy sampler ->
   ``draft_model_update`` (writes the target's draft slot ``s + 1``); the gathered hidden
   rows feed the next substep.
3. ``postprocess`` (``_update_status``): ``draft_model_postprocess`` sets the target's token
   counts for its next forward (a decoding item feeds the non-empty slots of its
   ``draft_tokens`` row, a stopped item 0; prefill items keep theirs).
4. Hybrid mode (``mtp_strategy == "with_ngram"``, ``K > S``): ``hybrid_mtp_ngram`` fills the
   remaining draft slots from n-gram matches in the prompt and history.

The state updates of a round are ops from :mod:`fastdeploy_mtp.ops`; besides them a round only
copies the target's block table (``paddle.assign``), stages hidden rows by slice assignment and
runs the MTP layer and the sampler. All of it runs on whatever device the buffers are on, so
there is one code path for every backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import paddle

from .. import ops
from ..config import FDConfig
from ..constants import PLACEHOLDER_TOKEN_ID
from ..models.cache_spec import CacheSpec
from ..models.interfaces import MTPModel, TargetModel
from ..runtime.input_batch import InputBatch, limit_drafts
from ..runtime.request import Request, RequestType
from ..runtime.spec_step import PaddleBackend, postprocess, prepare_round, propose_substeps
from ..runtime.step_output import StepOutput
from .mtp_caches import MTPCaches
from .mtp_forwards import MTPForwards
from .proposer_inputs import ProposerInputBatch
from .round_entry import RoundEntry
from .sampler import MTPSampler
from .skipped_rounds import SkippedRounds

if TYPE_CHECKING:
    from ..runtime.guided import GuidedSlots
    from .alternatives import ModelFreeAlternatives


def layer_for_substep(substep: int, num_layers: int, schedule: str = "cycle") -> int:
    """The MTP layer substep ``substep`` (0-based) runs: ``substep % num_layers`` under
    ``"cycle"``, ``min(substep, num_layers - 1)`` under ``"repeat_last"``, always 0 under
    ``"first"``."""
    if schedule == "cycle":
        return substep % num_layers
    if schedule == "repeat_last":
        return min(substep, num_layers - 1)
    if schedule == "first":
        return 0
    raise ValueError(f"unknown mtp_layer_schedule {schedule!r}")


class MTPProposer(MTPCaches, MTPForwards, RoundEntry):
    """FastDeploy's MTP proposer surface over the package's ops.

    Args:
        fd_config: serving config (:class:`fastdeploy_mtp.config.FDConfig` or a FastDeploy
            ``FDConfig``); ``speculative_config.method`` must be ``"mtp"``.
        main_model: the target model (kept as ``main_model``, FastDeploy's signature; the
            proposer does not call it: the MTP layer passed as ``model`` already shares its
            embedding and LM head).
        local_rank: this worker's rank (names the IPC caches).
        device_id: this worker's device (names the IPC caches).
        target_model_inputs: the target runner's ``share_inputs``; the proposer shares some of
            its tensors by reference (see :mod:`fastdeploy_mtp.proposer.proposer_inputs`).
        model: keyword-only, the MTP layer (anything satisfying
            :class:`~fastdeploy_mtp.models.interfaces.MTPModel`). FastDeploy builds it from
            ``speculative_config.model``; here the caller passes it, e.g. the one
            :func:`fastdeploy_mtp.models.load_tiny` returns.
        guided: keyword-only, the runner's grammar matchers (structured output): a
            constrained slot drafts under its grammar.
    """

    def __init__(
        self,
        fd_config: FDConfig,
        main_model: TargetModel,
        local_rank: int,
        device_id: int,
        target_model_inputs: InputBatch,
        *,
        model: MTPModel | None = None,
        guided: GuidedSlots | None = None,
    ):
        spec = fd_config.speculative_config
        if spec.method != "mtp":
            raise ValueError(
                f"MTPProposer needs speculative_config.method == 'mtp', got {spec.method!r}"
            )
        if model is None:
            raise ValueError(
                "MTPProposer needs the MTP layer: pass `model=` (e.g. from "
                "fastdeploy_mtp.models.load_tiny())"
            )
        self.fd_config = fd_config
        self.main_model = main_model
        self.model: MTPModel = model
        self.local_rank = local_rank
        self.device_id = device_id
        self.target_model_inputs = target_model_inputs
        self.num_model_steps = spec.num_model_steps
        self.max_draft_token_num = spec.num_speculative_tokens
        self.hybrid_mode = (
            spec.mtp_strategy == "with_ngram" and spec.num_speculative_tokens > spec.num_model_steps
        )
        self.max_model_len = fd_config.model_config.max_model_len
        self.block_size = fd_config.cache_config.block_size
        self.is_splitwise_prefill = fd_config.scheduler_config.splitwise_role == "prefill"
        self.model_inputs = ProposerInputBatch(fd_config, target_model_inputs)
        self.sampler = MTPSampler(fd_config.parallel_config.tensor_parallel_size)
        self.caches: list[paddle.Tensor] = []
        self.cache_specs: list[CacheSpec] = []  # what self.caches hold (set by initialize_kv_cache)
        self._attached: list[str] = []  # IPC names of caches attached from another process
        #: n-gram and suffix candidates for the draft planner (set by the factory), and the
        #: slots it admitted without the MTP layer (``[N]`` bool, the planner's array)
        self.alternatives: ModelFreeAlternatives | None = None
        self.excluded: np.ndarray | None = None
        self._published: list[str] = []  # IPC names of caches this proposer published
        self.num_gpu_blocks = 0
        #: FastDeploy's switch, kept for its interface (substeps use host-known bounds anyway)
        self.enable_overlap = fd_config.scheduler_config.enable_overlap_schedule
        #: Set by the runner before each :meth:`run`: True when no slot is in prefill this
        #: round (FastDeploy's name). Such steady-state rounds build the MTP forwards'
        #: metadata unchecked (``ForwardMeta.check``), so they read nothing back; rounds with
        #: a prefill validate it on the host.
        self.overlap_round = False
        #: distinct MTP layers and the layer each substep runs (``mtp_layer_schedule``)
        self.num_mtp_layers = int(getattr(model, "num_layers", 1))
        self.layer_schedule = [
            layer_for_substep(s, self.num_mtp_layers, spec.mtp_layer_schedule)
            for s in range(self.num_model_steps)
        ]
        #: rows accepted while the MTP layer was skipped (the draft planner), replayed into the
        #: MTP caches by the next round that runs it (:meth:`_catch_up`)
        self._skipped = SkippedRounds()
        #: seconds spent in MTP forwards and logits since the runner last reset it
        self.model_seconds = 0.0
        #: host-known upper bound on every draft slot's cached + new tokens this round, set by
        #: the runner (``ForwardMeta.max_seq_len``: attention gathers only that many positions);
        #: None = the whole block table
        self.seq_len_bound: int | None = None
        #: host-known upper bound on the rows any slot feeds substep 0 (its accepted tokens or
        #: prompt chunk, at most what it fed the target this step), set by the runner; None =
        #: unknown (``ForwardMeta.max_rows_per_item``)
        self.rows_bound: int | None = None
        #: the round's op sequence runs on Paddle tensors (see
        #: :mod:`~fastdeploy_mtp.runtime.spec_step`)
        self._ops = PaddleBackend()
        #: distinct MTP layers: substep 0's inputs and the chain rows of the substeps since
        #: (:meth:`forward_substep`)
        self._first: tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor] | None = None
        self._chain: list[tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]] = []
        self.guided = guided  # the runner's grammar matchers (structured output)

    # ---- request insertion ---------------------------------------------------------------
    def insert_tasks_v1(self, req_dicts: Sequence[Request], num_running_requests: int = 0) -> None:
        """Set the draft state of the slots the scheduler (re)filled this step.

        A prefill task (chunk ``[start, end)`` of its prompt, ``len = end - start``) loads the
        chunk shifted left by one at the start of ``input_ids[idx]``:
        ``prompt[start + 1 : end + 1]``, i.e. ``len`` tokens, or ``len - 1`` on the final chunk,
        whose last position gets the target's next token from ``draft_model_preprocess``.
        ``input_ids_cpu`` gets the whole prompt shifted left by one
        (``input_ids_len = len(prompt) - 1``), for the n-gram hybrid; the draft's lengths
        become ``seq_lens_encoder = seq_lens_this_time = len``, ``seq_lens_decoder = start``;
        ``step_idx`` = tokens already generated when the chunk reaches the end of prompt plus
        output (0 otherwise); ``pre_ids`` is reset to the generated tokens and the slot's
        drafts are cleared. A decode task needs nothing here (the draft's block table is
        copied from the target at the start of every round); an abort stops the slot.

        A splitwise decode instance never gets a prefill task for a handed-over request: its
        slot is loaded whole (target and draft rows, KV blocks of every layer) from the
        prefill instance's state (:mod:`fastdeploy_mtp.splitwise.handoff`), so the first
        round continues from the prefill instance's drafts instead of redrafting.
        """
        for req in req_dicts:
            idx = int(req.idx)
            self.forget_slot(idx)
            if req.task_type == RequestType.PREFILL and self._excluded(idx):
                self._stop_slot(idx)  # the MTP layer never sees this request
            elif req.task_type == RequestType.PREFILL:
                self.model_inputs.load_prefill_chunk(req)
            elif req.task_type == RequestType.ABORT:
                self._stop_slot(idx)
        if self.alternatives is not None:
            self.alternatives.insert_tasks_v1(req_dicts)

    def forget_slot(self, idx: int) -> None:
        """Drop what the proposer keeps for slot ``idx`` (its request finished or was replaced)."""
        self._skipped.forget(idx)
        if self.alternatives is not None:
            self.alternatives.forget_slot(idx)

    def _stop_slot(self, idx: int) -> None:
        self.forget_slot(idx)
        self.model_inputs.stop_slot(idx)

    def exist_prefill(self) -> bool:
        """Whether some draft slot is in prefill (reads the lengths on the host)."""
        return bool((self.model_inputs.seq_lens_encoder > 0).any().item())

    #: Buffers swapped by :meth:`reorder_inputs` (FastDeploy's ``swap_states`` list).
    SWAPPED = (
        "block_tables",
        "input_ids",
        "input_ids_cpu",
        "seq_lens_this_time",
        "seq_lens_encoder",
        "seq_lens_decoder",
        "step_idx",
        "pre_ids",
        "encoder_block_lens",
        "input_ids_len",
        "mask_rollback",
        "recompute_token_num",
        "stop_flags",
        "draft_tokens",
    )

    def reorder_inputs(self, src_dst: Iterable[Sequence[int]]) -> None:
        """Swap the draft state of slot pairs ``(i1, i2)`` (the target reorders its slots, e.g.
        prefill before decode in splitwise deployments, and the draft must follow)."""
        draft = self.model_inputs
        for i1, i2 in src_dst:
            for name in self.SWAPPED:
                buf = draft[name]
                a, b = buf[i1].clone(), buf[i2].clone()
                buf[i1] = b
                buf[i2] = a

    # ---- one round -------------------------------------------------------------------------
    def propose(
        self, full_hidden_states: paddle.Tensor, real_bsz: int, num_steps: int | None
    ) -> None:
        """The round of :meth:`run`: write drafts for every running target item into the
        target's ``draft_tokens``: ``num_model_steps`` from the MTP layer, and in hybrid mode
        the remaining slots up to ``K`` from n-gram matches. ``real_bsz`` bounds the token
        count of substeps after the first. ``num_steps``: MTP substeps this round,
        ``1 .. num_model_steps`` (``None``: all); the adaptive draft length runs fewer when no
        request wants more drafts. To skip the MTP layer for a round use :meth:`skip_round`."""
        steps = self.num_model_steps if num_steps is None else int(num_steps)
        if not 1 <= steps <= self.num_model_steps:
            raise ValueError(f"`num_steps` must be in [1, {self.num_model_steps}], got {num_steps}")
        draft, target = self.model_inputs, self.target_model_inputs
        self.sampler.new_round()
        paddle.assign(target.block_tables, output=draft.block_tables)
        prepare_round(
            self._ops,
            draft,
            self._seen(target),
            full_hidden_states,
            self.num_model_steps,
            self.is_splitwise_prefill,
        )
        if self._skipped:
            self._catch_up()
        n = int(draft.seq_lens_this_time.shape[0])
        real_bsz = real_bsz if 0 < real_bsz <= n else n
        propose_substeps(
            self._ops,
            draft,
            self,
            real_bsz,
            int(full_hidden_states.shape[0]),
            steps,
            self.max_model_len,
        )
        self._update_status()
        if self.hybrid_mode:
            self._extend_draft_token_with_ngram_match()
        if self.guided is not None and self.guided.matchers:
            self.guided.end_drafts(self.target_model_inputs, limit_drafts)

    @paddle.no_grad()
    def skip_round(
        self, full_hidden_states: paddle.Tensor, step: StepOutput, rows_start: np.ndarray
    ) -> None:
        """A round without the MTP layer (plain decoding: every running item feeds only its
        last token next step). What the MTP layer would have consumed is kept as it is (the
        target's hidden rows of this step, on the device; the host copies of the emitted
        tokens), and the next :meth:`run` writes it into the MTP caches in one forward per
        layer before its first substep, so the MTP layer attends to the same history as if it
        had run every round. A skipped round costs a few tensor ops, not a loop over slots.

        Args:
            full_hidden_states: ``[T_target, H]`` the target's hidden rows of this step.
            step: what the step emitted: its ``accept_tokens`` ``[N, K+1]`` and
                ``accept_num`` ``[N]``, and ``decode_mask`` ``[N]``, the slots that decoded (a
                prefill round cannot be skipped: the MTP layer must see the prompt).
            rows_start: ``[N]`` host ints, first row of each slot in ``full_hidden_states``.
        """
        target = self.target_model_inputs
        self.sampler.new_round()
        # the drafts of the last MTP round were verified this step: clear them (as
        # draft_model_preprocess would), so every running item feeds one token next step
        target.draft_tokens[:, 1:] = PLACEHOLDER_TOKEN_ID
        self._update_status()
        self._skipped.record(
            full_hidden_states,
            target.step_idx,
            step.accept_tokens,
            step.accept_num,
            rows_start,
            step.decode_mask & ~self.excluded if self.excluded is not None else step.decode_mask,
        )

    def _excluded(self, idx: int) -> bool:
        return self.excluded is not None and bool(self.excluded[idx])

    def _seen(self, target: InputBatch) -> InputBatch:
        """The target's buffers as this round's ``draft_model_preprocess`` reads them: the
        slots the MTP layer leaves alone look stopped, so their draft slots stay stopped."""
        if self.excluded is None or not self.excluded.any():
            return target
        view = InputBatch()
        for name, value in target.items():
            view[name] = value
        flags = paddle.to_tensor(self.excluded.reshape(-1, 1)[: int(target.stop_flags.shape[0])])
        view.stop_flags = paddle.logical_or(target.stop_flags, flags)
        return view

    def _catch_up(self) -> None:
        """Write the rows of skipped rounds into the MTP caches (every layer a substep runs)
        and the draft's token history, right before this round's accepted rows: one forward per
        layer, outputs discarded."""
        replay = self._skipped.take(self.model_inputs)
        if replay is None:
            return
        meta = self._meta(
            replay.ids,
            replay.cu_seqlens_q,
            replay.seq_lens_encoder,
            replay.seq_lens_decoder,
            replay.seq_lens_this_time,
            replay.max_rows,
        )
        for layer in sorted(set(self.layer_schedule)):  # the layers this config ever runs
            self._forward(meta.ids_remove_padding, replay.hidden, meta, layer)

    # ---- the MTP side of spec_step.propose_substeps ------------------------------------------
    def sample_substep(self, gathered: paddle.Tensor, substep: int) -> paddle.Tensor:
        """``[N]`` int64 greedy drafts from substep ``substep``'s gathered rows (and, for the
        slots that asked, their log-probabilities: :meth:`MTPSampler.record`). A constrained
        slot drafts under its grammar
        (:meth:`~fastdeploy_mtp.runtime.guided.GuidedSlots.mask_drafts`)."""
        logits = self._logits(gathered, self.layer_schedule[substep])
        guided = self.guided if self.guided is not None and self.guided.matchers else None
        if guided is not None:
            logits = guided.mask_drafts(logits, self.model_inputs.seq_lens_this_time)
        tokens = self.sampler(logits)
        if guided is not None:
            guided.take_drafts(tokens)
        if self.sampler.wanted:
            self.sampler.record(logits, tokens, self.model_inputs.seq_lens_this_time, substep)
        return tokens

    def _update_status(self) -> None:
        postprocess(self._ops, self.target_model_inputs)

    def _extend_draft_token_with_ngram_match(self) -> None:
        draft, target = self.model_inputs, self.target_model_inputs
        spec = self.fd_config.speculative_config
        ops.hybrid_mtp_ngram(
            input_ids=draft.input_ids_cpu,
            input_ids_len=draft.input_ids_len,
            pre_ids=draft.pre_ids,
            step_idx=draft.step_idx,
            draft_token_num=target.actual_draft_token_num,
            draft_tokens=target.draft_tokens,
            seq_lens_this_time=target.seq_lens_this_time,
            seq_lens_decoder=draft.seq_lens_decoder,
            max_dec_len=draft.max_dec_len,
            max_ngram_size=spec.max_ngram_size,
            min_ngram_size=spec.min_ngram_size,
            max_draft_tokens=self.max_draft_token_num,
        )
