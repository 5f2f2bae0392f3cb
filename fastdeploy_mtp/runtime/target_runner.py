"""The target model runner of the reference engine: owns ``share_inputs`` and the target's
KV caches, runs one speculative step (forward, sampling + verify, status update) and hands the
hidden states to the proposer."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle

from .. import ops
from ..config import FDConfig
from ..constants import NO_BLOCK_ID, PLACEHOLDER_TOKEN_ID
from ..ipc.kv_caches import acquire_caches, detach_caches, host_view
from ..models.cache_spec import CacheSpec, backend_specs, model_dtype
from ..models.forward_meta import ForwardMeta
from ..models.interfaces import MTPModel, TargetModel
from . import collaborators
from .collaborators import DraftLogprobs, Proposer, ProposerFactory, SlotHandover
from .draft_methods import verified_methods
from .draft_planner import DraftPlanner
from .guided import GuidedSlots
from .input_batch import InputBatch, limit_drafts, make_target_inputs
from .planned_round import planned_round
from .recurrent_slots import acquire_linear_states, release_linear_states
from .request import Request, RequestType, check_prefill_task
from .slot_loading import load_block_table, load_prefill_chunk, load_sampling_rows
from .spec_step import LogitRows, Packed, PaddleBackend, TargetStep, postprocess, target_step
from .step_output import StepOutput
from .target_sampler import TargetSampler


class TargetRunner:
    """Target model + buffers + (optionally) a proposer, for one worker (the
    :class:`~fastdeploy_mtp.runtime.collaborators.Runner` the engine drives in-process).

    Args:
        fd_config: serving config; with speculation the runner builds the proposer of
            ``speculative_config.method`` through ``make_proposer``.
        model: the target model (see :class:`~fastdeploy_mtp.models.interfaces.TargetModel`).
        mtp_model: the MTP layer (see :class:`~fastdeploy_mtp.models.interfaces.MTPModel`;
            needed for ``method == "mtp"``, ignored by the other methods).
        make_proposer: builds the proposer (the one of :mod:`fastdeploy_mtp.proposer`, as
            :mod:`fastdeploy_mtp.assembly` passes it).
        handover: loads and reads a slot's state for a splitwise hand-over
            (:mod:`fastdeploy_mtp.splitwise.handoff`).
    """

    def __init__(
        self,
        fd_config: FDConfig,
        model: TargetModel,
        mtp_model: MTPModel | None,
        *,
        make_proposer: ProposerFactory,
        handover: SlotHandover,
    ):
        self.fd_config = fd_config
        self.model = model
        self.share_inputs: InputBatch = make_target_inputs(fd_config)
        self.num_blocks = fd_config.cache_config.total_block_num
        #: the target's caches (a key and a value per layer, the model's dtype and per-rank
        #: shape), attached by name when a cache-manager process created them
        self.cache_specs: list[CacheSpec] = backend_specs(
            "target",
            model.num_cache_layers,
            model.attn_backend,
            self.num_blocks,
            model_dtype(model),
        )
        self.caches, self._attached = acquire_caches(self.cache_specs, fd_config)
        self.block_size = fd_config.cache_config.block_size
        self.handover = handover
        #: structured output's grammar matchers (the MTP layer drafts under each slot's grammar)
        self.guided = GuidedSlots.for_model(fd_config, model.config)
        #: the drafting method's proposer
        self.proposer: Proposer | None = make_proposer(
            fd_config, model, self.share_inputs, self.num_blocks, mtp_model, self.guided
        )
        self._pending_fixups: list[Request] = []
        self._exports: list[int] = []
        #: host mirror of ``seq_lens_decoder``: forwards get a length bound without a device read
        self._cached = np.zeros(fd_config.scheduler_config.max_num_seqs, np.int64)
        spec = fd_config.speculative_config
        #: a hybrid model's per-slot linear-attention states (``None`` without)
        self.linear_states, self._state_names = acquire_linear_states(model, fd_config)
        self.method = spec.method
        self.planner = DraftPlanner.of_proposer(
            spec, fd_config.scheduler_config.max_num_seqs, self.proposer
        )
        # without drafts every strategy checks nothing: the target's sample is the token
        strategy = spec.verify_strategy if spec.enabled else "target_match"
        self.verify_strategy = ops.VerifyStrategy.from_string(strategy)
        self.sampler = TargetSampler(self.verify_strategy, fd_config.model_config.max_model_len)
        #: the step's op sequence runs on Paddle tensors (see :mod:`.spec_step`)
        self._ops = PaddleBackend()
        #: seconds in the target's forward and logits this step
        self._model_s = 0.0
        #: prompt ids must be below this: the smaller of ``model_config.vocab_size`` and the
        #: model's own ``config.vocab_size`` (its embedding rows), where it has one
        self.vocab_size = min(
            fd_config.model_config.vocab_size,
            getattr(model.config, "vocab_size", fd_config.model_config.vocab_size),
        )

    def decode_lens(self) -> np.ndarray:
        """``[N]`` int32: tokens each slot feeds if it decodes next step."""
        return self.share_inputs.seq_lens_this_time.numpy()

    def close(self) -> None:
        """Release the caches: detach attached ones, and the MTP layer's (detach / unpublish)."""
        if self.proposer is not None:
            self.proposer.clear_mtp_cache()
        detach_caches(self.caches, self._attached)
        release_linear_states(self.linear_states, self._state_names)
        self._attached = self._state_names = []

    def all_cache_specs(self) -> list[CacheSpec]:
        """This rank's caches: the target's, then (with speculation) every MTP layer's."""
        return self.cache_specs + (self.proposer.cache_specs if self.proposer is not None else [])

    def host_caches(self) -> list[list[np.ndarray]]:
        """The KV caches as writable numpy views without a copy, for KV transfer: one list
        (this process is one rank), in :meth:`all_cache_specs` order (16-bit floats viewed as
        their bits, see :func:`~fastdeploy_mtp.ipc.kv_caches.host_view`)."""
        caches = list(self.caches) + (
            list(self.proposer.caches) if self.proposer is not None else []
        )
        return [[host_view(c) for c in caches]]

    # ---- splitwise -----------------------------------------------------------------------------
    def set_exports(self, idxs: Sequence[int]) -> None:
        self._exports = [int(i) for i in idxs]

    def check_handoff(self, state: object) -> None:
        if self.linear_states is not None:  # (planning refuses a splitwise role first)
            raise collaborators.HandoffError(
                "a hand-over moves KV, not this model's linear-attention states"
            )
        self.handover.check_slot_state(state, self.share_inputs, self._draft(), self.vocab_size)

    def _draft(self) -> Any | None:
        """The proposer's per-slot draft state a hand-over carries (``None`` without one)."""
        return self.proposer.model_inputs if self.proposer is not None else None

    def _import(self, req: Request) -> None:
        """Load handed-over ``req``'s slot whole from the prefill instance's state."""
        idx = req.idx
        self.handover.import_slot(req.handoff_state, self.share_inputs, self._draft(), idx)
        self._cached[idx] = int(self.share_inputs.seq_lens_decoder[idx])
        self.sampler.set_slot(idx, req.sampling, req.sampling.seed_for(req.request_id))
        self.guided.load(req)
        if self.proposer is not None:
            self.proposer.forget_slot(idx)
        if self.planner is not None:  # (the MTP draft state came with it)
            self.planner.reset_slot(idx, req.sampling.speculative_method, with_mtp=True)

    # ---- task insertion ----------------------------------------------------------------------
    def check_task(self, req: Request) -> None:
        """See :func:`check_prefill_task`."""
        check_prefill_task(req, self.fd_config.model_config.max_model_len, self.vocab_size)
        self.guided.check_task(req)

    def abort_slot(self, req: Request) -> None:
        """Reset the target and draft state of ``req``'s slot (the request is being aborted,
        possibly in the middle of its prefill)."""
        self.free_slot(req.idx)
        self._pending_fixups = [r for r in self._pending_fixups if r is not req]
        if self.proposer is not None:
            req.task_type = RequestType.ABORT
            self.proposer.insert_tasks_v1([req])

    def insert_tasks(self, tasks: Sequence[Request]) -> None:
        """Load this step's prefill chunks (and block-table updates) into the buffers."""
        for req in tasks:
            load_block_table(self.share_inputs, req)
            if req.task_type == RequestType.IMPORT:
                self._import(req)
                continue
            if req.task_type != RequestType.PREFILL:
                continue
            load_prefill_chunk(self.share_inputs, req)
            self._cached[req.idx] = req.prefill_start_index
            seed = load_sampling_rows(self.share_inputs, req)
            self.sampler.set_slot(req.idx, req.sampling, seed)
            self.guided.load(req)
            if not req.is_final_chunk:
                self._pending_fixups.append(req)
        prefills = [t for t in tasks if t.task_type == RequestType.PREFILL]
        if self.planner is not None:
            self.planner.admit(prefills)
        if self.proposer is not None:
            self.proposer.insert_tasks_v1(prefills)
            self.proposer.overlap_round = not prefills

    def free_slot(self, idx: int) -> None:
        """Stop a slot whose request finished or was aborted."""
        self.sampler.clear_slot(idx)
        self.guided.drop(idx)
        if self.proposer is not None:
            self.proposer.forget_slot(idx)
        target = self.share_inputs
        target.stop_flags[idx, 0] = True
        target.seq_lens_this_time[idx] = 0
        target.seq_lens_encoder[idx] = 0
        target.seq_lens_decoder[idx] = 0
        target.block_tables[idx, :] = NO_BLOCK_ID
        self._cached[idx] = 0

    # ---- one step ---------------------------------------------------------------------------
    @paddle.no_grad()
    def execute(self) -> StepOutput:
        """One target step (:func:`~fastdeploy_mtp.runtime.spec_step.target_step`: forward over
        this step's tokens, the target's tokens (argmax, or the seeded sampler), verification
        and status update), then the proposer's round (without speculation,
        ``draft_model_postprocess``).
        Returns what the step emitted, copied to the host before the proposer runs."""
        t_start = time.perf_counter()
        self._model_s = 0.0
        if self.proposer is not None:
            self.proposer.model_seconds = 0.0
        target = self.share_inputs
        self.guided.cut_drafts(target, {req.idx for req in self._pending_fixups}, limit_drafts)
        step = target_step(
            self._ops, target, self, self.fd_config.model_config.max_model_len, self.verify_strategy
        )
        self._fix_up_non_final_chunks()
        out = self._step_output(step)
        self._draft_logprobs(out)
        prefill = bool((step.enc[step.slt > 0] > 0).any())
        if self.proposer is not None:
            self._propose(step.hidden, out, step.slt, step.rows.cu, prefill)
        else:
            # Without drafts each decoding slot feeds its last token next: count the
            # non-empty draft slots ([last token] only), as the proposer's postprocess does.
            postprocess(self._ops, target)
        if self._exports:
            draft = self._draft()
            out.exports = {
                idx: self.handover.export_slot(target, draft, idx) for idx in self._exports
            }
            self._exports = []
        out.model_seconds = self._model_s + (
            self.proposer.model_seconds if self.proposer is not None else 0.0
        )
        out.step_seconds = time.perf_counter() - t_start
        if self.planner is not None:
            drafts = int((out.drafts[out.decode_mask] >= 0).sum())
            self.planner.record(int((step.slt > 0).sum()), drafts, out.step_seconds, prefill)
        return out

    def _draft_logprobs(self, out: StepOutput) -> None:
        """Draft logprobs (``include_draft_logprobs``): hand out those of the drafts this step
        verified, and tell the MTP sampler which slots want them from the round about to run
        (no slot asking: nothing is computed). Without an MTP layer the lists stay empty."""
        wanted = sorted(idx for idx, sp in self.sampler.params.items() if sp.include_draft_logprobs)
        drafter = getattr(self.proposer, "sampler", None)
        if not isinstance(drafter, DraftLogprobs):
            out.draft_logprobs = {idx: [] for idx in wanted}
            return
        out.draft_logprobs = drafter.verified(out.drafts, wanted) if wanted else {}
        drafter.wanted = set(wanted)

    def forward_target(self, packed: Packed, slt: np.ndarray, enc: np.ndarray) -> paddle.Tensor:
        """The target forward of :func:`~fastdeploy_mtp.runtime.spec_step.target_step`:
        ``[T, H]`` hidden rows, bounded by the host mirror of the cached lengths."""
        token_num = int(slt.sum())
        meta = ForwardMeta(
            ids_remove_padding=packed.ids_remove_padding,
            cu_seqlens_q=packed.cu_seqlens_q,
            seq_lens_encoder=self.share_inputs.seq_lens_encoder,
            seq_lens_decoder=self.share_inputs.seq_lens_decoder,
            seq_lens_this_time=self.share_inputs.seq_lens_this_time,
            block_tables=self.share_inputs.block_tables,
            caches=self.caches,
            block_size=self.block_size,
            max_seq_len=int((self._cached + slt)[slt > 0].max()) if token_num else 1,
            max_rows_per_item=int(slt.max()),
            linear_states=self.linear_states,
            # validate on the host in rounds with a prefill; steady-state rounds read nothing back
            check=bool((enc[slt > 0] > 0).any()),
        )
        t0 = time.perf_counter()
        if token_num:
            hidden = self.model(packed.ids_remove_padding, meta)
        else:
            hidden = paddle.zeros([0, self.model.config.hidden_size])
        self._model_s += time.perf_counter() - t0
        return hidden

    def commit_verified(self, accept_num: paddle.Tensor, verified: np.ndarray) -> None:
        """Roll the verified slots' linear-attention states back to their accepted tokens
        (nothing for a model without such layers)."""
        if self.linear_states is not None and verified.any():
            self.linear_states.commit(accept_num, paddle.to_tensor(verified))

    def target_tokens(self, hidden: paddle.Tensor, rows: LogitRows) -> tuple[paddle.Tensor, Any]:
        """The target's tokens at the logit rows: argmax, or the seeded sampler where a slot
        needs it (then also its candidates and uniforms for verification)."""
        if not rows.rows:
            return paddle.zeros([0], dtype="int64"), None
        t0 = time.perf_counter()
        logits = self.model.compute_logits(
            paddle.gather(hidden, paddle.to_tensor(rows.rows, dtype="int64"))
        )
        self._model_s += time.perf_counter() - t0
        logits = self.guided.apply(logits, rows.slots, rows.positions)
        sampled = None
        if self.sampler.needs_sampler(rows.slots):
            target = self.share_inputs
            sampled = self.sampler.sample(
                logits, rows.slots, rows.positions, target, target.step_idx.numpy().reshape(-1)
            )
            target_tokens = sampled.tokens
        else:
            target_tokens = paddle.argmax(logits, axis=-1).astype("int64")
        if self.fd_config.parallel_config.tensor_parallel_size > 1:
            # Every rank must verify (and emit) the same tokens: rank 0's tokens win, as the
            # MTP sampler does for drafts. All ranks have the same rows here (and the same
            # candidate rows and uniforms, computed from them).
            from ..distributed import broadcast_from_rank0

            target_tokens = broadcast_from_rank0(target_tokens)
        return target_tokens, sampled

    def _step_output(self, step: TargetStep) -> StepOutput:
        """The step's emitted tokens and flags on the host; advances the cached lengths."""
        target = self.share_inputs
        accept_tokens = target.accept_tokens.numpy().copy()
        accept_num = target.accept_num.numpy().copy()
        slt, enc = step.slt, step.enc
        self._cached += np.where(enc > 0, slt, np.where(slt > 0, accept_num, 0)).astype(np.int64)
        out = StepOutput(
            accept_tokens=accept_tokens,
            accept_num=accept_num,
            stop_flags=target.stop_flags.numpy().reshape(-1).copy(),
            drafts=step.drafts,
            decode_mask=step.decode_mask,
            num_tokens=step.token_num,
            guided=self.guided.advance(accept_tokens, accept_num),
            draft_methods=verified_methods(self.planner, self.method, step.drafts),
            mtp_unseen=self.planner.no_mtp.copy()
            if self.planner is not None
            else np.zeros(0, bool),
        )
        if step.sampled is not None and step.sampled.logprobs is not None:
            out.logprobs = self.sampler.emitted_logprobs(
                step.sampled.logprobs, step.rows.slots, accept_tokens, accept_num
            )
        return out

    def _propose(
        self, hidden: paddle.Tensor, out: StepOutput, slt: np.ndarray, cu: np.ndarray, prefill: bool
    ) -> None:
        """The proposer's round (planned by the draft planner when it is on), from host values:
        this step's lengths ``slt``, their prefix sums ``cu`` (each slot's first row in
        ``hidden``), whether a slot was in prefill, the emitted tokens."""
        assert self.proposer is not None
        running = slt > 0
        # draft rows sit at most K + 1 past the committed tokens (chain rows of the substeps)
        bound = int(self._cached.max()) + self.proposer.max_draft_token_num + 2
        self.proposer.seq_len_bound = bound
        self.proposer.rows_bound = max(1, int(slt.max()))
        real_bsz = int(np.nonzero(running)[0].max()) + 1 if running.any() else 0
        forced = self.guided.forced_drafts(self.proposer.max_draft_token_num)
        if self.planner is None:
            self.proposer.run(hidden, real_bsz=real_bsz)
        else:
            still = running & ~out.stop_flags
            planned_round(
                self.planner, self.proposer, self.share_inputs, hidden, out, still, prefill,
                cu[:-1], real_bsz, self._ops, forced,
            )  # fmt: skip
        self.guided.offer_forced(self.share_inputs, forced)  # the grammar's forced drafts first

    def _fix_up_non_final_chunks(self) -> None:
        """A non-final prompt chunk emits a throw-away token through verify/update (as
        upstream). Undo what it did to the slot's state and hand the MTP layer the true next
        prompt token instead (its input at the chunk's last position).

        ``unified_update_model_status`` also wrote the throw-away token into the history, at
        ``token_ids_all[idx, prompt_len]`` (the first generated position, ``step_idx`` being
        0): it is cleared again, or the penalty op would count it as a generated token when
        the final chunk's row is penalised (presence, frequency and repetition penalties
        would then depend on how the prompt was split)."""
        target = self.share_inputs
        width = int(target.token_ids_all.shape[1])
        for req in self._pending_fixups:
            idx = req.idx
            first_generated = len(req.prompt_token_ids)
            if first_generated < width:
                target.token_ids_all[idx, first_generated] = PLACEHOLDER_TOKEN_ID
            target.stop_flags[idx, 0] = False
            target.step_idx[idx, 0] = 0
            target.accept_num[idx] = 0
            target.accept_tokens[idx, 0] = req.prompt_token_ids[req.prefill_end_index]
        self._pending_fixups = []
