"""The cross-process tensor ops: set_data_ipc, share_external_data, unset_data_ipc.

Hand-written wrappers (their bindings manage tensor storage, so they are not generated from a
declaration like the kernel ops); each docstring is the op's section of ``docs/ops.md``,
attached at build time through ``_op_wrappers.MANUAL_OP_DOCS``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._loader import OpError, build_info, run_paddle_op
from ._op_wrappers import MANUAL_OP_DOCS

if TYPE_CHECKING:
    import paddle


_INT32_MAX = 2**31 - 1


def set_data_ipc(tmp_input: paddle.Tensor, shm_name: str) -> None:
    # Checked here, before Paddle hands the op a contiguous copy of a strided view: sharing
    # that copy would publish a snapshot the caller's tensor never sees again.
    is_contiguous = getattr(tmp_input, "is_contiguous", None)
    if is_contiguous is not None and not is_contiguous():
        raise OpError(
            f"set_data_ipc: `tmp_input` is not contiguous (a strided view, shape "
            f"{list(tmp_input.shape)}); share a contiguous tensor, else creator and attachers "
            "would not see each other's writes"
        )
    run_paddle_op("set_data_ipc", tmp_input, shm_name)


set_data_ipc.__doc__ = MANUAL_OP_DOCS["set_data_ipc"]


def share_external_data(
    input: paddle.Tensor, shm_name: str, shape: Sequence[int], use_ipc: bool = True
) -> paddle.Tensor:
    dims = _shape_attr(shape)
    if build_info()["xpu"]:
        return run_paddle_op("share_external_data", input, shm_name, dims, bool(use_ipc))
    if not use_ipc:
        raise OpError(
            "share_external_data: `use_ipc`=False reuses the creator's XPU device pointer and "
            "applies to XPU tensors only; this build has no XPU support"
        )
    return run_paddle_op("share_external_data", input, shm_name, dims)


def _shape_attr(shape: Sequence[int]) -> list[int]:
    """`shape` as the op's int32 attr; the byte-size product is checked by the op."""
    try:
        dims = [operator.index(d) for d in shape]
    except TypeError:
        raise OpError(
            f"share_external_data: `shape` must be a sequence of ints, got {shape!r}"
        ) from None
    for d in dims:
        if d < 0:
            raise OpError(f"share_external_data: `shape` {dims} has a negative dimension {d}")
        if d > _INT32_MAX:
            raise OpError(f"share_external_data: `shape` {dims} has a dimension {d} above 2^31-1")
    return dims


share_external_data.__doc__ = MANUAL_OP_DOCS["share_external_data"]


def unset_data_ipc(
    tmp_input: paddle.Tensor, shm_name: str, close_ipc: bool, unlink_shm: bool
) -> None:
    run_paddle_op("unset_data_ipc", tmp_input, shm_name, bool(close_ipc), bool(unlink_shm))


unset_data_ipc.__doc__ = MANUAL_OP_DOCS["unset_data_ipc"]
