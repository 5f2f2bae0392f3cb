"""One packed prefill through a model's paged path, for the model-folder tests that compare it
with transformers, and the relative error they measure."""

from __future__ import annotations

import numpy as np
import paddle

from fastdeploy_mtp.models import contiguous_block_tables, make_forward_meta
from fastdeploy_mtp.models.mtp_layer import MTPStack


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """``max |got - want| / max |want|``."""
    return float(np.abs(got - want).max() / np.abs(want).max())


def prefill_with_caches(model, ids, hidden=None, layer: int = 0) -> tuple[paddle.Tensor, list[paddle.Tensor]]:
    """One packed prefill of ``ids`` at positions 0.. through ``model`` (the target, or an MTP
    model fed ``hidden [S, H]``; ``layer`` of an :class:`MTPStack`) with fresh paged caches
    (blocks shuffled); returns (its hidden states, the caches)."""
    cfg = model.config
    tables, nblocks = contiguous_block_tables([len(ids)], cfg.block_size, shuffle_seed=1)
    caches = model.attn_backend.allocate_caches(model.num_cache_layers, nblocks)
    meta = make_forward_meta([len(ids)], [0], tables, caches, cfg.block_size, ids_remove_padding=np.asarray(ids))
    if hidden is None:
        return model(meta.ids_remove_padding, meta), caches
    extra = {"layer": layer} if isinstance(model, MTPStack) else {}
    return model(meta.ids_remove_padding, paddle.to_tensor(hidden), meta, **extra), caches


def prefill(model, ids, hidden=None, layer: int = 0) -> paddle.Tensor:
    """The hidden states of :func:`prefill_with_caches`."""
    return prefill_with_caches(model, ids, hidden, layer)[0]
