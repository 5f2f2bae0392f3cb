"""The ``"mooncake"`` KV transport on one host (the cross-host runs are in
``tests/serving/test_netns_splitwise.py``): blocks land where they should, the descriptor's
fields are checked, a hand-over cannot redirect the read, and a missing engine is named."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdeploy_mtp.splitwise.kv_client import pull_blocks
from fastdeploy_mtp.splitwise.kv_layout import TransferError
from fastdeploy_mtp.splitwise.transport import choose_transport, read_descriptor
from fastdeploy_mtp.splitwise.transports import mooncake

from . import test_kv_transfer
from .test_kv_transfer import (
    DST_BLOCKS,
    SRC_BLOCKS,
    FakeSource,
    all_zero,
    assert_copied,
    check_answer,
    descriptor_for,
    layout_of,
    make_caches,
)

sources = test_kv_transfer.sources  # the fixture

#: A stand-in ``mooncake`` module on ``PYTHONPATH`` that hides the installed package.
ABSENT = "raise ModuleNotFoundError(\"No module named 'mooncake'\", name='mooncake')\n"


@pytest.mark.parametrize("tp", [1, 2])
def test_mooncake_pull_copies_the_offered_blocks(sources: Any, tp: int) -> None:
    src = make_caches(tp, SRC_BLOCKS, seed=40 + tp)
    dst = make_caches(tp, DST_BLOCKS, seed=None)
    source, releases = sources(src, mooncake=True)
    descriptor = json.loads(json.dumps(source.offer("m", [3, 4, 5, 9, 0])))  # as it travels to D
    offered = descriptor["mooncake"]
    assert offered["segment"].startswith("127.0.0.1:") and offered["protocol"] == "tcp"
    assert offered["buffers"] == [[int(a.ctypes.data) for a in rank] for rank in src]
    assert (
        choose_transport("auto", descriptor) == "mooncake"
    )  # no shm names: the engine beats the socket
    copied = pull_blocks(descriptor, dst, layout_of(dst), [0, 1, 2, 7, 11], transport="mooncake")
    assert copied == tp * 5 * layout_of(src).block_nbytes
    assert_copied(src, dst, [3, 4, 5, 9, 0], [0, 1, 2, 7, 11])
    assert releases.wait() == [("m", "released")]


def test_concurrent_pulls_each_land_their_own_blocks(sources: Any) -> None:
    """A decode instance pulls in a thread per request; the first pulls register the
    destination caches at the same time."""
    import threading

    src = make_caches(2, SRC_BLOCKS, seed=50)
    source, releases = sources(src, mooncake=True)
    jobs = [(f"c{i}", [i, i + 5], make_caches(2, DST_BLOCKS, seed=None)) for i in range(5)]
    offers = {rid: source.offer(rid, ids) for rid, ids, _ in jobs}
    errors: list[BaseException] = []

    def pull(rid: str, dst: Any) -> None:
        try:
            pull_blocks(offers[rid], dst, layout_of(dst), [7, 2], transport="mooncake")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pull, args=(rid, dst)) for rid, _, dst in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    for _, ids, dst in jobs:
        assert_copied(src, dst, ids, [7, 2])
    assert sorted(releases.wait(5)) == sorted((rid, "released") for rid, _, _ in jobs)


def test_runs_merge_consecutive_blocks_on_both_sides() -> None:
    src, dst = np.array([3, 4, 5, 9, 0, 1]), np.array([0, 1, 2, 7, 8, 9])
    assert mooncake._runs(src, dst) == [(3, 0, 3), (9, 7, 1), (0, 8, 2)]
    assert mooncake._runs(np.array([1, 2]), np.array([5, 4])) == [(1, 5, 1), (2, 4, 1)]


def test_a_source_without_the_engine_offers_none_and_pulling_it_over_mooncake_is_refused(
    sources: Any,
) -> None:
    src = make_caches(1, SRC_BLOCKS, seed=3)
    dst = make_caches(1, DST_BLOCKS, seed=None)
    source, releases = sources(src)
    descriptor = source.offer("plain", [1])
    assert descriptor["mooncake"] is None and choose_transport("auto", descriptor) == "tcp"
    refused = "needs the prefill instance to register its caches.*--kv-transport mooncake"
    with pytest.raises(TransferError, match=refused):
        pull_blocks(descriptor, dst, layout_of(dst), [0], transport="mooncake")
    assert all_zero(dst) and source.pending() == ["plain"] and releases.calls == []


def test_a_hand_over_cannot_redirect_the_read(sources: Any) -> None:
    """The addresses read are those of P's own offer: a hand-over whose ``mooncake`` field
    differs (another address in P's memory, another segment) is refused before any read."""
    src = make_caches(1, SRC_BLOCKS, seed=4)
    dst = make_caches(1, DST_BLOCKS, seed=None)
    source, _ = sources(src, mooncake=True)
    for change in (
        lambda d: d["mooncake"]["buffers"][0].__setitem__(0, d["mooncake"]["buffers"][0][0] + 64),
        lambda d: d["mooncake"].__setitem__("segment", "127.0.0.1:1"),
    ):
        descriptor = source.offer(f"r{id(change)}", [2])
        change(descriptor)
        with pytest.raises(
            TransferError, match="hand-over's `mooncake` differs from what the prefill instance"
        ):
            pull_blocks(descriptor, dst, layout_of(dst), [0], transport="mooncake")
    assert all_zero(dst)


def test_an_offer_outside_the_registered_memory_fails_without_a_write(sources: Any) -> None:
    """A source that answers ``check`` with addresses it never registered (a forged or broken
    prefill instance) gets a failed read from the engine, not someone else's memory."""
    real, _ = sources(make_caches(1, SRC_BLOCKS, seed=5), mooncake=True)
    segment = real.offer("seg", [0])["mooncake"]["segment"]
    stray = make_caches(1, SRC_BLOCKS, seed=6)  # never registered
    descriptor = descriptor_for("tcp://127.0.0.1:1", [1, 2])
    descriptor["mooncake"] = {
        "segment": segment,
        "buffers": [[int(a.ctypes.data) for a in stray[0]]],
        "protocol": "tcp",
    }
    fake = FakeSource(lambda frames: [check_answer(descriptor)])
    try:
        descriptor["address"] = fake.address
        dst = make_caches(1, DST_BLOCKS, seed=None)
        with pytest.raises(TransferError, match=r"Mooncake read of rank 0's blocks from .* failed"):
            pull_blocks(descriptor, dst, layout_of(dst), [3, 4], transport="mooncake", timeout=5)
        assert all_zero(dst)
    finally:
        fake.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x", "must be null or an object with `segment`, `buffers` and `protocol`"),
        ({"protocol": ...}, "must be null or an object"),
        ({"extra": 1}, "must be null or an object"),
        ({"segment": 5}, r"`mooncake`.segment must be a 'host:port' str"),
        ({"segment": "host"}, r"`mooncake`.segment must be a 'host:port' str"),
        ({"segment": "h:99999"}, "must end in a port"),
        ({"protocol": "ib"}, r"`mooncake`.protocol must be 'rdma' or 'tcp', got 'ib'"),
        ({"protocol": None}, r"`mooncake`.protocol must be 'rdma' or 'tcp', got None"),
        ({"buffers": [[1] * 6, [1] * 6]}, "must hold one list per rank"),
        ({"buffers": [[1] * 5]}, r"buffers\[0\] must hold 6 addresses"),
        ({"buffers": [[1, 1, 1, 1, 1, True]]}, r"buffers\[0\]\[5\] must be the address"),
        ({"buffers": [[1, 1, 0, 1, 1, 1]]}, r"buffers\[0\]\[2\] must be the address"),
        ({"buffers": [[1, 1, 1, 2**64, 1, 1]]}, r"buffers\[0\]\[3\] must be the address"),
    ],
)
def test_bad_mooncake_fields_are_refused(value: Any, message: str) -> None:
    """Each case changes one key of a good field (``...`` drops it; a value that is not a
    dict replaces the field)."""
    good = {"segment": "h:1", "buffers": [[4096] * 6], "protocol": "tcp"}
    descriptor = descriptor_for("tcp://127.0.0.1:1", [1])
    if isinstance(value, dict):
        value = {k: v for k, v in {**good, **value}.items() if v is not ...}
    descriptor["mooncake"] = value
    with pytest.raises(TransferError, match=message):
        read_descriptor(descriptor)
    descriptor["mooncake"] = good
    assert read_descriptor(descriptor).fields["mooncake"] == good


def test_the_source_option_must_be_a_bool() -> None:
    src = make_caches(1, SRC_BLOCKS, seed=7)
    from fastdeploy_mtp.splitwise.kv_source import KVSource

    with pytest.raises(TransferError, match="`mooncake` must be a bool, got 'yes'"):
        KVSource(src, layout_of(src), lambda r, s: None, mooncake="yes")


@pytest.mark.parametrize(
    ("engine_py", "message"),
    [
        (
            "raise ImportError("
            "'libibverbs.so.1: cannot open shared object file: No such file or directory')",
            "needs the system library libibverbs.so.1, .*apt-get install libibverbs1",
        ),
        (None, r'needs the package mooncake-transfer-engine-non-cuda \(pip install "\.\[pd\]"'),
    ],
)
def test_a_missing_piece_is_named_in_one_line(
    tmp_path: Path, engine_py: str | None, message: str
) -> None:
    """With the package or its system library missing, asking for the transport says which
    one to install (checked in a fresh interpreter whose ``mooncake`` is a stand-in)."""
    if engine_py is not None:
        (tmp_path / "mooncake").mkdir()
        (tmp_path / "mooncake" / "__init__.py").write_text("")
        (tmp_path / "mooncake" / "engine.py").write_text(engine_py + "\n")
    else:  # the package is absent: an empty stand-in of "mooncake" hides the installed one
        (tmp_path / "mooncake.py").write_text(ABSENT)
    code = textwrap.dedent(
        """
        from fastdeploy_mtp.splitwise.transports import mooncake
        assert not mooncake.available()
        mooncake.require()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path),
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "fastdeploy_mtp.splitwise.kv_layout.TransferError: KV transport 'mooncake'"
    )
    assert __import__("re").search(message, last), last


def _env(first: Path) -> dict[str, str]:
    import os

    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(first), os.environ.get("PYTHONPATH")])),
    }


def test_the_protocol_follows_the_rdma_devices_unless_set(monkeypatch: Any) -> None:
    """Ours first, then the engine's own switches (set by the engine this process started
    in an earlier test: cleared here), then the kernel's RDMA devices."""
    import os

    for name in ("FDMTP_MOONCAKE_PROTOCOL", "MC_FORCE_TCP", "MC_FORCE_HCA"):
        monkeypatch.delenv(name, raising=False)
    has_rdma = os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))
    assert mooncake.protocol() == ("rdma" if has_rdma else "tcp")
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    assert mooncake.protocol() == "tcp"
    monkeypatch.setenv("MC_FORCE_HCA", "1")  # the engine installs RDMA whatever MC_FORCE_TCP
    assert mooncake.protocol() == "rdma"
    monkeypatch.setenv("FDMTP_MOONCAKE_PROTOCOL", "tcp")
    assert mooncake.protocol() == "tcp"
    monkeypatch.setenv("FDMTP_MOONCAKE_PROTOCOL", "rdma")
    assert mooncake.protocol() == "rdma"
    monkeypatch.setenv("FDMTP_MOONCAKE_PROTOCOL", "ib")
    for check in (mooncake.protocol, mooncake.require):  # require: what serve asks at start-up
        with pytest.raises(
            TransferError, match="FDMTP_MOONCAKE_PROTOCOL must be 'rdma' or 'tcp', got 'ib'"
        ):
            check()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_serve_asking_for_mooncake_without_it_exits_2_naming_the_package(
    tmp_path: Path, role: str
) -> None:
    (tmp_path / "mooncake.py").write_text(ABSENT)
    argv = [
        sys.executable,
        "-m",
        "fastdeploy_mtp.entrypoints.cli",
        "serve",
        "--splitwise-role",
        role,
    ]
    out = subprocess.run(
        [
            *argv,
            "--kv-transport",
            "mooncake",
            "--speculative-config",
            '{"method": "mtp", "num_speculative_tokens": 1}',
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path),
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert (
        "--kv-transport mooncake: KV transport 'mooncake' needs the package "
        "mooncake-transfer-engine-non-cuda" in (out.stderr)
    )
