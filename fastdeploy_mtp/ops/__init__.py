"""Native MTP ops: typed wrappers over the Paddle custom-op library, and build info.

The ops library (``_fdmtp_ops.so``) is loaded into Paddle once per process, on the first
op call (see :mod:`fastdeploy_mtp.ops._loader`). Importing this package does not import
Paddle, so :func:`backends` also works where only the framework-free module is built.

Every op keeps FastDeploy's name and positional input order. Argument errors raise
:class:`OpError` (a ``ValueError``) naming the op and the argument, before any input is
written.

Backends::

    >>> import fastdeploy_mtp.ops as ops
    >>> ops.backends()            # compiled in: {'cpu': True, 'cuda': True/False, 'xpu': False}
    >>> ops.cuda_status()         # (usable in this process, reason)
"""

from __future__ import annotations

from ._loader import OpError, backends, build_info, cuda_status, kernels
from .draft_model_postprocess import draft_model_postprocess
from .hybrid_mtp_ngram import hybrid_mtp_ngram
from .ngram_match import ngram_match

__all__ = [
    "OpError",
    "backends",
    "build_info",
    "cuda_status",
    "draft_model_postprocess",
    "hybrid_mtp_ngram",
    "kernels",
    "ngram_match",
]
