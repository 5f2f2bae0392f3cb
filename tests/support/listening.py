"""The listening TCP sockets a process holds, read from ``/proc`` (no psutil here): the
kernel's socket tables (``/proc/<pid>/net/tcp`` and ``tcp6``) filtered to the socket inodes
among the process's open files (``/proc/<pid>/fd``)."""

from __future__ import annotations

import ipaddress
import os

_LISTEN = "0A"  # the state column of a listening socket


def listening_tcp(pid: int | str = "self") -> set[tuple[str, int]]:
    """``(address, port)`` of every listening TCP socket ``pid`` holds open, the address as
    ``ipaddress`` writes it (``"0.0.0.0"``, ``"::"``, ``"127.0.0.1"``)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            rows = f.read().splitlines()[1:]
        for row in rows:
            fields = row.split()
            if fields[3] == _LISTEN and fields[9] in inodes:
                address, port = fields[1].split(":")
                found.add((_address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> str:
    """An address of ``/proc/net/tcp*``: the bytes of each 32-bit word in host order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))
