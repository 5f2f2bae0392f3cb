"""share_external_data: attach a tensor another process published with set_data_ipc."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def share_external_data(input: "paddle.Tensor", shm_name: str, shape: Sequence[int]) -> "paddle.Tensor":
    """Attach the tensor published as ``shm_name`` by :func:`set_data_ipc` (no copy).

    The attacher side (a worker or proposer waiting for the cache manager's
    ``cache_ready_signal``). Returns a new tensor of ``shape`` with ``input``'s dtype on
    the same memory as the creator's tensor: writes are seen both ways.

    * CPU: ``input`` is a CPU placeholder (e.g. ``paddle.empty([], dtype)``); the segment is
      mapped into this process. Works in the creator's own process too.
    * CUDA: ``input`` is a CUDA placeholder; the stored handle is opened on ``input``'s
      device with ``cudaIpcOpenMemHandle``. The handle must come from another process
      (CUDA IPC cannot open its own exports). A 72-byte upstream FastDeploy record is
      accepted (no dtype or size check is possible then).

    The returned tensor owns the attachment: the mapping (or CUDA handle) is released when
    it and every view of it are gone, or by :func:`unset_data_ipc` with ``close_ipc=True``;
    never while a tensor still views it. Unlinking the name does not affect it.

    Args:
        input: 0-d (any shape) placeholder: its dtype (float32, float16, bfloat16, int8 or
            uint8) and device select what to attach; it is not read or written.
        shm_name: the name given to :func:`set_data_ipc` (no ``/``).
        shape: the wanted shape; its bytes must not exceed the published tensor's.

    Returns:
        ``paddle.Tensor`` of ``shape`` (FastDeploy's output ``output``).

    Raises:
        OpError: no segment of that name (not created yet, or unlinked), a segment that is
            incomplete or not a tensor segment, a dtype mismatch, a shape larger than the
            published tensor, host memory attached with a CUDA placeholder (or the reverse),
            a name with ``/``. The message names the problem.

    Example::

        k = share_external_data(paddle.empty([], "bfloat16"), "key_caches_0_rank0.device0",
                                [num_blocks, heads, block, head_dim])
    """
    return run_paddle_op("share_external_data", input, shm_name, [int(d) for d in shape])
