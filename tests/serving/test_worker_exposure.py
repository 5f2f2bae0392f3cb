"""What the child processes of a TP 2 ``serve`` expose once it is ready, checked on a host of
its own (:class:`~tests.support.netns.Hosts`) with a second host beside it:

* the workers' only listening TCP socket is Paddle's TCP store, on rank 0 at
  ``0.0.0.0:<tp_master_port>`` (Paddle binds every address) and bound to the loopback
  device: a connection to the host's network address is refused, from the other host and
  from the server's host alike; one to 127.0.0.1 from the server's host is accepted. Rank 1
  and the cache manager listen on nothing, and every connection the workers hold (the
  store's clients, gloo's pairs) runs between loopback addresses. A request still completes
  (the collectives work over the confined group);
* none of the children (cache manager, workers, their helpers) holds the API key or the
  splitwise secret in its environment, though ``serve`` was started with both.

The confinement itself (``fastdeploy_mtp.loopback_only``) is also checked on sockets of
this process: a listener found by its port and bound to ``lo``, a connection it accepted
from the other host before that shut down (one from loopback kept), and a clear outcome
when nothing listens.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from fastdeploy_mtp import loopback_only
from fastdeploy_mtp.credentials import API_KEY_ENV, SECRET_ENV
from tests.support.netns import Hosts
from tests.support.servers import ServerProcess, descendants, http_post, serving

MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'
API_KEY = "exposure-test-api-key"
SECRET = "5e" * 16
LISTEN = "0A"


def _address(hex_address: str) -> tuple[str, int]:
    """``/proc/net/tcp{,6}``'s ``HEXIP:HEXPORT`` (the IP in host order, 32-bit words) as
    (address text, port)."""
    ip, port = hex_address.rsplit(":", 1)
    raw = b"".join(bytes.fromhex(ip[i : i + 8])[::-1] for i in range(0, len(ip), 8))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port, 16)


def tcp_sockets(pid: int) -> list[tuple[tuple[str, int], tuple[str, int], str]]:
    """(local, remote, state) of every TCP socket process ``pid`` holds (its descriptors'
    inodes looked up in its network namespace's tables)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[9] in inodes:
                    found.append((_address(cols[1]), _address(cols[2]), cols[3]))
    return found


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")


def environment_names(pid: int) -> set[str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return {entry.split(b"=", 1)[0].decode() for entry in f.read().split(b"\0") if entry}


def connects(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
        return True
    except ConnectionRefusedError:
        return False


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with Hosts(["server", "peer"]) as made:
        yield made


@pytest.fixture(scope="module")
def server(hosts: Hosts) -> Iterator[ServerProcess]:
    env = dict(os.environ, **{API_KEY_ENV: API_KEY, SECRET_ENV: SECRET})
    yield from serving(["--speculative-config", MTP1, "-tp", "2"], env=env, on=(hosts, "server"))


def serve_pid(srv: ServerProcess) -> int:
    """The ``fastdeploy-mtp serve`` process (under ``ip netns exec`` and its shell)."""
    (pid,) = [
        p
        for p in [srv.proc.pid, *descendants(srv.proc.pid)]
        if "fastdeploy_mtp.entrypoints.cli" in cmdline(p)
    ]
    return pid


def test_the_workers_listen_only_on_the_store_bound_to_loopback(
    hosts: Hosts, server: ServerProcess
) -> None:
    ranks = {}
    for pid in server.worker_pids():
        args = cmdline(pid)
        rank = int(args[args.index("--local_rank") + 1])
        ranks[rank] = (pid, int(args[args.index("--tp_master_port") + 1]))
    assert sorted(ranks) == [0, 1]
    store_port = ranks[0][1]
    listening = {
        rank: sorted(local for local, _, state in tcp_sockets(pid) if state == LISTEN)
        for rank, (pid, _) in ranks.items()
    }
    assert listening == {0: [("0.0.0.0", store_port)], 1: []}
    for rank, (pid, _) in ranks.items():
        for local, remote, state in tcp_sockets(pid):
            if state != LISTEN:
                assert local[0] == remote[0] == "127.0.0.1", (rank, local, remote)
    (manager,) = [
        p
        for p in descendants(serve_pid(server))
        if "fastdeploy_mtp.serving.processes.cache_manager" in cmdline(p)
    ]
    assert tcp_sockets(manager) == []

    address = hosts.addresses["server"]
    assert hosts.call("peer", connects, address, store_port) is False
    assert hosts.call("server", connects, address, store_port) is False
    assert hosts.call("server", connects, "127.0.0.1", store_port) is True

    body = {"model": "fastdeploy-mtp-tiny", "prompt": "def ", "max_tokens": 4, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    status, answer = server.reach(
        http_post, server.base_url + "/v1/completions", body, 120, headers
    )
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == 4


def test_no_child_inherits_the_api_key_or_the_splitwise_secret(server: ServerProcess) -> None:
    serve = serve_pid(server)
    assert {API_KEY_ENV, SECRET_ENV} <= environment_names(serve)
    children = descendants(serve)
    kinds = {" ".join(cmdline(p)[:4]) for p in children}
    assert len(server.worker_pids()) == 2 and len(children) >= 3, kinds
    leaked = {p: environment_names(p) & {API_KEY_ENV, SECRET_ENV} for p in children}
    assert not any(leaked.values()), (leaked, kinds)


def listener_on_every_address() -> socket.socket:
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    return listener


def test_a_listener_is_bound_to_loopback_and_drops_what_it_accepted_from_elsewhere(
    hosts: Hosts,
) -> None:
    address = hosts.addresses["server"]
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(hosts.call("server", listener_on_every_address))
        port = listener.getsockname()[1]
        foreign = stack.enter_context(
            hosts.call("peer", socket.create_connection, (address, port), 5)
        )
        local = stack.enter_context(
            hosts.call("server", socket.create_connection, ("127.0.0.1", port), 5)
        )
        accepted = [stack.enter_context(listener.accept()[0]) for _ in range(2)]
        assert loopback_only.own_listener(port) == listener.fileno()

        formed, outcome = threading.Event(), list[str]()
        loopback_only.confine_listener(port, formed, outcome)
        assert outcome == [""]
        bound = listener.getsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, 16)
        assert bound.rstrip(b"\0") == b"lo"
        foreign.settimeout(5)
        assert foreign.recv(1) == b""  # shut down: the other host's peer sees it leave
        for conn in accepted:
            with contextlib.suppress(OSError):
                conn.sendall(b"x")
        local.settimeout(5)
        assert local.recv(1) == b"x"  # the loopback peer's connection goes on
        assert hosts.call("peer", connects, address, port) is False
        assert hosts.call("server", connects, "127.0.0.1", port) is True


def test_confining_says_why_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))  # bound, not listening: the port is ours and quiet
        port = probe.getsockname()[1]
        assert loopback_only.own_listener(port) is None
        formed, outcome = threading.Event(), list[str]()
        formed.set()
        loopback_only.confine_listener(port, formed, outcome)
        assert outcome == ["no listening socket of this process on that port"]
