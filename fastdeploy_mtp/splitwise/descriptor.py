"""The descriptor of an offer: what travels from a prefill instance ("P") to a decode
instance ("D") with a request so that D can pull its KV blocks, and its checks.

A descriptor is a JSON-able dict, its keys in this order::

    {"version": 4, "request_id": str, "address": "tcp://host:port", "token": str,
     "layout": KVLayout.to_dict(), "block_ids": [int, ...],
     "num_blocks": <P's cache block count>,
     <every transport's fields: "shm_names": [[name per cache] per rank] or None,
      "mooncake": {"segment": "host:port", "buffers": [[address per cache] per rank]} or None>,
     "hold_timeout": float}

``address`` is P's control socket and ``token`` the offer's transfer token
(:mod:`.control`); the transports' fields are each transport's (:mod:`.transport`), in the
order of their preference.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .kv_layout import (
    KVLayout,
    TransferError,
    block_id_list,
    int_field,
    nonempty_str,
    positive_number,
)

__all__ = [
    "DESCRIPTOR_HEAD",
    "DESCRIPTOR_VERSION",
    "Descriptor",
    "check_descriptor",
    "differing_field",
]

#: ``"version"`` of the descriptors a source writes and :func:`check_descriptor` reads.
DESCRIPTOR_VERSION = 4

#: The keys of a descriptor before the transports' fields, in their order; ``"hold_timeout"``
#: comes after those fields, last.
DESCRIPTOR_HEAD = (
    "version",
    "request_id",
    "address",
    "token",
    "layout",
    "block_ids",
    "num_blocks",
)

#: ``read_fields(descriptor, layout, where)``: the transports' fields of a received
#: descriptor, checked against the prefill's layout.
FieldReader = Callable[[dict[str, Any], KVLayout, str], dict[str, Any]]


@dataclass(frozen=True)
class Descriptor:
    """A descriptor's fields, checked (:func:`check_descriptor`) or about to be sent
    (:meth:`to_dict`); ``fields`` holds every registered transport's fields."""

    request_id: str
    address: str
    layout: KVLayout
    block_ids: list[int]
    num_blocks: int
    hold_timeout: float
    fields: dict[str, Any]
    #: the offer's transfer token (:mod:`.control`)
    token: str = ""

    @property
    def where(self) -> str:
        """The prefix of the pull's error messages."""
        return f"pull_blocks({self.request_id!r})"

    def offer_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without the token: what P's ``check`` answer carries and D compares."""
        out = self.to_dict()
        del out["token"]
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able descriptor (module docstring), sharing no list with ``self``."""
        return {
            "version": DESCRIPTOR_VERSION,
            "request_id": self.request_id,
            "address": self.address,
            "token": self.token,
            "layout": self.layout.to_dict(),
            "block_ids": list(self.block_ids),
            "num_blocks": self.num_blocks,
            **copy.deepcopy(self.fields),
            "hold_timeout": self.hold_timeout,
        }


def check_descriptor(
    descriptor: Any, field_keys: Sequence[str], read_fields: FieldReader
) -> Descriptor:
    """The checked fields of a received descriptor (a :class:`TransferError` names the first
    missing or ill-typed key).

    Args:
        descriptor: as received.
        field_keys: the transports' keys, every one of which the descriptor must have.
        read_fields: reads and checks the values of ``field_keys``.
    """
    where = "pull_blocks: descriptor"
    if not isinstance(descriptor, dict):
        raise TransferError(f"{where} must be a dict, got {type(descriptor).__name__}")
    for key in (*DESCRIPTOR_HEAD, *field_keys, "hold_timeout"):
        if key not in descriptor:
            raise TransferError(f"{where}: missing key `{key}`")
    if descriptor["version"] != DESCRIPTOR_VERSION or isinstance(descriptor["version"], bool):
        raise TransferError(
            f"{where}: `version` {descriptor['version']!r} is not {DESCRIPTOR_VERSION}"
        )
    rid = nonempty_str(descriptor["request_id"], "request_id", where)
    where = f"pull_blocks({rid!r}): descriptor"
    address = descriptor["address"]
    if not isinstance(address, str) or not address.startswith("tcp://"):
        raise TransferError(f"{where}: `address` must be a 'tcp://host:port' str, got {address!r}")
    token = descriptor["token"]
    if not isinstance(token, str) or not 16 <= len(token) <= 128:
        raise TransferError(
            f"{where}: `token` must be the offer's transfer token (a str of 16..128 characters)"
        )
    layout, num_blocks = _layout_and_blocks(descriptor, where)
    block_ids = block_id_list(descriptor["block_ids"], num_blocks, "block_ids", where)
    if not block_ids:
        raise TransferError(f"{where}: `block_ids` is empty")
    fields = read_fields(descriptor, layout, where)
    hold = positive_number(descriptor["hold_timeout"], "hold_timeout", where)
    return Descriptor(rid, address, layout, block_ids, num_blocks, hold, fields, token)


def _layout_and_blocks(descriptor: dict[str, Any], where: str) -> tuple[KVLayout, int]:
    """The descriptor's ``layout`` and ``num_blocks``, checked against each other."""
    try:
        layout = KVLayout.from_dict(descriptor["layout"])
    except TransferError as exc:
        raise TransferError(f"{where}: `layout`: {exc}") from None
    num_blocks = int_field(descriptor["num_blocks"], "num_blocks", 1, where)
    for entry in layout.caches:
        if entry.shape[0] != num_blocks:
            raise TransferError(
                f"{where}: `layout` gives {entry.label} {entry.shape[0]} blocks, "
                f"`num_blocks` is {num_blocks}"
            )
    return layout, num_blocks


def differing_field(handed_over: Descriptor, offered: Descriptor) -> str | None:
    """The first field in which the hand-over's descriptor differs from P's offer (``None``
    if they agree); the address and hold timeout are the hand-over's business."""
    ours, theirs = handed_over.offer_dict(), offered.offer_dict()
    for key in ours:
        if key not in ("address", "hold_timeout") and ours[key] != theirs.get(key):
            return key
    return None
