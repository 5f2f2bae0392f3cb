"""The Mooncake transport as deployed: both ends agree on the engine's protocol (a mismatch is
refused at the first hand-over in one line), the sockets the engine listens on, and who can
read and write what through them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdeploy_mtp.splitwise import mooncake_engine
from fastdeploy_mtp.splitwise.kv_client import pull_blocks
from fastdeploy_mtp.splitwise.kv_layout import TransferError
from fastdeploy_mtp.splitwise.transport import choose_transport
from fastdeploy_mtp.splitwise.transports import mooncake

from . import test_kv_transfer
from .test_kv_transfer import (
    DST_BLOCKS,
    SRC_BLOCKS,
    all_zero,
    assert_copied,
    layout_of,
    make_caches,
)

sources = test_kv_transfer.sources  # the fixture

ROOT = Path(__file__).resolve().parents[2]
HAS_RDMA = bool(os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"))


def _run(code: str, stdin: str = "", **env: str | None) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter importing this checkout, its environment this one's
    without the protocol settings, plus ``env`` (``None`` removes a variable)."""
    merged = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FDMTP_MOONCAKE_PROTOCOL", "MC_FORCE_TCP", "MC_FORCE_HCA")
    }
    merged["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), merged.get("PYTHONPATH")]))
    for key, value in env.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        input=stdin,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=merged,
    )


#: A decode host: pulls the descriptor on stdin over "mooncake", then over what "auto" picks.
DECODE_HOST = """
    import json, sys
    from fastdeploy_mtp.splitwise.kv_client import pull_blocks
    from fastdeploy_mtp.splitwise.kv_layout import TransferError
    from fastdeploy_mtp.splitwise.transport import choose_transport
    from tests.splitwise.test_kv_transfer import (
        DST_BLOCKS, SRC_BLOCKS, all_zero, assert_copied, layout_of, make_caches,
    )
    descriptor = json.loads(sys.stdin.read())
    dst = make_caches(1, DST_BLOCKS, seed=None)
    try:
        pull_blocks(descriptor, dst, layout_of(dst), [0, 1], transport="mooncake", timeout=10)
        refused = None
    except TransferError as exc:
        refused = str(exc)
    untouched = all_zero(dst)
    auto = choose_transport("auto", descriptor)
    pull_blocks(descriptor, dst, layout_of(dst), [0, 1], transport=auto, timeout=10)
    assert_copied(make_caches(1, SRC_BLOCKS, seed=60), dst, [2, 3], [0, 1])
    print(json.dumps({"refused": refused, "untouched": untouched, "auto": auto}))
"""


def test_a_decode_host_on_another_protocol_refuses_at_the_first_hand_over(sources: Any) -> None:
    """The prefill instance's engine runs over tcp (this host has no RDMA NIC); a decode
    instance on a host whose engine would run over rdma (forced) refuses to pull over
    mooncake before anything is sent, naming both protocols and the fix; "auto" takes tcp."""
    src = make_caches(1, SRC_BLOCKS, seed=60)
    source, releases = sources(src, mooncake=True)
    descriptor = source.offer("mixed", [2, 3])
    assert descriptor["mooncake"]["protocol"] == "tcp"
    out = _run(DECODE_HOST, json.dumps(descriptor), FDMTP_MOONCAKE_PROTOCOL="rdma")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    segment = descriptor["mooncake"]["segment"]
    assert result == {
        "refused": (
            f"pull_blocks('mixed'): the prefill instance's Mooncake engine ({segment}) runs "
            "over tcp, this decode instance's over rdma: both ends must run over one protocol "
            "(set FDMTP_MOONCAKE_PROTOCOL=tcp on both hosts, or use --kv-transport tcp)"
        ),
        "untouched": True,
        "auto": "tcp",
    }
    warnings = [line for line in out.stderr.splitlines() if "'auto' takes tcp instead" in line]
    assert len(warnings) == 1 and "runs over tcp, this decode instance's over rdma" in warnings[0]
    # the refusal sent nothing: the offer was still there for the tcp pull, which released it
    assert releases.wait() == [("mixed", "released")]


def test_a_prefill_host_on_rdma_is_refused_by_a_tcp_decode_host(sources: Any) -> None:
    """The other way round: a descriptor from a prefill instance whose engine runs over rdma
    (as one on a host with an RDMA NIC sends it) reaching this host's tcp engine."""
    src = make_caches(1, SRC_BLOCKS, seed=61)
    dst = make_caches(1, DST_BLOCKS, seed=None)
    source, releases = sources(src, mooncake=True)
    descriptor = json.loads(json.dumps(source.offer("rdma-p", [1])))
    descriptor["mooncake"]["protocol"] = "rdma"
    with pytest.raises(
        TransferError, match=r"engine \(.*\) runs over rdma, this decode instance's over tcp: "
    ):
        pull_blocks(descriptor, dst, layout_of(dst), [0], transport="mooncake")
    assert choose_transport("auto", descriptor) == "tcp"
    assert all_zero(dst) and source.pending() == ["rdma-p"] and releases.calls == []


PREFILL_ON_RDMA = """
    from fastdeploy_mtp.splitwise.kv_layout import TransferError
    from fastdeploy_mtp.splitwise.kv_source import KVSource
    from tests.splitwise.test_kv_transfer import SRC_BLOCKS, layout_of, make_caches
    src = make_caches(1, SRC_BLOCKS, seed=1)
    try:
        source = KVSource(src, layout_of(src), lambda r, s: None, mooncake=True)
    except TransferError as exc:
        print(exc)
    else:
        print(source.offer("r", [0])["mooncake"]["protocol"])
        source.close()
"""


def test_the_engine_runs_over_the_protocol_it_advertises() -> None:
    """Forced to rdma, the prefill instance's engine runs over RDMA or does not start (the
    engine alone would fall back to TCP where it finds no NIC, and every pull from a decode
    host on RDMA would fail at run time)."""
    out = _run(PREFILL_ON_RDMA, FDMTP_MOONCAKE_PROTOCOL="rdma")
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    if HAS_RDMA:
        assert last == "rdma"
    else:
        assert last == (
            "KV transport 'mooncake': the transfer engine did not start at 127.0.0.1 over rdma "
            "(code -1) (no usable RDMA NIC? FDMTP_MOONCAKE_PROTOCOL=tcp runs it over TCP)"
        )
    assert _run(PREFILL_ON_RDMA, FDMTP_MOONCAKE_PROTOCOL="tcp").stdout.split()[-1] == "tcp"


LISTENER = """
    import json, os, socket
    from fastdeploy_mtp.splitwise.mooncake_engine import engine_at
    from tests.support.listening import listening_tcp

    def reaches(address, port):
        with socket.create_connection((address, port), timeout=5):
            return True

    before = listening_tcp()
    engine = engine_at("127.0.0.1")
    opened = sorted(listening_tcp() - before)
    print(json.dumps({
        "segment": engine.segment,
        "rpc_port": engine.engine.get_rpc_port(),
        "opened": opened,
        "reached_at_127_0_0_2": [reaches("127.0.0.2", port) for _, port in opened],
        "MC_FORCE_TCP": os.environ.get("MC_FORCE_TCP"),
    }))
"""


def test_the_engine_listens_on_every_interface_whatever_the_advertised_host() -> None:
    """Started as the transport starts it, at 127.0.0.1 (and with ``MC_TCP_BIND_ADDRESS``
    naming that host), the engine opens two listening sockets, both on a wildcard address:
    the handshake port (the segment's) on 0.0.0.0 and the TCP transport's data port on [::]
    (dual-stack), both reachable at another address of this host (127.0.0.2). Both ports
    come from MC_MIN_PRC_PORT..MC_MAX_PRC_PORT, the range a firewall can close."""
    low, high = 21000, 21999
    out = _run(
        LISTENER,
        MC_TCP_BIND_ADDRESS="127.0.0.1",
        MC_MIN_PRC_PORT=str(low),
        MC_MAX_PRC_PORT=str(high),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    rpc = seen["rpc_port"]
    assert seen["segment"] == f"127.0.0.1:{rpc}"
    (handshake,) = [s for s in seen["opened"] if s[1] == rpc]
    (data,) = [s for s in seen["opened"] if s[1] != rpc]
    assert len(seen["opened"]) == 2
    assert handshake == ["0.0.0.0", rpc] and data[0] == "::"
    assert all(low <= port <= high for _, port in seen["opened"])
    assert seen["reached_at_127_0_0_2"] == [True, True]
    assert seen["MC_FORCE_TCP"] == "1"  # the protocol the descriptors carry, told the engine


def test_whoever_reaches_the_engine_reads_and_writes_the_prefill_caches_only(
    sources: Any,
) -> None:
    """A process that only reaches the engine's port (no token, no key, no offer) reads and
    writes any block of a prefill instance's registered caches; a decode instance's caches,
    which a tcp pull does not register, it can neither read nor write (here both sides share
    this process's engine)."""
    src = make_caches(1, SRC_BLOCKS, seed=62)
    dst = make_caches(1, DST_BLOCKS, seed=None)
    source, _ = sources(src, mooncake=True)
    descriptor = source.offer("pulled", [4])
    pull_blocks(descriptor, dst, layout_of(dst), [5], transport="mooncake")
    assert_copied(src, dst, [4], [5])
    segment = descriptor["mooncake"]["segment"]
    nbytes = src[0][0][0].nbytes
    from mooncake.engine import TransferEngine

    outsider = TransferEngine()
    assert outsider.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = np.full(nbytes, 7, np.uint8)
    at = int(buf.ctypes.data)
    try:
        # an unoffered block of P: read, then overwritten
        block = int(src[0][0].ctypes.data) + 8 * nbytes
        assert outsider.batch_transfer_sync_read(segment, [at], [block], [nbytes]) == 0
        assert buf.tobytes() == src[0][0][8].tobytes()
        buf[:] = 7
        assert outsider.batch_transfer_sync_write(segment, [at], [block], [nbytes]) == 0
        assert src[0][0][8].tobytes() == bytes([7]) * nbytes
        # D's block the pull wrote: neither readable nor writable
        target = int(dst[0][0].ctypes.data) + 5 * nbytes
        assert outsider.batch_transfer_sync_write(segment, [at], [target], [nbytes]) != 0
        assert outsider.batch_transfer_sync_read(segment, [at], [target], [nbytes]) != 0
        assert_copied(src, dst, [4], [5])
        assert (buf == 7).all()
    finally:
        del outsider


class _RecordingEngine:
    """The engine's registration calls, recorded (an RDMA engine cannot start here)."""

    def __init__(self) -> None:
        self.registered: list[tuple[int, int]] = []

    def register_memory(self, base: int, size: int) -> int:
        self.registered.append((base, size))
        return 0


@pytest.mark.parametrize("protocol", ["rdma", "tcp"])
def test_a_decode_instance_registers_its_caches_only_over_rdma(protocol: str) -> None:
    dst = make_caches(2, DST_BLOCKS, seed=None)
    engine = mooncake_engine.Engine.__new__(mooncake_engine.Engine)
    engine.protocol, engine.engine = protocol, _RecordingEngine()
    engine.regions, engine.lock = {}, threading.Lock()
    bases = [[int(a.ctypes.data) for a in rank] for rank in dst]
    for _ in range(2):  # the second pull registers nothing new
        assert mooncake._destinations(engine, dst, layout_of(dst)) == bases
    expected = [(int(a.ctypes.data), a.nbytes) for rank in dst for a in rank]
    assert engine.engine.registered == (expected if protocol == "rdma" else [])
    strided = [[a[:, :, ::2] for a in rank] for rank in dst]
    with pytest.raises(TransferError, match="rank 0 target layer 0 key is not C-contiguous"):
        mooncake._destinations(engine, strided, layout_of(dst))
