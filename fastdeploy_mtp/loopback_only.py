"""Restrict a listening TCP socket of this process that a library opened on every address
(Paddle's TCP store binds ``0.0.0.0``, with no option) to connections over the loopback
device, as if it had bound 127.0.0.1.

Linux's ``SO_BINDTODEVICE`` on the listener does it (unprivileged since Linux 5.7): a
connection to one of the host's network addresses, from another host or from this one, is
refused as if nothing listened; one to 127.0.0.1 from this host's processes is accepted.
Connections it accepted from elsewhere before are shut down (its owner sees those peers
leave). The socket is found among this process's descriptors by its port (``SO_ACCEPTCONN``,
``getsockname``); its owner is not otherwise disturbed (each look goes through a duplicate
descriptor, which is then closed).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Iterator


def _own_tcp_sockets() -> Iterator[tuple[int, socket.socket]]:
    """(descriptor, a socket over a duplicate of it) for each TCP socket of this process; the
    duplicate is closed when the loop moves on. No system-wide table is read
    (``/proc/net/tcp`` walks every connection of the host and takes milliseconds)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:["):
                continue
            # wrapping a descriptor leaves its (shared) blocking mode alone unless
            # socket.setdefaulttimeout was called, which nothing in this package does
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:  # closed meanwhile
            continue
        with sock:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                yield int(fd), sock


def _listening(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))


def own_listener(port: int) -> int | None:
    """File descriptor of this process's listening TCP socket (IPv4 or IPv6) on ``port``, or
    ``None``."""
    for fd, sock in _own_tcp_sockets():
        if _listening(sock) and sock.getsockname()[1] == port:
            return fd
    return None


def drop_foreign_connections(port: int) -> int:
    """Shut down every connection this process accepted on ``port`` from an address that is
    not a loopback one (its owner then sees the peer leave); returns how many."""
    dropped = 0
    for _, sock in _own_tcp_sockets():
        with contextlib.suppress(OSError):  # not connected (any more)
            if _listening(sock) or sock.getsockname()[1] != port:
                continue
            peer = ipaddress.ip_address(sock.getpeername()[0])
            if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
                peer = peer.ipv4_mapped
            if not peer.is_loopback:
                sock.shutdown(socket.SHUT_RDWR)
                dropped += 1
    return dropped


def bind_to_loopback(fd: int) -> None:
    """Let the listening socket ``fd`` accept only connections over the loopback device
    (to 127.0.0.1, from this host's processes)."""
    with socket.socket(fileno=os.dup(fd)) as sock:  # the duplicate closes, ``fd`` stays
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")


def confine_listener(port: int, formed: threading.Event, outcome: list[str]) -> None:
    """Run in a thread while a library opens a listener on ``port``: every 2 ms, look for
    this process's listener on ``port``; once it is there, bind it to the loopback device and
    drop the connections it accepted from elsewhere meanwhile. Stop after one last look once
    ``formed`` is set. Appends ``""`` to ``outcome`` when confined, else why not."""
    while True:
        fd = own_listener(port)
        if fd is not None:
            try:
                bind_to_loopback(fd)
                drop_foreign_connections(port)  # those accepted before
                outcome.append("")
            except OSError as exc:
                outcome.append(str(exc))
            return
        if formed.is_set():
            outcome.append("no listening socket of this process on that port")
            return
        time.sleep(0.002)
