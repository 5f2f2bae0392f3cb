"""The ``"shm"`` KV transport: both instances on one host. P's caches are published with
``set_data_ipc`` under names that its descriptors carry (``"shm_names"``: per rank, one
name per cache); D attaches them with ``share_external_data``, copies the offered blocks,
detaches, and releases the offer over the control socket.

The source's option ``shm_names`` (:class:`~fastdeploy_mtp.splitwise.kv_source.KVSource`)
turns it on; without it descriptors carry ``"shm_names": null`` and only other transports
can pull them.

The copy is not compared with P's tags of its blocks (the ``digest`` the ``"mooncake"``
transport asks for): the names come from P's authenticated ``check`` answer and name files
only the deployment's user can open (mode 0600, owner and mode checked on attach), so the
check would guard only against that user's own processes, which the trust model does not,
at the price of one HMAC pass over the KV on each side (several times the copy itself,
``scripts/bench_kv_mac.py``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..control import release_after_direct_read
from ..descriptor import Descriptor
from ..kv_layout import Caches, KVLayout, TransferError
from ..transport import PullJob, Transport, register


def _check_names(names: Any, layout: KVLayout, where: str) -> list[list[str]]:
    """``names`` as per rank a list of ``layout.num_caches`` non-empty str."""
    if (
        not isinstance(names, Sequence)
        or isinstance(names, str)
        or len(names) != layout.tensor_parallel_size
    ):
        raise TransferError(
            f"{where}: `shm_names` must hold one list per rank ({layout.tensor_parallel_size})"
        )
    out = []
    for r, rank in enumerate(names):
        if (
            not isinstance(rank, Sequence)
            or isinstance(rank, str)
            or len(rank) != layout.num_caches
            or not all(isinstance(n, str) and n for n in rank)
        ):
            raise TransferError(
                f"{where}: `shm_names[{r}]` must hold {layout.num_caches} non-empty names"
            )
        out.append(list(rank))
    return out


@register
class ShmTransport(Transport):
    """Copy from P's published caches, attached by name."""

    name = "shm"
    preference = 10  # "auto" takes it over "tcp" whenever P's caches are on this host
    fields = ("shm_names",)

    def offer_fields(
        self, caches: Caches, layout: KVLayout, options: dict[str, Any], host: str, where: str
    ) -> dict[str, Any]:
        names = options.pop("shm_names", None)
        return {"shm_names": None if names is None else _check_names(names, layout, where)}

    def read_fields(
        self, descriptor: dict[str, Any], layout: KVLayout, where: str
    ) -> dict[str, Any]:
        names = descriptor["shm_names"]
        return {"shm_names": None if names is None else _check_names(names, layout, where)}

    def usable(self, descriptor: dict[str, Any]) -> bool:
        names = descriptor.get("shm_names") or []
        return bool(
            names and names[0] and os.path.exists(os.path.join("/dev/shm", str(names[0][0])))
        )

    def check_pullable(self, descriptor: Descriptor, where: str) -> None:
        if descriptor.fields["shm_names"] is None:
            raise TransferError(
                f"{where}: transport 'shm' needs `shm_names` in the descriptor; the source has none"
            )

    def pull(self, job: PullJob) -> None:
        # pull_blocks asked "check" just before: P held the offer, and `descriptor` is its offer
        _copy(job.descriptor, job.caches, job.dst_idx)
        release_after_direct_read(job.channel, job.timeout, "shm")


def _copy(descriptor: Descriptor, caches: Caches, dst_idx: np.ndarray) -> None:
    """Attach every cache P published (every entry of the layout on every rank, each of its
    entry's shape and dtype), copy the offered blocks to ``dst_idx`` (int64 ``[n]``) of the
    matching cache in ``caches``, detach."""
    import paddle

    from ... import ops
    from ...ipc.kv_caches import host_view

    layout = descriptor.layout
    src_idx = np.asarray(descriptor.block_ids, np.int64)
    attached: list[tuple[Any, str]] = []
    try:
        for rank in descriptor.fields[
            "shm_names"
        ]:  # attach everything first: a missing name fails before any write
            for name, entry in zip(rank, layout.caches):
                shape = [descriptor.num_blocks, *entry.block_shape]
                try:
                    t = ops.share_external_data(
                        input=paddle.empty([], dtype=entry.dtype), shm_name=name, shape=shape
                    )
                except Exception as exc:
                    raise TransferError(
                        f"{descriptor.where}: cannot attach the prefill's cache {name!r}: {exc}"
                    ) from None
                attached.append((t, name))
        for i, (t, _name) in enumerate(attached):
            src = host_view(t)
            caches[i // layout.num_caches][i % layout.num_caches][dst_idx] = src[src_idx]
            del src
    finally:
        for t, name in attached:
            ops.unset_data_ipc(tmp_input=t, shm_name=name, close_ipc=True, unlink_shm=False)
