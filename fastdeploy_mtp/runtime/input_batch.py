"""The target runner's persistent buffers (``share_inputs``), FastDeploy's layout.

Shapes use ``N`` = ``max_num_seqs`` slots, ``W = K + 1`` draft slots (``K`` =
``num_speculative_tokens``, 0 without speculation), ``L`` = ``max_model_len``, ``B`` =
block-table columns, ``E`` = number of EOS ids. All tensors live on the runner's device and
are allocated once (their addresses never change, as CUDA-graph capture requires); ops write
them in place.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import paddle

from ..config import FDConfig
from ..constants import NO_BLOCK_ID, PLACEHOLDER_TOKEN_ID

if TYPE_CHECKING:
    from paddle._typing import DTypeLike


class InputBatch:
    """A bag of named tensors with both attribute and dict-style access (``x.k`` is
    ``x["k"]``), as FastDeploy's ``InputBatch``."""

    def __init__(self) -> None:
        object.__setattr__(self, "_buffers", {})

    def _buffer(self, name: str, error: type[LookupError] | type[AttributeError]) -> Any:
        try:
            return self._buffers[name]
        except KeyError:
            raise error(f"{type(self).__name__} has no buffer {name!r}") from None

    def __getattr__(self, name: str) -> Any:
        return self._buffer(name, AttributeError)

    def __setattr__(self, name: str, value: Any) -> None:
        self._buffers[name] = value

    def __getitem__(self, name: str) -> Any:
        return self._buffer(name, KeyError)

    def __setitem__(self, name: str, value: Any) -> None:
        self._buffers[name] = value

    def __contains__(self, name: str) -> bool:
        return name in self._buffers

    def __iter__(self) -> Iterator[str]:
        return iter(self._buffers)

    def items(self) -> ItemsView[str, Any]:
        return self._buffers.items()

    def as_dict(self) -> dict[str, Any]:
        return dict(self._buffers)


def _full(shape: list[int], value: float, dtype: DTypeLike) -> paddle.Tensor:
    return paddle.full(shape, value, dtype=dtype)


def make_target_inputs(fd_config: FDConfig) -> InputBatch:
    """The target's ``share_inputs`` (the subset of FastDeploy's that the proposer and the
    reference engine use).

    Buffers (dtype, shape, initial value):
        input_ids            int64 [N, L] -1: the current prefill chunk at ``[:len]``
        token_ids_all        int64 [N, L] -1: prompt at ``[:prompt_len]``, then generated
        prompt_lens          int64 [N, 1] 0
        seq_lens_this_time   int32 [N]    0: tokens this step
        seq_lens_encoder     int32 [N]    0: prompt tokens this step (prefill)
        seq_lens_decoder     int32 [N]    0: tokens in the KV cache
        step_idx             int64 [N, 1] 0: generated tokens so far
        stop_flags           bool  [N, 1] True: free / finished slots are stopped
        is_block_step        bool  [N]    False: paused slots (preemption)
        draft_tokens         int64 [N, W] -1: [last accepted, d1..dK]
        accept_tokens        int64 [N, W] -1; accept_num int32 [N] 0
        actual_draft_token_num int32 [N]  K
        max_dec_len          int64 [N, 1] 0; min_dec_len int64 [N, 1] 0
        eos_token_id         int64 [E, 1]
        not_need_stop        bool  [1]    False (on the device)
        block_tables         int32 [N, B] -1
        top_p / temperature  float32 [N, 1] 1.0; top_k int64 [N, 1] 0; infer_seed int64 [N, 1] 0
        min_p                float32 [N, 1] 0
        penalty_score        float32 [N, 1] 1 (repetition); frequency_score, presence_score 0
        bad_tokens           int64 [N, 1] -1; bad_tokens_len int64 [N] 0
        reasoning_status     int32 [N, 1] 0
    """
    n = fd_config.scheduler_config.max_num_seqs
    spec = fd_config.speculative_config
    k = spec.num_speculative_tokens if spec.enabled else 0
    w = k + 1
    seq_len = fd_config.model_config.max_model_len
    eos = np.asarray(fd_config.model_config.eos_token_id, np.int64).reshape(-1, 1)
    target = InputBatch()
    target.input_ids = _full([n, seq_len], PLACEHOLDER_TOKEN_ID, "int64")
    target.token_ids_all = _full([n, seq_len], PLACEHOLDER_TOKEN_ID, "int64")
    target.prompt_lens = _full([n, 1], 0, "int64")
    target.seq_lens_this_time = _full([n], 0, "int32")
    target.seq_lens_encoder = _full([n], 0, "int32")
    target.seq_lens_decoder = _full([n], 0, "int32")
    target.step_idx = _full([n, 1], 0, "int64")
    target.stop_flags = _full([n, 1], True, "bool")
    target.is_block_step = _full([n], False, "bool")
    target.draft_tokens = _full([n, w], PLACEHOLDER_TOKEN_ID, "int64")
    target.accept_tokens = _full([n, w], PLACEHOLDER_TOKEN_ID, "int64")
    target.accept_num = _full([n], 0, "int32")
    target.actual_draft_token_num = _full([n], k, "int32")
    target.max_dec_len = _full([n, 1], 0, "int64")
    target.min_dec_len = _full([n, 1], 0, "int64")
    target.eos_token_id = paddle.to_tensor(eos)
    target.not_need_stop = _full([1], False, "bool")
    target.block_tables = _full([n, fd_config.max_blocks_per_seq], NO_BLOCK_ID, "int32")
    target.top_p = _full([n, 1], 1.0, "float32")
    target.top_k = _full([n, 1], 0, "int64")
    target.temperature = _full([n, 1], 1.0, "float32")
    target.infer_seed = _full([n, 1], 0, "int64")
    target.min_p = _full([n, 1], 0.0, "float32")
    target.penalty_score = _full([n, 1], 1.0, "float32")
    target.frequency_score = _full([n, 1], 0.0, "float32")
    target.presence_score = _full([n, 1], 0.0, "float32")
    target.bad_tokens = _full([n, 1], PLACEHOLDER_TOKEN_ID, "int64")
    target.bad_tokens_len = _full([n], 0, "int64")
    target.reasoning_status = _full([n, 1], 0, "int32")
    return target


def limit_drafts(target: InputBatch, limits: np.ndarray) -> None:
    """Keep at most ``limits[b]`` drafts of every decoding slot ``b``: later draft slots
    become -1 and ``seq_lens_this_time`` at most ``1 + limits[b]`` (prefill slots keep their
    chunk length). Device-side: no value is read back."""
    lim = paddle.to_tensor(np.asarray(limits, np.int64))
    cols = paddle.arange(int(target.draft_tokens.shape[1]), dtype="int64")
    drop = (cols.unsqueeze(0) > lim.unsqueeze(1)) & (cols.unsqueeze(0) > 0)
    paddle.assign(
        paddle.where(
            drop, paddle.full_like(target.draft_tokens, PLACEHOLDER_TOKEN_ID), target.draft_tokens
        ),
        output=target.draft_tokens,
    )
    slt = target.seq_lens_this_time
    decoding = (slt > 0) & (target.seq_lens_encoder == 0)
    capped = paddle.minimum(slt, (lim + 1).astype(slt.dtype))
    paddle.assign(paddle.where(decoding, capped, slt), output=slt)
