"""The MTP sampler: greedy, as FastDeploy's GPU ``MTPSampler`` (argmax, no penalties), and
the draft log-probabilities of the slots whose requests ask for them
(``include_draft_logprobs``, FastDeploy's ``speculate_get_logits`` path)."""

from __future__ import annotations

import numpy as np
import paddle

from ..constants import PLACEHOLDER_TOKEN_ID
from ..runtime.sampling_params import TokenLogprob


def chosen_logprobs(logits: paddle.Tensor, rows: list[int], tokens: paddle.Tensor) -> np.ndarray:
    """``log_softmax(logits[r])[tokens[r]]`` for each row ``r`` of ``rows`` (float32 on the
    host); only those rows are normalised."""
    index = paddle.to_tensor(rows, dtype="int64")
    picked = paddle.gather(logits, index).astype("float32")
    logprobs = paddle.nn.functional.log_softmax(picked, axis=-1)
    chosen = paddle.gather(tokens.astype("int64"), index).unsqueeze(1)
    return paddle.take_along_axis(logprobs, chosen, axis=1).reshape([-1]).numpy()


class MTPSampler:
    """``logits [n, V]`` float32 -> ``next_tokens [n]`` int64 = ``argmax`` over the vocabulary
    (the padded tail is ``-inf``, so it never wins).

    With tensor parallelism every rank must propose the same drafts; ranks other than 0 take
    rank 0's tokens (``broadcast``), as FastDeploy does.

    Draft log-probabilities: for the slots in :attr:`wanted` (set by the runner before each
    round), :meth:`record` keeps each substep's draft and its log-probability; the next step
    verifies those drafts and :meth:`verified` hands them out. With :attr:`wanted` empty
    nothing is computed or read back.
    """

    def __init__(self, tensor_parallel_size: int = 1):
        self.tensor_parallel_size = tensor_parallel_size
        #: slots whose requests asked for draft logprobs
        self.wanted: set[int] = set()
        #: this round's drafts of the wanted slots: slot -> substep -> (token, logprob)
        self._recorded: dict[int, dict[int, TokenLogprob]] = {}

    def __call__(self, logits: paddle.Tensor) -> paddle.Tensor:
        next_tokens = paddle.argmax(logits, axis=-1).astype("int64")
        if self.tensor_parallel_size > 1:
            import paddle.distributed as dist

            dist.broadcast(next_tokens, src=0)
        return next_tokens

    def new_round(self) -> None:
        """Forget the drafts of the previous round (a round writes every draft slot anew)."""
        self._recorded = {}

    def record(
        self,
        logits: paddle.Tensor,
        tokens: paddle.Tensor,
        seq_lens_this_time: paddle.Tensor,
        substep: int,
    ) -> None:
        """Keep substep ``substep``'s draft and its log-probability for every wanted slot that
        runs in it. Row ``k`` of ``logits``/``tokens`` belongs to the ``k``-th slot with
        ``seq_lens_this_time > 0`` (``eagle_gather_hidden_states`` compacts the running slots
        in slot order; ``draft_model_update`` reads ``tokens`` the same way)."""
        running = np.flatnonzero(seq_lens_this_time.numpy().reshape(-1) > 0)
        slots = [int(b) for b in running if int(b) in self.wanted]
        if not slots:
            return
        row_of = {int(b): k for k, b in enumerate(running)}
        rows = [row_of[b] for b in slots]
        values = chosen_logprobs(logits, rows, tokens)
        ids = paddle.gather(tokens, paddle.to_tensor(rows, dtype="int64")).numpy()
        for b, token, value in zip(slots, ids, values):
            self._recorded.setdefault(b, {})[substep] = TokenLogprob(int(token), float(value))

    def verified(self, drafts: np.ndarray, slots: list[int]) -> dict[int, list[TokenLogprob]]:
        """For each of ``slots``: the drafts of ``drafts [N, K]`` (the ones a step just
        verified; they are the last round's) that the MTP layer proposed, with their
        log-probabilities: the leading drafts that match what :meth:`record` kept (n-gram
        drafts after them are not the layer's). A slot without drafts gets an empty list."""
        out: dict[int, list[TokenLogprob]] = {}
        for b in slots:
            kept = self._recorded.get(b, {})
            row: list[TokenLogprob] = []
            for j, token in enumerate(drafts[b]):
                got = kept.get(j)
                if int(token) == PLACEHOLDER_TOKEN_ID or got is None or got.token_id != int(token):
                    break
                row.append(got)
            out[b] = row
        return out
