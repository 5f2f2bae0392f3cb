"""Native MTP ops: typed wrappers over the Paddle custom-op library, and build info.

Every kernel op is declared once (``custom_ops/ops/<op>.toml``); its wrapper here is generated
from that declaration at build time (``_op_wrappers.py``), with FastDeploy's name, positional
input order, attrs and in-place map, and a docstring made of the op's contract in
``docs/ops.md`` plus a parameter list with each tensor's shape and dtype. The IPC ops
(:func:`set_data_ipc`, :func:`share_external_data`, :func:`unset_data_ipc`) are hand-written
in :mod:`fastdeploy_mtp.ops.shared_tensors`.

The ops library (``_fdmtp_ops.so``) is loaded into Paddle once per process, on the first op
call (see :mod:`fastdeploy_mtp.ops._loader`). Importing this package does not import Paddle, so
:func:`backends` also works where only the framework-free module is built.

Argument errors raise :class:`OpError` (a ``ValueError``) naming the op and the argument,
before any input is written.

Backends::

    >>> import fastdeploy_mtp.ops as ops
    >>> ops.backends()            # compiled in: {'cpu': True, 'cuda': True/False, 'xpu': False}
    >>> ops.cuda_status()         # (usable in this process, reason)

Accelerator kernels on the CPU (see :mod:`fastdeploy_mtp.ops.emulation`)::

    >>> with ops.emulate("cuda"):  # ops on CPU tensors run the CUDA kernels, emulated
    ...     ...
"""

from __future__ import annotations

from . import _op_wrappers
from ._loader import OpError, backends, build_info, cuda_status, kernels
from ._op_wrappers import *  # noqa: F403  (the generated op wrappers, constants and OP_NAMES)
from .emulation import emulate
from .messaging import (
    msg_queue_key,
    read_msgmax,
    remove_msg_queue,
    topk_message_bytes,
    topk_slots_within,
)
from .sampling import position_uniforms, rejection_candidates, verify_uniforms
from .shared_tensors import set_data_ipc, share_external_data, unset_data_ipc

__all__ = [
    *_op_wrappers.__all__,
    "OpError",
    "backends",
    "build_info",
    "cuda_status",
    "emulate",
    "kernels",
    "msg_queue_key",
    "position_uniforms",
    "read_msgmax",
    "rejection_candidates",
    "remove_msg_queue",
    "set_data_ipc",
    "share_external_data",
    "topk_message_bytes",
    "topk_slots_within",
    "unset_data_ipc",
    "verify_uniforms",
]
