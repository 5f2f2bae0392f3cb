"""set_data_ipc: publish a tensor under a shared-memory name for other processes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def set_data_ipc(tmp_input: "paddle.Tensor", shm_name: str) -> None:
    """Share ``tmp_input`` with other processes under the POSIX shared-memory name ``shm_name``.

    The creator side of a KV cache (FastDeploy's cache manager, or a proposer that creates
    its own caches). Other processes attach with :func:`share_external_data`; whoever owns
    the name removes it with :func:`unset_data_ipc` (``unlink_shm=True``).

    * **CPU tensor**: a segment ``/dev/shm/<shm_name>`` is created (a stale segment of that
      name is replaced), the tensor's bytes are copied into it, and the tensor's storage
      becomes that segment. The **same** ``paddle.Tensor`` object keeps working, with its
      contents, on shared memory: in-place writes (``t[...] = v``, ``paddle.assign(x,
      output=t)``, ``t.add_()``) are seen by every attached process and vice versa. Its
      ``data_ptr()`` changes once. Other tensors that shared the old storage (views taken
      before the call) keep the old, private buffer; an out-of-place op (``t + 1``) makes a
      new private tensor as always. The mapping lives as long as the tensor (or a view of it)
      does, also after the name is unlinked.
    * **CUDA tensor**: the ``cudaIpcMemHandle_t`` of the allocation holding the tensor (and
      the tensor's offset in it) is stored in the segment; the tensor itself is unchanged.
      The segment's first 72 bytes are upstream FastDeploy's record, so an upstream
      attacher can open it.

    Args:
        tmp_input: **in/out** (FastDeploy's in-place output ``tmp_input_out``), contiguous,
            float32, float16, bfloat16, int8 or uint8, CPU or CUDA. A CPU tensor must own its
            storage (not a view at an offset).
        shm_name: one path component, 1..255 bytes, no ``/``. FastDeploy's KV caches are
            named ``key_caches_{layer}_rank{r}.device{d}`` / ``value_caches_...``.

    Raises:
        OpError: a bad name, an unsupported dtype or device, or an OS/CUDA failure; the
            message names the problem. Nothing was created.

    Example::

        cache = paddle.zeros([num_blocks, heads, block, head_dim], dtype="bfloat16")
        set_data_ipc(cache, "key_caches_0_rank0.device0")
        # another process:
        #   k = share_external_data(paddle.empty([], "bfloat16"), "key_caches_0_rank0.device0",
        #                           [num_blocks, heads, block, head_dim])
    """
    run_paddle_op("set_data_ipc", tmp_input, shm_name)
