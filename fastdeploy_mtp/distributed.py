"""Tensor parallelism across worker processes with ``paddle.distributed`` (gloo on CPU).

One worker process per tensor-parallel rank calls :func:`init_tensor_parallel` once, before
it loads its shard of the model (``load_tiny(tensor_parallel_size=..., tensor_parallel_rank=...)``).
The model's parallel layers then use the collectives below; with a world of one process they
are never called.

Ports: rank 0 hosts Paddle's TCP store on ``master_port`` (``PADDLE_MASTER``); the trainer
endpoints Paddle wants named are ``master_host:master_port + rank``; and a short rendezvous
that bounds the wait for the peers listens on ``master_port + world_size``. A caller therefore
reserves the ``world_size + 1`` ports ``master_port .. master_port + world_size``
(:func:`find_free_port_range` finds such a range).

Exposure: the rendezvous listens on ``master_host`` only while the group forms. Paddle's
store listens on every IPv4 address (Paddle gives no choice) for the life of rank 0's
process (a process-wide static with no close). Rank 0 binds it to the loopback device
(``SO_BINDTODEVICE`` ``lo``) from a thread, which runs once Paddle's store set-up lets go of
the GIL (after rank 1 joined: about 0.1 s), and shuts down what it accepted from other
hosts meanwhile; from then on only this host's processes reach it, at 127.0.0.1. Gloo's
pairs use the loopback interface (``GLOO_SOCKET_IFNAME=lo``); their listeners close once
the pairs are connected.

Failure bounds: Paddle's own store waits up to 15 minutes for a missing peer and its gloo
collectives have no practical timeout. :func:`init_tensor_parallel` first runs its own
rendezvous, bounded by ``timeout``, so a peer that never starts turns into a
``TimeoutError`` instead of a hang. A peer that dies *after* the rendezvous (during Paddle's
initialisation or in a collective mid-step) is not bounded here: the engine that started the
workers must notice the death and kill the others.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import paddle

from .loopback_only import confine_listener

_MAGIC = b"FDTP"
_HELLO = struct.Struct("!4sii")  # magic, rank, world_size

_group: object | None = None
_world_size = 1
_rank = 0


def find_free_port_range(count: int, host: str = "127.0.0.1", attempts: int = 50) -> int:
    """First port of ``count`` consecutive ports that are free on ``host`` right now (a race
    with other processes remains possible; callers that must be sure retry on failure)."""
    if count <= 0:
        raise ValueError(f"`count` must be positive, got {count}")
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            start = probe.getsockname()[1]
        if start + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(start, start + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind((host, port))
            return start
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(
        f"no {count} consecutive free ports found on {host} after {attempts} attempts"
    )


class _Expired(Exception):
    """The rendezvous deadline passed."""


class _Deadline:
    """A point ``timeout`` seconds from now; :meth:`left` is the time to it."""

    def __init__(self, timeout: float):
        self.at = time.monotonic() + timeout

    def left(self) -> float:
        """Seconds until the deadline (> 0); raises :class:`_Expired` once it passed."""
        remaining = self.at - time.monotonic()
        if remaining <= 0:
            raise _Expired
        return remaining


def _rendezvous(rank: int, world_size: int, host: str, port: int, timeout: float) -> None:
    """Block until all ``world_size`` ranks reached this point, or raise ``TimeoutError``.

    Rank 0 listens on ``port`` and waits for one hello per other rank, then answers each one;
    the others connect (retrying while rank 0 is not listening yet) and wait for the answer.
    """
    if rank == 0:
        _host_rendezvous(world_size, host, port, timeout)
    else:
        _join_rendezvous(rank, world_size, host, port, timeout)


def _host_rendezvous(world_size: int, host: str, port: int, timeout: float) -> None:
    """Rank 0: take one hello from each other rank, then answer them all."""
    deadline = _Deadline(timeout)
    where = f"tensor-parallel rendezvous on {host}:{port}"
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    peers: dict[int, socket.socket] = {}
    try:
        server.bind((host, port))
        server.listen(world_size)
        while len(peers) < world_size - 1:
            try:
                accepted = _accept_hello(server, deadline)
            except (_Expired, TimeoutError):
                missing = sorted(set(range(1, world_size)) - set(peers))
                raise TimeoutError(
                    f"{where}: rank(s) {missing} of world_size {world_size} did not show up within "
                    f"{timeout:g} s"
                ) from None
            if accepted is None:
                continue
            conn, hello = accepted
            magic, peer_rank, peer_world = _HELLO.unpack(hello)
            if magic != _MAGIC or peer_world != world_size or not 0 < peer_rank < world_size:
                conn.close()
                raise RuntimeError(
                    f"{where}: a peer announced rank {peer_rank} of world_size {peer_world}; "
                    f"expected a rank in 1..{world_size - 1} of world_size {world_size}"
                )
            if peer_rank in peers:
                conn.close()
                raise RuntimeError(f"{where}: rank {peer_rank} joined twice")
            peers[peer_rank] = conn
        for conn in peers.values():
            conn.sendall(_HELLO.pack(_MAGIC, 0, world_size))
    finally:
        for conn in peers.values():
            conn.close()
        server.close()


def _accept_hello(server: socket.socket, deadline: _Deadline) -> tuple[socket.socket, bytes] | None:
    """Accept one connection on ``server`` and read its hello; ``None`` for a connection that
    closed before its hello (not a peer). Raises :class:`_Expired` or ``TimeoutError`` when
    the deadline passes (the connection, if any, closed)."""
    conn: socket.socket | None = None
    try:
        server.settimeout(deadline.left())
        conn, _ = server.accept()
        conn.settimeout(deadline.left())
        return conn, _recv_exact(conn, _HELLO.size)
    except ConnectionError:
        if conn is not None:
            conn.close()
        return None
    except (_Expired, TimeoutError):
        if conn is not None:
            conn.close()
        raise


def _join_rendezvous(rank: int, world_size: int, host: str, port: int, timeout: float) -> None:
    """Rank ``rank`` > 0: say hello to rank 0 (retrying while it does not listen yet) and
    wait for its answer."""
    deadline = _Deadline(timeout)
    while True:
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            conn.settimeout(min(1.0, deadline.left()))
            conn.connect((host, port))
            conn.sendall(_HELLO.pack(_MAGIC, rank, world_size))
            conn.settimeout(deadline.left())
            magic, _, peer_world = _HELLO.unpack(_recv_exact(conn, _HELLO.size))
            if magic != _MAGIC or peer_world != world_size:
                raise RuntimeError(
                    f"tensor-parallel rendezvous on {host}:{port}: unexpected answer from rank 0"
                )
            return
        except _Expired:
            raise TimeoutError(
                f"tensor-parallel rendezvous on {host}:{port}: rank {rank} did not hear from rank "
                f"0 (and every peer) within {timeout:g} s"
            ) from None
        except OSError:  # rank 0 not listening yet (refused, reset or timed out): retry
            time.sleep(min(0.05, max(deadline.at - time.monotonic(), 0)))
        finally:
            conn.close()


def _wait_listening(host: str, port: int, timeout: float) -> None:
    """Return once ``host:port`` accepts a connection (closed at once), or after ``timeout``
    seconds (Paddle then retries on its own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.01)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed the connection during the rendezvous")
        data += chunk
    return data


def _form_group(rank: int, world_size: int, master_host: str, master_port: int) -> object:
    """Set the environment Paddle reads and call ``init_parallel_env`` (every peer is at the
    rendezvous); rank 0 binds Paddle's store to the loopback device meanwhile (see the
    module doc). Returns what ``init_parallel_env`` returned."""
    import paddle.distributed as dist

    endpoints = [f"{master_host}:{master_port + r}" for r in range(world_size)]
    os.environ.update(
        {
            "PADDLE_TRAINER_ID": str(rank),
            "PADDLE_TRAINERS_NUM": str(world_size),
            "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
            "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
            "PADDLE_MASTER": endpoints[0],
            "PADDLE_DISTRI_BACKEND": "gloo",
            "GLOO_SOCKET_IFNAME": "lo",  # gloo's pairs on loopback, whatever the hostname is
        }
    )
    for var in ("MASTER_ADDR", "MASTER_PORT"):  # they would take precedence over PADDLE_MASTER
        os.environ.pop(var, None)
    formed, outcome = threading.Event(), list[str]()
    watch = threading.Thread(target=confine_listener, args=(master_port, formed, outcome))
    if rank == 0:  # the store's host
        watch.start()
    try:
        group = dist.init_parallel_env()
    finally:
        formed.set()
        if watch.is_alive():
            watch.join()
    if rank == 0 and outcome != [""]:
        raise RuntimeError(
            f"cannot restrict Paddle's TCP store on port {master_port} to the loopback device "
            f"({outcome[0]}); it would accept connections from other hosts"
        )
    return group


def init_tensor_parallel(
    rank: int,
    world_size: int,
    master_port: int,
    master_host: str = "127.0.0.1",
    timeout: float = 60.0,
) -> None:
    """Make this process rank ``rank`` of a ``world_size``-process gloo group (CPU).

    Sets the environment ``paddle.distributed.init_parallel_env`` reads (``PADDLE_TRAINER_ID``,
    ``PADDLE_TRAINERS_NUM``, ``PADDLE_TRAINER_ENDPOINTS``, ``PADDLE_CURRENT_ENDPOINT``,
    ``PADDLE_MASTER``, ``PADDLE_DISTRI_BACKEND=gloo``, ``GLOO_SOCKET_IFNAME=lo``) once every
    peer reached a rendezvous bounded by ``timeout`` (nothing is changed when it times out),
    then calls ``init_parallel_env``; rank 0 binds Paddle's store to the loopback device
    meanwhile. ``world_size == 1`` does nothing. Calling it again with the same arguments does
    nothing; with others it raises.

    Args:
        rank: this process's rank, ``0 <= rank < world_size``.
        world_size: number of tensor-parallel processes.
        master_port: first of the ``world_size + 1`` ports used (see the module doc).
        master_host: address of rank 0 (every rank runs on this host for now).
        timeout: seconds to wait for all peers to reach the rendezvous.

    Raises:
        ValueError: bad ``rank``/``world_size``/``master_port``/``timeout``.
        TimeoutError: a peer did not reach the rendezvous within ``timeout`` seconds.
        RuntimeError: already initialised differently, a peer announced another world, or
            rank 0 could not bind the store to the loopback device (Linux before 5.7).
    """
    global _group, _world_size, _rank
    if world_size < 1:
        raise ValueError(f"`world_size` must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"`rank` must be in [0, {world_size}), got {rank}")
    if timeout <= 0:
        raise ValueError(f"`timeout` must be positive, got {timeout}")
    if world_size == 1:
        return
    if not 0 < master_port <= 65535 - world_size:
        raise ValueError(
            f"`master_port` must leave room for {world_size + 1} ports below 65536, got "
            f"{master_port}"
        )
    if _group is not None:
        if (_rank, _world_size) == (rank, world_size):
            return
        raise RuntimeError(
            f"tensor parallelism already initialised as rank {_rank} of {_world_size}; cannot "
            f"re-initialise as rank {rank} of {world_size}"
        )
    _rendezvous(rank, world_size, master_host, master_port + world_size, timeout)
    if rank != 0:
        # Paddle's store client retries a refused connection only every 3 s: wait until rank 0
        # (which goes straight to creating the store) listens, probing every 10 ms.
        _wait_listening(master_host, master_port, timeout)
    group = _form_group(rank, world_size, master_host, master_port)
    if group is None:
        raise RuntimeError(
            "paddle.distributed.init_parallel_env() returned no group (not a parallel environment?)"
        )
    _group, _world_size, _rank = group, world_size, rank


def tensor_parallel_group() -> object | None:
    """The group made by :func:`init_tensor_parallel`, or ``None`` when there is none."""
    return _group


def tensor_parallel_world_size() -> int:
    """Ranks in the tensor-parallel group (1 when not initialised)."""
    return _world_size


def tensor_parallel_rank() -> int:
    """This process's rank in the tensor-parallel group (0 when not initialised)."""
    return _rank


def _require_group(what: str) -> object:
    if _group is None:
        raise RuntimeError(
            f"{what} needs tensor parallelism: call init_tensor_parallel(rank, world_size, ...) "
            "first"
        )
    return _group


# Gloo dies (SIGFPE) on a tensor with no elements. In this package every rank passes the same
# shape to each collective (the inputs are replicated), so all ranks skip an empty one alike.


def all_reduce_sum(x: paddle.Tensor) -> paddle.Tensor:
    """Sum ``x`` (any shape, float32) over the ranks, in place; returns ``x`` (an empty ``x``
    as is, without communicating)."""
    import paddle.distributed as dist

    group = _require_group("all_reduce_sum")
    if x.size == 0:
        return x
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    return x


def all_gather_last_axis(x: paddle.Tensor) -> paddle.Tensor:
    """``x [..., n]`` on every rank -> ``[..., world_size * n]``: the ranks' tensors
    concatenated along the last axis in rank order (a new tensor; zeros, without
    communicating, when ``x`` is empty)."""
    import paddle.distributed as dist

    group = _require_group("all_gather_last_axis")
    if x.size == 0:
        return paddle.zeros([*x.shape[:-1], x.shape[-1] * _world_size], dtype=x.dtype)
    parts: list[paddle.Tensor] = []
    dist.all_gather(parts, x, group=group)
    return paddle.concat(parts, axis=-1)


def broadcast_from_rank0(x: paddle.Tensor) -> paddle.Tensor:
    """Overwrite ``x`` on every rank with rank 0's values, in place; returns ``x`` (an empty
    ``x`` as is, without communicating)."""
    import paddle.distributed as dist

    group = _require_group("broadcast_from_rank0")
    if x.size == 0:
        return x
    dist.broadcast(x, src=0, group=group)
    return x
