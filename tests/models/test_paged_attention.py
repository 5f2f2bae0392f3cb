"""The paged-KV-cache reference backend against full recomputation, the dense training
path and a direct numpy computation."""

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.models import causal_bias, contiguous_block_tables, make_forward_meta
from tests.support.models import build_models, small_config

import mtp_numpy_reference as ref

# float32 Paddle vs float32 Paddle (same math, different summation order / caching)
ATOL_SAME, RTOL_SAME = 2e-5, 2e-5
# float32 Paddle vs float64 numpy
ATOL_REF, RTOL_REF = 1e-4, 1e-4


def params_np(layer, prefix=""):
    return {prefix + n: p.numpy().astype(np.float64) for n, p in layer.named_parameters()}


def run_target(target, items, tables, caches):
    """items: list of (new_ids, past) -> per-item hidden [n, H] numpy."""
    cfg = target.config
    ids = np.concatenate([np.asarray(i, np.int64) for i, _ in items]) if items else []
    meta = make_forward_meta(
        [len(i) for i, _ in items],
        [p for _, p in items],
        tables,
        caches,
        cfg.block_size,
        ids_remove_padding=ids,
    )
    out = target(meta.ids_remove_padding, meta).numpy()
    splits = np.cumsum([len(i) for i, _ in items])[:-1]
    return np.split(out, splits)


def fresh_caches(model, num_blocks):
    return model.attn_backend.allocate_caches(model.num_cache_layers, num_blocks)


def test_kv_cache_shape_is_blocks_kvheads_blocksize_headdim(models, config):
    target, _ = models
    assert target.attn_backend.get_kv_cache_shape(7) == [
        7,
        config.num_key_value_heads,
        config.block_size,
        config.head_dim,
    ]
    with pytest.raises(ValueError, match="max_num_blocks"):
        target.attn_backend.get_kv_cache_shape(0)


def test_dense_path_matches_numpy(models, config):
    target, _ = models
    ids = np.random.default_rng(1).integers(0, config.ori_vocab_size, 23)
    _, post = target.forward_dense(paddle.to_tensor(ids[None]), causal_bias(23))
    expect = ref.target_hidden(ids, params_np(target), config)
    np.testing.assert_allclose(post.numpy()[0], expect, rtol=RTOL_REF, atol=ATOL_REF)


def test_kv_cache_decode_equals_full_recompute(models, config):
    target, _ = models
    ids = np.random.default_rng(2).integers(0, config.ori_vocab_size, 21)
    tables, nblocks = contiguous_block_tables([len(ids)], config.block_size)
    full = run_target(target, [(ids, 0)], tables, fresh_caches(target, nblocks))[0]
    expect = ref.target_hidden(ids, params_np(target), config)
    np.testing.assert_allclose(full, expect, rtol=RTOL_REF, atol=ATOL_REF)

    caches = fresh_caches(target, nblocks)
    got = [run_target(target, [(ids[:6], 0)], tables, caches)[0]]
    for t in range(6, len(ids)):  # one decode step per token
        got.append(run_target(target, [(ids[t : t + 1], t)], tables, caches)[0])
    np.testing.assert_allclose(np.concatenate(got), full, rtol=RTOL_SAME, atol=ATOL_SAME)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_equals_one_prefill(chunk):
    config = small_config(num_hidden_layers=1)
    target, _ = build_models(config, seed=3)
    ids = np.random.default_rng(3).integers(0, config.ori_vocab_size, 70)
    tables, nblocks = contiguous_block_tables([len(ids)], config.block_size)
    one = run_target(target, [(ids, 0)], tables, fresh_caches(target, nblocks))[0]
    caches = fresh_caches(target, nblocks)
    got = [
        run_target(target, [(ids[s : s + chunk], s)], tables, caches)[0]
        for s in range(0, len(ids), chunk)
    ]
    np.testing.assert_allclose(np.concatenate(got), one, rtol=RTOL_SAME, atol=ATOL_SAME)


def _three_step_batch(target, tables, num_blocks):
    """A prefill step then a mixed step (decode, chunk continuation, idle item, new prefill)."""
    rng = np.random.default_rng(4)
    v = target.config.ori_vocab_size
    seqs = [rng.integers(0, v, n) for n in (13, 9, 6, 11)]
    caches = fresh_caches(target, num_blocks)
    first = run_target(
        target,
        [(seqs[0][:12], 0), (seqs[1][:5], 0), (seqs[2], 0), (seqs[3][:0], 0)],
        tables,
        caches,
    )
    second = run_target(
        target,
        [(seqs[0][12:13], 12), (seqs[1][5:9], 5), (seqs[2][:0], 6), (seqs[3], 0)],
        tables,
        caches,
    )
    return seqs, first, second


def test_block_table_layouts_give_the_same_result(config):
    target, _ = build_models(config, seed=5)
    caps = [13, 9, 6, 11]
    contiguous, n = contiguous_block_tables(caps, config.block_size)
    shuffled, n_s = contiguous_block_tables(caps, config.block_size, shuffle_seed=11)
    # non-contiguous with gaps: every item's blocks are odd numbers spread over a bigger pool
    gappy = np.full([4, contiguous.shape[1] + 2], -1, np.int32)
    pool = list(range(2 * n + 3, 0, -2))
    for b, cap in enumerate(caps):
        for j in range(-(-cap // config.block_size)):
            gappy[b, j] = pool.pop()
    base = _three_step_batch(target, contiguous, n)
    for tables, blocks in ((shuffled, n_s), (gappy, 2 * n + 4)):
        other = _three_step_batch(target, tables, blocks)
        for a, b in zip(base[1] + base[2], other[1] + other[2]):
            np.testing.assert_allclose(b, a, rtol=RTOL_SAME, atol=ATOL_SAME)


def test_mixed_prefill_decode_batch_matches_per_sequence_recompute(config):
    target, _ = build_models(config, seed=6)
    caps = [13, 9, 6, 11]
    tables, n = contiguous_block_tables(caps, config.block_size, shuffle_seed=2)
    seqs, first, second = _three_step_batch(target, tables, n)
    w = params_np(target)
    full = [ref.target_hidden(s, w, config) for s in seqs]
    np.testing.assert_allclose(first[0], full[0][:12], rtol=RTOL_REF, atol=ATOL_REF)
    np.testing.assert_allclose(second[0], full[0][12:13], rtol=RTOL_REF, atol=ATOL_REF)
    np.testing.assert_allclose(first[1], full[1][:5], rtol=RTOL_REF, atol=ATOL_REF)
    np.testing.assert_allclose(second[1], full[1][5:9], rtol=RTOL_REF, atol=ATOL_REF)
    np.testing.assert_allclose(first[2], full[2], rtol=RTOL_REF, atol=ATOL_REF)
    assert second[2].shape == (0, config.hidden_size)
    assert first[3].shape == (0, config.hidden_size)
    np.testing.assert_allclose(second[3], full[3], rtol=RTOL_REF, atol=ATOL_REF)


@pytest.mark.parametrize(
    "concat_order,final_norm", [("emb_first", "in_forward"), ("hidden_first", "in_logits")]
)
def test_mtp_layer_paged_equals_dense_and_numpy(concat_order, final_norm):
    config = small_config(mtp_concat_order=concat_order, mtp_final_norm=final_norm)
    target, mtp = build_models(config, seed=7)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, config.ori_vocab_size, 18)
    hidden = rng.standard_normal((17, config.hidden_size)).astype(np.float32)
    next_ids = tokens[1:]  # MTP row p: token t_{p+1} with hidden h_p
    dense = mtp.forward_dense(
        paddle.to_tensor(next_ids[None]), paddle.to_tensor(hidden[None]), causal_bias(17)
    ).numpy()[0]
    tables, n = contiguous_block_tables([17], config.block_size, shuffle_seed=3)
    caches = mtp.attn_backend.allocate_caches(1, n)
    outs = []
    for start, stop in ((0, 10), (10, 11), (11, 17)):  # prefill, decode, verify-like chunk
        meta = make_forward_meta(
            [stop - start],
            [start],
            tables,
            caches,
            config.block_size,
            ids_remove_padding=next_ids[start:stop],
        )
        outs.append(
            mtp(meta.ids_remove_padding, paddle.to_tensor(hidden[start:stop]), meta).numpy()
        )
    paged = np.concatenate(outs)
    np.testing.assert_allclose(paged, dense, rtol=RTOL_SAME, atol=ATOL_SAME)
    w = params_np(mtp)
    emb = target.embed_tokens.weight.numpy().astype(np.float64)
    expect = ref.mtp_hidden(next_ids, hidden.astype(np.float64), w, emb, config)
    np.testing.assert_allclose(paged, expect, rtol=RTOL_REF, atol=ATOL_REF)
    logits = mtp.compute_logits(paddle.to_tensor(paged)).numpy()
    expect_logits = ref.mtp_logits(
        expect, w, target.lm_head.weight.numpy().astype(np.float64), config
    )
    v = config.ori_vocab_size
    np.testing.assert_allclose(logits[:, :v], expect_logits[:, :v], rtol=RTOL_REF, atol=ATOL_REF)


def test_compute_logits_masks_padded_vocab(models, config):
    target, mtp = models
    hidden = paddle.to_tensor(
        np.random.default_rng(8).standard_normal((5, config.hidden_size)).astype(np.float32)
    )
    for model in (target, mtp):
        logits = model.compute_logits(hidden)
        assert logits.dtype == paddle.float32
        assert list(logits.shape) == [5, config.vocab_size]
        arr = logits.numpy()
        assert np.all(np.isneginf(arr[:, config.ori_vocab_size :]))
        assert np.all(np.isfinite(arr[:, : config.ori_vocab_size]))


def test_empty_batch_and_empty_input_forward(models, config):
    target, mtp = models
    tables, n = contiguous_block_tables([4, 4], config.block_size)
    caches = fresh_caches(target, n)
    out = run_target(target, [([], 0), ([], 3)], tables, caches)
    assert all(o.shape == (0, config.hidden_size) for o in out)
    assert np.all(caches[0].numpy() == 0), "an empty step must not write the cache"
    assert target.empty_input_forward(None) is None
    assert mtp.empty_input_forward(None) is None


def test_bad_metadata_is_rejected_with_the_argument_named(models, config):
    target, _ = models
    tables = np.array([[0, -1]], np.int32)
    caches = fresh_caches(target, 2)
    meta = make_forward_meta(
        [6], [0], tables, caches, config.block_size, ids_remove_padding=np.zeros(6, np.int64)
    )
    with pytest.raises(ValueError, match=r"block_tables\[0, 1\]"):
        target(meta.ids_remove_padding, meta)
    meta = make_forward_meta(
        [3], [0], tables, caches, config.block_size, ids_remove_padding=np.zeros(3, np.int64)
    )
    meta.cu_seqlens_q = paddle.to_tensor(np.array([0, 2], np.int32))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        target(meta.ids_remove_padding, meta)
    meta = make_forward_meta(
        [3], [0], tables, caches[:2], config.block_size, ids_remove_padding=np.zeros(3, np.int64)
    )
    with pytest.raises(ValueError, match="caches"):
        target(meta.ids_remove_padding, meta)


def test_reused_forward_meta_updated_in_place_is_replanned(config):
    """Engines keep one ForwardMeta and overwrite its tensors each step; the model must not
    reuse indices derived from the previous step."""
    target, _ = build_models(config, seed=9)
    ids = np.random.default_rng(9).integers(0, config.ori_vocab_size, 10)
    tables, n = contiguous_block_tables([10], config.block_size)
    full = run_target(target, [(ids, 0)], tables, fresh_caches(target, n))[0]
    caches = fresh_caches(target, n)
    meta = make_forward_meta(
        [1], [0], tables, caches, config.block_size, ids_remove_padding=ids[:1]
    )
    got = []
    for t in range(10):
        meta.ids_remove_padding[0] = int(ids[t])  # in-place updates, same object
        meta.seq_lens_decoder[0] = t
        got.append(target(meta.ids_remove_padding, meta).numpy())
    np.testing.assert_allclose(np.concatenate(got), full, rtol=RTOL_SAME, atol=ATOL_SAME)
