"""unset_data_ipc: release an attachment and/or remove a shared-memory name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def unset_data_ipc(tmp_input: "paddle.Tensor", shm_name: str, close_ipc: bool, unlink_shm: bool) -> None:
    """Release ``tmp_input``'s attachment (``close_ipc``) and/or unlink ``shm_name`` (``unlink_shm``).

    * ``close_ipc=True``: if ``tmp_input``'s storage is shared memory (attached with
      :func:`share_external_data`, or moved there by :func:`set_data_ipc` on CPU), the
      tensor lets go of it and becomes uninitialized: using it afterwards raises an error
      instead of reading released memory. The mapping (or CUDA handle) is released once no
      other tensor views it. A tensor that owns ordinary memory (a CUDA creator's) is left as
      is. FastDeploy's ``clear_mtp_cache`` calls ``unset_data_ipc(t, name, True, False)``.
    * ``unlink_shm=True``: removes the name (``/dev/shm/<shm_name>``); a name that does not
      exist counts as success. Existing attachments keep working; new attaches fail.

    Args:
        tmp_input: the tensor (FastDeploy's input ``tmp_input``; no outputs).
        shm_name: the segment name (no ``/``).
        close_ipc: release the tensor's attachment.
        unlink_shm: remove the name.

    Raises:
        OpError: a bad name, or unlinking failed for another reason than "does not exist".
            Nothing was changed.

    Example::

        unset_data_ipc(k, "key_caches_0_rank0.device0", True, False)   # attacher
        unset_data_ipc(cache, "key_caches_0_rank0.device0", False, True)  # creator
    """
    run_paddle_op("unset_data_ipc", tmp_input, shm_name, bool(close_ipc), bool(unlink_shm))
