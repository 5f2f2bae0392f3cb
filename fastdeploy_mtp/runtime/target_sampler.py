"""The target's sampler: from the logits of a step's output rows to the tokens (or candidate
rows) ``verify_draft_tokens`` checks the drafts against, and the logprobs of what was emitted.

Rows are the target runner's output rows: one per prefill item (its last token), ``1 +
drafts`` per decode item. Row ``j`` of the item in slot ``b`` predicts the token generated at
position ``g = step_idx[b] + j`` of its request. Everything runs with Paddle ops on the
logits' device; the host supplies only per-row scalars (slot, ``j``, and the uniforms, which
are a pure function of ``(seed, g)``: :func:`fastdeploy_mtp.ops.sampling.position_uniforms`).
See :mod:`fastdeploy_mtp.runtime.sampling_params` for the order of the transformations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle

from .. import ops
from ..ops.sampling import position_uniforms
from .input_batch import InputBatch
from .sampling_params import SamplingParams, TokenLogprob

#: Column of ``position_uniforms`` per use: the target's sample, REJECTION's accept test,
#: REJECTION's / TOPP's replacement draw.
SAMPLE_COLUMN, ACCEPT_COLUMN, DRAW_COLUMN = 0, 1, 2


@dataclass
class SampledRows:
    """What :meth:`TargetSampler.sample` produced for ``R`` rows.

    Attributes:
        tokens: ``[R]`` int64, the target's token per row (argmax for greedy rows, the seeded
            sample otherwise); what GREEDY / TARGET_MATCH verify against.
        candidate_ids / candidate_scores / candidate_lens: for REJECTION and TOPP, ``[R, C]``
            int64 / float32 and ``[R]`` int32 (greedy rows: the argmax alone, score 1).
        uniforms: ``[R, 2]`` float32 ``(u_accept, u_draw)`` for REJECTION / TOPP.
        logprobs: ``[R, V]`` float32 ``log_softmax`` of the processed logits, when a row's
            request asked for logprobs.
    """

    tokens: paddle.Tensor
    candidate_ids: paddle.Tensor | None = None
    candidate_scores: paddle.Tensor | None = None
    candidate_lens: paddle.Tensor | None = None
    uniforms: paddle.Tensor | None = None
    logprobs: paddle.Tensor | None = None


class TargetSampler:
    """Samples the target's rows of one step.

    Args:
        verify_strategy: an :class:`~fastdeploy_mtp.ops.VerifyStrategy` (which outputs are
            built: tokens for GREEDY / TARGET_MATCH, candidate rows for REJECTION / TOPP).
        max_model_len: the token buffers' row length (the penalty op's ``max_seq_len``).
    """

    def __init__(self, verify_strategy: int, max_model_len: int):
        self.strategy = int(verify_strategy)
        self.max_model_len = max_model_len
        #: per slot, the sampling parameters of its request (set when the slot is loaded)
        self.params: dict[int, SamplingParams] = {}
        self.seeds: dict[int, int] = {}

    def set_slot(self, idx: int, params: SamplingParams, seed: int) -> None:
        self.params[idx] = params
        self.seeds[idx] = seed

    def clear_slot(self, idx: int) -> None:
        self.params.pop(idx, None)
        self.seeds.pop(idx, None)

    def _param(self, idx: int) -> SamplingParams:
        return self.params.get(idx) or _GREEDY

    def needs_sampler(self, slots: np.ndarray) -> bool:
        """Whether rows of ``slots`` need more than the plain argmax (GREEDY's fast path)."""
        for b in set(int(s) for s in slots):
            p = self._param(b)
            if not p.greedy or p.logprobs is not None or p.penalised:
                return True
        return self.strategy in (ops.VerifyStrategy.REJECTION, ops.VerifyStrategy.TOPP)

    # ---- the rows ---------------------------------------------------------------------------
    @paddle.no_grad()
    def sample(
        self,
        logits: paddle.Tensor,
        row_slot: np.ndarray,
        row_j: np.ndarray,
        inputs: InputBatch,
        step_idx: np.ndarray,
    ) -> SampledRows:
        """Sample ``logits`` ``[R, V]`` (float32; rows of slots ``row_slot``, offsets
        ``row_j`` within their items) with the target buffers ``inputs`` (history, drafts,
        EOS ids) and the host copy ``step_idx`` ``[N]``."""
        logits = logits.astype("float32")
        r, v = int(logits.shape[0]), int(logits.shape[1])
        params = [self._param(int(b)) for b in row_slot]
        if any(p.penalised for p in params):
            logits = self._penalise(logits, row_slot, inputs, step_idx)
        if any(p.min_tokens > 0 and p.stop_token_ids for p in params):
            logits = _hold_stop_ids(logits, params, row_slot, row_j, step_idx)
        temps = np.array([1.0 if p.greedy else p.temperature for p in params], np.float32)
        greedy = np.array([p.greedy for p in params], bool)
        argmax = paddle.argmax(logits, axis=-1).astype("int64")
        scaled = logits / paddle.to_tensor(temps).reshape([r, 1])
        out = SampledRows(tokens=argmax)
        if any(p.logprobs is not None for p in params):
            out.logprobs = paddle.nn.functional.log_softmax(scaled, axis=-1)
        sampling_rows = not greedy.all()
        rejection_like = self.strategy in (ops.VerifyStrategy.REJECTION, ops.VerifyStrategy.TOPP)
        if not sampling_rows and not rejection_like:
            return out
        probs = paddle.nn.functional.softmax(scaled, axis=-1)
        sorted_p, sorted_idx = paddle.topk(probs, k=v, axis=-1)
        kept = paddle.where(
            self._keep_mask(sorted_p, params, v), sorted_p, paddle.zeros_like(sorted_p)
        )
        kept_mass = paddle.clip(kept.sum(axis=-1, keepdim=True), min=1e-30)
        # TOPP's candidate scores are upstream's raw probabilities; the others' the filtered
        # distribution
        scores = kept if self.strategy == ops.VerifyStrategy.TOPP else kept / kept_mass
        g = step_idx[row_slot].astype(np.int64) + row_j.astype(np.int64)
        seeds = np.array([self.seeds.get(int(b), 0) for b in row_slot], np.int64)
        if sampling_rows:
            u = paddle.to_tensor(position_uniforms(seeds, g, SAMPLE_COLUMN)).reshape([r, 1])
            filtered = (
                paddle.put_along_axis(paddle.zeros_like(probs), sorted_idx, kept, axis=-1)
                / kept_mass
            )
            cum = paddle.cumsum(filtered, axis=-1)
            pick = (cum <= u).astype("int64").sum(axis=-1)
            # rounding can leave u above the last cumulative sum: take the last kept token
            last = (v - 1) - paddle.argmax(
                paddle.flip((filtered > 0).astype("int64"), axis=[-1]), axis=-1
            )
            pick = paddle.minimum(pick, last.astype("int64"))
            out.tokens = paddle.where(paddle.to_tensor(greedy), argmax, pick)
        if rejection_like:
            one_hot_ids = argmax.reshape([r, 1])
            is_greedy = paddle.to_tensor(greedy).reshape([r, 1])
            ids = paddle.where(
                is_greedy, paddle.concat([one_hot_ids, sorted_idx[:, 1:]], axis=-1), sorted_idx
            )
            first = paddle.zeros_like(scores)
            first[:, 0] = 1.0
            out.candidate_ids = ids.astype("int64")
            out.candidate_scores = paddle.where(is_greedy, first, scores)
            out.candidate_lens = paddle.where(
                is_greedy.reshape([r]),
                paddle.ones([r], dtype="int32"),
                (out.candidate_scores > 0).astype("int32").sum(axis=-1).astype("int32"),
            )
            ua = position_uniforms(seeds, g, ACCEPT_COLUMN)
            ud = position_uniforms(seeds, g, DRAW_COLUMN)
            out.uniforms = paddle.to_tensor(np.stack([ua, ud], axis=1))
        return out

    def _keep_mask(
        self, sorted_p: paddle.Tensor, params: list[SamplingParams], v: int
    ) -> paddle.Tensor:
        """``[R, V]`` bool over the descending-sorted probabilities: top-k, top-p, min-p."""
        r = len(params)
        rank = paddle.arange(v, dtype="int64").reshape([1, v])
        k = np.array([p.top_k if p.top_k > 0 else v for p in params], np.int64).reshape([r, 1])
        keep = rank < paddle.to_tensor(k)
        top_p = np.array([p.top_p for p in params], np.float32).reshape([r, 1])
        before = paddle.cumsum(sorted_p, axis=-1) - sorted_p  # mass of the better tokens
        keep = keep & ((before < paddle.to_tensor(top_p)) | (rank == 0))
        min_p = np.array([p.min_p for p in params], np.float32).reshape([r, 1])
        keep = keep & (sorted_p >= paddle.to_tensor(min_p) * sorted_p[:, :1])
        return keep

    def _penalise(
        self, logits: paddle.Tensor, row_slot: np.ndarray, inputs: InputBatch, step_idx: np.ndarray
    ) -> paddle.Tensor:
        """Repetition / frequency / presence penalties and ``min_tokens`` with
        ``speculate_get_token_penalty_multi_scores``: row ``j`` counts the committed history
        and the drafts ``d1..dj`` it follows (exact under speculation)."""
        n = int(inputs.seq_lens_this_time.shape[0])
        r = int(logits.shape[0])
        cu = np.zeros([n + 1], np.int32)
        for b in range(n):
            cu[b] = int(np.searchsorted(row_slot, b))
        cu[n] = r
        cur_len = np.where(step_idx >= 0, step_idx, 0).astype(np.int64)
        logits = logits.clone()
        ops.speculate_get_token_penalty_multi_scores(
            token_ids_all=inputs.token_ids_all,
            prompt_lens=inputs.prompt_lens,
            logits=logits,
            penalty_scores=inputs.penalty_score,
            frequency_scores=inputs.frequency_score,
            presence_scores=inputs.presence_score,
            temperatures=paddle.ones([n, 1], dtype="float32"),  # temperature is applied after
            bad_tokens=inputs.bad_tokens,
            bad_tokens_len=inputs.bad_tokens_len,
            cur_len=paddle.to_tensor(cur_len),
            min_len=inputs.min_dec_len.reshape([n]),
            eos_token_id=inputs.eos_token_id.reshape([-1]),
            seq_lens_this_time=inputs.seq_lens_this_time,
            batch_id_per_token_output=paddle.to_tensor(row_slot.astype(np.int32)),
            cu_seqlens_q_output=paddle.to_tensor(cu),
            max_seq_len=self.max_model_len,
            step_input_ids=inputs.draft_tokens,
        )
        return logits

    # ---- logprobs of the emitted tokens ----------------------------------------------------
    def emitted_logprobs(
        self,
        logprobs: paddle.Tensor,
        row_slot: np.ndarray,
        accept_tokens: np.ndarray,
        accept_num: np.ndarray,
    ) -> dict[int, list[TokenLogprob]]:
        """Per slot whose request asked for logprobs: the logprob of each emitted token (the
        ``i``-th emitted token was decided at the slot's ``i``-th row) and the top ``k``."""
        out: dict[int, list[TokenLogprob]] = {}
        starts: dict[int, int] = {}
        for i, b in enumerate(row_slot):
            starts.setdefault(int(b), i)
        wanted = [
            b for b in starts if self._param(b).logprobs is not None and int(accept_num[b]) > 0
        ]
        if not wanted:
            return out
        rows = [starts[b] + i for b in wanted for i in range(int(accept_num[b]))]
        table = paddle.gather(logprobs, paddle.to_tensor(rows, dtype="int64")).numpy()
        at = 0
        for b in wanted:
            k = int(self._param(b).logprobs or 0)
            entries = []
            for i in range(int(accept_num[b])):
                row = table[at]
                at += 1
                token = int(accept_tokens[b, i])
                top: list[tuple[int, float]] = []
                if k:
                    best = np.argsort(-row, kind="stable")[:k]
                    top = [(int(t), float(row[t])) for t in best]
                entries.append(TokenLogprob(token, float(row[token]), top))
            out[b] = entries
        return out


_GREEDY = SamplingParams()


#: The logit a banned token gets (the penalty op's own value for EOS under ``min_tokens``).
_BANNED = -1e10


def _hold_stop_ids(
    logits: paddle.Tensor,
    params: list[SamplingParams],
    row_slot: np.ndarray,
    row_j: np.ndarray,
    step_idx: np.ndarray,
) -> paddle.Tensor:
    """Ban each row's ``stop_token_ids`` while its request has generated fewer than
    ``min_tokens`` (a row ``j`` of slot ``b`` generates token number ``step_idx[b] + j``), as
    the penalty op bans the EOS ids: vLLM's ``min_tokens`` holds back EOS and the stop ids
    alike, and a served model's EOS ids reach the engine as stop ids."""
    r, v = int(logits.shape[0]), int(logits.shape[1])
    banned = np.zeros([r, v], bool)
    for row, p in enumerate(params):
        done = int(step_idx[row_slot[row]])
        if p.stop_token_ids and done >= 0 and done + int(row_j[row]) < p.min_tokens:
            ids = [t for t in p.stop_token_ids if 0 <= t < v]
            banned[row, ids] = True
    if not banned.any():
        return logits
    return paddle.where(paddle.to_tensor(banned), paddle.full_like(logits, _BANNED), logits)
