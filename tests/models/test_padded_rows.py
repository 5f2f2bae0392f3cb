"""Padding rows past sum(seq_lens_this_time) (an engine passing an upper bound of the token
count, e.g. the proposer's overlap mode): real rows are unchanged and padding rows never reach
the KV cache (their own outputs carry no meaning)."""

from __future__ import annotations

import numpy as np
import paddle

from fastdeploy_mtp.models import contiguous_block_tables, make_forward_meta


def test_padding_rows_do_not_change_real_rows_or_the_cache(random_model):
    target, mtp = random_model
    cfg = target.config
    lens, past = [3, 0, 2], [0, 0, 5]
    tables, nblocks = contiguous_block_tables([16, 16, 16], cfg.block_size)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.ori_vocab_size, size=sum(lens))
    results = []
    for pad in (0, 4):
        paddle.seed(0)
        caches = mtp.attn_backend.allocate_caches(1, nblocks)
        padded = np.concatenate([ids, np.full(pad, 2)])
        meta = make_forward_meta(
            lens, past, tables, caches, cfg.block_size, ids_remove_padding=padded
        )
        hidden = paddle.to_tensor(
            rng.standard_normal((len(padded), cfg.hidden_size)).astype("float32")
        )
        if pad:
            hidden[: len(ids)] = results[0][2]
        out = mtp(meta.ids_remove_padding, hidden, meta)
        results.append((out.numpy(), [c.numpy().copy() for c in caches], hidden[: len(ids)]))
    (plain, plain_caches, _), (padded_out, padded_caches, _) = results
    np.testing.assert_allclose(padded_out[: len(ids)], plain, rtol=1e-6, atol=1e-6)
    assert padded_out.shape[0] == len(ids) + 4
    # same cache contents up to float rounding of the differently shaped matmuls (a padding
    # row written into the cache would change a slot completely)
    for a, b in zip(plain_caches, padded_caches):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert np.array_equal(a == 0, b == 0), "padding rows wrote into the cache"
