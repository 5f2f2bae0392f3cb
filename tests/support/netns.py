"""Hosts for cross-host tests: Linux network namespaces joined by one bridge.

:class:`Hosts` makes one namespace per host name plus a "switch" namespace that holds a
bridge; each host gets a veth pair into the bridge and one address in a /24 of the
benchmarking range 198.18.0.0/15 (reserved for tests of network devices, routed nowhere),
and its loopback. Nothing is added to the namespace the tests run in: the hosts reach each
other and nothing else, and every address used is one made here. Namespace names carry
this process's pid, so test runs beside each other do not meet.

A process runs on a host with :meth:`Hosts.command` (``ip netns exec``; optionally with a
``/dev/shm`` of its own, so that shared-memory names do not cross hosts either), and this
process talks to a host with :meth:`Hosts.call`, which runs a function in a thread that
entered the host's namespace (``setns`` applies to the calling thread only): every socket
made in it belongs to that host.

Needs root (the CI machine and the developers' run as root) and ``iproute2``.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Hosts"]

_CLONE_NEWNET = 0x40000000
_T = TypeVar("_T")
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


class Hosts:
    """Network namespaces ``names`` on one bridged /24; :meth:`close` removes them.

    Args:
        names: host names (short words).
        subnet: third octet of ``198.18.<subnet>.0/24`` (default: from the pid).
    """

    def __init__(self, names: list[str], subnet: int | None = None):
        self.tag = f"fdmtp{os.getpid()}"
        self.subnet = subnet if subnet is not None else os.getpid() % 250 + 1
        self.switch = f"{self.tag}-sw"
        self.namespaces = {name: f"{self.tag}-{name}" for name in names}
        self.addresses = {name: f"198.18.{self.subnet}.{i + 1}" for i, name in enumerate(names)}
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        for ns in (self.switch, *self.namespaces.values()):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (name, ns) in enumerate(self.namespaces.items()):
            port = f"p{i}"
            # made inside the switch namespace, one end moved to the host: nothing appears here
            _ip(
                "-n",
                self.switch,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[name]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def command(self, name: str, argv: list[str], private_shm: bool = False) -> list[str]:
        """``argv`` run on host ``name``; ``private_shm``: with an empty ``/dev/shm`` of its
        own (``ip netns exec`` gives the process a mount namespace of its own already)."""
        prefix = ["ip", "netns", "exec", self.namespaces[name]]
        if not private_shm:
            return [*prefix, *argv]
        script = 'mount -t tmpfs -o mode=1777,size=4g tmpfs /dev/shm && exec "$@"'
        return [*prefix, "sh", "-c", script, "sh", *argv]

    def call(self, name: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` in a thread inside host ``name``'s network namespace."""
        result: list[Any] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                fd = os.open(f"/run/netns/{self.namespaces[name]}", os.O_RDONLY)
                try:
                    if _libc.setns(fd, _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns into {self.namespaces[name]}")
                finally:
                    os.close(fd)
                result.append(fn(*args, **kwargs))
            except BaseException as exc:
                error.append(exc)

        thread = threading.Thread(target=run, name=f"netns-{name}", daemon=True)
        thread.start()
        thread.join()
        if error:
            raise error[0]
        return result[0]

    def shape(self, name: str, rate: str | None) -> None:
        """Limit what host ``name`` sends to ``rate`` (``tc`` token bucket, e.g. ``"4mbit"``);
        ``None`` lifts the limit."""
        ns = self.namespaces[name]
        if rate is None:
            subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"], timeout=30
            )
            return
        tbf = ["tbf", "rate", rate, "burst", "16kb", "latency", "2s"]
        out = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise RuntimeError(f"tc on {ns}: {out.stderr.strip()}")

    def close(self) -> None:
        """Remove every namespace made (their veth pairs and the bridge go with them).
        The processes started on the hosts must have ended first."""
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)
        self._made.clear()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
