"""Loading a task into its slot of the target's buffers (``share_inputs``): the block table,
a prompt chunk with its lengths and counters, and the request's sampling parameters."""

from __future__ import annotations

import paddle

from ..constants import NO_BLOCK_ID, PLACEHOLDER_TOKEN_ID
from .input_batch import InputBatch
from .request import Request


def load_block_table(target: InputBatch, req: Request) -> None:
    """Slot ``req.idx``'s row of ``block_tables`` (``[N, max_blocks_per_seq]`` int32): the
    request's blocks, then :data:`~fastdeploy_mtp.constants.NO_BLOCK_ID`."""
    blocks = list(req.block_tables)
    target.block_tables[req.idx, :] = NO_BLOCK_ID
    if blocks:
        target.block_tables[req.idx, : len(blocks)] = paddle.to_tensor(blocks, dtype="int32")


def load_prefill_chunk(target: InputBatch, req: Request) -> None:
    """Prompt chunk ``[prefill_start_index, prefill_end_index)`` of ``req`` into its slot:
    the chunk's ids, the lengths (``seq_lens_encoder`` = chunk, ``seq_lens_decoder`` = its
    start), ``step_idx`` (the tokens generated so far on the final chunk, else 0), cleared
    drafts and emitted tokens, ``max_dec_len``. A request's first chunk (at 0, or right after
    a prefix-cache hit) also writes the whole prompt into the history ``token_ids_all``."""
    idx = req.idx
    prompt = list(req.prompt_token_ids)
    start, end = req.prefill_start_index, req.prefill_end_index
    length = end - start
    target.input_ids[idx, :length] = paddle.to_tensor(prompt[start:end], dtype="int64")
    if req.is_first_chunk:
        target.token_ids_all[idx, :] = PLACEHOLDER_TOKEN_ID
        target.token_ids_all[idx, : len(prompt)] = paddle.to_tensor(prompt, dtype="int64")
        target.prompt_lens[idx, 0] = len(prompt)
    target.seq_lens_encoder[idx] = length
    target.seq_lens_decoder[idx] = start
    target.seq_lens_this_time[idx] = length
    target.step_idx[idx, 0] = len(req.output_token_ids) if req.is_final_chunk else 0
    target.stop_flags[idx, 0] = False
    target.is_block_step[idx] = False
    target.draft_tokens[idx, :] = PLACEHOLDER_TOKEN_ID
    target.accept_tokens[idx, :] = PLACEHOLDER_TOKEN_ID
    target.accept_num[idx] = 0
    target.max_dec_len[idx, 0] = req.max_tokens


def load_sampling_rows(target: InputBatch, req: Request) -> int:
    """The request's sampling parameters into its slot's rows (temperature, top-p/k, min-p,
    seed, penalties, the EOS mask length ``min_dec_len``); returns the seed."""
    sp, idx = req.sampling, req.idx
    seed = sp.seed_for(req.request_id)
    target.temperature[idx, 0] = float(sp.temperature)
    target.top_p[idx, 0] = float(sp.top_p)
    target.top_k[idx, 0] = int(sp.top_k)
    target.min_p[idx, 0] = float(sp.min_p)
    # through a tensor: a Python int assigned by index goes through float64 (53 bits)
    target.infer_seed[idx, 0] = paddle.to_tensor(seed, dtype="int64")
    target.penalty_score[idx, 0] = float(sp.repetition_penalty)
    target.frequency_score[idx, 0] = float(sp.frequency_penalty)
    target.presence_score[idx, 0] = float(sp.presence_penalty)
    target.min_dec_len[idx, 0] = sp.eos_ban_len(req.max_tokens)
    return seed
