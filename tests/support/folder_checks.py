"""What the model-folder tests share: one packed prefill through a model's paged path, the
relative error they measure against transformers, the target's comparison with transformers'
(logits, hidden states, greedy tokens), and the TP 2 expert-slice check."""

from __future__ import annotations

import numpy as np
import paddle

from fastdeploy_mtp.models import contiguous_block_tables, greedy_generate, make_forward_meta
from fastdeploy_mtp.models.mtp_layer import MTPStack
from tests.support import reference_models


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """``max |got - want| / max |want|``."""
    return float(np.abs(got - want).max() / np.abs(want).max())


def prefill_with_caches(
    model, ids, hidden=None, layer: int = 0
) -> tuple[paddle.Tensor, list[paddle.Tensor]]:
    """One packed prefill of ``ids`` at positions 0.. through ``model`` (the target, or an MTP
    model fed ``hidden [S, H]``; ``layer`` of an :class:`MTPStack`) with fresh paged caches
    (blocks shuffled); returns (its hidden states, the caches)."""
    cfg = model.config
    tables, nblocks = contiguous_block_tables([len(ids)], cfg.block_size, shuffle_seed=1)
    caches = model.attn_backend.allocate_caches(model.num_cache_layers, nblocks)
    meta = make_forward_meta(
        [len(ids)], [0], tables, caches, cfg.block_size, ids_remove_padding=np.asarray(ids)
    )
    if hidden is None:
        return model(meta.ids_remove_padding, meta), caches
    extra = {"layer": layer} if isinstance(model, MTPStack) else {}
    return model(meta.ids_remove_padding, paddle.to_tensor(hidden), meta, **extra), caches


def prefill(model, ids, hidden=None, layer: int = 0) -> paddle.Tensor:
    """The hidden states of :func:`prefill_with_caches`."""
    return prefill_with_caches(model, ids, hidden, layer)[0]


def assert_target_matches_transformers(
    target, hidden, path, prompt, rtol: float, greedy=reference_models.recomputed_greedy
) -> None:
    """``target``'s logits of ``hidden`` (its prefill of ``prompt``) and ``hidden`` itself are
    within ``rtol`` of transformers' for the folder ``path``, and 12 greedy tokens after the
    prompt's first 6 equal ``greedy``'s (the reference's greedy tokens)."""
    want = reference_models.logits(path, [prompt])[0]
    assert relative_error(target.compute_logits(hidden).numpy(), want) <= rtol
    assert relative_error(hidden.numpy(), reference_models.hidden(path, [prompt])[0]) <= rtol
    assert greedy_generate(target, prompt[:6], 12) == greedy(path, prompt[:6], 12)


def assert_two_ranks_hold_their_expert_slices(path, full, full_mtp) -> None:
    """Load the folder ``path`` at TP 2, rank by rank: every parameter of ``full`` /
    ``full_mtp`` (the TP 1 models) is there, each expert's gate/up projections are split by
    columns and its down projection by rows, and the router (with its correction bias) is
    replicated."""
    from fastdeploy_mtp.models import load_model

    whole = {
        **dict(full.named_parameters()),
        **{f"mtp.{n}": p for n, p in full_mtp.named_parameters()},
    }
    for rank in range(2):
        target, mtp, _ = load_model(path, tensor_parallel_size=2, tensor_parallel_rank=rank)
        params = {
            **dict(target.named_parameters()),
            **{f"mtp.{n}": p for n, p in mtp.named_parameters()},
        }
        assert set(params) == set(whole)
        for name, p in params.items():
            full_value = whole[name].numpy()
            if "experts." in name and name.endswith(("gate_proj.weight", "up_proj.weight")):
                np.testing.assert_array_equal(p.numpy(), np.split(full_value, 2, axis=1)[rank])
            elif "experts." in name and name.endswith("down_proj.weight"):
                np.testing.assert_array_equal(p.numpy(), np.split(full_value, 2, axis=0)[rank])
            elif ".mlp.gate." in name:  # the router and its correction bias: replicated
                np.testing.assert_array_equal(p.numpy(), full_value)
