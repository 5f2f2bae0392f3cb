"""The cross-process tensor ops: set_data_ipc, share_external_data, unset_data_ipc.

Hand-written wrappers (their bindings manage tensor storage, so they are not generated from a
declaration like the kernel ops); each docstring is the op's section of ``docs/ops.md``,
attached at build time through ``_op_wrappers.MANUAL_OP_DOCS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._loader import OpError, build_info, run_paddle_op
from ._op_wrappers import MANUAL_OP_DOCS

if TYPE_CHECKING:
    import paddle


def set_data_ipc(tmp_input: paddle.Tensor, shm_name: str) -> None:
    run_paddle_op("set_data_ipc", tmp_input, shm_name)


set_data_ipc.__doc__ = MANUAL_OP_DOCS["set_data_ipc"]


def share_external_data(
    input: paddle.Tensor, shm_name: str, shape: Sequence[int], use_ipc: bool = True
) -> paddle.Tensor:
    dims = [int(d) for d in shape]
    if build_info()["xpu"]:
        return run_paddle_op("share_external_data", input, shm_name, dims, bool(use_ipc))
    if not use_ipc:
        raise OpError(
            "share_external_data: `use_ipc`=False reuses the creator's XPU device pointer and "
            "applies to XPU tensors only; this build has no XPU support"
        )
    return run_paddle_op("share_external_data", input, shm_name, dims)


share_external_data.__doc__ = MANUAL_OP_DOCS["share_external_data"]


def unset_data_ipc(tmp_input: paddle.Tensor, shm_name: str, close_ipc: bool, unlink_shm: bool) -> None:
    run_paddle_op("unset_data_ipc", tmp_input, shm_name, bool(close_ipc), bool(unlink_shm))


unset_data_ipc.__doc__ = MANUAL_OP_DOCS["unset_data_ipc"]
