"""Which address of this host a peer on another host can reach.

A prefill instance that binds its KV port to every interface (``--host 0.0.0.0``) must still
put one concrete address into its descriptors, and a transfer engine must name the address
it serves from. :func:`discover_host` picks it; ``--kv-advertise-host`` overrides it where a
host has several networks and the one decode instances use is not the one picked.

Everything here asks the kernel (the routing table and the interfaces of this network
namespace); nothing is sent on the network.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

__all__ = ["address_towards", "discover_host", "interface_addresses"]

_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
#: A TEST-NET-1 address (never assigned to a host): the source address the kernel picks for
#: it is the one of the default route.
_PROBE = "192.0.2.1"


def address_towards(host: str, port: int = 9) -> str | None:
    """The local IPv4 address the kernel would send from to reach ``host`` (``None``: no
    route, or ``host`` does not resolve). A UDP ``connect`` only consults the routing table."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address == "0.0.0.0" else str(address)


def interface_addresses() -> list[str]:
    """The IPv4 address of every interface of this network namespace that has one, in
    interface order (loopback included)."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                answer = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
            except OSError:  # no IPv4 address on this interface
                continue
            out.append(socket.inet_ntoa(answer[20:24]))
    return out


def discover_host() -> str:
    """An address of this host that other hosts can reach: the source address of the
    default route; without one (an isolated network), the first interface address that is
    not loopback; with none, this machine's fully qualified name."""
    routed = address_towards(_PROBE)
    if routed is not None and not ipaddress.ip_address(routed).is_loopback:
        return routed
    for address in interface_addresses():
        if not ipaddress.ip_address(address).is_loopback:
            return address
    return socket.getfqdn()
