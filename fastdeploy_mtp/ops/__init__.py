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
from .draft_model_preprocess import draft_model_preprocess
from .draft_model_update import draft_model_update
from .eagle_gather_hidden_states import eagle_gather_hidden_states
from .eagle_get_hidden_states import eagle_get_hidden_states
from .eagle_get_self_hidden_states import eagle_get_self_hidden_states
from .hybrid_mtp_ngram import hybrid_mtp_ngram
from .set_data_ipc import set_data_ipc
from .share_external_data import share_external_data
from .unset_data_ipc import unset_data_ipc
from .mtp_step_paddle import mtp_step_paddle
from .ngram_match import ngram_match
from .sampling import VerifyStrategy, position_uniforms, rejection_candidates, verify_uniforms
from .speculate_get_logits import speculate_get_logits
from .speculate_pre_process import speculate_pre_process
from .unified_update_model_status import unified_update_model_status
from .update_attn_mask_offsets import update_attn_mask_offsets
from .verify_draft_tokens import verify_draft_tokens

__all__ = [
    "OpError",
    "VerifyStrategy",
    "backends",
    "build_info",
    "cuda_status",
    "draft_model_postprocess",
    "draft_model_preprocess",
    "draft_model_update",
    "eagle_gather_hidden_states",
    "eagle_get_hidden_states",
    "eagle_get_self_hidden_states",
    "hybrid_mtp_ngram",
    "kernels",
    "mtp_step_paddle",
    "ngram_match",
    "position_uniforms",
    "rejection_candidates",
    "set_data_ipc",
    "share_external_data",
    "speculate_get_logits",
    "speculate_pre_process",
    "unified_update_model_status",
    "unset_data_ipc",
    "update_attn_mask_offsets",
    "verify_draft_tokens",
    "verify_uniforms",
]
