"""Which local address another host reaches (the netns tests check it on a host of its own)."""

from __future__ import annotations

import ipaddress
import socket

from fastdeploy_mtp.splitwise.addresses import address_towards, discover_host, interface_addresses


def test_the_interfaces_and_the_route_to_loopback() -> None:
    addresses = interface_addresses()
    assert "127.0.0.1" in addresses
    assert all(ipaddress.ip_address(a).version == 4 for a in addresses)
    assert address_towards("127.0.0.1") == "127.0.0.1"
    assert address_towards("no-such-host.invalid") is None


def test_the_discovered_host_is_not_loopback_when_there_is_another_address() -> None:
    found = discover_host()
    others = [a for a in interface_addresses() if not ipaddress.ip_address(a).is_loopback]
    if others:  # a machine with a network: the default route's source, else its first address
        routed = address_towards("192.0.2.1")
        assert found == (routed if routed is not None and routed != "127.0.0.1" else others[0])
    else:  # no network at all: its name
        assert found == socket.getfqdn()
