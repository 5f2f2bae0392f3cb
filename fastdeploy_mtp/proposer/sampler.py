"""The MTP sampler: greedy, as FastDeploy's GPU ``MTPSampler`` (argmax, no penalties)."""

from __future__ import annotations

import paddle


class MTPSampler:
    """``logits [n, V]`` float32 -> ``next_tokens [n]`` int64 = ``argmax`` over the vocabulary
    (the padded tail is ``-inf``, so it never wins).

    With tensor parallelism every rank must propose the same drafts; ranks other than 0 take
    rank 0's tokens (``broadcast``), as FastDeploy does.
    """

    def __init__(self, tensor_parallel_size: int = 1):
        self.tensor_parallel_size = tensor_parallel_size

    def __call__(self, logits: paddle.Tensor) -> paddle.Tensor:
        next_tokens = paddle.argmax(logits, axis=-1).astype("int64")
        if self.tensor_parallel_size > 1:
            import paddle.distributed as dist

            dist.broadcast(next_tokens, src=0)
        return next_tokens
