"""The paged attention backend derives everything on the device: it must equal a host-planned
per-item numpy reference for every batch shape (prefill, chunked prefill, decode, verify,
mixed batches, items without rows, padding rows, shuffled block tables, every attention
layout, with or without ``max_seq_len`` and ``max_rows_per_item`` hints), leave the caches
untouched by padding rows, and, with ``ForwardMeta.check`` cleared, read nothing back to the
host."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import paddle
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fastdeploy_mtp.models import (
    ReferenceAttentionBackend,
    contiguous_block_tables,
    make_forward_meta,
)
from fastdeploy_mtp.models.layers import RotaryEmbedding
from tests.support.models import build_models, small_config

HEAD_DIM = 4


def reference_attention(q, k, v, key_cache, value_cache, this_time, decoder, tables, block_size):
    """Host-planned paged attention, one item at a time in float64: write every real row's
    key/value to its slot, then let row ``i`` of item ``b`` attend to positions ``0 ..
    decoder[b] + i``. Returns ``(out [T, nh * hd], key_cache, value_cache)`` (new arrays)."""
    key_cache, value_cache = key_cache.copy(), value_cache.copy()
    num_heads, kv_heads, hd = q.shape[1], k.shape[1], q.shape[2]
    groups = num_heads // kv_heads
    cu = np.concatenate([[0], np.cumsum(this_time)]).astype(np.int64)
    for b, n in enumerate(this_time):
        pos = np.arange(decoder[b], decoder[b] + n)
        blocks, offsets = tables[b, pos // block_size], pos % block_size
        key_cache[blocks, :, offsets, :] = k[cu[b] : cu[b + 1]]
        value_cache[blocks, :, offsets, :] = v[cu[b] : cu[b + 1]]
    out = np.zeros([q.shape[0], num_heads * hd], np.float64)
    for b, n in enumerate(this_time):
        if n == 0:
            continue
        total = decoder[b] + n
        pos = np.arange(total)
        keys = key_cache[tables[b, pos // block_size], :, pos % block_size, :].astype(np.float64)
        values = value_cache[tables[b, pos // block_size], :, pos % block_size, :].astype(
            np.float64
        )
        for i in range(n):
            row, seen = cu[b] + i, decoder[b] + i + 1
            for h in range(num_heads):
                scores = keys[:seen, h // groups] @ q[row, h].astype(np.float64) / np.sqrt(hd)
                probs = np.exp(scores - scores.max())
                probs /= probs.sum()
                out[row, h * hd : (h + 1) * hd] = probs @ values[:seen, h // groups]
    return out, key_cache, value_cache


def scattered_tables(this_time, decoder, block_size, extra_columns, rng):
    """Block tables whose blocks come from a shuffled pool with spare blocks in between;
    entries past an item's need are -1, and so is the whole row of some idle items."""
    need = [
        -(-(d + n) // block_size) if n else int(rng.integers(0, 3))
        for n, d in zip(this_time, decoder)
    ]
    width = max(need, default=0) + extra_columns
    pool = rng.permutation(2 * sum(need) + 3)
    tables = np.full([len(need), max(width, 1)], -1, np.int32)
    used = 0
    for b, m in enumerate(need):
        tables[b, :m] = pool[used : used + m]
        used += m
    return tables, len(pool)


def run_case(
    this_time,
    decoder,
    pad,
    block_size,
    kv_heads,
    groups,
    seed,
    hint="none",
    layout=None,
    check=False,
    tables=None,
    rows_hint="none",
):
    """Run the backend once and the reference once on the same random inputs and caches
    (``layout``: a forced layout name or None; ``hint``/``rows_hint``: no, a tight or a loose
    ``max_seq_len``/``max_rows_per_item``)."""
    rng = np.random.default_rng(seed)
    if tables is None:
        tables, num_blocks = scattered_tables(
            this_time, decoder, block_size, int(rng.integers(0, 3)), rng
        )
    else:
        num_blocks = int(tables.max()) + 1
    num_heads, rows = kv_heads * groups, int(sum(this_time)) + pad
    backend = ReferenceAttentionBackend(num_heads, kv_heads, HEAD_DIM, block_size)
    backend.force_layout = layout
    shape = backend.get_kv_cache_shape(num_blocks)
    # stale (finite) contents everywhere: a slot read that should not be changes the result
    key_np = rng.standard_normal(shape).astype(np.float32)
    value_np = rng.standard_normal(shape).astype(np.float32)
    caches = [paddle.to_tensor(key_np), paddle.to_tensor(value_np)]
    q = rng.standard_normal([rows, num_heads, HEAD_DIM]).astype(np.float32)
    k = rng.standard_normal([rows, kv_heads, HEAD_DIM]).astype(np.float32)
    v = rng.standard_normal([rows, kv_heads, HEAD_DIM]).astype(np.float32)
    meta = make_forward_meta(
        this_time, decoder, tables, caches, block_size, ids_remove_padding=np.zeros(rows, np.int64)
    )
    totals = [d + n for n, d in zip(this_time, decoder) if n]
    meta.max_seq_len = {
        "none": None,
        "tight": max(totals, default=1),
        "loose": max(totals, default=1) + 7,
    }[hint]
    widest = max(this_time, default=0)
    meta.max_rows_per_item = {"none": None, "tight": widest, "loose": widest + 3}[rows_hint]
    meta.check = check
    meta.build_plan()
    out = backend.forward(
        paddle.to_tensor(q), paddle.to_tensor(k), paddle.to_tensor(v), 0, meta
    ).numpy()
    want, want_keys, want_values = reference_attention(
        q,
        k,
        v,
        key_np,
        value_np,
        np.asarray(this_time),
        np.asarray(decoder),
        tables.astype(np.int64),
        block_size,
    )
    return out, want, caches, want_keys, want_values


def assert_matches_reference(this_time, pad, out, want, caches, want_keys, want_values):
    real = int(sum(this_time))
    np.testing.assert_allclose(out[:real], want[:real], rtol=1e-5, atol=1e-5)
    assert np.all(out[real:] == 0), "padding rows must get zeros"
    assert out.shape[0] == real + pad
    assert np.array_equal(caches[0].numpy(), want_keys), (
        "key cache differs from the per-item writes"
    )
    assert np.array_equal(caches[1].numpy(), want_values), (
        "value cache differs from the per-item writes"
    )


def check_case(batch, geometry, seed, hint, layout, check, rows_hint):
    """:func:`run_case` on ``batch`` = (this_time, decoder, pad) and ``geometry`` =
    (block_size, kv_heads, groups), its output and caches checked against the reference."""
    this_time, decoder, pad = batch
    got = run_case(*batch, *geometry, seed, hint, layout, check, None, rows_hint)
    assert_matches_reference(this_time, pad, *got)


CASES = {
    "prefill": ([9], [0], 0),
    "chunked_prefill": ([5, 7], [8, 13], 0),
    "decode": ([1, 1, 1], [17, 4, 30], 0),
    "verify": ([4, 4], [21, 6], 0),
    "mixed": ([1, 6, 0, 4, 3], [12, 0, 9, 20, 5], 0),
    "zero_row_items": ([0, 3, 0, 0], [5, 2, 0, 11], 0),
    "padding": ([2, 0, 3], [6, 3, 1], 5),
    "only_padding": ([0, 0], [7, 3], 4),
    "empty": ([0, 0], [7, 3], 0),
}


LAYOUTS = [None, "shared", "row", "grouped"]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x or "auto")
@pytest.mark.parametrize("case", sorted(CASES))
def test_named_batches_match_the_host_planned_reference(case, layout):
    for geometry in ((4, 2, 2), (1, 1, 3)):
        for rows_hint in ("none", "tight", "loose"):
            check_case(CASES[case], geometry, len(case), "tight", layout, True, rows_hint)


def test_shuffled_contiguous_tables_match_the_reference():
    this_time, decoder = [3, 1, 5], [10, 22, 0]
    tables, _ = contiguous_block_tables([13, 23, 5], 4, shuffle_seed=5)
    for layout in LAYOUTS[1:]:
        got = run_case(
            this_time, decoder, 2, 4, 2, 2, seed=3, layout=layout, tables=tables, rows_hint="tight"
        )
        assert_matches_reference(this_time, 2, *got)


def test_layouts_agree_with_each_other():
    """A verify batch (8 items x 4 rows, padding behind) in every layout: the outputs agree
    to float32 rounding and the caches bit for bit."""
    this_time, decoder = [4] * 8, [30, 3, 17, 0, 9, 44, 21, 12]
    results = [
        run_case(this_time, decoder, 3, 4, 2, 2, 7, "loose", layout, False, None, "tight")
        for layout in LAYOUTS
    ]
    first_out, _, first_caches, _, _ = results[0]
    for out, _, caches, _, _ in results[1:]:
        np.testing.assert_allclose(out, first_out, rtol=1e-5, atol=1e-5)
        for a, b in zip(caches, first_caches):
            assert np.array_equal(a.numpy(), b.numpy())


def test_the_automatic_layout_follows_the_batch_shape():
    """With the shipped target's shapes: grouped only with a ``max_rows_per_item`` hint, and
    then for verify batches of many items; one row per item stays per-row (the same work
    without the grouped layout's extra index ops), batch 1 and prefill keep the shared
    layout. ``force_shared_keys`` still maps to the shared/row layouts."""
    backend = ReferenceAttentionBackend(4, 2, 32, 16)

    def choice(this_time, decoder, rows_hint):
        tables, _ = contiguous_block_tables([d + n for n, d in zip(this_time, decoder)], 16)
        meta = make_forward_meta(this_time, decoder, tables, [], 16)
        meta.max_seq_len, meta.max_rows_per_item = 320, rows_hint
        return backend.choose_layout(meta.build_plan())

    assert choice([4] * 8, [300] * 8, 4) == "grouped"
    assert choice([4] * 16, [300] * 16, 4) == "grouped"
    assert choice([1] * 8, [300] * 8, 1) == "row"
    assert choice([4] * 8, [300] * 8, None) == "row"
    assert choice([4], [300], 4) == "shared"
    assert choice([300], [0], 300) == "shared"
    backend.force_shared_keys = True
    assert backend.force_layout == "shared" and choice([4] * 8, [300] * 8, 4) == "shared"
    backend.force_shared_keys = False
    assert backend.force_layout == "row" and backend.force_shared_keys is False
    backend.force_layout = "grouped"
    assert backend.force_shared_keys is None and choice([4], [300], None) == "grouped"
    backend.force_layout = "diagonal"
    with pytest.raises(ValueError, match="`force_layout` must be one of"):
        choice([4], [300], None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 14)), min_size=1, max_size=5),
    pad=st.integers(0, 3),
    block_size=st.sampled_from([1, 2, 4, 8]),
    kv_heads=st.integers(1, 2),
    groups=st.integers(1, 3),
    hint=st.sampled_from(["none", "tight", "loose"]),
    rows_hint=st.sampled_from(["none", "tight", "loose"]),
    layout=st.sampled_from(LAYOUTS),
    check=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_batches_match_the_host_planned_reference(
    items, pad, block_size, kv_heads, groups, hint, rows_hint, layout, check, seed
):
    batch = ([n for n, _ in items], [d for _, d in items], pad)
    check_case(batch, (block_size, kv_heads, groups), seed, hint, layout, check, rows_hint)


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_padding_rows_leave_the_caches_bit_identical(layout):
    """The same real rows with and without padding rows behind them (whose keys and values
    are random, so any write would show): the caches end up bit-identical and so do the
    real rows' outputs. With no real row at all, nothing changes."""
    this_time, decoder, bs = [2, 0, 3], [5, 9, 0], 4
    tables, num_blocks = contiguous_block_tables([8, 12, 4], bs, shuffle_seed=1)
    rng = np.random.default_rng(0)
    backend = ReferenceAttentionBackend(4, 2, HEAD_DIM, bs)
    backend.force_layout = layout
    start = [
        rng.standard_normal(backend.get_kv_cache_shape(num_blocks)).astype(np.float32)
        for _ in range(2)
    ]
    real = sum(this_time)
    q, k, v = (rng.standard_normal([real + 6, h, HEAD_DIM]).astype(np.float32) for h in (4, 2, 2))
    results = []
    for rows in (real, real + 6):
        caches = [paddle.to_tensor(c) for c in start]
        meta = make_forward_meta(
            this_time, decoder, tables, caches, bs, ids_remove_padding=np.zeros(rows, np.int64)
        )
        meta.check, meta.max_rows_per_item = False, 3
        out = backend.forward(*(paddle.to_tensor(x[:rows]) for x in (q, k, v)), 0, meta).numpy()
        results.append((out, [c.numpy() for c in caches]))
    (plain, plain_caches), (padded, padded_caches) = results
    np.testing.assert_array_equal(padded[:real], plain)
    assert np.all(padded[real:] == 0)
    for a, b in zip(plain_caches, padded_caches):
        assert np.array_equal(a, b), "padding rows wrote into the cache"

    caches = [paddle.to_tensor(c) for c in start]
    meta = make_forward_meta(
        [0, 0, 0], decoder, tables, caches, bs, ids_remove_padding=np.zeros(5, np.int64)
    )
    meta.check, meta.max_rows_per_item = False, 0
    out = backend.forward(*(paddle.to_tensor(x[:5]) for x in (q, k, v)), 0, meta).numpy()
    assert np.all(out == 0)
    for before, after in zip(start, caches):
        assert np.array_equal(before, after.numpy()), "a batch without real rows changed the cache"


HOST_READS = ("numpy", "item", "tolist", "__bool__", "__int__", "__float__", "__index__")


@pytest.fixture
def host_read_guard(monkeypatch):
    """Make every host read of a tensor from a ``fastdeploy_mtp.models`` module raise while
    ``guard["on"]`` is set; the reads are recorded in ``guard["reads"]``."""
    guard = {"on": False, "reads": []}

    def wrap(name, original):
        def wrapper(self, *args, **kwargs):
            caller = inspect.currentframe().f_back
            module = caller.f_globals.get("__name__", "")
            if guard["on"] and module.startswith("fastdeploy_mtp.models"):
                guard["reads"].append(f"{module}:{caller.f_lineno} Tensor.{name}()")
                raise AssertionError(f"host read Tensor.{name}() from {module}:{caller.f_lineno}")
            return original(self, *args, **kwargs)

        return wrapper

    for name in HOST_READS:
        monkeypatch.setattr(paddle.Tensor, name, wrap(name, getattr(paddle.Tensor, name)))
    return guard


def _model_forwards(check, guard, layout=None):
    """A decode/verify/prefill/idle batch with padding rows through the target and the MTP
    layer; returns the outputs."""
    config = small_config()
    target, mtp = build_models(config, seed=4)
    target.attn_backend.force_layout = mtp.attn_backend.force_layout = layout
    this_time, decoder, pad = [4, 1, 0, 6], [9, 30, 3, 0], 3
    tables, num_blocks = contiguous_block_tables([16, 32, 8, 8], config.block_size, shuffle_seed=4)
    rng = np.random.default_rng(4)
    ids = rng.integers(0, config.ori_vocab_size, sum(this_time) + pad)
    outs = []
    for model in (target, mtp):
        caches = model.attn_backend.allocate_caches(model.num_cache_layers, num_blocks)
        meta = make_forward_meta(
            this_time, decoder, tables, caches, config.block_size, ids_remove_padding=ids
        )
        meta.check, meta.max_seq_len, meta.max_rows_per_item = check, 40, 6
        hidden = paddle.to_tensor(
            rng.standard_normal([len(ids), config.hidden_size]).astype(np.float32)
        )
        guard["on"] = True
        try:
            with paddle.no_grad():
                out = (
                    target(meta.ids_remove_padding, meta)
                    if model is target
                    else mtp(None, hidden, meta)
                )
        finally:
            guard["on"] = False
        outs.append(out.numpy())
    return outs


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x or "auto")
def test_unchecked_forwards_make_no_host_read(host_read_guard, layout):
    outs = _model_forwards(check=False, guard=host_read_guard, layout=layout)
    assert not host_read_guard["reads"], host_read_guard["reads"]
    unguarded = _model_forwards(check=True, guard={"on": False})
    for got, want in zip(outs, unguarded):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_guard_sees_the_checked_forwards_host_reads(host_read_guard):
    """The check above can fail: with ``check`` set the same forwards validate on the host."""
    with pytest.raises(AssertionError, match="host read"):
        _model_forwards(check=True, guard=host_read_guard)
    assert any(r.startswith("fastdeploy_mtp.models.forward_meta") for r in host_read_guard["reads"])


def test_checked_metadata_errors_name_the_field():
    """``check`` (the default) refuses inconsistent metadata on the host; without it the same
    metadata is clamped into range (meaningless rows, no out-of-bounds access)."""
    config = small_config(max_position_embeddings=24)
    target, _ = build_models(config, seed=2)
    bs = config.block_size
    caches = target.attn_backend.allocate_caches(target.num_cache_layers, 8)
    bad = {
        r"needs 3 cache blocks for 9 tokens but `block_tables` has 2 columns": (
            [3],
            [6],
            [[0, 1]],
            3,
        ),
        r"`ids_remove_padding` has 2 tokens but sum\(seq_lens_this_time\) = 3": (
            [3],
            [0],
            [[0, 1]],
            2,
        ),
        r"position 25 is beyond `max_position_embeddings` \(24\)": (
            [2],
            [24],
            [[0, 1, 2, 3, 4, 5, 6, 7]],
            2,
        ),
        r"`block_tables\[0, 1\]` is unused": ([2], [3], [[0, -1]], 2),
    }
    for message, (this_time, decoder, tables, rows) in bad.items():
        ids = np.zeros(rows, np.int64)
        meta = make_forward_meta(
            this_time, decoder, np.asarray(tables, np.int32), caches, bs, ids_remove_padding=ids
        )
        with pytest.raises(ValueError, match=message):
            target(meta.ids_remove_padding, meta)
        meta.check = False
        out = target(meta.ids_remove_padding, meta).numpy()
        assert out.shape == (rows, config.hidden_size) and np.isfinite(out).all()
    meta = make_forward_meta(
        [3], [4], np.array([[0, 1, 2]], np.int32), caches, bs, ids_remove_padding=np.zeros(3)
    )
    meta.max_seq_len = 6
    with pytest.raises(ValueError, match="holds 7 tokens after this step but `max_seq_len` is 6"):
        target(meta.ids_remove_padding, meta)
    with pytest.raises(ValueError, match="`max_seq_len` must be positive or None, got 0"):
        dataclasses.replace(meta, max_seq_len=0)
    meta = dataclasses.replace(meta, max_seq_len=None, max_rows_per_item=2)
    with pytest.raises(
        ValueError, match="item 0 has 3 rows this step but `max_rows_per_item` is 2"
    ):
        target(meta.ids_remove_padding, meta)
    with pytest.raises(ValueError, match="`max_rows_per_item` must be >= 0 or None, got -1"):
        dataclasses.replace(meta, max_rows_per_item=-1)


def test_rope_lookup_takes_device_positions():
    rope = RotaryEmbedding(HEAD_DIM * 2, 32, 10000.0)
    positions = np.array([0, 5, 31, 7], np.int64)
    for got, want in zip(rope.lookup(paddle.to_tensor(positions)), rope.lookup(positions)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    int32 = rope.lookup(paddle.to_tensor(positions.astype(np.int32)), check=False)
    np.testing.assert_array_equal(int32[0].numpy(), rope.lookup(positions)[0].numpy())
    with pytest.raises(ValueError, match=r"position 32 is beyond `max_position_embeddings` \(32\)"):
        rope.lookup(paddle.to_tensor(np.array([3, 32])))
    with pytest.raises(ValueError, match="position 32"):
        rope.lookup(np.array([3, 32]))
    clamped = rope.lookup(paddle.to_tensor(np.array([40])), check=False)[0].numpy()
    np.testing.assert_array_equal(clamped, rope.lookup(np.array([31]))[0].numpy())
