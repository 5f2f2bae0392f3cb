"""Rounds the adaptive draft length ran without the MTP layer, kept until the next round that
runs it replays their rows into the MTP caches (:meth:`MTPProposer.skip_round
<fastdeploy_mtp.proposer.MTPProposer.skip_round>` records, ``MTPProposer._catch_up`` replays).

A skipped round costs a few tensor ops, not a loop over slots: what the MTP layer would have
consumed is kept as it is (the target's hidden rows of that step, on the device; host copies of
the emitted tokens) and packed for one forward per layer when the layer runs again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle

from .proposer_inputs import ProposerInputBatch


@dataclass
class SkippedRound:
    """What a round without the MTP layer leaves for the next one that runs it."""

    hidden: paddle.Tensor  # [T, H] the target's hidden rows of that step (or the kept ones)
    step_idx: paddle.Tensor  # [N] the target's step_idx after it (device)
    tokens: np.ndarray  # [N, K+1] tokens emitted (host)
    counts: np.ndarray  # [N] rows to replay per slot (0: none, or forgotten)
    rows_start: np.ndarray  # [N] first row of each slot in ``hidden``


@dataclass
class Replay:
    """The rows of skipped rounds packed for one MTP forward (``R`` rows, ``N`` slots), each
    slot's rows right before its committed tokens of this round.

    Attributes:
        ids: ``[R]`` int64 tokens, slots in batch order (rows of stopped slots last).
        hidden: ``[R, H]`` float32, the target's hidden rows of those tokens.
        cu_seqlens_q: ``[N + 1]`` int32 prefix sums of ``seq_lens_this_time``.
        seq_lens_encoder: ``[N]`` int32 zeros (no prefill).
        seq_lens_decoder: ``[N]`` int32, where each slot's replayed rows start.
        seq_lens_this_time: ``[N]`` int32 rows per slot (0 for a slot that stopped).
        max_rows: the most rows of one slot.
    """

    ids: paddle.Tensor
    hidden: paddle.Tensor
    cu_seqlens_q: paddle.Tensor
    seq_lens_encoder: paddle.Tensor
    seq_lens_decoder: paddle.Tensor
    seq_lens_this_time: paddle.Tensor
    max_rows: int


class SkippedRounds:
    """The skipped rounds since the MTP layer last ran, oldest first."""

    def __init__(self) -> None:
        self.rounds: list[SkippedRound] = []

    def __bool__(self) -> bool:
        return bool(self.rounds)

    def forget(self, idx: int) -> None:
        """Drop slot ``idx``'s rows (its request finished or was replaced)."""
        for sk in self.rounds:
            sk.counts[int(idx)] = 0

    def record(
        self,
        hidden: paddle.Tensor,
        step_idx: paddle.Tensor,
        accept_tokens: np.ndarray,
        accept_num: np.ndarray,
        rows_start: np.ndarray,
        decoding: np.ndarray,
    ) -> None:
        """Keep a skipped round's rows of the slots that decoded and emitted tokens
        (``hidden`` ``[T, H]``, the target's ``step_idx`` ``[N, 1]``; the rest ``[N]`` or
        ``[N, K+1]`` host arrays as :meth:`MTPProposer.skip_round` takes them). When those
        are at most half the step's rows (most slots left to the model-free methods) only they
        are kept, gathered, so that a long stretch of skipped rounds holds no more."""
        keep = np.asarray(decoding, bool) & (np.asarray(accept_num) > 0)
        if not keep.any():
            return
        counts = np.where(keep, np.asarray(accept_num), 0).astype(np.int64)
        starts = np.asarray(rows_start, np.int64).copy()
        if 2 * int(counts.sum()) <= int(hidden.shape[0]):  # few rows kept: only those, packed
            rows = np.concatenate([np.arange(a, a + c) for a, c in zip(starts, counts) if c])
            hidden = paddle.gather(hidden, paddle.to_tensor(rows, dtype="int64"))
            starts = np.cumsum(counts) - counts
        self.rounds.append(
            SkippedRound(
                hidden=hidden,
                step_idx=step_idx.reshape([-1]).clone(),
                tokens=np.asarray(accept_tokens).copy(),
                counts=counts,
                rows_start=starts,
            )
        )

    def take(self, draft: ProposerInputBatch) -> Replay | None:
        """Empty the list: write the kept tokens into the draft's token history
        (``pre_ids``, which n-gram matching reads) and return their rows packed for the MTP
        forward, or None when no row is left."""
        rounds, self.rounds = self.rounds, []
        if not rounds:
            return None
        bsz = int(draft.seq_lens_this_time.shape[0])
        counts = np.zeros(bsz, np.int64)
        # per replayed row: its row in the concatenated hidden states, token, slot, which
        # round's step_idx, and how many tokens before that step_idx it sits
        rows: list[int] = []
        ids: list[int] = []
        slot: list[int] = []
        hist: list[int] = []
        back: list[int] = []
        starts = np.cumsum([0] + [int(sk.hidden.shape[0]) for sk in rounds])
        per_round = np.stack([sk.counts for sk in rounds])  # [rounds, N]
        for b in map(int, np.flatnonzero(per_round.sum(axis=0))):
            for r in map(int, np.flatnonzero(per_round[:, b])):
                sk, a = rounds[r], int(per_round[r, b])
                base = int(starts[r] + sk.rows_start[b])
                rows.extend(range(base, base + a))
                ids.extend(int(t) for t in sk.tokens[b, :a])
                slot.extend([b] * a)
                hist.extend([r * bsz + b] * a)
                back.extend(range(a, 0, -1))
                counts[b] += a
        if not ids:
            return None
        # the draft's history: token i of a round's a tokens sits at that round's step_idx - a + i
        steps = paddle.concat([sk.step_idx for sk in rounds])
        pos = paddle.gather(steps, paddle.to_tensor(hist, dtype="int64")) - paddle.to_tensor(
            back, dtype="int64"
        )
        slots_t = paddle.to_tensor(slot, dtype="int64")
        ids_t = paddle.to_tensor(ids, dtype="int64")
        width = int(draft.pre_ids.shape[1])
        draft.pre_ids[slots_t, pos.clip(0, width - 1)] = ids_t
        # a slot that stopped this step (preprocess zeroed its lengths) gets nothing written:
        # its rows become padding at the end of the batch
        counts_t = paddle.to_tensor(counts, dtype="int32")
        live = (draft.seq_lens_decoder >= counts_t) & ~draft.stop_flags.reshape([-1])
        this_time = paddle.where(live, counts_t, paddle.zeros_like(counts_t))
        cu = paddle.concat([paddle.zeros([1], "int32"), paddle.cumsum(this_time).astype("int32")])
        order = paddle.argsort((~paddle.gather(live, slots_t)).astype("int32"), stable=True)
        hidden = paddle.concat([sk.hidden for sk in rounds]).astype("float32")
        h = paddle.gather(paddle.gather(hidden, paddle.to_tensor(rows, dtype="int64")), order)
        return Replay(
            ids=paddle.gather(ids_t, order),
            hidden=h,
            cu_seqlens_q=cu,
            seq_lens_encoder=paddle.zeros_like(this_time),
            seq_lens_decoder=draft.seq_lens_decoder - this_time,
            seq_lens_this_time=this_time,
            max_rows=int(counts.max()),
        )
