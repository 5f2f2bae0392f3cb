"""The shipped tiny checkpoint: byte tokenizer, evaluation, save and load."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import paddle
import paddle.nn.functional as F

from .attention import causal_bias


@paddle.no_grad()
def evaluate_dense(target, mtp, data: np.ndarray, seq_len: int,
                   max_windows: Optional[int] = None, batch_size: int = 64) -> Dict[str, float]:
    """Teacher-forced held-out metrics over non-overlapping ``seq_len`` windows of ``data``.

    Args:
        target, mtp: the models (training/dense path).
        data: ``[N]`` uint8 bytes.
        seq_len: window length; each window gives ``seq_len - 1`` next-token predictions and
            ``seq_len - 2`` MTP (token-after-next) predictions.
        max_windows: evaluate only this many evenly spaced windows (quick evals).

    Returns:
        ``main_loss`` / ``mtp_loss`` (mean CE in nats per byte), ``main_top1`` /
        ``mtp_top1`` (accuracy of the argmax), ``windows``.
    """
    target.eval()
    mtp.eval()
    n_win = len(data) // seq_len
    idx = np.arange(n_win)
    if max_windows is not None and n_win > max_windows:
        idx = np.linspace(0, n_win - 1, max_windows).astype(np.int64)
    windows = data[: n_win * seq_len].reshape(n_win, seq_len)[idx].astype(np.int64)
    bias = causal_bias(seq_len)
    sums = np.zeros(4)
    counts = np.zeros(2)
    for s in range(0, len(windows), batch_size):
        ids = paddle.to_tensor(windows[s:s + batch_size])
        pre, post = target.forward_dense(ids, bias)
        hidden = target.mtp_hidden(pre, post)
        logits = target.compute_logits(hidden)[:, :-1]
        main_t = ids[:, 1:]
        mtp_logits = mtp.compute_logits(mtp.forward_dense(ids[:, 1:-1], hidden[:, :-2], bias))
        mtp_t = ids[:, 2:]
        sums[0] += float(F.cross_entropy(logits, main_t.unsqueeze(-1), reduction="sum"))
        sums[1] += float((logits.argmax(-1) == main_t).astype("float32").sum())
        sums[2] += float(F.cross_entropy(mtp_logits, mtp_t.unsqueeze(-1), reduction="sum"))
        sums[3] += float((mtp_logits.argmax(-1) == mtp_t).astype("float32").sum())
        counts += [main_t.size, mtp_t.size]
    target.train()
    mtp.train()
    return {"main_loss": round(sums[0] / counts[0], 5), "main_top1": round(sums[1] / counts[0], 5),
            "mtp_loss": round(sums[2] / counts[1], 5), "mtp_top1": round(sums[3] / counts[1], 5),
            "windows": int(len(windows))}


def save_tiny(out_dir, target, mtp, config, metrics):  # filled in after training starts
    raise NotImplementedError
