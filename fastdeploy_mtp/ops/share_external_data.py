"""share_external_data: attach a tensor another process published with set_data_ipc."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ._loader import OpError, build_info, run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def share_external_data(
    input: "paddle.Tensor", shm_name: str, shape: Sequence[int], use_ipc: bool = True
) -> "paddle.Tensor":
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
    * XPU (builds with ``FDMTP_WITH_XPU``): ``input`` is an XPU placeholder. ``use_ipc=True``
      opens the stored handle with ``xpu_ipc_open_memhandle`` (other processes only);
      ``use_ipc=False`` (upstream's XPU attr) reuses the creator's device pointer stored in
      the segment, which is only valid in the creating process: from another process it is
      an error here (upstream would read a foreign address). The creator's tensor must
      outlive such an attachment. Without a Kunlun device the same path runs on the
      framework-free module under the XPU emulator (``_kernels.xpu_emu_empty``,
      ``_kernels.xpu_emulation``).

    The returned tensor owns the attachment: the mapping (or CUDA handle) is released when
    it and every view of it are gone, or by :func:`unset_data_ipc` with ``close_ipc=True``;
    never while a tensor still views it. Unlinking the name does not affect it.

    Args:
        input: 0-d (any shape) placeholder: its dtype (float32, float16, bfloat16, int8 or
            uint8) and device select what to attach; it is not read or written.
        shm_name: the name given to :func:`set_data_ipc` (no ``/``).
        shape: the wanted shape; its bytes must not exceed the published tensor's.
        use_ipc: XPU only (upstream's XPU op attr; the GPU op has none): False reuses the
            stored device pointer in the creator's own process instead of opening the IPC
            handle. Must stay True for CPU and CUDA tensors.

    Returns:
        ``paddle.Tensor`` of ``shape`` (FastDeploy's output ``output``).

    Raises:
        OpError: no segment of that name (not created yet, or unlinked), a segment that is
            incomplete or not a tensor segment, a dtype mismatch, a shape larger than the
            published tensor, host memory attached with a CUDA placeholder (or the reverse),
            a name with ``/``, ``use_ipc=False`` for a non-XPU tensor or from another
            process. The message names the problem.

    Example::

        k = share_external_data(paddle.empty([], "bfloat16"), "key_caches_0_rank0.device0",
                                [num_blocks, heads, block, head_dim])
    """
    dims = [int(d) for d in shape]
    if build_info()["xpu"]:  # the XPU build registers upstream's XPU signature
        return run_paddle_op("share_external_data", input, shm_name, dims, bool(use_ipc))
    if not use_ipc:
        raise OpError(
            "share_external_data: `use_ipc`=False reuses the creator's XPU device pointer and "
            "applies to XPU tensors only; this build has no XPU support"
        )
    return run_paddle_op("share_external_data", input, shm_name, dims)
