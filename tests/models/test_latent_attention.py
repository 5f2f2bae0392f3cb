"""The latent paged backend (multi-head latent attention) against a per-item numpy
computation: the absorbed path and the path that rebuilds keys and values agree with it (and
with each other within 1e-5) on a mixed prefill + decode + idle batch with padding rows and
shuffled blocks, and the cache receives exactly the new rows' latents."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.models import make_forward_meta
from fastdeploy_mtp.models.latent_attention import LatentAttentionBackend, LatentShape

SHAPE = LatentShape(
    num_heads=3, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=5
)
BLOCK, BLOCKS, SCALE = 4, 12, 0.37
#: (new rows, cached rows) per item: a prefill, a decode, an idle item, a 3-row verify
ITEMS = [(6, 0), (1, 9), (0, 5), (3, 4)]
PADDING = 2


def batch(rng: np.random.Generator):
    """Random queries, new latents, kv_b weight, a random old cache and shuffled block tables."""
    t = sum(n for n, _ in ITEMS) + PADDING
    q = rng.standard_normal((t, SHAPE.num_heads, SHAPE.qk_head_dim)).astype(np.float32)
    latent = rng.standard_normal((t, SHAPE.latent_dim)).astype(np.float32)
    w = (rng.standard_normal((SHAPE.kv_lora_rank, SHAPE.num_heads * 9)) / 3).astype(np.float32)
    cache = rng.standard_normal((BLOCKS, 1, BLOCK, SHAPE.latent_dim)).astype(np.float32)
    order = rng.permutation(BLOCKS)
    tables = np.full((len(ITEMS), 4), -1, np.int32)
    for b in range(len(ITEMS)):
        tables[b, :3] = order[3 * b : 3 * b + 3]
    return q, latent, w, cache, tables


def numpy_reference(q, latent, w, cache, tables):
    """Per item and head: write the new latents, rebuild k/v from the whole context, attend."""
    cache = cache.copy()
    outs, row = [], 0
    wk = w.reshape(SHAPE.kv_lora_rank, SHAPE.num_heads, 9)
    for b, (n, past) in enumerate(ITEMS):
        for i in range(n):
            p = past + i
            cache[tables[b, p // BLOCK], 0, p % BLOCK] = latent[row + i]
        ctx = (
            np.stack([cache[tables[b, p // BLOCK], 0, p % BLOCK] for p in range(past + n)])
            if n
            else None
        )
        for i in range(n):
            heads = []
            for h in range(SHAPE.num_heads):
                c, kpe = (
                    ctx[: past + i + 1, : SHAPE.kv_lora_rank],
                    ctx[: past + i + 1, SHAPE.kv_lora_rank :],
                )
                k = np.concatenate([c @ wk[:, h, :4], kpe], axis=1)
                s = (k @ q[row + i, h]) * SCALE
                p = np.exp(s - s.max())
                heads.append((p / p.sum()) @ (c @ wk[:, h, 4:]))
            outs.append(np.concatenate(heads))
        row += n
    outs += [np.zeros(SHAPE.num_heads * SHAPE.v_head_dim, np.float32)] * PADDING
    return np.stack(outs), cache


@pytest.mark.parametrize("absorbed", [True, False])
def test_latent_backend_matches_numpy_on_a_mixed_batch(absorbed: bool) -> None:
    q, latent, w, cache, tables = batch(np.random.default_rng(3))
    backend = LatentAttentionBackend(SHAPE, BLOCK, SCALE)
    backend.absorbed = absorbed
    assert backend.get_kv_cache_shape(BLOCKS) == [BLOCKS, 1, BLOCK, 10]
    caches = [paddle.to_tensor(cache)]
    t = q.shape[0]
    meta = make_forward_meta(
        [n for n, _ in ITEMS],
        [p for _, p in ITEMS],
        tables,
        caches,
        BLOCK,
        ids_remove_padding=np.zeros(t),
    )
    out = backend.forward(
        paddle.to_tensor(q), paddle.to_tensor(latent), paddle.to_tensor(w), 0, meta
    ).numpy()
    want, want_cache = numpy_reference(q, latent, w, cache, tables)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(caches[0].numpy(), want_cache)  # only the new rows' slots changed


def test_absorbed_and_rebuilt_paths_agree_within_1e_5() -> None:
    q, latent, w, cache, tables = batch(np.random.default_rng(8))
    outs = []
    for absorbed in (True, False):
        backend = LatentAttentionBackend(SHAPE, BLOCK, SCALE)
        backend.absorbed = absorbed
        meta = make_forward_meta(
            [n for n, _ in ITEMS], [p for _, p in ITEMS], tables, [paddle.to_tensor(cache)], BLOCK,
            ids_remove_padding=np.zeros(q.shape[0]),
        )  # fmt: skip
        outs.append(
            backend.forward(
                paddle.to_tensor(q), paddle.to_tensor(latent), paddle.to_tensor(w), 0, meta
            )
        )
    np.testing.assert_allclose(outs[0].numpy(), outs[1].numpy(), rtol=0, atol=1e-5)


def test_a_cache_of_the_wrong_shape_or_a_missing_layer_is_refused() -> None:
    backend = LatentAttentionBackend(SHAPE, BLOCK, SCALE)
    meta = make_forward_meta(
        [1], [0], np.zeros((1, 1), np.int32), [paddle.zeros([2, 1, BLOCK, 9])], BLOCK
    )
    with pytest.raises(ValueError, match=r"layer 0 latent cache must be \[2, 1, 4, 10\]"):
        backend.layer_cache(0, meta)
    with pytest.raises(ValueError, match="latent layer 1 needs at least 2"):
        backend.layer_cache(1, meta)
    assert len(backend.allocate_caches(3, 2)) == 3
