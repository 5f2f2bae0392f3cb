"""The target model runner of the reference engine: owns ``share_inputs`` and the target's
KV caches, runs one speculative step (forward, greedy verify, status update) and hands the
hidden states to the proposer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import paddle

from .. import ops
from ..config import FDConfig
from ..models.forward_meta import ForwardMeta
from .input_batch import InputBatch, make_target_inputs
from .request import Request, RequestType


@dataclass
class StepOutput:
    """What one target step produced, on the host.

    Attributes:
        accept_tokens: ``[N, K+1]`` tokens emitted per slot (first ``accept_num[b]`` valid).
        accept_num: ``[N]`` tokens emitted per slot this step.
        stop_flags: ``[N]`` slots stopped after this step.
        drafts: ``[N, K]`` the drafts the target verified this step (-1 = none).
        decode_mask: ``[N]`` slots that decoded this step (not prefill).
        num_tokens: tokens in the target forward.
    """

    accept_tokens: np.ndarray
    accept_num: np.ndarray
    stop_flags: np.ndarray
    drafts: np.ndarray
    decode_mask: np.ndarray
    num_tokens: int


class TargetRunner:
    """Target model + buffers + (optionally) the MTP proposer, for one worker.

    Args:
        fd_config: serving config; with ``speculative_config.method == "mtp"`` the runner
            builds an :class:`~fastdeploy_mtp.proposer.MTPProposer` around ``mtp_model``.
        model: the target model (``forward(ids, meta) -> [T, H]``, ``compute_logits``,
            ``attn_backend``, ``num_cache_layers``).
        mtp_model: the MTP layer (needed when speculation is on).
    """

    def __init__(self, fd_config: FDConfig, model, mtp_model=None):
        self.fd_config = fd_config
        self.model = model
        self.share_inputs: InputBatch = make_target_inputs(fd_config)
        self.num_blocks = fd_config.cache_config.total_block_num
        self.caches = model.attn_backend.allocate_caches(model.num_cache_layers, self.num_blocks)
        self.block_size = fd_config.cache_config.block_size
        self.proposer = None
        if fd_config.speculative_config.enabled:
            from ..proposer import MTPProposer

            pc = fd_config.parallel_config
            self.proposer = MTPProposer(fd_config, model, pc.local_rank, pc.device_id,
                                        self.share_inputs, model=mtp_model)
            self.proposer.initialize_kv_cache(self.num_blocks)
        self._pending_fixups: list[Request] = []

    # ---- task insertion ----------------------------------------------------------------------
    def insert_tasks(self, tasks: Sequence[Request]) -> None:
        """Load this step's prefill chunks (and block-table updates) into the buffers."""
        x = self.share_inputs
        for req in tasks:
            idx = req.idx
            blocks = list(req.block_tables)
            x.block_tables[idx, :] = -1
            if blocks:
                x.block_tables[idx, :len(blocks)] = paddle.to_tensor(blocks, dtype="int32")
            if req.task_type != RequestType.PREFILL:
                continue
            prompt = list(req.prompt_token_ids)
            start, end = req.prefill_start_index, req.prefill_end_index
            length = end - start
            x.input_ids[idx, :length] = paddle.to_tensor(prompt[start:end], dtype="int64")
            if start == 0:
                x.token_ids_all[idx, :] = -1
                x.token_ids_all[idx, :len(prompt)] = paddle.to_tensor(prompt, dtype="int64")
                x.prompt_lens[idx, 0] = len(prompt)
            x.seq_lens_encoder[idx] = length
            x.seq_lens_decoder[idx] = start
            x.seq_lens_this_time[idx] = length
            x.step_idx[idx, 0] = len(req.output_token_ids) if req.is_final_chunk else 0
            x.stop_flags[idx, 0] = False
            x.is_block_step[idx] = False
            x.draft_tokens[idx, :] = -1
            x.accept_tokens[idx, :] = -1
            x.accept_num[idx] = 0
            x.max_dec_len[idx, 0] = req.max_tokens
            if not req.is_final_chunk:
                self._pending_fixups.append(req)
        prefills = [t for t in tasks if t.task_type == RequestType.PREFILL]
        if self.proposer is not None:
            self.proposer.insert_tasks_v1(prefills)
            self.proposer.overlap_round = not prefills

    def free_slot(self, idx: int) -> None:
        """Stop a slot whose request finished or was aborted."""
        x = self.share_inputs
        x.stop_flags[idx, 0] = True
        x.seq_lens_this_time[idx] = 0
        x.seq_lens_encoder[idx] = 0
        x.seq_lens_decoder[idx] = 0
        x.block_tables[idx, :] = -1

    # ---- one step ---------------------------------------------------------------------------
    @paddle.no_grad()
    def execute(self) -> StepOutput:
        x = self.share_inputs
        slt = x.seq_lens_this_time.numpy().astype(np.int64)
        enc = x.seq_lens_encoder.numpy().astype(np.int64)
        token_num = int(slt.sum())
        (ids, _, cu_seqlens_q, _, cu_seqlens_q_output, _, _) = ops.speculate_pre_process(
            token_num, x.input_ids, x.seq_lens_this_time, x.draft_tokens, x.seq_lens_encoder,
            x.seq_lens_decoder)
        meta = ForwardMeta(ids_remove_padding=ids, cu_seqlens_q=cu_seqlens_q,
                           seq_lens_encoder=x.seq_lens_encoder, seq_lens_decoder=x.seq_lens_decoder,
                           seq_lens_this_time=x.seq_lens_this_time, block_tables=x.block_tables,
                           caches=self.caches, block_size=self.block_size)
        hidden = self.model(ids, meta) if token_num else paddle.zeros([0, self.model.config.hidden_size])
        # Logit rows: the last token of a prefill chunk (or of a 1-token item), every token of
        # a decode item with drafts (speculate_pre_process's output-row rule).
        cu = np.concatenate([[0], np.cumsum(slt)])
        rows: list[int] = []
        for b in np.nonzero(slt)[0]:
            n, s = int(slt[b]), int(cu[b])
            rows.extend([s + n - 1] if (n == 1 or enc[b] != 0) else range(s, s + n))
        target_tokens = paddle.zeros([0], dtype="int64")
        if rows:
            logits = self.model.compute_logits(paddle.gather(hidden, paddle.to_tensor(rows, dtype="int64")))
            target_tokens = paddle.argmax(logits, axis=-1).astype("int64")
        drafts = x.draft_tokens.numpy()[:, 1:].copy()
        decode_mask = (slt > 0) & (enc == 0)
        ops.verify_draft_tokens(
            x.accept_tokens, x.accept_num, x.draft_tokens, target_tokens, None, None, None, x.top_p,
            x.stop_flags, x.seq_lens_encoder, x.seq_lens_this_time, x.eos_token_id, x.is_block_step,
            cu_seqlens_q_output, x.reasoning_status, x.max_dec_len, x.step_idx, None,
            max_seq_len=self.fd_config.model_config.max_model_len,
            verify_strategy=ops.VerifyStrategy.GREEDY)
        ops.unified_update_model_status(
            x.seq_lens_encoder, x.seq_lens_decoder, x.not_need_stop, x.draft_tokens, x.accept_tokens,
            x.accept_num, x.stop_flags, x.seq_lens_this_time, x.is_block_step, x.token_ids_all,
            x.prompt_lens, x.step_idx, x.eos_token_id, x.max_dec_len)
        self._fix_up_non_final_chunks()
        out = StepOutput(accept_tokens=x.accept_tokens.numpy().copy(), accept_num=x.accept_num.numpy().copy(),
                         stop_flags=x.stop_flags.numpy().reshape(-1).copy(), drafts=drafts,
                         decode_mask=decode_mask, num_tokens=token_num)
        if self.proposer is not None:
            self.proposer.run(hidden)
        else:
            # Without drafts each decoding slot feeds its last token next: count the
            # non-empty draft slots ([last token] only), as the proposer's postprocess does.
            ops.draft_model_postprocess(x.draft_tokens, x.seq_lens_this_time, x.seq_lens_encoder,
                                        x.stop_flags)
        return out

    def _fix_up_non_final_chunks(self) -> None:
        """A non-final prompt chunk emits a throw-away token through verify/update (as
        upstream). Undo what it did to the slot's state and hand the MTP layer the true next
        prompt token instead (its input at the chunk's last position)."""
        x = self.share_inputs
        for req in self._pending_fixups:
            idx = req.idx
            x.stop_flags[idx, 0] = False
            x.step_idx[idx, 0] = 0
            x.accept_num[idx] = 0
            x.accept_tokens[idx, 0] = req.prompt_token_ids[req.prefill_end_index]
        self._pending_fixups = []
