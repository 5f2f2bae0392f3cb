"""The ``"tcp"`` KV transport: the blocks' bytes travel in the source's answer to ``fetch``
on the control socket (ZeroMQ), so it works between any two hosts that reach each other.

Both ends of the byte stream are here: :func:`fetch_reply` is what P's source answers, and
:class:`TcpTransport` checks the answer's header, every frame's tag (with the splitwise
secret, :mod:`..kv_mac`) and the exact size of every frame before it writes a byte into D's
caches. The message layout is in
:mod:`fastdeploy_mtp.splitwise.control`.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..kv_layout import Caches, KVLayout, TransferError
from ..transport import PullJob, Transport, frame_labels, register

logger = logging.getLogger(__name__)


def fetch_reply(
    caches: Caches, layout: KVLayout, block_ids: np.ndarray
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """P's answer to ``fetch``: the header and one C-contiguous copy of ``cache[block_ids]``
    (``[len(block_ids), *block_shape]``) per rank and cache, rank-major: every cache of
    ``layout.caches`` (every target and every MTP layer) of every rank.

    Args:
        caches: per rank, the source's caches, one per entry of ``layout.caches``.
        layout: their layout.
        block_ids: int64 ``[n]``, the offered blocks.
    """
    data = [np.ascontiguousarray(cache[block_ids]) for rank in caches for cache in rank]
    per_cache = [c.block_nbytes for c in layout.caches]
    header = {
        "ok": True,
        "frames": len(data),
        "block_nbytes": per_cache,
        "num_blocks": len(block_ids),
    }
    return header, data


@register
class TcpTransport(Transport):
    """Fetch the bytes over the control socket, copy them in, then release the offer."""

    name = "tcp"
    preference = 0  # usable everywhere: what "auto" falls back to

    def pull(self, job: PullJob) -> None:
        layout, n = job.descriptor.layout, len(job.descriptor.block_ids)
        header, frames = job.channel.ask("fetch", job.timeout)
        # with a key: every frame's tag, before its size or anything else is looked at
        job.channel.check_frames(header, [f.buffer for f in frames], frame_labels(layout))
        where = f"{job.descriptor.where}: fetch reply from {job.channel.address}"
        want = layout.tensor_parallel_size * layout.num_caches
        per_cache = [c.block_nbytes for c in layout.caches]
        for key, expected in (("frames", want), ("block_nbytes", per_cache), ("num_blocks", n)):
            if header.get(key) != expected:
                raise TransferError(
                    f"{where}: header `{key}` is {header.get(key)!r:.200}, expected {expected}"
                )
        if len(frames) != want:
            raise TransferError(f"{where}: {len(frames)} data frames, expected {want}")
        for i, frame in enumerate(frames):
            entry = layout.caches[i % layout.num_caches]
            if len(frame.buffer) != n * entry.block_nbytes:
                raise TransferError(
                    f"{where}: data frame {i} (rank {i // layout.num_caches}, {entry.label}) has "
                    f"{len(frame.buffer)} bytes, expected {n * entry.block_nbytes}"
                )
        for i, frame in enumerate(frames):
            entry = layout.caches[i % layout.num_caches]
            cache = job.caches[i // layout.num_caches][i % layout.num_caches]
            cache[job.dst_idx] = np.frombuffer(frame.buffer, dtype=entry.host_dtype).reshape(
                (n, *entry.block_shape)
            )
        try:  # the bytes were consistent when fetched; a lost offer now costs nothing
            job.channel.release(job.timeout)
        except TransferError as exc:
            logger.warning("%s (after a complete copy)", exc)
