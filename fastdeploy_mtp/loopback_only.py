"""Restrict a listening TCP socket of this process that a library opened on every address
(Paddle's TCP store binds ``0.0.0.0``, with no option) to connections over the loopback
device, as if it had bound 127.0.0.1.

Linux's ``SO_BINDTODEVICE`` on the listener does it (unprivileged since Linux 5.7): a
connection to one of the host's network addresses, from another host or from this one, is
refused as if nothing listened; one to 127.0.0.1 from this host's processes is accepted.
The socket is found by port in ``/proc/self/net/tcp{,6}`` and matched by inode against this
process's descriptors; its owner is not disturbed (the option is set through a duplicate
descriptor, which is then closed).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time


def own_listener(port: int) -> int | None:
    """File descriptor of this process's listening TCP socket on ``port`` (IPv4 or IPv6), or
    ``None``: the listeners of the network namespace on that port (``/proc/self/net``),
    matched by socket inode against this process's descriptors."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/self/net/{table}") as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()  # local address (hex ip:port), state 0A = LISTEN, inode
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{cols[9]}]")
    for fd in os.listdir("/proc/self/fd") if inodes else ():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") in inodes:
                return int(fd)
    return None


def bind_to_loopback(fd: int) -> None:
    """Let the listening socket ``fd`` accept only connections over the loopback device
    (to 127.0.0.1, from this host's processes)."""
    with socket.socket(fileno=os.dup(fd)) as sock:  # the duplicate closes, ``fd`` stays
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")


def confine_listener(port: int, formed: threading.Event, outcome: list[str]) -> None:
    """Run in a thread while a library opens a listener on ``port``: every 2 ms, look for
    this process's listener on ``port`` and bind it to the loopback device once it is there;
    stop after one last look once ``formed`` is set. Appends ``""`` to ``outcome`` when
    confined, else why not."""
    while True:
        fd = own_listener(port)
        if fd is not None:
            try:
                bind_to_loopback(fd)
                outcome.append("")
            except OSError as exc:
                outcome.append(str(exc))
            return
        if formed.is_set():
            outcome.append("no listening socket of this process on that port")
            return
        time.sleep(0.002)
