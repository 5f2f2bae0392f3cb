"""The messaging ops (speculate_save_output_topk, speculate_get_output_topk,
mtp_save_first_token, mtp_get_first_token) through real SysV message queues, against the
numpy reference of the message layout (tests/reference/messaging.py).

Host-only ops: they run the same host code on every backend, so they are tested here on
the CPU bindings (Paddle and the framework-free module), not in the backend-parametrised
kernel tests. Every test uses its own queue id and removes the queue afterwards.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import os
import time
from pathlib import Path

import numpy as np
import pytest

import fastdeploy_mtp.ops as ops
from fastdeploy_mtp import _kernels
from fastdeploy_mtp.ops import messaging
from tests.ops.child_process import run_in_child
from tests.reference import messaging as ref

paddle = pytest.importorskip("paddle")

TOKENS_LEN = 3 + ref.MAX_BSZ + ref.MAX_BSZ * ref.ENTRY_INTS
SCORES_LEN = ref.MAX_BSZ * ref.ENTRY_INTS
RANKS_LEN = ref.MAX_BSZ * ref.MAX_DRAFT
FIRST_LEN = 2 + ref.FIRST_MAX_BSZ * (1 + ref.MAX_DRAFT)
_ids = itertools.count()

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.msgget.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.msgrcv.argtypes = [
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_long,
    ctypes.c_int,
]
_libc.msgrcv.restype = ctypes.c_ssize_t
IPC_NOWAIT = 0o4000


@pytest.fixture
def qid(monkeypatch):
    """A queue id of this test alone; the queue is removed (and checked gone) afterwards."""
    monkeypatch.delenv("INFERENCE_MSG_ID", raising=False)
    monkeypatch.delenv("INFERENCE_MSG_QUEUE_ID", raising=False)
    queue = (os.getpid() % 50000) * 20 + next(_ids) % 20
    messaging.remove_msg_queue(queue)
    yield queue
    messaging.remove_msg_queue(queue)
    assert messaging.msg_queue_key(queue) not in _queues(), "the queue was left behind"


def _queues() -> dict[int, str]:
    """key -> perms of every SysV queue on the system (/proc/sysvipc/msg)."""
    lines = Path("/proc/sysvipc/msg").read_text().splitlines()[1:]
    return {int(f[0]): f[2] for f in (line.split() for line in lines)}


def raw_receive(queue: int) -> bytes | None:
    """The text of the next message on `queue`, read with msgrcv directly; None if empty."""
    q = _libc.msgget(messaging.msg_queue_key(queue), 0)
    if q < 0:
        return None
    buf = ctypes.create_string_buffer(8 + 600_000)
    got = _libc.msgrcv(q, buf, 600_000, 0, IPC_NOWAIT)
    if got < 0:
        return None
    assert int.from_bytes(buf.raw[:8], "little") == 1  # mtype
    return buf.raw[8 : 8 + got]


# ---- speculate_save_output_topk / speculate_get_output_topk -------------------------------


def topk_case(rng, counts, width=21, preempted=(), prefilling=(), not_need_stop=True):
    """Arguments of speculate_save_output_topk (numpy) for items with `counts` tokens."""
    bsz = len(counts)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    token_num = max(int(sum(counts)), 1)
    prompt = np.full((bsz, 1), 8, np.int64)
    dec = np.full(bsz, 20, np.int32)
    dec[list(prefilling)] = 3
    pre = np.zeros(bsz, np.int32)
    pre[list(preempted)] = 1
    return dict(
        sampled_token_ids=rng.integers(0, 50000, token_num).astype(np.int64),
        logprob_token_ids=rng.integers(0, 50000, (token_num, width)).astype(np.int64),
        logprob_scores=rng.standard_normal((token_num, width)).astype(np.float32),
        logprob_ranks=rng.integers(0, 100, token_num).astype(np.int64),
        token_num_per_batch=np.asarray(counts, np.int32),
        cu_batch_token_offset=offsets,
        not_need_stop=np.array([not_need_stop]),
        seq_lens_decoder=dec,
        prompt_lens=prompt,
        preempted_idx=pre,
    )


def save_topk(case, message_flag=3, rank_id=0, save_each_rank=False, msg_queue_id=None):
    t = {k: paddle.to_tensor(v) for k, v in case.items()}
    ops.speculate_save_output_topk(*t.values(), message_flag, rank_id, save_each_rank, msg_queue_id)


def read_topk(queue, real_k=20, wait_flag=False, timeout_ms=0, fill=7):
    tokens = paddle.full([TOKENS_LEN], fill, "int64")
    scores = paddle.full([SCORES_LEN], float(fill), "float32")
    ranks = paddle.full([RANKS_LEN], fill, "int64")
    ops.speculate_get_output_topk(tokens, scores, ranks, real_k, 0, wait_flag, queue, timeout_ms)
    return tokens.numpy(), scores.numpy(), ranks.numpy()


def expected_read(text, real_k, fill=7):
    tokens = np.full(TOKENS_LEN, fill, np.int64)
    scores = np.full(SCORES_LEN, fill, np.float32)
    ranks = np.full(RANKS_LEN, fill, np.int64)
    ref.decode_topk(text, real_k, tokens, scores, ranks)
    return tokens, scores, ranks


TOPK_CASES = {
    "decoding": dict(counts=[1, 6, 3]),
    "prefilling_and_preempted": dict(counts=[2, 4, 1, 3], prefilling=[1], preempted=[3]),
    "narrow_logprobs": dict(counts=[2, 5], width=4),
    "sampled_only": dict(counts=[3, 1], width=1),
    "last_step": dict(counts=[1, 2], not_need_stop=False),
    "empty_items": dict(counts=[0, 0, 2]),
}


@pytest.mark.parametrize("name", sorted(TOPK_CASES))
def test_topk_message_bytes_are_the_reference_layout(qid, name):
    case = topk_case(np.random.default_rng(3), **TOPK_CASES[name])
    save_topk(case, message_flag=4, msg_queue_id=qid)
    text = raw_receive(qid)
    assert text is not None
    bsz = len(case["token_num_per_batch"])
    assert (
        len(text) == messaging.topk_message_bytes(bsz) == 2060 + 1032 * bsz
    )  # the used prefix only
    assert text == ref.encode_topk(*case.values(), message_flag=4)
    assert raw_receive(qid) is None  # one message per call


@pytest.mark.parametrize("real_k", [20, 5, 0])
def test_topk_round_trip_through_the_reader(qid, real_k):
    case = topk_case(
        np.random.default_rng(real_k), counts=[2, 6, 0, 1], prefilling=[3], preempted=[2]
    )
    kwargs = dict(case, message_flag=3, rank_id=0, save_each_rank=False, msg_queue_id=qid)
    _kernels.speculate_save_output_topk(**kwargs)  # the framework-free binding writes
    got = read_topk(qid, real_k=real_k)
    want = expected_read(ref.encode_topk(*case.values(), message_flag=3), real_k)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert list(got[0][:7]) == [1, 3, 4, 2, 6, -9, 0]


def test_topk_reader_framework_free_binding_matches(qid):
    case = topk_case(np.random.default_rng(9), counts=[4, 2])
    save_topk(case, msg_queue_id=qid)
    tokens = np.full(TOKENS_LEN, 7, np.int64)
    scores = np.full(SCORES_LEN, 7, np.float32)
    ranks = np.full(RANKS_LEN, 7, np.int64)
    _kernels.speculate_get_output_topk(tokens, scores, ranks, 20, 0, False, qid)
    for g, w in zip(
        (tokens, scores, ranks), expected_read(ref.encode_topk(*case.values(), message_flag=3), 20)
    ):
        np.testing.assert_array_equal(g, w)


def test_messages_arrive_in_order_and_msg_id_follows_the_environment(qid, monkeypatch):
    monkeypatch.setenv("INFERENCE_MSG_ID", "7")
    rng = np.random.default_rng(1)
    cases = [topk_case(rng, counts=[i + 1, 1], not_need_stop=i < 2) for i in range(3)]
    for c in cases:
        save_topk(c, msg_queue_id=qid)
    for c in cases:
        got = read_topk(qid)
        for g, w in zip(
            got, expected_read(ref.encode_topk(*c.values(), message_flag=3, msg_id=7), 20)
        ):
            np.testing.assert_array_equal(g, w)
    assert [c["not_need_stop"][0] for c in cases] == [True, True, False]
    assert read_topk(qid)[0][0] == -2


def test_queue_id_from_the_environment_and_mode_0600(qid, monkeypatch):
    monkeypatch.setenv("INFERENCE_MSG_QUEUE_ID", str(qid))
    save_topk(topk_case(np.random.default_rng(0), counts=[1]))  # msg_queue_id=None: the env
    assert _queues()[messaging.msg_queue_key(qid)] == "600"
    assert raw_receive(qid) is not None


def test_rank_above_zero_sends_only_with_save_each_rank(qid):
    case = topk_case(np.random.default_rng(2), counts=[1, 2])
    save_topk(case, rank_id=1, save_each_rank=False, msg_queue_id=qid)
    assert read_topk(qid)[0][0] == -2
    save_topk(case, rank_id=1, save_each_rank=True, msg_queue_id=qid)
    assert read_topk(qid)[0][:5].tolist() == [1, 3, 2, 1, 2]


def test_empty_queue_non_blocking_and_blocking_with_timeout(qid):
    tokens, scores, ranks = read_topk(qid, fill=5)
    assert tokens[:3].tolist() == [-2, 0, 0]
    assert (
        (tokens[3:] == 5).all() and (scores == 5).all() and (ranks == 5).all()
    )  # nothing else written
    start = time.monotonic()
    tokens, _, _ = read_topk(qid, wait_flag=True, timeout_ms=300)
    assert 0.3 <= time.monotonic() - start < 10
    assert tokens[:3].tolist() == [-2, 0, 0]
    out = paddle.full([FIRST_LEN], 5, "int64")
    start = time.monotonic()
    ops.mtp_get_first_token(out, True, qid, 200)
    assert 0.2 <= time.monotonic() - start < 10
    assert out.numpy()[:2].tolist() == [-2, 0] and (out.numpy()[2:] == 5).all()


def test_writer_in_a_child_process_reader_waits_in_the_parent(qid):
    case = topk_case(np.random.default_rng(5), counts=[3, 1, 2], preempted=[1])

    def writer():
        time.sleep(0.3)
        _kernels.speculate_save_output_topk(
            **case, message_flag=4, rank_id=0, save_each_rank=False, msg_queue_id=qid
        )
        x = np.array([[11, 12], [21, 22]], np.int64)
        _kernels.mtp_save_first_token(
            x, np.array([True]), np.array([9, 9], np.int32), np.array([[4], [4]], np.int64),
            np.array([[1], [1]], np.int64), 0, False, True, qid + 1,
        )  # fmt: skip
        return "sent"

    try:
        assert run_in_child(writer, timeout=60) == "sent"
        got = read_topk(qid, wait_flag=True, timeout_ms=20_000)
        for g, w in zip(got, expected_read(ref.encode_topk(*case.values(), message_flag=4), 20)):
            np.testing.assert_array_equal(g, w)
        out = paddle.zeros([FIRST_LEN], "int64")
        ops.mtp_get_first_token(out, True, qid + 1, 20_000)
        assert out.numpy()[:4].tolist() == [1, 2, 2, 2]
        assert out.numpy()[258:260].tolist() == [11, 12] and out.numpy()[264:266].tolist() == [
            21,
            22,
        ]
    finally:
        messaging.remove_msg_queue(qid + 1)


@pytest.mark.parametrize("value, message", [("2", "INFERENCE_MSG_ID=2 is reserved"),
                                            ("-3", "must not be negative"),
                                            ("abc", "is not an int32 integer")])  # fmt: skip
def test_reserved_or_bad_msg_id_is_rejected(qid, monkeypatch, value, message):
    monkeypatch.setenv("INFERENCE_MSG_ID", value)
    with pytest.raises(ops.OpError, match=f"^speculate_save_output_topk: .*{message}"):
        save_topk(topk_case(np.random.default_rng(0), counts=[1]), msg_queue_id=qid)
    with pytest.raises(ops.OpError, match=f"^mtp_save_first_token: .*{message}"):
        save_first(np.zeros((1, 2), np.int64), step=[1], queue=qid)
    assert raw_receive(qid) is None


def _bad(case, **changes):
    return {**case, **changes}


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(logprob_token_ids=np.zeros((4, 22), np.int64),
              logprob_scores=np.zeros((4, 22), np.float32)),
         "`logprob_token_ids` must have shape"),
        (dict(logprob_token_ids=np.zeros((3, 21), np.int64)),
         "`logprob_token_ids` must have shape"),
        (dict(logprob_scores=np.zeros((4, 20), np.float32)),
         "`logprob_scores` must have the shape"),
        (dict(logprob_ranks=np.zeros(3, np.int64)), "`logprob_ranks` must have"),
        (dict(token_num_per_batch=np.array([1, 7], np.int32)), r"`token_num_per_batch`\[1\] = 7"),
        (dict(token_num_per_batch=np.array([-1, 3], np.int32)),
         r"`token_num_per_batch`\[0\] = -1"),
        (dict(cu_batch_token_offset=np.array([0, 2], np.int32)),
         r"`cu_batch_token_offset`\[1\] = 2"),
        (dict(cu_batch_token_offset=np.array([-1, 1], np.int32)),
         r"`cu_batch_token_offset`\[0\] = -1"),
        (dict(seq_lens_decoder=np.zeros(1, np.int32)), "`seq_lens_decoder`"),
        (dict(preempted_idx=np.zeros(1, np.int32)), "`preempted_idx`"),
        (dict(logprob_scores=np.zeros((4, 21), np.float64)), "`logprob_scores` must be float32"),
        (dict(not_need_stop=np.array([True, False])), "`not_need_stop`"),
    ],
)  # fmt: skip
def test_topk_bad_arguments_are_named_and_nothing_is_sent(qid, change, message):
    case = topk_case(np.random.default_rng(0), counts=[1, 3])
    with pytest.raises(ops.OpError, match=f"^speculate_save_output_topk: .*{message}"):
        save_topk(_bad(case, **change), msg_queue_id=qid)
    with pytest.raises(ValueError, match=f"^speculate_save_output_topk: .*{message}"):
        _kernels.speculate_save_output_topk(**_bad(case, **change), message_flag=3, rank_id=0,
                                            save_each_rank=False, msg_queue_id=qid)  # fmt: skip
    assert raw_receive(qid) is None


def test_topk_more_items_than_the_layout_is_rejected(qid):
    case = topk_case(np.random.default_rng(0), counts=[0] * 513)
    with pytest.raises(
        ops.OpError, match="`token_num_per_batch` has 513 items; a message holds at most 512"
    ):
        save_topk(case, msg_queue_id=qid)


def test_msg_queue_id_out_of_range_is_rejected():
    case = topk_case(np.random.default_rng(0), counts=[1])
    with pytest.raises(ops.OpError, match=r"attr `msg_queue_id` must be in \[0, 1048575\]"):
        save_topk(case, msg_queue_id=1 << 20)
    with pytest.raises(ValueError, match="msg_queue_id must be an integer"):
        messaging.msg_queue_key(-1)


@pytest.mark.parametrize(
    "shapes, name",
    [
        ((TOKENS_LEN - 1, SCORES_LEN, RANKS_LEN), "output_tokens"),
        ((TOKENS_LEN, SCORES_LEN - 1, RANKS_LEN), "output_scores"),
        ((TOKENS_LEN, SCORES_LEN, RANKS_LEN - 1), "output_ranks"),
    ],
)
def test_topk_reader_rejects_small_buffers(qid, shapes, name):
    save_topk(topk_case(np.random.default_rng(0), counts=[1]), msg_queue_id=qid)
    t = [
        paddle.zeros([shapes[0]], "int64"),
        paddle.zeros([shapes[1]], "float32"),
        paddle.zeros([shapes[2]], "int64"),
    ]
    with pytest.raises(
        ops.OpError, match=f"^speculate_get_output_topk: `{name}` must hold at least"
    ):
        ops.speculate_get_output_topk(*t, 20, 0, False, qid)
    assert raw_receive(qid) is not None  # the message was not consumed


def test_topk_reader_accepts_column_buffers_and_rejects_bad_attrs(qid):
    save_topk(topk_case(np.random.default_rng(0), counts=[2]), msg_queue_id=qid)
    t = [
        paddle.zeros([TOKENS_LEN, 1], "int64"),
        paddle.zeros([SCORES_LEN, 1], "float32"),
        paddle.zeros([RANKS_LEN, 1], "int64"),
    ]
    with pytest.raises(ops.OpError, match=r"attr `real_k` must be in \[0, 20\], got 21"):
        ops.speculate_get_output_topk(*t, 21, 0, False, qid)
    with pytest.raises(ops.OpError, match="attr `timeout_ms` must be >= 0"):
        ops.speculate_get_output_topk(*t, 20, 0, True, qid, -1)
    ops.speculate_get_output_topk(*t, 20, 0, False, qid)
    assert t[0].numpy()[:4, 0].tolist() == [1, 3, 1, 2]


def test_message_above_msgmax_raises_an_error_naming_msgmax(qid):
    """bsz 64 needs 68108 bytes: above Linux's default kernel.msgmax (8192). Where the
    system allows it, the message goes through instead."""
    case = topk_case(np.random.default_rng(4), counts=[1] * 64)
    need = messaging.topk_message_bytes(64)
    msgmax = messaging.read_msgmax()
    if need > msgmax:
        with pytest.raises(
            ops.OpError, match=rf"needs {need} bytes.*kernel\.msgmax.*is {msgmax} bytes.*sysctl -w"
        ):
            save_topk(case, msg_queue_id=qid)
        assert raw_receive(qid) is None
    else:
        save_topk(case, msg_queue_id=qid)
        assert read_topk(qid)[0][2] == 64
    small = topk_case(np.random.default_rng(4), counts=[6] * 5)  # 7220 bytes: fits the default
    assert messaging.topk_message_bytes(5) <= 8192
    save_topk(small, msg_queue_id=qid)
    assert read_topk(qid)[0][:3].tolist() == [1, 3, 5]


# ---- mtp_save_first_token / mtp_get_first_token ------------------------------------------


def save_first(
    x,
    step,
    dec=None,
    prompt=None,
    skip=False,
    not_need_stop=True,
    queue=None,
    rank_id=0,
    each=False,
):
    bsz = x.shape[0]
    dec = np.full(bsz, 10, np.int32) if dec is None else np.asarray(dec, np.int32)
    prompt = (
        np.full((bsz, 1), 5, np.int64)
        if prompt is None
        else np.asarray(prompt, np.int64).reshape(bsz, 1)
    )
    step = np.asarray(step, np.int64).reshape(bsz, 1)
    args = [paddle.to_tensor(v) for v in (x, np.array([not_need_stop]), dec, prompt, step)]
    ops.mtp_save_first_token(*args, rank_id, each, skip, queue)
    np.testing.assert_array_equal(args[0].numpy(), x)  # x is not modified
    return ref.encode_first_token(x, np.array([not_need_stop]), dec, prompt, step, skip)


@pytest.mark.parametrize("skip", [False, True])
def test_first_token_message_and_reader(qid, skip):
    x = np.arange(5 * 3, dtype=np.int64).reshape(5, 3) + 100
    step = [0, 1, 2, 1, 1]
    dec = [10, 10, 10, 2, 10]  # item 3 still prefilling
    want = save_first(x, step, dec=dec, skip=skip, not_need_stop=False, queue=qid)
    text = raw_receive(qid)
    assert text == want and len(text) == messaging.FIRST_TOKEN_MESSAGE_BYTES == 7176
    counts = np.frombuffer(text, "<i4")[2:7].tolist()
    assert counts == ([0, 2, 0, 0, 2] if skip else [0, 2, 0, 2, 2])  # step_idx > 1: count 0
    assert np.frombuffer(text, "<i4")[0] == -1
    save_first(x, step, dec=dec, skip=skip, queue=qid)
    out = paddle.full([FIRST_LEN], 9, "int64")
    ops.mtp_get_first_token(out, False, qid)
    expected = np.full(FIRST_LEN, 9, np.int64)
    ref.decode_first_token(want.replace(np.int32(-1).tobytes(), np.int32(1).tobytes(), 1), expected)
    np.testing.assert_array_equal(out.numpy(), expected)
    ops.mtp_get_first_token(out, False, qid)
    assert out.numpy()[:2].tolist() == [-2, 0]


def test_first_token_rank_and_bad_arguments(qid):
    x = np.array([[1, 2], [3, 4]], np.int64)
    save_first(x, [1, 1], queue=qid, rank_id=2)
    assert raw_receive(qid) is None
    save_first(x, [1, 1], queue=qid, rank_id=2, each=True)
    assert raw_receive(qid) is not None
    with pytest.raises(
        ops.OpError, match="^mtp_save_first_token: `x` must have at least 2 columns"
    ):
        save_first(np.zeros((2, 1), np.int64), [1, 1], queue=qid)
    with pytest.raises(ops.OpError, match="^mtp_save_first_token: `x` has 257 rows"):
        save_first(np.zeros((257, 2), np.int64), [1] * 257, queue=qid)
    args = [paddle.to_tensor(v) for v in (x, np.array([True]), np.zeros(1, np.int32),
                                          np.zeros((2, 1), np.int64),
                                          np.ones((2, 1), np.int64))]  # fmt: skip
    with pytest.raises(ops.OpError, match="^mtp_save_first_token: `seq_lens_decoder`"):
        ops.mtp_save_first_token(*args, 0, False, False, qid)
    with pytest.raises(
        ops.OpError, match="^mtp_get_first_token: `output_tokens` must hold at least 1794"
    ):
        ops.mtp_get_first_token(paddle.zeros([FIRST_LEN - 1], "int64"), False, qid)
    assert raw_receive(qid) is None


def test_full_queue_raises_after_the_send_timeout_instead_of_hanging(qid):
    """Nobody reads: the queue (kernel.msgmnb bytes, 16384 by default) fills up with
    first-token messages (7176 bytes each); the next send retries for MSG_SEND_TIMEOUT_MS and
    then raises, naming the queue and its fill."""
    x = np.array([[1, 2]], np.int64)
    fits = int(Path("/proc/sys/kernel/msgmnb").read_text()) // messaging.FIRST_TOKEN_MESSAGE_BYTES
    for _ in range(fits):
        save_first(x, [1], queue=qid)

    def one_more():
        start = time.monotonic()
        try:
            save_first(x, [1], queue=qid)
        except ops.OpError as e:
            return str(e), time.monotonic() - start
        return "sent", time.monotonic() - start

    message, seconds = run_in_child(one_more, timeout=60)
    assert message.startswith(
        f"mtp_save_first_token: queue `msg_queue_id` = {qid} stayed full for 10000 ms"
    )
    assert "the reader is not draining it" in message
    assert ops.MSG_SEND_TIMEOUT_MS / 1000 <= seconds < 30


def test_malformed_message_is_consumed_and_read_as_no_message(qid):
    """A top-k message whose bsz is outside the layout, or that is shorter than its bsz
    needs, reads as "no message" (-2) and is dropped; the next one is read normally."""
    q = _libc.msgget(messaging.msg_queue_key(qid), 0o1600)  # IPC_CREAT | 0600
    _libc.msgsnd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for bsz, size in ((600, 2060), (-1, 2060), (3, 2060 + 1032 * 2), (1, 12)):
        meta = np.zeros(3 + ref.MAX_BSZ, "<i4")
        meta[:3] = (1, 3, bsz)
        text = (meta.tobytes() + bytes(1032 * 3))[:size]
        buf = ctypes.create_string_buffer((1).to_bytes(8, "little") + text)
        assert _libc.msgsnd(q, buf, len(text), 0) == 0
        assert read_topk(qid, fill=5)[0][:4].tolist() == [-2, 0, 0, 5]
    assert raw_receive(qid) is None  # each was consumed
    save_topk(topk_case(np.random.default_rng(0), counts=[1]), msg_queue_id=qid)
    assert read_topk(qid)[0][:4].tolist() == [1, 3, 1, 1]


# ---- fastdeploy_mtp.ops.messaging ----------------------------------------------------------


def test_helpers_key_sizes_and_remove(qid):
    assert (ops.MAX_BSZ, ops.MAX_DRAFT_TOKENS, ops.SPEC_LOGPROB_K) == (512, 6, 20)
    assert messaging.topk_message_bytes(0) == 2060 and messaging.topk_message_bytes(512) == 530444
    with pytest.raises(ValueError, match="bsz must be in"):
        messaging.topk_message_bytes(513)
    assert messaging.read_msgmax() == int(Path("/proc/sys/kernel/msgmax").read_text())
    st = os.stat("/dev/shm")
    key = ((st.st_dev & 0xF) << 28) | ((st.st_ino & 0xFF) << 20) | qid
    assert messaging.msg_queue_key(qid) % (1 << 32) == key
    assert messaging.remove_msg_queue(qid) is False  # none yet
    save_topk(topk_case(np.random.default_rng(0), counts=[1]), msg_queue_id=qid)
    assert messaging.msg_queue_key(qid) in _queues()
    assert messaging.remove_msg_queue(qid) is True
    assert messaging.msg_queue_key(qid) not in _queues()
