"""The prefill source's answers and KV blocks are authenticated (``splitwise/kv_mac.py``): a
decode instance with the splitwise secret refuses, counts and writes nothing of a tampered
tcp data frame (a byte flipped, frames reordered, truncated or replayed from another
request), an answer from whoever holds the prefill instance's address without the key, and
a Mooncake copy that differs from the prefill instance's blocks; the hand-over with the
secret copies exactly what it copies without."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from fastdeploy_mtp.credentials import DroppedMessages, derive
from fastdeploy_mtp.splitwise.control import control_mac
from fastdeploy_mtp.splitwise.kv_client import pull_blocks
from fastdeploy_mtp.splitwise.kv_layout import TransferError
from fastdeploy_mtp.splitwise.kv_mac import answer_mac
from fastdeploy_mtp.splitwise.transports import mooncake

from . import test_kv_transfer
from .test_kv_transfer import (
    DST_BLOCKS,
    SRC_BLOCKS,
    FakeSource,
    all_zero,
    assert_copied,
    check_answer,
    layout_of,
    make_caches,
)

sources = test_kv_transfer.sources  # the fixtures
publish = test_kv_transfer.publish

SECRET, OTHER = b"s" * 32, b"o" * 32
KEY = derive(SECRET, "kv")

#: ``tamper(op, frames) -> frames``: what a man in the middle does to an answer.
Tamper = Callable[[str, list[bytes]], list[bytes]]


@pytest.fixture
def relays() -> Iterator[Callable[[str, Tamper], FakeSource]]:
    """A man in the middle: a fake source on its own address that passes every request on
    to the real source at ``upstream`` and answers with ``tamper(op, its answer)``."""
    made: list[tuple[FakeSource, zmq.Socket, zmq.Context]] = []

    def make(upstream: str, tamper: Tamper) -> FakeSource:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(upstream)

        def forward(frames: list[bytes]) -> list[bytes]:
            sock.send_multipart(frames)
            assert sock.poll(5000), "the real source did not answer the relay"
            return tamper(json.loads(frames[0])["op"], sock.recv_multipart())

        relay = FakeSource(forward)
        made.append((relay, sock, ctx))
        return relay

    yield make
    for relay, sock, ctx in made:
        relay.close()  # its thread is the socket's only user: stopped first
        sock.close(0)
        ctx.term()


def header_of(frames: list[bytes]) -> dict[str, Any]:
    return dict(json.loads(frames[0]))


def with_header(frames: list[bytes], header: dict[str, Any]) -> list[bytes]:
    return [json.dumps(header).encode(), *frames[1:]]


def flip_a_byte(frames: list[bytes]) -> list[bytes]:
    data = bytearray(frames[3])
    data[17] ^= 0x01
    return [*frames[:3], bytes(data), *frames[4:]]


def reorder(frames: list[bytes]) -> list[bytes]:
    return [frames[0], frames[2], frames[1], *frames[3:]]


def drop_the_last_frame(frames: list[bytes]) -> list[bytes]:
    return frames[:-1]


def cut_a_frame(frames: list[bytes]) -> list[bytes]:
    return [*frames[:2], frames[2][:-4], *frames[3:]]


def drop_the_last_frame_and_its_tag(frames: list[bytes]) -> list[bytes]:
    header = header_of(frames)
    header["tags"] = header["tags"][:-1]
    header["frames"] -= 1
    return with_header(frames[:-1], header)


def change_the_header(frames: list[bytes]) -> list[bytes]:
    return with_header(frames, {**header_of(frames), "num_blocks": 1})


TAMPERED_FETCHES = [
    (flip_a_byte, "the blocks of rank 0 target layer 1 key sent from"),
    (reorder, "the blocks of rank 0 target layer 0 key sent from"),
    (drop_the_last_frame, "5 data frames, expected 6"),
    (cut_a_frame, "the blocks of rank 0 target layer 0 value sent from"),
    (drop_the_last_frame_and_its_tag, "refused the fetch answer .*its mac does not hold"),
    (change_the_header, "refused the fetch answer .*its mac does not hold"),
]


def passing(op: str, frames: list[bytes]) -> list[bytes]:
    return frames


def pull_through(
    relay: FakeSource, descriptor: dict[str, Any], dst: Any, dropped: DroppedMessages, **kw: Any
) -> int:
    """Pull ``descriptor``'s blocks into ``dst`` blocks 0, 1, ... as if its source sat at the
    relay's address."""
    ids = list(range(len(descriptor["block_ids"])))
    moved = {**descriptor, "address": relay.address}
    return pull_blocks(moved, dst, layout_of(dst), ids, secret=SECRET, dropped=dropped, **kw)


@pytest.mark.parametrize(("tamper", "message"), TAMPERED_FETCHES)
def test_a_tampered_tcp_data_answer_is_refused_counted_and_never_written(
    sources: Any, relays: Any, tamper: Callable[[list[bytes]], list[bytes]], message: str
) -> None:
    source, releases = sources(make_caches(1, SRC_BLOCKS, seed=60), secret=SECRET)
    relay = relays(source.address, lambda op, f: tamper(f) if op == "fetch" else f)
    dst, dropped = make_caches(1, DST_BLOCKS, seed=None), DroppedMessages()
    with pytest.raises(TransferError, match=message) as refused:
        pull_through(relay, source.offer("victim", [2, 6]), dst, dropped, timeout=5)
    assert "\n" not in str(refused.value)
    assert all_zero(dst)
    assert dropped.counts()["kv"] == 1 and source.dropped.counts()["kv"] == 0
    assert source.pending() == ["victim"] and releases.calls == []  # held until it expires


def test_frames_or_a_whole_answer_replayed_from_another_request_are_refused(
    sources: Any, relays: Any
) -> None:
    """The fetch answer of request ``a`` (same layout, same block count) recorded on the way,
    then given in place of request ``b``'s frames, or of ``b``'s whole answer."""
    source, _ = sources(make_caches(1, SRC_BLOCKS, seed=61), secret=SECRET)
    recorded: dict[str, list[bytes]] = {}
    replacing: list[Callable[[list[bytes]], list[bytes]]] = []

    def tamper(op: str, frames: list[bytes]) -> list[bytes]:
        if op != "fetch":
            return frames
        if not replacing:
            recorded["a"] = frames
            return frames
        return replacing[0](frames)

    relay = relays(source.address, tamper)
    dst, dropped = make_caches(1, DST_BLOCKS, seed=None), DroppedMessages()
    pull_through(relay, source.offer("a", [1, 2]), dst, dropped)  # passes: a's own answer
    assert dropped.counts()["kv"] == 0
    for replace, message in (
        (lambda f: [f[0], *recorded["a"][1:]], "the blocks of rank 0 target layer 0 key sent"),
        (lambda f: recorded["a"], "refused the fetch answer .*its mac does not hold"),
    ):
        replacing[:] = [replace]
        dst = make_caches(1, DST_BLOCKS, seed=None)
        rid = f"b{dropped.counts()['kv']}"
        with pytest.raises(TransferError, match=message):
            pull_through(relay, source.offer(rid, [7, 3]), dst, dropped, timeout=5)
        assert all_zero(dst)
    assert dropped.counts()["kv"] == 2


def test_an_answer_cannot_be_replayed_as_a_request_or_another_op() -> None:
    """The MACs differ by direction and op for the same request, token and content."""
    assert answer_mac(KEY, "check", "r", "t" * 43, 0, {}) != control_mac(
        KEY, "check", "r", "t" * 43
    )
    assert answer_mac(KEY, "release", "r", "t" * 43, 0, {"ok": True}) != answer_mac(
        KEY, "check", "r", "t" * 43, 0, {"ok": True}
    )


def test_whoever_answers_on_the_prefill_address_without_the_key_is_refused(sources: Any) -> None:
    """The prefill instance exited and another process bound its KV port: its well-formed
    answers, unsigned, signed with another deployment's key, carrying the request's own mac,
    or a genuine check answer replayed with a forged fetch answer, are refused and counted
    before a byte is written."""
    source, _ = sources(make_caches(1, SRC_BLOCKS, seed=62), secret=SECRET)
    port = int(source.address.rsplit(":", 1)[1])
    descriptor = source.offer("r", [4, 5])
    rid, token = "r", descriptor["token"]
    genuine = test_kv_transfer._control(
        source.address,
        {
            "op": "check",
            "request_id": rid,
            "token": token,
            "mac": control_mac(KEY, "check", rid, token),
        },
    )
    source.close()
    plain = json.loads(check_answer(descriptor))
    other_key = derive(OTHER, "kv")
    forged_fetch = [
        json.dumps({"ok": True, "frames": 6, "block_nbytes": [256] * 6, "num_blocks": 2}).encode(),
        *(b"\x01" * 512 for _ in range(6)),
    ]
    cases: list[tuple[dict[str, Any], str]] = [
        (plain, "check answer .*carries no mac"),
        ({**plain, "mac": answer_mac(other_key, "check", rid, token, 0, plain)}, "does not hold"),
        ({**plain, "mac": control_mac(KEY, "check", rid, token)}, "does not hold"),
        (genuine, "fetch answer .*carries no mac"),
    ]
    dropped = DroppedMessages()
    for i, (check, message) in enumerate(cases):

        def reply(frames: list[bytes], check: dict[str, Any] = check) -> list[bytes]:
            op = json.loads(frames[0])["op"]
            return [json.dumps(check).encode()] if op == "check" else forged_fetch

        fake = FakeSource(reply, port=port)
        try:
            dst = make_caches(1, DST_BLOCKS, seed=None)
            with pytest.raises(TransferError, match=message):
                pull_blocks(descriptor, dst, layout_of(dst), [0, 1], secret=SECRET, dropped=dropped)
            assert all_zero(dst) and dropped.counts()["kv"] == i + 1
        finally:
            fake.close()


def corrupting(real: Callable[[Any, str], None]) -> Callable[[Any, str], None]:
    """``finish_direct_read`` after one byte of the copy changed on the way (on the wire, or
    in P's memory through the transfer engine's open port during the hold)."""

    def finish(job: Any, how: str) -> None:
        cache = job.caches[0][-1]
        block = cache[job.dst_idx[0]].view(np.uint8)
        block.reshape(-1)[5] ^= 0x40
        real(job, how)

    return finish


def test_a_mooncake_copy_that_differs_from_the_prefill_blocks_is_refused(
    sources: Any, monkeypatch: Any
) -> None:
    """The transfer engine reads P's memory straight into D's blocks, unauthenticated: the
    copy is checked against the tags P computes of its own blocks (``digest``) before the
    release; a difference fails the pull (the blocks are freed unused) and is counted."""
    monkeypatch.setattr(mooncake, "finish_direct_read", corrupting(mooncake.finish_direct_read))
    source, releases = sources(make_caches(2, SRC_BLOCKS, seed=63), mooncake=True, secret=SECRET)
    dst, dropped = make_caches(2, DST_BLOCKS, seed=None), DroppedMessages()
    descriptor = source.offer("d", [8, 1, 3])
    with pytest.raises(
        TransferError, match="the blocks of rank 0 mtp layer 0 value read over mooncake"
    ):
        pull_blocks(
            descriptor, dst, layout_of(dst), [5, 6, 7], "mooncake", secret=SECRET, dropped=dropped
        )
    assert dropped.counts()["kv"] == 1 and releases.calls == []


def test_an_shm_copy_asks_no_digest(sources: Any, publish: Any) -> None:
    """shm reads files only the deployment's user can open: no digest round trip, no tags."""
    src, names = publish(make_caches(1, SRC_BLOCKS, seed=66))
    source, releases = sources(src, shm_names=names, secret=SECRET)
    asked: list[str] = []
    answer = source._answer

    def recording(frames: list[bytes]) -> Any:
        asked.append(json.loads(frames[0])["op"])
        return answer(frames)

    source._answer = recording
    dst = make_caches(1, DST_BLOCKS, seed=None)
    pull_blocks(source.offer("s", [2, 4]), dst, layout_of(dst), [0, 1], "shm", secret=SECRET)
    assert_copied(src, dst, [2, 4], [0, 1])
    assert asked == ["check", "release"] and releases.wait() == [("s", "released")]


@pytest.mark.parametrize("transport", ["tcp", "shm", "mooncake"])
@pytest.mark.parametrize("skip", [0, 1])
def test_the_hand_over_with_the_secret_copies_what_it_copies_without(
    sources: Any, publish: Any, transport: str, skip: int
) -> None:
    data = make_caches(2, SRC_BLOCKS, seed=64)
    copies = []
    for secret in (None, SECRET):
        src, names = publish(data)
        source, releases = sources(
            src, shm_names=names, mooncake=transport == "mooncake", secret=secret
        )
        dst, dropped = make_caches(2, DST_BLOCKS, seed=None), DroppedMessages()
        rid = f"same-{secret is None}"
        copied = pull_blocks(
            source.offer(rid, [9, 0, 4]),
            dst,
            layout_of(dst),
            [2, 11, 5],
            transport,
            secret=secret,
            skip=skip,
            dropped=dropped,
        )
        assert copied == 2 * (3 - skip) * layout_of(dst).block_nbytes
        assert_copied(src, dst, [9, 0, 4][skip:], [2, 11, 5][skip:])
        assert dropped.counts()["kv"] == 0 and releases.wait() == [(rid, "released")]
        copies.append(dst)
    for without, with_ in zip(copies[0], copies[1]):
        for a, b in zip(without, with_):
            np.testing.assert_array_equal(a, b)


def test_digest_is_answered_only_by_a_source_with_a_secret(sources: Any) -> None:
    source, _ = sources(make_caches(1, SRC_BLOCKS, seed=65))
    descriptor = source.offer("n", [1])
    answer = test_kv_transfer._control(
        source.address, {"op": "digest", "request_id": "n", "token": descriptor["token"]}
    )
    assert answer == {
        "ok": False,
        "error": "this source has no splitwise secret: it tags no blocks",
    }
