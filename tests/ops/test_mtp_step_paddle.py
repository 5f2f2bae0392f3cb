"""mtp_step_paddle on every backend against tests/reference/ (docs/ops.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.mtp_step_paddle import NAMES, mtp_step_paddle as reference
from tests.support.compare import assert_all_exact, assert_bad_input_rejected, run_exact

OP = "mtp_step_paddle"


def make_state(rng, bsz, k, *, block_size=4, max_blocks=12, free_blocks=None):
    """A consistent allocator state: every item owns enc_len prompt blocks plus used draft
    blocks; the free list holds the remaining ids."""
    total = bsz * max_blocks
    ids = rng.permutation(total).astype(np.int32)
    tables = np.full((bsz, max_blocks), -1, np.int32)
    enc_len = rng.integers(0, 4, size=bsz).astype(np.int32)
    used = rng.integers(0, 3, size=bsz).astype(np.int32)
    nxt = 0
    for b in range(bsz):
        n = enc_len[b] + used[b]
        tables[b, :n] = ids[nxt : nxt + n]
        nxt += n
    dec = (
        ((enc_len + used) * block_size - rng.integers(k + 1, k + 1 + block_size, size=bsz))
        .clip(0)
        .astype(np.int32)
    )
    free_ids = ids[nxt:]
    if free_blocks is not None:
        free_ids = free_ids[:free_blocks]
    free_list = np.full(total, -1, np.int32)
    free_list[: free_ids.size] = free_ids
    base_stop = rng.random((bsz, 1)) < 0.2
    drop = rng.random((bsz, 1)) < 0.1
    return [
        base_stop,
        base_stop | (rng.random((bsz, 1)) < 0.1),  # stop_flags
        drop,
        rng.integers(0, k + 2, size=bsz).astype(np.int32),  # seq_lens_this_time
        np.zeros(bsz, np.int32),  # seq_lens_encoder (unused)
        dec,
        tables,
        enc_len,
        used,
        free_list,
        np.array([free_ids.size], np.int32),
    ]


def check(backend, tensors, block_size=4, k=3, context=""):
    want = reference(*tensors, block_size=block_size, max_draft_tokens=k)
    return run_exact(backend, OP, NAMES, tensors, (block_size, k), want, context)


@pytest.mark.parametrize("bsz", [1, 7, 64, 1500])
@pytest.mark.parametrize("k", [1, 3, 5, 8])
def test_random_states_match_reference(backend, bsz, k):
    rng = np.random.default_rng(bsz + 17 * k)
    check(backend, make_state(rng, bsz, k), k=k, context=f"bsz={bsz} k={k}")
    # scarce free blocks: evictions happen
    check(
        backend,
        make_state(rng, bsz, k, free_blocks=bsz // 8),
        k=k,
        context=f"bsz={bsz} k={k} scarce",
    )


def manual(rows, free, block_size=4, max_blocks=6):
    """rows: dicts with table (list), enc_len, used, dec, base_stop, drop."""
    bsz = len(rows)
    tables = np.full((bsz, max_blocks), -1, np.int32)
    for b, r in enumerate(rows):
        tables[b, : len(r["table"])] = r["table"]
    free_list = np.full(32, -1, np.int32)
    free_list[: len(free)] = free
    return [
        np.array([[r.get("base_stop", False)] for r in rows]),
        np.array([[False] for _ in rows]),
        np.array([[r.get("drop", False)] for r in rows]),
        np.array([3] * bsz, np.int32),
        np.zeros(bsz, np.int32),
        np.array([r["dec"] for r in rows], np.int32),
        tables,
        np.array([r["enc_len"] for r in rows], np.int32),
        np.array([r["used"] for r in rows], np.int32),
        free_list,
        np.array([len(free)], np.int32),
    ]


def test_per_item_arrays_and_block_tables_may_have_more_rows_than_the_batch(backend):
    """The batch is ``seq_lens_this_time``'s length; extra rows elsewhere (running items with
    free blocks to take, if they were read) stay untouched."""
    rng = np.random.default_rng(5)
    small, big = make_state(rng, 7, 3, free_blocks=3), make_state(rng, 10, 3)
    padded = [
        t if i in (3, 9, 10) else np.concatenate([t, b[7:]])  # not slt, free_list, free_list_len
        for i, (t, b) in enumerate(zip(small, big))
    ]
    padded[0][7:] = False  # the extra rows look like running items
    out = check(backend, padded, context="extra rows")
    for i in (0, 1, 2, 4, 5, 6, 7, 8):
        np.testing.assert_array_equal(out[NAMES[i]][7:], padded[i][7:], err_msg=NAMES[i])
    want = reference(*small, block_size=4, max_draft_tokens=3)
    for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10):
        np.testing.assert_array_equal(
            out[NAMES[i]][: len(want[NAMES[i]])], want[NAMES[i]], err_msg=NAMES[i]
        )


def test_stopped_items_release_blocks_from_their_encoder_length(backend):
    rows = [dict(table=[10, 11, 12, 13], enc_len=2, used=2, dec=0, base_stop=True)]
    out = check(backend, manual(rows, free=[30]), context="free")
    np.testing.assert_array_equal(out["free_list"][:3], [30, 12, 13])
    assert out["free_list_len"][0] == 3
    np.testing.assert_array_equal(out["block_tables"][0, :4], [10, 11, -1, -1])
    assert out["used_list_len"][0] == 0 and out["encoder_block_lens"][0] == 0


def test_allocation_pops_the_free_list_in_batch_order(backend):
    # (dec + K + 1) // block_size with K=3, block 4: dec 4 -> slot 2, dec 0 -> slot 1
    rows = [dict(table=[1, 2], enc_len=2, used=0, dec=4), dict(table=[3], enc_len=1, used=0, dec=0)]
    out = check(backend, manual(rows, free=[40, 41, 42]), context="alloc")
    assert out["block_tables"][0, 2] == 42 and out["block_tables"][1, 1] == 41
    assert out["free_list_len"][0] == 1
    np.testing.assert_array_equal(out["used_list_len"], [1, 1])


def test_eviction_picks_the_most_used_item_ties_to_the_smallest_index(backend):
    rows = [
        dict(table=[1, 2, 3], enc_len=1, used=2, dec=8),  # needs slot 3
        dict(table=[4, 5, 6], enc_len=1, used=2, dec=8),  # needs slot 3
        dict(table=[7, 8], enc_len=1, used=1, dec=4),  # needs slot 2
    ]
    out = check(backend, manual(rows, free=[]), context="evict")
    # need 3 > 0 free: evict item 0 (2 used, smaller index than item 1): 2 free, need 3
    # still > 2 (need is not decremented), evict item 1: 4 free. Then item 2 allocates.
    assert list(out["batch_drop"][:, 0]) == [True, True, False]
    assert list(out["stop_flags"][:, 0]) == [True, True, False]
    np.testing.assert_array_equal(out["seq_lens_decoder"], [0, 0, 4])
    assert out["block_tables"][2, 2] == 6 and out["free_list_len"][0] == 3


def test_nothing_to_evict_stops_unserved_items_instead_of_hanging(backend):
    # upstream loops forever: two items need a block, one is free, nobody holds one
    rows = [
        dict(table=[1], enc_len=1, used=0, dec=0),
        dict(table=[2], enc_len=1, used=0, dec=0),
        dict(table=[3], enc_len=1, used=0, dec=0),
    ]
    out = check(backend, manual(rows, free=[50]), context="stuck")
    assert out["block_tables"][0, 1] == 50 and not out["batch_drop"][0, 0]
    assert list(out["batch_drop"][:, 0]) == [False, True, True]  # reported as dropped
    assert list(out["stop_flags"][:, 0]) == [False, True, True]
    np.testing.assert_array_equal(out["seq_lens_this_time"], [3, 0, 0])


def test_repeated_calls_give_identical_results(backend):
    tensors = make_state(np.random.default_rng(8), 300, 3, free_blocks=20)
    first = backend.run(OP, tensors, (4, 3))
    second = backend.run(OP, tensors, (4, 3))
    assert_all_exact(NAMES, second, dict(zip(NAMES, first)), context="repeat")


BAD = {
    "block_tables_int64": (6, lambda t: t[6].astype(np.int64), "block_tables"),
    "batch_drop_int32": (2, lambda t: t[2].astype(np.int32), "batch_drop"),
    "used_list_len_batch_mismatch": (8, lambda t: t[8][:-1].copy(), "used_list_len"),
    "free_list_2d": (9, lambda t: t[9].reshape(2, -1), "free_list"),
    "free_list_len_two": (10, lambda t: np.zeros(2, np.int32), "free_list_len"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    assert_bad_input_rejected(
        backend, OP, NAMES, BAD[case], make_state(np.random.default_rng(5), 6, 3), (4, 3)
    )


@pytest.mark.parametrize(
    "index,value,name",
    [(5, -4, "seq_lens_decoder"), (8, -1, "used_list_len"), (7, -2, "encoder_block_lens")],
)
def test_negative_lengths_are_clamped_on_every_backend(backend, index, value, name):
    """Lengths and counts are values (a device kernel cannot check them without a sync): a
    negative one reads as 0 on every backend, instead of a host-only rejection."""
    for seed in range(4):
        tensors = make_state(np.random.default_rng(seed), 6, 3, free_blocks=seed)
        tensors[index] = tensors[index].copy()
        tensors[index][1::2] = value
        check(backend, tensors, context=f"negative {name}, seed {seed}")


@pytest.mark.parametrize("free_list_len", [-5, 33, 2**31 - 1, -(2**31)])
def test_free_list_len_outside_the_free_list_is_clamped_on_every_backend(backend, free_list_len):
    """free_list_len is clamped to [0, F] before any pop or push (and written back clamped);
    a device kernel used to pop free_list[free_list_len - 1] past the capacity."""
    rows = [
        dict(table=[1, 2], enc_len=2, used=0, dec=4),
        dict(table=[3, 4, 5], enc_len=1, used=2, dec=4, base_stop=True),
    ]
    out = check(
        backend, manual(rows, free=list(range(40, 72))), context=f"free_list_len={free_list_len}"
    )
    assert 0 <= out["free_list_len"][0] <= 32


def test_evicted_item_keeps_its_encoder_block_lens(backend):
    """As upstream: eviction gives back only the draft blocks after the prompt's blocks and
    leaves encoder_block_lens alone (step-1 frees of stopped items reset it)."""
    rows = [
        dict(table=[1, 2, 3, 4], enc_len=2, used=2, dec=12),  # evicted: 3, 4 freed; 1, 2 kept
        dict(table=[5, 6], enc_len=1, used=1, dec=4),  # needs slot 2
    ]
    out = check(backend, manual(rows, free=[]), context="evict keeps enc_len")
    assert out["batch_drop"][0, 0] and out["encoder_block_lens"][0] == 2
    np.testing.assert_array_equal(out["block_tables"][0, :4], [1, 2, -1, -1])
    assert out["used_list_len"][0] == 0


def test_length_values_of_2_31_do_not_cost_time(backend):
    """A used_list_len of 2**31 - 1 releases at most a row of blocks (the loop is bounded by
    the block table, not by the value)."""
    from tests.ops.child_process import run_in_child

    big = 2**31 - 1
    rows = [
        dict(table=[1, 2, 3], enc_len=1, used=big, dec=big, base_stop=True),
        dict(table=[4, 5], enc_len=1, used=big, dec=8),
        dict(table=[6], enc_len=-big, used=big, dec=0),
    ]
    run_in_child(
        lambda: bool(check(backend, manual(rows, free=[70, 71]), context="2**31 - 1")), timeout=60
    )


@pytest.mark.parametrize("attrs,name", [((0, 3), "block_size"), ((4, -1), "max_draft_tokens")])
def test_bad_attrs_are_rejected(backend, attrs, name):
    tensors = make_state(np.random.default_rng(5), 6, 3)
    with pytest.raises(ValueError, match=f"attr `{name}`"):
        backend.run(OP, tensors, attrs)
