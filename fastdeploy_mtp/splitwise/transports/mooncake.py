"""The ``"mooncake"`` KV transport: D reads the offered blocks straight out of P's caches
into its own with the Mooncake transfer engine (:mod:`..mooncake_engine`: RDMA where the
engine finds NICs, its TCP transport otherwise), no copy in between.

P registers every cache of every rank with its process's engine once, when its
:class:`~fastdeploy_mtp.splitwise.kv_source.KVSource` starts (source option
``mooncake=True``), and its descriptors carry ``"mooncake": {"segment": "host:port",
"buffers": [[base address per cache] per rank], "protocol": "rdma" | "tcp"}``: the engine's
segment name (its handshake port at the source's advertised host), where each cache starts
in P's address space, and the protocol the engine runs over. D refuses to pull from an
engine that runs over another protocol than its own, before anything is sent, in one line
naming both (``"auto"`` takes tcp instead, with a warning). Only the TCP transport has run
here; the RDMA path is unverified.

D reads, per rank, one batch holding every (cache, run of consecutive blocks) of the
request: block ``block_ids[j]`` of cache ``c`` is ``block_nbytes(c)`` bytes at
``buffers[r][c] + block_ids[j] * block_nbytes(c)``. The blocks and addresses read are those
of P's own ``check`` answer (:mod:`..control`), never the hand-over's; P's engine refuses
any read outside the memory it registered. Over TCP D registers nothing (the engine's TCP
transport writes what it reads to the local address as given); over RDMA it registers its
caches on its first pull (the NIC writes only into registered memory).

What the engine does not give: it authenticates no one and listens on every interface,
whatever the advertised host. Whoever reaches its ports can read and write every cache
registered with it: all of P's; none of D's over TCP, all of them over RDMA. The transfer
token and signature guard the control socket (who may hold and release an offer), not the
engine's ports, so keep those on the cluster's network (the trust model in
``docs/architecture.md``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from ..addresses import address_towards
from ..descriptor import Descriptor
from ..kv_layout import Caches, KVLayout, TransferError
from ..mooncake_engine import (
    PROTOCOLS,
    Engine,
    available,
    base_address,
    current,
    engine_at,
    local_protocol,
    protocol,
    require,
)
from ..transport import PullJob, Transport, finish_direct_read, frame_labels, register

__all__ = ["MooncakeTransport", "available", "protocol", "require"]

logger = logging.getLogger(__name__)

NAME = "mooncake"
_MAX_ADDRESS = 1 << 64
_lock = threading.Lock()
_warned: set[str] = set()  # the mismatches "auto" passed over (each logged once)


def _mismatch(theirs: Any, segment: Any) -> str | None:
    """``None`` when P's engine (at ``segment``) runs over this host's protocol, else why
    this host cannot read from it (one line naming both)."""
    ours = local_protocol()
    if theirs == ours:
        return None
    return (
        f"the prefill instance's Mooncake engine ({segment}) runs over {theirs}, this decode "
        f"instance's over {ours}: both ends must run over one protocol (set "
        "FDMTP_MOONCAKE_PROTOCOL=tcp on both hosts, or use --kv-transport tcp)"
    )


def _read_field(value: Any, layout: KVLayout, where: str) -> dict[str, Any] | None:
    """The ``mooncake`` field checked: ``None`` or ``{"segment": "host:port", "buffers":
    [[int per cache] per rank], "protocol": "rdma" | "tcp"}``."""
    if value is None:
        return None
    field = f"{where}: `mooncake`"
    if not isinstance(value, dict) or set(value) != {"segment", "buffers", "protocol"}:
        raise TransferError(
            f"{field} must be null or an object with `segment`, `buffers` and `protocol`"
        )
    if value["protocol"] not in PROTOCOLS:
        raise TransferError(
            f"{field}.protocol must be 'rdma' or 'tcp', got {value['protocol']!r:.40}"
        )
    segment = value["segment"]
    if not isinstance(segment, str) or not 3 <= len(segment) <= 300 or ":" not in segment:
        raise TransferError(f"{field}.segment must be a 'host:port' str, got {segment!r:.100}")
    port = segment.rsplit(":", 1)[1]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise TransferError(f"{field}.segment must end in a port, got {segment!r:.100}")
    buffers = value["buffers"]
    tp, nc = layout.tensor_parallel_size, layout.num_caches
    if not isinstance(buffers, list) or len(buffers) != tp:
        raise TransferError(f"{field}.buffers must hold one list per rank ({tp})")
    out = []
    for r, rank in enumerate(buffers):
        if not isinstance(rank, list) or len(rank) != nc:
            raise TransferError(f"{field}.buffers[{r}] must hold {nc} addresses (one per cache)")
        for c, (base, entry) in enumerate(zip(rank, layout.caches)):
            extent = entry.shape[0] * entry.block_nbytes
            if (
                not isinstance(base, int)
                or isinstance(base, bool)
                or not 0 < base < _MAX_ADDRESS - extent
            ):
                raise TransferError(
                    f"{field}.buffers[{r}][{c}] must be the address of {entry.label}, "
                    f"got {base!r:.40}"
                )
        out.append(list(rank))
    return {"segment": segment, "buffers": out, "protocol": value["protocol"]}


def _runs(src: np.ndarray, dst: np.ndarray) -> list[tuple[int, int, int]]:
    """(first source block, first destination block, count) of each maximal run where both
    the source and the destination ids go up by one."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src.tolist(), dst.tolist()):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            first_s, first_d, n = runs[-1]
            runs[-1] = (first_s, first_d, n + 1)
        else:
            runs.append((s, d, 1))
    return runs


@register
class MooncakeTransport(Transport):
    """Read the offered blocks from P's registered caches with the Mooncake transfer engine."""

    name = NAME
    preference = 5  # "auto": below shm (same host), above tcp (a copy through the control socket)
    fields = ("mooncake",)

    def offer_fields(
        self, caches: Caches, layout: KVLayout, options: dict[str, Any], host: str, where: str
    ) -> dict[str, Any]:
        wanted = options.pop("mooncake", False)
        if not isinstance(wanted, bool):
            raise TransferError(f"{where}: `mooncake` must be a bool, got {wanted!r}")
        if not wanted:
            return {"mooncake": None}
        engine = engine_at(host)
        buffers: list[list[int]] = []
        labels = iter(frame_labels(layout))  # rank-major, as the caches are walked
        try:
            for rank in caches:
                buffers.append([])
                for cache in rank:
                    buffers[-1].append(engine.register(cache, next(labels)))
        except BaseException:  # none of this source's registrations stays behind
            engine.forget([base for rank_bases in buffers for base in rank_bases])
            raise
        return {
            "mooncake": {"segment": engine.segment, "buffers": buffers, "protocol": engine.protocol}
        }

    def close_fields(self, fields: dict[str, Any]) -> None:
        offered = fields.get("mooncake")
        engine = current()
        if offered is None or engine is None:
            return
        engine.forget([base for rank in offered["buffers"] for base in rank])

    def read_fields(
        self, descriptor: dict[str, Any], layout: KVLayout, where: str
    ) -> dict[str, Any]:
        return {"mooncake": _read_field(descriptor["mooncake"], layout, where)}

    def usable(self, descriptor: dict[str, Any]) -> bool:
        offered = descriptor.get("mooncake")
        if not isinstance(offered, dict) or not available():
            return False
        why = _mismatch(offered.get("protocol"), offered.get("segment"))
        if why is not None:
            with _lock:
                first = why not in _warned
                _warned.add(why)
            if first:
                logger.warning("mooncake: 'auto' takes tcp instead: %s", why)
        return why is None

    def check_pullable(self, descriptor: Descriptor, where: str) -> None:
        if descriptor.fields["mooncake"] is None:
            raise TransferError(
                f"{where}: transport 'mooncake' needs the prefill instance to register its caches "
                "with the Mooncake transfer engine (serve --splitwise-role prefill "
                "--kv-transport mooncake); this one did not"
            )
        require()
        offered = descriptor.fields["mooncake"]
        why = _mismatch(offered["protocol"], offered["segment"])
        if why is not None:
            raise TransferError(f"{where}: {why}")

    def pull(self, job: PullJob) -> None:
        # pull_blocks asked "check" just before: P holds the offer, and `job.descriptor` is it
        descriptor = job.descriptor
        offered = descriptor.fields["mooncake"]
        segment = offered["segment"]
        layout = descriptor.layout
        engine = engine_at(
            address_towards(segment.rsplit(":", 1)[0].strip("[]")) or "127.0.0.1", job.timeout
        )
        mine = _destinations(engine, job.caches, layout)
        runs = _runs(np.asarray(descriptor.block_ids, np.int64), job.dst_idx)
        for r in range(layout.tensor_parallel_size):
            local: list[int] = []
            remote: list[int] = []
            lengths: list[int] = []
            for c, entry in enumerate(layout.caches):
                size = entry.block_nbytes
                for s, d, n in runs:
                    local.append(mine[r][c] + d * size)
                    remote.append(offered["buffers"][r][c] + s * size)
                    lengths.append(n * size)
            rc = engine.engine.batch_transfer_sync_read(segment, local, remote, lengths)
            if rc != 0:
                raise TransferError(
                    f"{descriptor.where}: the Mooncake read of rank {r}'s blocks from {segment} "
                    f"failed (code {rc}): the prefill instance is gone or unreachable, or "
                    "refused the addresses; the destination blocks may be partly written"
                )
        finish_direct_read(job, "mooncake")


def _destinations(engine: Engine, caches: Caches, layout: KVLayout) -> list[list[int]]:
    """Where each of D's caches starts (per rank, per cache). Over RDMA the NIC writes only
    into registered memory: the caches are registered (once, until their arrays go). Over
    TCP nothing is: the engine's TCP transport writes what it reads to the address it is
    given, and the engine's port serves none of D's memory."""
    place = engine.register if engine.protocol == "rdma" else base_address
    labels = iter(frame_labels(layout))  # rank-major, as the caches are walked
    return [[place(cache, next(labels)) for cache in rank] for rank in caches]
