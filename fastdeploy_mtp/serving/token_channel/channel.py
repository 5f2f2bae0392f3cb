"""The two ends of a deployment's token channel: the engine's reader
(:func:`open_reader`) and rank 0's writer (:func:`open_writer`), of the channel its
:class:`~fastdeploy_mtp.serving.processes.layout.ServeLayout` names (see :mod:`.base`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import TokenReader, TokenWriter
from .shared_memory import ShmTokenReader, ShmTokenWriter, shm_name
from .sysv import FirstTokenReader, SysvTokenReader, SysvTokenWriter

if TYPE_CHECKING:
    from ..processes.layout import ServeLayout


def open_reader(layout: ServeLayout, n: int, k: int) -> TokenReader:
    """The engine's end of ``layout``'s channel for ``n`` slots and ``k`` drafts (create the
    shm segment before the workers start: they attach it)."""
    if layout.splitwise_role == "prefill" and k:
        return FirstTokenReader(layout.msg_queue_id, n, k)
    if layout.token_channel == "shm":
        return ShmTokenReader(shm_name(layout.engine_worker_queue_port), n, k + 1)
    return SysvTokenReader(layout.msg_queue_id, n, k)


def open_writer(layout: ServeLayout, rank: int, n: int, k: int) -> TokenWriter:
    """Rank 0's end of ``layout``'s channel (not for a prefill instance with MTP, which sends
    first tokens: :func:`~fastdeploy_mtp.serving.processes.worker_process.send_first_tokens`)."""
    if layout.token_channel == "shm":
        return ShmTokenWriter(shm_name(layout.engine_worker_queue_port), n, k + 1)
    return SysvTokenWriter(rank, layout.msg_queue_id)
