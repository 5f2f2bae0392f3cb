"""KV-block transfer between a prefill source and a decode puller (tcp and shm transports)."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from fastdeploy_mtp.models.cache_spec import describe, key_value_specs
from fastdeploy_mtp.splitwise.addresses import discover_host
from fastdeploy_mtp.splitwise.descriptor import DESCRIPTOR_HEAD
from fastdeploy_mtp.splitwise.kv_client import pull_blocks
from fastdeploy_mtp.splitwise.kv_layout import KVLayout, TransferError
from fastdeploy_mtp.splitwise.kv_source import KVSource
from fastdeploy_mtp.splitwise.transport import (
    PullJob,
    Transport,
    _registry as transport_registry,
    choose_transport,
    register,
    transport_names,
)

TARGET_LAYERS, MTP_LAYERS = 2, 1
BLOCK_SHAPE = (2, 4, 8)  # kv heads per rank, block size, head dim
SRC_BLOCKS, DST_BLOCKS = 10, 12


def make_caches(
    tp: int,
    num_blocks: int,
    seed: int | None,
    layers: int = TARGET_LAYERS + MTP_LAYERS,
    dtype: Any = np.float32,
) -> list[list[np.ndarray]]:
    """Per rank, ``2 * layers`` arrays ``[num_blocks, *BLOCK_SHAPE]``: random (``seed``) or
    zeros."""
    rng = np.random.default_rng(seed)
    shape = (num_blocks, *BLOCK_SHAPE)
    if seed is None:
        return [[np.zeros(shape, dtype) for _ in range(2 * layers)] for _ in range(tp)]
    return [
        [rng.standard_normal(shape).astype(dtype) for _ in range(2 * layers)] for _ in range(tp)
    ]


def description(
    num_blocks: int,
    target: int = TARGET_LAYERS,
    mtp: int = MTP_LAYERS,
    block_shape: tuple[int, ...] = BLOCK_SHAPE,
    dtype: str = "float32",
) -> list[dict[str, Any]]:
    """The cache spec's JSON form of ``target`` + ``mtp`` layers (a key and a value each)."""
    shape = (num_blocks, *block_shape)
    return describe(
        key_value_specs("target", target, shape, dtype) + key_value_specs("mtp", mtp, shape, dtype)
    )


def make_layout(tp: int, num_blocks: int, **kwargs: Any) -> KVLayout:
    return KVLayout.from_description(tp, description(num_blocks, **kwargs))


def layout_of(caches: list[list[np.ndarray]], target: int = TARGET_LAYERS) -> KVLayout:
    """The layout of ``caches``: the first ``2 * target`` arrays of a rank are the target's
    key/value pairs, the rest the MTP layers'; shapes and dtypes those of rank 0's arrays."""
    first = caches[0]
    desc = [
        {
            "owner": "target" if i < 2 * target else "mtp",
            "layer": i // 2 if i < 2 * target else i // 2 - target,
            "kind": ("key", "value")[i % 2],
            "shape": list(a.shape),
            "dtype": a.dtype.name,
        }
        for i, a in enumerate(first)
    ]
    return KVLayout.of_caches(caches, desc)


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


class Releases:
    """An ``on_release`` that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, request_id: str, reason: str) -> None:
        with self._lock:
            self.calls.append((request_id, reason))
            self.threads.add(threading.current_thread().name)

    def wait(self, count: int = 1, timeout: float = 5.0) -> list[tuple[str, str]]:
        assert wait_until(lambda: len(self.calls) >= count, timeout), (
            f"on_release calls: {self.calls}"
        )
        time.sleep(0.15)  # a duplicate call would land within a server-loop period
        return list(self.calls)


@pytest.fixture
def sources() -> Iterator[Callable[..., tuple[KVSource, Releases]]]:
    """Make KV sources that are closed after the test."""
    made: list[KVSource] = []

    def make(caches: list[list[np.ndarray]], **kwargs: Any) -> tuple[KVSource, Releases]:
        releases = Releases()
        source = KVSource(caches, layout_of(caches), releases, **kwargs)
        made.append(source)
        return source, releases

    yield make
    for source in made:
        source.close()


def assert_copied(
    src: list[list[np.ndarray]], dst: list[list[np.ndarray]], src_ids: list[int], dst_ids: list[int]
) -> None:
    """Block ``src_ids[j]`` of every cache landed in ``dst_ids[j]``; every other block is zero."""
    others = [b for b in range(dst[0][0].shape[0]) if b not in dst_ids[: len(src_ids)]]
    for r, (src_rank, dst_rank) in enumerate(zip(src, dst)):
        for c, (s, d) in enumerate(zip(src_rank, dst_rank)):
            for sb, db in zip(src_ids, dst_ids):
                np.testing.assert_array_equal(
                    d[db], s[sb], err_msg=f"rank {r} cache {c} block {sb}->{db}"
                )
            assert not d[others].any(), f"rank {r} cache {c}: blocks outside {dst_ids} were written"


def all_zero(caches: list[list[np.ndarray]]) -> bool:
    return not any(a.any() for rank in caches for a in rank)


# ---- layout ---------------------------------------------------------------------------------


def test_layout_round_trip_and_sizes() -> None:
    layout = make_layout(2, 3)
    assert layout.num_caches == 6 and (layout.count("target"), layout.count("mtp")) == (4, 2)
    assert [c.block_nbytes for c in layout.caches] == [2 * 4 * 8 * 4] * 6
    assert layout.block_nbytes == 6 * 2 * 4 * 8 * 4
    assert KVLayout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    assert layout_of(make_caches(2, 3, 0)) == layout
    assert [c.label for c in layout.caches[3:5]] == ["target layer 1 value", "mtp layer 0 key"]
    bf16 = make_layout(1, 3, dtype="bfloat16")
    assert bf16.caches[0].host_dtype == "int16" and bf16.caches[0].block_nbytes == 2 * 4 * 8 * 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tensor_parallel_size": None}, "missing key `tensor_parallel_size`"),  # removed below
        ({"tensor_parallel_size": "2"}, "`tensor_parallel_size` must be an int"),
        ({"extra": 1}, "unknown key `extra`"),
        ({"caches": []}, "`caches` must be a non-empty list"),
        ({0: {"layer": True}}, r"`caches\[0\]`: `layer` must be an int"),
        ({1: {"layer": -1}}, r"`caches\[1\]`: `layer` must be >= 0"),
        ({2: {"owner": "draft"}}, r"`caches\[2\]`: `owner` must be 'target' or 'mtp'"),
        ({3: {"kind": "query"}}, r"`caches\[3\]`: `kind` must be"),
        ({4: {"shape": [3, 2, 0, 8]}}, r"`caches\[4\]`: `shape` must be >= 1"),
        ({4: {"shape": "3,2,4,8"}}, r"`caches\[4\]`: `shape` must be a list"),
        ({5: {"dtype": "float99"}}, r"`caches\[5\]`: `dtype` must be one of"),
        ({5: {"dtype": 4}}, r"`caches\[5\]`: `dtype` must be one of"),
        ({5: {"extra": 1}}, r"`caches\[5\]` must have the keys"),
    ],
)
def test_layout_from_dict_names_the_bad_key(change: dict[Any, Any], message: str) -> None:
    d = make_layout(1, 3).to_dict()
    for key, value in change.items():
        if isinstance(key, int):
            d["caches"][key].update(value)
        elif value is None:
            del d[key]
        else:
            d[key] = value
    with pytest.raises(TransferError, match=message):
        KVLayout.from_dict(d)


@pytest.mark.parametrize(
    ("decode", "message"),
    [
        (dict(tp=1), "`tensor_parallel_size`: prefill has 2, this decode instance has 1"),
        (
            dict(mtp=3),
            r"prefill has 6 caches per rank, this decode instance 10 "
            r"\(first unmatched: mtp layer 1 key\)",
        ),
        (
            dict(target=1, mtp=2),
            r"cache 2 \(target layer 1 key\): prefill has target layer 1 key, this decode .* mtp",
        ),
        (
            dict(block_shape=(1, 4, 8)),
            r"cache 0 \(target layer 0 key\): block shape \[2, 4, 8\] on the prefill",
        ),
        (
            dict(dtype="bfloat16"),
            r"cache 0 \(target layer 0 key\): dtype float32 on the prefill, bfloat16 here",
        ),
    ],
)
def test_layout_check_matches_names_the_first_differing_cache(
    decode: dict[str, Any], message: str
) -> None:
    prefill = make_layout(2, 10)
    prefill.check_matches(make_layout(2, 12))  # the block counts may differ
    tp = decode.pop("tp", 2)
    with pytest.raises(TransferError, match=f"KV layout mismatch.*{message}"):
        prefill.check_matches(make_layout(tp, 12, **decode))


def test_layout_of_inconsistent_caches() -> None:
    caches = make_caches(2, 4, 0)
    caches[1].pop()
    with pytest.raises(
        TransferError, match=r"caches\[1\]` must hold 6 arrays \(4 target \+ 2 MTP caches\), got 5"
    ):
        layout_of(caches)
    caches = make_caches(2, 4, 0)
    caches[1][3] = caches[1][3][:, :, :2]
    with pytest.raises(
        TransferError, match=r"caches\[1\]\[3\]` \(target layer 1 value\) has shape"
    ):
        layout_of(caches)
    caches = make_caches(2, 4, 0)
    caches[1][2] = caches[1][2].astype(np.float16)
    with pytest.raises(
        TransferError, match=r"caches\[1\]\[2\]` \(target layer 1 key\) has dtype float16"
    ):
        layout_of(caches)
    caches = make_caches(1, 4, 0)
    caches[0][5] = caches[0][5][:3]
    with pytest.raises(
        TransferError, match=r"caches\[0\]\[5\]` \(mtp layer 0 value\) has 3 blocks"
    ):
        layout_of(caches)


# ---- tcp transport ------------------------------------------------------------------------------


def test_a_wildcard_bind_advertises_a_reachable_address(sources: Any) -> None:
    """Bound on every interface, the descriptor names a host a decode instance can connect to:
    ``advertise_host``, or this machine's name."""
    src = make_caches(1, SRC_BLOCKS, seed=5)
    dst = make_caches(1, DST_BLOCKS, seed=None)
    source, releases = sources(src, host="0.0.0.0", advertise_host="127.0.0.1")
    assert source.address.startswith("tcp://127.0.0.1:")
    pull_blocks(source.offer("w", [2]), dst, layout_of(dst), [4])
    assert_copied(src, dst, [2], [4])
    assert releases.wait() == [("w", "released")]
    named, _ = sources(src, host="0.0.0.0")
    assert named.address == f"tcp://{discover_host()}:{named.address.rsplit(':', 1)[1]}"
    with pytest.raises(TransferError, match="advertise_host"):
        sources(src, advertise_host="")


@pytest.mark.parametrize("tp", [1, 2])
def test_tcp_pull_copies_the_offered_blocks(sources: Any, tp: int) -> None:
    src = make_caches(tp, SRC_BLOCKS, seed=tp)
    dst = make_caches(tp, DST_BLOCKS, seed=None)
    source, releases = sources(src)
    assert source.address.startswith("tcp://127.0.0.1:")
    descriptor = json.loads(json.dumps(source.offer("req-1", [3, 7, 1])))  # as it travels to D
    assert descriptor["num_blocks"] == SRC_BLOCKS and descriptor["shm_names"] is None
    # the wire order: the head, the transports' fields by preference, the hold timeout
    assert list(descriptor) == [*DESCRIPTOR_HEAD, "mooncake", "shm_names", "hold_timeout"]
    assert source.pending() == ["req-1"]

    copied = pull_blocks(descriptor, dst, layout_of(dst), [11, 0, 5, 9])  # the 4th is spare
    layout = layout_of(src)
    assert copied == tp * 3 * layout.block_nbytes
    assert_copied(src, dst, [3, 7, 1], [11, 0, 5])
    assert releases.wait() == [("req-1", "released")]
    assert releases.threads == {source._thread.name}  # from the server thread
    assert source.pending() == []
    dst_before = [[a.copy() for a in rank] for rank in dst]
    with pytest.raises(TransferError, match="'req-1' was released"):
        pull_blocks(descriptor, dst, layout_of(dst), [2, 3, 4], timeout=2)
    for before, after in zip(itertools.chain(*dst_before), itertools.chain(*dst)):
        np.testing.assert_array_equal(before, after)


def test_several_offers_and_pulls_are_independent(sources: Any) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=5)
    source, releases = sources(src)
    first = source.offer("a", [0, 1])
    second = source.offer("b", [9])
    dst_b = make_caches(1, 4, seed=None)
    pull_blocks(second, dst_b, layout_of(dst_b), [2])
    assert_copied(src, dst_b, [9], [2])
    assert source.pending() == ["a"]
    dst_a = make_caches(1, 4, seed=None)
    pull_blocks(first, dst_a, layout_of(dst_a), np.array([3, 1]))
    assert_copied(src, dst_a, [0, 1], [3, 1])
    assert sorted(releases.wait(2)) == [("a", "released"), ("b", "released")]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("secret", [None, b"s" * 32])
def test_skip_pulls_only_the_blocks_the_decode_cache_lacks(
    sources: Any, publish: Any, transport: str, secret
) -> None:
    """``skip``: D's prefix cache already holds the first offered blocks; only the rest are
    read (shm) or sent (tcp: P's reply carries them alone), and the held ones are untouched."""
    data = make_caches(1, SRC_BLOCKS, seed=21)
    src, names = publish(data)
    source, releases = sources(src, shm_names=names, secret=secret)
    descriptor = source.offer("skip-req", [4, 0, 8, 2])
    dst = make_caches(1, DST_BLOCKS, seed=None)
    copied = pull_blocks(
        descriptor, dst, layout_of(dst), [1, 10, 6, 3], transport=transport, secret=secret, skip=2
    )
    assert copied == 2 * layout_of(dst).block_nbytes
    assert_copied(src, dst, [8, 2], [6, 3])  # blocks 1 and 10 (the cached prefix) stay as they were
    assert releases.wait() == [("skip-req", "released")]
    offer = source.offer("skip-all", [4, 0])
    with pytest.raises(TransferError, match="`skip` must be an int in"):
        pull_blocks(offer, dst, layout_of(dst), [1, 10], transport=transport, secret=secret, skip=2)


def test_a_fetch_with_a_forged_first_is_refused(sources: Any) -> None:
    """``first`` is covered by the control mac: a signed fetch of the tail is answered with
    those blocks alone; one whose ``first`` was changed after signing is refused."""
    from fastdeploy_mtp.credentials import derive
    from fastdeploy_mtp.splitwise.control import control_mac
    from fastdeploy_mtp.splitwise.kv_client import _Peer

    key = derive(b"k" * 32, "kv")
    source, _ = sources(make_caches(1, SRC_BLOCKS, seed=3), secret=b"k" * 32)
    for rid, forged in (("signed", False), ("forged", True)):
        descriptor = source.offer(rid, [1, 2, 3])
        peer = _Peer(descriptor["address"], rid, descriptor["token"], key, first=1)
        try:
            if not forged:
                header, _frames = peer.ask("fetch", 5.0)
                assert header["num_blocks"] == 2
                continue
            mac = control_mac(key, "fetch", rid, descriptor["token"])  # signs first = 0
            body = {
                "op": "fetch",
                "request_id": rid,
                "token": descriptor["token"],
                "mac": mac,
                "first": 1,
            }
            peer.sock.send(json.dumps(body).encode())
            assert peer.sock.poll(5000)
            reply = json.loads(peer.sock.recv_multipart()[0])
        finally:
            peer.close()
        assert reply["ok"] is False and rid in source.pending()


# ---- shm transport ------------------------------------------------------------------------------

_device_ids = itertools.count()


@pytest.fixture
def publish() -> Iterator[
    Callable[[list[list[np.ndarray]]], tuple[list[list[np.ndarray]], list[list[str]]]]
]:
    """Publish caches as a cache manager does (``set_data_ipc`` under FastDeploy's names, unique
    to the test); returns numpy views of the shared memory and the names. Unpublished after
    the test, which then checks that no name is left in /dev/shm."""
    import paddle

    from fastdeploy_mtp.ipc.kv_caches import cache_names, publish_caches, unpublish_caches

    published: list[tuple[list[Any], list[str]]] = []

    def make(data: list[list[np.ndarray]]) -> tuple[list[list[np.ndarray]], list[list[str]]]:
        device_id = os.getpid() * 1000 + next(_device_ids)
        names = [cache_names(0, len(data[0]) // 2, r, device_id) for r in range(len(data))]
        tensors = [[paddle.to_tensor(a) for a in rank] for rank in data]
        for rank_tensors, rank_names in zip(tensors, names):
            publish_caches(rank_tensors, rank_names)
            published.append((rank_tensors, rank_names))
        assert all(os.path.exists(f"/dev/shm/{n}") for rank in names for n in rank)
        return [[np.from_dlpack(t) for t in rank] for rank in tensors], names

    yield make
    for rank_tensors, rank_names in published:
        unpublish_caches(rank_tensors, rank_names)
    leftovers = [
        n for _, rank_names in published for n in rank_names if os.path.exists(f"/dev/shm/{n}")
    ]
    assert leftovers == []


@pytest.mark.parametrize("tp", [1, 2])
def test_shm_pull_copies_from_the_published_caches(sources: Any, publish: Any, tp: int) -> None:
    data = make_caches(tp, SRC_BLOCKS, seed=11)
    src, names = publish(data)  # views of the shared memory
    src[0][0][4] += 1.0  # a write after publishing is what D must see
    # The source serves tcp fetches from other arrays (negated), so only a copy that really
    # reads the published memory gives `src`.
    decoy = [[-a for a in rank] for rank in src]
    source, releases = sources(decoy, shm_names=names)
    descriptor = json.loads(json.dumps(source.offer("shm-req", [4, 0, 8])))
    assert descriptor["shm_names"] == names
    dst = make_caches(tp, DST_BLOCKS, seed=None)

    copied = pull_blocks(descriptor, dst, layout_of(dst), [1, 10, 6], transport="shm")
    assert copied == tp * 3 * layout_of(dst).block_nbytes
    assert_copied(src, dst, [4, 0, 8], [1, 10, 6])
    np.testing.assert_array_equal(dst[0][0][1], data[0][0][4] + 1.0)
    assert releases.wait() == [("shm-req", "released")]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_every_cache_of_three_mtp_layers_on_every_rank_is_transferred(
    sources: Any, publish: Any, transport: str
) -> None:
    """2 target + 3 MTP layers at TP 2: per rank, 4 target and 6 MTP caches (3 key/value
    pairs) arrive, each holding exactly its own source cache's blocks."""
    tp, mtp = 2, 3
    src, names = publish(make_caches(tp, SRC_BLOCKS, seed=31, layers=TARGET_LAYERS + mtp))
    source, releases = sources(src, shm_names=names)
    layout = layout_of(src)
    assert (layout.count("target"), layout.count("mtp")) == (2 * TARGET_LAYERS, 2 * mtp)
    descriptor = json.loads(json.dumps(source.offer("all", [6, 2])))
    assert [c["owner"] for c in descriptor["layout"]["caches"]] == ["target"] * 4 + ["mtp"] * 6
    dst = make_caches(tp, DST_BLOCKS, seed=None, layers=TARGET_LAYERS + mtp)
    copied = pull_blocks(descriptor, dst, layout_of(dst), [3, 9], transport=transport)
    assert copied == tp * 10 * 2 * layout.caches[0].block_nbytes
    arrived: dict[tuple[int, str], int] = {}
    for r in range(tp):
        for c, entry in enumerate(layout.caches):
            if dst[r][c].any():
                np.testing.assert_array_equal(
                    dst[r][c][[3, 9]], src[r][c][[6, 2]], err_msg=f"rank {r} {entry.label}"
                )
                arrived[r, entry.owner] = arrived.get((r, entry.owner), 0) + 1
    assert arrived == {(0, "target"): 4, (0, "mtp"): 6, (1, "target"): 4, (1, "mtp"): 6}
    assert releases.wait() == [("all", "released")]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_bfloat16_caches_travel_as_their_bits(transport: str) -> None:
    """bfloat16 caches (host views int16): the shm transport attaches P's caches with the
    layout's dtype, both transports copy the bits unchanged."""
    import paddle

    from fastdeploy_mtp.ipc.kv_caches import host_view, publish_caches, unpublish_caches

    device_id = os.getpid() * 1000 + next(_device_ids)
    rng = np.random.default_rng(41)
    values = [rng.standard_normal((SRC_BLOCKS, *BLOCK_SHAPE)).astype(np.float32) for _ in range(6)]
    tensors = [paddle.to_tensor(v).astype("bfloat16") for v in values]
    names = [f"{k}_caches_{n}_rank0.device{device_id}" for n in range(3) for k in ("key", "value")]
    publish_caches(tensors, names)
    try:
        src = [[host_view(t) for t in tensors]]
        releases = Releases()
        with KVSource(
            src,
            KVLayout.of_caches(src, description(SRC_BLOCKS, dtype="bfloat16")),
            releases,
            shm_names=[names],
        ) as source:
            dst = [[np.zeros((DST_BLOCKS, *BLOCK_SHAPE), np.int16) for _ in range(6)]]
            layout = KVLayout.of_caches(dst, description(DST_BLOCKS, dtype="bfloat16"))
            copied = pull_blocks(
                source.offer("bf16", [7, 3]), dst, layout, [0, 5], transport=transport
            )
            assert copied == 6 * 2 * 2 * 4 * 8 * 2
            assert_copied(src, dst, [7, 3], [0, 5])
            back = (
                paddle.to_tensor(dst[0][4][[0, 5]]).view(paddle.bfloat16).astype("float32").numpy()
            )
            np.testing.assert_array_equal(back, tensors[4].astype("float32").numpy()[[7, 3]])
            assert releases.wait() == [("bf16", "released")]
    finally:
        unpublish_caches(tensors, names)
    assert not any(os.path.exists(f"/dev/shm/{n}") for n in names)


def test_shm_pull_fails_when_the_offer_ends_during_the_copy(publish: Any) -> None:
    src, names = publish(make_caches(1, SRC_BLOCKS, seed=15))

    offer: dict[str, Any] = {}

    def reply(frames: list[bytes]) -> list[bytes]:  # held at "check", gone at "release"
        if json.loads(frames[0])["op"] == "check":
            return [check_answer(offer)]
        return [b'{"ok": false, "error": "request \'fake\' expired"}']

    fake = FakeSource(reply)
    try:
        dst = make_caches(1, DST_BLOCKS, seed=None)
        descriptor = {**descriptor_for(fake.address, [2]), "shm_names": names}
        offer.update(descriptor)
        with pytest.raises(
            TransferError, match="refused release: request 'fake' expired; .* may be torn"
        ):
            pull_blocks(descriptor, dst, layout_of(dst), [7], transport="shm", timeout=5)
        assert [json.loads(f[0])["op"] for f in fake.received] == ["check", "release"]
    finally:
        fake.close()


def test_shm_pull_needs_names_and_published_caches(sources: Any) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=2)
    dst = make_caches(1, DST_BLOCKS, seed=None)
    source, releases = sources(src)
    with pytest.raises(TransferError, match="needs `shm_names`"):
        pull_blocks(source.offer("no-names", [1]), dst, layout_of(dst), [0], transport="shm")
    names = [[f"kvx_test_never_published_{os.getpid()}_{i}" for i in range(6)]]
    named, _ = sources(src, shm_names=names)
    with pytest.raises(
        TransferError, match="cannot attach the prefill's cache 'kvx_test_never_published"
    ):
        pull_blocks(
            named.offer("missing", [1]), dst, layout_of(dst), [0], transport="shm", timeout=2
        )
    assert all_zero(dst)
    assert named.pending() == ["missing"]  # not released: nothing was copied


# ---- the transport registry ----------------------------------------------------------------------


def test_auto_takes_shm_when_the_prefill_caches_are_on_this_host(publish: Any) -> None:
    _, names = publish(make_caches(1, 2, seed=1))
    assert transport_names() == ("tcp", "mooncake", "shm")
    assert choose_transport("auto", {"shm_names": names}) == "shm"
    assert choose_transport("auto", {"shm_names": None}) == "tcp"
    assert choose_transport("auto", {"shm_names": [[f"kvx_test_nowhere_{os.getpid()}"]]}) == "tcp"
    assert choose_transport("tcp", {"shm_names": names}) == "tcp"


class LoopTransport(Transport):
    """A transport as a new module would add one: its own descriptor field and option; it
    moves the bytes as "tcp" does (over ``fetch``)."""

    name = "loop"
    preference = 20
    fields = ("loop_tag",)

    def offer_fields(
        self, caches: Any, layout: KVLayout, options: dict[str, Any], host: str, where: str
    ) -> dict[str, Any]:
        return {"loop_tag": options.pop("loop_tag", None)}

    def read_fields(
        self, descriptor: dict[str, Any], layout: KVLayout, where: str
    ) -> dict[str, Any]:
        return {"loop_tag": descriptor["loop_tag"]}

    def usable(self, descriptor: dict[str, Any]) -> bool:
        return descriptor.get("loop_tag") is not None

    def pull(self, job: PullJob) -> None:
        _, frames = job.channel.ask("fetch", job.timeout)
        layout = job.descriptor.layout
        entries = layout.caches * layout.tensor_parallel_size
        for cache, frame, entry in zip((c for rank in job.caches for c in rank), frames, entries):
            shape = (len(job.descriptor.block_ids), *entry.block_shape)
            cache[job.dst_idx] = np.frombuffer(frame.buffer, entry.host_dtype).reshape(shape)
        job.channel.release(job.timeout)


def test_a_registered_transport_is_offered_pulled_and_chosen(
    sources: Any, monkeypatch: Any
) -> None:
    transport_names()  # the shipped transports are loaded before the test adds its own
    monkeypatch.setitem(transport_registry, "loop", LoopTransport())
    src = make_caches(2, SRC_BLOCKS, seed=21)
    dst = make_caches(2, DST_BLOCKS, seed=None)
    source, releases = sources(src, loop_tag="here")
    descriptor = json.loads(json.dumps(source.offer("l", [5, 2])))
    assert list(descriptor)[-4:] == ["mooncake", "shm_names", "loop_tag", "hold_timeout"]
    assert descriptor["loop_tag"] == "here"
    assert choose_transport("auto", descriptor) == "loop"
    pull_blocks(descriptor, dst, layout_of(dst), [1, 3], transport="loop")
    assert_copied(src, dst, [5, 2], [1, 3])
    assert releases.wait() == [("l", "released")]
    plain, _ = sources(src)
    assert plain.offer("p", [1])["loop_tag"] is None
    assert choose_transport("auto", plain.offer("q", [2])) == "tcp"
    with pytest.raises(
        TransferError, match="`transport` must be 'tcp', 'mooncake', 'shm' or 'loop', got 'rdma'"
    ):
        pull_blocks(plain.offer("r", [3]), dst, layout_of(dst), [0], transport="rdma")
    for taken in ("auto", "tcp"):
        with pytest.raises(ValueError, match=f"KV transport name '{taken}' is taken"):
            register(type("Again", (LoopTransport,), {"name": taken}))


# ---- hold, withdraw, close ----------------------------------------------------------------------


def test_an_unreleased_offer_expires(sources: Any) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=3)
    source, releases = sources(src, hold_timeout=0.3)
    descriptor = source.offer("slow", [2, 3])
    assert releases.wait() == [("slow", "expired")]
    assert source.pending() == []
    dst = make_caches(1, DST_BLOCKS, seed=None)
    with pytest.raises(
        TransferError, match=r"'slow' expired \(not released within hold_timeout 0.3 s\)"
    ):
        pull_blocks(descriptor, dst, layout_of(dst), [0, 1], timeout=2)
    assert all_zero(dst)


def test_withdraw(sources: Any) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=4)
    source, releases = sources(src)
    descriptor = source.offer("w", [5])
    assert source.withdraw("w") is True
    assert source.withdraw("w") is False
    assert source.withdraw("never") is False
    assert source.pending() == []
    assert releases.wait() == [("w", "withdrawn")]
    dst = make_caches(1, DST_BLOCKS, seed=None)
    with pytest.raises(TransferError, match="'w' was withdrawn"):
        pull_blocks(descriptor, dst, layout_of(dst), [0], timeout=2)
    assert all_zero(dst)
    source.offer("w", [5])  # the id can be offered again once it ended
    assert source.pending() == ["w"]


def test_close_releases_pending_offers_and_pulls_then_fail(sources: Any) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=6)
    source, releases = sources(src)
    descriptor = source.offer("c1", [1])
    source.offer("c2", [2])
    source.close()
    source.close()  # idempotent
    assert sorted(releases.calls) == [("c1", "closed"), ("c2", "closed")]
    assert not source._thread.is_alive()
    assert source.pending() == []
    assert source.withdraw("c1") is False
    with pytest.raises(TransferError, match="is closed"):
        source.offer("c3", [3])
    dst = make_caches(1, DST_BLOCKS, seed=None)
    start = time.monotonic()
    with pytest.raises(
        TransferError, match=rf"{descriptor['address']} did not answer check within 0.5 s"
    ):
        pull_blocks(descriptor, dst, layout_of(dst), [0], timeout=0.5)
    assert time.monotonic() - start < 2.5
    assert all_zero(dst)


def test_a_raising_on_release_does_not_stop_the_source() -> None:
    src = make_caches(1, SRC_BLOCKS, seed=7)
    calls: list[tuple[str, str]] = []

    def on_release(rid: str, reason: str) -> None:
        calls.append((rid, reason))
        raise RuntimeError("engine bug")

    with KVSource(src, layout_of(src), on_release) as source:
        dst = make_caches(1, DST_BLOCKS, seed=None)
        pull_blocks(source.offer("x", [1]), dst, layout_of(dst), [0])
        pull_blocks(source.offer("y", [2]), dst, layout_of(dst), [1])
        assert_copied(src, dst, [1, 2], [0, 1])
    assert calls == [("x", "released"), ("y", "released")]


# ---- refusals: nothing written ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make_dst", "message"),
    [
        (
            lambda: (make_caches(1, DST_BLOCKS, None, layers=4), 3),
            r"cache 4 \(mtp layer 0 key\): prefill has mtp layer 0 key, "
            r"this decode instance has target layer 2 key",
        ),
        (
            lambda: (make_caches(1, DST_BLOCKS, None, layers=5), 2),
            "6 caches per rank, this decode instance 10",
        ),
        (
            None,
            r"cache 0 \(target layer 0 key\): block shape \[2, 4, 8\] on the prefill, "
            r"\[2, 4, 4\] here",
        ),
        (
            lambda: (make_caches(2, DST_BLOCKS, None), 2),
            "`tensor_parallel_size`: prefill has 1, this decode",
        ),
        (
            lambda: (make_caches(1, DST_BLOCKS, None, dtype=np.float16), 2),
            "dtype float32 on the prefill, float16",
        ),
    ],
)
def test_layout_mismatch_is_refused_before_any_write(
    sources: Any, make_dst: Any, message: str
) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=8)
    source, releases = sources(src)
    if make_dst is None:
        dst = [[np.zeros((DST_BLOCKS, 2, 4, 4), np.float32) for _ in range(6)]]
        target = 2
    else:
        dst, target = make_dst()
    with pytest.raises(TransferError, match=f"KV layout mismatch.*{message}"):
        pull_blocks(source.offer("m", [1, 2]), dst, layout_of(dst, target), [0, 1])
    assert all_zero(dst)
    assert source.pending() == ["m"] and releases.calls == []


def test_bad_destination_arguments_are_refused_before_any_write(sources: Any) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=9)
    source, releases = sources(src)
    descriptor = source.offer("d", [1, 2, 3])
    dst = make_caches(1, DST_BLOCKS, seed=None)
    layout = layout_of(dst)
    refusals = [
        ([0, 1], {}, r"`dst_block_ids` has 2 block\(s\), the prefill offered 3"),
        (
            [0, 1, DST_BLOCKS],
            {},
            rf"`dst_block_ids` holds block id {DST_BLOCKS}, outside \[0, {DST_BLOCKS}\)",
        ),
        ([0, -1, 2], {}, "`dst_block_ids` holds block id -1"),
        ([0, 1, 1], {}, "`dst_block_ids` holds block id 1 more than once"),
        ([0, 1.5, 2], {}, "`dst_block_ids` holds 1.5"),
        ([0, 1, 2], {"transport": "rdma"}, "`transport` must be 'tcp', 'mooncake' or 'shm'"),
        ([0, 1, 2], {"timeout": 0}, "`timeout` must be a positive number"),
    ]
    for ids, kwargs, message in refusals:
        with pytest.raises(TransferError, match=message):
            pull_blocks(descriptor, dst, layout, ids, **kwargs)
    read_only = make_caches(1, DST_BLOCKS, seed=None)
    read_only[0][4].flags.writeable = False
    with pytest.raises(TransferError, match=r"`caches\[0\]\[4\]` \(mtp layer 0 key\) is read-only"):
        pull_blocks(descriptor, read_only, layout, [0, 1, 2])
    assert all_zero(dst) and all_zero(read_only)
    assert source.pending() == ["d"] and releases.calls == []


def test_bad_descriptors_are_refused_before_any_write(sources: Any) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=10)
    source, _ = sources(src)
    good = source.offer("bad", [1, 2])
    dst = make_caches(1, DST_BLOCKS, seed=None)
    layout = layout_of(dst)
    cases: list[tuple[Any, str]] = [
        ("not a dict", "descriptor must be a dict"),
        ({k: v for k, v in good.items() if k != "block_ids"}, "missing key `block_ids`"),
        ({**good, "version": 2}, "`version` 2 is not 4"),
        ({**good, "token": None}, "`token` must be the offer's transfer token"),
        ({**good, "token": "short"}, "`token` must be the offer's transfer token"),
        ({**good, "request_id": 7}, "`request_id` must be a non-empty str"),
        ({**good, "address": "ipc:///tmp/x"}, "`address` must be a 'tcp://host:port' str"),
        (
            {**good, "block_ids": [1, SRC_BLOCKS]},
            rf"`block_ids` holds block id {SRC_BLOCKS}, outside \[0, ",
        ),
        ({**good, "block_ids": []}, "`block_ids` is empty"),
        ({**good, "num_blocks": "10"}, "`num_blocks` must be an int"),
        ({**good, "layout": {**good["layout"], "dtype": None}}, "`layout`: .*unknown key `dtype`"),
        (
            {**good, "layout": make_layout(1, 7).to_dict()},
            "`layout` gives target layer 0 key 7 blocks, `num_blocks`",
        ),
        ({**good, "shm_names": [["a"]]}, r"`shm_names\[0\]` must hold 6 non-empty names"),
        ({**good, "hold_timeout": -1}, "`hold_timeout` must be a positive number"),
    ]
    for descriptor, message in cases:
        with pytest.raises(TransferError, match=message):
            pull_blocks(descriptor, dst, layout, [0, 1], timeout=2)
    with pytest.raises(TransferError, match="unknown request 'other' \\(never offered here\\)"):
        pull_blocks({**good, "request_id": "other"}, dst, layout, [0, 1], timeout=2)
    assert all_zero(dst)
    assert source.pending() == ["bad"]


def test_offer_refusals(sources: Any) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=12)
    source, _ = sources(src)
    source.offer("dup", [1])
    with pytest.raises(TransferError, match="'dup' is already offered"):
        source.offer("dup", [2])
    with pytest.raises(TransferError, match="`block_ids` is empty"):
        source.offer("e", [])
    with pytest.raises(TransferError, match=rf"block id {SRC_BLOCKS}, outside"):
        source.offer("e", [SRC_BLOCKS])
    with pytest.raises(TransferError, match="block id 3 more than once"):
        source.offer("e", [3, 3])
    with pytest.raises(TransferError, match="`request_id` must be a non-empty str"):
        source.offer("", [1])
    assert source.pending() == ["dup"]


def test_source_constructor_refusals() -> None:
    src = make_caches(1, SRC_BLOCKS, seed=13)
    layout = layout_of(src)
    with pytest.raises(TransferError, match="`hold_timeout` must be a positive number"):
        KVSource(src, layout, lambda r, s: None, hold_timeout=0)
    with pytest.raises(TransferError, match="`on_release` must be callable"):
        KVSource(src, layout, None)  # type: ignore[arg-type]
    with pytest.raises(TransferError, match=r"`shm_names` must hold one list per rank \(1\)"):
        KVSource(src, layout, lambda r, s: None, shm_names=[["a"] * 6, ["b"] * 6])
    with pytest.raises(
        TransferError, match="KVSource: no KV transport takes the option\\(s\\) 'shm_name'"
    ):
        KVSource(src, layout, lambda r, s: None, shm_name=[["a"] * 6])
    with pytest.raises(TransferError, match=r"`caches` must hold 2 rank\(s\), got 1"):
        KVSource(src, make_layout(2, SRC_BLOCKS), lambda r, s: None)
    with KVSource(src, layout, lambda r, s: None) as taken:
        port = int(taken.address.rsplit(":", 1)[1])
        with pytest.raises(TransferError, match=f"cannot bind tcp://127.0.0.1:{port}"):
            KVSource(src, layout, lambda r, s: None, port=port)


# ---- misbehaving peers ------------------------------------------------------------------------


class FakeSource:
    """A bare ROUTER in a thread: reads every message and answers with ``reply(frames)``, or
    not at all when that is ``None``. Bound to ``port`` on 127.0.0.1 (0: a free one)."""

    def __init__(self, reply: Callable[[list[bytes]], list[bytes] | None], port: int = 0):
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if port:
            self._sock.bind(f"tcp://127.0.0.1:{port}")
        else:
            port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.received: list[list[bytes]] = []
        self._reply = reply
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(50):
                identity, *frames = self._sock.recv_multipart()
                self.received.append(frames)
                out = self._reply(frames)
                if out is not None:
                    self._sock.send_multipart([identity, *out])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)
        self._ctx.term()


FAKE_TOKEN = "t" * 43


def descriptor_for(address: str, block_ids: list[int], tp: int = 1) -> dict[str, Any]:
    layout = make_layout(tp, SRC_BLOCKS)
    return {
        "version": 4,
        "request_id": "fake",
        "address": address,
        "token": FAKE_TOKEN,
        "layout": layout.to_dict(),
        "block_ids": block_ids,
        "num_blocks": SRC_BLOCKS,
        "shm_names": None,
        "mooncake": None,
        "hold_timeout": 60.0,
    }


def check_answer(descriptor: dict[str, Any]) -> bytes:
    """A source's answer to ``check`` for an offer of ``descriptor``."""
    offer = {k: v for k, v in descriptor.items() if k != "token"}
    return json.dumps({"ok": True, "num_blocks": len(offer["block_ids"]), "offer": offer}).encode()


def test_a_source_that_never_answers_times_out() -> None:
    fake = FakeSource(lambda frames: None)
    try:
        dst = make_caches(1, DST_BLOCKS, seed=None)
        timeout = 1.0
        start = time.monotonic()
        with pytest.raises(TransferError, match=rf"{fake.address} did not answer check within 1 s"):
            pull_blocks(
                descriptor_for(fake.address, [1, 2]), dst, layout_of(dst), [0, 1], timeout=timeout
            )
        assert time.monotonic() - start < timeout + 2
        assert wait_until(lambda: len(fake.received) == 1)
        assert json.loads(fake.received[0][0]) == {
            "op": "check",
            "request_id": "fake",
            "token": FAKE_TOKEN,
            "mac": None,
        }
        assert all_zero(dst)
    finally:
        fake.close()


@pytest.mark.parametrize(
    ("header", "frame_bytes", "message"),
    [
        (
            {"frames": 6, "num_blocks": 2},
            [512] * 5 + [511],
            r"data frame 5 \(rank 0, mtp layer 0 value\) has 511",
        ),
        ({"frames": 6, "num_blocks": 2}, [512] * 5, "5 data frames, expected 6"),
        ({"frames": 5, "num_blocks": 2}, [512] * 6, "header `frames` is 5, expected 6"),
        ({"frames": 6, "num_blocks": 3}, [768] * 6, "header `num_blocks` is 3, expected 2"),
    ],
)
def test_a_wrong_sized_reply_is_refused_before_any_write(
    header: dict[str, Any], frame_bytes: list[int], message: str
) -> None:
    full = {"ok": True, "block_nbytes": [256] * 6, **header}

    def reply(frames: list[bytes]) -> list[bytes]:
        op = json.loads(frames[0])["op"]
        if op == "check":
            return [check_answer(descriptor_for(fake.address, [1, 2]))]
        if op != "fetch":
            return [b'{"ok": true}']
        return [json.dumps(full).encode(), *(b"\x01" * n for n in frame_bytes)]

    fake = FakeSource(reply)
    try:
        dst = make_caches(1, DST_BLOCKS, seed=None)
        with pytest.raises(TransferError, match=message):
            pull_blocks(
                descriptor_for(fake.address, [1, 2]), dst, layout_of(dst), [0, 1], timeout=5
            )
        assert all_zero(dst)
    finally:
        fake.close()


def test_a_source_gone_after_a_complete_tcp_copy_is_not_an_error() -> None:
    src = make_caches(1, SRC_BLOCKS, seed=16)

    def reply(
        frames: list[bytes],
    ) -> list[bytes] | None:  # answers the check and fetch, then nothing
        op = json.loads(frames[0])["op"]
        if op == "check":
            return [check_answer(descriptor_for(fake.address, [4, 1]))]
        if op != "fetch":
            return None
        header = {"ok": True, "frames": 6, "block_nbytes": [256] * 6, "num_blocks": 2}
        return [
            json.dumps(header).encode(),
            *(np.ascontiguousarray(c[[4, 1]]).tobytes() for c in src[0]),
        ]

    fake = FakeSource(reply)
    try:
        dst = make_caches(1, DST_BLOCKS, seed=None)
        start = time.monotonic()
        copied = pull_blocks(
            descriptor_for(fake.address, [4, 1]), dst, layout_of(dst), [0, 8], timeout=1.0
        )
        assert copied == 6 * 2 * 256
        assert 1.0 <= time.monotonic() - start < 3.0  # waited for the release reply, bounded
        assert_copied(src, dst, [4, 1], [0, 8])
        assert [json.loads(f[0])["op"] for f in fake.received] == ["check", "fetch", "release"]
    finally:
        fake.close()


def test_malformed_messages_do_not_stop_the_source(sources: Any) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=14)
    source, releases = sources(src)
    descriptor = source.offer("ok", [6])
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(source.address)
    try:
        bad: list[tuple[list[bytes], str]] = [
            ([b"not json"], "malformed JSON"),
            ([b"\xff\xfe\x00"], "malformed JSON"),
            ([b"[1, 2]"], "expected a JSON object, got list"),
            ([b'{"op": "explode", "request_id": "ok"}'], "unknown op 'explode'"),
            ([b'{"op": "fetch"}'], "`request_id` and `token` must be str"),
            ([b'{"op": "release", "request_id": 5}'], "`request_id` and `token` must be str"),
            ([b'{"op": "fetch", "request_id": "ok"}', b"more"], "expected one JSON frame, got 2"),
            ([b""], "malformed JSON"),
        ]
        for frames, message in bad:
            sock.send_multipart(frames)
            assert sock.poll(5000), f"no answer to {frames}"
            answer = json.loads(sock.recv())
            assert answer["ok"] is False and message in answer["error"], (frames, answer)
        sock.send(b"x" * (1 << 17))  # above the control-message limit: the peer is dropped
        time.sleep(0.2)
    finally:
        sock.close(0)
        ctx.term()
    assert source._thread.is_alive()
    assert source.pending() == ["ok"] and releases.calls == []
    dst = make_caches(1, DST_BLOCKS, seed=None)
    pull_blocks(descriptor, dst, layout_of(dst), [3])
    assert_copied(src, dst, [6], [3])
    assert releases.wait() == [("ok", "released")]


# ---- who may pull: the transfer token, the splitwise secret, the offer's own blocks ----------


def _control(address: str, request: dict[str, Any]) -> dict[str, Any]:
    """Send one control request as a bare peer; the source's answer."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send(json.dumps(request).encode())
        assert sock.poll(5000), f"no answer to {request}"
        return dict(json.loads(sock.recv()))
    finally:
        sock.close(0)
        ctx.term()


def test_without_the_transfer_token_no_peer_can_fetch_check_or_release(sources: Any) -> None:
    """Knowing (or guessing) the request id is not enough: a fetch, check or release without
    the offer's token is refused, counted, and leaves the offer to its holder."""
    src = make_caches(1, SRC_BLOCKS, seed=21)
    source, releases = sources(src)
    victim = source.offer("victim", [2, 5])
    guesses = [
        None,
        "",
        "x" * 43,
        victim["token"][:-1] + ("A" if victim["token"][-1] != "A" else "B"),
    ]
    for op in ("fetch", "check", "release"):
        for token in guesses:
            answer = _control(source.address, {"op": op, "request_id": "victim", "token": token})
            assert answer["ok"] is False and "data" not in answer, (op, token, answer)
            assert "offer" not in answer
    assert source.dropped.counts()["kv"] == 3 * len(guesses)
    assert source.pending() == ["victim"] and releases.calls == []
    dst = make_caches(1, DST_BLOCKS, seed=None)
    pull_blocks(victim, dst, layout_of(dst), [0, 1])  # the holder's pull still works
    assert_copied(src, dst, [2, 5], [0, 1])
    assert releases.wait() == [("victim", "released")]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_hand_over_pointing_at_another_requests_blocks_is_refused(
    sources: Any, publish: Any, transport: str
) -> None:
    """One's own descriptor with the block ids (or cache names) of another request's offer:
    the pull asks the source what this token's offer is and refuses the difference before a
    byte is read, so nobody decodes from a victim's KV."""
    src, names = publish(make_caches(1, SRC_BLOCKS, seed=22))
    source, releases = sources(src, shm_names=names)
    victim = source.offer("victim", [7, 8])
    mine = source.offer("mine", [1])
    dst = make_caches(1, DST_BLOCKS, seed=None)
    forged = [
        ({**mine, "block_ids": victim["block_ids"]}, "block_ids"),
        ({**mine, "block_ids": [7]}, "block_ids"),
        ({**mine, "shm_names": [[n + "x" for n in names[0]]]}, "shm_names"),
    ]
    for descriptor, field in forged:
        with pytest.raises(
            TransferError, match=f"the hand-over's `{field}` differs from what the prefill"
        ):
            pull_blocks(descriptor, dst, layout_of(dst), [0, 1], transport=transport, timeout=5)
        assert all_zero(dst)
    # someone else's id with one's own token is a wrong token for that offer
    with pytest.raises(TransferError, match="not authorized"):
        pull_blocks(
            {**mine, "request_id": "victim"},
            dst,
            layout_of(dst),
            [0, 1],
            transport=transport,
            timeout=5,
        )
    assert all_zero(dst)
    assert sorted(source.pending()) == ["mine", "victim"] and releases.calls == []
    pull_blocks(victim, dst, layout_of(dst), [3, 4], transport=transport)
    assert_copied(src, dst, [7, 8], [3, 4])


def test_an_offer_is_fetched_once() -> None:
    src = make_caches(1, SRC_BLOCKS, seed=23)
    with KVSource(src, layout_of(src), lambda r, s: None) as source:
        descriptor = source.offer("once", [3])
        request = {"op": "fetch", "request_id": "once", "token": descriptor["token"]}
        assert _control(source.address, request)["ok"] is True
        again = _control(source.address, request)
        assert again == {
            "ok": False,
            "error": "request 'once' was already fetched (an offer is fetched once)",
        }
        assert _control(source.address, {**request, "op": "release"})["ok"] is True
        gone = _control(source.address, {**request, "op": "release"})  # the token is spent
        assert gone["ok"] is False and "was released" in gone["error"]


def test_a_source_with_the_splitwise_secret_serves_only_signed_requests() -> None:
    """Control requests signed with another secret, or not at all, are refused and counted;
    the signed pull works, and the token still has to match."""
    secret, other = b"s" * 32, b"o" * 32
    src = make_caches(2, SRC_BLOCKS, seed=24)
    with KVSource(src, layout_of(src), lambda r, s: None, secret=secret) as source:
        descriptor = source.offer("signed", [4, 9])
        dst = make_caches(2, DST_BLOCKS, seed=None)
        for wrong in (None, other):
            with pytest.raises(TransferError, match="refused check: not authorized"):
                pull_blocks(descriptor, dst, layout_of(dst), [0, 1], secret=wrong, timeout=5)
        assert all_zero(dst) and source.dropped.counts()["kv"] == 2
        assert source.pending() == ["signed"]
        assert (
            pull_blocks(descriptor, dst, layout_of(dst), [0, 1], secret=secret)
            == 2 * 2 * layout_of(dst).block_nbytes
        )
        assert_copied(src, dst, [4, 9], [0, 1])
    with pytest.raises(TransferError, match="`secret` must be non-empty bytes or None"):
        KVSource(src, layout_of(src), lambda r, s: None, secret="text")  # type: ignore[arg-type]
