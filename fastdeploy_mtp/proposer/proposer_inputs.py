"""``ProposerInputBatch``: the MTP proposer's buffers (``model_inputs``), with FastDeploy's
names and layout (``docs/architecture.md`` summarises how they relate to the target's).

Three kinds of buffers:

* **cloned** from the target (own memory, same shape and dtype, :data:`CLONED_FROM_TARGET`):
  the draft's shadow copies of the prompt chunk, lengths, steps, token history and block
  table (``stop_flags`` is cloned too, then reset so that every draft slot starts stopped);
* **shared by reference** with the target (the *same* tensor objects, so a write by either
  side is seen by both, :data:`SHARED_WITH_TARGET`): sampling parameters, ``max_dec_len``,
  ``min_dec_len``, ``eos_token_id``, ``prompt_lens``, and the ones the proposer's ops write
  into: ``base_model_draft_tokens`` (= target ``draft_tokens``), ``accept_tokens``,
  ``accept_num``;
* **new**: the draft's ``seq_lens_this_time``, history (``pre_ids``), drafts, hidden-state
  staging buffer, and the per-slot state of FastDeploy's v0 block allocator
  (``mtp_step_paddle``'s inputs, kept for layout compatibility).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import paddle

from ..config import FDConfig
from ..constants import NO_BATCH_ID, PLACEHOLDER_TOKEN_ID, UNSET_SEQ_LEN
from ..runtime.input_batch import InputBatch

if TYPE_CHECKING:
    from ..runtime.request import Request

#: Target buffers the proposer shares by reference (same tensor object), under its own
#: name -> the target's name.
SHARED_WITH_TARGET = {
    "prompt_lens": "prompt_lens",
    "top_p": "top_p",
    "top_k": "top_k",
    "temperature": "temperature",
    "eos_token_id": "eos_token_id",
    "infer_seed": "infer_seed",
    "max_dec_len": "max_dec_len",
    "min_dec_len": "min_dec_len",
    "base_model_draft_tokens": "draft_tokens",
    "accept_num": "accept_num",
    "accept_tokens": "accept_tokens",
}

#: Target buffers the proposer clones (own memory, same shape and dtype).
CLONED_FROM_TARGET = (
    "block_tables",
    "input_ids",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "step_idx",
    "stop_flags",
    "token_ids_all",
)


class ProposerInputBatch(InputBatch):
    """Buffers of :class:`~fastdeploy_mtp.proposer.MTPProposer` (names as FastDeploy's).

    Args:
        fd_config: the serving config (``N``, ``K``, ``L``, ``H``, cache layout).
        target_inputs: the target runner's ``share_inputs``.

    New buffers (dtype, shape, initial value; ``Tmax`` = ``max_num_batched_tokens + N * (K+1)``):
        seq_lens_this_time   int32 [N] 0 (FastDeploy's ``seq_lens_this_time_buffer``)
        stop_flags           bool  [N, 1] True (replaces the clone of the target's)
        draft_tokens         int64 [N, K+1] -1: the draft's input tokens of the substep
        pre_ids              int64 [N, L] -1: draft history aligned with generated positions
        input_ids_cpu        int64 [N, L] -1: the whole prompt shifted left by one (n-gram)
        input_ids_len        int64 [N, 1] 0: its length (prompt_len - 1)
        not_need_stop        bool  [1] False
        target_hidden_states float32 [Tmax, H] 0: hidden rows feeding the next substep
        cu_seqlens_q_output  int32 [N + 1] 0; batch_id_per_token_output int32 [N * (K+1)] -1
        last_seq_lens_this_time int32 [N] -1
        is_block_step, batch_drop bool [N, 1] False; used_list_len int32 [N] 0;
        encoder_block_lens int32 [N] 0; free_list int32 [F], free_list_len int32 [1] F
            (the v0 allocator state ``mtp_step_paddle`` reads; F = total - int(total * ratio),
            free_list = [0] when F = 0)
        mask_rollback int32 [N, 1] 0; recompute_token_num int32 [N, 1] S - 1
    """

    def __init__(self, fd_config: FDConfig, target_inputs: InputBatch):
        super().__init__()
        spec = fd_config.speculative_config
        n = fd_config.scheduler_config.max_num_seqs
        k = spec.num_speculative_tokens
        w = k + 1
        seq_len = fd_config.model_config.max_model_len
        hidden = fd_config.model_config.hidden_size
        if target_inputs.draft_tokens.shape[1] != w:
            raise ValueError(
                f"target `draft_tokens` is {target_inputs.draft_tokens.shape[1]} wide, "
                f"but num_speculative_tokens = {k} needs K + 1 = {w}"
            )
        for name in CLONED_FROM_TARGET:
            self[name] = target_inputs[name].clone()
        for own, theirs in SHARED_WITH_TARGET.items():
            self[own] = target_inputs[theirs]
        self.seq_lens_this_time = paddle.zeros([n], dtype="int32")
        self.stop_flags = paddle.full([n, 1], True, dtype="bool")
        self.draft_tokens = paddle.full([n, w], PLACEHOLDER_TOKEN_ID, dtype="int64")
        self.pre_ids = paddle.full([n, seq_len], PLACEHOLDER_TOKEN_ID, dtype="int64")
        self.input_ids_cpu = paddle.full([n, seq_len], PLACEHOLDER_TOKEN_ID, dtype="int64")
        self.input_ids_len = paddle.zeros([n, 1], dtype="int64")
        self.not_need_stop = paddle.full([1], False, dtype="bool")
        max_tokens = fd_config.scheduler_config.max_num_batched_tokens + n * w
        self.target_hidden_states = paddle.zeros([max_tokens, hidden], dtype="float32")
        self.cu_seqlens_q_output = paddle.zeros([n + 1], dtype="int32")
        self.batch_id_per_token_output = paddle.full([n * w], NO_BATCH_ID, dtype="int32")
        self.last_seq_lens_this_time = paddle.full([n], UNSET_SEQ_LEN, dtype="int32")
        self.is_block_step = paddle.full([n, 1], False, dtype="bool")
        self.batch_drop = paddle.full([n, 1], False, dtype="bool")
        self.used_list_len = paddle.zeros([n], dtype="int32")
        self.encoder_block_lens = paddle.zeros([n], dtype="int32")
        cache = fd_config.cache_config
        first_free = int(cache.total_block_num * cache.kv_cache_ratio)
        free = list(range(cache.total_block_num - 1, first_free - 1, -1))
        self.free_list = paddle.to_tensor(free if free else [0], dtype="int32")
        self.free_list_len = paddle.to_tensor([len(free)], dtype="int32")
        self.mask_rollback = paddle.zeros([n, 1], dtype="int32")
        self.recompute_token_num = paddle.full([n, 1], spec.num_model_steps - 1, dtype="int32")
        self.substep = 0

    def shares_with(self, target_inputs: InputBatch) -> bool:
        """Whether every shared buffer is the target's very tensor object."""
        return all(self[own] is target_inputs[theirs] for own, theirs in SHARED_WITH_TARGET.items())

    # ---- per-slot state (MTPProposer's insertion) -------------------------------------------
    def load_prefill_chunk(self, req: Request) -> None:
        """Set slot ``req.idx``'s draft state for prefill chunk ``[start, end)`` of its prompt
        (see :meth:`MTPProposer.insert_tasks_v1
        <fastdeploy_mtp.proposer.MTPProposer.insert_tasks_v1>`).

        Raises:
            ValueError: an empty chunk.
        """
        idx = int(req.idx)
        prompt = list(req.prompt_token_ids)
        output = list(req.output_token_ids)
        start, end = int(req.prefill_start_index), int(req.prefill_end_index)
        length = end - start
        if length <= 0:
            raise ValueError(f"request {req.request_id!r}: empty prefill chunk [{start}, {end})")
        shifted = prompt[start + 1 : end] + (prompt[end : end + 1] if end < len(prompt) else [])
        if shifted:
            self.input_ids[idx, : len(shifted)] = paddle.to_tensor(shifted, dtype="int64")
        self.input_ids_cpu[idx, :] = PLACEHOLDER_TOKEN_ID
        if len(prompt) > 1:
            self.input_ids_cpu[idx, : len(prompt) - 1] = paddle.to_tensor(prompt[1:], dtype="int64")
        self.input_ids_len[idx, 0] = len(prompt) - 1
        self.pre_ids[idx, :] = PLACEHOLDER_TOKEN_ID
        if output:
            self.pre_ids[idx, : len(output)] = paddle.to_tensor(output, dtype="int64")
        self.stop_flags[idx, 0] = False
        self.batch_drop[idx, 0] = False
        self.seq_lens_encoder[idx] = length
        self.seq_lens_decoder[idx] = start
        self.seq_lens_this_time[idx] = length
        self.step_idx[idx, 0] = len(output) if end >= len(prompt) + len(output) else 0
        self.draft_tokens[idx, :] = PLACEHOLDER_TOKEN_ID

    def stop_slot(self, idx: int) -> None:
        """Stop draft slot ``idx`` (an aborted request): no tokens, no lengths."""
        self.stop_flags[idx, 0] = True
        self.seq_lens_this_time[idx] = 0
        self.seq_lens_encoder[idx] = 0
        self.seq_lens_decoder[idx] = 0
        self.step_idx[idx, 0] = 0
