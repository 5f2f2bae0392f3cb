"""The shipped tiny checkpoint: byte tokenizer, paged-cache helpers, evaluation, greedy
generation, save and load."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import paddle
import paddle.nn.functional as F

from ..constants import NO_BLOCK_ID
from .corpus import EOT_ID
from .dense_attention import causal_bias
from .folder_inspection import ASSETS_DIR
from .hf_config import UnsupportedModelError
from .host_forward_meta import make_forward_meta
from .loading import state_to_numpy
from .model_config import ModelConfig
from .model_folder import load_model
from .mtp_layer import MTPLayer, MTPStack
from .target import TinyTargetModel

#: Directory of the shipped checkpoint.
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.json"
#: The byte tokenizer's files, the same in every tiny checkpoint folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: Prefix of the MTP layer's tensors in our own checkpoint format.
MTP_PREFIX = "mtp."


class ByteTokenizer:
    """Bytes are tokens: ids 0..255 are the UTF-8 bytes of the text and id 256
    (:data:`~fastdeploy_mtp.models.corpus.EOT_ID`) is ``<|endoftext|>``, the model's EOS,
    which has no text (ids 257.. of the padded vocabulary never occur)."""

    vocab_size = EOT_ID + 1
    eos_token_id = EOT_ID

    def encode(self, text: str | bytes) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return list(data)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (bytes, invalid UTF-8 as U+FFFD), the end-of-text id left out."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i <= EOT_ID]
        if bad:
            raise ValueError(f"`ids` must be bytes (0..255) or {EOT_ID}, got {bad[:5]}")
        return bytes(i for i in ids if i != EOT_ID).decode("utf-8", errors="replace")


def contiguous_block_tables(
    seq_capacity: Sequence[int], block_size: int, shuffle_seed: int | None = None
) -> tuple[np.ndarray, int]:
    """Block tables giving item ``b`` room for ``seq_capacity[b]`` tokens.

    Returns ``(block_tables [B, max_blocks] int32 with -1 padding, num_blocks)``. Blocks are
    handed out in order, or in a random permutation when ``shuffle_seed`` is given.
    """
    need = [-(-int(c) // block_size) for c in seq_capacity]
    total = max(1, sum(need))
    order = np.arange(total)
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(total)
    tables = np.full([len(need), max(1, max(need, default=1))], NO_BLOCK_ID, np.int32)
    k = 0
    for b, n in enumerate(need):
        tables[b, :n] = order[k : k + n]
        k += n
    return tables, total


@paddle.no_grad()
def evaluate_dense(
    target: TinyTargetModel,
    mtp: MTPLayer,
    data: np.ndarray,
    seq_len: int,
    max_windows: int | None = None,
    batch_size: int = 64,
) -> dict[str, float]:
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
        ids = paddle.to_tensor(windows[s : s + batch_size])
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
    return {
        "main_loss": round(sums[0] / counts[0], 5),
        "main_top1": round(sums[1] / counts[0], 5),
        "mtp_loss": round(sums[2] / counts[1], 5),
        "mtp_top1": round(sums[3] / counts[1], 5),
        "windows": int(len(windows)),
    }


@paddle.no_grad()
def score_windows(
    target: TinyTargetModel, data: np.ndarray, window: int, num_windows: int
) -> float:
    """Mean next-token CE (nats/byte) of the first ``num_windows * window`` bytes of
    ``data``, scored through the serving path: one packed prefill batch with ``num_windows``
    items of ``window`` tokens each and a paged KV cache. Each window predicts its own
    ``window - 1`` next bytes (no context across windows)."""
    data = np.asarray(data, dtype=np.int64)
    if len(data) < num_windows * window:
        raise ValueError(f"`data` has {len(data)} bytes, need {num_windows * window}")
    ids = data[: num_windows * window].reshape(num_windows, window)
    cfg = target.config
    tables, nblocks = contiguous_block_tables([window] * num_windows, cfg.block_size)
    caches = target.attn_backend.allocate_caches(target.num_cache_layers, nblocks)
    meta = make_forward_meta(
        [window] * num_windows,
        [0] * num_windows,
        tables,
        caches,
        cfg.block_size,
        ids_remove_padding=ids.reshape(-1),
    )
    logits = target.compute_logits(target(meta.ids_remove_padding, meta))
    logits = logits.reshape([num_windows, window, -1])[:, :-1]
    labels = paddle.to_tensor(ids[:, 1:]).unsqueeze(-1)
    return float(F.cross_entropy(logits, labels).mean())


@paddle.no_grad()
def greedy_generate(
    target: TinyTargetModel, prompt: Sequence[int], max_new_tokens: int
) -> list[int]:
    """Greedy continuation of one prompt with the paged KV cache: one prefill, then one
    decode step per new token. Returns the new token ids."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("`prompt` must not be empty")
    return greedy_generate_batch(target, np.asarray([prompt], np.int64), max_new_tokens)[0].tolist()


@paddle.no_grad()
def greedy_generate_batch(
    target: TinyTargetModel, prompts: np.ndarray, max_new_tokens: int
) -> np.ndarray:
    """Greedy continuations of ``prompts [B, P]`` (equal lengths, ints) through the paged KV
    cache, all items in one packed batch: one prefill, then one decode step per new token.
    Returns ``[B, max_new_tokens]`` int64 new token ids."""
    cfg = target.config
    prompts = np.asarray(prompts, np.int64)
    if prompts.ndim != 2 or prompts.shape[1] == 0:
        raise ValueError(f"`prompts` must be [B, P] with P > 0, got shape {list(prompts.shape)}")
    b, p = prompts.shape
    tables, nblocks = contiguous_block_tables([p + max_new_tokens] * b, cfg.block_size)
    caches = target.attn_backend.allocate_caches(target.num_cache_layers, nblocks)
    out = np.zeros([b, max_new_tokens], np.int64)
    step_ids, past = prompts, 0
    for i in range(max_new_tokens):
        n = step_ids.shape[1]
        meta = make_forward_meta(
            [n] * b, [past] * b, tables, caches, cfg.block_size, ids_remove_padding=step_ids
        )
        meta.max_rows_per_item = n  # lets the backend group each item's rows
        hidden = target(meta.ids_remove_padding, meta).reshape([b, n, -1])[:, -1]
        out[:, i] = target.compute_logits(hidden).argmax(-1).numpy()
        past += n
        step_ids = out[:, i : i + 1]
    return out


def save_tiny(
    out_dir: str,
    target: TinyTargetModel,
    mtp: MTPLayer | MTPStack,
    config: ModelConfig,
    metrics: dict | None = None,
) -> None:
    """Write ``model.safetensors`` (target tensors under their own names, MTP tensors under
    ``mtp.``; Paddle ``[in, out]`` layout, float32), ``config.json``, ``metrics.json`` and the
    byte tokenizer's files (copied from the shipped folder: every tiny checkpoint reads bytes),
    so that ``out_dir`` is a model folder every command serves."""
    import shutil

    from safetensors.numpy import save_file

    os.makedirs(out_dir, exist_ok=True)
    tensors = state_to_numpy(target)
    tensors.update(state_to_numpy(mtp, MTP_PREFIX))
    save_file(
        tensors,
        os.path.join(out_dir, WEIGHTS_FILE),
        metadata={"format": "fastdeploy_mtp.tiny", "layout": "paddle [in, out]"},
    )
    config.save_json(os.path.join(out_dir, CONFIG_FILE))
    for name in TOKENIZER_FILES:
        if os.path.abspath(out_dir) != os.path.abspath(ASSETS_DIR):
            shutil.copyfile(os.path.join(ASSETS_DIR, name), os.path.join(out_dir, name))
    if metrics is not None:
        with open(os.path.join(out_dir, METRICS_FILE), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2, sort_keys=True)
            f.write("\n")


def load_tiny(
    path: str | None = None, tensor_parallel_size: int = 1, tensor_parallel_rank: int = 0
) -> tuple[TinyTargetModel, MTPLayer | MTPStack, ModelConfig]:
    """Load the shipped (or a saved) tiny checkpoint, whole or one tensor-parallel shard:
    :func:`~fastdeploy_mtp.models.model_folder.load_model` of ``path`` (default:
    ``fastdeploy_mtp/assets``), which must have an MTP layer.

    Args:
        path: model folder with ``model.safetensors`` and ``config.json``.
        tensor_parallel_size, tensor_parallel_rank: load rank ``tensor_parallel_rank``'s shard
            of a ``tensor_parallel_size``-way split, sliced from the full checkpoint (see
            :mod:`~fastdeploy_mtp.models.parallel_layers`). With a size above 1 the models
            run only inside the group made by
            :func:`fastdeploy_mtp.distributed.init_tensor_parallel`.

    Returns:
        ``(target, mtp, config)`` in eval mode; ``mtp`` (an :class:`MTPLayer`, or an
        :class:`MTPStack` when ``config.num_nextn_predict_layers > 1``) shares the target's
        embedding and head. ``config`` is the full model's (unsharded) config.

    Raises:
        UnsupportedModelError: the folder cannot be loaded (see ``inspect_model_folder``) or
            has no MTP layer.
        ValueError: a config field (``num_attention_heads``, ``num_key_value_heads``,
            ``intermediate_size``, ``vocab_size``) not divisible by ``tensor_parallel_size``,
            or a rank outside ``[0, tensor_parallel_size)``.
    """
    folder = path or ASSETS_DIR
    target, mtp, config = load_model(
        folder, tensor_parallel_size=tensor_parallel_size, tensor_parallel_rank=tensor_parallel_rank
    )
    if mtp is None:
        raise UnsupportedModelError(
            f"model folder {folder}: load_tiny needs an MTP layer (num_nextn_predict_layers is 0)"
        )
    return target, mtp, config
