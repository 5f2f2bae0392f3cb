"""``MTPProposer``: runs a model's MTP layer beside the target to draft tokens.

One round (:meth:`MTPProposer.run`, after the target's verify and status update; the whole
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

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import paddle

from .. import ops
from ..config import FDConfig
from ..constants import PLACEHOLDER_TOKEN_ID
from ..models.cache_spec import CacheSpec
from ..models.forward_meta import ForwardMeta
from ..models.interfaces import MTPModel, TargetModel
from ..runtime.input_batch import InputBatch, limit_drafts
from ..runtime.request import Request, RequestType
from ..runtime.spec_step import Packed, PaddleBackend, postprocess, prepare_round, propose_substeps
from .mtp_caches import MTPCaches
from .proposer_inputs import ProposerInputBatch
from .sampler import MTPSampler
from .skipped_rounds import SkippedRounds

if TYPE_CHECKING:
    from ..runtime.guided import GuidedSlots


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


class MTPProposer(MTPCaches):
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
    ):
        spec = fd_config.speculative_config
        if spec.method != "mtp":
            raise ValueError(
                f"MTPProposer needs speculative_config.method == 'mtp', got {spec.method!r}"
            )
        if model is None:
            raise ValueError(
                "MTPProposer needs the MTP layer: pass `model=` (e.g. from fastdeploy_mtp.models.load_tiny())"
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
        self._published: list[str] = []  # IPC names of caches this proposer published
        self.num_gpu_blocks = 0
        #: FastDeploy's switch, kept for its interface: substeps here are always sized by
        #: host-known bounds (see :meth:`_propose`), overlap schedule or not
        self.enable_overlap = fd_config.scheduler_config.enable_overlap_schedule
        #: Set by the runner before each :meth:`run`: True when no slot is in prefill this
        #: round (FastDeploy's name). Such steady-state rounds build the MTP forwards'
        #: metadata unchecked (``ForwardMeta.check``), so they read nothing back; rounds with
        #: a prefill validate it on the host.
        self.overlap_round = False
        #: distinct MTP layers of the model (``num_nextn_predict_layers``) and the layer each
        #: substep runs (``speculative_config.mtp_layer_schedule``)
        self.num_mtp_layers = int(getattr(model, "num_layers", 1))
        self.layer_schedule = [
            layer_for_substep(s, self.num_mtp_layers, spec.mtp_layer_schedule)
            for s in range(self.num_model_steps)
        ]
        #: rows accepted while the MTP layer was skipped (adaptive draft length), per slot:
        #: ``(tokens, target hidden rows [n, H])``, replayed into the MTP caches by the next
        #: round that runs it (:meth:`_catch_up`)
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
        #: the round's op sequence runs on Paddle tensors (see :mod:`~fastdeploy_mtp.runtime.spec_step`)
        self._ops = PaddleBackend()
        #: distinct MTP layers: substep 0's inputs and the chain rows of the substeps since
        #: (:meth:`forward_substep`)
        self._first: tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor] | None = None
        self._chain: list[tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]] = []
        #: the runner's grammar matchers (structured output), set by the runner
        self.guided: GuidedSlots | None = None

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
            if req.task_type == RequestType.PREFILL:
                self.model_inputs.load_prefill_chunk(req)
            elif req.task_type == RequestType.ABORT:
                self._stop_slot(idx)

    def insert_prefill_inputs(
        self, req_dicts: Sequence[Request], num_running_requests: int = 0
    ) -> None:
        """FastDeploy's older (v0 scheduler) insertion: same draft state as
        :meth:`insert_tasks_v1`, plus the per-slot state of the v0 block allocator
        (``encoder_block_lens`` = the slot's block count, ``used_list_len = 0``), which
        ``mtp_step_paddle`` reads; this proposer's :meth:`run` does not call that op."""
        self.insert_tasks_v1(req_dicts, num_running_requests)
        for req in req_dicts:
            if req.task_type == RequestType.PREFILL:
                idx = int(req.idx)
                self.model_inputs.encoder_block_lens[idx] = len(req.block_tables)
                self.model_inputs.used_list_len[idx] = 0

    def update_task_chunk_prefill(self, task: Request) -> None:
        """Load the next prompt chunk of a chunked-prefill request (same state as a fresh
        prefill task for that chunk)."""
        task.task_type = RequestType.PREFILL
        self.insert_tasks_v1([task])

    def forget_slot(self, idx: int) -> None:
        """Drop what the proposer keeps for slot ``idx`` (its request finished or was replaced)."""
        self._skipped.forget(idx)

    def _stop_slot(self, idx: int) -> None:
        self.forget_slot(idx)
        self.model_inputs.stop_slot(idx)

    def dummy_prefill_inputs(
        self, num_tokens: int, batch_size: int, expected_decode_len: int = 1
    ) -> None:
        """Fill the first ``batch_size`` slots with a dummy prefill of ``num_tokens //
        batch_size`` tokens each, capped at ``max_model_len - expected_decode_len - 1``
        (warm-up and memory profiling)."""
        if batch_size <= 0 or num_tokens < batch_size:
            raise ValueError(f"need 0 < batch_size <= num_tokens, got {batch_size}, {num_tokens}")
        per_item = min(num_tokens // batch_size, self.max_model_len - expected_decode_len - 1)
        for idx in range(batch_size):
            self.model_inputs.load_dummy_prefill(idx, per_item)

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
    @paddle.no_grad()
    def run(
        self,
        full_hidden_states: paddle.Tensor,
        step_use_cudagraph: bool = False,
        is_dummy_run: bool = False,
        real_bsz: int = 0,
        num_steps: int | None = None,
    ) -> None:
        """Write drafts for every running target item into the target's ``draft_tokens``:
        ``num_model_steps`` from the MTP layer, and in hybrid mode the remaining slots up to
        ``K`` from n-gram matches.

        Args:
            full_hidden_states: ``[T_target, H]`` the target's hidden rows of this step (as its
                forward returned them, in batch order).
            step_use_cudagraph: accepted for FastDeploy compatibility (no graphs here).
            is_dummy_run: accepted for FastDeploy compatibility (the round runs as usual).
            real_bsz: number of leading slots in use (0, or more than ``max_num_seqs``, = all);
                it bounds the token count of substeps after the first.
            num_steps: MTP substeps this round, ``1 .. num_model_steps`` (default all); the
                adaptive draft length runs fewer when no request wants more drafts. To skip
                the MTP layer for a round use :meth:`skip_round`.
        """
        steps = self.num_model_steps if num_steps is None else int(num_steps)
        if not 1 <= steps <= self.num_model_steps:
            raise ValueError(f"`num_steps` must be in [1, {self.num_model_steps}], got {num_steps}")
        draft, target = self.model_inputs, self.target_model_inputs
        self.sampler.new_round()
        paddle.assign(target.block_tables, output=draft.block_tables)
        prepare_round(
            self._ops,
            draft,
            target,
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
        self,
        full_hidden_states: paddle.Tensor,
        accept_tokens: np.ndarray,
        accept_num: np.ndarray,
        rows_start: np.ndarray,
        decoding: np.ndarray,
    ) -> None:
        """A round without the MTP layer (plain decoding: every running item feeds only its
        last token next step). What the MTP layer would have consumed is kept as it is (the
        target's hidden rows of this step, on the device; the host copies of the emitted
        tokens), and the next :meth:`run` writes it into the MTP caches in one forward per
        layer before its first substep, so the MTP layer attends to the same history as if it
        had run every round. A skipped round costs a few tensor ops, not a loop over slots.

        Args:
            full_hidden_states: ``[T_target, H]`` the target's hidden rows of this step.
            accept_tokens: ``[N, K+1]`` host ints, tokens each slot emitted this step.
            accept_num: ``[N]`` host ints, how many.
            rows_start: ``[N]`` host ints, first row of each slot in ``full_hidden_states``.
            decoding: ``[N]`` host bools, slots that decoded this step (a prefill round cannot
                be skipped: the MTP layer must see the prompt).
        """
        target = self.target_model_inputs
        self.sampler.new_round()
        # the drafts of the last MTP round were verified this step: clear them (as
        # draft_model_preprocess would), so every running item feeds one token next step
        target.draft_tokens[:, 1:] = PLACEHOLDER_TOKEN_ID
        self._update_status()
        self._skipped.record(
            full_hidden_states, target.step_idx, accept_tokens, accept_num, rows_start, decoding
        )

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

    def _meta(
        self,
        ids: paddle.Tensor,
        cu_seqlens_q: paddle.Tensor,
        seq_lens_encoder: paddle.Tensor,
        seq_lens_decoder: paddle.Tensor,
        seq_lens_this_time: paddle.Tensor,
        max_rows_per_item: int | None,
    ) -> ForwardMeta:
        """A forward's metadata over the draft's block table and the MTP caches, with this
        round's host-known bounds; validated on the host only in rounds with a prefill."""
        return ForwardMeta(
            ids_remove_padding=ids,
            cu_seqlens_q=cu_seqlens_q,
            seq_lens_encoder=seq_lens_encoder,
            seq_lens_decoder=seq_lens_decoder,
            seq_lens_this_time=seq_lens_this_time,
            block_tables=self.model_inputs.block_tables,
            caches=self.caches,
            block_size=self.block_size,
            max_seq_len=self.seq_len_bound,
            max_rows_per_item=max_rows_per_item,
            check=not self.overlap_round,
        )

    def _forward(
        self, ids: paddle.Tensor, hidden: paddle.Tensor, meta: ForwardMeta, layer: int
    ) -> paddle.Tensor:
        t0 = time.perf_counter()
        if self.num_mtp_layers > 1:
            out = self.model(ids, hidden, meta, layer=layer)  # type: ignore[call-arg]
        else:
            out = self.model(ids, hidden, meta)
        self.model_seconds += time.perf_counter() - t0
        return out

    def _logits(self, hidden: paddle.Tensor, layer: int) -> paddle.Tensor:
        t0 = time.perf_counter()
        if self.num_mtp_layers > 1:
            out = self.model.compute_logits(hidden, None, layer=layer)  # type: ignore[call-arg]
        else:
            out = self.model.compute_logits(hidden)
        self.model_seconds += time.perf_counter() - t0
        return out

    # ---- the MTP side of spec_step.propose_substeps ------------------------------------------
    def forward_substep(self, substep: int, packed: Packed, token_num: int) -> paddle.Tensor:
        """The MTP layer of substep ``substep`` over the packed draft tokens and the first
        ``token_num`` staged hidden rows: ``[token_num, H]``. With distinct MTP layers a
        substep after the first re-reads the accepted rows and the chain of drafts so far
        (:meth:`_chain_forward`), since its layer has its own cache."""
        draft = self.model_inputs
        multi = self.num_mtp_layers > 1
        layer = self.layer_schedule[substep]
        rows_hidden = draft.target_hidden_states[:token_num]
        if multi and substep > 0:
            self._chain.append(
                (packed.ids_remove_padding, rows_hidden.clone(), packed.batch_id_per_token)
            )
            assert self._first is not None
            return self._chain_forward(self._first, self._chain, layer, packed.batch_id_per_token)
        meta = self._meta(
            packed.ids_remove_padding,
            packed.cu_seqlens_q,
            draft.seq_lens_encoder,
            draft.seq_lens_decoder,
            draft.seq_lens_this_time,
            self.rows_bound if substep == 0 else 1,
        )
        if multi:
            dec0 = draft.seq_lens_decoder.clone()
            self._first = (
                packed.ids_remove_padding,
                rows_hidden.clone(),
                packed.batch_id_per_token,
                dec0,
            )
            self._chain = []
        return self._forward(packed.ids_remove_padding, rows_hidden, meta, layer)

    def sample_substep(self, gathered: paddle.Tensor, substep: int) -> paddle.Tensor:
        """``[N]`` int64 greedy drafts from substep ``substep``'s gathered rows (and, for the
        slots that asked, their log-probabilities: :meth:`MTPSampler.record`). A constrained
        slot drafts under its grammar (:meth:`~fastdeploy_mtp.runtime.guided.GuidedSlots.mask_drafts`)."""
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

    def empty_substep(self) -> None:
        self.model.empty_input_forward(None)

    def _chain_forward(
        self,
        first: tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor],
        chain: list[tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]],
        layer: int,
        batch_id_now: paddle.Tensor,
    ) -> paddle.Tensor:
        """Substep ``s >= 1`` with distinct MTP layers: run ``layer`` over, per item, the rows of
        substep 0 (accepted tokens with the target's hidden states) followed by the ``s``
        chain rows (draft ``j`` with the hidden state substep ``j - 1`` produced), from the
        position substep 0 started at. Returns this substep's rows in its own packed layout
        (one row per running item: that item's last row), as a single-layer forward would.

        All shapes are host-known (the sum of the packed row counts, padding included); the
        item of every row comes from the ops' ``batch_id_per_token`` (-1 on padding rows)."""
        ids0, hid0, bid0, dec0 = first
        bsz = int(dec0.shape[0])
        parts_ids = [ids0] + [c[0] for c in chain]
        parts_hid = [hid0] + [c[1] for c in chain]
        parts_bid = [bid0] + [c[2] for c in chain]
        bid = paddle.concat(
            [paddle.where(b < 0, paddle.full_like(b, bsz), b) for b in parts_bid]
        ).astype("int64")
        order = paddle.argsort(
            bid, stable=True
        )  # item by item; substep 0 rows, then chain rows in order
        ids = paddle.gather(paddle.concat(parts_ids), order)
        hid = paddle.gather(paddle.concat(parts_hid), order)
        # rows per item as a comparison sum, not bincount (whose output size depends on the data)
        counts = (
            (bid.unsqueeze(1) == paddle.arange(bsz, dtype="int64").unsqueeze(0))
            .astype("int32")
            .sum(0)
            .astype("int32")
        )
        cu = paddle.concat([paddle.zeros([1], "int32"), paddle.cumsum(counts).astype("int32")])
        rows = None if self.rows_bound is None else self.rows_bound + len(chain)
        meta = self._meta(ids, cu, paddle.zeros_like(counts), dec0, counts, rows)
        out = self._forward(ids, hid, meta, layer)
        last = paddle.gather(out, (cu[1:] - 1).clip(min=0).astype("int64"))  # [B, H], one per item
        now = batch_id_now.astype("int64").clip(min=0)
        return paddle.gather(last, now)

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
