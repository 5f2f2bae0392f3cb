"""The ``sysv`` token channel: FastDeploy's SysV messages, and the first-token message of a
splitwise prefill instance with MTP.

FastDeploy's SysV message (``speculate_save_output_topk`` /
``speculate_get_output_topk``): 2,060 + 1,032 bytes per slot, so ``kernel.msgmax`` bounds
the slots (5 on a default kernel), and ``MAX_DRAFT_TOKENS`` (6) tokens per slot and step, so
``serve`` refuses this channel for K > 5 (``planning``).

A splitwise prefill instance with MTP always sends ``mtp_save_first_token``'s SysV message
(its own layout, which fits 256 slots): :class:`FirstTokenReader`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...ops.messaging import FIRST_TOKEN_MAX_BSZ, MAX_BSZ, MAX_DRAFT_TOKENS, SPEC_LOGPROB_K
from .base import WorkerDiedError, WorkerStepError

if TYPE_CHECKING:
    from ...runtime.target_runner import StepOutput

#: ``message_flag`` of the target's token messages (FastDeploy: 3 target, 4 draft)
TARGET_MESSAGE_FLAG = 3
_TOPK = SPEC_LOGPROB_K + 1


class SysvTokenReader:
    """FastDeploy's reader: one ``speculate_get_output_topk`` message per step."""

    def __init__(self, msg_queue_id: int, n: int, k: int):
        import paddle

        from ... import ops

        self._ops, self.msg_queue_id, self.n, self.k = ops, msg_queue_id, n, k
        self._tokens = paddle.zeros(
            [3 + MAX_BSZ + MAX_BSZ * MAX_DRAFT_TOKENS * _TOPK], dtype="int64"
        )
        self._scores = paddle.zeros([MAX_BSZ * MAX_DRAFT_TOKENS * _TOPK], dtype="float32")
        self._ranks = paddle.zeros([MAX_BSZ * MAX_DRAFT_TOKENS], dtype="int64")

    def _receive(self, wait: bool) -> None:
        self._ops.speculate_get_output_topk(
            output_tokens=self._tokens,
            output_scores=self._scores,
            output_ranks=self._ranks,
            real_k=0,
            rank_id=0,
            wait_flag=wait,
            msg_queue_id=self.msg_queue_id,
            timeout_ms=5000,
        )

    def read(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        self._receive(wait=True)
        n, body_at = self.n, 3 + MAX_BSZ
        out = _checked(
            self._tokens[: body_at + n * MAX_DRAFT_TOKENS * _TOPK].numpy(), 2, n, "token"
        )
        counts = np.maximum(out[3 : 3 + n], 0).astype(np.int64)
        body = out[body_at : body_at + n * MAX_DRAFT_TOKENS * _TOPK].reshape(
            [n, MAX_DRAFT_TOKENS, _TOPK]
        )
        accept_tokens = np.zeros([n, self.k + 1], np.int64)
        width = min(self.k + 1, MAX_DRAFT_TOKENS)
        accept_tokens[:, :width] = body[:, :width, 0]
        return accept_tokens, counts

    def drain(self) -> None:
        self._receive(wait=False)

    def close(self) -> None:
        pass  # the runner removes the queue


class FirstTokenReader(SysvTokenReader):
    """A splitwise prefill instance's reader: ``mtp_get_first_token``'s message (per slot 0
    tokens, or 2: the first token and the first draft; the draft stays in the slot state)."""

    def __init__(self, msg_queue_id: int, n: int, k: int):
        import paddle

        super().__init__(msg_queue_id, n, k)
        self._first = paddle.zeros(
            [2 + FIRST_TOKEN_MAX_BSZ * (1 + MAX_DRAFT_TOKENS)], dtype="int64"
        )

    def _receive(self, wait: bool) -> None:
        self._ops.mtp_get_first_token(
            output_tokens=self._first,
            wait_flag=wait,
            msg_queue_id=self.msg_queue_id,
            timeout_ms=5000,
        )

    def read(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        self._receive(wait=True)
        n = self.n
        out = _checked(self._first.numpy(), 1, n, "first-token")
        counts = out[2 : 2 + n]
        body = 2 + FIRST_TOKEN_MAX_BSZ  # then MAX_DRAFT_TOKENS token slots per slot
        accept_tokens = np.zeros([n, self.k + 1], np.int64)
        accept_tokens[:, 0] = out[body : body + n * MAX_DRAFT_TOKENS : MAX_DRAFT_TOKENS]
        return accept_tokens, (counts > 0).astype(np.int64)


def _checked(out: np.ndarray, bsz_at: int, n: int, kind: str) -> np.ndarray:
    """``out`` once it is a message (not the no-message marker ``-2``) of ``n`` slots."""
    if out[0] == -2:
        raise WorkerDiedError(
            f"rank 0 acknowledged a step without sending its {kind.replace('-token', ' token')}s"
        )
    if int(out[bsz_at]) != n:
        raise WorkerStepError(f"{kind} message for {int(out[bsz_at])} slots, expected {n}")
    return out


class SysvTokenWriter:
    """FastDeploy's sender: one ``speculate_save_output_topk`` message per step, one packed
    row per emitted token, no logprobs (score 0, rank 0)."""

    def __init__(self, rank: int, msg_queue_id: int):
        self.rank, self.msg_queue_id = rank, msg_queue_id

    def send(self, out: StepOutput, inputs: Any, step: int) -> None:
        import paddle

        from ... import ops

        width = out.accept_tokens.shape[1]
        counts = np.clip(out.accept_num.astype(np.int32).reshape(-1), 0, width)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
        # every slot's first counts[b] tokens, in slot order, without a loop over the slots
        rows = out.accept_tokens[np.arange(width)[None, :] < counts[:, None]].astype(np.int64)
        n = int(rows.shape[0])
        ops.speculate_save_output_topk(
            sampled_token_ids=paddle.to_tensor(rows.reshape([n, 1])),
            logprob_token_ids=paddle.to_tensor(rows.reshape([n, 1])),
            logprob_scores=paddle.zeros([n, 1], dtype="float32"),
            logprob_ranks=paddle.zeros([n], dtype="int64"),
            token_num_per_batch=paddle.to_tensor(counts),
            cu_batch_token_offset=paddle.to_tensor(offsets),
            not_need_stop=inputs.not_need_stop,
            seq_lens_decoder=inputs.seq_lens_decoder,
            prompt_lens=inputs.prompt_lens,
            preempted_idx=paddle.zeros([len(counts)], dtype="int32"),
            message_flag=TARGET_MESSAGE_FLAG,
            rank_id=self.rank,
            save_each_rank=False,
            msg_queue_id=self.msg_queue_id,
        )

    def close(self) -> None:
        pass
